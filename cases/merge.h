// Inputs of the merge_states op (vLLM's merge_attn_states): two partial
// attention results of the same T x N rows, the prefix's and the suffix's,
// each an output [T, N, D] in the case's dtype and an lse [T, N] float32, as
// chunked prefill, cascade attention and decode-context-parallel hand them to
// the merge. Drawn from the case's generator (same seed, same bits anywhere):
// - each (token, head) row's kind from the case's lse pattern (cases/case_spec.h;
//   mixed: drawn per row), an empty side's lse -inf or +inf (FlashAttention 2's
//   empty row) and its output row 0, as the kernels that produce it write;
// - finite lse values 4 + 2 n(0,1) on each side, or with a gap g the suffix's
//   at the prefix's +- g (sign drawn per row): exp of the smaller side
//   underflows fp32 from g ~ 88 (and fp16/bf16 sums long before);
// - finite output values n(0,1) rounded to the dtype.
// The correct answer is reference/merge_reference.h's (SPEC: Ops, merge_states).
#pragma once

#include <cstdint>
#include <memory>

#include "cases/case_spec.h"
#include "cases/tensor.h"

namespace mlagate {

struct MergeInputs {
  Tensor prefix_output;  // [T, N, D] the case's dtype
  Tensor prefix_lse;     // [T, N] float32
  Tensor suffix_output;  // [T, N, D]
  Tensor suffix_lse;     // [T, N] float32
};

// The kind of row `row` (= token * N + head): the case's pattern, or for
// kMixed the one drawn for that row. kBothPosInf rows are +inf on the prefix
// and +inf or -inf on the suffix (an FA2 partial beside an FA3 one).
LsePattern merge_row_kind(const CaseSpec& spec, std::int64_t row);

// Draws a merge case's inputs (spec.merge.active(); the spec validated).
std::shared_ptr<const MergeInputs> generate_merge(const CaseSpec& spec);

}  // namespace mlagate
