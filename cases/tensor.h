// Host tensors: an owning, contiguous row-major Tensor and a non-owning
// TensorView handed to backends. Values of 16-bit dtypes are stored as bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cases/block_pool.h"
#include "cases/dtype.h"

namespace mlagate {

using Shape = std::vector<std::int64_t>;

std::int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 16, 576]"

// Non-owning view of row-major data (host or, later, device): contiguous, or
// with element strides (a slice of a larger tensor, cases/LAYOUTS.md).
struct TensorView {
  DType dtype = DType::kF32;
  Shape shape;
  void* data = nullptr;  // element [0, ..., 0]
  // data is CUDA device memory, not host memory: only in the prefill inputs
  // the layer glue lends a backend whose Capabilities::device_inputs says it
  // reads them there (reference/device_staging.h). get(), set() and every
  // host read are invalid on such a view.
  bool on_device = false;
  // Element strides per dim; empty: contiguous row-major. Only a backend
  // whose Capabilities::strided_views says so is ever handed a strided view;
  // nbytes(), as<T>() indexing and every flat read assume contiguous data.
  std::vector<std::int64_t> strides = {};

  std::int64_t numel() const { return shape_numel(shape); }
  bool contiguous() const;
  // Stride of dim d in elements (the row-major one where strides is empty).
  std::int64_t stride(std::size_t d) const;
  // Element offset of logical (row-major flat) element i.
  std::int64_t offset_of(std::int64_t i) const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  // Bytes from data to the end of the last element: what a copy of the view
  // with its strides (and whatever lies between its rows) covers.
  std::size_t span_bytes() const;
  // The elements in row-major order into / from a packed buffer of nbytes()
  // (what an adapter's .contiguous() or output.copy_(o) does).
  void pack_into(void* dst) const;
  void unpack_from(const void* src) const;
  template <class T>
  T* as() const {
    if (sizeof(T) != dtype_size(dtype)) throw std::logic_error("TensorView::as: element size mismatch");
    return static_cast<T*>(data);
  }
  // Element i (logical row-major order, strides honoured) converted to double (any dtype).
  double get(std::int64_t i) const;
  // Store v into element i (as get), rounding to the dtype (RNE for bf16/fp16).
  void set(std::int64_t i, double v) const;
};

// Owning tensor, zero-filled on construction (for_overwrite: left unset).
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape);
  // For a producer that writes every element: no zero-filling pass over what
  // it is about to overwrite (the layer op's up-projected K and V are a GB at
  // TP 1, where that pass cost seconds).
  static Tensor for_overwrite(DType dtype, Shape shape);
  // Copies spread large byte ranges over the threads (a TP 1 case's tensors
  // and caches are hundreds of MB); assignment reuses the storage it has when
  // that is big enough, so a buffer copied into again and again faults its
  // pages in once.
  Tensor(const Tensor& o);
  Tensor& operator=(const Tensor& o);
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  ~Tensor() = default;

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(std::size_t i) const { return shape_.at(i); }
  std::int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return bytes_.size(); }
  bool empty() const { return bytes_.empty(); }

  std::byte* bytes() { return bytes_.data(); }
  const std::byte* bytes() const { return bytes_.data(); }
  template <class T>
  T* data() {
    check_elem(sizeof(T));
    return reinterpret_cast<T*>(bytes_.data());
  }
  template <class T>
  const T* data() const {
    check_elem(sizeof(T));
    return reinterpret_cast<const T*>(bytes_.data());
  }

  TensorView view() { return {dtype_, shape_, bytes_.data()}; }
  TensorView view() const { return {dtype_, shape_, const_cast<std::byte*>(bytes_.data())}; }
  double get(std::int64_t i) const { return view().get(i); }
  void set(std::int64_t i, double v) { view().set(i, v); }

  // All elements as double (the reference reference reads inputs this way).
  std::vector<double> to_f64() const;

 private:
  void check_elem(std::size_t s) const {
    if (s != dtype_size(dtype_)) throw std::logic_error("Tensor::data: element size mismatch");
  }
  DType dtype_ = DType::kF32;
  Shape shape_;
  // resize() default-initialises (leaves bytes unset) where std::allocator
  // would value-initialise (zero) them: zeroing is the constructor's choice.
  // Blocks of kBlockPoolMinBytes and more come from the process's pool of
  // kept blocks (block_pool.h: a case's tensors are hundreds of MB, and
  // faulting fresh pages in for every case was a third of explore's CPU).
  template <class T>
  struct DefaultInitAllocator : std::allocator<T> {
    template <class U>
    struct rebind {
      using other = DefaultInitAllocator<U>;
    };
    DefaultInitAllocator() = default;
    template <class U>
    DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
    static bool pooled(std::size_t n) { return kBlockPoolForTensors && n * sizeof(T) >= kBlockPoolMinBytes; }
    T* allocate(std::size_t n) {
      if (pooled(n)) return static_cast<T*>(block_pool_take(n * sizeof(T)));
      return std::allocator<T>::allocate(n);
    }
    void deallocate(T* p, std::size_t n) noexcept {
      if (pooled(n)) block_pool_give(p, n * sizeof(T));
      else std::allocator<T>::deallocate(p, n);
    }
    template <class U>
    void construct(U* p) noexcept {
      ::new (static_cast<void*>(p)) U;
    }
    template <class U, class... Args>
    void construct(U* p, Args&&... args) {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  };
  // Over-aligned storage is not needed: every element type is <= 8 bytes and
  // storage from operator new is 16-byte aligned.
  std::vector<std::byte, DefaultInitAllocator<std::byte>> bytes_;
};

// memcpy in 1 MiB pieces on every thread above 8 MiB, one memcpy below
// (serial inside a parallel region): Tensor's copies, and host copies of
// hundreds of MB elsewhere (the device staging's pinned buffers).
void parallel_memcpy(void* dst, const void* src, std::size_t n);

}  // namespace mlagate
