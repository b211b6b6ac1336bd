// The paged attention engine on the GPU, below both of its users: the CUDA
// backends (backends/cuda, Acc = float) and the GPU fp64 reference
// (reference/cuda, Acc = double) instantiate this one template. One thread
// block takes a group of up to kGroupRows query rows that share one key
// sequence (rows of one request in decode, tokens of one (request, head) in
// prefill), walks a range of its keys in tiles of kTileKeys with an online
// softmax, and hands the normalized rows and their LSE to a sink. Problems say
// where queries, keys and values are (paged latent cache, contiguous per-head
// tensors, case inputs); sinks say where results go (model-dtype outputs, fp32
// split partials, fp64 reference). kRoundP rounds the probabilities to the
// model dtype before P@V (what a 16-bit tensor-core MMA sees); the row sum
// uses the unrounded values.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cases/errors.h"
#include "gpu/device.h"
#include "gpu/kv_format.cuh"

namespace mlagate::gpu {

constexpr int kThreads = 256;
constexpr int kGroupRows = 16;  // G: rows per block
constexpr int kTileKeys = 16;   // KT: keys per tile; G * KT == kThreads (one logit per thread)
constexpr int kValueColsPerThread = 2;
constexpr int kMaxValueDim = kValueColsPerThread * kThreads;  // dv <= 512
static_assert(kGroupRows * kTileKeys == kThreads);

// Rows [first_row, first_row + rows) of one request (and, for prefill, one head).
struct RowGroup {
  int request;
  int first_row;
  int rows;
  int head;  // prefill: the head of every row; decode: unused (row r is token r / N, head r % N)
};

// Row groups of a decode call: each request's rows r = u * N + n cut into
// groups of kGroupRows (host code; the CUDA backends and the GPU reference
// both launch decode-shaped problems).
inline std::vector<RowGroup> decode_row_groups(std::span<const std::int32_t> query_start, int heads) {
  std::vector<RowGroup> groups;
  for (std::size_t b = 0; b + 1 < query_start.size(); ++b) {
    const int rows = (query_start[b + 1] - query_start[b]) * heads;
    for (int r = 0; r < rows; r += kGroupRows)
      groups.push_back({static_cast<int>(b), r, std::min(kGroupRows, rows - r), 0});
  }
  return groups;
}

template <class Acc>
__device__ __forceinline__ Acc neg_inf();
template <>
__device__ __forceinline__ float neg_inf<float>() {
  return -__int_as_float(0x7f800000);
}
template <>
__device__ __forceinline__ double neg_inf<double>() {
  return -__longlong_as_double(0x7ff0000000000000ll);
}

__device__ __forceinline__ float acc_exp(float x) { return expf(x); }
__device__ __forceinline__ double acc_exp(double x) { return exp(x); }
__device__ __forceinline__ float acc_log(float x) { return logf(x); }
__device__ __forceinline__ double acc_log(double x) { return log(x); }

// fp32 -> model dtype -> fp32, round to nearest even (cases/encoding.h's rule).
__device__ __forceinline__ float round_to_model(float x, bool bf16) {
  return bf16 ? __bfloat162float(__float2bfloat16_rn(x)) : __half2float(__float2half_rn(x));
}
__device__ __forceinline__ double round_to_model(double x, bool bf16) {
  return round_to_model(static_cast<float>(x), bf16);
}
__device__ __forceinline__ std::uint16_t to_model_bits(float x, bool bf16) {
  return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
}

__device__ __forceinline__ int clamp_visible(int v, int n) { return v < 0 ? 0 : (v > n ? n : v); }

// Dynamic shared memory of one block, in Acc elements.
__host__ __device__ inline int smem_elems(int dk, int dv, bool values_in_keys) {
  return kGroupRows * (dk + 1) + kTileKeys * (dk + 1) + (values_in_keys ? 0 : kTileKeys * (dv + 1)) +
         kGroupRows * kTileKeys;
}

// One logit: query row q against key kk over dk elements in four interleaved
// partial sums, summed pairwise and scaled.
template <class Acc>
__device__ __forceinline__ Acc tile_logit(const Acc* q, const Acc* kk, int dk, double scale) {
  Acc d0 = 0, d1 = 0, d2 = 0, d3 = 0;
  int e = 0;
  for (; e + 4 <= dk; e += 4) {
    d0 += q[e] * kk[e];
    d1 += q[e + 1] * kk[e + 1];
    d2 += q[e + 2] * kk[e + 2];
    d3 += q[e + 3] * kk[e + 3];
  }
  for (; e < dk; ++e) d0 += q[e] * kk[e];
  return ((d0 + d1) + (d2 + d3)) * static_cast<Acc>(scale);
}

// The engine. grid.x: row groups; grid.y: splits of each request's keys
// (split s covers keys [s * len, (s + 1) * len) with len = the request's key
// count / grid.y rounded up to whole tiles). Rows with no visible key in the
// range give o = 0 and lse = -inf.
template <class Problem, class Sink, class Acc, bool kRoundP>
__global__ void __launch_bounds__(kThreads) attention_kernel(const Problem pb, const Sink sink, const RowGroup* groups) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* qs = reinterpret_cast<Acc*>(smem_raw);  // [G][dk + 1]
  const int dk = pb.dk, dv = pb.dv;
  const int kstride = dk + 1, vstride = Problem::kValuesInKeys ? kstride : dv + 1;
  Acc* ks = qs + kGroupRows * kstride;  // [KT][dk + 1]
  Acc* vs = Problem::kValuesInKeys ? ks : ks + kTileKeys * kstride;  // [KT][dv + 1] (or the keys' first dv columns)
  Acc* ps = (Problem::kValuesInKeys ? ks + kTileKeys * kstride : vs + kTileKeys * vstride);  // [G][KT]
  __shared__ Acc row_m[kGroupRows], row_l[kGroupRows], row_corr[kGroupRows];
  __shared__ int row_vis[kGroupRows];
  __shared__ long long tile_key[kTileKeys];

