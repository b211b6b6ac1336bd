// The fp64 reference on the GPU: reference_absorbed and reference_mqa of
// reference/fp64_reference.cpp with the same math in double precision. W_UK absorption
// and the W_UV projection are batched fp64 GEMMs (one per head, each output a
// sequential sum), the MQA core is the attention engine with Acc = double,
// its keys split (reference_mqa_splits) where the row groups alone would
// leave the GPU idle, the splits merged through their LSEs in double.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cases/encoding.h"
#include "cases/errors.h"
#include "gpu/attention.cuh"
#include "reference/cuda/cuda_reference.h"

namespace mlagate {
namespace gpu {
namespace {

constexpr int kTile = 16;

__device__ __forceinline__ double load_elem(const std::uint16_t* p, long long i, bool bf16) {
  return static_cast<double>(model_to_float(p[i], bf16));
}
__device__ __forceinline__ double load_elem(const double* p, long long i, bool /*bf16*/) { return p[i]; }

// A strided matrix: element (i, j) of batch z at base + z * batch + i * row + j * col.
template <class T>
struct Mat {
  const T* base;
  long long batch, row, col;
};

// C[z] (M x Nc) = A[z] (M x K) x B[z] (K x Nc) in fp64, 16 x 16 tiles; each
// output is summed over k in order. Tiles are loaded along whichever index is
// contiguous in memory.
template <class TA, class TB>
__global__ void gemm_f64_kernel(int M, int Nc, int K, Mat<TA> A, Mat<TB> B, double* C, long long c_batch,
                                long long c_row, long long c_col, bool bf16) {
  __shared__ double As[kTile][kTile + 1];  // [i][k]
  __shared__ double Bs[kTile][kTile + 1];  // [k][j]
  const int z = blockIdx.z;
  const int i0 = blockIdx.y * kTile, j0 = blockIdx.x * kTile;
  const int idx = threadIdx.y * kTile + threadIdx.x;
  const int fast = idx % kTile, slow = idx / kTile;
  double acc = 0;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    {
      const int i = A.col == 1 ? slow : fast, k = A.col == 1 ? fast : slow;
      As[i][k] = (i0 + i < M && k0 + k < K)
                     ? load_elem(A.base, z * A.batch + (i0 + i) * A.row + (k0 + k) * A.col, bf16)
                     : 0.0;
    }
    {
      const int k = B.row == 1 ? fast : slow, j = B.row == 1 ? slow : fast;
      Bs[k][j] = (k0 + k < K && j0 + j < Nc)
                     ? load_elem(B.base, z * B.batch + (k0 + k) * B.row + (j0 + j) * B.col, bf16)
                     : 0.0;
    }
    __syncthreads();
    for (int k = 0; k < kTile; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  const int i = i0 + threadIdx.y, j = j0 + threadIdx.x;
  if (i < M && j < Nc) C[z * c_batch + i * c_row + j * c_col] = acc;
}

template <class TA, class TB>
void gemm_f64(int batch, int M, int Nc, int K, Mat<TA> A, Mat<TB> B, double* C, long long c_batch, long long c_row,
              long long c_col, bool bf16, cudaStream_t s) {
  if (batch == 0 || M == 0 || Nc == 0) return;
  const dim3 grid((Nc + kTile - 1) / kTile, (M + kTile - 1) / kTile, batch);
  gemm_f64_kernel<TA, TB><<<grid, dim3(kTile, kTile), 0, s>>>(M, Nc, K, A, B, C, c_batch, c_row, c_col, bf16);
  MLAGATE_CUDA_CHECK_LAUNCH();
}

// q_full[t, n, L + r] = q[t, n, P + r] (the rope part of every query).
__global__ void copy_q_pe_kernel(const std::uint16_t* q, double* q_full, long long rows, int P, int R, int L, bool bf16) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * R) return;
  const long long row = i / R;
  const int r = static_cast<int>(i % R);
  q_full[row * (L + R) + L + r] = load_elem(q, row * (P + R) + P + r, bf16);
}

// The case on the device, plus q_full [T, N, L+R] with its rope part filled.
struct DeviceCase {
  int B, T, N, L, R, P, V;
  bool bf16;
  DeviceBuffer q, kv_c, k_pe, w_uk, w_uv, meta, q_full;
  DeviceBuffer kv_c_f32, k_pe_f32;  // fp8 caches: the dequantized keys (empty otherwise)
  const std::int32_t* seq_lens() const { return meta.as<std::int32_t>(); }
  const std::int32_t* query_start() const { return seq_lens() + B; }
  const std::int32_t* kv_start() const { return query_start() + B + 1; }
};

void check_16bit(const Tensor& t, const char* name) {
  if (t.dtype() != DType::kBF16 && t.dtype() != DType::kF16)
    throw std::invalid_argument(std::string("cuda golden: ") + name + " is not a 16-bit model dtype");
}

void upload_case(const Case& c, DeviceCase& d, bool with_weights, cudaStream_t s) {
  const Dims& dims = c.spec.dims;
  d.B = c.num_requests;
  d.T = c.num_tokens;
  d.N = c.spec.num_heads();
  d.L = dims.kv_lora_rank;
  d.R = dims.rope_dim;
  d.P = dims.nope_dim;
  d.V = dims.v_head_dim;
  d.bf16 = c.spec.dtype == DType::kBF16;
  for (const auto& [t, name] : {std::pair{&c.q, "q"}, {&c.kv_c, "kv_c"}, {&c.k_pe, "k_pe"}, {&c.w_uk, "w_uk"},
                                {&c.w_uv, "w_uv"}})
    check_16bit(*t, name);
  auto up = [&](const Tensor& t) { return upload_array(reinterpret_cast<const std::uint16_t*>(t.bytes()), t.numel(), s); };
  d.q = up(c.q);
  // The dequantized cache is there when kv_c_cache is; k_pe_cache then has
  // k_pe's elements, none under NoPE MLA (R = 0), where it is empty too.
  const bool dequantized = !c.kv_c_cache.empty();
  if (dequantized ? c.k_pe_cache.numel() != c.k_pe.numel() : !c.k_pe_cache.empty())
    throw std::invalid_argument("cuda golden: kv_c_cache and k_pe_cache must both be set or both empty");
  if (!dequantized) {
    d.kv_c = up(c.kv_c);
    d.k_pe = up(c.k_pe);
  } else {
    if (c.kv_c_cache.dtype() != DType::kF32 || (c.k_pe_cache.numel() > 0 && c.k_pe_cache.dtype() != DType::kF32) ||
        c.kv_c_cache.numel() != c.kv_c.numel())
      throw std::invalid_argument("cuda golden: kv_c_cache / k_pe_cache must be float32 of the inputs' shapes");
    d.kv_c_f32 = upload_array(c.kv_c_cache.data<float>(), static_cast<std::size_t>(c.kv_c_cache.numel()), s);
    d.k_pe_f32 = upload_array(c.k_pe_cache.numel() > 0 ? c.k_pe_cache.data<float>() : nullptr,
                              static_cast<std::size_t>(c.k_pe_cache.numel()), s);
  }
  if (with_weights) {
    d.w_uk = up(c.w_uk);
    d.w_uv = up(c.w_uv);
  }
  std::vector<std::int32_t> meta(c.seq_lens.begin(), c.seq_lens.end());
  meta.insert(meta.end(), c.query_start_loc.begin(), c.query_start_loc.end());
  meta.insert(meta.end(), c.kv_start_loc.begin(), c.kv_start_loc.end());
  d.meta = upload_array(meta.data(), meta.size(), s);
  const long long rows = static_cast<long long>(d.T) * d.N;
  d.q_full = DeviceBuffer(static_cast<std::size_t>(rows) * (d.L + d.R) * sizeof(double));
  d.q_full.fill(0xFF, s);  // NaN until written
  if (rows * d.R > 0) {
    const long long n = rows * d.R;
    copy_q_pe_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(d.q.as<std::uint16_t>(), d.q_full.as<double>(),
                                                                           rows, d.P, d.R, d.L, d.bf16);
    MLAGATE_CUDA_CHECK_LAUNCH();
  }
}

// Row `blockIdx.x`: o = sum_s exp(lse_s - M) o_s / sum_s exp(lse_s - M) and
// lse = M + log(that sum), M the largest lse_s. A split with no visible key
// (lse -inf, o 0) adds nothing; a row no split saw gives o 0 and lse -inf,
// as the unsplit engine does. A NaN partial stays NaN.
__global__ void combine_partials_f64(const double* part_o, const double* part_lse, int splits, long long rows, int dv,
                                     double* o, double* lse) {
  const long long row = blockIdx.x;
  double m = -__longlong_as_double(0x7ff0000000000000ll);
  for (int sp = 0; sp < splits; ++sp) {
    const double x = part_lse[sp * rows + row];
    if (x > m || x != x) m = x;
  }
  const bool empty = m == -__longlong_as_double(0x7ff0000000000000ll);
  double sum = 0;
  if (!empty)
    for (int sp = 0; sp < splits; ++sp) sum += exp(part_lse[sp * rows + row] - m);
  for (int d = threadIdx.x; d < dv; d += blockDim.x) {
    double acc = 0;
    if (!empty)
      for (int sp = 0; sp < splits; ++sp)
        acc += exp(part_lse[sp * rows + row] - m) * part_o[(sp * rows + row) * dv + d];
    o[row * dv + d] = empty ? 0.0 : acc / sum;
  }
  if (threadIdx.x == 0) lse[row] = empty ? m : m + log(sum);
}

// o_lat [T, N, L] and lse [T, N] of the MQA core over q_full.
void mqa_core(const Case& c, const DeviceCase& d, DeviceBuffer& o_lat, DeviceBuffer& lse, cudaStream_t s) {
  const long long rows = static_cast<long long>(d.T) * d.N;
  o_lat = DeviceBuffer(static_cast<std::size_t>(rows) * d.L * sizeof(double));
  lse = DeviceBuffer(static_cast<std::size_t>(rows) * sizeof(double));
  o_lat.fill(0xFF, s);
  lse.fill(0xFF, s);
  const std::vector<RowGroup> groups = decode_row_groups(c.query_start_loc, d.N);
  const DeviceBuffer d_groups = upload_array(groups.data(), groups.size(), s);
  LatentReferenceProblem pb;
  pb.q_full = d.q_full.as<double>();
  pb.kv_c = d.kv_c.size() ? d.kv_c.as<std::uint16_t>() : nullptr;
  pb.k_pe = d.k_pe.size() ? d.k_pe.as<std::uint16_t>() : nullptr;
  pb.kv_c_f32 = d.kv_c_f32.size() ? d.kv_c_f32.as<float>() : nullptr;
  pb.k_pe_f32 = d.k_pe_f32.size() ? d.k_pe_f32.as<float>() : nullptr;
  pb.seq_lens = d.seq_lens();
  pb.query_start = d.query_start();
  pb.kv_start = d.kv_start();
  pb.heads = d.N;
  pb.L = d.L;
  pb.R = d.R;
  pb.dk = d.L + d.R;
  pb.dv = d.L;
  pb.scale = c.spec.softmax_scale();
  pb.bf16 = d.bf16;
  const int max_keys = c.seq_lens.empty() ? 0 : *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
  const int splits = reference_mqa_splits(static_cast<long long>(groups.size()), max_keys);
  DeviceBuffer part_o, part_lse;  // the split partials: freed after the synchronization below
  if (splits == 1) {
    const DoubleSink sink{o_lat.as<double>(), lse.as<double>(), d.L};
    launch_attention<LatentReferenceProblem, DoubleSink, double, false>(pb, sink, d_groups.as<RowGroup>(),
                                                                     static_cast<int>(groups.size()), 1, s);
  } else {
    part_o = DeviceBuffer(static_cast<std::size_t>(splits) * rows * d.L * sizeof(double));
    part_lse = DeviceBuffer(static_cast<std::size_t>(splits) * rows * sizeof(double));
    const PartialSinkOf<double> sink{part_o.as<double>(), part_lse.as<double>(), d.L, rows};
    launch_attention<LatentReferenceProblem, PartialSinkOf<double>, double, false>(
        pb, sink, d_groups.as<RowGroup>(), static_cast<int>(groups.size()), splits, s);
    combine_partials_f64<<<static_cast<unsigned>(rows), 128, 0, s>>>(part_o.as<double>(), part_lse.as<double>(), splits,
                                                                    rows, d.L, o_lat.as<double>(), lse.as<double>());
    MLAGATE_CUDA_CHECK_LAUNCH();
  }
  MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
}

template <class T>
void download_vector(const DeviceBuffer& b, std::vector<T>& out, std::size_t n, cudaStream_t s) {
  out.resize(n);
  b.download(out.data(), n * sizeof(T), s);
}

}  // namespace
}  // namespace gpu

