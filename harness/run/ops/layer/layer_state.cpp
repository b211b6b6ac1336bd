// The layer op module's state in a case's context (LayerState): the glue
// cache its backends share with the case's projected rows, and the
// err_baseline of each (path, request); and the module's driver.
#include <algorithm>
#include <cmath>
#include <future>
#include <stdexcept>
#include <system_error>

#include "cases/errors.h"
#include "harness/run/case_context.h"
#include "harness/run/core_share.h"
#include "harness/run/ops/layer/layer.h"
#include "reference/sdpa_emulation.h"

namespace mlagate {

namespace {

using run_detail::Clock;
using run_detail::ms_since;

class LayerState : public OpState {
 public:
  explicit LayerState(CaseContext& ctx) : ctx_(ctx) {}

  LayerMemo memo;  // the layer op's backend-independent glue, shared by its backends
  // A golden file's stored err_baseline parts of the layer op (the emulation's:
  // used unless a replacement implementation computes them).
  std::optional<StoredBaselines> stored_layer_base;
  // The baseline policy's err_baseline (SPEC: Pass rules, rule 5): the max abs
  // error of the model-dtype SDPA reference against the reference, per form
  // (decode, prefill) and request (NaN until a backend routes it that way).
  std::array<std::vector<double>, 2> base_out, base_lse;

  // The case's own projected rows: made and filled on demand, counted with
  // the inputs (generate) except where the glue projects rows for a backend
  // and offers them.
  KvProjection& projection() {
    take_spare_cores();
    if (!memo.projection()) {
      const auto t0 = Clock::now();
      memo.projection(ctx_.c);
      ctx_.generate_ms += ms_since(t0);
    }
    return *memo.projection();
  }
  const KvProjection& projection(std::span<const int> requests) {
    KvProjection& p = projection();
    const auto t0 = Clock::now();
    p.ensure(requests);
    ctx_.generate_ms += ms_since(t0);
    return p;
  }
  std::pair<const Tensor*, const Tensor*> projection_of_all() {
    KvProjection& p = projection();
    const auto t0 = Clock::now();
    const Tensor* k = &p.k_all();
    const Tensor* v = &p.v_all();
    ctx_.generate_ms += ms_since(t0);
    return {k, v};
  }

  // The (form, request) pairs of the layer op's err_baseline that `paths`
  // need and that are not known yet, by form (decode, prefill).
  std::array<std::vector<int>, 2> layer_baseline_missing(const std::vector<std::string>& paths,
                                                        const BaselineImpl& impl) {
    const auto B = static_cast<std::size_t>(ctx_.c.num_requests);
    if (paths.size() != B)
      throw std::logic_error("layer_baseline: " + std::to_string(paths.size()) + " paths for " + std::to_string(B) +
                             " requests");
    std::array<std::vector<int>, 2> need;
    for (int f = 0; f < 2; ++f) {
      const SdpaForm form = f == 0 ? SdpaForm::kDecode : SdpaForm::kPrefill;
      std::vector<double>& eo = base_out[f];
      std::vector<double>& el = base_lse[f];
      if (eo.empty()) {
        eo.assign(B, kNaN), el.assign(B, kNaN);
        // Stored values (NaN: not stored) for the emulation; what is missing is computed.
        if (stored_layer_base && !impl.layer) {
          eo = stored_layer_base->layer_out[f];
          el = stored_layer_base->layer_lse[f];
        }
      }
      for (std::size_t i = 0; i < B; ++i)
        if (paths[i] == sdpa_form_name(form) && std::isnan(eo[i])) need[f].push_back(static_cast<int>(i));
    }
    return need;
  }
  // The model-dtype SDPA of `need` in one form: the emulation or its replacement.
  SdpaResult layer_emulation(SdpaForm form, const std::vector<int>& need, const BaselineImpl& impl) {
    // The prefill form's keys and values: the projection the glue shares (its
    // time counted as generate, not baseline).
    auto emulate = [&] {
      take_spare_cores();
      const auto t1 = Clock::now();
      // An emulator that projects K and V from the latent rows itself needs
      // none projected here (on the GPU: none brought to the host).
      const KvProjection* kv = nullptr;
      if (form == SdpaForm::kPrefill)
        kv = prefill_emulation_reads_latent(ctx_.c, projection()) ? &projection() : &projection(need);
      ctx_.baseline_ms -= ms_since(t1);
      return emulate_sdpa_layer(ctx_.c, form, need, kv);
    };
    SdpaResult e = impl.layer ? impl.layer(ctx_.c, form, need) : emulate();
    // A replacement without lse (SDPA returns none): lse from the emulation.
    // Nor has it the decode path with fp32 keys on a cache whose rounded keys
    // are inexact (torch's SDPA takes 16-bit keys; sdpa_emulation.h): that
    // implementation's errors come from the emulation too.
    const bool wants_f32_keys = form == SdpaForm::kDecode && !cache_values_exact(ctx_.c);
    if (e.lse.empty() || (wants_f32_keys && (e.out_f32_keys.empty() || e.lse_f32_keys.empty()))) {
      SdpaResult em = emulate();
      if (e.lse.empty()) e.lse = std::move(em.lse);
      if (e.out_f32_keys.empty()) e.out_f32_keys = std::move(em.out_f32_keys);
      if (e.lse_f32_keys.empty()) e.lse_f32_keys = std::move(em.lse_f32_keys);
    }
    return e;
  }
  // Emulations made ahead (overlap_reference_and_baseline) for exactly these requests.
  std::array<std::optional<std::pair<std::vector<int>, SdpaResult>>, 2> early_emulation;

