// CaseDrawer (draw.h): case i of a search, drawn within the space and the
// target backend's declaration, biased toward boundaries.
#include "harness/explore/draw.h"

#include <algorithm>
#include <numeric>

#include "cases/case.h"
#include "cases/errors.h"
#include "harness/reliability/memory_estimate.h"

namespace mlagate {

namespace {

std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A length in [lo, hi]: half the time a boundary value (0, 1, b - 1, b, b + 1
// for b the block size, 64 and powers of two), else log-uniform (a bit length
// drawn uniformly, then a value of that length), so that short and long are
// both common.
int draw_len(DrawRng& r, int lo, int hi, int bs) {
  if (lo >= hi) return lo;
  if (r.percent(50)) {
    std::vector<int> b = {0, 1, 2};
    for (int base : {bs, 2 * bs, 16, 64, 128}) b.insert(b.end(), {base - 1, base, base + 1});
    for (int k = 2; k <= 20; ++k) b.insert(b.end(), {(1 << k) - 1, 1 << k, (1 << k) + 1});
    std::erase_if(b, [&](int v) { return v < lo || v > hi; });
    if (!b.empty()) return r.pick(b);
  }
  int bits_hi = 0;
  while ((1ll << (bits_hi + 1)) <= hi) ++bits_hi;
  const int k = r.between(0, bits_hi);
  const int a = std::max(lo, k == 0 ? 0 : 1 << k), z = std::min<long long>(hi, (2ll << k) - 1);
  return a <= z ? r.between(a, z) : r.between(lo, hi);
}

// Heads on the rank: powers of two (what TP splits give), multiples of 8 and
// 16 and their neighbours (tile edges), and any count.
int draw_heads(DrawRng& r, IntRange range) {
  std::vector<int> c;
  const int kind = static_cast<int>(r.below(3));
  for (int h = range.lo; h <= range.hi; ++h) {
    const bool pow2 = (h & (h - 1)) == 0;
    const bool edge = h % 8 == 0 || (h + 1) % 16 == 0 || (h - 1) % 16 == 0;
    if ((kind == 0 && pow2) || (kind == 1 && edge) || kind == 2) c.push_back(h);
  }
  return c.empty() ? r.between(range.lo, range.hi) : r.pick(c);
}

template <class T>
std::vector<T> intersect(const std::vector<T>& want, const std::vector<T>& have) {
  if (want.empty()) return have;
  std::vector<T> out;
  for (const T& v : want)
    if (std::find(have.begin(), have.end(), v) != have.end()) out.push_back(v);
  return out;
}

}  // namespace

DrawRng::DrawRng(std::uint64_t seed, std::uint64_t index) : s_(mix(seed * 0x9E3779B97F4A7C15ull + mix(index + 1))) {}

std::uint64_t DrawRng::next() {
  s_ += 0x9E3779B97F4A7C15ull;
  return mix(s_);
}

std::uint64_t DrawRng::below(std::uint64_t n) {
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
}

int DrawRng::between(int lo, int hi) { return lo + static_cast<int>(below(static_cast<std::uint64_t>(hi - lo) + 1)); }

double reference_work(const CaseSpec& s, Op op) {
  const double heads = s.num_heads();
  double tk = 0;  // query tokens x keys they see
  for (int i = 0; i < s.num_requests(); ++i) tk += double(s.batch.query_lens[i]) * s.batch.seq_lens[i];
  if (is_sparse_op(op)) {
    const double width = s.sparse.topk + s.sparse.window + s.sparse.extra_topk;
    return s.num_tokens() * width * heads * s.dims.head_size();
  }
  if (op == Op::kCacheWrite) return double(s.num_kv_tokens()) * s.dims.head_size();
  const double d = op == Op::kPrefill ? s.dims.nope_dim + s.dims.rope_dim + s.dims.v_head_dim
                                      : s.dims.head_size() + s.dims.kv_lora_rank;
  // The layer op also up-projects every context key per head on its prefill path.
  const double glue = op == Op::kLayer ? double(s.num_kv_tokens()) * heads * (s.dims.nope_dim + s.dims.v_head_dim) *
                                             s.dims.kv_lora_rank / 64.0
                                       : 0.0;
  return tk * heads * d + glue;
}

CaseDrawer::CaseDrawer(ExploreSpace space, std::vector<const Backend*> backends, std::uint64_t seed, DrawLimits limits)
    : space_(std::move(space)), backends_(std::move(backends)), seed_(seed), limits_(limits) {
  if (backends_.empty()) throw InputError("explore: no backend selected");
}

std::vector<Op> CaseDrawer::ops_of(const Backend& b) const {
  std::vector<Op> declared;
  const Capabilities caps = b.capabilities();
  const bool dense = std::find(caps.ops.begin(), caps.ops.end(), Op::kDecode) != caps.ops.end() ||
                     std::find(caps.ops.begin(), caps.ops.end(), Op::kPrefill) != caps.ops.end();
  if (dense) declared.push_back(Op::kLayer);
  // merge_states is not drawn: its cases have no shape space worth a search
  // (tokens x heads x head dim, each row independent) and the merge suite
  // names every lse pattern (EXPLORE.md, "What it draws").
  for (Op op : caps.ops)
    if (!is_merge_op(op)) declared.push_back(op);
  if (space_.ops.empty()) return declared;
  std::vector<Op> want;
  for (const std::string& o : space_.ops) want.push_back(parse_op(o));
  return intersect(want, declared);
}

CaseSpec CaseDrawer::draw_spec(DrawRng& r, const Backend& b, Op op) const {
  const Capabilities caps = b.capabilities();
  CaseSpec c;
  c.suite = "explore";
  c.dims = dims_preset(r.pick(space_.dims));
  const std::vector<DType> dtypes = intersect(space_.dtypes, caps.dtypes);
  if (!dtypes.empty()) c.dtype = r.pick(dtypes);
  std::vector<KvCacheFormat> declared;
  for (KvCacheDtype k : caps.kv_dtypes) {
    declared.push_back({k, ScaleRule::kPow2});
    if (k == KvCacheDtype::kFp8DsMla) declared.push_back({k, ScaleRule::kRaw});
  }
  const std::vector<KvCacheFormat> kvs = intersect(space_.kv_dtypes, declared);
  if (!kvs.empty()) {
    const KvCacheFormat f = r.pick(kvs);
    c.kv_cache_dtype = f.dtype;
    c.scale_rule = f.scale_rule;
  }
  const std::vector<int> bss = intersect(space_.block_sizes, caps.block_sizes);
  c.block_size = bss.empty() ? 0 : r.pick(bss);
  const int bs = c.block_size ? c.block_size : (caps.block_sizes.empty() ? 16 : caps.block_sizes.front());
  c.total_heads = draw_heads(r, space_.heads);
  c.tp = 1;
  c.seed = r.next() & 0x7FFFFFFFu;  // a suite file takes int seeds
  c.q_magnitude = r.pick(space_.q_magnitudes);
  if (c.kv_cache_dtype == KvCacheDtype::kFp8 || c.kv_cache_dtype == KvCacheDtype::kFp8E4m3)
    c.k_scale = static_cast<float>(r.pick(space_.k_scales));

  // The batch: a request count, a length scale, then each request.
  const int b_count = r.percent(50) ? r.between(space_.requests.lo, std::min(space_.requests.hi, std::max(space_.requests.lo, 4)))
                                    : draw_len(r, space_.requests.lo, space_.requests.hi, 16);
  const int s_lo = std::max(1, space_.seq_len.lo);
  const int s_max = std::max(s_lo, draw_len(r, s_lo, space_.seq_len.hi, bs));
  const bool same_len = r.percent(15);
  const int q_kind = static_cast<int>(r.below(10));  // 0-3: decodes, 4-5: uniform q, 6-9: mixed
  const int q_uniform = draw_len(r, std::max(2, space_.query_len.lo), std::max(2, space_.query_len.hi), 64);
  c.batch.name = "x";
  for (int i = 0; i < b_count; ++i) {
    int s = same_len || i == 0 ? s_max : (r.percent(50) ? draw_len(r, s_lo, s_max, bs) : r.between(s_lo, s_max));
    int q = q_kind < 4 ? 1 : q_kind < 6 ? q_uniform : (r.percent(40) ? 1 : draw_len(r, space_.query_len.lo, space_.query_len.hi, 64));
    q = std::clamp(q, space_.query_len.lo, space_.query_len.hi);
    if (q > s) s = std::min(space_.seq_len.hi, q);
    q = std::min(q, s);
    c.batch.seq_lens.push_back(s);
    c.batch.query_lens.push_back(std::max(1, q));
  }
  // Decodes of several tokens each, all alike: a spec-decode batch.
  c.batch.spec_decode = q_kind >= 4 && q_kind < 6 && r.percent(50) &&
                        std::all_of(c.batch.query_lens.begin(), c.batch.query_lens.end(),
                                    [&](int q) { return q == c.batch.query_lens.front() && q > 1; });
  if (space_.seq_len.lo == 0 && r.percent(space_.padding_percent)) {
    const int pads = r.between(1, 3);
    for (int k = 0; k < pads && c.num_requests() < space_.requests.hi; ++k) {
      const auto at = static_cast<std::ptrdiff_t>(r.below(static_cast<std::uint64_t>(c.num_requests()) + 1));
      c.batch.seq_lens.insert(c.batch.seq_lens.begin() + at, 0);
      c.batch.query_lens.insert(c.batch.query_lens.begin() + at, c.batch.spec_decode ? c.batch.query_lens.front() : 1);
    }
  }
  if (is_sparse_op(op)) {
    std::vector<IndexPattern> pats = space_.patterns;
    if (pats.empty()) pats = index_patterns();
    c.sparse.pattern = r.pick(pats);
    c.sparse.sink = r.percent(50);
    if (c.dims == dims_preset("v4")) {
      c.sparse.window = draw_len(r, space_.window.lo, space_.window.hi, 64);
      const int ratio = r.pick(space_.compress);
      if (ratio > 0) {
        c.sparse.compress = ratio;
        c.sparse.extra_topk = draw_len(r, 1, ratio >= 128 ? 64 : 512, 64);
      }
    } else {
      c.sparse.topk = draw_len(r, space_.topk.lo, space_.topk.hi, 64);
    }
  }
  return c;
}

// From a stream of its own (the case's index and attempt), so every other
// dimension is drawn exactly as before layouts existed; only layouts the
// backend takes for the op (and the case can have) are drawn, so a layout
// never turns a drawn case away.
void CaseDrawer::draw_layout(std::uint64_t index, int attempt, const Backend& b, Op op, CaseSpec& c) const {
  DrawRng r(seed_ ^ 0x4c61796f75747321ull, index * 1024 + static_cast<std::uint64_t>(attempt));
  std::vector<LayoutSpec> options = space_.layouts;
  if (options.empty()) {
    if (r.percent(50)) return;
    options = {layout_values().begin() + 1, layout_values().end()};
  }
  std::vector<LayoutSpec> ok;
  const Capabilities caps = b.capabilities();  // once: a plugin's or Python backend's call is not free
  const int bs = c.block_size ? c.block_size : (caps.block_sizes.empty() ? 16 : caps.block_sizes.front());
  for (const LayoutSpec& l : options) {
    CaseSpec t = c;
    t.layout = l;
    try {
      t.validate();
    } catch (const std::exception&) {
      continue;
    }
    // A shared layout that shares no whole block at the case's block size is the contiguous case again.
    if (l.shared && shared_prefix_tokens(t) < bs) continue;
    if (b.supports(t, op).ok) ok.push_back(l);
  }
  if (ok.empty()) return;
  // Shared pages are the part the fewest cases can take (two requests with a
  // whole block of common context): where one can, half its draws share.
  const auto shared = std::find_if(ok.begin(), ok.end(), [](const LayoutSpec& l) { return l.shared; });
  if (space_.layouts.empty() && shared != ok.end() && r.percent(50)) {
    c.layout = *shared;
    return;
  }
  c.layout = r.pick(ok);
}

std::optional<DrawnCase> CaseDrawer::draw(std::uint64_t index) const {
  DrawRng r(seed_, index);
  const Backend& target = *backends_[index % backends_.size()];
  const std::vector<Op> ops = ops_of(target);
  if (ops.empty()) return std::nullopt;
  for (int attempt = 0; attempt < 400; ++attempt) {
    const Op op = r.pick(ops);
    CaseSpec c = draw_spec(r, target, op);
    c.batch.name = "x" + std::to_string(index);
    try {
      c.validate();
    } catch (const std::exception&) {
      continue;
    }
    // Too big: fewer requests, then fewer heads, then shorter queries, before
    // drawing again, so that long contexts (request 0 holds the longest) are
    // not drawn away.
    const double max_work = space_.max_work > 0 ? space_.max_work : limits_.max_work;
    auto longest_q = [&c] { return *std::max_element(c.batch.query_lens.begin(), c.batch.query_lens.end()); };
    while ((reference_work(c, op) > max_work || c.num_kv_tokens() > space_.max_keys) &&
           (c.num_requests() > space_.requests.lo || c.total_heads > space_.heads.lo ||
            longest_q() > std::max(1, space_.query_len.lo))) {
      if (c.num_requests() > space_.requests.lo) {
        c.batch.seq_lens.pop_back();
        c.batch.query_lens.pop_back();
      } else if (c.total_heads > space_.heads.lo) {
        c.total_heads = std::max(space_.heads.lo, c.total_heads / 2);
      } else {
        for (int& q : c.batch.query_lens) q = std::max(std::max(1, space_.query_len.lo), q / 2);  // seq_lens stay
      }
    }
    if (c.num_kv_tokens() > space_.max_keys) continue;
    try {
      c.validate();  // fewer requests may leave a shared layout nothing to share
    } catch (const std::exception&) {
      continue;
    }
    if (reference_work(c, op) > max_work) continue;
    if (limits_.max_bytes && estimate_case_bytes(c, op == Op::kPrefill) > limits_.max_bytes) continue;
    if (!target.supports(c, op).ok) continue;
    draw_layout(index, attempt, target, op, c);
    return DrawnCase{std::move(c), op, std::string(target.name())};
  }
  return std::nullopt;
}

}  // namespace mlagate
