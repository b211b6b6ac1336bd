// The kernel-level prefill op: its call, its err_baseline and its driver.
#include "harness/run/ops/prefill/prefill.h"

#include <chrono>
#include <optional>

#include "harness/run/case_context.h"
#include "harness/run/core_share.h"
#include "harness/run/ops/layer/layer.h"
#include "reference/sdpa_emulation.h"
#include "reports/profile.h"

namespace mlagate {

using run_detail::Clock;
using run_detail::ms_since;

OpRun run_prefill_op(Backend& b, const Case& c, const Tensor& k, const Tensor& v, const ExecOptions& opt) {
  const std::int64_t N = c.spec.num_heads(), V = c.spec.dims.v_head_dim, T = c.num_tokens;
  OpRun run;
  ProducedOutput o{"o", GuardedBuffer(c.spec.dtype, {T, N, V}, opt.poison, opt.reuse_buffers), N, V, false};
  ProducedOutput l{"lse", GuardedBuffer(DType::kF32, {T, N}, opt.poison, opt.reuse_buffers), N, 1, true};
  PrefillArgs a;
  a.q = c.q.view();
  a.k = k.view();
  a.v = v.view();
  a.cu_seqlens_q = c.query_start_loc;
  a.cu_seqlens_k = c.kv_start_loc;
  a.causal = true;
  a.scale = c.spec.softmax_scale();
  a.o = o.buf.view();
  a.lse = l.buf.view();
  const auto t0 = Clock::now();
  b.prefill(a);
  run.run_ms = backend_call_done(t0);
  finish_kernel_op(run, o, l, c.num_requests, "prefill");
  return run;
}

namespace {

struct PrefillState : OpState {
  std::optional<BaselineErrors> base;  // err_baseline (the model-dtype emulation's)
};

class PrefillDriver final : public OpDriver {
 public:
  Op op() const override { return Op::kPrefill; }
  bool reads_cache() const override { return false; }
  OpRun run(CaseContext& ctx, Backend& b, const RunConfig& cfg, Record&) const override {
    const auto [k, v] = case_projection_of_all(ctx);
    const std::uint64_t k_print = fingerprint(*k), v_print = fingerprint(*v);
    // Lent, not copied: a backend that wrote into them must not change the
    // next backend's inputs nor the baseline's keys, whether it returned or threw.
    const auto check = [&] {
      if (fingerprint(*k) != k_print || fingerprint(*v) != v_print) withdraw_projection(ctx, k);
    };
    OpRun run;
    try {
      run = run_prefill_op(b, ctx.c, *k, *v, cfg.exec);
    } catch (...) {
      check();
      throw;
    }
    check();
    return run;
  }
  JudgedAgainst reference(CaseContext& ctx) const override {
    const ReferenceOutputs& g = ctx.get_reference();
    return {&g.out, &g.lse};
  }
  BaselineErrors baseline(CaseContext& ctx, const OpRun&, const RunConfig&) const override {
    PrefillState& s = ctx.slot<PrefillState>();
    if (!s.base) {
      const auto [k, v] = case_projection_of_all(ctx);
      const ReferenceOutputs& g = ctx.get_reference();
      take_spare_cores();
      const auto t0 = Clock::now();
      const SdpaResult e = emulate_sdpa_prefill_op(ctx.c, k->view(), v->view(), &case_projection(ctx));
      s.base = BaselineErrors{baseline_error(e.out, g.out, 0, e.out.size()), baseline_error(e.lse, g.lse, 0, e.lse.size())};
      ctx.baseline_ms += ms_since(t0);
    }
    return *s.base;
  }
  int lse_roundings(const CaseSpec& spec) const override { return spec.dims.nope_dim + spec.dims.rope_dim; }
  const std::vector<double>* unquantized_main(CaseContext& ctx) const override { return &ctx.unquantized_absorbed(); }
  void adopt(PreparedCase& p, CaseContext& ctx) const override {
    if (p.baselines && p.baselines->prefill_op)
      ctx.slot<PrefillState>().base = BaselineErrors{(*p.baselines->prefill_op)[0], (*p.baselines->prefill_op)[1]};
  }
};

}  // namespace

const OpDriver& prefill_driver() {
  static const PrefillDriver d;
  return d;
}

}  // namespace mlagate
