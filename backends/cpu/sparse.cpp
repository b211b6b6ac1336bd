// "cpu.sparse": DeepSeek V3.2 / V4 sparse attention on the host with a GPU
// kernel's precision, written the way FlashMLA's sparse kernels work: per
// token, the named keys in tiles of 64, each dequantized by this file's own
// readers and rounded to the model dtype (the bf16 tensor-core operand), fp32
// logits, an online softmax with a running max, probabilities rounded to the
// model dtype before P@V, fp32 accumulation, the sink added to the final
// denominator. Rows with no key return o = 0 and lse = +inf (FlashMLA's
// convention). Planted faults (tests only) reproduce the sparse bug classes.
#include <Eigen/Core>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/cpu_backends.h"
#include "backends/cpu/sparse_faults.h"
#include "cases/encoding.h"
#include "cases/errors.h"
#include "cases/fp8.h"

namespace mlagate {
namespace {

using Index = Eigen::Index;
using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
constexpr Index kTile = 64;  // keys per step of the online softmax (FlashMLA's block of top-k)

float to_model(float x, DType dt) { return round_to_16bit(x, dt == DType::kBF16); }
float from16(std::uint16_t b, DType dt) { return dt == DType::kBF16 ? bf16_to_f32(b) : f16_to_f32(b); }

// One cache entry as D floats, by this backend's own reading of the layouts
// in cases/fp8.h (the reference reader is not used, so a layout mistake on
// either side shows up as a difference).
void read_entry(const PagedCache& c, std::int64_t slot, float* dst, const SparseFaults& f) {
  const int L = c.kv_lora_rank, R = c.rope_dim;
  std::byte buf[4096];  // the largest entry: L + R 16-bit values (auto)
  if (c.entry_bytes > static_cast<int>(sizeof buf)) throw std::invalid_argument("cpu.sparse: cache entry too large");
  c.load_entry(slot, buf);
  const auto* u8 = reinterpret_cast<const std::uint8_t*>(buf);
  auto bf16_at = [&](int offset) {
    std::uint16_t b;
    std::memcpy(&b, buf + offset, 2);
    return b;
  };
  switch (c.kv_dtype) {
    case KvCacheDtype::kAuto:
      for (int i = 0; i < L + R; ++i) dst[i] = from16(bf16_at(2 * i), c.elem_dtype);
      return;
    case KvCacheDtype::kFp8:
    case KvCacheDtype::kFp8E4m3:
      for (int i = 0; i < L + R; ++i) dst[i] = e4m3_to_f32(u8[i]) * c.k_scale;
      return;
    case KvCacheDtype::kFp8DsMla:
      for (int t = 0; t < L / 128; ++t) {
        std::uint32_t bits;
        std::memcpy(&bits, buf + L + 4 * t, 4);
        if (f.reader_pow2_scales) bits &= 0xFF800000u;  // planted: a reader for power-of-two scales only
        float s = std::bit_cast<float>(bits);
        if (f.raw_scales_as_bf16) s = bf16_to_f32(f32_to_bf16(s));  // planted: the scale rounded to bf16
        for (int i = t * 128; i < (t + 1) * 128; ++i) dst[i] = e4m3_to_f32(u8[i]) * s;
      }
      for (int i = 0; i < R; ++i) dst[L + i] = bf16_to_f32(bf16_at(L + 4 * (L / 128) + 2 * i));
      return;
    case KvCacheDtype::kFp8V4:
      for (int t = 0; t < L / 64; ++t) {
        const float s = ue8m0_to_f32(u8[L + 2 * R + t]);
        for (int i = t * 64; i < (t + 1) * 64; ++i) dst[i] = e4m3_to_f32(u8[i]) * s;
      }
      for (int i = 0; i < R; ++i) dst[L + i] = bf16_to_f32(bf16_at(L + 2 * i));
      return;
  }
  throw NotSupportedError("cpu.sparse cannot read kv cache dtype " + std::string(kv_cache_dtype_name(c.kv_dtype)));
}

// Online softmax over keys [first, first + n) in tiles of 64: the running max
// m, the sum l of unrounded exponentials, the accumulator of rounded P @ V.
void online_softmax(const MatF& q, const MatF& keys, Index first, Index n, Index dv, float scale, DType dt, MatF& acc,
                    std::vector<float>& m, std::vector<float>& l) {
  const Index N = q.rows();
  acc = MatF::Zero(N, dv);
  m.assign(static_cast<std::size_t>(N), -std::numeric_limits<float>::infinity());
  l.assign(static_cast<std::size_t>(N), 0.f);
  MatF s, p;
  for (Index j0 = first; j0 < first + n; j0 += kTile) {
    const Index w = std::min(kTile, first + n - j0);
    s.noalias() = q * keys.middleRows(j0, w).transpose();
    p.resize(N, w);
    for (Index h = 0; h < N; ++h) {
      float mt = m[static_cast<std::size_t>(h)];
      for (Index j = 0; j < w; ++j) mt = std::max(mt, s(h, j) * scale);
      const float corr = std::exp(m[static_cast<std::size_t>(h)] - mt);
      float sum = 0;
      for (Index j = 0; j < w; ++j) {
        const float e = std::exp(s(h, j) * scale - mt);
        sum += e;
        p(h, j) = to_model(e, dt);
      }
      l[static_cast<std::size_t>(h)] = l[static_cast<std::size_t>(h)] * corr + sum;
      acc.row(h) *= corr;
      m[static_cast<std::size_t>(h)] = mt;
    }
    acc.noalias() += p * keys.block(j0, 0, w, dv);
  }
}

// The attention of one token over `keys` [n, D] (model-dtype values) for all
// heads; q [N, D]. Writes o [N, Dv] (model-dtype values) and lse [N].
// split > 0: the keys in chunks of `split`, each chunk's fp32 (o, lse) merged
// through their LSEs afterwards (split-KV decoding with a combine step).
void attend(const MatF& q, const MatF& keys, Index n, Index dv, float scale, std::span<const float> sink, DType dt,
            const SparseFaults& f, int split, float* o, float* lse) {
  const Index N = q.rows();
  if (n == 0) {
    std::fill(o, o + N * dv, 0.f);
    std::fill(lse, lse + N, std::numeric_limits<float>::infinity());
    return;
  }
  MatF acc;
  std::vector<float> m, l;
  if (split <= 0 || n <= split) {
    online_softmax(q, keys, 0, n, dv, scale, dt, acc, m, l);
    for (Index h = 0; h < N; ++h) {
      const auto hs = static_cast<std::size_t>(h);
      float denom = l[hs];
      const float lse_keys = m[hs] + std::log(l[hs]);
      if (!sink.empty() && !f.drops_sink) denom += std::exp(sink[hs] - m[hs]);
      lse[h] = f.sink_in_lse && !sink.empty() ? m[hs] + std::log(denom) : lse_keys;
      for (Index k = 0; k < dv; ++k) o[h * dv + k] = to_model(acc(h, k) / denom, dt);
    }
    return;
  }
  // Partials: o_i = acc_i / l_i (fp32), lse_i = m_i + log l_i; then the combine.
  const Index parts = (n + split - 1) / split;
  MatF po(parts * N, dv);
  std::vector<float> plse(static_cast<std::size_t>(parts * N));
  for (Index c = 0; c < parts; ++c) {
    online_softmax(q, keys, c * split, std::min<Index>(split, n - c * split), dv, scale, dt, acc, m, l);
    for (Index h = 0; h < N; ++h) {
      po.row(c * N + h) = acc.row(h) / l[static_cast<std::size_t>(h)];
      plse[static_cast<std::size_t>(c * N + h)] = m[static_cast<std::size_t>(h)] + std::log(l[static_cast<std::size_t>(h)]);
    }
  }
  for (Index h = 0; h < N; ++h) {
    float mx = -std::numeric_limits<float>::infinity();
    for (Index c = 0; c < parts; ++c) mx = std::max(mx, plse[static_cast<std::size_t>(c * N + h)]);
    float sum = 0;
    for (Index c = 0; c < parts; ++c) sum += std::exp(plse[static_cast<std::size_t>(c * N + h)] - mx);
    const float total = mx + std::log(sum);
    const auto hs = static_cast<std::size_t>(h);
    const float keep = sink.empty() || f.drops_sink ? 1.f : 1.f / (1.f + std::exp(sink[hs] - total));
    lse[h] = f.sink_in_lse && !sink.empty() ? total + std::log1p(std::exp(sink[hs] - total)) : total;
    for (Index k = 0; k < dv; ++k) {
      float v = 0;
      for (Index c = 0; c < parts; ++c) v += std::exp(plse[static_cast<std::size_t>(c * N + h)] - total) * po(c * N + h, k);
      o[h * dv + k] = to_model(v * keep, dt);
    }
  }
}

void store(const float* o, const float* lse, Index N, Index dv, const TensorView& out, const TensorView& lse_out,
           std::int64_t t) {
  auto* ob = out.as<std::uint16_t>() + t * N * dv;
  for (Index k = 0; k < N * dv; ++k)
    ob[k] = out.dtype == DType::kBF16 ? f32_to_bf16(o[k]) : f32_to_f16(o[k]);
  std::copy_n(lse, N, lse_out.as<float>() + t * N);
}

void load_q(const TensorView& q, std::int64_t t, MatF& out) {
  const Index N = q.shape[1], D = q.shape[2];
  out.resize(N, D);
  const auto* p = q.as<std::uint16_t>() + t * N * D;
  for (Index k = 0; k < N * D; ++k) out.data()[k] = from16(p[k], q.dtype);
}

class CpuSparse final : public Backend {
 public:
  CpuSparse(SparseFaults f, std::string name, int split = 0) : faults_(f), name_(std::move(name)), split_(split) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override {
    return split_ > 0 ? "CPU sparse attention, split-KV: fp32 partials of 256 keys merged through their LSEs, then the sink"
                      : "CPU sparse attention (DeepSeek V3.2 top-k, V4 window + compressed): GPU precision, online softmax in tiles of 64";
  }
  Capabilities capabilities() const override {
    Capabilities caps;
    caps.host_only = true;
    caps.ops = {Op::kSparseDecode, Op::kSparsePrefill, Op::kCacheWrite};
    caps.block_sizes = {64, 1, 2, 4, 8, 16, 32, 128, 256};
    caps.query_len_support = QueryLenSupport::kVarlen;
    caps.dtypes = {DType::kBF16, DType::kF16};
    caps.kv_dtypes = {KvCacheDtype::kAuto, KvCacheDtype::kFp8, KvCacheDtype::kFp8E4m3, KvCacheDtype::kFp8DsMla,
                      KvCacheDtype::kFp8V4};
    caps.max_pool_bytes = std::numeric_limits<std::int64_t>::max();  // slots and offsets in 64 bits
    caps.sparse_valid_prefix = faults_.declare_valid_prefix;
    if (faults_.declare_no_dcp) caps.no_dcp = "this test double refuses DCP";
    return caps;
  }

