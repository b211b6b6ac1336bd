// Draws a case's inputs from the counter-based generator. Values depend only on
// (seed, tensor name, element index), so the loop order and thread count are free.
#include "cases/case.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <list>
#include <mutex>
#include <set>
#include <string>

#include "cases/encoding.h"
#include "cases/errors.h"
#include "cases/fp8.h"
#include "cases/generator.h"
#include "cases/input_store.h"
#include "cases/merge.h"
#include "cases/sparse.h"

namespace mlagate {

void fill_normal(Tensor& t, std::uint64_t seed, const char* name, double factor) {
  const std::uint64_t st = gen::stream(seed, gen::tensor_key(name));
  const std::int64_t n = t.numel();
  // Model dtypes are 16-bit: round through our own RNE conversion (inline
  // and branch-free, so each chunk's rounding is a vector loop).
  const bool bf16 = t.dtype() == DType::kBF16;
  std::uint16_t* out = t.data<std::uint16_t>();
  // Chunks of normals_at (the same values as normal_at, several at a time).
  constexpr std::int64_t kChunk = 2048;
#pragma omp parallel
  {
    double v[kChunk];
#pragma omp for schedule(static)
    for (std::int64_t c = 0; c < n; c += kChunk) {
      const std::int64_t m = std::min(kChunk, n - c);
      gen::normals_at(st, static_cast<std::uint64_t>(c), m, v);
      std::uint16_t* o = out + c;
      if (bf16) {
        for (std::int64_t i = 0; i < m; ++i) o[i] = f32_to_bf16(static_cast<float>(v[i] * factor));
      } else {
        for (std::int64_t i = 0; i < m; ++i) o[i] = f32_to_f16(static_cast<float>(v[i] * factor));
      }
    }
  }
}

namespace {

// A tensor's values depend on the seed, its name, dtype and shape alone, so a
// suite's cases draw the same ones again and again: the weights at each TP
// degree for every batch spec, a batch spec's latent cache rows at every TP
// degree. The most recent are kept (on 2 cores a TP 1 case's weights take
// 0.5 s to draw, large_decode's cache rows 0.6 s), and workers side by side
// share what they draw through the run's input store.
std::atomic<bool> g_keep_drawn{true};

// Workers side by side draw each only once between them (input_store.h):
// one case's jobs may be spread over several, kept or not.
void fill_shared(Tensor& t, std::uint64_t seed, const char* name, double factor) {
  InputClaim claim(normal_tensor_key(seed, name, factor, t.dtype(), t.shape()), t);
  if (!claim.loaded()) {
    fill_normal(t, seed, name, factor);
    claim.publish(t);
  }
}

void fill_kept(Tensor& t, std::uint64_t seed, const char* name, double factor) {
  if (!g_keep_drawn.load(std::memory_order_relaxed)) return fill_shared(t, seed, name, factor);
  struct Entry {
    std::uint64_t seed;
    std::string name;
    double factor;
    Tensor value;
  };
  static std::mutex mutex;
  static std::list<Entry> kept;  // most recent first
  constexpr std::size_t kMaxBytes = std::size_t{512} << 20;
  {
    const std::lock_guard lock(mutex);
    for (auto it = kept.begin(); it != kept.end(); ++it)
      if (it->seed == seed && it->name == name && it->factor == factor && it->value.dtype() == t.dtype() &&
          it->value.shape() == t.shape()) {
        std::memcpy(t.bytes(), it->value.bytes(), t.nbytes());
        kept.splice(kept.begin(), kept, it);
        return;
      }
  }
  fill_shared(t, seed, name, factor);
  const std::lock_guard lock(mutex);
  kept.push_front(Entry{seed, name, factor, t});
  std::size_t bytes = 0;
  for (auto it = kept.begin(); it != kept.end();) {
    bytes += it->value.nbytes();
    it = bytes > kMaxBytes ? kept.erase(it) : std::next(it);
  }
}

}  // namespace

void set_keep_drawn_inputs(bool keep) { g_keep_drawn.store(keep, std::memory_order_relaxed); }

bool seeds_repeat(std::span<const CaseSpec> cases) {
  std::set<std::uint64_t> seeds;
  for (const CaseSpec& c : cases)
    if (!seeds.insert(c.seed).second) return true;
  return false;
}

void fill_cache_values(Case& c) {
  if (!is_fp8(c.spec.kv_cache_dtype)) {
    c.kv_c_cache = Tensor();
    c.k_pe_cache = Tensor();
    c.cache_values_exact_memo = true;
    return;
  }
  const Dims& d = c.spec.dims;
  const EntryFormat f = make_entry_format(c.spec.kv_format(), c.spec.dtype, d.kv_lora_rank, d.rope_dim, c.spec.k_scale);
  // The triage what-if: the same bytes read back with the scale a kernel
  // rounds to the model dtype (CaseSpec::reference_k_scale_rounded).
  EntryFormat read_f = f;
  if (c.spec.reference_k_scale_rounded) read_f.k_scale = round_to_16bit(c.spec.k_scale, c.spec.dtype == DType::kBF16);
  const std::int64_t S = c.num_kv_tokens, L = d.kv_lora_rank, R = d.rope_dim;
  c.kv_c_cache = Tensor(DType::kF32, {S, L});
  c.k_pe_cache = Tensor(DType::kF32, {S, R});
  const std::uint16_t* kv = c.kv_c.data<std::uint16_t>();
  const std::uint16_t* pe = c.k_pe.data<std::uint16_t>();
  float* kv_out = c.kv_c_cache.data<float>();
  float* pe_out = c.k_pe_cache.data<float>();
  const bool bf16 = c.spec.dtype == DType::kBF16;
  const auto exact = [bf16](const float* p, std::int64_t n) {
    bool ok = true;
    for (std::int64_t k = 0; k < n; ++k)
      ok = ok && round_to_16bit(p[k], bf16) == p[k];
    return ok;
  };
  bool all_exact = true;
#pragma omp parallel reduction(&& : all_exact)
  {
    std::vector<std::byte> entry(static_cast<std::size_t>(f.bytes));
#pragma omp for schedule(static)
    for (std::int64_t j = 0; j < S; ++j) {
      encode_entry(f, kv + j * L, pe + j * R, entry.data());
      decode_entry(read_f, entry.data(), kv_out + j * L, pe_out + j * R);
      if (all_exact) all_exact = exact(kv_out + j * L, L) && exact(pe_out + j * R, R);
    }
  }
  c.cache_values_exact_memo = all_exact;
}

std::string inputs_key(const CaseSpec& spec) {
  CaseSpec k = spec;
  k.suite.clear();
  k.kv_cache_dtype = KvCacheDtype::kAuto;
  k.scale_rule = ScaleRule::kPow2;
  k.k_scale = 1.0f;
  k.reference_k_scale_rounded = false;
  k.block_size = 0;
  return k.id();
}

std::string shape_key(const CaseSpec& spec) {
  CaseSpec k = spec;
  k.seed = 0;
  return inputs_key(k);
}

std::string cache_values_key(const CaseSpec& spec) {
  std::string k = inputs_key(spec) + "|";
  switch (spec.kv_cache_dtype) {
    case KvCacheDtype::kAuto: return k + "auto";
    case KvCacheDtype::kFp8:
    case KvCacheDtype::kFp8E4m3: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%a", static_cast<double>(spec.k_scale));
      return k + "e4m3/k_scale=" + buf + (spec.reference_k_scale_rounded ? "/read_rounded" : "");
    }
    case KvCacheDtype::kFp8DsMla:
    case KvCacheDtype::kFp8V4: return k + kv_cache_format_name(spec.kv_format());
  }
  return k;
}

