// An mlagate plugin with CUDA kernels: MLA decode and DeepSeek sparse decode
// on device pointers (the tensors mlagate hands a kDLCUDA backend live on the
// GPU; it launches on the stream it is given and mlagate synchronizes, checks
// the guard bands around the outputs and copies them back). It includes
// mlagate/plugin.h and nothing else of mlagate; CMakeLists.txt builds it
// anywhere nvcc is.
//
//   mlagate run --plugin build/libmla_decode_cuda_example.so --backend example.cuda_decode --suite smoke
//   mlagate run --plugin build/libmla_decode_cuda_example.so --backend example.cuda_sparse --suite sparse
//
// example.cuda_decode: one block of 8 warps per (token, head) row; each warp
// takes every 8th visible key, computes the 576-wide logit with a warp
// reduction and keeps its own online softmax (max, sum, o in registers); the
// warps' states are merged through shared memory at the end. fp32 throughout,
// output rounded to the model dtype. kv cache dtypes auto (bf16 or fp16
// entries) and fp8 / fp8_e4m3 (e4m3fn * k_scale); L <= 512. Its q and
// outputs may be strided views (strided_views, ABI 1.3).
//
// example.cuda_sparse (plugin ABI 1.2): the sparse decode op with the same
// block shape; a row's keys are its top-k slots (V3.2: indices, topk_length,
// -1 skipped) or its sliding window through the block table plus its
// compressed-cache slots (V4), and the per-head sink divides the output. It
// reads every entry layout the problem describes (auto, fp8, fp8_e4m3,
// fp8_ds_mla's fp32 tile scales, fp8_v4's UE8M0 scales on split pages).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>

#include "mlagate/plugin.h"

