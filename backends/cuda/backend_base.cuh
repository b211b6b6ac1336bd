// What every CUDA backend shares: the device check (SKIPPED without a GPU),
// argument validation, the device cache (uploaded once per case and block
// size), the device cache writer, guarded and poisoned device outputs, kernel
// timing with events, and the copy back into the harness's host buffers.
// A backend only says how its decode (and prefill) kernels are launched.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "backends/backend.h"
#include "gpu/attention.cuh"
#include "gpu/device.h"

namespace mlagate::gpu {

// Entry layout and dequantization of a cache; NotSupportedError for kv dtypes
// the kernels cannot read.
KvFormat kv_format_of(const PagedCache& cache, float k_scale);

// A [T, N, ...] view's token and head strides for a kernel (packed where the
// view has none): layout strided's views (cases/LAYOUTS.md).
RowStrides row_strides(const TensorView& v);

class CudaBackend : public Backend {
 public:
  void decode(const DecodeArgs& a) final;
  // `mlagate bench`: the uploads and the plan (split count, workspaces) here,
  // launch() enqueues only the decode's kernels.
  std::unique_ptr<DecodeBench> prepare_decode_bench(const DecodeArgs& a) final;
  // --cuda-graph: a real CUDA graph of the planned decode's kernels over
  // persistent device buffers (q, metadata, the cache with the captured
  // capacity, guarded outputs), refreshed in place by copies before each
  // cudaGraphLaunch. The plan (split count, workspaces) is made once, for the
  // longest sequence the captured table can hold.
  std::unique_ptr<DecodeGraph> capture_decode(const DecodeArgs& a) override;
  void cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                   std::span<const std::int64_t> slots) override;
  // Kernel time of the last op (CUDA events around the launches).
  double last_kernel_ms() const { return last_kernel_ms_; }

 protected:
  struct DecodeCall {
    PagedDecodeProblem pb;
    const RowGroup* groups = nullptr;  // device
    int num_groups = 0;
    long long rows = 0;  // T * N
    int max_seq_len = 0;
    GuardedDeviceOutput* o_lat = nullptr;  // [T, N, L] model dtype
    GuardedDeviceOutput* lse = nullptr;    // [T, N] fp32
    RowStrides o_rows, lse_rows;  // packed, or the strided views' (Capabilities::strided_views)
    cudaStream_t stream = nullptr;
  };
  // One decode's kernels, planned once (split count, workspaces, poisoned on
  // call.stream) and then enqueued on a stream, without synchronizing: decode()
  // plans and enqueues once per call, the bench plans once and enqueues every
  // iteration. The plan may keep `call`'s pointers; they outlive it.
  class PlannedDecode {
   public:
    virtual ~PlannedDecode() = default;
    virtual void enqueue(cudaStream_t s) = 0;
    virtual std::string note() const { return {}; }  // what was planned, for the bench table ("8 splits")
  };
  virtual std::unique_ptr<PlannedDecode> plan_decode(const DecodeCall& call) = 0;
  cudaStream_t stream();

  double last_kernel_ms_ = 0;

 private:
  struct DecodeInputs;  // a call's device inputs and guarded outputs (backend_base.cu)
  std::unique_ptr<DecodeInputs> upload_decode(const DecodeArgs& a);

  std::unique_ptr<Stream> stream_;
};

}  // namespace mlagate::gpu
