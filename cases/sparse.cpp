// Draws the sparse ops' inputs (index sets, sink, V4's compressed cache) from
// the case's counter-based generator and maps them onto paged caches.
#include "cases/sparse.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cases/encoding.h"
#include "cases/errors.h"
#include "cases/generator.h"

namespace mlagate {

namespace {

// k distinct values of [0, n) in random order (partial Fisher-Yates keyed by
// (seed, tensor, token)); the pool is the caller's scratch.
void pick_distinct(int n, int k, std::uint64_t seed, std::uint64_t tensor, int token, std::vector<int>& pool,
                   std::vector<int>& out) {
  pool.resize(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) pool[static_cast<std::size_t>(i)] = i;
  out.clear();
  for (int i = 0; i < k; ++i) {
    const auto j = i + static_cast<int>(gen::below(static_cast<std::uint64_t>(n - i), seed, tensor,
                                                   static_cast<std::uint64_t>(token) * 65537u + static_cast<std::uint64_t>(i)));
    std::swap(pool[static_cast<std::size_t>(i)], pool[static_cast<std::size_t>(j)]);
    out.push_back(pool[static_cast<std::size_t>(i)]);
  }
}

// A row of width K holding `valid` (in the given order) and kIndexInvalid
// elsewhere, the invalid slots scattered by a seeded shuffle so kernels that
// stop at the first -1 are caught.
void scatter_row(const std::vector<int>& valid, int K, std::uint64_t seed, std::uint64_t tensor, int token,
                 std::int32_t* row) {
  std::fill(row, row + K, kIndexInvalid);
  for (std::size_t i = 0; i < valid.size(); ++i) row[i] = valid[i];
  for (int i = K - 1; i > 0; --i) {
    const auto j = static_cast<int>(gen::below(static_cast<std::uint64_t>(i) + 1, seed, tensor,
                                               (static_cast<std::uint64_t>(token) << 20) + static_cast<std::uint64_t>(i)));
    std::swap(row[i], row[j]);
  }
}

// The oob pattern: each unused (-1) slot of a row becomes a past-the-end code
// of one of four kinds, drawn per slot, so that a kernel sees every form of
// ">= s_kv": exactly s_kv (a wrap-around reads slot 0), s_kv + 1..64 (a
// wrap-around reads the null block), INT32_MAX (a sign or overflow bug) and
// large values between.
void past_end_row(std::int32_t* row, int K, std::uint64_t seed, int token) {
  static const std::uint64_t kind = gen::tensor_key("topk_past_end_kind"), near = gen::tensor_key("topk_past_end_near"),
                             far = gen::tensor_key("topk_past_end_far");
  for (int k = 0; k < K; ++k) {
    if (row[k] != kIndexInvalid) continue;
    const std::uint64_t at = (static_cast<std::uint64_t>(token) << 20) + static_cast<std::uint64_t>(k);
    switch (gen::below(4, seed, kind, at)) {
      case 0: row[k] = kIndexPastEnd; break;
      case 1: row[k] = kIndexPastEnd - 1 - static_cast<std::int32_t>(gen::below(kPastEndNear, seed, near, at)); break;
      case 2: row[k] = kIndexFar; break;
      default: row[k] = kIndexFar + static_cast<std::int32_t>(gen::below(kPastEndFar, seed, far, at)); break;
    }
  }
}

// The lens_garbage pattern: each slot past a row's length gets one of three
// kinds of garbage, drawn per slot, never -1 (flashinfer #5095: a kernel that
// needs -1 there past 64 query tokens): a real key of the request (a kernel
// that reads it is wrong but finite), a poisoned null-block slot (NaN) or an
// index past the pool (a read out of bounds).
void garbage_tail(std::int32_t* row, int K, int n, int visible, std::uint64_t seed, int token) {
  static const std::uint64_t kind = gen::tensor_key("topk_garbage_kind"), key = gen::tensor_key("topk_garbage_key"),
                             far = gen::tensor_key("topk_garbage_far");
  for (int k = n; k < K; ++k) {
    const std::uint64_t at = (static_cast<std::uint64_t>(token) << 20) + static_cast<std::uint64_t>(k);
    switch (gen::below(3, seed, kind, at)) {
      case 0:
        row[k] = visible > 0 ? static_cast<std::int32_t>(gen::below(static_cast<std::uint64_t>(visible), seed, key, at))
                             : kIndexPoisoned;
        break;
      case 1: row[k] = kIndexPoisoned; break;
      default: row[k] = kIndexFar + static_cast<std::int32_t>(gen::below(kPastEndFar, seed, far, at)); break;
    }
  }
}

// V4's compressed cache: entry j of request i summarizes tokens
// j*ratio .. (j+1)*ratio - 1; the compressor is not under test, so its
// entries are drawn like any key.
Case make_compressed(const Case& c) {
  Case k = compressed_layout(c);
  const CaseSpec& spec = k.spec;
  k.kv_c = Tensor::for_overwrite(spec.dtype, {k.num_kv_tokens, spec.dims.kv_lora_rank});  // drawn below, every element
  k.k_pe = Tensor::for_overwrite(spec.dtype, {k.num_kv_tokens, spec.dims.rope_dim});
  fill_normal(k.kv_c, c.spec.seed, "kv_c_compressed");
  fill_normal(k.k_pe, c.spec.seed, "k_pe_compressed");
  fill_cache_values(k);
  return k;
}

}  // namespace

Case compressed_layout(const Case& c) {
  const SparseSpec& sp = c.spec.sparse;
  if (sp.compress < 2) throw std::logic_error("compressed_layout: the case has no compressed cache");
  CaseSpec spec = c.spec;
  spec.sparse = SparseSpec{};
  spec.seed = c.spec.seed ^ 0x5bd1e995u;  // its own block permutation
  for (std::size_t i = 0; i < spec.batch.seq_lens.size(); ++i) {
    spec.batch.seq_lens[i] = spec.batch.seq_lens[i] / sp.compress;
    spec.batch.query_lens[i] = 0;
  }
  return case_layout(spec);
}

std::vector<int> token_requests(const Case& c) {
  std::vector<int> req(static_cast<std::size_t>(c.num_tokens));
  for (int i = 0; i < c.num_requests; ++i)
    for (int t = c.query_start_loc[static_cast<std::size_t>(i)]; t < c.query_start_loc[static_cast<std::size_t>(i) + 1]; ++t)
      req[static_cast<std::size_t>(t)] = i;
  return req;
}

int token_position(const Case& c, int request, int t) {
  const auto i = static_cast<std::size_t>(request);
  if (c.seq_lens[i] == 0) return -1;  // padding: sees nothing
  return c.context_lens[i] + (t - c.query_start_loc[i]);
}

std::shared_ptr<const SparseInputs> generate_sparse(const Case& c) {
  const SparseSpec& sp = c.spec.sparse;
  if (!sp.active()) throw std::logic_error("generate_sparse: not a sparse case");
  if (sp.pattern == IndexPattern::kOutOfRange && sp.topk == 0)
    throw InvalidCase(c.spec.batch.name + ": index pattern oob fills the unused slots of top-k rows; a V4 case has none");
  auto s = std::make_shared<SparseInputs>();
  const std::uint64_t seed = c.spec.seed;
  const std::vector<int> req = token_requests(c);
  const int T = c.num_tokens;
  std::vector<int> pool, pick;

  if (sp.topk > 0) {
    IndexSet& m = s->main;
    m.width = sp.topk;
    m.pos.assign(static_cast<std::size_t>(T) * sp.topk, kIndexInvalid);
    if (has_topk_length(sp.pattern)) m.length.assign(static_cast<std::size_t>(T), 0);
    const std::uint64_t key = gen::tensor_key("topk_indices");
    for (int t = 0; t < T; ++t) {
      std::int32_t* row = m.pos.data() + static_cast<std::size_t>(t) * sp.topk;
      const int p = token_position(c, req[static_cast<std::size_t>(t)], t);
      const int visible = p + 1;  // the indexer picks among the causal keys
      const bool empty_row = sp.pattern == IndexPattern::kInvalidRows && t % 3 == 1;
      const int n = empty_row ? 0 : std::min(sp.topk, std::max(visible, 0));
      pick_distinct(std::max(visible, 0), n, seed, key, t, pool, pick);
      if (sp.pattern == IndexPattern::kDuplicates)
        for (int k = 3; k < n; k += 4) pick[static_cast<std::size_t>(k)] = pick[static_cast<std::size_t>(k - 3)];
      if (has_topk_length(sp.pattern)) {
        // Valid ones first, then slots that must never be read.
        std::fill(row, row + sp.topk, kIndexPoisoned);
        std::copy(pick.begin(), pick.end(), row);
        m.length[static_cast<std::size_t>(t)] = n;
        if (sp.pattern == IndexPattern::kLengthsGarbage) garbage_tail(row, sp.topk, n, std::max(visible, 0), seed, t);
      } else {
        scatter_row(pick, sp.topk, seed, key ^ 1u, t, row);
        if (sp.pattern == IndexPattern::kOutOfRange) past_end_row(row, sp.topk, seed, t);
      }
    }
  }

  if (sp.compress > 0) {
    s->compressed = make_compressed(c);
    IndexSet& e = s->extra;
    e.width = sp.extra_topk;
    e.pos.assign(static_cast<std::size_t>(T) * sp.extra_topk, kIndexInvalid);
    e.length.assign(static_cast<std::size_t>(T), 0);
    const std::uint64_t key = gen::tensor_key("compressed_indices");
    for (int t = 0; t < T; ++t) {
      std::int32_t* row = e.pos.data() + static_cast<std::size_t>(t) * sp.extra_topk;
      const int i = req[static_cast<std::size_t>(t)];
      const int p = token_position(c, i, t);
      const int visible = p < 0 ? 0 : (p + 1) / sp.compress;  // complete compressed entries
      const int n = std::min(sp.extra_topk, visible);
      pick_distinct(visible, n, seed, key, t, pool, pick);
      std::copy(pick.begin(), pick.end(), row);
      e.length[static_cast<std::size_t>(t)] = n;
      // Past the length: the request's other compressed entries (a kernel that
      // ignores the length reads real keys and is wrong), then -1.
      const int stored = s->compressed.seq_lens[static_cast<std::size_t>(i)];
      int k = n;
      for (int j = 0; j < stored && k < sp.extra_topk; ++j)
        if (std::find(pick.begin(), pick.end(), j) == pick.end()) row[k++] = j;
    }
  }

  if (sp.sink) {
    // Sinks near the rows' lse, so that dropping or misplacing one moves the
    // output by a visible fraction (exp(sink - lse) of order 1).
    const int K = sp.topk > 0 ? sp.topk : sp.window + sp.extra_topk;
    const double centre = std::log(static_cast<double>(std::max(K, 2)));
    const std::uint64_t st = gen::stream(seed, gen::tensor_key("attn_sink"));
    s->sink.resize(static_cast<std::size_t>(c.spec.num_heads()));
    for (std::size_t h = 0; h < s->sink.size(); ++h)
      s->sink[h] = static_cast<float>(centre + 1.5 * gen::normal_at(st, h));
  }
  return s;
}

std::shared_ptr<const SparseInputs> retarget_sparse(const SparseInputs& s, const CaseSpec& spec) {
  auto out = std::make_shared<SparseInputs>(s);
  if (spec.sparse.compress > 0) {
    out->compressed.spec.kv_cache_dtype = spec.kv_cache_dtype;
    out->compressed.spec.scale_rule = spec.scale_rule;
    out->compressed.spec.k_scale = spec.k_scale;
    out->compressed.spec.block_size = spec.block_size;
    fill_cache_values(out->compressed);
  }
  return out;
}

void main_positions(const Case& c, int t, std::vector<int>& out) {
  out.clear();
  const SparseSpec& sp = c.spec.sparse;
  int i = 0;
  while (c.query_start_loc[static_cast<std::size_t>(i) + 1] <= t) ++i;
  const int p = token_position(c, i, t);
  if (sp.window > 0) {
    for (int q = std::max(0, p - sp.window + 1); q <= p; ++q) out.push_back(q);
    return;
  }
  const IndexSet& m = c.sparse->main;
  const std::int32_t* row = m.pos.data() + static_cast<std::size_t>(t) * m.width;
  for (int k = 0; k < m.count(t); ++k)
    if (row[k] >= 0) out.push_back(row[k]);
}

void extra_positions(const Case& c, int t, std::vector<int>& out) {
  out.clear();
  if (!c.sparse || c.sparse->extra.empty()) return;
  const IndexSet& e = c.sparse->extra;
  const std::int32_t* row = e.pos.data() + static_cast<std::size_t>(t) * e.width;
  for (int k = 0; k < e.count(t); ++k)
    if (row[k] >= 0) out.push_back(row[k]);
}

std::int32_t past_end_index(std::int32_t code, std::int64_t s_kv) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  if (!is_past_end(code)) throw std::logic_error("past_end_index: " + std::to_string(code) + " is no past-the-end code");
  if (s_kv < 0 || s_kv > kMax)
    throw std::logic_error("past_end_index: a buffer of " + std::to_string(s_kv) + " keys has no int32 index past its end");
  if (code <= kIndexPastEnd) return static_cast<std::int32_t>(std::min(s_kv + (kIndexPastEnd - code), kMax));
  return static_cast<std::int32_t>(std::max(kMax - (static_cast<std::int64_t>(code) - kIndexFar), s_kv));
}

