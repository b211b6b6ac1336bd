// The fp64 reference's softmax sum in a fixed order (fp64_reference.cpp's
// softmax_row). Until 2026-12-04 the CPU's baseline emulation summed its
// float rows with it too; its cores now follow detail/emulation_math.h's
// 32 lanes, as the GPU's do.
#pragma once

#include <Eigen/Core>

namespace mlagate::detail {

// x[0] + ... + x[n-1] in four fixed lanes (j mod 4, the tail in lane 0),
// combined as (0 + 1) + (2 + 3): Eigen's reductions depend on the pointer's
// alignment, and a reference must give the same bits wherever its buffer lands.
template <class Scalar>
Scalar sum_in_four_lanes(const Scalar* x, Eigen::Index n) {
  Scalar acc[4] = {0, 0, 0, 0};
  Eigen::Index j = 0;
  for (; j + 4 <= n; j += 4) {
    acc[0] += x[j];
    acc[1] += x[j + 1];
    acc[2] += x[j + 2];
    acc[3] += x[j + 3];
  }
  for (; j < n; ++j) acc[0] += x[j];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

}  // namespace mlagate::detail
