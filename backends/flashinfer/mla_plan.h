// What the FlashInfer MLA adapters (flashinfer_backend.cu: the dense decode;
// flashinfer_sparse.cu: the SM90 sparse decode) share around FlashInfer's
// host planner: page-locked staging, MLAPlan with its work-list bound checked,
// and the plan's workspace offsets turned into MLAParams pointers. Internal:
// includes FlashInfer's headers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <flashinfer/attention/mla_params.cuh>
#include <flashinfer/attention/scheduler.cuh>

#include "cases/errors.h"
#include "gpu/device.h"

namespace mlagate::fi {

constexpr int kMaxWorks = 16384;  // MLAPlan's max_total_num_works: each work list holds this many
constexpr std::size_t kIntWorkspaceBytes = std::size_t{8} << 20;  // FlashInfer's own default

// Page-locked host memory (MLAPlan stages its work lists there before the upload).
class PinnedBuffer {
 public:
  explicit PinnedBuffer(std::size_t bytes) : bytes_(bytes) { MLAGATE_CUDA_CHECK(cudaMallocHost(&ptr_, bytes)); }
  ~PinnedBuffer() { cudaFreeHost(ptr_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return ptr_; }
  std::size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

template <class T>
T* at_offset(void* base, std::int64_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

// MLAPlan over host qo_indptr [B+1], kv_indptr [B+1] (in pages) and kv_len
// [B] into the workspaces, waited for (its upload reads the pinned staging).
// MLAPlan writes its work lists without a bound: a plan of more than
// kMaxWorks items would overlap the next list, so it is refused
// (NotSupportedError) rather than run corrupt.
inline flashinfer::MLAPlanInfo plan_mla(gpu::DeviceBuffer& float_ws, gpu::DeviceBuffer& int_ws, std::int32_t* qo_indptr,
                                        std::int32_t* kv_indptr, std::int32_t* kv_len, int batch, int heads,
                                        int head_dim_o, bool causal, cudaStream_t s) {
  PinnedBuffer pinned(kIntWorkspaceBytes);
  std::fill_n(static_cast<unsigned char*>(pinned.data()), pinned.size(), 0);
  flashinfer::MLAPlanInfo plan{};
  try {
    const cudaError_t e = flashinfer::MLAPlan<std::int32_t>(
        float_ws.data(), float_ws.size(), int_ws.data(), pinned.data(), kIntWorkspaceBytes, plan, qo_indptr, kv_indptr,
        kv_len, static_cast<std::uint32_t>(batch), static_cast<std::uint32_t>(heads), head_dim_o, causal, s);
    if (e != cudaSuccess) throw std::runtime_error(std::string("MLAPlan: ") + cudaGetErrorString(e));
  } catch (const flashinfer::Error& e) {
    throw std::runtime_error(std::string("MLAPlan: ") + e.what());
  }
  MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));  // the plan's upload reads the pinned buffer
  const int works = at_offset<std::int32_t>(pinned.data(), plan.work_indptr_offset)[plan.num_blks_y];
  if (works > kMaxWorks)
    throw NotSupportedError("the plan has " + std::to_string(works) + " work items; MLAPlan holds " +
                            std::to_string(kMaxWorks));
  return plan;
}

// Whether a later plan lays the work out as `captured` did: the grid and the
// workspace offsets a captured kernel keeps (a graph replays only such a plan).
inline bool same_layout(const flashinfer::MLAPlanInfo& plan, const flashinfer::MLAPlanInfo& captured) {
  return plan.num_blks_x == captured.num_blks_x && plan.num_blks_y == captured.num_blks_y &&
         plan.work_indptr_offset == captured.work_indptr_offset && plan.q_indptr_offset == captured.q_indptr_offset &&
         plan.partial_o_offset == captured.partial_o_offset && plan.partial_lse_offset == captured.partial_lse_offset &&
         plan.kv_len_offset == captured.kv_len_offset &&
         plan.merge_partial_stride_offset == captured.merge_partial_stride_offset;
}

// The plan's lists and partial buffers as the params' pointers (what
// FlashInfer's batch_mla_run.cu / batch_mla_sm90_run.cu do).
template <class Params>
void point_params_at_plan(Params& p, const flashinfer::MLAPlanInfo& plan, gpu::DeviceBuffer& float_ws,
                          gpu::DeviceBuffer& int_ws) {
  using DTypeO = std::remove_pointer_t<decltype(p.final_o)>;
  void* ib = int_ws.data();
  p.partial_o = at_offset<DTypeO>(float_ws.data(), plan.partial_o_offset);
  p.partial_lse = at_offset<float>(float_ws.data(), plan.partial_lse_offset);
  p.q_indptr = at_offset<std::int32_t>(ib, plan.q_indptr_offset);
  p.kv_indptr = at_offset<std::int32_t>(ib, plan.kv_indptr_offset);
  p.partial_indptr = at_offset<std::int32_t>(ib, plan.partial_indptr_offset);
  p.merge_packed_offset_start = at_offset<std::int32_t>(ib, plan.merge_packed_offset_start_offset);
  p.merge_packed_offset_end = at_offset<std::int32_t>(ib, plan.merge_packed_offset_end_offset);
  p.merge_partial_packed_offset_start = at_offset<std::int32_t>(ib, plan.merge_partial_packed_offset_start_offset);
  p.merge_partial_packed_offset_end = at_offset<std::int32_t>(ib, plan.merge_partial_packed_offset_end_offset);
  p.merge_partial_stride = at_offset<std::int32_t>(ib, plan.merge_partial_stride_offset);
  p.q_len = at_offset<std::int32_t>(ib, plan.q_len_offset);
  p.kv_len = at_offset<std::int32_t>(ib, plan.kv_len_offset);
  p.q_start = at_offset<std::int32_t>(ib, plan.q_start_offset);
  p.kv_start = at_offset<std::int32_t>(ib, plan.kv_start_offset);
  p.kv_end = at_offset<std::int32_t>(ib, plan.kv_end_offset);
  p.work_indptr = at_offset<std::int32_t>(ib, plan.work_indptr_offset);
}

// The float workspace the adapters give MLAPlan: partial o and lse for two
// CTAs of 128 rows per SM at head_dim_o 512 (what FlashInfer's wrapper sizes
// for its default 128 MiB is larger; the plan checks what it needs).
inline std::size_t float_workspace_bytes(int sms, int head_dim_o) {
  return 2ull * sms * 128 * (2 * head_dim_o + sizeof(float)) + 1024;
}

}  // namespace mlagate::fi
