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

}  // namespace mlagate
