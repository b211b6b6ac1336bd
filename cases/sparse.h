// Inputs of the sparse ops (DeepSeek V3.2 DSA and V4 attention): each query
// token's index sets, drawn as positions within the token's request and turned
// into global slots of a paged cache per block size; the attention sink; and
// V4's compressed cache. Semantics (reference/SPARSE.md):
// - V3.2: token t attends to the keys its top-k row names; -1 names none.
//   Duplicates count once per occurrence (FlashMLA gathers every index).
// - V4: token t at position p attends to the window p - window + 1 .. p of its
//   request (clipped at 0) in the case's cache, plus the compressed entries its
//   extra row names in the compressed cache (C4A: a top-k of the (p+1)/ratio
//   visible ones; C128A: all of them when the row is wide enough).
// - The oob pattern's unused slots name indices at or past the end of the
//   buffer the kernel's indices point into (s_kv): FlashMLA's sparse prefill
//   reads any index >= s_kv as no key, its sparse decode defines only -1, so
//   the prefill op gets them as indices >= s_kv and the decode op as -1.
// - Only the first topk_length[t] slots of a row count when lengths are given;
//   the slots past it name entries that must never be read (poisoned ones for
//   top-k rows, keys of the request outside the selection for compressed rows).
// - sink[h] joins the softmax denominator of head h with no value; lse leaves it out.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cases/case.h"
#include "cases/paged_cache.h"
#include "cases/tensor.h"

namespace mlagate {

inline constexpr std::int32_t kIndexInvalid = -1;   // no key (FlashMLA's -1)
inline constexpr std::int32_t kIndexPoisoned = -2;  // past topk_length: a poisoned slot in the kernel's row

// No key, as an index at or past the end of the buffer (the oob pattern). The
// buffer's size s_kv depends on the block size, so a row stores a code that
// global_slots turns into an index per buffer:
//   kIndexPastEnd - d, d in [0, kPastEndNear]   -> s_kv + d (exactly s_kv at d = 0)
//   kIndexFar + r,     r in [0, kPastEndFar)    -> INT32_MAX - r (never below s_kv)
inline constexpr std::int32_t kIndexPastEnd = -3;
inline constexpr std::int32_t kPastEndNear = 64;
inline constexpr std::int32_t kIndexFar = std::numeric_limits<std::int32_t>::min();
inline constexpr std::int32_t kPastEndFar = 1 << 29;
// Whether a stored position is one of those codes.
constexpr bool is_past_end(std::int32_t code) {
  return (code <= kIndexPastEnd && code >= kIndexPastEnd - kPastEndNear) ||
         (code >= kIndexFar && code < kIndexFar + kPastEndFar);
}
// The index a code names in a buffer of s_kv keys (s_kv <= INT32_MAX).
std::int32_t past_end_index(std::int32_t code, std::int64_t s_kv);

struct IndexSet {
  int width = 0;                     // K: index slots per token
  std::vector<std::int32_t> pos;     // [T, K] request-local key positions, kIndexInvalid, kIndexPoisoned or a
                                     // past-the-end code (is_past_end; the oob pattern only)
  std::vector<std::int32_t> length;  // [T] slots that count (topk_length); empty: all K count
  bool empty() const { return width == 0; }
  int count(int t) const { return length.empty() ? width : length[static_cast<std::size_t>(t)]; }
};

struct SparseInputs {
  IndexSet main;            // V3.2: the top-k rows (V4: empty, the window is a rule)
  IndexSet extra;           // V4: rows into the compressed cache (empty without one)
  Case compressed;          // V4: the compressed cache's entries (seq_lens s_i / ratio; no queries)
  std::vector<float> sink;  // [N] or empty
};

// Draws the sparse inputs of a case whose spec.sparse is active (the case's
// cache values must be filled: the compressed case follows its kv dtype).
std::shared_ptr<const SparseInputs> generate_sparse(const Case& c);
// The same inputs for a case retargeted to another kv cache dtype or k_scale:
// only the compressed cache's values change.
std::shared_ptr<const SparseInputs> retarget_sparse(const SparseInputs& s, const CaseSpec& spec);

// V4's compressed cache as a case without tensors: seq_lens s_i / ratio, no
// queries, its own seed (block permutation); generate_sparse draws its kv_c
// and k_pe, a golden file reader fills them from the file.
Case compressed_layout(const Case& c);

// Request of each query token, from query_start_loc.
std::vector<int> token_requests(const Case& c);
// Position of query token t in its request (context_len + u); negative for padding.
int token_position(const Case& c, int request, int t);

// The keys token t attends to, as request-local positions, in order, with
// duplicates: the main cache (V3.2 row or V4 window) and the compressed cache.
void main_positions(const Case& c, int t, std::vector<int>& out);
void extra_positions(const Case& c, int t, std::vector<int>& out);

// An index set as a kernel sees it: [T, K] int32 global slots of `cache`
// (block_table[request, pos / bs] * bs + pos % bs), -1 for kIndexInvalid and a
// slot of the null block (poisoned) for kIndexPoisoned; and the lengths.
// Past-the-end codes become -1 without `s_kv` (the ops that define only -1:
// sparse_decode), else indices >= *s_kv (sparse_prefill, whose flat buffer has
// s_kv rows); past a row's length (lens_garbage) they are always indices past
// the buffer (*s_kv, else the pool's slots): garbage no kernel may read.
Tensor global_slots(const Case& owner, const IndexSet& set, const PagedCache& cache,
                    std::optional<std::int64_t> s_kv = std::nullopt);
// V4's window rows as global slots: [T, window], -1 past each token's count,
// with the counts (the reference way a backend builds them; backends/backend.h).
void window_slots(const Case& c, int window, const PagedCache& cache, Tensor& slots, std::vector<std::int32_t>& lens);

// Why a stored or produced index tensor cannot be used with this cache
// ("" when every slot is -1 or in [0, num_blocks * block_size), or, with
// past_end_is_invalid (sparse_prefill's form), at or past that end); for input checks.
std::string check_slots(const TensorView& slots, const PagedCache& cache, const std::string& what,
                        bool past_end_is_invalid = false);

}  // namespace mlagate
