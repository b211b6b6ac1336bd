// The kernel-level decode op: its call, its per-case state and its driver.
#include "harness/run/ops/decode/decode.h"

#include <chrono>
#include <optional>

#include "backends/decode_args.h"
#include "harness/run/core_share.h"
#include "harness/run/ops/decode/strided_views.h"
#include "reference/fp64_reference.h"
#include "reference/glue.h"
#include "reference/sdpa_emulation.h"
#include "reports/profile.h"

namespace mlagate {

using run_detail::Clock;
using run_detail::ms_since;

OpRun run_decode_op(Backend& b, const Case& c, const PagedCache& cache, const Tensor& q_lat, const Tensor& q_pe,
                    const ExecOptions& opt) {
  const std::int64_t N = c.spec.num_heads(), L = c.spec.dims.kv_lora_rank, T = c.num_tokens;
  OpRun run;
  ProducedOutput o{"o_lat", GuardedBuffer(c.spec.dtype, {T, N, L}, opt.poison, opt.reuse_buffers), N, L, false};
  ProducedOutput l{"lse", GuardedBuffer(DType::kF32, {T, N}, opt.poison, opt.reuse_buffers), N, 1, true};
  std::vector<std::int32_t> rows(static_cast<std::size_t>(c.num_requests));
  for (int i = 0; i < c.num_requests; ++i) rows[i] = i;
  // check_capabilities refused a strided case to a backend without strided views.
  const LayoutDecodeCall call(c.spec.layout.strided, q_lat, q_pe, o.buf.view(), l.buf.view());
  const DecodeArgs a = call.args(cache, {c.seq_lens, c.query_start_loc, rows}, c.spec.softmax_scale(), c.spec.k_scale);
  const auto t0 = Clock::now();
  b.decode(a);
  run.run_ms = backend_call_done(t0);
  run.guard_violation = call.finish(cache);
  finish_kernel_op(run, o, l, c.num_requests, "decode");
  return run;
}

// A case of the same inputs keeps the reference over them when this one's
// cache was not fp8 (then it is the unquantized one).
std::unique_ptr<OpState> DecodeState::keep_for_inputs(bool was_fp8) {
  auto kept = std::make_unique<DecodeState>();
  kept->unquantized_mqa = !was_fp8 && !mqa_o_lat.empty() ? std::move(mqa_o_lat) : std::move(unquantized_mqa);
  if (!kept->unquantized_mqa) return nullptr;
  return kept;
}

DecodeState& decode_state(CaseContext& ctx) {
  DecodeState& s = ctx.slot<DecodeState>();
  if (s.q_lat) return s;
  const Case& c = ctx.c;
  take_spare_cores();
  const auto t0 = Clock::now();
  std::vector<int> tokens(static_cast<std::size_t>(c.num_tokens));
  for (int t = 0; t < c.num_tokens; ++t) tokens[static_cast<std::size_t>(t)] = t;
  s.q_lat.emplace();
  s.q_pe.emplace();
  absorb_queries(c, tokens, *s.q_lat, *s.q_pe);
  if (ctx.reference && ctx.reference->mqa)
    ctx.reference->mqa(c, s.q_lat->view(), s.mqa_o_lat, s.mqa_lse);
  else
    reference_mqa(c, s.q_lat->view(), s.mqa_o_lat, s.mqa_lse);
  ctx.reference_ms += ms_since(t0);
  return s;
}

BaselineErrors decode_baseline(CaseContext& ctx) {
  DecodeState& s = decode_state(ctx);
  if (!s.base) {
    take_spare_cores();
    const auto t0 = Clock::now();
    const SdpaResult e = emulate_sdpa_decode_op(ctx.c, s.q_lat->view());
    s.base = BaselineErrors{baseline_error(e, false, s.mqa_o_lat, 0, e.out.size()),
                            baseline_error(e, true, s.mqa_lse, 0, e.lse.size())};
    ctx.baseline_ms += ms_since(t0);
  }
  return *s.base;
}

namespace {

class DecodeDriver final : public OpDriver {
 public:
  Op op() const override { return Op::kDecode; }
  OpRun run(CaseContext& ctx, Backend& b, const RunConfig& cfg, Record& r) const override {
    const PagedCache& full = ctx.cache(r.block_size, true, cfg.exec, r.timings.cache_ms);
    const DecodeState& s = decode_state(ctx);
    return run_decode_op(b, ctx.c, full, *s.q_lat, *s.q_pe, cfg.exec);
  }
  JudgedAgainst reference(CaseContext& ctx) const override {
    const DecodeState& s = decode_state(ctx);
    return {&s.mqa_o_lat, &s.mqa_lse};
  }
  BaselineErrors baseline(CaseContext& ctx, const OpRun&, const RunConfig&) const override {
    return decode_baseline(ctx);
  }
  // The reference on the same absorbed queries over the unquantized inputs.
  const std::vector<double>* unquantized_main(CaseContext& ctx) const override {
    DecodeState& s = decode_state(ctx);
    ctx.without_cache_values([&] {
      if (s.unquantized_mqa) return;
      std::vector<double> o, l;
      reference_mqa(ctx.c, s.q_lat->view(), o, l);
      s.unquantized_mqa = std::move(o);
    });
    return &*s.unquantized_mqa;
  }
  void adopt(PreparedCase& p, CaseContext& ctx) const override {
    if (!p.decode && !p.unquantized_mqa && !(p.baselines && p.baselines->decode_op)) return;
    DecodeState& s = ctx.slot<DecodeState>();
    if (p.decode) {
      s.q_lat = std::move(p.decode->q_lat);
      s.q_pe = std::move(p.decode->q_pe);
      s.mqa_o_lat = std::move(p.decode->o_lat);
      s.mqa_lse = std::move(p.decode->lse);
    }
    if (p.baselines && p.baselines->decode_op)
      s.base = BaselineErrors{(*p.baselines->decode_op)[0], (*p.baselines->decode_op)[1]};
    if (p.unquantized_mqa) s.unquantized_mqa = std::move(*p.unquantized_mqa);
  }
  // The paged cache with the new tokens, and the absorbed queries and reference.
  void plan_ahead(const Backend& b, const CaseSpec& spec, const RunConfig& cfg, AheadPlan& plan) const override {
    if (spec.merge.active() || !b.supports(spec, Op::kDecode).ok) return;
    const int bs = resolve_block_size(b.capabilities(), spec);
    plan.add(plan.caches, "cache/" + std::to_string(bs) + "/1",
             [bs, &cfg](CaseContext& ctx) { ctx.cache(bs, true, cfg.exec, ctx.cache_ms); });
    plan.add(plan.inputs, "decode", [](CaseContext& ctx) { decode_state(ctx); });
  }
};

}  // namespace

const OpDriver& decode_driver() {
  static const DecodeDriver d;
  return d;
}

}  // namespace mlagate
