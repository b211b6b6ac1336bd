// The case context's shared parts: timings handed to records, the absorbed
// reference, paged caches (built, or a golden file's with the new tokens
// written by the reference writer), the unquantized reference, and the op
// modules' slots handed on between cases.
#include "harness/run/case_context.h"

#include <algorithm>

#include "cases/encoding.h"
#include "harness/run/core_share.h"
#include "reports/profile.h"

namespace mlagate {

double CaseContext::take_shared(Timings& t) {
  t.generate_ms += generate_ms - taken.generate_ms;
  t.reference_ms += reference_ms - taken.reference_ms;
  t.baseline_ms += baseline_ms - taken.baseline_ms;
  t.cache_ms += cache_ms - taken.cache_ms;
  const double entered = enter_ms - taken.total_ms;
  taken.generate_ms = generate_ms;
  taken.reference_ms = reference_ms;
  taken.baseline_ms = baseline_ms;
  taken.cache_ms = cache_ms;
  taken.total_ms = enter_ms;
  return entered;
}

void CaseContext::close_timings(Timings& t, double wall_ms) {
  t.total_ms = wall_ms + take_shared(t);
  t.glue_ms = std::max(0.0, t.total_ms - (t.generate_ms + t.reference_ms + t.baseline_ms + t.cache_ms + t.run_ms +
                                          t.compare_ms));
  run_profile().add_job(t);  // in a worker this process's profile is not shown: the parent adds the record
}

const ReferenceOutputs& CaseContext::get_reference() {
  if (!ref_outputs) {
    take_spare_cores();
    const auto t0 = Clock::now();
    ref_outputs = reference && reference->absorbed ? reference->absorbed(c) : reference_absorbed(c);
    reference_ms += ms_since(t0);
  }
  return *ref_outputs;
}

std::string CaseContext::missing_cache(int bs) const {
  if (build_missing_caches || given_caches.count(bs)) return {};
  std::string have;
  for (const auto& [b, unused] : given_caches) have += (have.empty() ? "" : ", ") + std::to_string(b);
  return "no stored cache for block size " + std::to_string(bs) + " (the file holds " +
         (have.empty() ? std::string("none") : have) + ")";
}

const PagedCache& CaseContext::cache(int bs, bool write_new, const ExecOptions& opt, double& ms) {
  auto key = std::make_pair(bs, write_new);
  auto it = caches.find(key);
  if (it == caches.end()) {
    const auto t0 = Clock::now();
    CacheOptions co;
    co.poison = opt.poison;
    co.poison_block_table = opt.poison_block_table;
    co.write_new_tokens = write_new;
    if (auto g = given_caches.find(bs); g != given_caches.end()) {
      // A given cache (golden file): the new tokens go in through the reference writer.
      PagedCache pc = g->second;
      if (write_new) write_new_tokens(pc);
      it = caches.emplace(key, std::move(pc)).first;
    } else {
      it = caches.emplace(key, build_paged_cache(c, bs, co)).first;
    }
    ms += ms_since(t0);
  }
  return it->second;
}

void CaseContext::write_new_tokens(PagedCache& pc) const {
  const std::int64_t L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim;
  const std::size_t esz = dtype_size(c.kv_c.dtype());
  const std::int64_t* sm = pc.slot_mapping.data<std::int64_t>();
  for (int i = 0; i < c.num_requests; ++i) {
    const int q = c.query_lens[static_cast<std::size_t>(i)];
    if (c.seq_lens[static_cast<std::size_t>(i)] == 0 || q == 0) continue;
    const std::int64_t row = c.kv_start_loc[static_cast<std::size_t>(i)] + c.context_lens[static_cast<std::size_t>(i)];
    TensorView kv{c.kv_c.dtype(), {q, L}, const_cast<std::byte*>(c.kv_c.bytes()) + row * L * esz};
    TensorView pe{c.k_pe.dtype(), {q, R}, const_cast<std::byte*>(c.k_pe.bytes()) + row * R * esz};
    reference_cache_write(pc, kv, pe, {sm + c.query_start_loc[static_cast<std::size_t>(i)], static_cast<std::size_t>(q)});
  }
}

void CaseContext::without_cache_values(const std::function<void()>& work) {
  const auto t0 = Clock::now();
  Tensor kv = std::move(c.kv_c_cache), pe = std::move(c.k_pe_cache);
  c.kv_c_cache = Tensor();
  c.k_pe_cache = Tensor();
  struct Restore {
    CaseContext& ctx;
    Tensor &kv, &pe;
    double& ms;
    Clock::time_point t0;
    ~Restore() {
      ctx.c.kv_c_cache = std::move(kv);
      ctx.c.k_pe_cache = std::move(pe);
      ms += ms_since(t0);
    }
  } restore{*this, kv, pe, reference_ms, t0};
  work();
}

const std::vector<double>& CaseContext::unquantized_absorbed() {
  take_spare_cores();
  without_cache_values([&] {
    if (!unquantized) unquantized = reference && reference->absorbed ? reference->absorbed(c) : reference_absorbed(c);
  });
  return unquantized->out;
}

void CaseContext::adopt(PreparedCase&& p) {
  c = std::move(p.c);
  ref_outputs = std::move(p.reference);
  given_caches = std::move(p.caches);
  build_missing_caches = p.build_missing_caches;
  if (p.unquantized) unquantized = ReferenceOutputs{std::move(*p.unquantized), {}, {}};
}

void CaseContext::retag_slots(const CaseSpec& spec) {
  for (auto& [type, s] : slots_) s->retag(spec);
}

void CaseContext::keep_slots_from(CaseContext& prev, bool was_fp8) {
  for (auto& [type, s] : prev.slots_)
    if (std::unique_ptr<OpState> kept = s->keep_for_inputs(was_fp8)) slots_[type] = std::move(kept);
}

}  // namespace mlagate
