// StridedDecodeViews (strided_views.h): the fused q, the padded outputs and
// the check of their padding.
#include "harness/run/ops/decode/strided_views.h"

#include <cstring>

#include "harness/run/guarded.h"

namespace mlagate {
namespace {

std::string padding_change(const Tensor& t, std::int64_t payload, std::int64_t stride, const char* name, const char* row) {
  const std::int64_t rows = static_cast<std::int64_t>(t.nbytes()) / stride;
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t k = payload; k < stride; ++k)
      if (t.bytes()[i * stride + k] != GuardedBuffer::kGuardByte)
        return std::string(name) + ": a write past the view into its larger buffer, " + row + " " + std::to_string(i) +
               ", byte " + std::to_string(k - payload) + " past the row's end";
  return {};
}

}  // namespace

StridedDecodeViews::StridedDecodeViews(const Tensor& q_lat, const Tensor& q_pe, const TensorView& o, const TensorView& lse)
    : t_(q_lat.dim(0)), n_(q_lat.dim(1)), l_(q_lat.dim(2)), r_(q_pe.dim(2)),
      esz_(static_cast<std::int64_t>(dtype_size(q_lat.dtype()))),
      fused_(q_lat.dtype(), {t_, n_, l_ + r_}),
      o_(Tensor::for_overwrite(o.dtype, {t_, n_, l_ + kOutPad})),
      lse_(Tensor::for_overwrite(DType::kF32, {t_, n_ + kLsePad})) {
  std::memset(o_.bytes(), static_cast<int>(GuardedBuffer::kGuardByte), o_.nbytes());
  std::memset(lse_.bytes(), static_cast<int>(GuardedBuffer::kGuardByte), lse_.nbytes());
  q_lat_ = {q_lat.dtype(), {t_, n_, l_}, fused_.bytes()};
  q_lat_.strides = {n_ * (l_ + r_), l_ + r_, 1};
  q_pe_ = {q_lat.dtype(), {t_, n_, r_}, fused_.bytes() + l_ * esz_};
  q_pe_.strides = q_lat_.strides;
  o_lat_ = {o.dtype, {t_, n_, l_}, o_.bytes()};
  o_lat_.strides = {n_ * (l_ + kOutPad), l_ + kOutPad, 1};
  lse_view_ = {DType::kF32, {t_, n_}, lse_.bytes()};
  lse_view_.strides = {n_ + kLsePad, 1};
  // The inputs into their slices of the fused q, the outputs' (poisoned)
  // payload into the padded buffers: the views' elements only.
  q_lat_.unpack_from(q_lat.bytes());
  q_pe_.unpack_from(q_pe.bytes());
  o_lat_.unpack_from(o.data);
  lse_view_.unpack_from(lse.data);
}

std::string StridedDecodeViews::finish(const TensorView& o, const TensorView& lse) const {
  std::string where = padding_change(o_, l_ * esz_, (l_ + kOutPad) * esz_, "o_lat", "head row");
  if (where.empty()) where = padding_change(lse_, n_ * 4, (n_ + kLsePad) * 4, "lse", "token row");
  o_lat_.pack_into(o.data);
  lse_view_.pack_into(lse.data);
  return where;
}

LayoutDecodeCall::LayoutDecodeCall(bool strided, const Tensor& q_lat, const Tensor& q_pe, const TensorView& o,
                                   const TensorView& lse)
    : q_lat_(q_lat), q_pe_(q_pe), o_(o), lse_(lse) {
  if (strided) strided_.emplace(q_lat, q_pe, o, lse);
}

DecodeArgs LayoutDecodeCall::args(const PagedCache& cache, const DecodeBatch& batch, double scale, float k_scale) const {
  if (strided_)
    return decode_args(strided_->q_lat(), strided_->q_pe(), cache, batch, scale, k_scale, strided_->o_lat(), strided_->lse());
  return decode_args(q_lat_.view(), q_pe_.view(), cache, batch, scale, k_scale, o_, lse_);
}

std::string LayoutDecodeCall::finish(const PagedCache& cache) const {
  std::string where = strided_ ? strided_->finish(o_, lse_) : std::string();
  if (where.empty()) where = cache.data.check_other_layers();
  return where;
}

}  // namespace mlagate