int reference_mqa_splits(long long row_groups, int max_keys) {
  if (row_groups <= 0 || max_keys <= kReferenceSplitKeys) return 1;
  const long long by_keys = (static_cast<long long>(max_keys) + kReferenceSplitKeys - 1) / kReferenceSplitKeys;
  const long long by_blocks = kReferenceTargetBlocks / row_groups;
  return static_cast<int>(std::max(1LL, std::min(by_keys, by_blocks)));
}

ReferenceOutputs cuda_reference_absorbed(const Case& c) {
  using namespace gpu;
  require_device();
  Stream stream;
  const cudaStream_t s = stream.get();
  DeviceCase d;
  upload_case(c, d, true, s);
  const int D = d.L + d.R, QW = d.P + d.R;
  // ql[:, n, :] = q_nope[:, n, :] W_UK[:, n, :]^T into q_full[:, n, :L]; batch = head.
  // A(t, p) = q[t, n, p]; B(p, l) = W_UK[l, n, p]; C(t, l) = q_full[t, n, l].
  gemm_f64<std::uint16_t, std::uint16_t>(d.N, d.T, d.L, d.P, Mat<std::uint16_t>{d.q.as<std::uint16_t>(), QW, 1LL * d.N * QW, 1},
                                         Mat<std::uint16_t>{d.w_uk.as<std::uint16_t>(), d.P, 1, 1LL * d.N * d.P},
                                         d.q_full.as<double>(), D, 1LL * d.N * D, 1, d.bf16, s);
  DeviceBuffer o_lat, lse;
  mqa_core(c, d, o_lat, lse, s);
  // out[:, n*V + v] = o_lat[:, n, :] W_UV[:, n, v]; A(t, l) = o_lat[t, n, l]; B(l, v) = W_UV[l, n, v].
  const long long rows = static_cast<long long>(d.T) * d.N;
  DeviceBuffer out(static_cast<std::size_t>(rows) * d.V * sizeof(double));
  out.fill(0xFF, s);
  gemm_f64<double, std::uint16_t>(d.N, d.T, d.V, d.L, Mat<double>{o_lat.as<double>(), d.L, 1LL * d.N * d.L, 1},
                                  Mat<std::uint16_t>{d.w_uv.as<std::uint16_t>(), d.V, 1LL * d.N * d.V, 1},
                                  out.as<double>(), d.V, 1LL * d.N * d.V, 1, d.bf16, s);
  MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
  ReferenceOutputs g;
  download_vector(out, g.out, static_cast<std::size_t>(rows) * d.V, s);
  download_vector(lse, g.lse, static_cast<std::size_t>(rows), s);
  download_vector(o_lat, g.o_lat, static_cast<std::size_t>(rows) * d.L, s);
  return g;
}

