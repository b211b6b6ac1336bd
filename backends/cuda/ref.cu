// cuda.ref: the plain fp32 GPU kernel. Decode reads the paged cache through the
// block table (every query length, the causal rule per token) and prefill
// attends over contiguous per-head keys; logits, softmax, probabilities and
// accumulation all in fp32, outputs rounded once to the model dtype.
#include <limits>
#include <algorithm>
#include <stdexcept>
#include <string>

#include "backends/cuda/backend_base.cuh"
#include "backends/cuda/cuda_backends.h"
#include "cases/errors.h"

namespace mlagate {
namespace gpu {
namespace {

[[noreturn]] void bad_prefill(const std::string& what) { throw std::invalid_argument("prefill: " + what); }

void validate_prefill(const PrefillArgs& a) {
  for (const TensorView* t : {&a.q, &a.k, &a.v, &a.o})
    if (t->shape.size() != 3) bad_prefill("q, k, v and o must be 3-d, got " + shape_str(t->shape));
  const DType dt = a.q.dtype;
  if (dt != DType::kBF16 && dt != DType::kF16) bad_prefill("q dtype is not a 16-bit model dtype");
  if (a.k.dtype != dt || a.v.dtype != dt || a.o.dtype != dt) bad_prefill("q, k, v and o must share one dtype");
  if (a.lse.dtype != DType::kF32) bad_prefill("lse must be float32");
  const std::int64_t t = a.q.shape[0], n = a.q.shape[1], dqk = a.q.shape[2];
  const std::int64_t sk = a.k.shape[0], dv = a.v.shape[2];
  if (a.k.shape != Shape{sk, n, dqk}) bad_prefill("k has shape " + shape_str(a.k.shape));
  if (a.v.shape != Shape{sk, n, dv}) bad_prefill("v has shape " + shape_str(a.v.shape));
  if (a.o.shape != Shape{t, n, dv}) bad_prefill("o has shape " + shape_str(a.o.shape));
  if (a.lse.shape != Shape{t, n}) bad_prefill("lse has shape " + shape_str(a.lse.shape));
  if (a.cu_seqlens_q.size() != a.cu_seqlens_k.size() || a.cu_seqlens_q.empty())
    bad_prefill("cu_seqlens_q and cu_seqlens_k must both have B + 1 entries");
  const std::size_t b = a.cu_seqlens_q.size() - 1;
  if (a.cu_seqlens_q[0] != 0 || a.cu_seqlens_q[b] != t) bad_prefill("cu_seqlens_q must run from 0 to T");
  if (a.cu_seqlens_k[0] != 0 || a.cu_seqlens_k[b] != sk) bad_prefill("cu_seqlens_k must run from 0 to Sk");
  for (std::size_t i = 0; i < b; ++i)
    if (a.cu_seqlens_q[i + 1] < a.cu_seqlens_q[i] || a.cu_seqlens_k[i + 1] < a.cu_seqlens_k[i])
      bad_prefill("cu_seqlens must not decrease");
}

class RefBackend final : public CudaBackend {
 public:
  explicit RefBackend(const detail::CudaFaults& faults) : faults_(faults) {}

  std::string_view name() const override { return "cuda.ref"; }
  std::string_view description() const override {
    return "CUDA fp32 reference kernel: paged decode (any query length, causal) and varlen prefill; fp32 logits, "
           "softmax, probabilities and accumulation";
  }
  Capabilities capabilities() const override {
    Capabilities caps;
    caps.ops = {Op::kDecode, Op::kPrefill, Op::kCacheWrite};
    caps.block_sizes = {16, 1, 32, 64, 128};
    caps.query_len_support = QueryLenSupport::kVarlen;
    // Every request of a layer goes through the paged decode kernel (the
    // prefill kernel is exercised by the kernel-level prefill op).
    caps.reorder_threshold = 1 << 16;
    caps.dtypes = {DType::kBF16, DType::kF16};
    caps.kv_dtypes = {KvCacheDtype::kAuto, KvCacheDtype::kFp8, KvCacheDtype::kFp8E4m3, KvCacheDtype::kFp8DsMla};
    caps.max_pool_bytes = std::numeric_limits<std::int64_t>::max();  // 64-bit slots: gpu/attention.cuh
    caps.strided_views = true;  // q, o and lse read and written with their token and head strides (RowStrides)
    return caps;
  }
  void prefill(const PrefillArgs& a) override;

