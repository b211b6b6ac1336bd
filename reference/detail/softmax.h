// The softmax numerator of the baseline emulation (float): scale, subtract
// the row max, exponentiate, and sum in a fixed order. The caller passes its
// own Eigen map (aligned or not), so the vectorization, and therefore every
// bit, stays what that caller had. (The fp64 reference's softmax_row sums with
// sum_in_four_lanes too but exponentiates whole runs of 8: fp64_reference.cpp.)
#pragma once

#include <Eigen/Core>

namespace mlagate::detail {

template <class Scalar>
struct ExpRow {
  Scalar max, sum;  // the scaled row's max; the sum of exp(scaled - max)
};

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

// a[0..n) <- exp(scale * a - max), n >= 1, and their sum in four fixed lanes.
template <class ArrayMap>
ExpRow<typename ArrayMap::Scalar> exp_row(ArrayMap a, typename ArrayMap::Scalar scale) {
  using Scalar = typename ArrayMap::Scalar;
  a *= scale;
  const Scalar mx = a.maxCoeff();
  a = (a - mx).exp();
  return {mx, sum_in_four_lanes(a.data(), a.size())};
}

}  // namespace mlagate::detail
