// The merge_states op's answer (SPEC: Ops, merge_states), one source of truth:
// merge_row is the one core, run in fp64 for the reference and in fp32 by the
// harness's layer glue (reference/glue.cpp merge_states, chunked prefill) and
// by the baseline policy's yardstick (the fp32 merge rounded to the output
// dtype). For one (token, head) row with sides a (prefix) and b (suffix):
//   an lse of +inf means an empty side, as -inf does (FlashAttention 2 writes
//   +inf for a row with no key; vLLM's merge reads it so);
//   m = max(la, lb); both empty (m = -inf): out = 0, lse = -inf;
//   else wa = exp(la - m), wb = exp(lb - m) (an empty side's weight is 0 and
//   its values are never read), out = (a wa + b wb) / (wa + wb),
//   lse = m + log(wa + wb).
// No NaN for any pair of infinities, no overflow for any lse difference (the
// larger side's weight is 1, the smaller one's underflows to 0 gracefully).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace mlagate {

struct MergeInputs;  // cases/merge.h

// One row: out[0..dim) and the merged lse from the two sides' lse and values.
// `out` may alias `a` (the glue's running accumulator). F: float or double.
// The rules every form of the merge shares (vLLM's): either infinity is an
// empty side (-inf, weight 0); m is the larger lse. True when both sides are
// empty: out is zeroed and the merged lse is -inf.
template <class F>
bool merge_sides_empty(F& la, F& lb, F& m, F* out, std::int64_t dim) {
  constexpr F kNegInf = -std::numeric_limits<F>::infinity();
  if (std::isinf(la)) la = kNegInf;
  if (std::isinf(lb)) lb = kNegInf;
  m = std::max(la, lb);
  if (m != kNegInf) return false;
  for (std::int64_t x = 0; x < dim; ++x) out[x] = F(0);
  return true;
}

template <class F>
F merge_row(F la, F lb, const F* a, const F* b, F* out, std::int64_t dim) {
  constexpr F kNegInf = -std::numeric_limits<F>::infinity();
  F m;
  if (merge_sides_empty(la, lb, m, out, dim)) return kNegInf;
  const F wa = std::exp(la - m), wb = std::exp(lb - m), sum = wa + wb;
  for (std::int64_t x = 0; x < dim; ++x) {
    const F va = la == kNegInf ? F(0) : a[x];
    const F vb = lb == kNegInf ? F(0) : b[x];
    out[x] = (va * wa + vb * wb) / sum;
  }
  return m + std::log(sum);
}

// The baseline policy's lse floor for merge_states counts this many fp32
// roundings (reference/compare.h baseline_floor's dqk): max, two exp, a sum,
// a log and an add, with room for fast exp/log on GPUs.
inline constexpr int kMergeLseRoundings = 8;

// The fp64 reference of a merge case: out [T, N, D] and lse [T, N] (-inf for
// rows with no key), from the inputs as stored (exactly widened).
struct MergeReference {
  std::vector<double> out, lse;
};
MergeReference reference_merge(const MergeInputs& in);

// Plain same-precision merges, the output rounded to the inputs' dtype (fp32
// as is), whose larger error against reference_merge is the op's
// err_baseline: merge_row in fp32 (scales_first false), and vLLM's kernels'
// form, each side's scale exp(l - m) / sum computed first and the values
// multiplied by it (scales_first true). out as doubles of the rounded values.
MergeReference fp32_merge(const MergeInputs& in, bool scales_first = false);

}  // namespace mlagate