namespace {

constexpr int kWarps = 8;
constexpr int kMaxL = 512;  // o_lat elements a lane holds: kMaxL / 32

// A [T, N, ...] tensor's token and head strides in elements: the DLTensor's
// own (strided_views: vLLM hands q_lat and q_pe as slices of one fused
// tensor, o_lat and lse inside larger buffers), or the compact ones.
struct RowStrides {
  long long t, n;
};
RowStrides row_strides(const DLTensor& x) {
  if (x.strides) return {x.strides[0], x.strides[1]};
  long long inner = 1;
  for (int d = 2; d < x.ndim; ++d) inner *= x.shape[d];
  return {x.shape[1] * inner, inner};
}

struct Params {
  const unsigned short *q_lat, *q_pe;  // [T, N, L], [T, N, R] model-dtype bits, rows at q_lat_rows / q_pe_rows
  const unsigned char* cache;          // [num_blocks, block_size, entry_bytes]
  const int *table, *seq_lens, *qsl;   // [B, W], [B], [B + 1]
  unsigned short* o_lat;               // [T, N, L], rows at o_rows
  float* lse;                          // [T, N], rows at lse_rows
  RowStrides q_lat_rows, q_pe_rows, o_rows, lse_rows;
  int B, N, L, R, W, block_size, entry_bytes, kv_c_offset, k_pe_offset;
  int elem_bytes;  // 2: model-dtype entries (auto); 1: e4m3fn (fp8, fp8_e4m3)
  float scale, k_scale;
};

template <bool kBf16>
__device__ float widen(unsigned short b) {
  if constexpr (kBf16) return __uint_as_float(static_cast<unsigned>(b) << 16);
  else return __half2float(__ushort_as_half(b));
}

// e4m3fn: bias 7, no infinities, S.1111.111 is NaN.
__device__ float e4m3(unsigned char b) {
  const int e = (b >> 3) & 0xF, m = b & 0x7;
  float v = e == 0 ? m * 0x1p-9f : ldexpf(1.f + m * 0.125f, e - 7);
  if (e == 15 && m == 7) v = NAN;
  return (b & 0x80) ? -v : v;
}

// Element i of a field of the cache entry starting at `field`.
template <bool kBf16>
__device__ float entry_elem(const unsigned char* field, int i, const Params& p) {
  if (p.elem_bytes == 2) return widen<kBf16>(reinterpret_cast<const unsigned short*>(field)[i]);
  return e4m3(field[i]) * p.k_scale;
}

template <bool kBf16>
__device__ unsigned short narrow(float x) {
  if constexpr (kBf16) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  else return __half_as_ushort(__float2half_rn(x));
}

template <bool kBf16>
__global__ void __launch_bounds__(kWarps * 32) decode_kernel(Params p) {
  extern __shared__ float smem[];
  const int D = p.L + p.R;
  float* q = smem;                    // [D]
  float* warp_m = q + D;              // [kWarps]
  float* warp_l = warp_m + kWarps;    // [kWarps]
  float* warp_o = warp_l + kWarps;    // [kWarps, L]
  const int row = blockIdx.x, t = row / p.N, n = row % p.N;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  int b = 0;
  while (b + 1 < p.B && p.qsl[b + 1] <= t) ++b;
  const int s = p.seq_lens[b], ql = p.qsl[b + 1] - p.qsl[b], u = t - p.qsl[b];
  const int visible = max(0, min(s, s - ql + u + 1));  // causal: keys 0 .. s - ql + u

  for (int i = threadIdx.x; i < D; i += blockDim.x)
    q[i] = widen<kBf16>(i < p.L ? p.q_lat[t * p.q_lat_rows.t + n * p.q_lat_rows.n + i]
                                : p.q_pe[t * p.q_pe_rows.t + n * p.q_pe_rows.n + (i - p.L)]);
  __syncthreads();

  float m = -INFINITY, l = 0.f, o[kMaxL / 32];
#pragma unroll
  for (int k = 0; k < kMaxL / 32; ++k) o[k] = 0.f;
  for (int j = warp; j < visible; j += kWarps) {
    const long long block = p.table[static_cast<long long>(b) * p.W + j / p.block_size];
    const unsigned char* e = p.cache + (block * p.block_size + j % p.block_size) * p.entry_bytes;
    const unsigned char *kv = e + p.kv_c_offset, *pe = e + p.k_pe_offset;
    float dot = 0.f;
    for (int i = lane; i < p.L; i += 32) dot += q[i] * entry_elem<kBf16>(kv, i, p);
    for (int i = lane; i < p.R; i += 32) dot += q[p.L + i] * entry_elem<kBf16>(pe, i, p);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float x = dot * p.scale, m_new = fmaxf(m, x);
    const float c = __expf(m - m_new), w = __expf(x - m_new);
    l = l * c + w;
#pragma unroll
    for (int k = 0; k < kMaxL / 32; ++k)
      if (lane + 32 * k < p.L) o[k] = o[k] * c + w * entry_elem<kBf16>(kv, lane + 32 * k, p);
    m = m_new;
  }
  if (lane == 0) warp_m[warp] = m, warp_l[warp] = l;
#pragma unroll
  for (int k = 0; k < kMaxL / 32; ++k)
    if (lane + 32 * k < p.L) warp_o[warp * p.L + lane + 32 * k] = o[k];
  __syncthreads();

  const long long out = t * p.o_rows.t + n * p.o_rows.n, lse_at = t * p.lse_rows.t + n * p.lse_rows.n;
  if (visible == 0) {  // a row with no key: o = 0, lse = -inf
    for (int i = threadIdx.x; i < p.L; i += blockDim.x) p.o_lat[out + i] = narrow<kBf16>(0.f);
    if (threadIdx.x == 0) p.lse[lse_at] = -INFINITY;
    return;
  }
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, warp_m[w]);
  float total = 0.f;
  for (int w = 0; w < kWarps; ++w) total += warp_l[w] * __expf(warp_m[w] - M);  // a warp with no key adds 0
  for (int i = threadIdx.x; i < p.L; i += blockDim.x) {
    float acc = 0.f;
    for (int w = 0; w < kWarps; ++w) acc += warp_o[w * p.L + i] * __expf(warp_m[w] - M);
    p.o_lat[out + i] = narrow<kBf16>(acc / total);
  }
  if (threadIdx.x == 0) p.lse[lse_at] = M + logf(total);
}