Tensor global_slots(const Case& owner, const IndexSet& set, const PagedCache& cache, std::optional<std::int64_t> s_kv) {
  const int T = owner.num_tokens;
  Tensor out(DType::kI32, {T, set.width});
  std::int32_t* o = out.data<std::int32_t>();
  const std::vector<int> req = token_requests(owner);
  const std::int64_t capacity = static_cast<std::int64_t>(cache.num_blocks) * cache.block_size;
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < set.width; ++k) {
      const std::int32_t p = set.pos[static_cast<std::size_t>(t) * set.width + k];
      std::int64_t slot = -1;
      if (p == kIndexPoisoned)
        slot = k % std::max(1, cache.block_size);  // the null block: never assigned, poisoned
      else if (is_past_end(p) && k >= set.count(t))
        slot = past_end_index(p, s_kv ? *s_kv : capacity);  // garbage past the length (lens_garbage): past the pool
      else if (is_past_end(p))
        slot = s_kv ? past_end_index(p, *s_kv) : -1;
      else if (p >= 0)
        slot = cache.slot_of(req[static_cast<std::size_t>(t)], p);
      o[static_cast<std::size_t>(t) * set.width + k] = static_cast<std::int32_t>(slot);
    }
  return out;
}

void window_slots(const Case& c, int window, const PagedCache& cache, Tensor& slots, std::vector<std::int32_t>& lens) {
  const int T = c.num_tokens;
  slots = Tensor(DType::kI32, {T, window});
  lens.assign(static_cast<std::size_t>(T), 0);
  std::int32_t* o = slots.data<std::int32_t>();
  std::fill(o, o + static_cast<std::int64_t>(T) * window, -1);
  const std::vector<int> req = token_requests(c);
  for (int t = 0; t < T; ++t) {
    const int i = req[static_cast<std::size_t>(t)];
    const int p = token_position(c, i, t);
    int k = 0;
    for (int q = std::max(0, p - window + 1); q <= p; ++q)
      o[static_cast<std::size_t>(t) * window + k++] = static_cast<std::int32_t>(cache.slot_of(i, q));
    lens[static_cast<std::size_t>(t)] = k;
  }
}

std::string check_slots(const TensorView& slots, const PagedCache& cache, const std::string& what,
                        bool past_end_is_invalid) {
  if (slots.dtype != DType::kI32) return what + ": dtype " + std::string(dtype_name(slots.dtype)) + ", expected int32";
  const std::int64_t capacity = static_cast<std::int64_t>(cache.num_blocks) * cache.block_size;
  const auto* p = slots.as<std::int32_t>();
  for (std::int64_t k = 0; k < slots.numel(); ++k)
    if (p[k] != -1 && (p[k] < 0 || (p[k] >= capacity && !past_end_is_invalid)))
      return what + ": slot " + std::to_string(p[k]) + " at element " + std::to_string(k) + " is neither -1 nor in [0, " +
             std::to_string(capacity) + ")" + (past_end_is_invalid ? " nor at or past its end" : "");
  return {};
}

}  // namespace mlagate
