// The FlashAttention-3 MLA adapter's public face (free of CUDA and
// flash-attention headers so the registry can include it). Built only with
// -DMLAGATE_FLASH_ATTN_SOURCE_DIR.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace mlagate {

// "flash_attn.mla": FlashAttention-3's Hopper forward with q_v, called the way
// vLLM's FLASH_ATTN_MLA backend calls it (FlashAttnMLAImpl.forward_mqa):
// q = q_pe, k = the cache's k_pe columns, v = its kv_c columns, q_v = the
// absorbed q_nope, causal, seqused_k, the block table, scheduler metadata
// computed ahead of time (get_scheduler_metadata) and num_splits (0: FA3's
// heuristic; --splits N passes N, the bound the scheduler's per-request split
// counts stay within). The prefill path of the layer op is FA3's
// varlen MHA with qk 192 / v 128 where the build has those instantiations.
// Capabilities as vLLM declares them: fp16/bf16, kv cache auto only, block
// sizes multiples of 16, VARLEN queries with reorder threshold 512; sm90 only.
std::unique_ptr<Backend> make_flash_attn_mla(const BackendOptions& options);

// "flash_attn.mla.cudagraph": the same as vLLM's full-CUDA-graph mode calls it:
// the scheduler metadata kept in one buffer for the backend's life, sized for
// the largest batch, each call's metadata copied to its head and the rest
// zeroed (vLLM: "Otherwise, some thread blocks may use the invalid scheduler
// metadata and overwrite the output buffer"), and num_splits 32
// (flash_attn_max_num_splits_for_cuda_graph) for batches of at most 512 decode
// tokens unless --splits says otherwise.
std::unique_ptr<Backend> make_flash_attn_mla_cudagraph(const BackendOptions& options);

// vLLM's FLASH_ATTN_MLA_SPARSE: V3.2 sparse decode on FA3 (flash_attn_sparse.cu).
std::unique_ptr<Backend> make_flash_attn_mla_sparse();

namespace detail {
// Tests only (never in the registry), the two pieces of state the library
// leaves to its caller: the persistent buffer without zeroing its tail; and
// two forwards on one metadata (two layers of a step) without resetting the
// tile-count semaphore between them, the first into scratch outputs, with one
// split (vLLM's batch-invariant mode; the combine of a split call resets it).
std::unique_ptr<Backend> make_flash_attn_mla_stale_tail();
std::unique_ptr<Backend> make_flash_attn_mla_stale_semaphore();
// Whether this build compiled the prefill (hdim 192 / 128) instantiations.
bool flash_attn_has_prefill();
}  // namespace detail

}  // namespace mlagate