int32_t say(char* msg, size_t size, const char* text, int32_t status) {
  if (size) std::snprintf(msg, size, "%s", text);
  return status;
}

int32_t supports(void*, const mlagate_problem* p, char* reason, size_t size) {
  if (p->kv_lora_rank > kMaxL) {
    std::snprintf(reason, size, "kv_lora_rank %d > %d", p->kv_lora_rank, kMaxL);
    return 0;
  }
  return 1;
}

int32_t run(void*, const mlagate_problem* p, const mlagate_args* args, char* msg, size_t size) {
  if (p->op != MLAGATE_OP_DECODE) return say(msg, size, "example.cuda_decode implements decode only", MLAGATE_STATUS_NOT_SUPPORTED);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return say(msg, size, "no CUDA device", MLAGATE_STATUS_UNAVAILABLE);
  const mlagate_decode_args& a = args->decode;
  if (a.q_lat.device.device_type != kDLCUDA || a.kv_cache.ndim != 3 || a.block_table.ndim != 2 ||
      a.q_lat.ndim != 3 || a.q_lat.shape[1] != p->num_heads || a.q_lat.shape[2] != p->kv_lora_rank)
    return say(msg, size, "decode: unexpected tensors", MLAGATE_STATUS_ERROR);
  Params k{};
  k.q_lat = static_cast<const unsigned short*>(a.q_lat.data);
  k.q_pe = static_cast<const unsigned short*>(a.q_pe.data);
  k.cache = static_cast<const unsigned char*>(a.kv_cache.data);
  k.table = static_cast<const int*>(a.block_table.data);
  k.seq_lens = static_cast<const int*>(a.seq_lens.data);
  k.qsl = static_cast<const int*>(a.query_start_loc.data);
  k.o_lat = static_cast<unsigned short*>(a.o_lat.data);
  k.lse = static_cast<float*>(a.lse.data);
  k.q_lat_rows = row_strides(a.q_lat);
  k.q_pe_rows = row_strides(a.q_pe);
  k.o_rows = row_strides(a.o_lat);
  k.lse_rows = row_strides(a.lse);
  k.B = p->num_requests;
  k.N = p->num_heads;
  k.L = p->kv_lora_rank;
  k.R = p->rope_dim;
  k.W = static_cast<int>(a.block_table.shape[1]);
  k.block_size = p->block_size;
  k.entry_bytes = p->entry.bytes;
  k.kv_c_offset = p->entry.kv_c_offset;
  k.k_pe_offset = p->entry.k_pe_offset;
  k.elem_bytes = p->entry.kv_c_elem_bytes;
  k.scale = static_cast<float>(p->scale);
  k.k_scale = p->k_scale;
  const int rows = p->num_tokens * p->num_heads;
  if (rows == 0) return MLAGATE_STATUS_OK;
  const size_t smem = sizeof(float) * (k.L + k.R + 2 * kWarps + kWarps * k.L);
  const auto stream = static_cast<cudaStream_t>(args->stream);
  if (p->dtype == MLAGATE_DTYPE_BF16)
    decode_kernel<true><<<rows, kWarps * 32, smem, stream>>>(k);
  else
    decode_kernel<false><<<rows, kWarps * 32, smem, stream>>>(k);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return say(msg, size, cudaGetErrorString(e), MLAGATE_STATUS_ERROR);
  return MLAGATE_STATUS_OK;
}

// ---------------------------------------------------------------- sparse decode

constexpr int kMaxD = 576;  // L + R of the widest dims: value elements a lane holds: kMaxD / 32

// One paged cache as the problem lays it out (plugin.h, mlagate_entry_layout).
struct Cache {
  const unsigned char* data;
  long long block_bytes;
  int block_size, bytes, data_bytes;
};

