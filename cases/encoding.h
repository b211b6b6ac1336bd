// Bit-exact conversions between fp32 and the 16-bit model dtypes. Our own code,
// not the compiler's or a library's, so the same bits come out everywhere.
#pragma once

#include <cstdint>

namespace mlagate {

// fp32 -> bf16, round to nearest even; NaN stays NaN (quiet), inf stays inf.
std::uint16_t f32_to_bf16(float x);
float bf16_to_f32(std::uint16_t b);

// fp32 -> IEEE binary16, round to nearest even, with subnormals; overflow -> inf.
std::uint16_t f32_to_f16(float x);
float f16_to_f32(std::uint16_t h);

inline constexpr std::uint16_t kBF16QuietNaN = 0x7FC0;
inline constexpr std::uint16_t kF16QuietNaN = 0x7E00;

}  // namespace mlagate
