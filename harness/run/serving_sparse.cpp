// --dcp on the sparse decode op (SERVING.md, "DCP"): the case's main cache
// sharded over the ranks as the dense op's is, each rank called on its share
// of every token's keys, the partials merged through their LSEs and judged
// against the sparse reference.
//  - V3.2 (top-k rows): a rank's row keeps the slots of its keys, rewritten to
//    their local positions, and -1 for the others (slots past topk_length stay
//    the poisoned slots they were).
//  - V4 (sliding window): a rank's keys of a window form one run of its local
//    positions, so each token is a request of its own whose window is that
//    run; tokens of equal windows share a call.
//  - V4's compressed cache is not sharded: a token's compressed row goes with
//    the rank holding the token's own position (that rank's window is never
//    empty), -1 elsewhere.
//  - The sink joins once, after the merge (o x 1 / (1 + e^(sink - lse))): the
//    shards are called without it, as an engine merging partials applies it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "cases/encoding.h"
#include "cases/sparse.h"
#include "harness/run/serving.h"
#include "harness/run/serving_calls.h"
#include "reference/glue.h"

namespace mlagate::serving_detail {

namespace {

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

}  // namespace

Record run_sparse_dcp(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg, int ranks, int interleave) {
  std::vector<Captured> plain;
  Record r = plain_run(ctx, b, op, cfg, plain);
  const Captured* pl = find_output(plain, "lse");
  if (!pl) return r;
  const Case& c = ctx.c;
  sparse_state(ctx);
  const std::int64_t T = c.num_tokens, N = c.spec.num_heads(), Dv = c.spec.sparse_dv();
  const TensorView whole_lse{DType::kF32, {T, N}, const_cast<std::byte*>(pl->bytes.data())};
  const std::string hint = lse_base_hint(whole_lse, sparse_state(ctx).sparse_ref.lse);
  const std::string label = "dcp " + std::to_string(ranks) + " (interleave " + std::to_string(interleave) + ")";
  if (r.status != Status::kPassed) {
    r.message = "the whole call, before sharding: " + r.message + (hint.empty() ? "" : "; " + hint);
    return r;
  }
  const auto t0 = Clock::now();
  const double run_before = r.timings.run_ms;
  const SparseFull whole = sparse_full(ctx, cfg, r.block_size, r.timings.cache_ms);
  const PagedCache& full = *whole.cache;
  const SparseInputs& sp = *c.sparse;
  const int window = c.spec.sparse.window;
  const std::vector<int> owner = token_requests(c);
  std::vector<int> pos(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) pos[t] = token_position(c, owner[t], static_cast<int>(t));

  ShardMerge m(T, N, Dv);
  try {
    PagedCache shard = full;
    for (int rank = 0; rank < ranks && !m.failed(); ++rank) {
      fill_dcp_shard(c, full, shard, rank, ranks, interleave, cfg.exec.poison);
      // The compressed rows go with the rank of each token's own position.
      std::vector<bool> extra_here(static_cast<std::size_t>(T));
      for (std::int64_t t = 0; t < T; ++t) extra_here[t] = pos[t] >= 0 && dcp_rank_of(pos[t], ranks, interleave) == rank;
      SparseFull f;
      f.cache = &shard;
      f.extra = whole.extra;
      std::optional<IndexSet> main_set, extra_set;
      if (window == 0) {
        main_set = rank_set(sp.main, rank, ranks, interleave, true, {});
        f.main_slots = global_slots(c, *main_set, shard);
        f.main_len = sp.main.length;
      }
      if (f.extra) {
        extra_set = rank_set(sp.extra, rank, ranks, interleave, false, extra_here);
        f.extra_slots = global_slots(c, *extra_set, *f.extra);
        f.extra_len = sp.extra.length;
      }
      // Calls: V3.2 one over every token with a key here; V4 one per window length.
      std::map<int, Call> by_window;
      for (std::int64_t t = 0; t < T; ++t) {
        if (pos[t] < 0) continue;  // padding: no key anywhere
        const bool extra_keys = extra_set && any_key(*extra_set, static_cast<int>(t));
        if (window == 0) {
          if (!any_key(*main_set, static_cast<int>(t)) && !extra_keys) continue;
          // seq_len: the rank's keys up to the token's own position.
          by_window[0].add(static_cast<int>(t), 1, dcp_local_count(pos[t] + 1, rank, ranks, interleave), owner[t]);
        } else {
          const int hi = dcp_local_count(pos[t] + 1, rank, ranks, interleave);
          const int lo = dcp_local_count(std::max(0, pos[t] - window + 1), rank, ranks, interleave);
          if (hi == lo) continue;  // no window key here (then no compressed row either)
          by_window[hi - lo].add(static_cast<int>(t), 1, hi, owner[t]);
        }
      }
      for (const auto& [w, call] : by_window) {
        f.window = w;
        if (!m.take(call, call_sparse_decode(b, c, f, *sparse_state(ctx).sparse_q, call, cfg.exec), rank, r.timings.run_ms)) break;
      }
    }
  } catch (...) {
    m.take_exception();
  }
  if (m.failed()) {
    r.status = m.fail;
    r.message = label + ", " + m.fail_msg;
    r.timings.total_ms += ms_since(t0);
    return r;
  }
  // The sink, once, on the merged rows.
  if (!sp.sink.empty())
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < N; ++h) {
        const float l = m.acc_lse[static_cast<std::size_t>(t * N + h)];
        if (!std::isfinite(l)) continue;
        const float scale = 1.f / (1.f + std::exp(sp.sink[static_cast<std::size_t>(h)] - l));
        for (std::int64_t x = 0; x < Dv; ++x) m.acc_o[static_cast<std::size_t>((t * N + h) * Dv + x)] *= scale;
      }
  const double compare_ms = judge_merged(ctx, cfg, r, m, true, label, hint);
  r.timings.total_ms += ms_since(t0);
  r.timings.glue_ms += ms_since(t0) - (r.timings.run_ms - run_before) - compare_ms;
  return r;
}

}  // namespace mlagate::serving_detail
