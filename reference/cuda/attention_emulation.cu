// The baseline emulation's attention core on the GPU (cuda_emulate_attention,
// the AttentionEmulator --reference cuda sets): the fixed order of
// sdpa_emulation.h's EmulatedAttention, byte for byte what
// emulate_attention_fixed_order (reference/fixed_order_emulation.cpp) writes
// on the CPU. Three kernels a chunk of rows: the logits, the softmax, P @ V;
// the prefill form's K and V projected on the device from their latent rows
// by the row projector's kernels (row_projection_kernels.h: the glue's bits).
//
// Why the bits are the CPU's: every logit and every output element is one
// thread's __fmaf_rn chain in increasing depth from +0, over only its real
// terms (a tile's padding never enters a chain); the softmax's reductions are
// one warp per row, lane l over j = l, l + 32, ... in order, then the
// shuffle-xor tree the CPU replays (detail/emulation_math.h); every other
// step is an _rn intrinsic or integer code (the exponential and the
// roundings are emulation_math.h's, compiled here). No atomics, no split of
// a chain: the same bits on any GPU and at any size of the chunks. Built
// with -ftz=false (reference/cuda/CMakeLists.txt): subnormals are kept.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <vector>

#include "gpu/device.h"
#include "reference/cuda/cuda_reference.h"
#include "reference/cuda/row_projection_kernels.h"
#include "reference/detail/emulation_math.h"
#include "reference/detail/widen.h"
#include "reference/sdpa_emulation.h"

