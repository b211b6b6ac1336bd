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
#include "backends/cuda/attention.cuh"
#include "backends/cuda/device.h"

namespace mlagate::gpu {

// Row groups of a decode call: each request's rows r = u * N + n cut into
// groups of kGroupRows.
std::vector<RowGroup> decode_row_groups(std::span<const std::int32_t> query_start, int heads);

// Entry layout and dequantization of a cache; NotSupportedError for kv dtypes
// the kernels cannot read.
KvFormat kv_format_of(const PagedCache& cache, float k_scale);

class CudaBackend : public Backend {
 public:
  void decode(const DecodeArgs& a) final;
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
    cudaStream_t stream = nullptr;
  };
  virtual void launch_decode(const DecodeCall& call) = 0;
  cudaStream_t stream();

  double last_kernel_ms_ = 0;

 private:
  std::unique_ptr<Stream> stream_;
};

}  // namespace mlagate::gpu