struct SparseParams {
  const unsigned short* q;  // [T, N, L + R] model-dtype bits
  Cache main, extra;        // extra.data null: no compressed cache
  const int *table, *seq_lens, *qsl;                // [B, W], [B], [B + 1]
  const int *indices, *topk_length;                 // [T, K] or null, [T] or null
  const int *extra_indices, *extra_topk_length;     // [T, K2] or null, [T] or null
  const float* sink;                                // [N] or null
  unsigned short* o;                                // [T, N, Dv]
  float* lse;                                       // [T, N]
  int B, N, L, R, Dv, W, K, K2, window;
  int kv_c_offset, kv_c_elem_bytes, k_pe_offset, k_pe_elem_bytes;
  int scale_offset, scale_elem_bytes, scale_tile;  // 4: fp32 tile scales, 1: UE8M0, 0: k_scale
  float scale, k_scale;
};

// Byte i of the entry in `slot`: fp8_v4 keeps a block's data bytes of every
// row first and the rest after them; other layouts are contiguous (data_bytes
// = bytes, block_bytes = block_size * bytes).
__device__ const unsigned char* entry_byte(const Cache& c, long long slot, int i) {
  const long long block = slot / c.block_size, row = slot % c.block_size;
  const unsigned char* b = c.data + block * c.block_bytes;
  if (i < c.data_bytes) return b + row * c.data_bytes + i;
  return b + static_cast<long long>(c.block_size) * c.data_bytes + row * (c.bytes - c.data_bytes) + (i - c.data_bytes);
}

// Element k of the key in `slot` (k < L: kv_c, else k_pe), dequantized.
template <bool kBf16>
__device__ float key_elem(const SparseParams& p, const Cache& c, long long slot, int k) {
  if (k >= p.L) {
    const unsigned char* e = entry_byte(c, slot, p.k_pe_offset + (k - p.L) * p.k_pe_elem_bytes);
    if (p.k_pe_elem_bytes == 1) return e4m3(*e) * p.k_scale;
    return widen<kBf16>(static_cast<unsigned short>(e[0] | (e[1] << 8)));
  }
  const unsigned char* e = entry_byte(c, slot, p.kv_c_offset + k * p.kv_c_elem_bytes);
  if (p.kv_c_elem_bytes == 2) return widen<kBf16>(static_cast<unsigned short>(e[0] | (e[1] << 8)));
  float s = p.k_scale;
  if (p.scale_elem_bytes == 4) {
    const unsigned char* f = entry_byte(c, slot, p.scale_offset + 4 * (k / p.scale_tile));
    s = __uint_as_float(f[0] | (f[1] << 8) | (f[2] << 16) | (static_cast<unsigned>(f[3]) << 24));
  } else if (p.scale_elem_bytes == 1) {
    s = exp2f(static_cast<float>(*entry_byte(c, slot, p.scale_offset + k / p.scale_tile)) - 127.f);
  }
  return e4m3(*e) * s;
}

// Key j of token t's row: its cache and slot, or slot -1 for none.
__device__ long long row_key(const SparseParams& p, int t, int b, int first, int n_main, int j, bool& extra) {
  extra = j >= n_main;
  if (extra) {
    const int s = p.extra_indices[static_cast<long long>(t) * p.K2 + (j - n_main)];
    return s;
  }
  if (p.window == 0) return p.indices[static_cast<long long>(t) * p.K + j];
  const int pos = first + j;  // V4: the window, read through the block table
  return static_cast<long long>(p.table[static_cast<long long>(b) * p.W + pos / p.main.block_size]) * p.main.block_size +
         pos % p.main.block_size;
}

