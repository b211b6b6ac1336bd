// The cache_write conformance check: the new tokens of a case written by the
// backend and by the reference writer into copies of one cache, compared byte
// for byte, the unused (poisoned) regions included.
#include "harness/run/ops/cache_write/cache_write.h"

#include "harness/run/case_context.h"
#include "harness/run/ops/driver.h"
#include "reports/profile.h"

#include <chrono>
#include <cstring>
#include <vector>

namespace mlagate {

CacheWriteCheck check_cache_write(Backend& b, const Case& c, const PagedCache& base) {
  const std::int64_t L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim;
  const std::size_t esz = dtype_size(c.spec.dtype);
  // The new tokens in token order with their slots, as the layer writes them.
  const std::int64_t* sm = base.slot_mapping.data<std::int64_t>();
  std::vector<std::int64_t> slots;
  Tensor kv(c.spec.dtype, {c.num_tokens, L}), pe(c.spec.dtype, {c.num_tokens, R});
  std::int64_t n = 0;
  for (int i = 0; i < c.num_requests; ++i) {
    for (int u = 0; u < c.query_lens[i]; ++u) {
      const std::int64_t slot = sm[c.query_start_loc[i] + u];
      if (slot < 0) continue;  // padding (seq_len 0): nothing to write
      const std::int64_t row = c.kv_start_loc[i] + c.context_lens[i] + u;
      std::memcpy(kv.bytes() + n * L * esz, c.kv_c.bytes() + row * L * esz, static_cast<std::size_t>(L) * esz);
      std::memcpy(pe.bytes() + n * R * esz, c.k_pe.bytes() + row * R * esz, static_cast<std::size_t>(R) * esz);
      slots.push_back(slot);
      ++n;
    }
  }
  const TensorView kv_new{c.spec.dtype, {n, L}, kv.bytes()}, pe_new{c.spec.dtype, {n, R}, pe.bytes()};

  PagedCache expected = base, got = base;
  reference_cache_write(expected, kv_new, pe_new, slots);
  CacheWriteCheck out;
  const auto t0 = std::chrono::steady_clock::now();
  b.cache_write(got, kv_new, pe_new, slots);
  out.run_ms = backend_call_done(t0);

  const std::span<const std::int64_t> new_slots(sm, static_cast<std::size_t>(c.num_tokens));
  out.message = first_cache_difference(got, expected, new_slots, c.query_start_loc);
  out.identical = out.message.empty();
  if (out.identical)
    out.message = std::to_string(n) + " new token(s) written bit-exactly as the reference writer (" +
                  kv_cache_format_name(c.spec.kv_format()) + ", " + std::to_string(base.entry_bytes) + "-byte entries)";
  return out;
}

namespace {

// Judged by itself: bit-exact against the reference writer, no outputs to compare.
class CacheWriteDriver final : public OpDriver {
 public:
  Op op() const override { return Op::kCacheWrite; }
  OpRun run(CaseContext& ctx, Backend& b, const RunConfig& cfg, Record& r) const override {
    const PagedCache& base = ctx.cache(r.block_size, false, cfg.exec, r.timings.cache_ms);
    const CacheWriteCheck w = check_cache_write(b, ctx.c, base);
    OpRun run;
    run.run_ms = w.run_ms;
    run.verdict = w.identical ? Status::kPassed : Status::kIncorrect;
    run.verdict_message = w.message;
    return run;
  }
  JudgedAgainst reference(CaseContext&) const override { return {}; }
};

}  // namespace

const OpDriver& cache_write_driver() {
  static const CacheWriteDriver d;
  return d;
}

}  // namespace mlagate
