// fp32 <-> bf16/fp16 by bit manipulation, round to nearest even. Built with
// -ffp-contract=off; uses no floating-point library calls.
#include "cases/encoding.h"

#include <bit>
#include <cstdint>

namespace mlagate {

std::uint16_t f32_to_f16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u)  // inf or NaN
    return static_cast<std::uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x0200u : 0u));
  // 65520 and above round to inf (65504 is the largest finite half).
  if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  const int exp = static_cast<int>(abs >> 23) - 127;
  std::uint32_t mant = (abs & 0x007FFFFFu) | 0x00800000u;  // implicit bit
  if (exp < -25) return sign;  // below half the smallest subnormal: rounds to zero
  if (exp < -14) {
    // Subnormal half: value = mant * 2^(exp-23); half subnormal unit is 2^-24.
    const int shift = -exp - 1;  // 14..24: bits to drop so the unit becomes 2^-24
    const std::uint32_t kept = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    std::uint32_t r = kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
    return static_cast<std::uint16_t>(sign | r);  // r may carry into the exponent: still correct
  }
  // Normal: drop 13 mantissa bits with RNE; a carry may bump the exponent (to inf at most).
  std::uint32_t h = (static_cast<std::uint32_t>(exp + 15) << 10) | ((mant >> 13) & 0x3FFu);
  const std::uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    // Subnormal: normalize into an fp32 normal.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    return std::bit_cast<float>(sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3FFu) << 13));
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

void f32_run_to_16bit(const float* src, std::int64_t n, bool bf16, std::uint16_t* dst) {
  if (bf16) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
  }
}

}  // namespace mlagate