void cuda_reference_mqa(const Case& c, const TensorView& q_lat, std::vector<double>& o_lat_out,
                        std::vector<double>& lse_out) {
  using namespace gpu;
  require_device();
  const int T = c.num_tokens, N = c.spec.num_heads(), L = c.spec.dims.kv_lora_rank;
  if (q_lat.shape != Shape{T, N, L})
    throw std::invalid_argument("cuda_reference_mqa: q_lat has shape " + shape_str(q_lat.shape) + ", expected " +
                                shape_str({T, N, L}));
  Stream stream;
  const cudaStream_t s = stream.get();
  DeviceCase d;
  upload_case(c, d, false, s);
  // The given latent queries (widened exactly on the host) into q_full[:, :, :L].
  const long long rows = static_cast<long long>(T) * N;
  std::vector<double> ql(static_cast<std::size_t>(rows) * L);
  if (q_lat.dtype == DType::kBF16 || q_lat.dtype == DType::kF16) {
    const auto* bits = static_cast<const std::uint16_t*>(q_lat.data);
    const bool bf16 = q_lat.dtype == DType::kBF16;
    for (std::size_t i = 0; i < ql.size(); ++i) ql[i] = bf16 ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
  } else {
    for (std::size_t i = 0; i < ql.size(); ++i) ql[i] = q_lat.get(static_cast<std::int64_t>(i));
  }
  if (rows > 0)
    MLAGATE_CUDA_CHECK(cudaMemcpy2DAsync(d.q_full.data(), (L + d.R) * sizeof(double), ql.data(), L * sizeof(double),
                                         L * sizeof(double), static_cast<std::size_t>(rows), cudaMemcpyHostToDevice, s));
  DeviceBuffer o_lat, lse;
  mqa_core(c, d, o_lat, lse, s);
  download_vector(o_lat, o_lat_out, static_cast<std::size_t>(rows) * L, s);
  download_vector(lse, lse_out, static_cast<std::size_t>(rows), s);
}

}  // namespace mlagate