  // With a reference on the device not yet computed and the emulation's
  // err_baseline about to be needed, the reference runs on another thread
  // while this one emulates: the GPU's fp64 work and the CPU's model-dtype
  // work overlap instead of following each other. The results are the same
  // bits either way (neither reads the other); the reference phase counts
  // only the time spent waiting for it after the emulation. An emulation that
  // throws here is dropped and made again in layer_baseline, where its
  // exception is reported as before; the reference's exception is thrown here,
  // where get_reference would have thrown it. The thread's current device is
  // the process's first visible one (--devices gives each worker its device
  // through CUDA_VISIBLE_DEVICES); the reference uploads its inputs from the
  // host, so the device that computes it does not change its bits.
  void overlap_reference_and_baseline(const std::vector<std::string>& paths, const BaselineImpl& impl) {
    early_emulation = {};
    if (ctx_.ref_outputs || !ctx_.reference || !ctx_.reference->on_device || !ctx_.reference->absorbed || impl.layer) return;
    std::array<std::vector<int>, 2> need;
    try {
      need = layer_baseline_missing(paths, impl);
    } catch (...) {
      return;  // thrown again where layer_baseline asks, as before
    }
    if (need[0].empty() && need[1].empty()) return;
    std::future<ReferenceOutputs> golden;
    try {
      golden = std::async(std::launch::async, [absorbed = ctx_.reference->absorbed, &cc = ctx_.c] { return absorbed(cc); });
    } catch (const std::system_error&) {
      return;  // no thread to be had: the two follow each other, as before
    }
    const auto t0 = Clock::now();
    try {
      for (int f = 0; f < 2; ++f)
        if (!need[f].empty())
          early_emulation[f].emplace(need[f], layer_emulation(f == 0 ? SdpaForm::kDecode : SdpaForm::kPrefill,
                                                              need[f], impl));
    } catch (...) {
      early_emulation = {};
    }
    ctx_.baseline_ms += ms_since(t0);
    const auto t1 = Clock::now();
    try {
      ctx_.ref_outputs = golden.get();
    } catch (...) {
      ctx_.reference_ms += ms_since(t1);
      early_emulation = {};  // the record is the ctx_.reference's failure; nothing will read them
      throw;
    }
    ctx_.reference_ms += ms_since(t1);
  }

  // err_baseline of the layer op on the given per-request paths; each
  // (form, request) is computed once per case, whichever backend needs it.
  BaselineErrors layer_baseline(const std::vector<std::string>& paths, const BaselineImpl& impl) {
    const ReferenceOutputs& g = ctx_.get_reference();
    const auto t0 = Clock::now();
    const std::array<std::vector<int>, 2> need = layer_baseline_missing(paths, impl);
    for (int f = 0; f < 2; ++f) {
      if (need[f].empty()) continue;
      const SdpaForm form = f == 0 ? SdpaForm::kDecode : SdpaForm::kPrefill;
      std::optional<SdpaResult> e;
      if (early_emulation[f] && early_emulation[f]->first == need[f]) e = std::move(early_emulation[f]->second);
      early_emulation[f].reset();
      if (!e) e = layer_emulation(form, need[f], impl);
      std::vector<double> got_out, got_lse;
      layer_baseline_errors(ctx_.c, *e, g.out, g.lse, need[f], got_out, got_lse);
      for (int i : need[f]) base_out[f][i] = got_out[i], base_lse[f][i] = got_lse[i];
    }
    BaselineErrors err{0, 0};
    for (std::size_t i = 0; i < paths.size(); ++i) {
      const int f = paths[i] == sdpa_form_name(SdpaForm::kDecode) ? 0 : 1;
      err.out = std::max(err.out, base_out[f][i]);
      err.lse = std::max(err.lse, base_lse[f][i]);
    }
    ctx_.baseline_ms += ms_since(t0);
    return err;
  }

