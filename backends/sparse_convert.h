// What vLLM's Hopper sparse MLA backends do to a batch's top-k rows before
// their kernels, on the host, so that the adapters that call those kernels
// (flash_attn.mla.sparse, flashinfer.mla.sparse) do exactly that and a CPU
// test checks it without a GPU (tests/backends/test_sparse_convert.cpp):
// - triton_convert_req_index_to_global_index(..., return_valid_counts=True)
//   (vllm/v1/attention/backends/mla/sparse_utils.py): a row's slots keep their
//   columns (no compaction); valid_counts[t] = the number of slots >= 0;
// - FLASHINFER_MLA_SPARSE_SM90's plan: kv lengths from positions, not from the
//   rows (_kv_lens_host: ctx = position + 1; len = ctx if ctx <= index_topk,
//   else index_topk + ctx % kpool, kpool = max(tokens_per_state, 1)), a packed
//   CSR over them (kv_indptr = the lengths' prefix sums) and the slots copied
//   into it with negatives clamped to 0 (_pack_topk_indices: tl.maximum(v, 0)).
// Both kernels read the first valid_count (FA3: seqused_k) or planned-length
// (FlashInfer) slots of a row: they need the valid slots first, -1 only as a
// tail, which is how vLLM's indexer emits rows. Capabilities::
// sparse_valid_prefix declares that; the harness then hands such rows
// (valid_first_rows, reference/SPARSE.md "Row order").
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mlagate {

class Backend;
class Tensor;

// vLLM's valid_counts: per row of [T, K] slots, how many are >= 0.
std::vector<std::int32_t> vllm_valid_counts(std::span<const std::int32_t> slots, std::int64_t T, std::int64_t K);

// Each token's position in its request (p = seq_len - query_len + u for its
// u-th query token), as [T], from the batch's seq_lens [B] and
// query_start_loc [B+1].
std::vector<std::int32_t> token_positions(std::span<const std::int32_t> seq_lens,
                                          std::span<const std::int32_t> query_start_loc);

// FLASHINFER_MLA_SPARSE_SM90's per-row kv lengths from positions (a negative
// position, a padding token of a request with no key, gets 0).
std::vector<std::int32_t> vllm_sm90_kv_lens(std::span<const std::int32_t> positions, int index_topk, int kpool = 1);

// Its packed CSR: indptr [T+1] = prefix sums of lens; indices [indptr[T]] =
// row t's first lens[t] slots, each max(slot, 0). Throws std::invalid_argument
// when a length exceeds the row width K (vLLM's pack kernel would read the
// next row's slots).
struct PackedRows {
  std::vector<std::int32_t> indptr, indices;
};
PackedRows vllm_sm90_pack(std::span<const std::int32_t> slots, std::int64_t T, std::int64_t K,
                          std::span<const std::int32_t> lens);

// The harness side: each row of [T, K] slots reordered in place so its slots
// >= 0 come first, in their order, then its negative ones (a stable
// partition). The set of keys a row names is unchanged, so the reference
// output is too.
void valid_first_rows(std::span<std::int32_t> slots, std::int64_t T, std::int64_t K);

// The harness's hand-over of [T, K] top-k rows to `b`: valid_first_rows when
// `b` declares Capabilities::sparse_valid_prefix and the rows come without
// topk_length; as they are otherwise. One rule for the sparse op, the serving
// calls and graph mode.
void order_rows_for(const Backend& b, Tensor& slots, bool with_lengths);

}  // namespace mlagate
