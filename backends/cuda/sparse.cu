// cuda.sparse: our own CUDA kernels for DeepSeek V3.2 / V4 sparse attention
// (Op::kSparseDecode, Op::kSparsePrefill; semantics in backends/backend.h and
// cases/sparse.h). One thread block takes one query token and a group of up to
// kHeads heads; it walks the token's named keys (V3.2 top-k row, V4 window
// built on the device from seq_lens / query_start_loc / the block table, then
// the compressed cache's row) in tiles of kKeys: each key is dequantized by
// this file's own readers of every kv cache dtype (fp8_v4 through its per-page
// layout) and rounded to the model dtype (the operand a 16-bit MMA sees), fp32
// logits, an online softmax, probabilities rounded to the model dtype before
// P@V, fp32 accumulation, the sink in the final denominator. Each sum has one
// owner thread and a fixed order: no atomics, so the results are bitwise
// deterministic. Every index is checked on the host before any launch.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/backend_base.cuh"
#include "backends/cuda/cache_store.h"
#include "backends/cuda/cuda_backends.h"
#include "cases/errors.h"
#include "cases/fp8.h"
#include "gpu/attention.cuh"
#include "gpu/kv_format.cuh"

namespace mlagate {
namespace gpu {
namespace {

constexpr int kSparseThreads = 256;
constexpr int kHeads = 8;        // heads per block: the query rows that share one tile of keys
constexpr int kKeys = 64;        // keys per tile (FlashMLA's top-k block)
constexpr int kMaxD = 576;       // widest key (L + R of DeepSeek V3.2)
constexpr int kColsPerThread = (kMaxD + kSparseThreads - 1) / kSparseThreads;  // value columns per thread
constexpr int kWarps = kSparseThreads / 32;

enum class SparseKv : int { kModel16 = 0, kFp8 = 1, kDsMla = 2, kV4 = 3 };

// One paged cache on the device. The entry of slot s sits at block s / bs,
// offset o = s % bs: its data bytes at block * block_bytes + o * data_bytes and
// (fp8_v4 only) its scale bytes after the block's data region, at
// block * block_bytes + bs * data_bytes + o * (entry_bytes - data_bytes).
// For the contiguous formats data_bytes == entry_bytes and block_bytes ==
// bs * entry_bytes, so the same formula is slot * entry_bytes.
struct SparseCache {
  const unsigned char* data = nullptr;
  SparseKv kind = SparseKv::kModel16;
  bool bf16 = true;        // model dtype of kModel16 entries
  float k_scale = 1.f;     // kFp8
  int L = 0, R = 0;
  int block_size = 1;
  long long block_bytes = 0;
  int entry_bytes = 0, data_bytes = 0;
  int scale_offset = 0;    // kDsMla: byte offset of the fp32 tile scales in the entry
  int k_pe_offset = 0;     // kDsMla, kV4: byte offset of the bf16 k_pe in the (data part of the) entry
};

__device__ __forceinline__ float ue8m0_to_float(unsigned u) {
  if (u == 0xFFu) return __uint_as_float(0x7FC00000u);
  if (u == 0) return __uint_as_float(0x00400000u);  // 2^-127, an fp32 subnormal
  return __uint_as_float(u << 23);
}

// Element e (kv_c then k_pe) of slot `slot`, in fp32 (e4m3 * scale is one fp32 product).
__device__ __forceinline__ float read_element(const SparseCache& c, long long slot, int e) {
  const long long block = slot / c.block_size, off = slot % c.block_size;
  const unsigned char* base = c.data + block * c.block_bytes;
  const unsigned char* entry = base + off * c.data_bytes;
  switch (c.kind) {
    case SparseKv::kModel16:
      return model_to_float(reinterpret_cast<const std::uint16_t*>(entry)[e], c.bf16);
    case SparseKv::kFp8:
      return __fmul_rn(e4m3_to_float(entry[e]), c.k_scale);
    case SparseKv::kDsMla:
      if (e < c.L) {
        const float s = reinterpret_cast<const float*>(entry + c.scale_offset)[e / 128];
        return __fmul_rn(e4m3_to_float(entry[e]), s);
      }
      return model_to_float(reinterpret_cast<const std::uint16_t*>(entry + c.k_pe_offset)[e - c.L], true);
    case SparseKv::kV4: {
      if (e < c.L) {
        const unsigned char* scales =
            base + static_cast<long long>(c.block_size) * c.data_bytes + off * (c.entry_bytes - c.data_bytes);
        return __fmul_rn(e4m3_to_float(entry[e]), ue8m0_to_float(scales[e / 64]));
      }
      return model_to_float(reinterpret_cast<const std::uint16_t*>(entry + c.k_pe_offset)[e - c.L], true);
    }
  }
  return 0.f;
}

// Where a token's keys come from. Decode: the main part (V3.2 indices or the
// V4 window) then the extra (compressed) row; prefill: rows of a flat array.
struct SparseProblem {
  const std::uint16_t* q = nullptr;  // [T, N, D]
  int T = 0, N = 0, D = 0, dv = 0;
  bool bf16 = true;
  float scale = 0;
  const float* sink = nullptr;  // [N] or nullptr
  // Main part.
  bool prefill = false;
  const std::uint16_t* rows = nullptr;  // prefill: [S, D] model dtype
  long long num_rows = 0;               // prefill: S
  SparseCache cache, extra;
  const std::int32_t* indices = nullptr;   // [T, K] (decode V3.2 and prefill)
  const std::int32_t* lengths = nullptr;   // [T] or nullptr
  int K = 0;
  int window = 0;                          // V4 decode
  const std::int32_t* seq_lens = nullptr;  // [B]
  const std::int32_t* query_start = nullptr;  // [B + 1]
  const std::int32_t* table_rows = nullptr;   // [B]
  const std::int32_t* block_table = nullptr;  // [rows, width]
  int table_width = 0, num_requests = 0;
  // Extra part (decode).
  bool has_extra = false;
  const std::int32_t* extra_indices = nullptr;  // [T, K2]
  const std::int32_t* extra_lengths = nullptr;  // [T] or nullptr
  int K2 = 0;
  // Outputs.
  std::uint16_t* o = nullptr;  // [T, N, dv]
  float* lse = nullptr;        // [T, N]
};

// The main part of token t: how many list entries it has, and for the window
// the first position and the block-table row (sparse_window_slots' rule).
struct MainPart {
  int count = 0;
  int first_pos = 0;
  const std::int32_t* table = nullptr;
};

__device__ MainPart main_part(const SparseProblem& pb, int t) {
  MainPart m;
  if (pb.window == 0) {
    m.count = pb.lengths ? pb.lengths[t] : pb.K;
    return m;
  }
  // The request of token t: the last i with query_start[i] <= t (binary search).
  int lo = 0, hi = pb.num_requests - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (pb.query_start[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int i = lo, s = pb.seq_lens[i];
  const int q = pb.query_start[i + 1] - pb.query_start[i];
  if (s == 0 || t >= pb.query_start[i + 1]) return m;  // padding: no key
  const int p = s - q + (t - pb.query_start[i]);
  m.first_pos = max(0, p - pb.window + 1);
  m.count = p - m.first_pos + 1;
  m.table = pb.block_table + static_cast<long long>(pb.table_rows[i]) * pb.table_width;
  return m;
}

// Entry j of token t's key list: which cache (0 main, 1 extra, 2 flat rows)
// and slot; slot < 0 for an entry that names no key.
__device__ __forceinline__ long long key_slot(const SparseProblem& pb, const MainPart& m, int t, int j, int& which) {
  if (j < m.count) {
    if (pb.prefill) {
      which = 2;
      const long long r = pb.indices[static_cast<long long>(t) * pb.K + j];
      return (r >= 0 && r < pb.num_rows) ? r : -1;
    }
    which = 0;
    if (pb.window > 0) {
      const int pos = m.first_pos + j;
      return static_cast<long long>(m.table[pos / pb.cache.block_size]) * pb.cache.block_size + pos % pb.cache.block_size;
    }
    return pb.indices[static_cast<long long>(t) * pb.K + j];  // -1 or a slot (checked on the host)
  }
  which = 1;
  return pb.extra_indices[static_cast<long long>(t) * pb.K2 + (j - m.count)];
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Shared memory: keys [kKeys][D + 2] model-dtype bits (the +2 staggers rows
// across banks), q [kHeads][D] fp32, p [kHeads][kKeys] fp32, the tile's
// validity and the per-head softmax state.
__host__ __device__ inline std::size_t sparse_smem_bytes(int D) {
  return static_cast<std::size_t>(kKeys) * (D + 2) * 2 + static_cast<std::size_t>(kHeads) * D * 4 +
         static_cast<std::size_t>(kHeads) * kKeys * 4 + kKeys * 4 + kHeads * 4 * 2;
}

// A tile of keys into shared memory as model-dtype bits (zeros and s_valid 0
// where the tile has no key): warp k loads keys k, k + kWarps, ...; lanes
// stride over the elements.
__device__ __forceinline__ void load_key_tile(const SparseProblem& pb, const MainPart& m, int t, int j0, int w, int D,
                                              int ks, int lane, int warp, std::uint16_t* s_keys, int* s_valid) {
  for (int j = warp; j < kKeys; j += kWarps) {
    int which = 0;
    const long long slot = j < w ? key_slot(pb, m, t, j0 + j, which) : -1;
    std::uint16_t* dst = s_keys + j * ks;
    if (slot < 0) {
      for (int e = lane; e < D; e += 32) dst[e] = 0;
    } else if (which == 2) {
      for (int e = lane; e < D; e += 32) dst[e] = pb.rows[slot * D + e];
    } else {
      const SparseCache& c = which == 0 ? pb.cache : pb.extra;
      for (int e = lane; e < D; e += 32) dst[e] = to_model_bits(read_element(c, slot, e), pb.bf16);
    }
    if (lane == 0) s_valid[j] = slot >= 0 ? 1 : 0;
  }
}

__global__ void __launch_bounds__(kSparseThreads) sparse_attention_kernel(const SparseProblem pb) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = pb.D, ks = D + 2;
  std::uint16_t* s_keys = reinterpret_cast<std::uint16_t*>(smem);
  float* s_q = reinterpret_cast<float*>(smem + static_cast<std::size_t>(kKeys) * ks * 2);
  float* s_p = s_q + kHeads * D;
  int* s_valid = reinterpret_cast<int*>(s_p + kHeads * kKeys);
  float* s_corr = reinterpret_cast<float*>(s_valid + kKeys);
  float* s_skip = s_corr + kHeads;  // per head: 1 when the tile leaves it unchanged

  const int t = blockIdx.x, h0 = blockIdx.y * kHeads, tid = threadIdx.x;
  const int heads = min(kHeads, pb.N - h0);
  const int lane = tid % 32, warp = tid / 32;

  for (int i = tid; i < kHeads * D; i += kSparseThreads) {
    const int h = i / D, d = i % D;
    s_q[i] = h < heads ? model_to_float(pb.q[(static_cast<long long>(t) * pb.N + h0 + h) * D + d], pb.bf16) : 0.f;
  }
  const MainPart m = main_part(pb, t);
  const int extra_count = pb.has_extra ? (pb.extra_lengths ? pb.extra_lengths[t] : pb.K2) : 0;
  const int total = m.count + extra_count;

  // Softmax state per head, kept by the warp that owns the head (warp w owns heads w, w + kWarps, ...).
  constexpr int kHeadsPerWarp = (kHeads + kWarps - 1) / kWarps;
  float run_max[kHeadsPerWarp], run_sum[kHeadsPerWarp];
  for (int i = 0; i < kHeadsPerWarp; ++i) run_max[i] = neg_inf<float>(), run_sum[i] = 0.f;
  float acc[kHeads][kColsPerThread];
  for (int h = 0; h < kHeads; ++h)
    for (int c = 0; c < kColsPerThread; ++c) acc[h][c] = 0.f;
  bool any_key = false;

  for (int j0 = 0; j0 < total; j0 += kKeys) {
    const int w = min(kKeys, total - j0);
    __syncthreads();  // the previous tile's keys and p are consumed
    load_key_tile(pb, m, t, j0, w, D, ks, lane, warp, s_keys, s_valid);
    __syncthreads();
    // Logits: thread (h, j) for h < kHeads, j < kKeys, sequential over d.
    for (int i = tid; i < kHeads * kKeys; i += kSparseThreads) {
      const int h = i / kKeys, j = i % kKeys;
      float s = neg_inf<float>();
      if (s_valid[j] && h < heads) {
        const float* qh = s_q + h * D;
        const std::uint16_t* kj = s_keys + j * ks;
        float dot = 0.f;
        for (int d = 0; d < D; ++d) dot = fmaf(qh[d], model_to_float(kj[d], pb.bf16), dot);
        s = dot * pb.scale;
      }
      s_p[h * kKeys + j] = s;
    }
    __syncthreads();
    // Online softmax per head: the tile's max, the correction of the running
    // state, probabilities (the sum unrounded, P@V's operand rounded).
    for (int k = 0; k < kHeadsPerWarp; ++k) {
      const int h = warp + k * kWarps;
      if (h >= kHeads) break;
      const float a = s_p[h * kKeys + lane], b = s_p[h * kKeys + lane + 32];
      const float tile_max = warp_max(fmaxf(a, b));
      const float new_max = fmaxf(run_max[k], tile_max);
      if (new_max == neg_inf<float>()) {  // nothing valid yet for this head: leave it as it is
        s_p[h * kKeys + lane] = 0.f;
        s_p[h * kKeys + lane + 32] = 0.f;
        if (lane == 0) s_corr[h] = 1.f, s_skip[h] = 1.f;
        continue;
      }
      const float corr = run_max[k] == neg_inf<float>() ? 0.f : expf(run_max[k] - new_max);
      const float ea = a == neg_inf<float>() ? 0.f : expf(a - new_max);
      const float eb = b == neg_inf<float>() ? 0.f : expf(b - new_max);
      // The tile's sum in key order (lane i holds keys i and i + 32): one fixed tree.
      const float sum = warp_sum(ea + eb);
      run_sum[k] = run_sum[k] * corr + sum;
      run_max[k] = new_max;
      s_p[h * kKeys + lane] = round_to_model(ea, pb.bf16);
      s_p[h * kKeys + lane + 32] = round_to_model(eb, pb.bf16);
      if (lane == 0) s_corr[h] = corr, s_skip[h] = 0.f;
    }
    __syncthreads();
    for (int j = 0; j < w; ++j) any_key = any_key || s_valid[j];
    // P@V: thread owns columns tid, tid + 256, ... of every head.
    for (int c = 0; c < kColsPerThread; ++c) {
      const int col = tid + c * kSparseThreads;
      if (col >= pb.dv) break;
      for (int h = 0; h < kHeads; ++h) {
        if (s_skip[h] != 0.f) continue;
        float v = acc[h][c] * s_corr[h];
        for (int j = 0; j < w; ++j) v = fmaf(s_p[h * kKeys + j], model_to_float(s_keys[j * ks + col], pb.bf16), v);
        acc[h][c] = v;
      }
    }
  }
  // The final denominators: the owner warp publishes them through s_corr
  // (1 / denom) and s_skip (lse).
  __syncthreads();
  for (int k = 0; k < kHeadsPerWarp; ++k) {
    const int h = warp + k * kWarps;
    if (h >= kHeads || lane != 0) continue;
    if (!any_key || h >= heads) {
      s_corr[h] = 0.f;
      s_skip[h] = __int_as_float(0x7f800000);  // a row with no key: o = 0, lse = +inf (FlashMLA's convention)
      continue;
    }
    float denom = run_sum[k];
    if (pb.sink) denom += expf(pb.sink[h0 + h] - run_max[k]);
    s_corr[h] = denom;
    s_skip[h] = run_max[k] + logf(run_sum[k]);
  }
  __syncthreads();
  for (int h = 0; h < heads; ++h) {
    const long long row = static_cast<long long>(t) * pb.N + h0 + h;
    for (int c = 0; c < kColsPerThread; ++c) {
      const int col = tid + c * kSparseThreads;
      if (col >= pb.dv) break;
      const float o = s_corr[h] == 0.f ? 0.f : acc[h][c] / s_corr[h];
      pb.o[row * pb.dv + col] = to_model_bits(o, pb.bf16);
    }
    if (tid == 0) pb.lse[row] = s_skip[h];
  }
}

SparseCache sparse_cache_of(const PagedCache& c, const unsigned char* data) {
  const EntryFormat f = c.format();
  if (f.bytes != c.entry_bytes)
    throw std::invalid_argument("cuda.sparse: cache entry of " + std::to_string(c.entry_bytes) + " bytes, its format has " +
                                std::to_string(f.bytes));
  if (c.kv_lora_rank + c.rope_dim > kMaxD)
    throw NotSupportedError("cuda.sparse: keys wider than " + std::to_string(kMaxD));
  SparseCache s;
  s.data = data;
  s.bf16 = c.elem_dtype == DType::kBF16;
  s.k_scale = c.k_scale;
  s.L = c.kv_lora_rank;
  s.R = c.rope_dim;
  s.block_size = c.block_size;
  s.block_bytes = c.block_bytes;
  s.entry_bytes = c.entry_bytes;
  s.data_bytes = f.data_bytes;
  s.scale_offset = f.scale_offset;
  s.k_pe_offset = f.k_pe_offset;
  switch (c.kv_dtype) {
    case KvCacheDtype::kAuto: s.kind = SparseKv::kModel16; break;
    case KvCacheDtype::kFp8:
    case KvCacheDtype::kFp8E4m3: s.kind = SparseKv::kFp8; break;
    case KvCacheDtype::kFp8DsMla: s.kind = SparseKv::kDsMla; break;
    case KvCacheDtype::kFp8V4: s.kind = SparseKv::kV4; break;
  }
  if (s.block_bytes < static_cast<long long>(s.block_size) * s.entry_bytes)
    throw std::invalid_argument("cuda.sparse: block of " + std::to_string(s.block_bytes) + " bytes is smaller than its entries");
  return s;
}

class SparseBackend final : public CudaBackend {
 public:
  std::string_view name() const override { return "cuda.sparse"; }
  std::string_view description() const override {
    return "CUDA sparse attention (DeepSeek V3.2 top-k, V4 window + compressed cache, sinks): own readers of every kv "
           "dtype, model-dtype operands, fp32 online softmax and accumulation, deterministic";
  }
  Capabilities capabilities() const override {
    Capabilities caps;
    caps.ops = {Op::kSparseDecode, Op::kSparsePrefill};
    caps.block_sizes = {64, 1, 2, 4, 8, 16, 32, 128, 256};
    caps.query_len_support = QueryLenSupport::kVarlen;
    caps.dtypes = {DType::kBF16, DType::kF16};
    caps.kv_dtypes = {KvCacheDtype::kAuto, KvCacheDtype::kFp8, KvCacheDtype::kFp8E4m3, KvCacheDtype::kFp8DsMla,
                      KvCacheDtype::kFp8V4};
    caps.max_pool_bytes = std::numeric_limits<std::int64_t>::max();  // 64-bit slots: gpu/attention.cuh
    return caps;
  }
  Support supports(const CaseSpec& spec, Op op) const override {
    Support s = check_capabilities(capabilities(), spec, op);
    if (!s.ok || !is_sparse_op(op)) return s;
    if (spec.dims.head_size() > kMaxD)
      return Support::no("keys of " + std::to_string(spec.dims.head_size()) + " elements (at most " +
                         std::to_string(kMaxD) + ")");
    return s;
  }

  void sparse_decode(const SparseDecodeArgs& a) override {
    require_device();
    check_sparse_decode_args(a);  // on the host, before anything is launched
    const cudaStream_t s = stream();
    const int T = static_cast<int>(a.q.shape[0]), N = static_cast<int>(a.q.shape[1]), D = static_cast<int>(a.q.shape[2]);
    std::shared_ptr<const DeviceCache> main = DeviceCacheStore::instance().get(*a.cache, s);
    std::shared_ptr<const DeviceCache> extra;
    if (a.extra_cache) extra = DeviceCacheStore::instance().get(*a.extra_cache, s);

    SparseProblem pb = common(a.q, a.scale, static_cast<int>(a.o.shape[2]));
    pb.cache = sparse_cache_of(*a.cache, main->layer_as<unsigned char>());
    DeviceBuffer q = upload_array(static_cast<const std::uint16_t*>(a.q.data), a.q.numel(), s);
    DeviceBuffer sink = upload_array(a.sink.data(), a.sink.size(), s);
    DeviceBuffer idx, lens, meta, eidx, elens;
    if (a.window > 0) {
      pb.window = a.window;
      std::vector<std::int32_t> m(a.seq_lens.begin(), a.seq_lens.end());
      m.insert(m.end(), a.query_start_loc.begin(), a.query_start_loc.end());
      m.insert(m.end(), a.block_table_rows.begin(), a.block_table_rows.end());
      meta = upload_array(m.data(), m.size(), s);
      pb.num_requests = static_cast<int>(a.seq_lens.size());
      pb.seq_lens = meta.as<std::int32_t>();
      pb.query_start = pb.seq_lens + pb.num_requests;
      pb.table_rows = pb.query_start + pb.num_requests + 1;
      pb.block_table = main->block_table.as<std::int32_t>();
      pb.table_width = a.cache->table_width;
      if (pb.num_requests == 0 && T > 0) throw std::invalid_argument("sparse_decode: a window needs requests");
    } else {
      idx = upload_array(a.indices.as<std::int32_t>(), a.indices.numel(), s);
      lens = upload_array(a.topk_length.data(), a.topk_length.size(), s);
      pb.indices = idx.as<std::int32_t>();
      pb.lengths = a.topk_length.empty() ? nullptr : lens.as<std::int32_t>();
      pb.K = static_cast<int>(a.indices.shape[1]);
    }
    if (a.extra_cache) {
      if (a.extra_cache->kv_dtype != KvCacheDtype::kAuto && a.extra_cache->elem_dtype != a.q.dtype)
        throw std::invalid_argument("sparse_decode: the extra cache's model dtype differs from q's");
      pb.has_extra = true;
      pb.extra = sparse_cache_of(*a.extra_cache, extra->layer_as<unsigned char>());
      eidx = upload_array(a.extra_indices.as<std::int32_t>(), a.extra_indices.numel(), s);
      elens = upload_array(a.extra_topk_length.data(), a.extra_topk_length.size(), s);
      pb.extra_indices = eidx.as<std::int32_t>();
      pb.extra_lengths = a.extra_topk_length.empty() ? nullptr : elens.as<std::int32_t>();
      pb.K2 = static_cast<int>(a.extra_indices.shape[1]);
    }
    pb.q = q.as<std::uint16_t>();
    pb.sink = a.sink.empty() ? nullptr : sink.as<float>();
    run(pb, a.o, a.lse, T, N, D, s);
  }

  // --cuda-graph on the sparse op: the kernel captured once over persistent
  // device buffers (q, sink, index rows and lengths or the window's metadata,
  // both caches and the block table, guarded outputs poisoned once); each
  // replay uploads the new call into the same addresses and launches the graph.
  std::unique_ptr<SparseDecodeGraph> capture_sparse_decode(const SparseDecodeArgs& a) override {
    require_device();
    auto g = std::make_shared<Graph>();
    return persistent_sparse_decode_graph(
        a, [this, g](const SparseDecodeArgs& p, bool capture) { graph_step(*g, p, capture); }, "CUDA graph");
  }

  // `mlagate bench`: the graph mode's capture (uploads into the graph's own
  // buffers, a warm-up, the capture), then its graph replayed on the timer's
  // stream: one kernel.
  std::unique_ptr<DecodeBench> prepare_sparse_decode_bench(const SparseDecodeArgs& a) override {
    require_device();
    class Handle final : public DecodeBench {
     public:
      explicit Handle(std::shared_ptr<Graph> g) : g_(std::move(g)) {}
      void launch(void* cuda_stream) override { g_->graph.launch(static_cast<cudaStream_t>(cuda_stream)); }

     private:
      std::shared_ptr<Graph> g_;
    };
    auto g = std::make_shared<Graph>();
    graph_step(*g, a, true);
    return std::make_unique<Handle>(std::move(g));
  }

  void sparse_prefill(const SparsePrefillArgs& a) override {
    require_device();
    check_sparse_prefill_args(a);
    const cudaStream_t s = stream();
    const int T = static_cast<int>(a.q.shape[0]), N = static_cast<int>(a.q.shape[1]), D = static_cast<int>(a.q.shape[2]);
    if (D > kMaxD) throw NotSupportedError("cuda.sparse: rows wider than " + std::to_string(kMaxD));
    SparseProblem pb = common(a.q, a.scale, static_cast<int>(a.o.shape[2]));
    DeviceBuffer q = upload_array(static_cast<const std::uint16_t*>(a.q.data), a.q.numel(), s);
    DeviceBuffer rows = upload_array(static_cast<const std::uint16_t*>(a.kv.data), a.kv.numel(), s);
    DeviceBuffer sink = upload_array(a.sink.data(), a.sink.size(), s);
    DeviceBuffer idx = upload_array(a.indices.as<std::int32_t>(), a.indices.numel(), s);
    DeviceBuffer lens = upload_array(a.topk_length.data(), a.topk_length.size(), s);
    pb.prefill = true;
    pb.q = q.as<std::uint16_t>();
    pb.rows = rows.as<std::uint16_t>();
    pb.num_rows = a.kv.shape[0];
    pb.indices = idx.as<std::int32_t>();
    pb.lengths = a.topk_length.empty() ? nullptr : lens.as<std::int32_t>();
    pb.K = static_cast<int>(a.indices.shape[1]);
    pb.sink = a.sink.empty() ? nullptr : sink.as<float>();
    run(pb, a.o, a.lse, T, N, D, s);
  }

 protected:
  std::unique_ptr<PlannedDecode> plan_decode(const DecodeCall&) override {
    throw NotSupportedError("cuda.sparse has no dense decode kernel");
  }

 private:
  struct Graph {
    DeviceBuffer q, sink, meta, idx, lens, eidx, elens, cache, table, extra;
    std::unique_ptr<GuardedDeviceOutput> o, lse;
    CapturedGraph graph;  // last: destroyed before the buffers its kernel reads
  };

  // One step of a captured sparse decode: uploads into the graph's buffers
  // (allocated at the capture), then the capture (warm-up, stream capture) or
  // the replay, and the outputs back into the persistent host buffers.
  void graph_step(Graph& g, const SparseDecodeArgs& a, bool capture) {
    check_sparse_decode_args(a);
    const cudaStream_t s = stream();
    const auto put = [&](DeviceBuffer& d, const void* src, std::size_t bytes) {
      if (capture) d = DeviceBuffer(std::max<std::size_t>(bytes, 4));
      if (bytes > d.size()) throw std::invalid_argument("cuda.sparse graph: an input larger than captured");
      if (bytes) d.upload(src, bytes, s);
    };
    put(g.q, a.q.data, a.q.nbytes());
    put(g.sink, a.sink.data(), a.sink.size_bytes());
    put(g.cache, a.cache->data.bytes(), a.cache->data.nbytes());
    put(g.table, a.cache->block_table.bytes(), a.cache->block_table.nbytes());
    std::vector<std::int32_t> m(a.seq_lens.begin(), a.seq_lens.end());
    m.insert(m.end(), a.query_start_loc.begin(), a.query_start_loc.end());
    m.insert(m.end(), a.block_table_rows.begin(), a.block_table_rows.end());
    put(g.meta, m.data(), m.size() * sizeof(std::int32_t));
    if (a.window == 0) {
      put(g.idx, a.indices.data, a.indices.nbytes());
      put(g.lens, a.topk_length.data(), a.topk_length.size_bytes());
    }
    if (a.extra_cache) {
      put(g.extra, a.extra_cache->data.bytes(), a.extra_cache->data.nbytes());
      put(g.eidx, a.extra_indices.data, a.extra_indices.nbytes());
      put(g.elens, a.extra_topk_length.data(), a.extra_topk_length.size_bytes());
    }
    const int T = static_cast<int>(a.q.shape[0]), N = static_cast<int>(a.q.shape[1]), D = static_cast<int>(a.q.shape[2]);
    if (capture) {
      SparseProblem pb = common(a.q, a.scale, static_cast<int>(a.o.shape[2]));
      pb.cache = sparse_cache_of(*a.cache, g.cache.as<unsigned char>());
      pb.num_requests = static_cast<int>(a.seq_lens.size());
      if (a.window > 0) {
        pb.window = a.window;
        pb.seq_lens = g.meta.as<std::int32_t>();
        pb.query_start = pb.seq_lens + pb.num_requests;
        pb.table_rows = pb.query_start + pb.num_requests + 1;
        pb.block_table = g.table.as<std::int32_t>();
        pb.table_width = a.cache->table_width;
      } else {
        pb.indices = g.idx.as<std::int32_t>();
        pb.lengths = a.topk_length.empty() ? nullptr : g.lens.as<std::int32_t>();
        pb.K = static_cast<int>(a.indices.shape[1]);
      }
      if (a.extra_cache) {
        pb.has_extra = true;
        pb.extra = sparse_cache_of(*a.extra_cache, g.extra.as<unsigned char>());
        pb.extra_indices = g.eidx.as<std::int32_t>();
        pb.extra_lengths = a.extra_topk_length.empty() ? nullptr : g.elens.as<std::int32_t>();
        pb.K2 = static_cast<int>(a.extra_indices.shape[1]);
      }
      pb.q = g.q.as<std::uint16_t>();
      pb.sink = a.sink.empty() ? nullptr : g.sink.as<float>();
      if (pb.dv > kColsPerThread * kSparseThreads) throw NotSupportedError("cuda.sparse: value wider than " + std::to_string(kMaxD));
      g.o = std::make_unique<GuardedDeviceOutput>(a.o, "o", s);
      g.lse = std::make_unique<GuardedDeviceOutput>(a.lse, "lse", s);
      pb.o = g.o->as<std::uint16_t>();
      pb.lse = g.lse->as<float>();
      const std::size_t smem = sparse_smem_bytes(D);
      if (smem > static_cast<std::size_t>(max_dynamic_smem()))
        throw NotSupportedError("cuda.sparse: " + std::to_string(smem) + " bytes of shared memory needed");
      MLAGATE_CUDA_CHECK(cudaFuncSetAttribute(sparse_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
      const dim3 grid(static_cast<unsigned>(std::max(T, 1)), static_cast<unsigned>((N + kHeads - 1) / kHeads));
      if (T > 0 && N > 0) {
        sparse_attention_kernel<<<grid, kSparseThreads, smem, s>>>(pb);  // the warm-up
        MLAGATE_CUDA_CHECK_LAUNCH();
      }
      MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
      g.graph = CapturedGraph(s, [&] {
        if (T > 0 && N > 0) sparse_attention_kernel<<<grid, kSparseThreads, smem, s>>>(pb);
      });
    } else {
      g.graph.launch(s);
    }
    MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
    check_guards_or_throw({g.o.get(), g.lse.get()}, s);
    g.o->download_to(a.o, s);
    g.lse->download_to(a.lse, s);
  }

  static SparseProblem common(const TensorView& q, double scale, int dv) {
    SparseProblem pb;
    pb.T = static_cast<int>(q.shape[0]);
    pb.N = static_cast<int>(q.shape[1]);
    pb.D = static_cast<int>(q.shape[2]);
    pb.dv = dv;
    pb.bf16 = q.dtype == DType::kBF16;
    pb.scale = static_cast<float>(scale);
    return pb;
  }

  void run(SparseProblem& pb, const TensorView& o_host, const TensorView& lse_host, int T, int N, int D, cudaStream_t s) {
    if (pb.dv > kColsPerThread * kSparseThreads) throw NotSupportedError("cuda.sparse: value wider than " + std::to_string(kMaxD));
    GuardedDeviceOutput o(o_host, "o", s), lse(lse_host, "lse", s);
    pb.o = o.as<std::uint16_t>();
    pb.lse = lse.as<float>();
    const std::size_t smem = sparse_smem_bytes(D);
    if (smem > static_cast<std::size_t>(max_dynamic_smem()))
      throw NotSupportedError("cuda.sparse: " + std::to_string(smem) + " bytes of shared memory needed");
    MLAGATE_CUDA_CHECK(cudaFuncSetAttribute(sparse_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
    Event start, stop;
    start.record(s);
    if (T > 0 && N > 0) {
      const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>((N + kHeads - 1) / kHeads));
      sparse_attention_kernel<<<grid, kSparseThreads, smem, s>>>(pb);
      MLAGATE_CUDA_CHECK_LAUNCH();
    }
    last_kernel_ms_ = finish_timed_call(start, stop, s, o, o_host, lse, lse_host);
  }
};

}  // namespace
}  // namespace gpu

std::unique_ptr<Backend> make_cuda_sparse() { return std::make_unique<gpu::SparseBackend>(); }

}  // namespace mlagate