  const RowGroup grp = groups[blockIdx.x];
  const int tid = threadIdx.x;
  if (tid < kGroupRows) {
    row_vis[tid] = tid < grp.rows ? pb.visible(grp, grp.first_row + tid) : 0;
    row_m[tid] = neg_inf<Acc>();
    row_l[tid] = Acc(0);
  }
  for (int g = 0; g < kGroupRows; ++g)
    for (int e = tid; e < dk; e += kThreads)
      qs[g * kstride + e] = g < grp.rows ? pb.template query<Acc>(grp, grp.first_row + g, e) : Acc(0);
  __syncthreads();

  int kmax = 0;
  for (int g = 0; g < kGroupRows; ++g) kmax = max(kmax, row_vis[g]);
  // This block's key range: its split of the request's keys, never past the
  // last key a row of the group sees (keys past a request's end are never read).
  const int nkeys = pb.key_count(grp);
  const int splits = gridDim.y;
  int split_len = (nkeys + splits - 1) / splits;
  split_len = (split_len + kTileKeys - 1) / kTileKeys * kTileKeys;
  const int begin = min(nkeys, static_cast<int>(blockIdx.y) * split_len);
  const int end = min(kmax, begin + split_len);

  const int my_g = tid / kTileKeys, my_k = tid % kTileKeys;
  Acc acc[kGroupRows][kValueColsPerThread];
#pragma unroll
  for (int g = 0; g < kGroupRows; ++g)
#pragma unroll
    for (int c = 0; c < kValueColsPerThread; ++c) acc[g][c] = Acc(0);

