// Device-side reading of cache entries and 16-bit model values: one element of
// a key, dequantized on load (SPEC: KV cache dtypes). Every conversion is exact
// (16-bit and fp8 values are all representable in fp32) and mirrors the host
// encodings of cases/encoding.h.
#pragma once

#include <cstdint>

namespace mlagate::gpu {

// Model-dtype bits -> fp32, exact: bf16 is the top half of an fp32; fp16 is
// widened by hand (normal, subnormal, inf, NaN) so no rounding mode is involved.
__device__ __forceinline__ float model_to_float(std::uint16_t bits, bool bf16) {
  if (bf16) return __uint_as_float(static_cast<unsigned>(bits) << 16);
  const unsigned sign = (bits & 0x8000u) << 16, exp = (bits >> 10) & 0x1Fu, man = bits & 0x3FFu;
  if (exp == 0x1F) return __uint_as_float(sign | 0x7F800000u | (man << 13));  // inf / NaN
  if (exp != 0) return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
  const float sub = static_cast<float>(man) * 5.9604644775390625e-8f;  // man * 2^-24, exact
  return sign ? -sub : sub;
}

// float8_e4m3fn bits -> fp32, exact: bias 7, no infinities, S.1111.111 is NaN.
__device__ __forceinline__ float e4m3_to_float(std::uint8_t b) {
  const unsigned sign = (b & 0x80u) << 24, exp = (b >> 3) & 0xFu, man = b & 0x7u;
  if (exp == 0xF && man == 0x7) return __uint_as_float(sign | 0x7FC00000u);
  if (exp != 0) return __uint_as_float(sign | ((exp + 120u) << 23) | (man << 20));
  const float sub = static_cast<float>(man) * 0.001953125f;  // man * 2^-9, exact
  return sign ? -sub : sub;
}

enum class KvKind : int {
  kModel16 = 0,   // "auto": L + R model-dtype elements
  kFp8E4M3 = 1,   // "fp8", "fp8_e4m3": L + R bytes of e4m3(x / k_scale)
  kFp8DsMla = 2,  // "fp8_ds_mla": L e4m3 (tiles of 128), L/128 fp32 tile scales, R bf16 k_pe
};

// One token's entry layout (cases/fp8.h's EntryFormat, in device terms).
struct KvFormat {
  KvKind kind = KvKind::kModel16;
  int entry_bytes = 0;
  int L = 0;
  bool bf16 = true;       // model dtype of kModel16 entries
  float k_scale = 1.f;    // kFp8E4M3: x = e4m3 * k_scale
  int scale_offset = 0;   // kFp8DsMla: byte offset of the fp32 tile scales
  int k_pe_offset = 0;    // kFp8DsMla: byte offset of the bf16 k_pe

  // Element e (0 .. L+R-1: kv_c then k_pe) of the entry at `entry`, in fp32
  // (e4m3 * scale is one fp32 product, as the reference reader computes it).
  __device__ __forceinline__ float load(const unsigned char* entry, int e) const {
    switch (kind) {
      case KvKind::kModel16:
        return model_to_float(reinterpret_cast<const std::uint16_t*>(entry)[e], bf16);
      case KvKind::kFp8E4M3:
        return __fmul_rn(e4m3_to_float(entry[e]), k_scale);
      case KvKind::kFp8DsMla:
        if (e < L) return __fmul_rn(e4m3_to_float(entry[e]), reinterpret_cast<const float*>(entry + scale_offset)[e / 128]);
        return model_to_float(reinterpret_cast<const std::uint16_t*>(entry + k_pe_offset)[e - L], true);
    }
    return 0.f;
  }
};

}  // namespace mlagate::gpu