template <bool kBf16>
__global__ void __launch_bounds__(kWarps * 32) sparse_kernel(SparseParams p) {
  extern __shared__ float smem[];
  const int D = p.L + p.R;
  float* q = smem;                  // [D]
  float* warp_m = q + D;            // [kWarps]
  float* warp_l = warp_m + kWarps;  // [kWarps]
  float* warp_o = warp_l + kWarps;  // [kWarps, Dv]
  const int row = blockIdx.x, t = row / p.N, n = row % p.N;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  int b = 0;
  while (b + 1 < p.B && p.qsl[b + 1] <= t) ++b;
  int first = 0, n_main = 0;
  if (p.window > 0) {
    const int pos = p.seq_lens[b] - (p.qsl[b + 1] - p.qsl[b]) + (t - p.qsl[b]);
    first = max(0, pos - p.window + 1);
    n_main = pos < 0 ? 0 : pos - first + 1;
  } else {
    n_main = p.topk_length ? min(p.topk_length[t], p.K) : p.K;
  }
  const int n_extra = p.extra.data == nullptr || p.extra_indices == nullptr
                          ? 0
                          : (p.extra_topk_length ? min(p.extra_topk_length[t], p.K2) : p.K2);

  for (int i = threadIdx.x; i < D; i += blockDim.x) q[i] = widen<kBf16>(p.q[(static_cast<long long>(t) * p.N + n) * D + i]);
  __syncthreads();

  float m = -INFINITY, l = 0.f, o[kMaxD / 32];
#pragma unroll
  for (int k = 0; k < kMaxD / 32; ++k) o[k] = 0.f;
  for (int j = warp; j < n_main + n_extra; j += kWarps) {
    bool extra = false;
    const long long slot = row_key(p, t, b, first, n_main, j, extra);
    if (slot < 0) continue;  // -1: no key
    const Cache& c = extra ? p.extra : p.main;
    float dot = 0.f;
    for (int i = lane; i < D; i += 32) dot += q[i] * key_elem<kBf16>(p, c, slot, i);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float x = dot * p.scale, m_new = fmaxf(m, x);
    const float cs = __expf(m - m_new), w = __expf(x - m_new);
    l = l * cs + w;
#pragma unroll
    for (int k = 0; k < kMaxD / 32; ++k)
      if (lane + 32 * k < p.Dv) o[k] = o[k] * cs + w * key_elem<kBf16>(p, c, slot, lane + 32 * k);
    m = m_new;
  }
  if (lane == 0) warp_m[warp] = m, warp_l[warp] = l;
#pragma unroll
  for (int k = 0; k < kMaxD / 32; ++k)
    if (lane + 32 * k < p.Dv) warp_o[warp * p.Dv + lane + 32 * k] = o[k];
  __syncthreads();

  const long long out = (static_cast<long long>(t) * p.N + n) * p.Dv;
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, warp_m[w]);
  if (M == -INFINITY) {  // a row with no key: o = 0, lse = -inf
    for (int i = threadIdx.x; i < p.Dv; i += blockDim.x) p.o[out + i] = narrow<kBf16>(0.f);
    if (threadIdx.x == 0) p.lse[static_cast<long long>(t) * p.N + n] = -INFINITY;
    return;
  }
  float total = 0.f;
  for (int w = 0; w < kWarps; ++w) total += warp_l[w] * __expf(warp_m[w] - M);  // a warp with no key adds 0
  const float lse = M + logf(total);
  // The sink joins the denominator with no value: o * 1 / (1 + exp(sink - lse)).
  const float keep = p.sink ? 1.f / (1.f + __expf(p.sink[n] - lse)) : 1.f;
  for (int i = threadIdx.x; i < p.Dv; i += blockDim.x) {
    float acc = 0.f;
    for (int w = 0; w < kWarps; ++w) acc += warp_o[w * p.Dv + i] * __expf(warp_m[w] - M);
    p.o[out + i] = narrow<kBf16>(acc / total * keep);
  }
  if (threadIdx.x == 0) p.lse[static_cast<long long>(t) * p.N + n] = lse;
}

bool given(const DLTensor& t) { return t.data != nullptr && t.ndim > 0; }

// A cache tensor's layout: [num_blocks, block_size, entry_bytes] or fp8_v4's [num_blocks, block_bytes].
Cache cache_of(const DLTensor& t, const mlagate_problem* p, int block_size) {
  Cache c{};
  c.data = static_cast<const unsigned char*>(t.data);
  c.block_size = block_size;
  c.bytes = p->entry.bytes;
  c.data_bytes = p->data_bytes ? p->data_bytes : p->entry.bytes;
  c.block_bytes = t.ndim == 3 ? t.shape[1] * t.shape[2] : t.shape[1];
  return c;
}

