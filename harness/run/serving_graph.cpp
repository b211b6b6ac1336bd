// --cuda-graph (serving.h, SERVING.md): a decode captured once per capture
// size and backend, kept across a run's cases, and replayed for each case
// padded up to the captured batch, its real rows judged and its padding rows
// checked for NaN.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "cases/errors.h"
#include "harness/run/serving_calls.h"
#include "reports/profile.h"

namespace mlagate {

using serving_detail::Clock;
using serving_detail::ms_since;
struct GraphStore {
  struct Entry {
    std::unique_ptr<DecodeGraph> graph;              // the decode op's
    std::unique_ptr<SparseDecodeGraph> sparse_graph;  // the sparse decode op's
    int blocks = 0, width = 0;  // the cache capacity it was captured with
    int extra_blocks = 0, extra_width = 0;  // V4's compressed cache's
    bool captured() const { return graph || sparse_graph; }
    std::string note() const { return graph ? graph->note() : sparse_graph ? sparse_graph->note() : std::string(); }
    std::string captured_at;    // the case id
    int replays = 0;
    std::uint64_t used = 0;     // when it was last used (the store's clock)
  };
  std::map<std::pair<const Backend*, std::string>, Entry> entries;
  std::uint64_t clock = 0;
  // A graph holds device buffers as large as its case's cache: a backend keeps
  // at most this many (the least recently used goes first).
  static constexpr std::size_t kMaxPerBackend = 16;
  void evict_for(const Backend* b, const std::pair<const Backend*, std::string>& keep) {
    std::size_t n = 0;
    for (const auto& [k, e] : entries) n += k.first == b ? 1 : 0;
    while (n > kMaxPerBackend) {
      auto oldest = entries.end();
      for (auto it = entries.begin(); it != entries.end(); ++it)
        if (it->first.first == b && it->first != keep && (oldest == entries.end() || it->second.used < oldest->second.used))
          oldest = it;
      if (oldest == entries.end()) return;
      entries.erase(oldest);
      --n;
    }
  }
};

std::shared_ptr<GraphStore> make_graph_store() { return std::make_shared<GraphStore>(); }

std::vector<int> default_capture_sizes() {
  std::vector<int> v = {1, 2, 4};
  for (int s = 8; s <= 512; s += 8) v.push_back(s);
  return v;
}

namespace serving_detail {
namespace {

// Non-finite elements among rows [first, last) of a [rows, width] output.
std::int64_t nonfinite_rows(const TensorView& v, std::int64_t first, std::int64_t last, std::int64_t width,
                            bool allow_inf) {
  std::int64_t n = 0;
  for (std::int64_t i = first * width; i < last * width; ++i) {
    const double x = v.get(i);
    if (std::isnan(x) || (!allow_inf && std::isinf(x))) ++n;
  }
  return n;
}

// The padded step's cache write, as a captured engine step makes it: the real
// tokens at their slots, every padding token at slot -1 (vLLM pads
// slot_mapping with -1), through the backend's own writer into a copy of the
// context-only cache, compared byte for byte with the reference writer's. ""
// when identical; the first difference otherwise (a writer that turns slot -1
// into slot 0 writes the padding into another request's key: vLLM #38719).
// Plain runs never hand a writer slot -1 (the cache_write op and the decode
// loops skip padding), so this is the one place a writer meets it.
std::string check_padded_write(Backend& b, const Case& c, const PagedCache& context_only, std::int64_t Tp, int S, int q,
                               std::string& note) {
  const std::int64_t T = c.num_tokens, L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim;
  const std::size_t esz = dtype_size(c.spec.dtype);
  const std::int64_t* sm = context_only.slot_mapping.data<std::int64_t>();
  Tensor kv(c.spec.dtype, {Tp, L}), pe(c.spec.dtype, {Tp, R});
  std::vector<std::int64_t> slots(static_cast<std::size_t>(Tp), -1);
  for (int i = 0; i < c.num_requests; ++i)
    for (int u = 0; u < c.query_lens[i]; ++u) {
      const std::int64_t t = c.query_start_loc[i] + u;
      const std::int64_t row = c.kv_start_loc[i] + c.context_lens[i] + u;
      slots[static_cast<std::size_t>(t)] = sm[t];
      std::memcpy(kv.bytes() + t * L * esz, c.kv_c.bytes() + row * L * esz, static_cast<std::size_t>(L) * esz);
      std::memcpy(pe.bytes() + t * R * esz, c.k_pe.bytes() + row * R * esz, static_cast<std::size_t>(R) * esz);
    }
  // Padding tokens carry the first real token's values (a writer that writes
  // them anyway writes a real key where it does not belong).
  for (std::int64_t t = T; t < Tp && T > 0; ++t) {
    std::memcpy(kv.bytes() + t * L * esz, kv.bytes(), static_cast<std::size_t>(L) * esz);
    std::memcpy(pe.bytes() + t * R * esz, pe.bytes(), static_cast<std::size_t>(R) * esz);
  }
  PagedCache expected = context_only, got = context_only;
  reference_cache_write(expected, kv.view(), pe.view(), slots);
  try {
    b.cache_write(got, kv.view(), pe.view(), slots);
  } catch (const NotSupportedError& e) {
    note = std::string("; the padded cache write not checked (the backend's cache_write: ") + e.what() + ")";
    return {};
  }
  std::vector<std::int32_t> qsl(static_cast<std::size_t>(S) + 1);
  for (int i = 0; i <= S; ++i) qsl[static_cast<std::size_t>(i)] = i * q;
  return first_cache_difference(got, expected, slots, qsl);
}

}  // namespace

Record run_graph(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg, const ServingMode& mode) {
  const bool sparse = op == Op::kSparseDecode;
  const char* o_name = sparse ? "o" : "o_lat";
  std::vector<Captured> plain;
  Record r = plain_run(ctx, b, op, cfg, plain);
  if (!find_output(plain, o_name)) return r;
  if (r.status != Status::kPassed) {
    r.message = "the eager call, before the graph: " + r.message;
    return r;
  }
  const auto t0 = Clock::now();
  const double run_before = r.timings.run_ms;
  const Case& c = ctx.c;
  const int B = c.num_requests;
  const int q = B > 0 ? c.query_lens[0] : 0;
  for (int i = 0; i < B; ++i)
    if (c.query_lens[i] != q || q < 1) {
      r.status = Status::kNotSupported;
      r.message = "graph mode replays uniform decode batches (vLLM's FULL_DECODE_ONLY graphs): request " +
                  std::to_string(i) + " has " + std::to_string(c.query_lens[i]) + " query tokens, request 0 " +
                  std::to_string(q);
      return r;
    }
  int S = 0;
  for (int size : mode.capture_sizes)
    if (size >= B) {
      S = size;
      break;
    }
  if (S == 0) {
    r.status = Status::kNotSupported;
    r.message = "a batch of " + std::to_string(B) + " requests is larger than the largest capture size " +
                std::to_string(mode.capture_sizes.empty() ? 0 : mode.capture_sizes.back()) + " (it runs eagerly)";
    return r;
  }
  std::optional<SparseFull> sf;
  if (sparse) {
    sparse_state(ctx);
    sf = sparse_full(ctx, cfg, r.block_size, r.timings.cache_ms);
  }
  const PagedCache& cache = sparse ? *sf->cache : ctx.cache(r.block_size, true, cfg.exec, r.timings.cache_ms);
  const std::int64_t T = c.num_tokens, Tp = static_cast<std::int64_t>(S) * q, N = c.spec.num_heads(),
                     L = sparse ? c.spec.sparse_dv() : c.spec.dims.kv_lora_rank;
  // Padding rows of seq_len 1 read the first key of a request that has one.
  int reader = -1;
  for (int i = 0; i < B && reader < 0; ++i)
    if (c.seq_lens[i] > 0) reader = i;
  std::vector<int> pad_lens = {0};
  if (reader >= 0 && S > B) pad_lens.push_back(1);

  // The padded batch: the case's requests, then S - B padding requests (zero
  // queries, seq_len pad, the reader's block-table row).
  const std::int64_t Dq = sparse ? sparse_state(ctx).sparse_q->shape()[2] : L;
  Tensor ql(c.spec.dtype, {Tp, N, Dq}), qp(c.spec.dtype, {Tp, N, sparse ? 0 : c.spec.dims.rope_dim});
  std::memcpy(ql.bytes(), (sparse ? *sparse_state(ctx).sparse_q : *decode_state(ctx).q_lat).bytes(), (sparse ? *sparse_state(ctx).sparse_q : *decode_state(ctx).q_lat).nbytes());
  if (!sparse) std::memcpy(qp.bytes(), decode_state(ctx).q_pe->bytes(), decode_state(ctx).q_pe->nbytes());
  std::vector<std::int32_t> seq(static_cast<std::size_t>(S)), qsl(static_cast<std::size_t>(S) + 1), rows(static_cast<std::size_t>(S));
  for (int i = 0; i <= S; ++i) qsl[i] = i * q;
  for (int i = 0; i < S; ++i) rows[i] = i < B ? i : std::max(reader, 0);
  const auto args_for = [&](int pad, GuardedBuffer& o, GuardedBuffer& l) {
    for (int i = 0; i < S; ++i) seq[i] = i < B ? c.seq_lens[i] : pad;
    DecodeArgs a;
    a.q_lat = ql.view();
    a.q_pe = qp.view();
    a.cache = &cache;
    a.seq_lens = seq;
    a.query_start_loc = qsl;
    a.block_table_rows = rows;
    a.scale = c.spec.softmax_scale();
    a.k_scale = c.spec.k_scale;
    a.o_lat = o.view();
    a.lse = l.view();
    return a;
  };
  // The sparse op's rows of the padded batch: padding tokens' index rows
  // name no key (seq_len 0) or the reader's key 0 (seq_len 1), their
  // lengths 0 or 1; compressed rows name none.
  Tensor main_rows, extra_rows;
  std::vector<std::int32_t> main_len, extra_len;
  const auto pad_rows = [&](const Tensor& real, Tensor& into, std::int32_t first) {
    const std::int64_t K = real.shape()[1];
    if (into.empty()) into = Tensor(DType::kI32, {Tp, K});
    std::memcpy(into.bytes(), real.bytes(), real.nbytes());
    std::int32_t* d = into.data<std::int32_t>();
    std::fill(d + T * K, d + Tp * K, -1);
    if (first >= 0 && K > 0)
      for (std::int64_t t = T; t < Tp; ++t) d[t * K] = first;
  };
  const auto pad_len_list = [&](const std::vector<std::int32_t>& real, std::vector<std::int32_t>& into, int value) {
    if (real.empty()) return;
    into = real;
    into.resize(static_cast<std::size_t>(Tp), value);
  };
  const auto sparse_args_for = [&](int pad, GuardedBuffer& o, GuardedBuffer& l) {
    for (int i = 0; i < S; ++i) seq[i] = i < B ? c.seq_lens[i] : pad;
    const std::int32_t key0 = pad == 1 ? static_cast<std::int32_t>(cache.slot_of(reader, 0)) : -1;
    SparseDecodeArgs a;
    a.q = ql.view();
    a.cache = &cache;
    if (!sf->main_slots.empty()) {
      pad_rows(sf->main_slots, main_rows, key0);
      a.indices = main_rows.view();
    }
    pad_len_list(sf->main_len, main_len, pad);
    a.topk_length = main_len;
    a.window = sf->window;
    a.seq_lens = seq;
    a.query_start_loc = qsl;
    a.block_table_rows = rows;
    if (sf->extra) {
      a.extra_cache = sf->extra;
      pad_rows(sf->extra_slots, extra_rows, -1);
      a.extra_indices = extra_rows.view();
      pad_len_list(sf->extra_len, extra_len, 0);
      a.extra_topk_length = extra_len;
    }
    a.sink = sf->sink;
    a.scale = c.spec.softmax_scale();
    a.o = o.view();
    a.lse = l.view();
    return a;
  };
  std::ostringstream key;
  key << S << "/" << q << "/" << N << "/" << dims_label(c.spec.dims) << "/" << dtype_name(c.spec.dtype) << "/"
      << kv_cache_format_name(c.spec.kv_format()) << "/" << cache.block_size << "/" << exact_number(c.spec.softmax_scale())
      << "/" << exact_number(c.spec.k_scale);
  if (sparse)
    key << "/sparse/" << sf->main_slots.shape().size() << "/" << (sf->main_slots.empty() ? 0 : sf->main_slots.shape()[1])
        << "/" << (sf->extra ? sf->extra_slots.shape()[1] : 0) << "/" << sf->main_len.size() << "/"
        << sf->extra_len.size() << "/" << sf->window << "/" << sf->sink.size();
  const PagedCache* extra = sparse ? sf->extra : nullptr;
  if (!mode.graphs) throw std::logic_error("graph mode without a graph store");
  GraphStore& store = *mode.graphs;
  const auto entry_key = std::make_pair(static_cast<const Backend*>(&b), key.str());
  GraphStore::Entry& e = store.entries[entry_key];
  e.used = ++store.clock;
  store.evict_for(&b, entry_key);
  std::string how;
  Status fail = Status::kPassed;
  std::string fail_msg;
  RowCheck first_check;
  std::int64_t pad_nan_o = 0, pad_nan_lse = 0, pad_elems = 0;
  std::string write_note;
  const BaselineErrors sparse_base = sparse ? baseline_of(ctx, cfg, true) : BaselineErrors{};
  try {
    const bool larger = cache.num_blocks > e.blocks || cache.table_width > e.width ||
                        (extra && (extra->num_blocks > e.extra_blocks || extra->table_width > e.extra_width));
    if (!e.captured() || larger) {
      const bool again = e.captured();
      e = GraphStore::Entry{};
      e.used = store.clock;
      GuardedBuffer o(c.spec.dtype, {Tp, N, L}, cfg.exec.poison), l(DType::kF32, {Tp, N}, cfg.exec.poison);
      const auto tc = Clock::now();
      if (sparse) e.sparse_graph = b.capture_sparse_decode(sparse_args_for(0, o, l));
      else e.graph = b.capture_decode(args_for(0, o, l));
      r.timings.run_ms += backend_call_done(tc);
      if (!e.captured()) {
        store.entries.erase(entry_key);
        r.status = Status::kNotSupported;
        r.message = std::string("the backend cannot be captured in a CUDA graph (it has no ") +
                    (sparse ? "capture_sparse_decode)" : "capture_decode)");
        r.timings.total_ms += ms_since(t0);
        return r;
      }
      e.blocks = cache.num_blocks;
      e.width = cache.table_width;
      if (extra) e.extra_blocks = extra->num_blocks, e.extra_width = extra->table_width;
      e.captured_at = c.spec.id();
      how = again ? "captured again at this case (its cache is larger than the graph's)" : "captured at this case";
    } else {
      how = "replayed, captured at " + e.captured_at + " (" + std::to_string(e.replays) + " replays before)";
    }
    for (int pad : pad_lens) {
      GuardedBuffer o(c.spec.dtype, {Tp, N, L}, cfg.exec.poison), l(DType::kF32, {Tp, N}, cfg.exec.poison);
      const auto tc = Clock::now();
      if (sparse) e.sparse_graph->replay(sparse_args_for(pad, o, l));
      else e.graph->replay(args_for(pad, o, l));
      r.timings.run_ms += backend_call_done(tc);
      ++e.replays;
      const std::string label = "graph replay with padding seq_len " + std::to_string(pad);
      std::string guard = o.check_guards(o_name);
      if (guard.empty()) guard = l.check_guards("lse");
      if (!guard.empty()) {
        fail = Status::kIncorrect, fail_msg = label + ": " + guard;
        break;
      }
      // The real rows against the reference.
      const TensorView real_o{c.spec.dtype, {T, N, L}, o.view().data}, real_l{DType::kF32, {T, N}, l.view().data};
      const RowCheck rc =
          sparse ? check_rows(ctx, cfg, sparse_base, real_o, real_l, c.query_start_loc, sparse_state(ctx).sparse_ref.o,
                              sparse_state(ctx).sparse_ref.lse, o_name, L)
                 : check_rows(ctx, cfg, baseline_of(ctx, cfg), real_o, real_l, c.query_start_loc, decode_state(ctx).mqa_o_lat,
                              decode_state(ctx).mqa_lse);
      if (pad == 0) first_check = rc;
      if (rc.status != Status::kPassed) {
        fail = rc.status, fail_msg = label + ": " + rc.message;
        break;
      }
      // Padding rows: never judged against a reference, but NaN there is stale
      // output that reaches real rows through whatever reads the whole output.
      pad_elems += (Tp - T) * N * L;
      pad_nan_o += nonfinite_rows(o.view(), T, Tp, N * L, false);
      pad_nan_lse += nonfinite_rows(l.view(), T, Tp, N, true);
    }
    // The padded step's cache write, once per record.
    if (fail == Status::kPassed && S > B) {
      const PagedCache& context_only = ctx.cache(r.block_size, false, cfg.exec, r.timings.cache_ms);
      const auto tw = Clock::now();
      const std::string diff = check_padded_write(b, c, context_only, Tp, S, q, write_note);
      r.timings.run_ms += backend_call_done(tw);
      if (!diff.empty())
        fail = Status::kIncorrect,
        fail_msg = "padded cache write (slot_mapping -1 for the padding tokens, as vLLM pads it): " + diff +
                   " (vLLM #38719's class: padding written into a real slot)";
    }
  } catch (...) {
    store.entries.erase(entry_key);  // a graph that threw is not replayed again
    std::string why;
    fail = current_exception_status(why);
    fail_msg = "graph capture or replay: " + why;
  }
  r.timings.total_ms += ms_since(t0);
  r.timings.glue_ms += std::max(0.0, ms_since(t0) - (r.timings.run_ms - run_before));
  const std::string where = "capture size " + std::to_string(S) + ": " + std::to_string(B) + " requests + " +
                            std::to_string(S - B) + " padding" + (how.empty() ? "" : "; " + how);
  if (fail != Status::kPassed) {
    r.status = fail;
    r.message = fail_msg + " (" + where + ")";
    return r;
  }
  std::erase_if(r.metrics, [](const Metrics& m) { return m.output != "quant_error"; });
  Metrics pm;
  pm.output = "padding";
  pm.numel = pad_elems;
  pm.nonfinite_mismatches = pad_nan_o + pad_nan_lse;
  pm.passed = pm.nonfinite_mismatches == 0;
  pm.message = std::to_string(pad_nan_o) + " " + o_name + " and " + std::to_string(pad_nan_lse) +
               " lse elements of the padding rows are NaN" + (pad_nan_o ? "" : " or infinite") + " after the replays";
  r.metrics.insert(r.metrics.begin(), {first_check.o, first_check.lse, pm});
  if (!pm.passed) {
    r.status = Status::kNonfinite;
    r.message = "padding rows hold NaN after the graph replay: " + pm.message +
                " (stale output the replay left in the persistent buffer; it reaches real rows through anything "
                "that reads the whole output, e.g. an fp8 amax: vLLM #37442) (" + where + ")";
    return r;
  }
  r.message = e.note() + " (" + where + "): real rows match with padding seq_len " +
              (pad_lens.size() > 1 ? std::string("0 and 1") : std::string("0")) + "; padding rows finite" +
              (S > B && write_note.empty() ? "; the padded cache write (slot -1) exact" : write_note);
  return r;
}

}  // namespace serving_detail

}  // namespace mlagate