void retarget_case(Case& c, const CaseSpec& spec) {
  if (inputs_key(spec) != inputs_key(c.spec))
    throw std::logic_error("retarget_case: " + spec.id() + " does not share the inputs of " + c.spec.id());
  spec.validate();
  c.spec = spec;
  if (!c.keys_only) fill_cache_values(c);
  if (c.sparse) c.sparse = retarget_sparse(*c.sparse, spec);
}

Case case_layout(const CaseSpec& spec) {
  Case c;
  c.spec = spec;
  c.num_requests = spec.num_requests();
  c.num_tokens = spec.num_tokens();
  c.num_kv_tokens = spec.num_kv_tokens();
  c.query_start_loc.assign(1, 0);
  c.kv_start_loc.assign(1, 0);
  for (int i = 0; i < c.num_requests; ++i) {
    const int s = spec.batch.seq_lens[static_cast<std::size_t>(i)];
    const int q = spec.batch.query_lens[static_cast<std::size_t>(i)];
    c.seq_lens.push_back(s);
    c.query_lens.push_back(q);
    c.context_lens.push_back(s - q);  // -q for padding requests (seq_len 0): nothing visible
    c.query_start_loc.push_back(c.query_start_loc.back() + q);
    c.kv_start_loc.push_back(c.kv_start_loc.back() + s);
  }
  return c;
}

