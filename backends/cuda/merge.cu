// "cuda.merge": vLLM's merge_attn_states on the GPU (the merge_states op,
// SPEC: Ops, merge_states), one thread block per (token, head) row: every
// thread reads the row's two lses, reads +inf as -inf (FlashAttention 2's
// empty row), takes m = max and each side's scale exp(l - m) / sum in fp32
// (IEEE expf and logf, no fast math), and writes its columns of
// prefix * scale_p + suffix * scale_s rounded to the output dtype. A row empty
// on both sides writes 0 and lse -inf (not the NaN of -inf - -inf); an empty
// side's values are never read. Outputs are guarded and poisoned device
// buffers (device.h), as every CUDA backend's.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "backends/cuda/cuda_backends.h"
#include "gpu/device.h"

namespace mlagate {
namespace gpu {
namespace {

constexpr int kThreads = 128;

template <class T>
__device__ float load(const T* p, long long i);
template <>
__device__ float load<float>(const float* p, long long i) { return p[i]; }
template <>
__device__ float load<__nv_bfloat16>(const __nv_bfloat16* p, long long i) { return __bfloat162float(p[i]); }
template <>
__device__ float load<__half>(const __half* p, long long i) { return __half2float(p[i]); }

template <class T>
__device__ void store(T* p, long long i, float v);
template <>
__device__ void store<float>(float* p, long long i, float v) { p[i] = v; }
template <>
__device__ void store<__nv_bfloat16>(__nv_bfloat16* p, long long i, float v) { p[i] = __float2bfloat16_rn(v); }
template <>
__device__ void store<__half>(__half* p, long long i, float v) { p[i] = __float2half_rn(v); }

template <class T>
__global__ void merge_kernel(const T* __restrict__ po, const float* __restrict__ pl, const T* __restrict__ so,
                             const float* __restrict__ sl, T* __restrict__ out, float* __restrict__ out_lse, int dim) {
  const long long row = blockIdx.x;
  float lp = pl[row], ls = sl[row];
  if (isinf(lp)) lp = -INFINITY;
  if (isinf(ls)) ls = -INFINITY;
  const float m = fmaxf(lp, ls);
  const long long base = row * dim;
  if (m == -INFINITY) {
    for (int x = threadIdx.x; x < dim; x += blockDim.x) store<T>(out, base + x, 0.f);
    if (threadIdx.x == 0) out_lse[row] = -INFINITY;
    return;
  }
  const float ep = expf(lp - m), es = expf(ls - m), sum = ep + es;
  const float sp = ep / sum, ss = es / sum;
  for (int x = threadIdx.x; x < dim; x += blockDim.x) {
    const float vp = sp == 0.f ? 0.f : load<T>(po, base + x) * sp;
    const float vs = ss == 0.f ? 0.f : load<T>(so, base + x) * ss;
    store<T>(out, base + x, vp + vs);
  }
  if (threadIdx.x == 0) out_lse[row] = logf(sum) + m;
}

class MergeBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda.merge"; }
  std::string_view description() const override {
    return "CUDA merge_states (vLLM's merge_attn_states): one block per row, fp32 scales, +inf read as an empty side";
  }
  Capabilities capabilities() const override { return merge_states_capabilities(); }
  void merge_states(const MergeStatesArgs& a) override {
    require_device();
    check_merge_states_args(a);  // on the host, before anything is launched
    if (!stream_) stream_ = std::make_unique<Stream>();
    const cudaStream_t s = stream_->get();
    const long long rows = a.prefix_lse.numel();
    const int dim = static_cast<int>(a.prefix_output.shape[2]);
    const std::size_t esz = dtype_size(a.prefix_output.dtype);
    DeviceBuffer po = upload_array(static_cast<const unsigned char*>(a.prefix_output.data), a.prefix_output.numel() * esz, s);
    DeviceBuffer so = upload_array(static_cast<const unsigned char*>(a.suffix_output.data), a.suffix_output.numel() * esz, s);
    DeviceBuffer pl = upload_array(a.prefix_lse.as<float>(), static_cast<std::size_t>(rows), s);
    DeviceBuffer sl = upload_array(a.suffix_lse.as<float>(), static_cast<std::size_t>(rows), s);
    GuardedDeviceOutput out(a.output, "out", s), lse(a.output_lse, "lse", s);
    Event start, stop;
    start.record(s);
    if (rows > 0 && dim > 0) {
      const dim3 grid(static_cast<unsigned>(rows));
      switch (a.prefix_output.dtype) {
        case DType::kBF16:
          merge_kernel<__nv_bfloat16><<<grid, kThreads, 0, s>>>(po.as<__nv_bfloat16>(), pl.as<float>(), so.as<__nv_bfloat16>(),
                                                               sl.as<float>(), out.as<__nv_bfloat16>(), lse.as<float>(), dim);
          break;
        case DType::kF16:
          merge_kernel<__half><<<grid, kThreads, 0, s>>>(po.as<__half>(), pl.as<float>(), so.as<__half>(), sl.as<float>(),
                                                        out.as<__half>(), lse.as<float>(), dim);
          break;
        default:
          merge_kernel<float><<<grid, kThreads, 0, s>>>(po.as<float>(), pl.as<float>(), so.as<float>(), sl.as<float>(),
                                                       out.as<float>(), lse.as<float>(), dim);
      }
      MLAGATE_CUDA_CHECK_LAUNCH();
    }
    last_kernel_ms_ = finish_timed_call(start, stop, s, out, a.output, lse, a.output_lse);
  }

 private:
  std::unique_ptr<Stream> stream_;
  double last_kernel_ms_ = 0;
};

}  // namespace
}  // namespace gpu

std::unique_ptr<Backend> make_cuda_merge() { return std::make_unique<gpu::MergeBackend>(); }

}  // namespace mlagate