  // Its own writer for every format it reads (the cache_write op checks it
  // byte for byte against the reference writer).
  void cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                   std::span<const std::int64_t> slots) override {
    const int L = cache.kv_lora_rank, R = cache.rope_dim;
    const DType dt = cache.elem_dtype;
    if (kv_c.dtype != dt || k_pe.dtype != dt || kv_c.shape != Shape{static_cast<std::int64_t>(slots.size()), L} ||
        k_pe.shape != Shape{static_cast<std::int64_t>(slots.size()), R})
      throw std::invalid_argument("cpu.sparse cache_write: kv_c [n, L] and k_pe [n, R] in the cache's model dtype");
    const std::int64_t capacity = static_cast<std::int64_t>(cache.num_blocks) * cache.block_size;
    std::vector<std::uint8_t> e(static_cast<std::size_t>(cache.entry_bytes));
    for (std::size_t t = 0; t < slots.size(); ++t) {
      const std::int64_t slot = slots[t];
      if (slot < 0) continue;
      if (slot >= capacity) throw std::out_of_range("cpu.sparse cache_write: slot " + std::to_string(slot) + " out of range");
      const auto* x = kv_c.as<std::uint16_t>() + t * static_cast<std::size_t>(L);
      const auto* r = k_pe.as<std::uint16_t>() + t * static_cast<std::size_t>(R);
      std::fill(e.begin(), e.end(), 0);
      encode(cache, x, r, e.data());
      if (faults_.writer_contiguous_v4 && cache.split_pages()) {
        // planted: the 584 bytes written contiguously per token, as if entries were not split per page
        std::memcpy(cache.data.bytes() + slot * cache.entry_bytes, e.data(), e.size());
        continue;
      }
      cache.store_entry(slot, reinterpret_cast<const std::byte*>(e.data()));
    }
  }

