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
// overflow -> inf; NaN -> the quiet NaN 0x7E00 with the sign kept. Without
// branches, so that loops over it vectorize (the case inputs of an fp16 case
// round every element through it): normal and subnormal halves are one path,
// `shift` mantissa bits dropped with RNE. Tested against the case-by-case
// form on every rounding boundary (tests/cases/test_encoding.cpp); checked on
// all 2^32 patterns when it was written.
MLAGATE_HOST_DEVICE inline std::uint16_t f32_bits_to_f16(std::uint32_t u) {
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7FFFFFFFu;
  const std::uint32_t exp = abs >> 23;                              // biased fp32 exponent
  const std::uint32_t mant = (abs & 0x007FFFFFu) | 0x00800000u;  // implicit bit
  // A normal half (exp >= 113: 2^-14 and up) keeps 11 bits: drop 13. Below,
  // a subnormal half's unit is 2^-24: drop 126 - exp, capped at 31, where
  // all is dropped and the rest is below half a unit (rounds to zero).
  const std::uint32_t below = 126u - exp;
  const std::uint32_t shift = exp >= 113u ? 13u : (below > 31u ? 31u : below);
  const std::uint32_t base = exp >= 113u ? (exp - 113u) << 10 : 0u;  // + the implicit bit's 0x400: exp - 112
  std::uint32_t h = base + (mant >> shift);
  const std::uint32_t rem = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  h += (rem > half) | ((rem == half) & h);  // a carry may bump the exponent: still correct
  h = abs >= 0x477FF000u ? 0x7C00u : h;      // 65520 and above round to inf (65504: the largest half)
  h = abs >= 0x7F800000u ? 0x7C00u | (abs > 0x7F800000u ? 0x0200u : 0u) : h;  // inf, NaN
  return static_cast<std::uint16_t>(sign | h);
}

// fp32 -> bf16, round to nearest even; NaN stays NaN (quiet), inf stays inf.
// Inline: the glue and the emulation round gigabytes through it, and only
// an inline body lets the compiler vectorize those loops.
inline std::uint16_t f32_to_bf16(float x) { return f32_bits_to_bf16(std::bit_cast<std::uint32_t>(x)); }
inline float bf16_to_f32(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

// dst[0..n) = src rounded to bf16 (or fp16), element by element as above;
// both loops vectorize.
void f32_run_to_16bit(const float* src, std::int64_t n, bool bf16, std::uint16_t* dst);

// A bf16 (bf16 true) or fp16 value's bits as widening it to fp32 and rounding
// back give them, without the fp32: the same bits, except that a NaN comes
// back quiet (bf16: the quiet bit set, sign and payload kept; fp16: 0x7E00
// with the sign), as the rounding above makes every NaN.
inline std::uint16_t rounded_again_16bit(std::uint16_t b, bool bf16) {
  if (bf16) return ((b & 0x7F80u) == 0x7F80u && (b & 0x007Fu) != 0) ? static_cast<std::uint16_t>(b | 0x0040u) : b;
  return ((b & 0x7C00u) == 0x7C00u && (b & 0x03FFu) != 0) ? static_cast<std::uint16_t>((b & 0x8000u) | 0x7E00u) : b;
}

// fp32 -> IEEE binary16, round to nearest even, with subnormals; overflow -> inf.
inline std::uint16_t f32_to_f16(float x) { return f32_bits_to_f16(std::bit_cast<std::uint32_t>(x)); }

// IEEE binary16 -> fp32, exact; NaN keeps its sign and payload (shifted up),
// inf stays inf. Inline and without branches, so that the widening loops
// over fp16 inputs vectorize (as an out-of-line function with a loop for
// subnormals it was 2.4% of a CPU explore search's samples). A subnormal m x
// 2^-24 is the fp32 2^-14 x (1 + m / 2^10) less 2^-14: one subtraction,
// exact (the operands are within a factor of two).
inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t em = static_cast<std::uint32_t>(h & 0x7FFFu) << 13;  // exponent and mantissa in fp32's places
  const std::uint32_t exp = em & 0x0F800000u;
  const std::uint32_t normal = em + (112u << 23);  // rebias 15 -> 127
  const std::uint32_t special = em | 0x7F800000u;  // inf, NaN
  const std::uint32_t sub =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(em + (113u << 23)) - std::bit_cast<float>(113u << 23));
  const std::uint32_t out = exp == 0x0F800000u ? special : exp == 0 ? sub : normal;
  return std::bit_cast<float>(sign | out);
}

// x rounded to the nearest bf16 (or fp16) value, round to nearest even, as
// fp32: the model-dtype rounding the emulations, the sparse ops and the
// cache-exactness check all apply.
inline float round_to_16bit(float x, bool bf16) { return bf16 ? bf16_to_f32(f32_to_bf16(x)) : f16_to_f32(f32_to_f16(x)); }

inline constexpr std::uint16_t kBF16QuietNaN = 0x7FC0;
inline constexpr std::uint16_t kF16QuietNaN = 0x7E00;

}  // namespace mlagate
