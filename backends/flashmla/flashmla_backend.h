// The FlashMLA adapter's public face (free of CUDA and FlashMLA headers so the
// registry can include it). Built only with -DMLAGATE_FLASHMLA_SOURCE_DIR.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace mlagate {

// "flashmla": deepseek-ai/FlashMLA's sm90a dense decode (scheduler metadata,
// split-KV kernel, combine) called through its plain params structs on
// mlagate's paged cache as is ([num_blocks, 64, L + R] in the model dtype is
// the library's [num_blocks, 64, 1, 576]). Capabilities as the library states
// them: block size 64, bf16/fp16, head dims 576 (or 512) with d_v 512,
// UNIFORM query lengths, sm90a only.
std::unique_ptr<Backend> make_flashmla();

// "flashmla.sparse": FlashMLA's sm90 sparse kernels on the sparse ops. Decode:
// V3.2 (d_qk 576) on fp8_ds_mla with pow2 scales, no topk_length; V4 MODEL1
// (d_qk 512) on fp8_v4 with the window as topk rows + lengths, the compressed
// cache as the extra cache, sinks. Prefill: bf16 rows, d_qk 576 or 512, d_v
// 512. bf16 only; heads padded to 64 / 128 (at most 128); any page block size.
std::unique_ptr<Backend> make_flashmla_sparse();

namespace detail {
// Tests only (never in the registry): "flashmla.sparse+raw", flashmla.sparse
// that also runs V3.2 decode on fp8_ds_mla:raw caches, to measure the
// library's bf16 rounding of non-power-of-two tile scales.
std::unique_ptr<Backend> make_flashmla_sparse_raw_scales();
}  // namespace detail

}  // namespace mlagate
