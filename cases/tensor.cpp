// Host tensor storage and element access by dtype.
#include "cases/tensor.h"


#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "cases/encoding.h"

namespace mlagate {

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (std::int64_t d : s) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_str(s));
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  bytes_.assign(static_cast<std::size_t>(shape_numel(shape_)) * dtype_size(dtype_), std::byte{0});
}

void parallel_memcpy(void* to, const void* from, std::size_t n) {
  auto* dst = static_cast<std::byte*>(to);
  const auto* src = static_cast<const std::byte*>(from);
  constexpr std::size_t kPiece = std::size_t{1} << 20;
  if (n < 8 * kPiece) {
    if (n) std::memcpy(dst, src, n);
    return;
  }
  const std::int64_t pieces = static_cast<std::int64_t>((n + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < pieces; ++i) {
    const std::size_t at = static_cast<std::size_t>(i) * kPiece;
    std::memcpy(dst + at, src + at, std::min(kPiece, n - at));
  }
}

Tensor::Tensor(const Tensor& o) : dtype_(o.dtype_), shape_(o.shape_) {
  bytes_.resize(o.bytes_.size());  // left unset (DefaultInitAllocator): every byte is copied below
  parallel_memcpy(bytes_.data(), o.bytes_.data(), bytes_.size());
}

Tensor& Tensor::operator=(const Tensor& o) {
  if (this == &o) return *this;
  Shape shape = o.shape_;  // what can throw first, so that a failure leaves *this as it was or empty
  // Kept when big enough; else let go first, so that growing copies no stale bytes.
  if (bytes_.capacity() < o.bytes_.size()) {
    decltype(bytes_)().swap(bytes_);
    shape_ = Shape{0};  // no elements until the new storage is in place
  }
  bytes_.resize(o.bytes_.size());
  parallel_memcpy(bytes_.data(), o.bytes_.data(), bytes_.size());
  dtype_ = o.dtype_;
  shape_ = std::move(shape);
  return *this;
}

Tensor Tensor::for_overwrite(DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.bytes_.resize(static_cast<std::size_t>(shape_numel(t.shape_)) * dtype_size(dtype));
  return t;
}

bool TensorView::contiguous() const {
  for (std::size_t d = 0; d < strides.size(); ++d) {
    std::int64_t row_major = 1;
    for (std::size_t k = d + 1; k < shape.size(); ++k) row_major *= shape[k];
    if (shape[d] > 1 && strides[d] != row_major) return false;
  }
  return true;
}

std::int64_t TensorView::stride(std::size_t d) const {
  if (!strides.empty()) return strides.at(d);
  std::int64_t s = 1;
  for (std::size_t k = d + 1; k < shape.size(); ++k) s *= shape[k];
  return s;
}

std::size_t TensorView::span_bytes() const {
  const std::int64_t n = numel();
  if (n == 0) return 0;
  return static_cast<std::size_t>(offset_of(n - 1) + 1) * dtype_size(dtype);
}

namespace {
// Each innermost row of a view as (element offset, row length), in order;
// rows are runs of contiguous elements when the last dim's stride is 1.
template <class F>
void for_each_view_row(const TensorView& v, F&& f) {
  const std::int64_t n = v.numel();
  if (n == 0) return;
  const bool unit = v.shape.empty() || v.stride(v.shape.size() - 1) == 1;
  const std::int64_t w = unit && !v.shape.empty() ? v.shape.back() : 1;
  for (std::int64_t i = 0; i < n; i += w) f(i, v.offset_of(i), w);
}
}  // namespace

void TensorView::pack_into(void* dst) const {
  const std::size_t e = dtype_size(dtype);
  if (strides.empty()) {
    std::memcpy(dst, data, nbytes());
    return;
  }
  for_each_view_row(*this, [&](std::int64_t i, std::int64_t off, std::int64_t w) {
    std::memcpy(static_cast<std::byte*>(dst) + i * e, static_cast<const std::byte*>(data) + off * e,
                static_cast<std::size_t>(w) * e);
  });
}

void TensorView::unpack_from(const void* src) const {
  const std::size_t e = dtype_size(dtype);
  if (strides.empty()) {
    std::memcpy(data, src, nbytes());
    return;
  }
  for_each_view_row(*this, [&](std::int64_t i, std::int64_t off, std::int64_t w) {
    std::memcpy(static_cast<std::byte*>(data) + off * e, static_cast<const std::byte*>(src) + i * e,
                static_cast<std::size_t>(w) * e);
  });
}

std::int64_t TensorView::offset_of(std::int64_t i) const {
  if (strides.empty()) return i;
  std::int64_t off = 0;
  for (std::size_t d = shape.size(); d-- > 0;) {
    off += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return off;
}

double TensorView::get(std::int64_t i) const {
  const std::byte* p = static_cast<const std::byte*>(data) + offset_of(i) * static_cast<std::int64_t>(dtype_size(dtype));
  switch (dtype) {
    case DType::kF64: { double v; std::memcpy(&v, p, 8); return v; }
    case DType::kF32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::kBF16: { std::uint16_t v; std::memcpy(&v, p, 2); return bf16_to_f32(v); }
    case DType::kF16: { std::uint16_t v; std::memcpy(&v, p, 2); return f16_to_f32(v); }
    case DType::kI32: { std::int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::kI64: { std::int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case DType::kU8: { std::uint8_t v; std::memcpy(&v, p, 1); return v; }
  }
  return 0;
}

void TensorView::set(std::int64_t i, double v) const {
  std::byte* p = static_cast<std::byte*>(data) + offset_of(i) * static_cast<std::int64_t>(dtype_size(dtype));
  switch (dtype) {
    case DType::kF64: std::memcpy(p, &v, 8); return;
    case DType::kF32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); return; }
    // fp64 -> fp32 is IEEE round-to-nearest; then our own RNE to 16 bits.
    case DType::kBF16: { std::uint16_t b = f32_to_bf16(static_cast<float>(v)); std::memcpy(p, &b, 2); return; }
    case DType::kF16: { std::uint16_t b = f32_to_f16(static_cast<float>(v)); std::memcpy(p, &b, 2); return; }
    case DType::kI32: { std::int32_t x = static_cast<std::int32_t>(v); std::memcpy(p, &x, 4); return; }
    case DType::kI64: { std::int64_t x = static_cast<std::int64_t>(v); std::memcpy(p, &x, 8); return; }
    case DType::kU8: { std::uint8_t x = static_cast<std::uint8_t>(v); std::memcpy(p, &x, 1); return; }
  }
}

std::vector<double> Tensor::to_f64() const {
  std::vector<double> out(static_cast<std::size_t>(numel()));
  const TensorView v = view();
  for (std::int64_t i = 0; i < numel(); ++i) out[static_cast<std::size_t>(i)] = v.get(i);
  return out;
}

}  // namespace mlagate