int32_t sparse_supports(void*, const mlagate_problem* p, char* reason, size_t size) {
  if (p->struct_size < sizeof(mlagate_problem)) {
    std::snprintf(reason, size, "needs a host of plugin ABI 1.2");
    return 0;
  }
  if (p->kv_lora_rank + p->rope_dim > kMaxD) {
    std::snprintf(reason, size, "L + R = %d > %d", p->kv_lora_rank + p->rope_dim, kMaxD);
    return 0;
  }
  return 1;
}

int32_t sparse_run(void*, const mlagate_problem* p, const mlagate_args* args, char* msg, size_t size) {
  if (p->struct_size < sizeof(mlagate_problem) || args->struct_size < sizeof(mlagate_args))
    return say(msg, size, "example.cuda_sparse needs a host of plugin ABI 1.2", MLAGATE_STATUS_NOT_SUPPORTED);
  if (p->op != MLAGATE_OP_SPARSE_DECODE)
    return say(msg, size, "example.cuda_sparse implements sparse_decode only", MLAGATE_STATUS_NOT_SUPPORTED);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return say(msg, size, "no CUDA device", MLAGATE_STATUS_UNAVAILABLE);
  const mlagate_sparse_decode_args& a = args->sparse_decode;
  if (a.q.device.device_type != kDLCUDA || a.q.ndim != 3 || a.o.ndim != 3 || a.block_table.ndim != 2 ||
      a.q.shape[2] != p->kv_lora_rank + p->rope_dim || a.o.shape[2] != p->value_dim || p->value_dim > kMaxD ||
      (p->window == 0 && (!given(a.indices) || a.indices.ndim != 2)))
    return say(msg, size, "sparse_decode: unexpected tensors", MLAGATE_STATUS_ERROR);
  SparseParams k{};
  k.q = static_cast<const unsigned short*>(a.q.data);
  k.main = cache_of(a.kv_cache, p, p->block_size);
  if (given(a.extra_kv_cache)) k.extra = cache_of(a.extra_kv_cache, p, p->extra_block_size);
  k.table = static_cast<const int*>(a.block_table.data);
  k.seq_lens = static_cast<const int*>(a.seq_lens.data);
  k.qsl = static_cast<const int*>(a.query_start_loc.data);
  k.indices = given(a.indices) ? static_cast<const int*>(a.indices.data) : nullptr;
  k.topk_length = given(a.topk_length) ? static_cast<const int*>(a.topk_length.data) : nullptr;
  k.extra_indices = given(a.extra_indices) ? static_cast<const int*>(a.extra_indices.data) : nullptr;
  k.extra_topk_length = given(a.extra_topk_length) ? static_cast<const int*>(a.extra_topk_length.data) : nullptr;
  k.sink = given(a.sink) ? static_cast<const float*>(a.sink.data) : nullptr;
  k.o = static_cast<unsigned short*>(a.o.data);
  k.lse = static_cast<float*>(a.lse.data);
  k.B = p->num_requests;
  k.N = p->num_heads;
  k.L = p->kv_lora_rank;
  k.R = p->rope_dim;
  k.Dv = p->value_dim;
  k.W = static_cast<int>(a.block_table.shape[1]);
  k.K = k.indices ? static_cast<int>(a.indices.shape[1]) : 0;
  k.K2 = k.extra_indices ? static_cast<int>(a.extra_indices.shape[1]) : 0;
  k.window = p->window;
  k.kv_c_offset = p->entry.kv_c_offset;
  k.kv_c_elem_bytes = p->entry.kv_c_elem_bytes;
  k.k_pe_offset = p->entry.k_pe_offset;
  k.k_pe_elem_bytes = p->entry.k_pe_elem_bytes;
  k.scale_offset = p->entry.scale_offset;
  k.scale_elem_bytes = p->scale_elem_bytes;
  k.scale_tile = p->scale_tile;
  k.scale = static_cast<float>(p->scale);
  k.k_scale = p->k_scale;
  const int rows = p->num_tokens * p->num_heads;
  if (rows == 0) return MLAGATE_STATUS_OK;
  const size_t smem = sizeof(float) * (k.L + k.R + 2 * kWarps + kWarps * k.Dv);
  const auto stream = static_cast<cudaStream_t>(args->stream);
  const cudaError_t attr = p->dtype == MLAGATE_DTYPE_BF16
                               ? cudaFuncSetAttribute(sparse_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)
                               : cudaFuncSetAttribute(sparse_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (attr != cudaSuccess) return say(msg, size, cudaGetErrorString(attr), MLAGATE_STATUS_ERROR);
  if (p->dtype == MLAGATE_DTYPE_BF16)
    sparse_kernel<true><<<rows, kWarps * 32, smem, stream>>>(k);
  else
    sparse_kernel<false><<<rows, kWarps * 32, smem, stream>>>(k);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return say(msg, size, cudaGetErrorString(e), MLAGATE_STATUS_ERROR);
  return MLAGATE_STATUS_OK;
}

const int32_t kBlockSizes[] = {64, 16, 32, 128, 1};  // the first is the preferred one

mlagate_backend make_backend() {
  mlagate_backend b{};
  b.name = "example.cuda_decode";
  b.description = "example plugin: MLA decode as a CUDA kernel on device pointers, fp32 accumulation";
  b.ops = MLAGATE_OP_DECODE;
  b.block_sizes = kBlockSizes;
  b.num_block_sizes = sizeof kBlockSizes / sizeof kBlockSizes[0];
  b.query_len_support = MLAGATE_QUERY_LEN_VARLEN;
  b.reorder_threshold = 1 << 20;  // every request is a decode
  b.dtypes = MLAGATE_DTYPE_BF16 | MLAGATE_DTYPE_F16;
  b.kv_cache_dtypes = MLAGATE_KV_AUTO | MLAGATE_KV_FP8 | MLAGATE_KV_FP8_E4M3;
  b.device = DLDevice{kDLCUDA, 0};
  b.supports = supports;
  b.run = run;
  // run() launches on args->stream only and reads seq_lens, the table and the
  // query offsets from the args' buffers: it can be captured as it is (ABI 1.1).
  b.graph_ops = MLAGATE_OP_DECODE;
  // q_lat, q_pe, o_lat and lse are read and written through their DLTensor
  // strides (row_strides), as vLLM's views come (ABI 1.3).
  b.strided_views = 1;
  return b;
}

mlagate_backend make_sparse_backend() {
  mlagate_backend b{};
  b.name = "example.cuda_sparse";
  b.description = "example plugin: DeepSeek V3.2/V4 sparse decode as a CUDA kernel, fp32 accumulation";
  b.ops = MLAGATE_OP_SPARSE_DECODE;
  b.block_sizes = kBlockSizes;
  b.num_block_sizes = sizeof kBlockSizes / sizeof kBlockSizes[0];
  b.query_len_support = MLAGATE_QUERY_LEN_VARLEN;
  b.reorder_threshold = 1;
  b.dtypes = MLAGATE_DTYPE_BF16 | MLAGATE_DTYPE_F16;
  b.kv_cache_dtypes = MLAGATE_KV_AUTO | MLAGATE_KV_FP8 | MLAGATE_KV_FP8_E4M3 | MLAGATE_KV_FP8_DS_MLA | MLAGATE_KV_FP8_V4;
  b.device = DLDevice{kDLCUDA, 0};
  b.supports = sparse_supports;
  b.run = sparse_run;
  return b;
}

const mlagate_backend kBackends[] = {make_backend(), make_sparse_backend()};
const mlagate_plugin kPlugin = {MLAGATE_PLUGIN_ABI_VERSION, sizeof(mlagate_plugin), "mla_decode_cuda_example", 2, kBackends,
                                MLAGATE_PLUGIN_ABI_MINOR, sizeof(mlagate_backend)};

}  // namespace

// Tests reuse this kernel in plugins of their own (tests/reliability) and
// define this to export their own entry instead.
#ifndef MLA_DECODE_CUDA_EXAMPLE_NO_ENTRY
extern "C" const mlagate_plugin* mlagate_plugin_entry(void) { return &kPlugin; }
#endif
