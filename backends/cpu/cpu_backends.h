// The CPU backends: GPU-kernel precision on the host. They run without a GPU
// and are the same-precision baseline other backends are measured against.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace mlagate {

// "cpu.paged": decode through the block table in one pass over the keys, and
// ordinary varlen prefill.
std::unique_ptr<Backend> make_cpu_paged();

// "cpu.splitkv": flash-decoding; each request's keys are cut into splits of
// 256 keys whose partial (o, lse) are merged through their LSEs.
std::unique_ptr<Backend> make_cpu_splitkv();
// The same with exactly num_splits splits per request (>= 1), for tests;
// splits past a short request's keys stay empty.
std::unique_ptr<Backend> make_cpu_splitkv_forced(int num_splits);

// "cpu.sparse": the sparse ops (DeepSeek V3.2 top-k, V4 window + compressed
// cache) with a GPU kernel's precision; no dense ops.
std::unique_ptr<Backend> make_cpu_sparse();
// "cpu.sparse.splitkv": the same with each row's keys in splits of 256 whose
// fp32 partials are merged through their LSEs (FlashMLA's split-KV + combine).
std::unique_ptr<Backend> make_cpu_sparse_splitkv();

// "cpu.merge": the merge_states op (vLLM's merge_attn_states) with a GPU
// kernel's precision; no attention ops.
std::unique_ptr<Backend> make_cpu_merge();

}  // namespace mlagate
