// Deliberate faults of cpu.sparse for the planted-bug tests of the sparse ops
// (one per bug class of reference/SPARSE.md). Production backends
// always run with the defaults.
#pragma once

#include <memory>
#include <string>

#include "backends/backend.h"

namespace mlagate {

struct SparseFaults {
  bool reads_invalid_index = false;   // -1 read as slot 0 (the null block) instead of skipped
  bool past_end_wraps = false;        // sparse_prefill: an index >= S_kv read as row index % S_kv, not skipped
  bool ignores_topk_length = false;   // every slot of a row read, past topk_length too
  bool tail_needs_invalid = false;    // past 64 query tokens, a row ends at its first -1, not at topk_length
                                      // (flashinfer #5095: lanes past the length must be -1 there)
  bool valid_count_prefix = false;    // sparse_decode: a row without topk_length read as its first
                                      // count(slots >= 0) slots, a -1 among them as slot 0 (FA3's seqused_k
                                      // and FlashInfer SM90's clamp, given -1s that are not a tail)
  bool declare_valid_prefix = false;  // not a fault: the test double declares Capabilities::sparse_valid_prefix
  bool declare_no_dcp = false;        // not a fault: the test double declares Capabilities::no_dcp
  bool dedups_indices = false;        // a slot named twice in a row counted once (both ops)
  bool past_end_clamped = false;      // sparse_prefill: an index >= S_kv read as row S_kv - 1, not skipped
  bool raw_scales_as_bf16 = false;    // fp8_ds_mla tile scales rounded to bf16 before use (FlashMLA's V3.2
                                      // decode does so: exact only for the pow2 rule)
  bool drops_sink = false;            // the sink left out of the denominator
  bool sink_in_lse = false;           // the sink counted in the returned lse
  bool reader_pow2_scales = false;    // fp8_ds_mla tile scales read as 2^exponent (a raw-rule cache misread)
  int window_extra = 0;               // V4 window widened by this many keys (off by one: 1)
  bool writer_contiguous_v4 = false;  // fp8_v4 entries written as 584 contiguous bytes, not split per page
};

namespace detail {
std::unique_ptr<Backend> make_cpu_sparse_with_faults(const SparseFaults& faults, const std::string& name);
}  // namespace detail

}  // namespace mlagate
