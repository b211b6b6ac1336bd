// The fp64 reference on the GPU (--reference cuda): the same math as
// reference/fp64_reference.h's reference_absorbed and reference_mqa, for big suites on a
// GPU machine. Free of CUDA headers. Throws DeviceUnavailableError without a GPU.
//
// Agreement with the Eigen reference (tests/device): relative 1e-10 with a floor
// of 1e-3 of the reference RMS on every smoke and edges case; both are fp64 and
// differ only in summation order and the exp/log of the two math libraries.
#pragma once

#include <vector>

#include "cases/case.h"
#include "cases/tensor.h"
#include "reference/fp64_reference.h"

namespace mlagate {

// As reference_absorbed: out [T, N*V], lse [T, N], o_lat [T, N, L].
ReferenceOutputs cuda_reference_absorbed(const Case& c);

// As reference_mqa: the attention core on given latent queries q_lat [T, N, L]
// (any 16-bit model dtype or f64) with q_pe from c.q.
void cuda_reference_mqa(const Case& c, const TensorView& q_lat, std::vector<double>& o_lat, std::vector<double>& lse);

}  // namespace mlagate