int shared_prefix_tokens(const CaseSpec& spec) {
  if (!spec.layout.shared) return 0;
  // The prefix P that shares the most tokens: (requests with context >= P,
  // less the one that owns it) x P, over P = each request's context; the
  // longer on a tie. A batch of similar contexts shares its shortest; one
  // request of a few tokens does not stop two long ones from sharing.
  std::vector<int> ctx;
  for (std::size_t i = 0; i < spec.batch.seq_lens.size(); ++i)
    if (spec.batch.seq_lens[i] - spec.batch.query_lens[i] > 0) ctx.push_back(spec.batch.seq_lens[i] - spec.batch.query_lens[i]);
  std::sort(ctx.begin(), ctx.end(), std::greater<>());
  int best = 0;
  std::int64_t most = 0;
  for (std::size_t k = 1; k < ctx.size(); ++k) {  // ctx[k]: k + 1 requests have at least it
    const std::int64_t shared = static_cast<std::int64_t>(k) * ctx[k];
    if (shared > most) most = shared, best = ctx[k];
  }
  return best;
}

namespace {

// Layout shared: the common prefix's rows of every request with context are
// the first such request's (a prefix cache hit holds the same tokens).
void share_prefix_rows(Case& c) {
  const int p = shared_prefix_tokens(c.spec);
  if (p == 0) return;
  const std::int64_t L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim;
  int owner = -1;
  for (int i = 0; i < c.num_requests; ++i) {
    if (c.context_lens[static_cast<std::size_t>(i)] < p) continue;  // too short a context to hold the prefix
    if (owner < 0) {
      owner = i;
      continue;
    }
    const std::int64_t from = c.kv_start_loc[static_cast<std::size_t>(owner)], to = c.kv_start_loc[static_cast<std::size_t>(i)];
    std::memcpy(c.kv_c.bytes() + to * L * 2, c.kv_c.bytes() + from * L * 2, static_cast<std::size_t>(p * L * 2));
    std::memcpy(c.k_pe.bytes() + to * R * 2, c.k_pe.bytes() + from * R * 2, static_cast<std::size_t>(p * R * 2));
  }
}

}  // namespace

Case generate_case(const CaseSpec& spec, bool keys_only) {
  spec.validate();
  Case c = case_layout(spec);
  if (spec.merge.active()) {
    c.merge = generate_merge(spec);
    return c;
  }
  const Dims& d = spec.dims;
  const std::int64_t N = spec.num_heads();
  // Drawn below, every element: no zero-filling pass first. Each tensor's
  // values depend on (seed, name) alone, so leaving some out changes none of
  // the others.
  c.kv_c = Tensor::for_overwrite(spec.dtype, {c.num_kv_tokens, d.kv_lora_rank});
  c.k_pe = Tensor::for_overwrite(spec.dtype, {c.num_kv_tokens, d.rope_dim});
  fill_kept(c.kv_c, spec.seed, "kv_c", 1.0);
  fill_kept(c.k_pe, spec.seed, "k_pe", 1.0);
  if (!keys_only) {
    c.q = Tensor::for_overwrite(spec.dtype, {c.num_tokens, N, d.nope_dim + d.rope_dim});
    c.w_uk = Tensor::for_overwrite(spec.dtype, {d.kv_lora_rank, N, d.nope_dim});
    c.w_uv = Tensor::for_overwrite(spec.dtype, {d.kv_lora_rank, N, d.v_head_dim});
    // Weights scaled by 1/sqrt(L): unit-scale outputs, and LSE merging stays finite.
    const double w = 1.0 / std::sqrt(static_cast<double>(d.kv_lora_rank));
    fill_normal(c.q, spec.seed, "q", spec.q_magnitude);
    fill_kept(c.w_uk, spec.seed, "w_uk", w);
    fill_kept(c.w_uv, spec.seed, "w_uv", w);
  }
  share_prefix_rows(c);
  c.keys_only = keys_only;
  if (!keys_only) fill_cache_values(c);
  if (spec.sparse.active()) c.sparse = generate_sparse(c);
  return c;
}

}  // namespace mlagate
