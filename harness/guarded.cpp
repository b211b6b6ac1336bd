// Guarded output buffers and dtype-aware poisoning.
#include "harness/guarded.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace mlagate {

void poison_fill(const TensorView& v, Poison p) {
  if (p == Poison::kZero || p == Poison::kNone) {
    std::memset(v.data, 0, v.nbytes());
    return;
  }
  const std::int64_t n = v.numel();
  switch (v.dtype) {
    case DType::kBF16:
    case DType::kF16: {
      const std::uint16_t b = poison_bits16(p, v.dtype);
      std::fill_n(static_cast<std::uint16_t*>(v.data), n, b);
      return;
    }
    case DType::kF32: {
      const float f = p == Poison::kNaN ? __builtin_nanf("") : 3.0e38f;
      std::fill_n(static_cast<float*>(v.data), n, f);
      return;
    }
    case DType::kF64: {
      const double d = p == Poison::kNaN ? __builtin_nan("") : 1.0e300;
      std::fill_n(static_cast<double*>(v.data), n, d);
      return;
    }
    default:
      std::memset(v.data, 0xA5, v.nbytes());
  }
}

GuardedBuffer::GuardedBuffer(DType dtype, Shape shape, Poison poison) : dtype_(dtype), shape_(std::move(shape)) {
  payload_bytes_ = static_cast<std::size_t>(shape_numel(shape_)) * dtype_size(dtype_);
  storage_.assign(payload_bytes_ + 2 * kGuardBytes, kGuardByte);
  poison_fill(view(), poison);
}

std::string GuardedBuffer::check_guards(const std::string& name) const {
  for (std::size_t i = 0; i < kGuardBytes; ++i)
    if (storage_[i] != kGuardByte)
      return "out-of-bounds write: " + std::to_string(kGuardBytes - i) + " byte(s) before " + name + " were modified";
  for (std::size_t i = 0; i < kGuardBytes; ++i)
    if (storage_[kGuardBytes + payload_bytes_ + i] != kGuardByte)
      return "out-of-bounds write: byte " + std::to_string(i) + " past the end of " + name + " was modified";
  return {};
}

}  // namespace mlagate