 private:
  CaseContext& ctx_;
};

bool wants_baseline(const RunConfig& cfg) { return cfg.baseline.always || cfg.policy.kind == Policy::Kind::kBaseline; }

class LayerDriver final : public OpDriver {
 public:
  Op op() const override { return Op::kLayer; }
  Support admit(const Capabilities& caps, const CaseSpec& spec) const override {
    return route_requests(caps, spec).support;
  }
  OpRun run(CaseContext& ctx, Backend& b, const RunConfig& cfg, Record& r) const override {
    const PagedCache& base = ctx.cache(r.block_size, false, cfg.exec, r.timings.cache_ms);
    LayerState& s = ctx.slot<LayerState>();
    s.projection();  // made here, its time counted as the inputs', before the glue offers it rows
    OpRun run = run_layer(b, ctx.c, base, cfg.exec, &s.memo);
    if (wants_baseline(cfg)) s.overlap_reference_and_baseline(run.paths, cfg.baseline);
    return run;
  }
  JudgedAgainst reference(CaseContext& ctx) const override {
    const ReferenceOutputs& g = ctx.get_reference();
    return {&g.out, &g.lse};
  }
  BaselineErrors baseline(CaseContext& ctx, const OpRun& run, const RunConfig& cfg) const override {
    return ctx.slot<LayerState>().layer_baseline(run.paths, cfg.baseline);
  }
  const std::vector<double>* unquantized_main(CaseContext& ctx) const override { return &ctx.unquantized_absorbed(); }
  void adopt(PreparedCase& p, CaseContext& ctx) const override {
    if (p.baselines) ctx.slot<LayerState>().stored_layer_base = *p.baselines;
  }
  // The paged cache of the backend's block size, and the reference and
  // err_baseline on the backend's paths (route_requests: the paths run_layer
  // takes); a replacement baseline (libtorch) is left to the jobs' thread.
  void plan_ahead(const Backend& b, const CaseSpec& spec, const RunConfig& cfg, AheadPlan& plan) const override {
    if (spec.merge.active() || !b.supports(spec, Op::kLayer).ok) return;
    const Capabilities caps = b.capabilities();
    const int bs = resolve_block_size(caps, spec);
    const Routing routing = route_requests(caps, spec);
    if (!routing.support.ok) return;
    plan.add(plan.caches, "cache/" + std::to_string(bs) + "/0",
             [bs, &cfg](CaseContext& ctx) { ctx.cache(bs, false, cfg.exec, ctx.cache_ms); });
    if (!wants_baseline(cfg) || cfg.baseline.layer) {
      plan.add(plan.inputs, "layer/reference", [](CaseContext& ctx) { ctx.get_reference(); });
      return;
    }
    std::string key = "layer/baseline";
    for (const std::string& p : routing.paths()) key += "/" + p;
    const bool first = std::none_of(plan.inputs.begin(), plan.inputs.end(),
                                    [](const AheadPlan::Task& t) { return t.key.starts_with("layer/baseline"); });
    plan.add(plan.inputs, key, [paths = routing.paths(), first, &cfg](CaseContext& ctx) {
      LayerState& s = ctx.slot<LayerState>();
      if (first) try {
          s.overlap_reference_and_baseline(paths, cfg.baseline);
        } catch (...) {
        }
      s.layer_baseline(paths, cfg.baseline);
    });
  }
};

}  // namespace

const OpDriver& layer_driver() {
  static const LayerDriver d;
  return d;
}

KvProjection& case_projection(CaseContext& ctx) { return ctx.slot<LayerState>().projection(); }
const KvProjection& case_projection(CaseContext& ctx, std::span<const int> requests) {
  return ctx.slot<LayerState>().projection(requests);
}
std::pair<const Tensor*, const Tensor*> case_projection_of_all(CaseContext& ctx) {
  return ctx.slot<LayerState>().projection_of_all();
}
void withdraw_projection(CaseContext& ctx, const Tensor* k) { ctx.slot<LayerState>().projection().withdraw(k); }
BaselineErrors layer_baseline(CaseContext& ctx, const std::vector<std::string>& paths, const BaselineImpl& impl) {
  return ctx.slot<LayerState>().layer_baseline(paths, impl);
}
void overlap_reference_and_baseline(CaseContext& ctx, const std::vector<std::string>& paths,
                                    const BaselineImpl& impl) {
  ctx.slot<LayerState>().overlap_reference_and_baseline(paths, impl);
}

}  // namespace mlagate
