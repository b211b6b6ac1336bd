// The FlashInfer MLA adapter's public face (free of CUDA and FlashInfer
// headers so the registry can include it). Built only with
// -DMLAGATE_FLASHINFER_INCLUDE_DIR.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace mlagate {

// "flashinfer.mla.fa2": flashinfer-ai/flashinfer's header-only FA2 MLA path
// (MLAPlan on the host, then BatchMLAPagedAttention) on mlagate's paged cache
// as is: ckv and kpe are the two fields of each [L + R] entry, the block table
// is the kv_indices array (request i's pages start at its row * width).
// Any page size, VARLEN queries with the bottom-right causal rule, bf16/fp16,
// the fp8 (per-tensor k_scale) cache with bf16 queries on sm90; lse asked for
// in natural log (the library's default is base 2).
std::unique_ptr<Backend> make_flashinfer_mla_fa2();
// "flashinfer.mla.fa3": the same plan and parameters run by the Hopper (FA3)
// kernel, BatchMLAPageAttentionHopper; built when CUTLASS headers are at hand
// (MLAGATE_HAS_FLASHINFER_FA3), sm90 only.
std::unique_ptr<Backend> make_flashinfer_mla_fa3();
// vLLM's FLASHINFER_MLA_SPARSE_SM90: V3.2 / NoPE sparse decode on the FA3 kernel (flashinfer_sparse.cu).
std::unique_ptr<Backend> make_flashinfer_mla_sparse();

namespace detail {
// Tests only: flashinfer.mla.sparse with kpe_scale = k_scale (vLLM passes 1.0).
std::unique_ptr<Backend> make_flashinfer_mla_sparse_kpe_scaled();
}  // namespace detail

}  // namespace mlagate
