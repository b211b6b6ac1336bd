// The GPU up-projection's kernels (row_projection_kernels.h): a register-tiled
// fp32 GEMM whose every output is the one fma chain the CPU's row-wise GEMM
// (reference/detail/rowwise_gemm.h) computes, and the rope copy.
//
// Why the bits equal the CPU's: each output element is accumulated by one
// thread, acc = __fmaf_rn(a[j][l], b[l][col], acc) for l = 0, 1, ... in order
// from acc = +0.0f (IEEE fused multiply-add, round to nearest even, the same
// operation as x86's vfmadd and std::fma); the depth is never split (no
// split-K, no tree reduction, no tensor cores), and a partial last depth step
// runs only its real terms (a padded term fma(0, 0, acc) would turn an
// accumulated -0 into +0). Subnormals are kept: this file must not be built
// with --use_fast_math or -ftz=true (reference/cuda/CMakeLists.txt pins
// -ftz=false for it; the device tests check subnormal results). The rounding
// to 16 bits is cases/encoding.h's own integer code, compiled for the device.
#include <algorithm>

#include "cases/encoding.h"
#include "gpu/device.h"  // MLAGATE_CUDA_CHECK_LAUNCH
#include "reference/cuda/row_projection_kernels.h"

namespace mlagate::gpu {
namespace {

constexpr int kMicro = 8;  // outputs per thread along rows and along columns
static_assert(kProjThreads == (kProjRows / kMicro) * (kProjCols / kMicro));
static_assert(kProjRows * kProjDepth == 4 * kProjThreads && kProjCols * kProjDepth == 4 * kProjThreads);

__device__ __forceinline__ std::uint16_t round16(float x, bool bf16) {
  const std::uint32_t u = __float_as_uint(x);
  return bf16 ? f32_bits_to_bf16(u) : f32_bits_to_f16(u);
}

// One block: rows [row0, row0 + 128) x columns [col0, col0 + 128). Thread
// (tx, ty) of 16 x 16 owns rows ty*4 + {0..3} and 64 + ty*4 + {0..3}, columns
// tx*4 + {0..3} and 64 + tx*4 + {0..3}. Shared tiles of the depth step, double
// buffered: the next step's values are fetched into registers while this one
// is computed. Out-of-range rows and columns read zeros and are never stored.
__global__ void __launch_bounds__(kProjThreads, 2)
    projection_gemm_kernel(const float* __restrict__ a, int rows, int depth, const float* __restrict__ b, int cols,
                           int head_width, int head_stride, long long row_stride, bool bf16,
                           std::uint16_t* __restrict__ dst) {
  __shared__ __align__(16) float as[2][kProjDepth][kProjRows];  // [k][row]: a transposed
  __shared__ __align__(16) float bs[2][kProjDepth][kProjCols];  // [k][col]
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const int row0 = blockIdx.y * kProjRows, col0 = blockIdx.x * kProjCols;

  // What each thread loads per depth step: a's row tid / 2, depths (tid % 2) * 4
  // + {0..3}; b's depth tid / 32, columns (tid % 32) * 4 + {0..3}.
  const int a_row = tid / 2, a_k = (tid % 2) * 4;
  const int b_k = tid / 32, b_col = (tid % 32) * 4;
  const bool a_row_ok = row0 + a_row < rows;
  const float* a_ptr = a + static_cast<long long>(row0 + a_row) * depth;
  float a_reg[4], b_reg[4];
  auto fetch = [&](int k0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = k0 + a_k + i;
      a_reg[i] = a_row_ok && k < depth ? a_ptr[k] : 0.f;
    }
    const int kb = k0 + b_k;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = col0 + b_col + i;
      b_reg[i] = kb < depth && col < cols ? b[static_cast<long long>(kb) * cols + col] : 0.f;
    }
  };
  auto stash = [&](int buf) {
#pragma unroll
    for (int i = 0; i < 4; ++i) as[buf][a_k + i][a_row] = a_reg[i];
#pragma unroll
    for (int i = 0; i < 4; ++i) bs[buf][b_k][b_col + i] = b_reg[i];
  };

