// reference_merge and fp32_merge: merge_row (merge_reference.h) over every
// row of a merge case, in fp64 and in fp32.
#include "reference/merge_reference.h"

#include <type_traits>

#include "cases/encoding.h"
#include "cases/merge.h"
#include "reference/detail/widen.h"

namespace mlagate {

namespace {

// vLLM's form of the merge in fp32: the same infinity rules, the scales first.
float merge_row_scales_first(float la, float lb, const float* a, const float* b, float* out, std::int64_t dim) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float m;
  if (merge_sides_empty(la, lb, m, out, dim)) return kNegInf;
  const float wa = std::exp(la - m), wb = std::exp(lb - m), sum = wa + wb;
  const float sa = wa / sum, sb = wb / sum;
  for (std::int64_t x = 0; x < dim; ++x) out[x] = (la == kNegInf ? 0.f : a[x] * sa) + (lb == kNegInf ? 0.f : b[x] * sb);
  return std::log(sum) + m;
}

template <class F>
MergeReference merge_all(const MergeInputs& in, DType round_to, bool scales_first = false) {
  const std::int64_t rows = in.prefix_lse.numel();
  const std::int64_t dim = rows ? in.prefix_output.numel() / rows : 0;
  MergeReference r;
  r.out.resize(static_cast<std::size_t>(rows * dim));
  r.lse.resize(static_cast<std::size_t>(rows));
  std::vector<F> a(static_cast<std::size_t>(dim)), b(static_cast<std::size_t>(dim)), o(static_cast<std::size_t>(dim));
  const TensorView pa = in.prefix_output.view(), pb = in.suffix_output.view();
  for (std::int64_t row = 0; row < rows; ++row) {
    detail::widen_any(pa, row * dim, dim, a.data());
    detail::widen_any(pb, row * dim, dim, b.data());
    const F la = static_cast<F>(in.prefix_lse.data<float>()[row]);
    const F lb = static_cast<F>(in.suffix_lse.data<float>()[row]);
    F l;
    if constexpr (std::is_same_v<F, float>)
      l = scales_first ? merge_row_scales_first(la, lb, a.data(), b.data(), o.data(), dim)
                       : merge_row<F>(la, lb, a.data(), b.data(), o.data(), dim);
    else
      l = merge_row<F>(la, lb, a.data(), b.data(), o.data(), dim);
    r.lse[static_cast<std::size_t>(row)] = static_cast<double>(l);
    for (std::int64_t x = 0; x < dim; ++x) {
      double v = static_cast<double>(o[static_cast<std::size_t>(x)]);
      if (round_to == DType::kBF16) v = bf16_to_f32(f32_to_bf16(static_cast<float>(v)));
      if (round_to == DType::kF16) v = f16_to_f32(f32_to_f16(static_cast<float>(v)));
      r.out[static_cast<std::size_t>(row * dim + x)] = v;
    }
  }
  return r;
}

}  // namespace

MergeReference reference_merge(const MergeInputs& in) { return merge_all<double>(in, DType::kF64); }

MergeReference fp32_merge(const MergeInputs& in, bool scales_first) {
  return merge_all<float>(in, in.prefix_output.dtype(), scales_first);
}

}  // namespace mlagate