namespace mlagate {
namespace gpu {
namespace {

using namespace detail;

constexpr int kTile = 64;       // rows x keys (logits) or rows x columns (P @ V) a block
constexpr int kDepth = 16;      // depth step of the shared tiles
constexpr int kThreads = 256;   // 16 x 16, 4 x 4 outputs each
constexpr int kWarpsSoftmax = 8;
// Logits of one chunk of rows held at once (floats): 256 MiB.
constexpr long long kScratchFloats = 64ll << 20;

struct Args {
  const void* q;
  long long q_row, q_head;
  const void* k;
  long long k_row, k_head;
  const void* v;
  long long v_row, v_head;
  int elem;  // EmulatedAttention::Elem
  int rows, heads, rows_per_token, context, keys, dqk, dv;
  float scale;
  bool bf16;
  int r0, rc;  // the chunk: rows [r0, r0 + rc)
  float* s;    // [heads][rc][keys]: logits, then the rounded probabilities
  float* o;    // [rows][heads][dv]
  float* max;  // [rows][heads]
  float* sum;
};

__device__ __forceinline__ float element(const void* p, long long i, int elem) {
  if (elem == 0) return static_cast<const float*>(p)[i];
  const std::uint16_t u = static_cast<const std::uint16_t*>(p)[i];
  if (elem == 1) return __uint_as_float(static_cast<std::uint32_t>(u) << 16);
  return __half2float(__ushort_as_half(u));
}

__device__ __forceinline__ float max2(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return b > a ? b : a;
}

// s[h][r - r0][j] = the fma chain over d of q_r[d] * k_j[d]. A block skips the
// keys no row of its own sees.
__global__ void __launch_bounds__(kThreads) logits_kernel(Args a) {
  __shared__ float qs[kDepth][kTile + 1];  // [d][row]
  __shared__ float ks[kDepth][kTile + 1];  // [d][key]
  const int h = blockIdx.z;
  const int rb = a.r0 + blockIdx.y * kTile, kb = blockIdx.x * kTile;
  const int r_end = a.r0 + a.rc;
  const int last = min(rb + kTile, r_end) - 1;
  if (kb >= emu_visible(last, a.rows_per_token, a.context, a.keys)) return;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  for (int d0 = 0; d0 < a.dqk; d0 += kDepth) {
    for (int idx = tid; idx < kTile * kDepth; idx += kThreads) {
      const int t = idx / kDepth, d = idx % kDepth;
      const bool d_ok = d0 + d < a.dqk;
      qs[d][t] = d_ok && rb + t < r_end ? element(a.q, (rb + t) * a.q_row + h * a.q_head + d0 + d, a.elem) : 0.0f;
      ks[d][t] = d_ok && kb + t < a.keys ? element(a.k, (kb + t) * a.k_row + h * a.k_head + d0 + d, a.elem) : 0.0f;
    }
    __syncthreads();
    const int dn = min(kDepth, a.dqk - d0);  // only real terms enter a chain
    for (int d = 0; d < dn; ++d) {
      float qv[4], kv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) qv[i] = qs[d][ty + 16 * i], kv[i] = ks[d][tx + 16 * i];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = __fmaf_rn(qv[i], kv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = rb + ty + 16 * i;
    if (r >= r_end) continue;
    float* row = a.s + (static_cast<long long>(h) * a.rc + (r - a.r0)) * a.keys;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int key = kb + tx + 16 * j;
      if (key < a.keys) row[key] = acc[i][j];
    }
  }
}

// One warp a (head, row): max, exponentials, sum; the rounded probabilities
// replace the logits, the max and the sum go to the row's outputs.
__global__ void __launch_bounds__(kWarpsSoftmax * 32) softmax_kernel(Args a) {
  const long long g = static_cast<long long>(blockIdx.x) * kWarpsSoftmax + threadIdx.x / 32;
  if (g >= static_cast<long long>(a.heads) * a.rc) return;
  const int lane = threadIdx.x % 32;
  const int h = static_cast<int>(g / a.rc), r = a.r0 + static_cast<int>(g % a.rc);
  const int n = emu_visible(r, a.rows_per_token, a.context, a.keys);
  float* row = a.s + g * a.keys;
  const long long out = static_cast<long long>(r) * a.heads + h;
  if (n == 0) {
    if (lane == 0) a.max[out] = __uint_as_float(0xFF800000u), a.sum[out] = 0.0f;
    return;
  }
  float m = __uint_as_float(0xFF800000u);
  for (int j = lane; j < n; j += 32) m = max2(m, __fmul_rn(row[j], a.scale));
  for (int off = 16; off >= 1; off /= 2) m = max2(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  float sum = 0.0f;
  for (int j = lane; j < n; j += 32) {
    const float e = emu_exp(__fsub_rn(__fmul_rn(row[j], a.scale), m));
    sum = __fadd_rn(sum, e);
    row[j] = emu_round16(e, a.bf16);
  }
  for (int off = 16; off >= 1; off /= 2) sum = __fadd_rn(sum, __shfl_xor_sync(0xFFFFFFFFu, sum, off));
  if (lane == 0) a.max[out] = m, a.sum[out] = sum;
}

// o[r][h][c] = (the fma chain over the row's visible j of P_j * v_j[c]) / sum, rounded.
__global__ void __launch_bounds__(kThreads) pv_kernel(Args a) {
  __shared__ float ps[kDepth][kTile + 1];  // [j][row]
  __shared__ float vs[kDepth][kTile + 1];  // [j][column]
  const int h = blockIdx.z;
  const int rb = a.r0 + blockIdx.y * kTile, cb = blockIdx.x * kTile;
  const int r_end = a.r0 + a.rc;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  int n[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = rb + ty + 16 * i;
    n[i] = r < r_end ? emu_visible(r, a.rows_per_token, a.context, a.keys) : 0;
  }
  const int n_max = emu_visible(min(rb + kTile, r_end) - 1, a.rows_per_token, a.context, a.keys);
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  for (int j0 = 0; j0 < n_max; j0 += kDepth) {
    for (int idx = tid; idx < kTile * kDepth; idx += kThreads) {
      const int t = idx / kDepth, jj = idx % kDepth;
      const int j = j0 + jj;
      ps[jj][t] = j < n_max && rb + t < r_end ? a.s[(static_cast<long long>(h) * a.rc + (rb + t - a.r0)) * a.keys + j] : 0.0f;
    }
    for (int idx = tid; idx < kTile * kDepth; idx += kThreads) {
      const int jj = idx / kTile, t = idx % kTile;
      const int j = j0 + jj;
      vs[jj][t] = j < n_max && cb + t < a.dv ? element(a.v, j * a.v_row + h * a.v_head + cb + t, a.elem) : 0.0f;
    }
    __syncthreads();
    const int jn = min(kDepth, n_max - j0);
    for (int jj = 0; jj < jn; ++jj) {
      float pv[4], vv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) pv[i] = ps[jj][ty + 16 * i], vv[i] = vs[jj][tx + 16 * i];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (j0 + jj < n[i])  // the row's own keys only: no padded term in its chain
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[i][c] = __fmaf_rn(pv[i], vv[c], acc[i][c]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = rb + ty + 16 * i;
    if (r >= r_end) continue;
    const long long out = static_cast<long long>(r) * a.heads + h;
    const float sum = a.sum[out];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int col = cb + tx + 16 * c;
      if (col < a.dv) a.o[out * a.dv + col] = sum == 0.0f ? 0.0f : emu_round16(__fdiv_rn(acc[i][c], sum), a.bf16);
    }
  }
}

// Widens 16-bit rows to float on the device (exact): the latent rows the
// up-projection reads.
__global__ void widen_kernel(const std::uint16_t* __restrict__ in, long long n, bool bf16, float* __restrict__ out) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    out[i] = bf16 ? __uint_as_float(static_cast<std::uint32_t>(in[i]) << 16) : __half2float(__ushort_as_half(in[i]));
}

// What stays between calls: the stream, the buffers (grown to the largest
// call seen) and the last case's weights widened to float (as the row
// projector widens them), until cuda_release_attention_emulator.
struct Emulator {
  Stream stream;
  DeviceBuffer q, kv, s, o, max, sum;     // the calls' inputs and outputs, one after another
  DeviceBuffer latent, latent_f, k, v;    // one call's latent rows and its projected K and V
  DeviceBuffer w_uk, w_uv;                // float [L, N*P], [L, N*V]
  std::vector<std::byte> uk_bytes, uv_bytes;
  DType w_dtype = DType::kF32;