  for (int j0 = begin; j0 < end; j0 += kTileKeys) {
    const int nk = min(kTileKeys, end - j0);
    if (tid < kTileKeys) tile_key[tid] = tid < nk ? pb.key_row(grp, j0 + tid) : -1;
    __syncthreads();
    for (int k = 0; k < kTileKeys; ++k) {
      const long long row = tile_key[k];
      for (int e = tid; e < dk; e += kThreads) ks[k * kstride + e] = row >= 0 ? pb.template key<Acc>(row, e) : Acc(0);
      if (!Problem::kValuesInKeys)
        for (int d = tid; d < dv; d += kThreads) vs[k * vstride + d] = row >= 0 ? pb.template value<Acc>(row, d) : Acc(0);
    }
    __syncthreads();

    // One logit per thread: row my_g, key my_k; masked keys are -inf.
    Acc s = neg_inf<Acc>();
    if (my_g < grp.rows && my_k < nk && j0 + my_k < row_vis[my_g])
      s = tile_logit(qs + my_g * kstride, ks + my_k * kstride, dk, pb.scale);
    ps[my_g * kTileKeys + my_k] = s;
    __syncthreads();

    if (tid < kGroupRows) {  // online softmax, one thread per row
      Acc* p = ps + tid * kTileKeys;
      const Acc m_old = row_m[tid];
      Acc m_new = m_old;
      for (int k = 0; k < kTileKeys; ++k) m_new = p[k] > m_new ? p[k] : m_new;
      Acc corr = Acc(1), sum = Acc(0);
      if (m_new == neg_inf<Acc>()) {
        for (int k = 0; k < kTileKeys; ++k) p[k] = Acc(0);
      } else {
        corr = acc_exp(m_old - m_new);  // 0 when m_old is -inf
        for (int k = 0; k < kTileKeys; ++k) {
          const Acc e = acc_exp(p[k] - m_new);
          sum += e;
          p[k] = kRoundP ? round_to_model(e, pb.bf16) : e;
        }
      }
      row_l[tid] = row_l[tid] * corr + sum;
      row_m[tid] = m_new;
      row_corr[tid] = corr;
    }
    __syncthreads();

    // acc = acc * corr + P @ V; each thread owns value columns tid + c * kThreads.
#pragma unroll
    for (int c = 0; c < kValueColsPerThread; ++c) {
      const int d = tid + c * kThreads;
      if (d < dv) {
        Acc v[kTileKeys];
#pragma unroll
        for (int k = 0; k < kTileKeys; ++k) v[k] = vs[k * vstride + d];
#pragma unroll
        for (int g = 0; g < kGroupRows; ++g) {
          Acc a = acc[g][c] * row_corr[g];
#pragma unroll
          for (int k = 0; k < kTileKeys; ++k) a += ps[g * kTileKeys + k] * v[k];
          acc[g][c] = a;
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int g = 0; g < kGroupRows; ++g) {
    if (g < grp.rows) {
      const Acc l = row_l[g];
#pragma unroll
      for (int c = 0; c < kValueColsPerThread; ++c) {
        const int d = tid + c * kThreads;
        if (d < dv) sink.store_o(pb.flat_row(grp, grp.first_row + g), blockIdx.y, d, l > Acc(0) ? acc[g][c] / l : Acc(0));
      }
    }
  }
  if (tid < grp.rows) {
    const Acc l = row_l[tid];
    sink.store_lse(pb.flat_row(grp, grp.first_row + tid), blockIdx.y, l > Acc(0) ? row_m[tid] + acc_log(l) : neg_inf<Acc>());
  }
  if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) sink.after();
}

// The row rule of decode-shaped problems (the paged decode and the reference's
// MQA core): rows r = u * N + n of request b (token u, head n); token u of a
// request of s keys and q_len tokens sees keys 0 .. s - q_len + u.
__device__ __forceinline__ int decode_visible(const std::int32_t* seq_lens, const std::int32_t* query_start, int heads,
                                              const RowGroup& g, int r) {
  const int b = g.request, s = seq_lens[b], q_len = query_start[b + 1] - query_start[b];
  return clamp_visible(s - q_len + r / heads + 1, s);
}
__device__ __forceinline__ long long decode_flat_row(const std::int32_t* query_start, int heads, const RowGroup& g, int r) {
  return static_cast<long long>(query_start[g.request]) * heads + r;
}

// Where flat row f = t * heads + h of a [T, N, width] tensor starts, in
// elements, for the strided views of layout strided (cases/LAYOUTS.md): a
// token stride and a head stride. heads == 0 (the default) is the packed
// layout, row f at f * width.
struct RowStrides {
  long long token = 0, head = 0;
  int heads = 0;
  __host__ __device__ long long at(long long f, long long width) const {
    return heads ? (f / heads) * token + (f % heads) * head : f * width;
  }
};

// Decode over the paged cache: rows r = u * N + n of request b (token u, head n),
// query [q_lat | q_pe], keys = the cache entries through the block table,
// values = the first L elements of each key.
struct PagedDecodeProblem {
  static constexpr bool kValuesInKeys = true;
  const std::uint16_t* q_lat;  // [T, N, L]
  const std::uint16_t* q_pe;   // [T, N, R]
  const unsigned char* cache;  // [num_blocks, block_size, entry_bytes]
  const std::int32_t* block_table;  // [rows, width]
  const std::int32_t* seq_lens;     // [B]
  const std::int32_t* query_start;  // [B + 1]
  const std::int32_t* table_rows;   // [B]
  int table_width, block_size;
  KvFormat kv;  // entry layout and dequantization
  int heads, L, R;
  int dk, dv;  // L + R, L
  double scale;
  bool bf16;
  RowStrides q_lat_rows, q_pe_rows;  // packed unless the views are strided

  __device__ int key_count(const RowGroup& g) const { return seq_lens[g.request]; }
  __device__ int visible(const RowGroup& g, int r) const { return decode_visible(seq_lens, query_start, heads, g, r); }
  __device__ long long flat_row(const RowGroup& g, int r) const { return decode_flat_row(query_start, heads, g, r); }
  template <class Acc>
  __device__ Acc query(const RowGroup& g, int r, int e) const {
    const long long f = flat_row(g, r);
    const std::uint16_t bits = e < L ? q_lat[q_lat_rows.at(f, L) + e] : q_pe[q_pe_rows.at(f, R) + (e - L)];
    return static_cast<Acc>(model_to_float(bits, bf16));
  }
  __device__ long long key_row(const RowGroup& g, int j) const {
    const int block = block_table[static_cast<long long>(table_rows[g.request]) * table_width + j / block_size];
    return static_cast<long long>(block) * block_size + j % block_size;  // the slot
  }
  template <class Acc>
  __device__ Acc key(long long slot, int e) const {
    return static_cast<Acc>(kv.load(cache + slot * kv.entry_bytes, e));
  }
  template <class Acc>
  __device__ Acc value(long long slot, int d) const {
    return key<Acc>(slot, d);
  }
};

// Prefill over contiguous per-head keys and values: rows are the tokens u of
// request b for one head h; bottom-right causal (u sees keys 0 .. k_len - q_len + u).
struct PrefillProblem {
  static constexpr bool kValuesInKeys = false;
  const std::uint16_t* q;  // [T, N, dqk]
  const std::uint16_t* k;  // [Sk, N, dqk]
  const std::uint16_t* v;  // [Sk, N, dv]
  const std::int32_t* cu_q;  // [B + 1]
  const std::int32_t* cu_k;  // [B + 1]
  int heads;
  int dk, dv;
  bool causal;
  double scale;
  bool bf16;

  __device__ int key_count(const RowGroup& g) const { return cu_k[g.request + 1] - cu_k[g.request]; }
  __device__ int visible(const RowGroup& g, int r) const {
    const int k_len = key_count(g), q_len = cu_q[g.request + 1] - cu_q[g.request];
    return causal ? clamp_visible(k_len - q_len + r + 1, k_len) : k_len;
  }
  __device__ long long flat_row(const RowGroup& g, int r) const {
    return (static_cast<long long>(cu_q[g.request]) + r) * heads + g.head;
  }
  template <class Acc>
  __device__ Acc query(const RowGroup& g, int r, int e) const {
    return static_cast<Acc>(model_to_float(q[flat_row(g, r) * dk + e], bf16));
  }
  __device__ long long key_row(const RowGroup& g, int j) const {
    return (static_cast<long long>(cu_k[g.request]) + j) * heads + g.head;
  }
  template <class Acc>
  __device__ Acc key(long long row, int e) const {
    return static_cast<Acc>(model_to_float(k[row * dk + e], bf16));
  }
  template <class Acc>
  __device__ Acc value(long long row, int d) const {
    return static_cast<Acc>(model_to_float(v[row * dv + d], bf16));
  }
};

// The reference's MQA core: query rows of q_full [T, N, L+R] (fp64), keys
// [kv_c_j | k_pe_j] read from the case's inputs (request b's keys start at
// row kv_start[b]), values their kv_c part. fp8 caches: the keys are the
// dequantized values a correct reader sees (fp32), as in reference/fp64_reference.cpp.
struct LatentReferenceProblem {
  static constexpr bool kValuesInKeys = true;
  const double* q_full;           // [T, N, L+R]
  const std::uint16_t* kv_c;      // [S, L] model dtype (when kv_c_f32 is null)
  const std::uint16_t* k_pe;      // [S, R]
  const float* kv_c_f32;          // [S, L] fp8 caches: dequantized (else null)
  const float* k_pe_f32;          // [S, R]
  const std::int32_t* seq_lens;   // [B]
  const std::int32_t* query_start;  // [B + 1]
  const std::int32_t* kv_start;     // [B + 1]
  int heads, L, R;
  int dk, dv;
  double scale;
  bool bf16;

  template <class Acc>
  __device__ Acc query(const RowGroup& g, int r, int e) const {
    return static_cast<Acc>(q_full[flat_row(g, r) * dk + e]);
  }
  // Rows and keys by the decode rule (decode_visible), as PagedDecodeProblem's.
  __device__ long long flat_row(const RowGroup& g, int r) const { return decode_flat_row(query_start, heads, g, r); }
  __device__ int visible(const RowGroup& g, int r) const { return decode_visible(seq_lens, query_start, heads, g, r); }
  __device__ int key_count(const RowGroup& g) const { return seq_lens[g.request]; }
  __device__ long long key_row(const RowGroup& g, int j) const { return static_cast<long long>(kv_start[g.request]) + j; }
  template <class Acc>
  __device__ Acc key(long long row, int e) const {
    if (kv_c_f32) return static_cast<Acc>(e < L ? kv_c_f32[row * L + e] : k_pe_f32[row * R + (e - L)]);
    const std::uint16_t bits = e < L ? kv_c[row * L + e] : k_pe[row * R + (e - L)];
    return static_cast<Acc>(model_to_float(bits, bf16));
  }
  template <class Acc>
  __device__ Acc value(long long row, int d) const {
    return key<Acc>(row, d);
  }
};

// Test-only faults planted into the sinks (tests/device): production launches
// leave them at their defaults.
struct SinkFaults {
  long long skip_row = -1;      // this flat row's output is never written
  bool write_past_end = false;  // one element past the end of o is written
};

// Final outputs in the model dtype (o) and fp32 (lse).
struct ModelSink {
  std::uint16_t* o;  // [rows, dv]
  float* lse;        // [rows]
  int dv;
  long long rows;
  bool bf16;
  SinkFaults faults;
  RowStrides o_rows, lse_rows;  // packed unless the outputs are strided views

  template <class Acc>
  __device__ void store_o(long long row, int /*split*/, int d, Acc x) const {
    if (row == faults.skip_row) return;
    o[o_rows.at(row, dv) + d] = to_model_bits(static_cast<float>(x), bf16);
  }
  template <class Acc>
  __device__ void store_lse(long long row, int /*split*/, Acc x) const {
    lse[lse_rows.at(row, 1)] = static_cast<float>(x);
  }
  __device__ void after() const {
    if (faults.write_past_end) o[o_rows.at(rows - 1, dv) + dv] = 0;  // the element after the last row
  }
};

// Partials of split-KV in T: part_o [splits, rows, dv], part_lse [splits, rows].
// fp32 for the CUDA split-KV backend (PartialSink), fp64 for the GPU
// reference's split MQA core.
template <class T>
struct PartialSinkOf {
  T* part_o;
  T* part_lse;
  int dv;
  long long rows;

  template <class Acc>
  __device__ void store_o(long long row, int split, int d, Acc x) const {
    part_o[(split * rows + row) * dv + d] = static_cast<T>(x);
  }
  template <class Acc>
  __device__ void store_lse(long long row, int split, Acc x) const {
    part_lse[split * rows + row] = static_cast<T>(x);
  }
  __device__ void after() const {}
};
using PartialSink = PartialSinkOf<float>;

// fp64 results of the reference.
struct DoubleSink {
  double* o;    // [rows, dv]
  double* lse;  // [rows]
  int dv;

  template <class Acc>
  __device__ void store_o(long long row, int /*split*/, int d, Acc x) const {
    o[row * dv + d] = static_cast<double>(x);
  }
  template <class Acc>
  __device__ void store_lse(long long row, int /*split*/, Acc x) const {
    lse[row] = static_cast<double>(x);
  }
  __device__ void after() const {}
};

// Shared memory bytes of attention_kernel<Problem, *, Acc, *> for this problem;
// NotSupportedError when the dims do not fit the kernel.
template <class Problem, class Acc>
std::size_t attention_smem_bytes(const Problem& pb) {
  if (pb.dv > kMaxValueDim)
    throw NotSupportedError("value width " + std::to_string(pb.dv) + " > " + std::to_string(kMaxValueDim) +
                            " (the CUDA kernels keep up to " + std::to_string(kMaxValueDim) + " value columns per row)");
  const std::size_t bytes = static_cast<std::size_t>(smem_elems(pb.dk, pb.dv, Problem::kValuesInKeys)) * sizeof(Acc);
  if (bytes > static_cast<std::size_t>(max_dynamic_smem()))
    throw NotSupportedError("head size " + std::to_string(pb.dk) + " needs " + std::to_string(bytes) +
                            " bytes of shared memory per block, the device has " + std::to_string(max_dynamic_smem()));
  return bytes;
}

// Launches attention_kernel over num_groups row groups x splits key splits.
template <class Problem, class Sink, class Acc, bool kRoundP>
void launch_attention(const Problem& pb, const Sink& sink, const RowGroup* groups, int num_groups, int splits,
                      cudaStream_t s) {
  if (num_groups == 0) return;
  const std::size_t smem = attention_smem_bytes<Problem, Acc>(pb);
  auto kernel = attention_kernel<Problem, Sink, Acc, kRoundP>;
  MLAGATE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<dim3(static_cast<unsigned>(num_groups), static_cast<unsigned>(splits)), kThreads, smem, s>>>(pb, sink, groups);
  MLAGATE_CUDA_CHECK_LAUNCH();
}

// Resident blocks of that kernel per multiprocessor (for choosing split counts).
template <class Problem, class Sink, class Acc, bool kRoundP>
int attention_blocks_per_sm(const Problem& pb) {
  const std::size_t smem = attention_smem_bytes<Problem, Acc>(pb);
  auto kernel = attention_kernel<Problem, Sink, Acc, kRoundP>;
  MLAGATE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  int n = 0;
  MLAGATE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem));
  return n < 1 ? 1 : n;
}

}  // namespace mlagate::gpu
