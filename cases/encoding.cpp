// fp32 <-> bf16/fp16 by bit manipulation, round to nearest even. Built with
// -ffp-contract=off; uses no floating-point library calls.
#include "cases/encoding.h"

#include <bit>
#include <cstdint>

namespace mlagate {

void f32_run_to_16bit(const float* src, std::int64_t n, bool bf16, std::uint16_t* dst) {
  if (bf16) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
  }
}

}  // namespace mlagate