  // --cuda-graph on the sparse op: the host emulation (persistent buffers).
  std::unique_ptr<SparseDecodeGraph> capture_sparse_decode(const SparseDecodeArgs& a) override {
    return emulate_sparse_decode_graph(*this, a);
  }

  void sparse_decode(const SparseDecodeArgs& a) override {
    check_sparse_decode_args(a);
    const Index T = a.q.shape[0], N = a.q.shape[1], D = a.q.shape[2], dv = a.o.shape[2];
    const DType dt = a.q.dtype;
    std::vector<std::int32_t> win, win_len;
    if (a.window > 0) {
      SparseDecodeArgs w = a;
      w.window = a.window + faults_.window_extra;  // planted: one key too many (window off by one)
      sparse_window_slots(w, win, win_len);
    }
    const Index W = a.window + faults_.window_extra;
#pragma omp parallel
    {
      MatF q, keys;
      std::vector<float> o(static_cast<std::size_t>(N * dv)), lse(static_cast<std::size_t>(N)), row(static_cast<std::size_t>(D));
      std::vector<std::pair<const PagedCache*, std::int64_t>> named;
#pragma omp for schedule(dynamic)
      for (Index t = 0; t < T; ++t) {
        named.clear();
        if (a.window > 0) {
          for (Index k = 0; k < win_len[static_cast<std::size_t>(t)]; ++k) named.emplace_back(a.cache, win[static_cast<std::size_t>(t * W + k)]);
        } else {
          collect(a.indices, a.topk_length, t, a.cache, named);
        }
        if (a.extra_cache) collect(a.extra_indices, a.extra_topk_length, t, a.extra_cache, named);
        keys.resize(static_cast<Index>(named.size()), D);
        for (std::size_t j = 0; j < named.size(); ++j) {
          read_entry(*named[j].first, named[j].second, row.data(), faults_);
          for (Index k = 0; k < D; ++k) keys(static_cast<Index>(j), k) = to_model(row[static_cast<std::size_t>(k)], dt);
        }
        load_q(a.q, t, q);
        attend(q, keys, keys.rows(), dv, static_cast<float>(a.scale), a.sink, dt, faults_, split_, o.data(), lse.data());
        store(o.data(), lse.data(), N, dv, a.o, a.lse, t);
      }
    }
  }

