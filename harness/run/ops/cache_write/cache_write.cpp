// The cache_write conformance check: the new tokens of a case written by the
// backend and by the reference writer into copies of one cache, compared byte
// for byte, the unused (poisoned) regions included.
#include "harness/run/ops/cache_write/cache_write.h"

#include "harness/run/case_context.h"
#include "harness/run/ops/driver.h"
#include "reports/profile.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <span>
#include <vector>

namespace mlagate {

CacheWriteCheck check_cache_write(Backend& b, const Case& c, PagedCache& base) {
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

  PagedCache got = base;
  CacheWriteCheck out;
  const auto t0 = std::chrono::steady_clock::now();
  b.cache_write(got, kv_new, pe_new, slots);
  out.run_ms = backend_call_done(t0);

  // The expected cache is `base` with the reference writer's entries: made in
  // place and put back entry by entry when the comparison is done (or throws),
  // so that `base` is bit for bit as it came. A whole copy for it, as large as
  // the case's cache (177 MB for a 270,000-token fp8 case), was one more
  // allocation of fresh memory per check; the writer touches the new slots'
  // entries alone (store_entry), which is what is saved.
  std::vector<std::int64_t> touched(slots);
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  const std::int64_t capacity = static_cast<std::int64_t>(base.num_blocks) * base.block_size;
  std::erase_if(touched, [capacity](std::int64_t s) { return s >= capacity; });  // the writer refuses them
  const auto entry = static_cast<std::size_t>(base.entry_bytes);
  std::vector<std::byte> saved(touched.size() * entry);
  for (std::size_t i = 0; i < touched.size(); ++i) base.load_entry(touched[i], saved.data() + i * entry);
  // Made once every entry is saved: from here on `base` is put back whatever happens.
  struct PutBack {
    PagedCache& cache;
    const std::vector<std::int64_t>& slots;
    const std::vector<std::byte>& saved;
    ~PutBack() {
      const auto entry = static_cast<std::size_t>(cache.entry_bytes);
      for (std::size_t i = 0; i < slots.size(); ++i) cache.store_entry(slots[i], saved.data() + i * entry);
    }
  } put_back{base, touched, saved};
  reference_cache_write(base, kv_new, pe_new, slots);

  const std::span<const std::int64_t> new_slots(sm, static_cast<std::size_t>(c.num_tokens));
  out.message = first_cache_difference(got, base, new_slots, c.query_start_loc);
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
    ctx.cache(r.block_size, false, cfg.exec, r.timings.cache_ms);  // made on first use
    PagedCache& base = ctx.caches.at({r.block_size, false});       // written and put back by the check
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