  void weights(const Case& c, cudaStream_t st) {
    const auto same = [](const std::vector<std::byte>& held, const Tensor& t) {
      return held.size() == t.nbytes() && std::memcmp(held.data(), t.bytes(), held.size()) == 0;
    };
    if (w_uk.size() && c.w_uk.dtype() == w_dtype && same(uk_bytes, c.w_uk) && same(uv_bytes, c.w_uv)) return;
    uk_bytes.clear();
    const auto widen = [](const Tensor& w) {
      std::vector<float> out(static_cast<std::size_t>(w.numel()));
      detail::widen_any(w.view(), 0, w.numel(), out.data());
      return out;
    };
    const std::vector<float> uk = widen(c.w_uk), uv = widen(c.w_uv);
    w_uk = upload_array(uk.data(), uk.size(), st);
    w_uv = upload_array(uv.data(), uv.size(), st);
    MLAGATE_CUDA_CHECK(cudaStreamSynchronize(st));  // the host vectors go out of scope
    w_dtype = c.w_uk.dtype();
    uk_bytes.assign(c.w_uk.bytes(), c.w_uk.bytes() + c.w_uk.nbytes());
    uv_bytes.assign(c.w_uv.bytes(), c.w_uv.bytes() + c.w_uv.nbytes());
  }
};

std::mutex g_mutex;
std::unique_ptr<Emulator> g_emulator;

void reserve(DeviceBuffer& b, std::size_t bytes) {
  if (b.size() < bytes) b = DeviceBuffer(bytes);
}

// Elements from the first to one past the last that rows/keys x heads read.
std::size_t span_of(int count, long long row, int heads, long long head, int width) {
  return count == 0 ? 0 : static_cast<std::size_t>((count - 1) * row + (heads - 1) * head + width);
}

// Where one call's inputs and outputs lie in the shared buffers (bytes for
// the inputs, elements for the outputs).
struct Placement {
  std::size_t q = 0, k = 0, v = 0, k_bytes = 0, v_bytes = 0, out = 0;
  bool v_in_k = false, project = false;
};

// The attention of one call, its inputs on the device.
void attend(Emulator& st, const EmulatedAttention& e, const void* q, const void* k, const void* v, std::size_t out,
            std::size_t o_at, cudaStream_t s) {
  Args a{};
  a.q = q, a.q_row = e.q_row, a.q_head = e.q_head;
  a.k = k, a.k_row = e.k_row, a.k_head = e.k_head;
  a.v = v, a.v_row = e.v_row, a.v_head = e.v_head;
  a.elem = static_cast<int>(e.elem);
  a.rows = e.rows, a.heads = e.heads, a.rows_per_token = e.rows_per_token, a.context = e.context, a.keys = e.keys;
  a.dqk = e.dqk, a.dv = e.dv, a.scale = e.scale, a.bf16 = e.bf16;
  a.o = st.o.as<float>() + o_at, a.max = st.max.as<float>() + out, a.sum = st.sum.as<float>() + out;
  // Rows in chunks whose logits fit the scratch (the bits do not depend on it).
  const long long per_row = std::max<long long>(1, static_cast<long long>(e.heads) * e.keys);
  const int chunk = static_cast<int>(std::clamp<long long>(kScratchFloats / per_row, 1, std::max(e.rows, 1)));
  a.s = st.s.as<float>();
  for (int r0 = 0; r0 < e.rows; r0 += chunk) {
    a.r0 = r0;
    a.rc = std::min(chunk, e.rows - r0);
    const int row_tiles = (a.rc + kTile - 1) / kTile;
    if (e.keys > 0) {
      logits_kernel<<<dim3((e.keys + kTile - 1) / kTile, row_tiles, e.heads), kThreads, 0, s>>>(a);
      MLAGATE_CUDA_CHECK_LAUNCH();
    }
    const long long warps = static_cast<long long>(e.heads) * a.rc;
    softmax_kernel<<<static_cast<unsigned>((warps + kWarpsSoftmax - 1) / kWarpsSoftmax), kWarpsSoftmax * 32, 0, s>>>(a);
    MLAGATE_CUDA_CHECK_LAUNCH();
    pv_kernel<<<dim3((e.dv + kTile - 1) / kTile, row_tiles, e.heads), kThreads, 0, s>>>(a);
    MLAGATE_CUDA_CHECK_LAUNCH();
  }
}

// Every call queued on the stream, one synchronization at the end: the
// inputs up (the prefill form's latent rows instead of their K and V where
// named), the kernels, the outputs down.
void emulate(Emulator& st, std::span<const EmulatedAttention> calls) {
  const cudaStream_t s = st.stream.get();
  std::vector<Placement> at(calls.size());
  std::size_t q_bytes = 0, kv_bytes = 0, outs = 0, scratch = 0;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const EmulatedAttention& e = calls[i];
    Placement& p = at[i];
    const std::size_t es = e.elem == EmulatedAttention::Elem::kF32 ? 4 : 2;
    p.project = e.latent && e.weights_of && e.keys > 0 && e.elem != EmulatedAttention::Elem::kF32;
    if (!p.project && e.keys > 0 && (!e.k || !e.v)) throw std::invalid_argument("cuda_emulate_attention: no keys");
    if (e.k_rows || e.v_rows) throw std::invalid_argument("cuda_emulate_attention: rows in pieces (a CPU call)");
    p.q = q_bytes;
    q_bytes += (span_of(e.rows, e.q_row, e.heads, e.q_head, e.dqk) * es + 255) / 256 * 256;
    if (!p.project) {
      p.k_bytes = span_of(e.keys, e.k_row, e.heads, e.k_head, e.dqk) * es;
      p.v_bytes = span_of(e.keys, e.v_row, e.heads, e.v_head, e.dv) * es;
      p.v_in_k = e.v == e.k && p.v_bytes <= p.k_bytes;
      p.k = kv_bytes;
      kv_bytes += (p.k_bytes + 255) / 256 * 256;
      if (!p.v_in_k) {
        p.v = kv_bytes;
        kv_bytes += (p.v_bytes + 255) / 256 * 256;
      }
    }
    p.out = outs;
    outs += static_cast<std::size_t>(e.rows) * e.heads;
    const long long per_row = std::max<long long>(1, static_cast<long long>(e.heads) * e.keys);
    const long long chunk = std::clamp<long long>(kScratchFloats / per_row, 1, std::max(e.rows, 1));
    scratch = std::max<std::size_t>(scratch, static_cast<std::size_t>(per_row * chunk));
  }
  // The outputs: one region, each call's at its `out` (o rows of its own dv).
  std::vector<std::size_t> o_at(calls.size());
  std::size_t o_floats = 0;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    o_at[i] = o_floats;
    o_floats += static_cast<std::size_t>(calls[i].rows) * calls[i].heads * calls[i].dv;
  }
  reserve(st.q, q_bytes);
  reserve(st.kv, kv_bytes);
  reserve(st.s, scratch * sizeof(float));
  reserve(st.o, o_floats * sizeof(float));
  reserve(st.max, outs * sizeof(float));
  reserve(st.sum, outs * sizeof(float));
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const EmulatedAttention& e = calls[i];
    const Placement& p = at[i];
    const std::size_t es = e.elem == EmulatedAttention::Elem::kF32 ? 4 : 2;
    st.q.upload(e.q, span_of(e.rows, e.q_row, e.heads, e.q_head, e.dqk) * es, s, p.q);
    if (!p.project && p.k_bytes) st.kv.upload(e.k, p.k_bytes, s, p.k);
    if (!p.project && p.v_bytes && !p.v_in_k) st.kv.upload(e.v, p.v_bytes, s, p.v);
  }
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const EmulatedAttention& e = calls[i];
    const Placement& p = at[i];
    const auto* q = reinterpret_cast<const std::byte*>(st.q.data()) + p.q;
    const void* k = reinterpret_cast<const std::byte*>(st.kv.data()) + p.k;
    const void* v = p.v_in_k ? k : reinterpret_cast<const std::byte*>(st.kv.data()) + p.v;
    if (p.project) {
      // K [keys, N, P+R] and V [keys, N, V] as the glue projects them (the row
      // projector's kernels: the CPU's bits), from the latent and rope rows.
      const Case& c = *e.weights_of;
      const int L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim, P = c.spec.dims.nope_dim;
      const int V = c.spec.dims.v_head_dim, N = e.heads, keys = e.keys;
      // The projected K and V are read in their own layout: the call must say it.
      if (e.dqk != P + R || e.dv != V || e.k_row != static_cast<long long>(N) * (P + R) || e.k_head != P + R ||
          e.v_row != static_cast<long long>(N) * V || e.v_head != V || (e.elem == EmulatedAttention::Elem::kBF16) != e.bf16)
        throw std::invalid_argument("cuda_emulate_attention: latent rows of another layout than the call's");
      st.weights(c, s);
      reserve(st.latent, static_cast<std::size_t>(keys) * (L + R) * 2);
      reserve(st.latent_f, static_cast<std::size_t>(keys) * L * sizeof(float));
      reserve(st.k, static_cast<std::size_t>(keys) * N * (P + R) * 2);
      reserve(st.v, static_cast<std::size_t>(keys) * N * V * 2);
      auto* lat = st.latent.as<std::uint16_t>();
      st.latent.upload(e.latent, static_cast<std::size_t>(keys) * L * 2, s);
      if (R > 0) st.latent.upload(e.rope, static_cast<std::size_t>(keys) * R * 2, s, static_cast<std::size_t>(keys) * L * 2);
      const long long n = static_cast<long long>(keys) * L;
      widen_kernel<<<static_cast<unsigned>(std::min<long long>((n + 255) / 256, 4096)), 256, 0, s>>>(lat, n, e.bf16,
                                                                                                  st.latent_f.as<float>());
      MLAGATE_CUDA_CHECK_LAUNCH();
      launch_projection_gemm(st.latent_f.as<float>(), keys, L, st.w_uk.as<float>(), N * P, P, P + R,
                             static_cast<long long>(N) * (P + R), e.bf16, st.k.as<std::uint16_t>(), s);
      launch_pe_broadcast(lat + static_cast<std::size_t>(keys) * L, keys, N, R, P + R, P, st.k.as<std::uint16_t>(), s);
      launch_projection_gemm(st.latent_f.as<float>(), keys, L, st.w_uv.as<float>(), N * V, V, V,
                             static_cast<long long>(N) * V, e.bf16, st.v.as<std::uint16_t>(), s);
      k = st.k.data();
      v = st.v.data();
    }
    attend(st, e, q, k, v, p.out, o_at[i], s);
  }
  std::vector<float> o(o_floats), mx(outs), sm(outs);
  if (o_floats) st.o.download(o.data(), o_floats * sizeof(float), s);
  if (outs) {
    st.max.download(mx.data(), outs * sizeof(float), s);
    st.sum.download(sm.data(), outs * sizeof(float), s);
  }
  MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const EmulatedAttention& e = calls[i];
    const std::size_t n = static_cast<std::size_t>(e.rows) * e.heads;
    std::copy_n(o.begin() + static_cast<std::ptrdiff_t>(o_at[i]), n * e.dv, e.o);
    std::copy_n(mx.begin() + static_cast<std::ptrdiff_t>(at[i].out), n, e.max);
    std::copy_n(sm.begin() + static_cast<std::ptrdiff_t>(at[i].out), n, e.sum);
  }
}

}  // namespace
}  // namespace gpu

void cuda_emulate_attention(std::span<const EmulatedAttention> calls) {
  using namespace gpu;
  for (const EmulatedAttention& e : calls)
    if (e.rows < 0 || e.heads < 1 || e.rows_per_token < 1 || e.keys < 0 || e.dqk < 1 || e.dv < 1)
      throw std::invalid_argument("cuda_emulate_attention: bad dimensions");
  if (calls.empty()) return;
  require_device();
  const std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_emulator) g_emulator = std::make_unique<Emulator>();
  try {
    emulate(*g_emulator, calls);
  } catch (...) {
    // Nothing queued may outlive the call (it reads the caller's memory).
    cudaStreamSynchronize(g_emulator->stream.get());
    g_emulator.reset();
    throw;
  }
}

void cuda_release_attention_emulator() {
  const std::lock_guard<std::mutex> lock(gpu::g_mutex);
  gpu::g_emulator.reset();
}

}  // namespace mlagate
