// merge_states op execution: the kernel's arguments from a merge case, guarded
// outputs, the input check, timings.
#include "harness/run/ops/merge/merge_op.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "harness/run/case_context.h"
#include "harness/run/ops/driver.h"
#include "reference/merge_reference.h"

#include <chrono>
#include <cstring>

#include "cases/merge.h"
#include "reports/profile.h"

namespace mlagate {

OpRun run_merge_op(Backend& b, const Case& c, const ExecOptions& opt) {
  const MergeInputs& in = *c.merge;
  const std::int64_t T = c.num_tokens, N = c.spec.num_heads(), D = c.spec.merge.head_dim;
  // Copies, so a backend that writes into its inputs neither changes the next
  // backend's nor goes unnoticed (vLLM calls the merge out of place).
  Tensor po = in.prefix_output, pl = in.prefix_lse, so = in.suffix_output, sl = in.suffix_lse;
  ProducedOutput out{"out", GuardedBuffer(c.spec.dtype, {T, N, D}, opt.poison, opt.reuse_buffers), N, D, false};
  ProducedOutput lse{"lse", GuardedBuffer(DType::kF32, {T, N}, opt.poison, opt.reuse_buffers), N, 1, true};
  MergeStatesArgs a;
  a.prefix_output = po.view();
  a.prefix_lse = pl.view();
  a.suffix_output = so.view();
  a.suffix_lse = sl.view();
  a.output = out.buf.view();
  a.output_lse = lse.buf.view();
  OpRun run;
  const auto t0 = std::chrono::steady_clock::now();
  b.merge_states(a);
  run.run_ms = backend_call_done(t0);
  const std::pair<const Tensor*, const Tensor*> given[] = {{&po, &in.prefix_output}, {&pl, &in.prefix_lse},
                                                           {&so, &in.suffix_output}, {&sl, &in.suffix_lse}};
  const char* names[] = {"prefix_output", "prefix_lse", "suffix_output", "suffix_lse"};
  for (int i = 0; i < 4 && run.guard_violation.empty(); ++i)
    if (std::memcmp(given[i].first->bytes(), given[i].second->bytes(), given[i].second->nbytes()) != 0)
      run.guard_violation = std::string("merge_states wrote into its input ") + names[i];
  finish_kernel_op(run, out, lse, c.num_requests, "merge_states");
  return run;
}

namespace {

using run_detail::Clock;
using run_detail::ms_since;

// The fp64 reference of a merge case and the fp32 merge's error against it
// (its err_baseline), both from merge_row (reference/merge_reference.h).
struct MergeState : OpState {
  std::optional<MergeReference> ref;
  std::optional<BaselineErrors> base;
};

const MergeReference& merge_reference(CaseContext& ctx) {
  MergeState& s = ctx.slot<MergeState>();
  if (!s.ref) {
    const auto t0 = Clock::now();
    s.ref = reference_merge(*ctx.c.merge);
    ctx.reference_ms += ms_since(t0);
  }
  return *s.ref;
}

// The larger of the two fp32 merges' errors (either side's order).
double worse_error(const std::vector<double>& e, const std::vector<double>& f, const std::vector<double>& ref) {
  return std::max(baseline_error(e, ref, 0, e.size()), baseline_error(f, ref, 0, f.size()));
}

class MergeDriver final : public OpDriver {
 public:
  Op op() const override { return Op::kMergeStates; }
  Support admit(const Capabilities&, const CaseSpec& spec) const override {
    return spec.merge.active() ? Support::yes() : Support::no("merge_states needs a merge case");
  }
  bool reads_cache() const override { return false; }
  bool runs_merge_cases() const override { return true; }
  OpRun run(CaseContext& ctx, Backend& b, const RunConfig& cfg, Record&) const override {
    merge_reference(ctx);
    return run_merge_op(b, ctx.c, cfg.exec);
  }
  JudgedAgainst reference(CaseContext& ctx) const override {
    const MergeReference& r = merge_reference(ctx);
    // A merge case whose every row is empty on both sides: zero is the answer.
    const bool empty = std::all_of(r.lse.begin(), r.lse.end(), [](double l) { return std::isinf(l); });
    return {&r.out, &r.lse, empty};
  }
  BaselineErrors baseline(CaseContext& ctx, const OpRun&, const RunConfig&) const override {
    MergeState& s = ctx.slot<MergeState>();
    if (!s.base) {
      const MergeReference& r = merge_reference(ctx);
      const auto t0 = Clock::now();
      const MergeReference e = fp32_merge(*ctx.c.merge), f = fp32_merge(*ctx.c.merge, true);
      s.base = BaselineErrors{worse_error(e.out, f.out, r.out), worse_error(e.lse, f.lse, r.lse)};
      ctx.baseline_ms += ms_since(t0);
    }
    return *s.base;
  }
  // A merge's handful of fp32 operations (max, two exp, a sum, a log, an add).
  int lse_roundings(const CaseSpec&) const override { return kMergeLseRoundings; }
  void adopt(PreparedCase& p, CaseContext& ctx) const override {
    if (p.merge) ctx.slot<MergeState>().ref = std::move(p.merge);
  }
};

}  // namespace

const OpDriver& merge_driver() {
  static const MergeDriver d;
  return d;
}

}  // namespace mlagate