 protected:
  // One pass over every request's keys, straight into the outputs: nothing to plan.
  std::unique_ptr<PlannedDecode> plan_decode(const DecodeCall& call) override {
    class Plan final : public PlannedDecode {
     public:
      Plan(const DecodeCall& call, const detail::CudaFaults& faults)
          : call_(call),
            sink_{call.o_lat->as<std::uint16_t>(), call.lse->as<float>(), call.pb.dv, call.rows, call.pb.bf16,
                  SinkFaults{faults.skip_row, faults.write_past_end}, call.o_rows, call.lse_rows} {}
      void enqueue(cudaStream_t s) override {
        launch_attention<PagedDecodeProblem, ModelSink, float, false>(call_.pb, sink_, call_.groups, call_.num_groups,
                                                                      1, s);
      }

     private:
      DecodeCall call_;
      ModelSink sink_;
    };
    return std::make_unique<Plan>(call, faults_);
  }

 private:
  detail::CudaFaults faults_;
};

void RefBackend::prefill(const PrefillArgs& a) {
  require_device();
  validate_prefill(a);
  const int N = static_cast<int>(a.q.shape[1]);
  const cudaStream_t s = stream();
  const DeviceBuffer q = upload_array(static_cast<const std::uint16_t*>(a.q.data), a.q.numel(), s);
  const DeviceBuffer k = upload_array(static_cast<const std::uint16_t*>(a.k.data), a.k.numel(), s);
  const DeviceBuffer v = upload_array(static_cast<const std::uint16_t*>(a.v.data), a.v.numel(), s);
  std::vector<std::int32_t> meta(a.cu_seqlens_q.begin(), a.cu_seqlens_q.end());
  meta.insert(meta.end(), a.cu_seqlens_k.begin(), a.cu_seqlens_k.end());
  const DeviceBuffer d_meta = upload_array(meta.data(), meta.size(), s);
  // Groups: for each (request, head), its tokens in runs of kGroupRows.
  std::vector<RowGroup> groups;
  const std::size_t B = a.cu_seqlens_q.size() - 1;
  for (std::size_t b = 0; b < B; ++b) {
    const int q_len = a.cu_seqlens_q[b + 1] - a.cu_seqlens_q[b];
    for (int h = 0; h < N; ++h)
      for (int r = 0; r < q_len; r += kGroupRows)
        groups.push_back({static_cast<int>(b), r, std::min(kGroupRows, q_len - r), h});
  }
  const DeviceBuffer d_groups = upload_array(groups.data(), groups.size(), s);
  GuardedDeviceOutput o(a.o, "o", s), lse(a.lse, "lse", s);

  PrefillProblem pb;
  pb.q = q.as<std::uint16_t>();
  pb.k = k.as<std::uint16_t>();
  pb.v = v.as<std::uint16_t>();
  pb.cu_q = d_meta.as<std::int32_t>();
  pb.cu_k = pb.cu_q + B + 1;
  pb.heads = N;
  pb.dk = static_cast<int>(a.q.shape[2]);
  pb.dv = static_cast<int>(a.v.shape[2]);
  pb.causal = a.causal;
  pb.scale = a.scale;
  pb.bf16 = a.q.dtype == DType::kBF16;
  const long long rows = static_cast<long long>(a.q.shape[0]) * N;
  ModelSink sink{o.as<std::uint16_t>(), lse.as<float>(), pb.dv, rows, pb.bf16,
                 SinkFaults{faults_.skip_row, faults_.write_past_end}};

  Event start, stop;
  start.record(s);
  launch_attention<PrefillProblem, ModelSink, float, false>(pb, sink, d_groups.as<RowGroup>(),
                                                            static_cast<int>(groups.size()), 1, s);
  last_kernel_ms_ = finish_timed_call(start, stop, s, o, a.o, lse, a.lse);
}

}  // namespace
}  // namespace gpu

std::unique_ptr<Backend> make_cuda_ref() { return std::make_unique<gpu::RefBackend>(detail::CudaFaults{}); }

std::unique_ptr<Backend> detail::make_cuda_ref_with_faults(const CudaFaults& faults) {
  return std::make_unique<gpu::RefBackend>(faults);
}

}  // namespace mlagate
