// The merge part of a golden file (detail/merge_states_io.h): written by the
// export, read and validated before any backend may act on it.
#include "golden/detail/merge_states_io.h"

#include <cmath>
#include <string>

namespace mlagate::golden {

void write_merge_group(hid_t g, const Case& c, const MergeReference& ref, const io::Where& w) {
  const MergeInputs& in = *c.merge;
  const h5::Group mg = io::create_group(g, kMergeGroup, w);
  const io::Where wm = w / kMergeGroup;
  const std::int64_t T = c.num_tokens, N = c.spec.num_heads(), D = c.spec.merge.head_dim;
  io::write_attr(mg.get(), "reference", "fp64 merge of the two partial results (reference/merge_reference.h reference_merge)", wm);
  io::write_attr(mg.get(), "lse_layout", "[T, N] float32, natural log; +inf or -inf: that side is empty", wm);
  io::write_tensor(mg.get(), "prefix_output", in.prefix_output, wm);
  io::write_tensor(mg.get(), "prefix_lse", in.prefix_lse, wm);
  io::write_tensor(mg.get(), "suffix_output", in.suffix_output, wm);
  io::write_tensor(mg.get(), "suffix_lse", in.suffix_lse, wm);
  io::write_dataset(mg.get(), "out", DType::kF64, {T, N, D}, ref.out.data(), wm, io::Compress::kNone);
  io::write_dataset(mg.get(), "lse", DType::kF64, {T, N}, ref.lse.data(), wm, io::Compress::kNone);
}

StoredMerge read_merge_group(hid_t g, const CaseSpec& spec, const io::Where& w, io::Budget& budget) {
  if (!io::has_link(g, kMergeGroup, w)) io::bad(w, "a merge case without its merge_states group");
  const h5::Group mg = io::open_group(g, kMergeGroup, w);
  const io::Where wm = w / kMergeGroup;
  const std::int64_t T = spec.num_tokens(), N = spec.num_heads(), D = spec.merge.head_dim;
  auto in = std::make_shared<MergeInputs>();
  in->prefix_output = io::read_tensor(mg.get(), "prefix_output", spec.dtype, {T, N, D}, wm, budget);
  in->prefix_lse = io::read_tensor(mg.get(), "prefix_lse", DType::kF32, {T, N}, wm, budget);
  in->suffix_output = io::read_tensor(mg.get(), "suffix_output", spec.dtype, {T, N, D}, wm, budget);
  in->suffix_lse = io::read_tensor(mg.get(), "suffix_lse", DType::kF32, {T, N}, wm, budget);
  StoredMerge st;
  st.ref.out = io::f64_values(io::read_tensor(mg.get(), "out", DType::kF64, {T, N, D}, wm, budget));
  st.ref.lse = io::f64_values(io::read_tensor(mg.get(), "lse", DType::kF64, {T, N}, wm, budget));
  for (std::size_t i = 0; i < st.ref.out.size(); ++i)
    if (!std::isfinite(st.ref.out[i])) io::bad(wm / "out", "non-finite reference at element " + std::to_string(i));
  for (std::size_t i = 0; i < st.ref.lse.size(); ++i)
    if (std::isnan(st.ref.lse[i]) || st.ref.lse[i] == INFINITY)
      io::bad(wm / "lse", "reference lse at row " + std::to_string(i) + " is neither finite nor -inf");
  for (const Tensor* t : {&in->prefix_lse, &in->suffix_lse})
    for (std::int64_t i = 0; i < t->numel(); ++i)
      if (std::isnan(t->data<float>()[i])) io::bad(wm, "a NaN input lse at row " + std::to_string(i));
  st.inputs = std::move(in);
  return st;
}

}  // namespace mlagate::golden
