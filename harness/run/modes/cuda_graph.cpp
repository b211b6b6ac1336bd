// --cuda-graph (modes/cuda_graph.h, SERVING.md): a decode captured once per
// capture size and backend, kept across a run's cases, and replayed for each
// case padded up to the captured batch, its real rows judged and its padding
// rows checked for NaN; then the padded step's cache write (slot -1 for the
// padding tokens). One record in the steps of GraphRun, in the order a serving
// engine takes them: the eager call, the padded batch, capture (or a graph an
// earlier case captured), the replays, the padded write, the verdict.
#include "harness/run/modes/cuda_graph.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "backends/decode_args.h"
#include "backends/sparse_convert.h"
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
  using Key = std::pair<const Backend*, std::string>;
  std::map<Key, Entry> entries;
  std::uint64_t clock = 0;
  // A graph holds device buffers as large as its case's cache: a backend keeps
  // at most this many (the least recently used goes first).
  static constexpr std::size_t kMaxPerBackend = 16;
  void evict_for(const Backend* b, const Key& keep) {
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

namespace modes {

using namespace serving_detail;  // the shared calls and checks (serving_calls.h)

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

// Steps 1 and 2: a uniform decode batch (vLLM's FULL_DECODE_ONLY graphs) and
// the smallest capture size that holds it; 0 with r NOT_SUPPORTED otherwise.
int capture_size(const Case& c, const std::vector<int>& sizes, Record& r) {
  const int B = c.num_requests;
  const int q = B > 0 ? c.query_lens[0] : 0;
  for (int i = 0; i < B; ++i)
    if (c.query_lens[i] != q || q < 1) {
      r.status = Status::kNotSupported;
      r.message = "graph mode replays uniform decode batches (vLLM's FULL_DECODE_ONLY graphs): request " +
                  std::to_string(i) + " has " + std::to_string(c.query_lens[i]) + " query tokens, request 0 " +
                  std::to_string(q);
      return 0;
    }
  for (int size : sizes)
    if (size >= B) return size;
  r.status = Status::kNotSupported;
  r.message = "a batch of " + std::to_string(B) + " requests is larger than the largest capture size " +
              std::to_string(sizes.empty() ? 0 : sizes.back()) + " (it runs eagerly)";
  return 0;
}

// Step 3, the padded batch: the case's requests, then S - B padding requests
// (zero queries, seq_len `pad`, the reader's block-table row), as the op's
// arguments of one capture or replay. Padding rows of seq_len 1 read the
// first key of the first request that has one (the reader).
class PaddedBatch {
 public:
  PaddedBatch(CaseContext& ctx, bool sparse, const PagedCache& cache, const SparseFull* sf, int S)
      : c_(ctx.c), cache_(cache), sf_(sf), S_(S), B_(c_.num_requests), q_(B_ > 0 ? c_.query_lens[0] : 0),
        T_(c_.num_tokens), Tp_(static_cast<std::int64_t>(S) * q_) {
    for (int i = 0; i < B_ && reader_ < 0; ++i)
      if (c_.seq_lens[i] > 0) reader_ = i;
    const std::int64_t N = c_.spec.num_heads();
    const Tensor& q_all = sparse ? *sparse_state(ctx).sparse_q : *decode_state(ctx).q_lat;
    const std::int64_t Dq = sparse ? sparse_state(ctx).sparse_q->shape()[2] : c_.spec.dims.kv_lora_rank;
    ql_ = Tensor(c_.spec.dtype, {Tp_, N, Dq});
    qp_ = Tensor(c_.spec.dtype, {Tp_, N, sparse ? 0 : c_.spec.dims.rope_dim});
    std::memcpy(ql_.bytes(), q_all.bytes(), q_all.nbytes());
    if (!sparse) std::memcpy(qp_.bytes(), decode_state(ctx).q_pe->bytes(), decode_state(ctx).q_pe->nbytes());
    seq_.resize(static_cast<std::size_t>(S));
    qsl_.resize(static_cast<std::size_t>(S) + 1);
    rows_.resize(static_cast<std::size_t>(S));
    for (int i = 0; i <= S; ++i) qsl_[i] = i * q_;
    for (int i = 0; i < S; ++i) rows_[i] = i < B_ ? i : std::max(reader_, 0);
  }

  int S() const { return S_; }
  int B() const { return B_; }
  int q() const { return q_; }
  std::int64_t T() const { return T_; }
  std::int64_t Tp() const { return Tp_; }
  // The padding seq_lens replayed: 0, and 1 when there is padding and a key to read.
  std::vector<int> pad_lens() const { return reader_ >= 0 && S_ > B_ ? std::vector<int>{0, 1} : std::vector<int>{0}; }

  DecodeArgs dense(int pad, GuardedBuffer& o, GuardedBuffer& l) {
    set_seq_lens(pad);
    return decode_args(ql_.view(), qp_.view(), cache_, {seq_, qsl_, rows_}, c_.spec.softmax_scale(), c_.spec.k_scale,
                       o.view(), l.view());
  }

  // The sparse op's rows of the padded batch: padding tokens' index rows name
  // no key (seq_len 0) or the reader's key 0 (seq_len 1), their lengths 0 or
  // 1; compressed rows name none.
  SparseDecodeArgs sparse(int pad, GuardedBuffer& o, GuardedBuffer& l) {
    set_seq_lens(pad);
    const SparseFull& sf = *sf_;
    const std::int32_t key0 = pad == 1 ? static_cast<std::int32_t>(cache_.slot_of(reader_, 0)) : -1;
    SparseDecodeArgs a;
    a.q = ql_.view();
    a.cache = &cache_;
    if (!sf.main_slots.empty()) {
      pad_rows(sf.main_slots, main_rows_, key0);
      a.indices = main_rows_.view();
    }
    pad_len_list(sf.main_len, main_len_, pad);
    a.topk_length = main_len_;
    a.window = sf.window;
    a.seq_lens = seq_;
    a.query_start_loc = qsl_;
    a.block_table_rows = rows_;
    if (sf.extra) {
      a.extra_cache = sf.extra;
      pad_rows(sf.extra_slots, extra_rows_, -1);
      a.extra_indices = extra_rows_.view();
      pad_len_list(sf.extra_len, extra_len_, 0);
      a.extra_topk_length = extra_len_;
    }
    a.sink = sf.sink;
    a.scale = c_.spec.softmax_scale();
    a.o = o.view();
    a.lse = l.view();
    return a;
  }

 private:
  void set_seq_lens(int pad) {
    for (int i = 0; i < S_; ++i) seq_[i] = i < B_ ? c_.seq_lens[i] : pad;
  }
  void pad_rows(const Tensor& real, Tensor& into, std::int32_t first) const {
    const std::int64_t K = real.shape()[1];
    if (into.empty()) into = Tensor(DType::kI32, {Tp_, K});
    std::memcpy(into.bytes(), real.bytes(), real.nbytes());
    std::int32_t* d = into.data<std::int32_t>();
    std::fill(d + T_ * K, d + Tp_ * K, -1);
    if (first >= 0 && K > 0)
      for (std::int64_t t = T_; t < Tp_; ++t) d[t * K] = first;
  }
  void pad_len_list(const std::vector<std::int32_t>& real, std::vector<std::int32_t>& into, int value) const {
    if (real.empty()) return;
    into = real;
    into.resize(static_cast<std::size_t>(Tp_), value);
  }

  const Case& c_;
  const PagedCache& cache_;
  const SparseFull* sf_;
  int S_, B_, q_;
  std::int64_t T_, Tp_;
  int reader_ = -1;
  Tensor ql_, qp_, main_rows_, extra_rows_;
  std::vector<std::int32_t> seq_, qsl_, rows_, main_len_, extra_len_;
};

// One record's graph work (steps 3 to 7) into `r`, whose eager call passed.
class GraphRun {
 public:
  GraphRun(CaseContext& ctx, Backend& b, bool sparse, const RunConfig& cfg, Record& r, int S)
      : ctx_(ctx), c_(ctx.c), b_(b), sparse_(sparse), o_name_(sparse ? "o" : "o_lat"), cfg_(cfg), r_(r),
        sf_(sparse_inputs()), cache_(sparse ? *sf_->cache : ctx.cache(r.block_size, true, cfg.exec, r.timings.cache_ms)),
        batch_(ctx, sparse, cache_, sf_ ? &*sf_ : nullptr, S), N_(c_.spec.num_heads()),
        L_(sparse ? c_.spec.sparse_dv() : c_.spec.dims.kv_lora_rank),
        sparse_base_(sparse ? baseline_of(ctx, cfg, true) : BaselineErrors{}) {}

  void run(GraphStore& store, Clock::time_point t0, double run_before) {
    const GraphStore::Key key{&b_, capture_key()};
    GraphStore::Entry& e = store.entries[key];
    e.used = ++store.clock;
    store.evict_for(&b_, key);
    try {
      if (!capture_or_reuse(store, e)) {
        store.entries.erase(key);
        r_.status = Status::kNotSupported;
        r_.message = std::string("the backend cannot be captured in a CUDA graph (it has no ") +
                     (sparse_ ? "capture_sparse_decode)" : "capture_decode)");
        r_.timings.total_ms += ms_since(t0);
        return;
      }
      replays(e);
      if (fail_ == Status::kPassed && batch_.S() > batch_.B()) padded_write();
    } catch (...) {
      store.entries.erase(key);  // a graph that threw is not replayed again
      std::string why;
      fail_ = current_exception_status(why);
      fail_msg_ = "graph capture or replay: " + why;
    }
    r_.timings.total_ms += ms_since(t0);
    r_.timings.glue_ms += std::max(0.0, ms_since(t0) - (r_.timings.run_ms - run_before));
    verdict(fail_ == Status::kPassed ? e.note() : std::string());
  }

 private:
  std::optional<SparseFull> sparse_inputs() {
    if (!sparse_) return std::nullopt;
    sparse_state(ctx_);
    SparseFull f = sparse_full(ctx_, cfg_, r_.block_size, r_.timings.cache_ms);
    // The captured rows as the sparse op hands them (padding rows are a prefix already).
    order_rows_for(b_, f.main_slots, !f.main_len.empty());
    return f;
  }
  const PagedCache* extra() const { return sparse_ ? sf_->extra : nullptr; }
  GuardedBuffer out() const { return GuardedBuffer(c_.spec.dtype, {batch_.Tp(), N_, L_}, cfg_.exec.poison); }
  GuardedBuffer lse() const { return GuardedBuffer(DType::kF32, {batch_.Tp(), N_}, cfg_.exec.poison); }

  // A graph's key: whatever a captured graph fixes (step 4).
  std::string capture_key() const {
    std::ostringstream key;
    key << batch_.S() << "/" << batch_.q() << "/" << N_ << "/" << dims_label(c_.spec.dims) << "/"
        << dtype_name(c_.spec.dtype) << "/" << kv_cache_format_name(c_.spec.kv_format()) << "/" << cache_.block_size
        << "/" << exact_number(c_.spec.softmax_scale()) << "/" << exact_number(c_.spec.k_scale);
    if (sparse_) {
      const SparseFull& sf = *sf_;
      key << "/sparse/" << sf.main_slots.shape().size() << "/" << (sf.main_slots.empty() ? 0 : sf.main_slots.shape()[1])
          << "/" << (sf.extra ? sf.extra_slots.shape()[1] : 0) << "/" << sf.main_len.size() << "/" << sf.extra_len.size()
          << "/" << sf.window << "/" << sf.sink.size();
    }
    return key.str();
  }

  // Step 4: the key's graph, captured at this case when there is none or its
  // cache outgrew the graph's. False when the backend cannot be captured.
  bool capture_or_reuse(GraphStore& store, GraphStore::Entry& e) {
    const PagedCache* x = extra();
    const bool larger = cache_.num_blocks > e.blocks || cache_.table_width > e.width ||
                        (x && (x->num_blocks > e.extra_blocks || x->table_width > e.extra_width));
    if (e.captured() && !larger) {
      how_ = "replayed, captured at " + e.captured_at + " (" + std::to_string(e.replays) + " replays before)";
      return true;
    }
    const bool again = e.captured();
    e = GraphStore::Entry{};
    e.used = store.clock;
    GuardedBuffer o = out(), l = lse();
    const auto tc = Clock::now();
    if (sparse_) e.sparse_graph = b_.capture_sparse_decode(batch_.sparse(0, o, l));
    else e.graph = b_.capture_decode(batch_.dense(0, o, l));
    r_.timings.run_ms += backend_call_done(tc);
    if (!e.captured()) return false;
    e.blocks = cache_.num_blocks;
    e.width = cache_.table_width;
    if (x) e.extra_blocks = x->num_blocks, e.extra_width = x->table_width;
    e.captured_at = c_.spec.id();
    how_ = again ? "captured again at this case (its cache is larger than the graph's)" : "captured at this case";
    return true;
  }

  // Step 5: a replay per padding seq_len, its real rows judged, its padding
  // rows counted for NaN.
  void replays(GraphStore::Entry& e) {
    const std::int64_t T = batch_.T(), Tp = batch_.Tp();
    for (int pad : batch_.pad_lens()) {
      GuardedBuffer o = out(), l = lse();
      const auto tc = Clock::now();
      if (sparse_) e.sparse_graph->replay(batch_.sparse(pad, o, l));
      else e.graph->replay(batch_.dense(pad, o, l));
      r_.timings.run_ms += backend_call_done(tc);
      ++e.replays;
      const std::string label = "graph replay with padding seq_len " + std::to_string(pad);
      std::string guard = o.check_guards(o_name_);
      if (guard.empty()) guard = l.check_guards("lse");
      if (!guard.empty()) {
        fail_ = Status::kIncorrect, fail_msg_ = label + ": " + guard;
        return;
      }
      const TensorView real_o{c_.spec.dtype, {T, N_, L_}, o.view().data}, real_l{DType::kF32, {T, N_}, l.view().data};
      const RowCheck rc =
          sparse_ ? check_rows(ctx_, cfg_, sparse_base_, real_o, real_l, c_.query_start_loc,
                               sparse_state(ctx_).sparse_ref.o, sparse_state(ctx_).sparse_ref.lse, o_name_, L_)
                  : check_rows(ctx_, cfg_, baseline_of(ctx_, cfg_), real_o, real_l, c_.query_start_loc, decode_state(ctx_).mqa_o_lat,
                               decode_state(ctx_).mqa_lse);
      if (pad == 0) first_check_ = rc;
      if (rc.status != Status::kPassed) {
        fail_ = rc.status, fail_msg_ = label + ": " + rc.message;
        return;
      }
      // Padding rows: never judged against a reference, but NaN there is stale
      // output that reaches real rows through whatever reads the whole output.
      pad_elems_ += (Tp - T) * N_ * L_;
      pad_nan_o_ += nonfinite_rows(o.view(), T, Tp, N_ * L_, false);
      pad_nan_lse_ += nonfinite_rows(l.view(), T, Tp, N_, true);
    }
  }

  // Step 7: the padded step's cache write, once per record with padding.
  void padded_write() {
    const PagedCache& context_only = ctx_.cache(r_.block_size, false, cfg_.exec, r_.timings.cache_ms);
    const auto tw = Clock::now();
    const std::string diff = check_padded_write(b_, c_, context_only, batch_.Tp(), batch_.S(), batch_.q(), write_note_);
    r_.timings.run_ms += backend_call_done(tw);
    if (!diff.empty())
      fail_ = Status::kIncorrect,
      fail_msg_ = "padded cache write (slot_mapping -1 for the padding tokens, as vLLM pads it): " + diff +
                  " (vLLM #38719's class: padding written into a real slot)";
  }

  // The record: a failure with where it happened, NaN in the padding rows, or
  // the graph's note and what passed. Metrics: the real rows' and `padding`.
  void verdict(const std::string& note) {
    const int S = batch_.S(), B = batch_.B();
    const std::string where = "capture size " + std::to_string(S) + ": " + std::to_string(B) + " requests + " +
                              std::to_string(S - B) + " padding" + (how_.empty() ? "" : "; " + how_);
    if (fail_ != Status::kPassed) {
      r_.status = fail_;
      r_.message = fail_msg_ + " (" + where + ")";
      return;
    }
    std::erase_if(r_.metrics, [](const Metrics& m) { return m.output != "quant_error"; });
    Metrics pm;
    pm.output = "padding";
    pm.numel = pad_elems_;
    pm.nonfinite_mismatches = pad_nan_o_ + pad_nan_lse_;
    pm.passed = pm.nonfinite_mismatches == 0;
    pm.message = std::to_string(pad_nan_o_) + " " + o_name_ + " and " + std::to_string(pad_nan_lse_) +
                 " lse elements of the padding rows are NaN" + (pad_nan_o_ ? "" : " or infinite") + " after the replays";
    r_.metrics.insert(r_.metrics.begin(), {first_check_.o, first_check_.lse, pm});
    if (!pm.passed) {
      r_.status = Status::kNonfinite;
      r_.message = "padding rows hold NaN after the graph replay: " + pm.message +
                   " (stale output the replay left in the persistent buffer; it reaches real rows through anything "
                   "that reads the whole output, e.g. an fp8 amax: vLLM #37442) (" + where + ")";
      return;
    }
    r_.message = note + " (" + where + "): real rows match with padding seq_len " +
                 (batch_.pad_lens().size() > 1 ? std::string("0 and 1") : std::string("0")) + "; padding rows finite" +
                 (S > B && write_note_.empty() ? "; the padded cache write (slot -1) exact" : write_note_);
  }

  CaseContext& ctx_;
  const Case& c_;
  Backend& b_;
  bool sparse_;
  const char* o_name_;
  const RunConfig& cfg_;
  Record& r_;
  std::optional<SparseFull> sf_;
  const PagedCache& cache_;
  PaddedBatch batch_;
  std::int64_t N_, L_;
  BaselineErrors sparse_base_;
  // What the capture and the replays found.
  std::string how_, fail_msg_, write_note_;
  Status fail_ = Status::kPassed;
  RowCheck first_check_;
  std::int64_t pad_nan_o_ = 0, pad_nan_lse_ = 0, pad_elems_ = 0;
};

}  // namespace

void CudaGraph::validate() const {
  if (capture_sizes.empty()) throw InputError("--capture-sizes: give at least one size");
  for (std::size_t i = 0; i < capture_sizes.size(); ++i)
    if (capture_sizes[i] < 1 || capture_sizes[i] > 65536 || (i > 0 && capture_sizes[i] <= capture_sizes[i - 1]))
      throw InputError("--capture-sizes: sizes must be increasing, within 1..65536");
}

Record CudaGraph::run(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) const {
  const bool sparse = op == Op::kSparseDecode;
  std::vector<Captured> plain;
  Record r = plain_run(ctx, b, op, cfg, plain);
  if (!find_output(plain, sparse ? "o" : "o_lat")) return r;
  if (r.status != Status::kPassed) {
    r.message = "the eager call, before the graph: " + r.message;
    return r;
  }
  const auto t0 = Clock::now();
  const double run_before = r.timings.run_ms;
  const int S = capture_size(ctx.c, capture_sizes, r);
  if (S == 0) return r;
  GraphRun g(ctx, b, sparse, cfg, r, S);
  if (!graphs) throw std::logic_error("graph mode without a graph store");
  g.run(*graphs, t0, run_before);
  return r;
}

}  // namespace modes
}  // namespace mlagate
