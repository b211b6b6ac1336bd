// cuda.splitkv: split-KV flash-decoding. Each block takes a group of rows and
// one split of its request's keys and writes a partial fp32 (o, lse); a
// combine kernel merges every row's partials through their LSEs. The number
// of splits comes from the work (about two waves of the device's
// multiprocessors) unless --splits forces it. Model-dtype inputs, fp32 logits
// and accumulation, P rounded to the model dtype before P@V.
#include <limits>
#include <algorithm>
#include <cmath>
#include <string>

#include "backends/cuda/backend_base.cuh"
#include "backends/cuda/cuda_backends.h"
#include "cases/errors.h"

namespace mlagate {
namespace gpu {
namespace {

constexpr int kMinKeysPerSplit = 64;  // a split of fewer keys costs more than it saves
constexpr int kMaxChosenSplits = 128;
constexpr int kMaxForcedSplits = 65535;  // grid.y limit

// One block per row: lse = log sum_s exp(lse_s), o = sum_s exp(lse_s - lse) o_s.
// Splits without keys (lse_s = -inf) weigh exactly 0; a row whose splits are
// all empty gives o = 0 and lse = -inf. A NaN partial lse (a split that never
// wrote its row) makes the row NaN rather than being skipped.
__global__ void __launch_bounds__(256) combine_kernel(const float* part_o, const float* part_lse, int splits,
                                                      long long rows, int dv, std::uint16_t* o_out, float* lse_out,
                                                      RowStrides o_rows, RowStrides lse_rows, bool bf16) {
  const long long row = blockIdx.x;
  // This row's output and lse (strided views: layout strided, cases/LAYOUTS.md).
  std::uint16_t* o = o_out + o_rows.at(row, dv);
  float* lse = lse_out + lse_rows.at(row, 1);
  const float ninf = -__int_as_float(0x7f800000);
  float m = ninf;
  for (int s = 0; s < splits; ++s) {
    const float x = part_lse[s * rows + row];
    m = (x > m || x != x) ? x : m;
    if (m != m) break;
  }
  if (m == ninf) {
    for (int d = threadIdx.x; d < dv; d += blockDim.x) o[d] = to_model_bits(0.f, bf16);
    if (threadIdx.x == 0) *lse = ninf;
    return;
  }
  float sum = 0.f;
  for (int s = 0; s < splits; ++s) {
    const float x = part_lse[s * rows + row];
    if (x != ninf) sum += expf(x - m);
  }
  const float l = m + logf(sum);
  for (int d = threadIdx.x; d < dv; d += blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float x = part_lse[s * rows + row];
      if (x == ninf) continue;
      acc += expf(x - l) * part_o[(s * rows + row) * dv + d];
    }
    o[d] = to_model_bits(acc, bf16);
  }
  if (threadIdx.x == 0) *lse = l;
}

class SplitKvBackend final : public CudaBackend {
 public:
  explicit SplitKvBackend(int forced_splits) : forced_splits_(forced_splits) {}

  std::string_view name() const override { return "cuda.splitkv"; }
  std::string_view description() const override {
    return "CUDA split-KV flash-decoding: per-split fp32 partials merged by a combine kernel through their LSEs; "
           "fp32 logits and accumulation, P rounded to the model dtype before P@V";
  }
  Capabilities capabilities() const override {
    Capabilities caps;
    caps.ops = {Op::kDecode, Op::kCacheWrite};
    caps.block_sizes = {64, 16, 32};
    caps.query_len_support = QueryLenSupport::kVarlen;
    // Every request is a decode: the layer op sends prefills through decode too.
    caps.reorder_threshold = 1 << 16;
    caps.dtypes = {DType::kBF16, DType::kF16};
    caps.kv_dtypes = {KvCacheDtype::kAuto, KvCacheDtype::kFp8, KvCacheDtype::kFp8E4m3, KvCacheDtype::kFp8DsMla};
    caps.max_pool_bytes = std::numeric_limits<std::int64_t>::max();  // 64-bit slots: gpu/attention.cuh
    caps.strided_views = true;  // q, o and lse read and written with their token and head strides (RowStrides)
    return caps;
  }

