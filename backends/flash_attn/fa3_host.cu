// FA3's host side shared by the flash_attn adapters (fa3_host.h): the
// combine dispatch and the lse transpose kernel.
#include "backends/flash_attn/fa3_host.h"

#include "cases/errors.h"

namespace mlagate::fa3 {

// mha_fwd after a split forward: the combine writes the output in the model
// dtype and resets the semaphore.
void run_combine(Flash_fwd_params p, bool bf16, cudaStream_t s) {
  p.is_bf16 = bf16;
  if (p.dv <= 64) {
    if (bf16) return run_mha_fwd_combine_<cutlass::bfloat16_t, float, 64>(p, s, true);
    return run_mha_fwd_combine_<cutlass::half_t, float, 64>(p, s, true);
  }
  if (bf16) return run_mha_fwd_combine_<cutlass::bfloat16_t, float, 128>(p, s, true);
  return run_mha_fwd_combine_<cutlass::half_t, float, 128>(p, s, true);
}

// FA3's varlen lse [N, T] -> mlagate's [T, N].
namespace {
__global__ void lse_heads_to_tokens(const float* __restrict__ src, float* __restrict__ dst, int N, int T) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<std::int64_t>(N) * T) return;
  const std::int64_t t = i / N, h = i % N;
  dst[i] = src[h * T + t];
}
}  // namespace

void transpose_lse(const float* src, float* dst, int N, int T, cudaStream_t s) {
  const std::int64_t n = static_cast<std::int64_t>(N) * T;
  if (n == 0) return;
  lse_heads_to_tokens<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(src, dst, N, T);
  MLAGATE_CUDA_CHECK_LAUNCH();
}

}  // namespace mlagate::fa3
