// Layout strided (cases/LAYOUTS.md): the views vLLM hands a decode kernel,
// made around a decode call by the decode op and the layer op's decode step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backends/decode_args.h"
#include "cases/tensor.h"

namespace mlagate {

// q_lat and q_pe are slices of one fused [T, N, L+R] tensor; o_lat is written
// into a buffer whose head rows are kOutPad elements longer, lse into one of
// kLsePad more heads per token. The padding holds GuardedBuffer's guard byte
// and must come back unchanged; the payload starts as the guarded buffers'
// (poisoned) payload and goes back into them after the call, so the outputs
// are judged as in every other layout.
class StridedDecodeViews {
 public:
  static constexpr std::int64_t kOutPad = 64, kLsePad = 8;

  // o, lse: the op's contiguous (guarded) outputs [T, N, L] and [T, N].
  StridedDecodeViews(const Tensor& q_lat, const Tensor& q_pe, const TensorView& o, const TensorView& lse);
  const TensorView& q_lat() const { return q_lat_; }
  const TensorView& q_pe() const { return q_pe_; }
  const TensorView& o_lat() const { return o_lat_; }
  const TensorView& lse() const { return lse_view_; }
  // After the call: "" when every padding byte is unchanged (else where the
  // first write went), and the payload copied into o and lse.
  std::string finish(const TensorView& o, const TensorView& lse) const;

 private:
  std::int64_t t_, n_, l_, r_, esz_;
  Tensor fused_, o_, lse_;
  TensorView q_lat_, q_pe_, o_lat_, lse_view_;
};

// One decode call under the case's layout, as the decode op and the layer
// op's decode step make it: vLLM's strided views where the case is strided
// and the backend takes them, else the contiguous buffers; finish() says where
// a write went past a view or into another layer of the stacked cache ("" if
// nowhere) and leaves the payload in the contiguous outputs.
class LayoutDecodeCall {
 public:
  LayoutDecodeCall(bool strided, const Tensor& q_lat, const Tensor& q_pe, const TensorView& o, const TensorView& lse);
  DecodeArgs args(const PagedCache& cache, const DecodeBatch& batch, double scale, float k_scale) const;
  std::string finish(const PagedCache& cache) const;

 private:
  const Tensor& q_lat_;
  const Tensor& q_pe_;
  TensorView o_, lse_;
  std::optional<StridedDecodeViews> strided_;
};

}  // namespace mlagate