 protected:
  // The plan: the split count and the fp32 partials, which start as NaN so a
  // partial a split never writes shows up in the output. Enqueued: the split
  // kernel, then the combine.
  std::unique_ptr<PlannedDecode> plan_decode(const DecodeCall& call) override {
    class Plan final : public PlannedDecode {
     public:
      Plan(const DecodeCall& call, int splits)
          : call_(call),
            splits_(splits),
            part_o_(static_cast<std::size_t>(splits) * call.rows * call.pb.dv * sizeof(float)),
            part_lse_(static_cast<std::size_t>(splits) * call.rows * sizeof(float)) {
        part_o_.fill(0xFF, call.stream);
        part_lse_.fill(0xFF, call.stream);
      }
      void enqueue(cudaStream_t s) override {
        const PartialSink sink{part_o_.as<float>(), part_lse_.as<float>(), call_.pb.dv, call_.rows};
        launch_attention<PagedDecodeProblem, PartialSink, float, true>(call_.pb, sink, call_.groups, call_.num_groups,
                                                                       splits_, s);
        if (call_.rows > 0) {
          combine_kernel<<<static_cast<unsigned>(call_.rows), 256, 0, s>>>(
              part_o_.as<float>(), part_lse_.as<float>(), splits_, call_.rows, call_.pb.dv,
              call_.o_lat->as<std::uint16_t>(), call_.lse->as<float>(), call_.o_rows, call_.lse_rows, call_.pb.bf16);
          MLAGATE_CUDA_CHECK_LAUNCH();
        }
      }
      std::string note() const override { return std::to_string(splits_) + (splits_ == 1 ? " split" : " splits"); }

     private:
      DecodeCall call_;
      int splits_;
      DeviceBuffer part_o_, part_lse_;  // freed (cudaFree waits for the kernels) with the plan
    };
    const int splits = choose_splits(call);
    const std::size_t ws_bytes =
        static_cast<std::size_t>(splits) * static_cast<std::size_t>(call.rows) * (call.pb.dv + 1) * sizeof(float);
    // Forced splits can ask for a lot (1000 splits x 7000 rows is 14 GiB): up
    // to a quarter of the device's memory, else NOT_SUPPORTED with the numbers.
    const std::size_t limit = cuda_device_info().total_bytes / 4;
    if (ws_bytes > limit)
      throw NotSupportedError(std::to_string(splits) + " splits need " + std::to_string(ws_bytes >> 20) +
                              " MiB of partials (limit " + std::to_string(limit >> 20) + " MiB, a quarter of the device)");
    return std::make_unique<Plan>(call, splits);
  }

 private:
  // Splits for this call: forced, or enough blocks for about two waves of the
  // device, no split shorter than kMinKeysPerSplit keys of the longest request.
  int choose_splits(const DecodeCall& call) const {
    if (forced_splits_ > 0) return std::min(forced_splits_, kMaxForcedSplits);
    if (call.num_groups == 0) return 1;
    const int per_sm = attention_blocks_per_sm<PagedDecodeProblem, PartialSink, float, true>(call.pb);
    const long long target = 2LL * multiprocessor_count() * per_sm;
    long long splits = (target + call.num_groups - 1) / call.num_groups;
    const long long useful = std::max(1, (call.max_seq_len + kMinKeysPerSplit - 1) / kMinKeysPerSplit);
    splits = std::clamp<long long>(splits, 1, std::min<long long>(useful, kMaxChosenSplits));
    return static_cast<int>(splits);
  }

  int forced_splits_;
};

}  // namespace
}  // namespace gpu

std::unique_ptr<Backend> make_cuda_splitkv(const BackendOptions& options) {
  if (options.num_splits < 0) throw InputError("--splits must be >= 1 (or 0 to choose from the work)");
  return std::make_unique<gpu::SplitKvBackend>(options.num_splits);
}

}  // namespace mlagate