  void sparse_prefill(const SparsePrefillArgs& a) override {
    check_sparse_prefill_args(a);
    const Index T = a.q.shape[0], N = a.q.shape[1], D = a.q.shape[2], dv = a.o.shape[2], S = a.kv.shape[0];
    const Index K = a.indices.shape[1];
    const DType dt = a.q.dtype;
    const auto* kv = a.kv.as<std::uint16_t>();
    const auto* idx = a.indices.as<std::int32_t>();
#pragma omp parallel
    {
      MatF q, keys;
      std::vector<float> o(static_cast<std::size_t>(N * dv)), lse(static_cast<std::size_t>(N));
#pragma omp for schedule(dynamic)
      for (Index t = 0; t < T; ++t) {
        const bool by_sentinel = faults_.tail_needs_invalid && T > 64;  // planted
        const Index n = a.topk_length.empty() || faults_.ignores_topk_length || by_sentinel
                            ? K
                            : a.topk_length[static_cast<std::size_t>(t)];
        keys.resize(n, D);
        Index used = 0;
        for (Index k = 0; k < n; ++k) {
          std::int32_t r = idx[t * K + k];
          if (by_sentinel && r == -1) break;
          if (r < 0 && faults_.reads_invalid_index) r = 0;  // planted: -1 clamped to row 0
          if (r >= S && faults_.past_end_wraps) r = static_cast<std::int32_t>(r % S);  // planted: wrapped into the buffer
          if (r >= S && faults_.past_end_clamped) r = static_cast<std::int32_t>(S - 1);  // planted: clamped to the last row
          if (faults_.dedups_indices && r >= 0 && r < S &&  // planted: a row named twice counted once
              std::find(idx + t * K, idx + t * K + k, r) != idx + t * K + k)
            continue;
          // -1 and any index >= S_kv name no key (FlashMLA's sparse prefill).
          if (r < 0 || r >= S) continue;
          for (Index x = 0; x < D; ++x) keys(used, x) = from16(kv[r * D + x], dt);
          ++used;
        }
        load_q(a.q, t, q);
        attend(q, keys, used, dv, static_cast<float>(a.scale), a.sink, dt, faults_, split_, o.data(), lse.data());
        store(o.data(), lse.data(), N, dv, a.o, a.lse, t);
      }
    }
  }

