// Bit-exact conversions between fp32 and the 16-bit model dtypes. Our own code,
// not the compiler's or a library's, so the same bits come out everywhere.
#pragma once

#include <bit>
#include <cstdint>

namespace mlagate {

// fp32 -> bf16, round to nearest even; NaN stays NaN (quiet), inf stays inf.
// Inline: the glue and the emulation round gigabytes through it, and only
// an inline body lets the compiler vectorize those loops.
inline std::uint16_t f32_to_bf16(float x) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0)
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // keep sign, force quiet NaN
  // Round to nearest even: add 0x7FFF plus the lowest kept bit; overflow to inf is correct.
  const std::uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;
  return static_cast<std::uint16_t>(u >> 16);
}
inline float bf16_to_f32(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

// dst[0..n) = src rounded to bf16 (or fp16), element by element as above; the
// bf16 loop vectorizes.
void f32_run_to_16bit(const float* src, std::int64_t n, bool bf16, std::uint16_t* dst);

// fp32 -> IEEE binary16, round to nearest even, with subnormals; overflow -> inf.
std::uint16_t f32_to_f16(float x);
float f16_to_f32(std::uint16_t h);

inline constexpr std::uint16_t kBF16QuietNaN = 0x7FC0;
inline constexpr std::uint16_t kF16QuietNaN = 0x7E00;

}  // namespace mlagate
