// The stream of a run's cases (CaseStream): each case's context made on
// entry, reusing what the previous case shares with it.
#include "harness/run/case_context.h"

namespace mlagate {

using run_detail::Clock;
using run_detail::ms_since;

const CaseSpec& context_spec(const CaseContext& ctx) { return ctx.c.spec; }

CaseStream::CaseStream(const RunConfig& cfg) : cfg_(cfg) {}
CaseStream::~CaseStream() = default;

// Consecutive cases share what they can (the inputs depend on neither the kv
// cache dtype, its scale rule, k_scale nor the block size):
// - equal cache values (cache_values_key: fp8 and fp8_e4m3 are one format;
//   fp8_ds_mla ignores k_scale): the whole context moves on, golden,
//   references and caches included; only the spec and the caches' dtype tags change;
// - equal inputs (inputs_key): the generated case moves on and is retargeted,
//   and so do the unquantized references (an auto case's golden is exactly
//   that) for the fp8 cases' quantization error.
CaseContext& CaseStream::enter(const CaseSpec& spec) {
  auto ctx = std::make_unique<CaseContext>();
  ctx->reference = &cfg_.reference;
  std::unique_ptr<CaseContext> prev = std::move(last_);
  const auto t0 = Clock::now();
  const bool same_values = prev && cache_values_key(prev->c.spec) == cache_values_key(spec);
  if (cfg_.prepare && !(same_values && cfg_.prepared_same && cfg_.prepared_same(prev->c.spec, spec))) {
    // A prepared case (golden file) is handed on whole only when its
    // references are the same; its inputs whenever they are.
    // The previous context is freed before the next is made (peak memory):
    // only its case's tensors are kept, when they are this one's.
    std::optional<Case> previous;
    if (prev && inputs_key(prev->c.spec) == inputs_key(spec)) previous.emplace(std::move(prev->c));
    prev.reset();
    ctx->adopt(cfg_.prepare(spec, previous ? &*previous : nullptr));
  } else if (same_values) {
    spec.validate();
    ctx = std::move(prev);
    ctx->c.spec = spec;
    auto retag = [&](auto& caches) {
      for (auto& [key, pc] : caches) {
        pc.kv_dtype = spec.kv_cache_dtype;
        pc.k_scale = spec.k_scale;
      }
    };
    retag(ctx->caches);
    retag(ctx->extra_caches);
    retag(ctx->given_caches);
  } else if (prev && inputs_key(prev->c.spec) == inputs_key(spec)) {
    if (!is_fp8(prev->c.spec.kv_cache_dtype)) {
      if (prev->ref_outputs) prev->unquantized = std::move(prev->ref_outputs);
      if (!prev->mqa_o_lat.empty()) prev->unquantized_mqa = std::move(prev->mqa_o_lat);
    }
    ctx->c = std::move(prev->c);
    ctx->unquantized = std::move(prev->unquantized);
    ctx->unquantized_mqa = std::move(prev->unquantized_mqa);
    prev.reset();
    retarget_case(ctx->c, spec);
  } else {
    prev.reset();
    ctx->c = generate_case(spec);
  }
  // A context handed on keeps its counters: what is new is added.
  const double entered = ms_since(t0);
  ctx->enter_ms += entered;
  ctx->generate_ms += entered;
  last_ = std::move(ctx);
  return *last_;
}

}  // namespace mlagate
