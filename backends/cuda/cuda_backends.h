// The CUDA backends' public face: factories and a device query, free of CUDA
// headers so the registry and CPU-only code can include it. Built only when
// MLAGATE_HAS_CUDA; on a machine without a GPU every call of a backend's ops
// throws DeviceUnavailableError (a SKIPPED record).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backends/backend.h"
#include "gpu/device_info.h"  // cuda_device_info() and the device queries, for the callers of this header

namespace mlagate {

// "cuda.ref": the plain fp32 GPU kernel. Decode (absorbed MQA through the block
// table, every query length, fp32 logits, softmax, P and accumulation) and
// varlen prefill; cache_write bit-exact with the reference writer.
std::unique_ptr<Backend> make_cuda_ref();

// "cuda.splitkv": split-KV flash-decoding. Model-dtype inputs, fp32 logits and
// accumulation, P rounded to the model dtype before P@V; each split writes a
// partial (o, lse) and a combine kernel merges them. options.num_splits > 0
// forces that many splits per request (--splits), 0 picks them from the work.
std::unique_ptr<Backend> make_cuda_splitkv(const BackendOptions& options);

// "cuda.sparse": DeepSeek V3.2 / V4 sparse decode and prefill (the sparse ops)
// with its own readers of every kv cache dtype (fp8_v4 through its per-page
// layout), the V4 window built on the device, the compressed cache, sinks and
// topk lengths; model-dtype operands, fp32 online softmax and accumulation,
// deterministic (no atomics). Any head count; keys up to 576 wide.
std::unique_ptr<Backend> make_cuda_sparse();

// "cuda.merge": the merge_states op (vLLM's merge_attn_states), one thread
// block per (token, head) row, fp32 scales; bf16, fp16 and fp32 outputs.
std::unique_ptr<Backend> make_cuda_merge();

// Host -> device uploads of paged caches so far in this process (each case's
// cache is uploaded once per block size and shared by the CUDA backends).
std::uint64_t cuda_cache_uploads();

namespace detail {
// Deliberate faults planted into cuda.ref's output stores, for the device
// tests only (never in the registry).
struct CudaFaults {
  long long skip_row = -1;      // the o / o_lat row with this flat (token, head) index is never written
  bool write_past_end = false;  // one element past the end of o / o_lat is written
};
std::unique_ptr<Backend> make_cuda_ref_with_faults(const CudaFaults& faults);
// Kernel milliseconds of a CUDA backend's last op (CUDA events); -1 for other backends.
double cuda_last_kernel_ms(const Backend& b);
}  // namespace detail

}  // namespace mlagate
