// fp32 <-> bf16/fp16 by bit manipulation, round to nearest even. Built with
// -ffp-contract=off; uses no floating-point library calls.
#include "cases/encoding.h"

#include <bit>
#include <cstdint>

namespace mlagate {

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