 private:
  // One token's entry in the logical order of cases/fp8.h.
  void encode(const PagedCache& c, const std::uint16_t* x, const std::uint16_t* r, std::uint8_t* e) const {
    const int L = c.kv_lora_rank, R = c.rope_dim;
    const DType dt = c.elem_dtype;
    auto quant_tiles = [&](int tile, auto&& put_scale) {
      for (int t = 0; t < L / tile; ++t) {
        float amax = 0;
        for (int i = t * tile; i < (t + 1) * tile; ++i) amax = std::max(amax, std::fabs(from16(x[i], dt)));
        float s = amax / kE4m3Max;
        if (c.kv_dtype == KvCacheDtype::kFp8DsMla && c.scale_rule == ScaleRule::kRaw) {
          s = std::max(s, std::numeric_limits<float>::min());
        } else {
          // Power of two at or above max(amax / 448, 1e-4), from frexp (exact).
          int ex = 0;
          const float m = std::frexp(std::max(s, 1e-4f), &ex);  // value = m * 2^ex, m in [0.5, 1)
          s = m == 0.5f ? std::ldexp(1.f, ex - 1) : std::ldexp(1.f, ex);
        }
        for (int i = t * tile; i < (t + 1) * tile; ++i) e[i] = f32_to_e4m3(from16(x[i], dt) / s);
        put_scale(t, s);
      }
    };
    switch (c.kv_dtype) {
      case KvCacheDtype::kAuto:
        std::memcpy(e, x, static_cast<std::size_t>(L) * 2);
        std::memcpy(e + 2 * L, r, static_cast<std::size_t>(R) * 2);
        return;
      case KvCacheDtype::kFp8:
      case KvCacheDtype::kFp8E4m3:
        for (int i = 0; i < L; ++i) e[i] = f32_to_e4m3(from16(x[i], dt) / c.k_scale);
        for (int i = 0; i < R; ++i) e[L + i] = f32_to_e4m3(from16(r[i], dt) / c.k_scale);
        return;
      case KvCacheDtype::kFp8DsMla:
        quant_tiles(128, [&](int t, float s) { std::memcpy(e + L + 4 * t, &s, 4); });
        std::memcpy(e + L + 4 * (L / 128), r, static_cast<std::size_t>(R) * 2);
        return;
      case KvCacheDtype::kFp8V4:
        quant_tiles(64, [&](int t, float s) { e[L + 2 * R + t] = f32_to_ue8m0(s); });
        std::memcpy(e + L, r, static_cast<std::size_t>(R) * 2);
        return;
    }
    throw NotSupportedError("cpu.sparse cannot write kv cache dtype " + std::string(kv_cache_dtype_name(c.kv_dtype)));
  }

  void collect(const TensorView& idx, std::span<const std::int32_t> lens, Index t, const PagedCache* cache,
               std::vector<std::pair<const PagedCache*, std::int64_t>>& named) const {
    const Index K = idx.shape[1];
    const bool by_sentinel = faults_.tail_needs_invalid && idx.shape[0] > 64;  // planted
    Index n = lens.empty() || faults_.ignores_topk_length || by_sentinel ? K : lens[static_cast<std::size_t>(t)];
    const bool by_count = faults_.valid_count_prefix && lens.empty();  // planted
    if (by_count) n = std::count_if(idx.as<std::int32_t>() + t * K, idx.as<std::int32_t>() + (t + 1) * K,
                                    [](std::int32_t v) { return v >= 0; });
    const std::int64_t capacity = static_cast<std::int64_t>(cache->num_blocks) * cache->block_size;
    for (Index k = 0; k < n; ++k) {
      std::int64_t slot = idx.as<std::int32_t>()[t * K + k];
      if (by_sentinel && slot == -1) break;
      if (slot < 0 && (faults_.reads_invalid_index || by_count)) slot = 0;  // planted: -1 read as slot 0 (the null block)
      if (slot < 0 || slot >= capacity) continue;
      if (faults_.dedups_indices &&  // planted: a slot named twice counted once
          std::find(named.begin(), named.end(), std::make_pair(cache, slot)) != named.end())
        continue;
      named.emplace_back(cache, slot);
    }
  }

  SparseFaults faults_;
  std::string name_;
  int split_ = 0;  // keys per split-KV partial; 0: one pass
};

}  // namespace

std::unique_ptr<Backend> make_cpu_sparse() { return std::make_unique<CpuSparse>(SparseFaults{}, "cpu.sparse"); }
std::unique_ptr<Backend> make_cpu_sparse_splitkv() {
  return std::make_unique<CpuSparse>(SparseFaults{}, "cpu.sparse.splitkv", 256);
}

namespace detail {
std::unique_ptr<Backend> make_cpu_sparse_with_faults(const SparseFaults& faults, const std::string& name) {
  return std::make_unique<CpuSparse>(faults, name);
}
}  // namespace detail

}  // namespace mlagate
