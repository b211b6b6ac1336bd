// The arithmetic of the fixed-order attention emulation (sdpa_emulation.h,
// EmulatedAttention), compiled for the CPU (reference/fixed_order_emulation.cpp)
// and for the GPU (reference/cuda/attention_emulation.cu) from this one text,
// so that both write the same bits.
//
// Why the bits agree: every step is one IEEE fp32 operation rounded to
// nearest even (add, subtract, multiply, divide, fused multiply-add), never a
// library function whose last bits depend on the platform (the exponential is
// ours, below), and never contracted by a compiler: on the GPU each step is
// its _rn intrinsic, which nvcc does not fuse; on the CPU the files that
// include this are compiled with -ffp-contract=off (reference/CMakeLists.txt).
// Subnormals are kept on both (-ftz=false for the .cu file).
#pragma once

#include <cstdint>

#include "cases/encoding.h"  // MLAGATE_HOST_DEVICE, f32_bits_to_bf16 / f32_bits_to_f16

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif
#include <bit>
#include <cmath>

namespace mlagate::detail {

#if defined(__CUDA_ARCH__)
__device__ inline float emu_add(float a, float b) { return __fadd_rn(a, b); }
__device__ inline float emu_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ inline float emu_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ inline float emu_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ inline float emu_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ inline float emu_rint(float a) { return rintf(a); }
__device__ inline float emu_from_bits(std::uint32_t u) { return __uint_as_float(u); }
__device__ inline std::uint32_t emu_bits(float x) { return __float_as_uint(x); }
#else
inline float emu_add(float a, float b) { return a + b; }
inline float emu_sub(float a, float b) { return a - b; }
inline float emu_mul(float a, float b) { return a * b; }
inline float emu_div(float a, float b) { return a / b; }
inline float emu_fma(float a, float b, float c) { return std::fma(a, b, c); }
inline float emu_rint(float a) { return std::nearbyint(a); }  // the default mode: to nearest even
inline float emu_from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
inline std::uint32_t emu_bits(float x) { return std::bit_cast<std::uint32_t>(x); }
#endif

// exp(x) for the softmax's x = scaled logit - row max (<= 0; anything else is
// computed the same way): n = rint(x / ln 2), r = x - n ln 2 in two fma
// steps (ln 2 split as Cephes splits it), a degree-6 polynomial for exp(r)
// on |r| <= ln(2)/2 (Cephes' expf coefficients, within about 1 ulp), then the
// exact product by 2^n built from its bits (in two steps below 2^-126, where
// the result is subnormal and rounded once). NaN stays NaN; below -104 the
// result is +0 (under the smallest subnormal); above 88.7 it is +inf.
MLAGATE_HOST_DEVICE inline float emu_exp(float x) {
  if (x != x) return x;
  if (x < -104.0f) return 0.0f;
  if (x > 88.72283f) return emu_from_bits(0x7F800000u);
  const float n = emu_rint(emu_mul(x, 1.44269504088896341f));
  float r = emu_fma(n, -0.693359375f, x);
  r = emu_fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = emu_fma(p, r, 1.3981999507e-3f);
  p = emu_fma(p, r, 8.3334519073e-3f);
  p = emu_fma(p, r, 4.1665795894e-2f);
  p = emu_fma(p, r, 1.6666665459e-1f);
  p = emu_fma(p, r, 5.0000001201e-1f);
  float y = emu_fma(p, emu_mul(r, r), r);
  y = emu_add(y, 1.0f);
  const int e = static_cast<int>(n);  // -151 .. 128
  if (e >= -126) {
    if (e > 127) return emu_mul(emu_mul(y, 2.0f), emu_from_bits(static_cast<std::uint32_t>(e - 1 + 127) << 23));
    return emu_mul(y, emu_from_bits(static_cast<std::uint32_t>(e + 127) << 23));
  }
  // 2^e = 2^(e + 64) * 2^-64: the first product exact, the second rounds once.
  return emu_mul(emu_mul(y, emu_from_bits(static_cast<std::uint32_t>(e + 64 + 127) << 23)),
                 emu_from_bits(static_cast<std::uint32_t>(-64 + 127) << 23));
}

// x rounded to the model dtype (bf16 unless fp16), as fp32: encoding.h's own
// integer rounding, then the exact widening.
MLAGATE_HOST_DEVICE inline float emu_round16(float x, bool bf16) {
  const std::uint32_t u = emu_bits(x);
  if (bf16) return emu_from_bits(static_cast<std::uint32_t>(f32_bits_to_bf16(u)) << 16);
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(f32_bits_to_f16(u)));
#else
  return f16_to_f32(f32_bits_to_f16(u));
#endif
}

// Row r's visible keys: clamp(context + r / rows_per_token + 1, 0, keys), as
// sdpa_emulation.cpp's visible_keys.
MLAGATE_HOST_DEVICE inline int emu_visible(int r, int rows_per_token, int context, int keys) {
  const long long v = static_cast<long long>(context) + r / rows_per_token + 1;
  return static_cast<int>(v < 0 ? 0 : (v > keys ? keys : v));
}

// The softmax's reductions run in kEmuLanes lanes: lane l takes the row's
// elements j = l, l + 32, ... in increasing j; the lanes then combine by
// halves (lane l with lane l ^ 16, then ^ 8, ^ 4, ^ 2, ^ 1), as a warp's
// shuffle-xor tree does, every lane ending with the same value.
inline constexpr int kEmuLanes = 32;

// The larger of two, NaN if either is (the first NaN if both): the max
// reduction's step, as the GPU's lanes combine with it.
inline float emu_max2(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return b > a ? b : a;
}

// The lanes' values combined by halves (above): lane 0's result. Host code
// (the CPU's two implementations; the GPU combines with warp shuffles).
template <class Op>
float emu_combine_lanes(float (&lane)[kEmuLanes], Op op) {
  for (int off = kEmuLanes / 2; off >= 1; off /= 2) {
    float next[kEmuLanes];
    for (int l = 0; l < kEmuLanes; ++l) next[l] = op(lane[l], lane[l ^ off]);
    for (int l = 0; l < kEmuLanes; ++l) lane[l] = next[l];
  }
  return lane[0];
}

}  // namespace mlagate::detail
