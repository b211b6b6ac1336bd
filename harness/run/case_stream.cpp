// The stream of a run's cases (CaseStream): each case's context made on
// entry, reusing what the previous case shares with it; and a case made
// ahead on a thread of its own (CaseAhead), with the work the op modules say
// their jobs will share (OpDriver::plan_ahead).
#include "harness/run/case_context.h"
#include "harness/run/ops/driver.h"
#include "harness/run/runner.h"

#include <omp.h>

#include <algorithm>
#include <utility>

namespace mlagate {

using run_detail::Clock;
using run_detail::ms_since;

const CaseSpec& context_spec(const CaseContext& ctx) { return ctx.c.spec; }

CaseStream::CaseStream(const RunConfig& cfg) : cfg_(cfg) {}
CaseStream::~CaseStream() = default;

namespace {

// Whether `spec` takes cache_write and no other op of the run (RunConfig::keys_only_cases).
bool takes_only_cache_write(const RunConfig& cfg, const CaseSpec& spec) {
  if (!cfg.keys_only_cases || cfg.prepare || cfg.on_outputs || spec.merge.active()) return false;
  bool any = false;
  for (Op op : cfg.ops) {
    if (!spec.takes(op)) continue;
    if (op != Op::kCacheWrite) return false;
    any = true;
  }
  return any;
}

}  // namespace

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
  const bool keys_only = takes_only_cache_write(cfg_, spec);
  // A keys_only case is handed on only to another keys_only case (suite
  // groups may give one input set different ops).
  if (prev && prev->c.keys_only && !keys_only) prev.reset();
  const bool same_values = prev && cache_values_key(prev->c.spec) == cache_values_key(spec);
  if (cfg_.prepare && !(same_values && cfg_.prepared_same && cfg_.prepared_same(prev->c.spec, spec))) {
    // A prepared case (golden file) is handed on whole only when its
    // references are the same; its inputs whenever they are.
    // The previous context is freed before the next is made (peak memory):
    // only its case's tensors are kept, when they are this one's.
    std::optional<Case> previous;
    if (prev && inputs_key(prev->c.spec) == inputs_key(spec)) previous.emplace(std::move(prev->c));
    prev.reset();
    PreparedCase prepared = cfg_.prepare(spec, previous ? &*previous : nullptr);
    for (const OpDriver* d : op_drivers()) d->adopt(prepared, *ctx);  // the ops' parts, before the case moves in
    ctx->adopt(std::move(prepared));
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
    retag(ctx->given_caches);
    ctx->retag_slots(spec);
  } else if (prev && inputs_key(prev->c.spec) == inputs_key(spec)) {
    const bool was_fp8 = is_fp8(prev->c.spec.kv_cache_dtype);
    if (!was_fp8 && prev->ref_outputs) prev->unquantized = std::move(prev->ref_outputs);
    ctx->keep_slots_from(*prev, was_fp8);
    ctx->c = std::move(prev->c);
    ctx->unquantized = std::move(prev->unquantized);
    prev.reset();
    retarget_case(ctx->c, spec);
  } else {
    prev.reset();
    ctx->c = generate_case(spec, keys_only);
  }
  // A context handed on keeps its counters: what is new is added.
  const double entered = ms_since(t0);
  ctx->enter_ms += entered;
  ctx->generate_ms += entered;
  last_ = std::move(ctx);
  return *last_;
}

// What a case's jobs will share, from what the backends declare: each op
// module's plan (OpDriver::plan_ahead) for each backend, in the backends'
// order, so that shared work is made for the same requests as on first use.
struct CaseAhead::Plan {
  AheadPlan work;
  int threads = 0;  // the caller's OpenMP threads (a new thread starts from the process's default)
};

CaseAhead::CaseAhead(const RunConfig& cfg, std::vector<std::unique_ptr<Backend>>& backends, std::size_t case_index)
    : case_index_(case_index), stream_(std::make_unique<CaseStream>(cfg)), plan_(std::make_unique<Plan>()) {
  const CaseSpec& spec = cfg.cases.at(case_index);
  Plan& p = *plan_;
  bool valid = true;
  try {
    spec.validate();
  } catch (...) {
    valid = false;  // entering it throws again, on the thread, for its records
  }
  for (const auto& b : backends)
    for (Op op : cfg.ops) {
      if (!valid || !spec.takes(op)) continue;
      try {
        op_driver(op).plan_ahead(*b, spec, cfg, p.work);
      } catch (...) {
        // Its job asks again and records the answer.
      }
    }
  p.threads = omp_get_max_threads();
  thread_ = std::thread([this, &spec] {
    omp_set_num_threads(plan_->threads);
    const auto t0 = Clock::now();
    try {
      ctx_ = &stream_->enter(spec);
    } catch (...) {
      error_ = std::current_exception();
      return;
    }
    const double entered = ms_since(t0);
    CaseContext& ctx = *ctx_;
    // Whatever fails here is made again by the job that needs it, which
    // reports the failure as it always did.
    for (const auto* tasks : {&plan_->work.caches, &plan_->work.inputs})
      for (const AheadPlan::Task& task : *tasks) try {
          task.work(ctx);
        } catch (...) {
        }
    work_ms_ = ms_since(t0);
    // The case's first record counts all of it, as it counts an entry's time.
    ctx.enter_ms += work_ms_ - entered;
  });
}

CaseAhead::~CaseAhead() {
  if (thread_.joinable()) thread_.join();
}

CaseContext& CaseAhead::take(std::unique_ptr<CaseStream>& stream, double& beside_ms) {
  const auto t0 = Clock::now();
  if (thread_.joinable()) thread_.join();
  beside_ms = 0;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  if (!ctx_ || !stream_) throw std::logic_error("CaseAhead::take: taken twice");
  beside_ms = std::max(0.0, work_ms_ - ms_since(t0));
  stream = std::move(stream_);
  return *std::exchange(ctx_, nullptr);
}

}  // namespace mlagate
