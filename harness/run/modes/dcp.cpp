// --dcp on the decode op (modes/dcp.h, SERVING.md "DCP"): for each virtual
// rank a shard cache (the case's block table, each request's keys of that rank
// at their local positions, the rest poisoned), each query token a request of
// its own seeing its share of keys 0 .. c + u, the partials merged through
// their LSEs (serving_calls.h, merge_shards) and judged. vLLM's sharding
// functions (dcp_rank_of ...) are in ../dcp_layout.h.
#include "harness/run/modes/dcp.h"

#include <algorithm>

#include "cases/errors.h"
#include "harness/run/serving_calls.h"

namespace mlagate {


namespace modes {

using namespace serving_detail;  // the shared calls and checks (serving_calls.h)

std::string Dcp::name() const {
  return "dcp=" + std::to_string(ranks) + ",interleave=" + std::to_string(interleave);
}

void Dcp::validate() const {
  if (ranks < 2 || ranks > 64) throw InputError("--dcp " + std::to_string(ranks) + ": ranks must be in 2..64");
  if (interleave < 1) throw InputError("--dcp-interleave must be >= 1");
}

Record Dcp::run(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) const {
  if (op == Op::kSparseDecode) return run_sparse(ctx, b, op, cfg);
  std::vector<Captured> plain;
  Record r = plain_run(ctx, b, op, cfg, plain);
  const Captured* pl = find_output(plain, "lse");
  if (!pl) return r;
  const Case& c = ctx.c;
  const std::int64_t T = c.num_tokens, N = c.spec.num_heads(), L = c.spec.dims.kv_lora_rank;
  const TensorView whole_lse{DType::kF32, {T, N}, const_cast<std::byte*>(pl->bytes.data())};
  const ShardRun how{false, "dcp " + std::to_string(ranks) + " (interleave " + std::to_string(interleave) + ")",
                     lse_base_hint(whole_lse, decode_state(ctx).mqa_lse), {}, Clock::now(), r.timings.run_ms};
  if (r.status != Status::kPassed) {
    r.message = "the whole call, before sharding: " + r.message + (how.hint.empty() ? "" : "; " + how.hint);
    return r;
  }
  const PagedCache& full = ctx.cache(r.block_size, true, cfg.exec, r.timings.cache_ms);
  // Each query token as a request of its own: token u of a request with
  // context c sees keys 0 .. c + u, and a rank sees its share of those (the
  // causal rule holds per token whatever the sharding).
  std::vector<int> visible(static_cast<std::size_t>(T)), owner(static_cast<std::size_t>(T));
  for (int i = 0; i < c.num_requests; ++i)
    for (int u = 0; u < c.query_lens[i]; ++u) {
      const int t = c.query_start_loc[i] + u;
      visible[t] = c.seq_lens[i] - c.query_lens[i] + u + 1;
      owner[t] = i;
    }
  ShardMerge m(T, N, L);
  merge_shards(ctx, cfg, r, m, how, [&] {
    PagedCache shard = full;  // the same block table; each rank's keys rewritten in place
    for (int rank = 0; rank < ranks && !m.failed(); ++rank) {
      fill_dcp_shard(c, full, shard, rank, ranks, interleave, cfg.exec.poison);
      Call call;
      for (int t = 0; t < T; ++t)
        if (const int n = dcp_local_count(visible[t], rank, ranks, interleave); n > 0) call.add(t, 1, n, owner[t]);
      if (call.empty()) continue;  // no key on this rank: its partials weigh 0
      if (!m.take(call, call_decode(b, c, shard, *decode_state(ctx).q_lat, *decode_state(ctx).q_pe, call, cfg.exec), rank, r.timings.run_ms)) break;
    }
  });
  return r;
}

}  // namespace modes
}  // namespace mlagate
