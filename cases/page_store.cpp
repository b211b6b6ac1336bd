// PageStore: an ordinary Tensor, or an anonymous mapping reserved without
// backing (MAP_NORESERVE) for a placed pool, so a pool past 4 GiB costs the
// memory of the pages written into it and nothing more.
#include "cases/page_store.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace mlagate {

void PageStore::map(std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw std::runtime_error("page pool: cannot reserve " + std::to_string(bytes) + " bytes of address space: " +
                             std::strerror(errno));
  mapped_ = static_cast<std::byte*>(p);
  mapped_bytes_ = bytes;
}

void PageStore::unmap() noexcept {
  if (mapped_) ::munmap(mapped_, mapped_bytes_);
  mapped_ = nullptr;
  mapped_bytes_ = 0;
}

PageStore::PageStore(Shape shape, const Placement& p) : shape_(std::move(shape)), placement_(p) {
  const std::int64_t n = shape_numel(shape_);
  if (p.before < 0 || p.after < 0 || p.gap_begin < 0 || p.gap_end > n || p.gap_begin > p.gap_end)
    throw std::invalid_argument("page pool: placement outside the pool");
  map(static_cast<std::size_t>(p.before + n + p.after));
  std::memset(mapped_, static_cast<int>(kOtherLayerByte), static_cast<std::size_t>(p.before));
  std::memset(mapped_ + p.before + n, static_cast<int>(kOtherLayerByte), static_cast<std::size_t>(p.after));
}

void PageStore::copy_from(const PageStore& o) {
  if (!o.mapped_) {
    dense_ = o.dense_;
    return;
  }
  shape_ = o.shape_;
  placement_ = o.placement_;
  map(o.mapped_bytes_);
  const auto before = static_cast<std::size_t>(placement_.before), after = static_cast<std::size_t>(placement_.after);
  std::memcpy(mapped_, o.mapped_, before);
  std::memcpy(mapped_ + before + o.nbytes(), o.mapped_ + before + o.nbytes(), after);
  o.for_each_live_range([&](std::int64_t b, std::int64_t e) {
    parallel_memcpy(bytes() + b, o.bytes() + b, static_cast<std::size_t>(e - b));
  });
}

PageStore::PageStore(const PageStore& o) { copy_from(o); }

PageStore& PageStore::operator=(const PageStore& o) {
  if (this == &o) return *this;
  // An unplaced store copied into an unplaced one reuses its storage (Tensor's rule).
  if (!o.mapped_ && !mapped_) {
    dense_ = o.dense_;
    return *this;
  }
  unmap();
  dense_ = Tensor();
  placement_ = {};
  shape_.clear();
  copy_from(o);
  return *this;
}

PageStore::PageStore(PageStore&& o) noexcept
    : dense_(std::move(o.dense_)), mapped_(o.mapped_), mapped_bytes_(o.mapped_bytes_), shape_(std::move(o.shape_)),
      placement_(o.placement_) {
  o.mapped_ = nullptr;
  o.mapped_bytes_ = 0;
  o.placement_ = {};
}

PageStore& PageStore::operator=(PageStore&& o) noexcept {
  if (this == &o) return *this;
  unmap();
  dense_ = std::move(o.dense_);
  mapped_ = o.mapped_;
  mapped_bytes_ = o.mapped_bytes_;
  shape_ = std::move(o.shape_);
  placement_ = o.placement_;
  o.mapped_ = nullptr;
  o.mapped_bytes_ = 0;
  o.placement_ = {};
  return *this;
}

PageStore::~PageStore() { unmap(); }

std::string PageStore::check_other_layers() const {
  if (!mapped_) return {};
  const auto scan = [&](const std::byte* p, std::int64_t n, const char* where) -> std::string {
    for (std::int64_t i = 0; i < n; ++i)
      if (p[i] != kOtherLayerByte)
        return std::string("the ") + where + " the cache changed: byte " + std::to_string(i) + " of " +
               std::to_string(n) + " is " + std::to_string(static_cast<unsigned>(p[i])) + ", was " +
               std::to_string(static_cast<unsigned>(kOtherLayerByte));
    return {};
  };
  std::string s = scan(mapped_, placement_.before, "layer before");
  if (s.empty()) s = scan(mapped_ + placement_.before + static_cast<std::int64_t>(nbytes()), placement_.after, "layer after");
  return s;
}

}  // namespace mlagate
