// Bit-exact conversions between fp32 and the 16-bit model dtypes. Our own code,
// not the compiler's or a library's, so the same bits come out everywhere.
#pragma once

#include <bit>
#include <cstdint>

namespace mlagate {

// Compiled for the GPU too (reference/cuda's up-projection rounds with these
// very functions, so its bits are the CPU's): integer code only, on the bits.
#if defined(__CUDACC__)
#define MLAGATE_HOST_DEVICE __host__ __device__
#else
#define MLAGATE_HOST_DEVICE
#endif

// fp32 bits -> bf16 bits, round to nearest even; NaN stays NaN (quiet, sign
// and the top payload bits kept), inf stays inf.
MLAGATE_HOST_DEVICE inline std::uint16_t f32_bits_to_bf16(std::uint32_t u) {
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0)
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // keep sign, force quiet NaN
  // Round to nearest even: add 0x7FFF plus the lowest kept bit; overflow to inf is correct.
  const std::uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;
  return static_cast<std::uint16_t>(u >> 16);
}

// fp32 bits -> IEEE binary16 bits, round to nearest even, with subnormals;
// overflow -> inf; NaN -> the quiet NaN 0x7E00 with the sign kept.
MLAGATE_HOST_DEVICE inline std::uint16_t f32_bits_to_f16(std::uint32_t u) {
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u)  // inf or NaN
    return static_cast<std::uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x0200u : 0u));
  // 65520 and above round to inf (65504 is the largest finite half).
  if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  const int exp = static_cast<int>(abs >> 23) - 127;
  const std::uint32_t mant = (abs & 0x007FFFFFu) | 0x00800000u;  // implicit bit
  if (exp < -25) return sign;  // below half the smallest subnormal: rounds to zero
  if (exp < -14) {
    // Subnormal half: value = mant * 2^(exp-23); half subnormal unit is 2^-24.
    const int shift = -exp - 1;  // 14..24: bits to drop so the unit becomes 2^-24
    const std::uint32_t kept = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    const std::uint32_t r = kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
    return static_cast<std::uint16_t>(sign | r);  // r may carry into the exponent: still correct
  }
  // Normal: drop 13 mantissa bits with RNE; a carry may bump the exponent (to inf at most).
  std::uint32_t h = (static_cast<std::uint32_t>(exp + 15) << 10) | ((mant >> 13) & 0x3FFu);
  const std::uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

// fp32 -> bf16, round to nearest even; NaN stays NaN (quiet), inf stays inf.
// Inline: the glue and the emulation round gigabytes through it, and only
// an inline body lets the compiler vectorize those loops.
inline std::uint16_t f32_to_bf16(float x) { return f32_bits_to_bf16(std::bit_cast<std::uint32_t>(x)); }
inline float bf16_to_f32(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

// dst[0..n) = src rounded to bf16 (or fp16), element by element as above; the
// bf16 loop vectorizes.
void f32_run_to_16bit(const float* src, std::int64_t n, bool bf16, std::uint16_t* dst);

// fp32 -> IEEE binary16, round to nearest even, with subnormals; overflow -> inf.
std::uint16_t f32_to_f16(float x);
float f16_to_f32(std::uint16_t h);

// x rounded to the nearest bf16 (or fp16) value, round to nearest even, as
// fp32: the model-dtype rounding the emulations, the sparse ops and the
// cache-exactness check all apply.
inline float round_to_16bit(float x, bool bf16) { return bf16 ? bf16_to_f32(f32_to_bf16(x)) : f16_to_f32(f32_to_f16(x)); }

inline constexpr std::uint16_t kBF16QuietNaN = 0x7FC0;
inline constexpr std::uint16_t kF16QuietNaN = 0x7E00;

}  // namespace mlagate
