// Output buffers with guard bands: the payload is poisoned before the backend
// runs (stale or unwritten elements show up), and the guard bytes on both
// sides must come back unchanged (out-of-bounds writes show up).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "cases/paged_cache.h"
#include "cases/tensor.h"

namespace mlagate {

class GuardedBuffer {
 public:
  static constexpr std::size_t kGuardBytes = 256;
  static constexpr std::byte kGuardByte{0xA5};

  // reuse: the storage comes from (and goes back to) a process-wide pool of
  // earlier buffers of the same size, as a caching allocator's torch.empty
  // does; with Poison::kNone the payload then holds whatever the last user
  // left (--reuse-buffers), so stale memory shows up as it would in a model.
  GuardedBuffer(DType dtype, Shape shape, Poison poison, bool reuse = false);
  ~GuardedBuffer();
  GuardedBuffer(GuardedBuffer&&) noexcept = default;
  GuardedBuffer& operator=(GuardedBuffer&&) = default;

  TensorView view() { return {dtype_, shape_, storage_.data() + kGuardBytes}; }
  TensorView view() const { return {dtype_, shape_, const_cast<std::byte*>(storage_.data()) + kGuardBytes}; }
  // Empty when both guards are intact; otherwise where the first change is.
  std::string check_guards(const std::string& name) const;

 private:
  DType dtype_;
  Shape shape_;
  std::size_t payload_bytes_ = 0;
  std::vector<std::byte> storage_;
  bool reuse_ = false;
};

// Fills a float tensor's bytes with the poison pattern of its dtype.
void poison_fill(const TensorView& v, Poison p);

}  // namespace mlagate