  float acc[kMicro][kMicro];
#pragma unroll
  for (int i = 0; i < kMicro; ++i)
#pragma unroll
    for (int j = 0; j < kMicro; ++j) acc[i][j] = 0.f;  // +0, as the CPU's chain starts

  // One depth index: every accumulator takes its next term.
  auto step = [&](int buf, int k) {
    const float4 a_lo = *reinterpret_cast<const float4*>(&as[buf][k][ty * 4]);
    const float4 a_hi = *reinterpret_cast<const float4*>(&as[buf][k][64 + ty * 4]);
    const float4 b_lo = *reinterpret_cast<const float4*>(&bs[buf][k][tx * 4]);
    const float4 b_hi = *reinterpret_cast<const float4*>(&bs[buf][k][64 + tx * 4]);
    const float av[kMicro] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
    const float bv[kMicro] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
#pragma unroll
    for (int i = 0; i < kMicro; ++i)
#pragma unroll
      for (int j = 0; j < kMicro; ++j) acc[i][j] = __fmaf_rn(av[i], bv[j], acc[i][j]);
  };

  const int steps = (depth + kProjDepth - 1) / kProjDepth;
  if (steps > 0) {
    fetch(0);
    stash(0);
  }
  __syncthreads();
  for (int s = 0; s < steps; ++s) {
    const int buf = s % 2;
    if (s + 1 < steps) fetch((s + 1) * kProjDepth);
    const int k_end = min(kProjDepth, depth - s * kProjDepth);  // uniform over the block
    if (k_end == kProjDepth) {
#pragma unroll
      for (int k = 0; k < kProjDepth; ++k) step(buf, k);
    } else {
      for (int k = 0; k < k_end; ++k) step(buf, k);  // the real terms only
    }
    // The other buffer was last read in step s - 1, before the barrier that
    // ended it: it can take step s + 1's values now.
    if (s + 1 < steps) stash(1 - buf);
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kMicro; ++i) {
    const int row = row0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
    if (row >= rows) continue;
    std::uint16_t* out_row = dst + static_cast<long long>(row) * row_stride;
#pragma unroll
    for (int j = 0; j < kMicro; ++j) {
      const int col = col0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + (j - 4));
      if (col >= cols) continue;
      const int h = col / head_width, w = col - h * head_width;
      out_row[static_cast<long long>(h) * head_stride + w] = round16(acc[i][j], bf16);
    }
  }
}

__global__ void pe_broadcast_kernel(const std::uint16_t* __restrict__ pe, int rows, int heads, int R, int head_stride,
                                    int offset, std::uint16_t* __restrict__ dst) {
  const long long total = static_cast<long long>(rows) * heads * R;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long jh = i / R;  // row * heads + head
    const int r = static_cast<int>(i - jh * R);
    const long long j = jh / heads;
    dst[jh * head_stride + offset + r] = pe[j * R + r];
  }
}

}  // namespace

void launch_projection_gemm(const float* a, int rows, int depth, const float* b, int cols, int head_width,
                            int head_stride, long long row_stride, bool bf16, std::uint16_t* dst, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid(static_cast<unsigned>((cols + kProjCols - 1) / kProjCols),
                  static_cast<unsigned>((rows + kProjRows - 1) / kProjRows));
  projection_gemm_kernel<<<grid, kProjThreads, 0, s>>>(a, rows, depth, b, cols, head_width, head_stride, row_stride,
                                                       bf16, dst);
  MLAGATE_CUDA_CHECK_LAUNCH();
}

void launch_pe_broadcast(const std::uint16_t* pe, int rows, int heads, int R, int head_stride, int offset,
                         std::uint16_t* dst, cudaStream_t s) {
  const long long total = static_cast<long long>(rows) * heads * R;
  if (total <= 0) return;
  const long long blocks = std::min<long long>((total + 255) / 256, 4096);
  pe_broadcast_kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(pe, rows, heads, R, head_stride, offset, dst);
  MLAGATE_CUDA_CHECK_LAUNCH();
}

}  // namespace mlagate::gpu
