// The bytes of a paged cache's pool (PagedCache::data) and where they sit in
// memory (cases/LAYOUTS.md). Ordinarily a zero-filled owning buffer, exactly a
// Tensor. Two layouts of a serving engine place it differently:
//  - a stacked multi-layer cache: the pool is one layer's slice of a larger
//    allocation, with other layers' bytes before and after it, filled with a
//    pattern that must survive every backend call (check_other_layers);
//  - a huge pool: most of it never written (a gap of reserved, unbacked
//    address space: MAP_NORESERVE pages that read as zero and cost no memory
//    until touched), the case's pages above the gap.
// Copies copy the live bytes only, so a 4 GiB pool of a few MB of pages
// copies a few MB and stays unbacked in the copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "cases/tensor.h"

namespace mlagate {

class PageStore {
 public:
  struct Placement {
    std::int64_t before = 0, after = 0;  // bytes of the other layers around the pool (stacked cache)
    std::int64_t gap_begin = 0, gap_end = 0;  // pool bytes [begin, end) never written: unbacked, read as zero
    bool placed() const { return before != 0 || after != 0 || gap_end > gap_begin; }
    bool operator==(const Placement&) const = default;
  };
  // The byte every other layer's bytes hold (stacked cache).
  static constexpr std::byte kOtherLayerByte{0x5A};

  PageStore() = default;
  // An ordinary pool: the tensor itself (zero-filled, as Tensor's constructor).
  PageStore(Tensor t) : dense_(std::move(t)) {}  // NOLINT: a Tensor is an unplaced store
  // A placed pool of `shape` uint8 bytes, zero (gap included) and the other
  // layers filled with kOtherLayerByte.
  PageStore(Shape shape, const Placement& p);
  PageStore(const PageStore& o);
  PageStore& operator=(const PageStore& o);
  PageStore(PageStore&& o) noexcept;
  PageStore& operator=(PageStore&& o) noexcept;
  ~PageStore();

  DType dtype() const { return mapped_ ? DType::kU8 : dense_.dtype(); }
  const Shape& shape() const { return mapped_ ? shape_ : dense_.shape(); }
  std::int64_t dim(std::size_t i) const { return shape().at(i); }
  std::int64_t numel() const { return shape_numel(shape()); }
  std::size_t nbytes() const { return mapped_ ? static_cast<std::size_t>(shape_numel(shape_)) : dense_.nbytes(); }
  bool empty() const { return nbytes() == 0; }
  std::byte* bytes() { return mapped_ ? mapped_ + placement_.before : dense_.bytes(); }
  const std::byte* bytes() const { return mapped_ ? mapped_ + placement_.before : dense_.bytes(); }
  template <class T>
  T* data() {
    return reinterpret_cast<T*>(bytes());
  }
  template <class T>
  const T* data() const {
    return reinterpret_cast<const T*>(bytes());
  }
  TensorView view() const { return {dtype(), shape(), const_cast<std::byte*>(bytes())}; }

  // An unplaced pool as the Tensor it is (golden files, tests); throws
  // std::logic_error for a placed one.
  const Tensor& tensor() const {
    if (mapped_) throw std::logic_error("PageStore::tensor: a placed pool is not a Tensor");
    return dense_;
  }
  const Placement& placement() const { return placement_; }
  // The whole allocation (other layers included) and the pool's offset in it.
  const std::byte* allocation() const { return mapped_ ? mapped_ : dense_.bytes(); }
  std::size_t allocation_bytes() const { return mapped_ ? mapped_bytes_ : dense_.nbytes(); }
  // The pool's live byte ranges [begin, end) in order: everything but the gap.
  // Uploads and comparisons read these alone (the gap's pages stay unbacked).
  template <class F>
  void for_each_live_range(F&& f) const {
    const auto n = static_cast<std::int64_t>(nbytes());
    if (placement_.gap_end <= placement_.gap_begin) {
      if (n > 0) f(std::int64_t{0}, n);
      return;
    }
    if (placement_.gap_begin > 0) f(std::int64_t{0}, placement_.gap_begin);
    if (placement_.gap_end < n) f(placement_.gap_end, n);
  }
  // Empty when the other layers' bytes all hold kOtherLayerByte; otherwise
  // where the first changed byte is ("layer before the cache, byte 17 of 4096").
  std::string check_other_layers() const;

 private:
  void map(std::size_t bytes);
  void unmap() noexcept;
  void copy_from(const PageStore& o);

  Tensor dense_;
  std::byte* mapped_ = nullptr;  // placed: the mmap'd allocation
  std::size_t mapped_bytes_ = 0;
  Shape shape_;
  Placement placement_;
};

}  // namespace mlagate
