// Guarded output buffers and dtype-aware poisoning.
#include "harness/run/guarded.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

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

namespace {
// Storage of destroyed reusable buffers, by capacity (--reuse-buffers).
struct Pool {
  std::mutex mutex;
  std::multimap<std::size_t, std::vector<std::byte>> free;
  static constexpr std::size_t kMaxEntries = 64;
};
Pool& pool() {
  static Pool p;
  return p;
}
}  // namespace

GuardedBuffer::GuardedBuffer(DType dtype, Shape shape, Poison poison, bool reuse)
    : dtype_(dtype), shape_(std::move(shape)), reuse_(reuse) {
  payload_bytes_ = static_cast<std::size_t>(shape_numel(shape_)) * dtype_size(dtype_);
  const std::size_t total = payload_bytes_ + 2 * kGuardBytes;
  if (reuse_) {
    std::lock_guard<std::mutex> lock(pool().mutex);
    // Best fit, as a caching allocator hands out a cached block at least as large.
    if (auto it = pool().free.lower_bound(total); it != pool().free.end()) {
      storage_ = std::move(it->second);
      pool().free.erase(it);
      storage_.resize(total);  // within capacity: the bytes stay where the last user left them
    }
  }
  if (storage_.size() == total) {
    // Reused: fresh guards, the payload as the last user left it unless poisoned.
    std::fill_n(storage_.begin(), kGuardBytes, kGuardByte);
    std::fill_n(storage_.end() - static_cast<std::ptrdiff_t>(kGuardBytes), kGuardBytes, kGuardByte);
    if (poison != Poison::kNone) poison_fill(view(), poison);
    return;
  }
  storage_.assign(total, kGuardByte);
  poison_fill(view(), poison);
}

GuardedBuffer::~GuardedBuffer() {
  if (!reuse_ || storage_.empty()) return;
  std::lock_guard<std::mutex> lock(pool().mutex);
  if (pool().free.size() < Pool::kMaxEntries) pool().free.emplace(storage_.capacity(), std::move(storage_));
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
