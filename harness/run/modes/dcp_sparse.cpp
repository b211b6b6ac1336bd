// --dcp on the sparse decode op (modes/dcp.h, SERVING.md "DCP"): the case's
// main cache sharded over the ranks as the dense op's is, each rank called on
// its share of every token's keys, the partials merged through their LSEs and
// judged against the sparse reference.
//  - V3.2 (top-k rows): a rank's row keeps the slots of its keys, rewritten to
//    their local positions, and -1 for the others (slots past topk_length stay
//    the poisoned slots they were).
//  - V4 (sliding window): a rank's keys of a window form one run of its local
//    positions, so each token is a request of its own whose window is that
//    run; tokens of equal windows share a call.
//  - V4's compressed cache is not sharded: a token's compressed row goes with
//    the rank holding the token's own position (that rank's window is never
//    empty), -1 elsewhere.
//  - The sink joins once, after the merge (merge_shards).
#include <algorithm>
#include <map>
#include <optional>

#include "cases/encoding.h"
#include "cases/sparse.h"
#include "harness/run/modes/dcp.h"
#include "harness/run/serving_calls.h"

namespace mlagate::modes {

namespace {
using namespace serving_detail;  // the shared calls and checks (serving_calls.h)

// `set` as rank `rank` sees it: positions of its keys rewritten to local
// positions, other keys kIndexInvalid; when `keep` is false every key is
// invalid (a rank without the compressed row). Poisoned slots stay poisoned.
IndexSet rank_set(const IndexSet& set, int rank, int ranks, int interleave, bool local, const std::vector<bool>& keep) {
  IndexSet out = set;
  const std::size_t K = static_cast<std::size_t>(set.width);
  for (std::size_t t = 0; K > 0 && t < set.pos.size() / K; ++t)
    for (std::size_t k = 0; k < K; ++k) {
      std::int32_t& p = out.pos[t * K + k];
      if (p < 0) continue;
      if (!keep.empty() && !keep[t]) p = kIndexInvalid;
      else if (local) p = dcp_rank_of(p, ranks, interleave) == rank ? dcp_local_pos(p, ranks, interleave) : kIndexInvalid;
    }
  return out;
}

bool any_key(const IndexSet& set, int t) {
  const int n = std::min(set.count(t), set.width);
  for (int k = 0; k < n; ++k)
    if (set.pos[static_cast<std::size_t>(t) * set.width + k] >= 0) return true;
  return false;
}

// One rank's view of the case: its shard of the main cache (`shard`, filled
// by the caller), its index rows, and its calls (V3.2: one over every token
// with a key here; V4: one per window length).
struct RankCalls {
  SparseFull f;
  std::optional<IndexSet> main_set, extra_set;
  std::map<int, Call> by_window;
};

RankCalls rank_calls(const Case& c, const SparseFull& whole, const PagedCache& shard, const std::vector<int>& owner,
                     const std::vector<int>& pos, int rank, int ranks, int interleave) {
  const SparseInputs& sp = *c.sparse;
  const int window = c.spec.sparse.window;
  const std::int64_t T = c.num_tokens;
  RankCalls rc;
  // The compressed rows go with the rank of each token's own position.
  std::vector<bool> extra_here(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) extra_here[t] = pos[t] >= 0 && dcp_rank_of(pos[t], ranks, interleave) == rank;
  rc.f.cache = &shard;
  rc.f.extra = whole.extra;
  if (window == 0) {
    rc.main_set = rank_set(sp.main, rank, ranks, interleave, true, {});
    rc.f.main_slots = global_slots(c, *rc.main_set, shard);
    rc.f.main_len = sp.main.length;
  }
  if (rc.f.extra) {
    rc.extra_set = rank_set(sp.extra, rank, ranks, interleave, false, extra_here);
    rc.f.extra_slots = global_slots(c, *rc.extra_set, *rc.f.extra);
    rc.f.extra_len = sp.extra.length;
  }
  for (std::int64_t t = 0; t < T; ++t) {
    if (pos[t] < 0) continue;  // padding: no key anywhere
    const bool extra_keys = rc.extra_set && any_key(*rc.extra_set, static_cast<int>(t));
    if (window == 0) {
      if (!any_key(*rc.main_set, static_cast<int>(t)) && !extra_keys) continue;
      // seq_len: the rank's keys up to the token's own position.
      rc.by_window[0].add(static_cast<int>(t), 1, dcp_local_count(pos[t] + 1, rank, ranks, interleave), owner[t]);
    } else {
      const int hi = dcp_local_count(pos[t] + 1, rank, ranks, interleave);
      const int lo = dcp_local_count(std::max(0, pos[t] - window + 1), rank, ranks, interleave);
      if (hi == lo) continue;  // no window key here (then no compressed row either)
      rc.by_window[hi - lo].add(static_cast<int>(t), 1, hi, owner[t]);
    }
  }
  return rc;
}

}  // namespace

Record Dcp::run_sparse(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) const {
  std::vector<Captured> plain;
  Record r = plain_run(ctx, b, op, cfg, plain);
  const Captured* pl = find_output(plain, "lse");
  if (!pl) return r;
  const Case& c = ctx.c;
  sparse_state(ctx);
  const std::int64_t T = c.num_tokens, N = c.spec.num_heads(), Dv = c.spec.sparse_dv();
  const TensorView whole_lse{DType::kF32, {T, N}, const_cast<std::byte*>(pl->bytes.data())};
  const ShardRun how{true, "dcp " + std::to_string(ranks) + " (interleave " + std::to_string(interleave) + ")",
                     lse_base_hint(whole_lse, sparse_state(ctx).sparse_ref.lse), c.sparse->sink, Clock::now(), r.timings.run_ms};
  if (r.status != Status::kPassed) {
    r.message = "the whole call, before sharding: " + r.message + (how.hint.empty() ? "" : "; " + how.hint);
    return r;
  }
  const SparseFull whole = sparse_full(ctx, cfg, r.block_size, r.timings.cache_ms);
  const PagedCache& full = *whole.cache;
  const std::vector<int> owner = token_requests(c);
  std::vector<int> pos(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) pos[t] = token_position(c, owner[t], static_cast<int>(t));
  ShardMerge m(T, N, Dv);
  merge_shards(ctx, cfg, r, m, how, [&] {
    PagedCache shard = full;
    for (int rank = 0; rank < ranks && !m.failed(); ++rank) {
      fill_dcp_shard(c, full, shard, rank, ranks, interleave, cfg.exec.poison);
      RankCalls rc = rank_calls(c, whole, shard, owner, pos, rank, ranks, interleave);
      for (const auto& [w, call] : rc.by_window) {
        rc.f.window = w;
        if (!m.take(call, call_sparse_decode(b, c, rc.f, *sparse_state(ctx).sparse_q, call, cfg.exec), rank, r.timings.run_ms)) break;
      }
    }
  });
  return r;
}

}  // namespace mlagate::modes
