// bf16 and fp16 runs widened exactly, shared by the fp64 reference (to double),
// the baseline emulation and the layer glue (to float): one dtype dispatch per
// run instead of TensorView::get's one per element.
#pragma once

#include <bit>
#include <cstdint>

#include "cases/encoding.h"
#include "cases/tensor.h"

namespace mlagate::detail {

// dst[0..n) <- elements [first, first+n) of a bf16 or fp16 tensor; false (and
// nothing written) for any other dtype. bf16 is the top half of an fp32
// (encoding.h's bf16_to_f32), inlined so that the loop vectorizes.
// dst[0..n) <- p[0..n) of the given 16-bit dtype (bf16 unless fp16).
template <class Out>
void widen_16bit(const std::uint16_t* p, bool bf16, std::int64_t n, Out* dst) {
  if (bf16) {
    for (std::int64_t k = 0; k < n; ++k) dst[k] = std::bit_cast<float>(static_cast<std::uint32_t>(p[k]) << 16);
  } else {
    for (std::int64_t k = 0; k < n; ++k) dst[k] = f16_to_f32(p[k]);
  }
}

template <class Out>
bool widen_16bit(const TensorView& v, std::int64_t first, std::int64_t n, Out* dst) {
  if (v.dtype != DType::kBF16 && v.dtype != DType::kF16) return false;
  widen_16bit(v.as<std::uint16_t>() + first, v.dtype == DType::kBF16, n, dst);
  return true;
}

// dst[0..n) <- elements [first, first+n) of a tensor of any dtype: 16-bit runs
// widened, fp32 copied, anything else through TensorView::get.
template <class Out>
void widen_any(const TensorView& v, std::int64_t first, std::int64_t n, Out* dst) {
  if (widen_16bit(v, first, n, dst)) return;
  if (v.dtype == DType::kF32) {
    const float* p = v.as<float>() + first;
    for (std::int64_t k = 0; k < n; ++k) dst[k] = p[k];
    return;
  }
  for (std::int64_t k = 0; k < n; ++k) dst[k] = static_cast<Out>(v.get(first + k));
}

}  // namespace mlagate::detail
