// Planted-bug backends (tests only, never in the registry): broken variants of
// cpu.paged, one per real MLA bug class, each with the verdict the harness
// must reach on it. They prove the harness catches what it exists to catch.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "reports/record.h"

namespace mlagate {

struct PlantedBug {
  std::string name;         // "bug.<what>", also the backend's name()
  std::string description;
  Status expected;          // the verdict on a case that exposes the bug
  std::function<std::unique_ptr<Backend>()> make;
  // fp8 bugs: the cases that expose the bug (on the others it must pass);
  // empty for the bugs every detection case may expose.
  std::function<bool(const CaseSpec&)> exposed_by;
};

// bug.causal_off_by_one, bug.scale_1pct, bug.null_block_last_token,
// bug.heads_swapped, bug.one_nan, bug.lse_wrong_axis, bug.softmax_without_max. Each keeps cpu.paged's
// capabilities, so it runs on the same cases.
const std::vector<PlantedBug>& planted_bugs();

// fp8 cache bugs (SPEC: KV cache dtypes and Bug classes: writers and readers disagreeing
// about scales and rounding), a separate list because only fp8 cases expose
// them: bug.fp8_reader_pow2_scales, bug.fp8_writer_truncates,
// bug.fp8_reader_ignores_k_scale, bug.fp8_writer_saturates_240 and
// bug.fp8_scale_model_dtype_multiply (FlashInfer's MLA kernels: k_scale rounded
// to the model dtype and multiplied in it; exposed where k_scale is not exact
// there, e.g. 0.01). The writer bugs live in cpu.paged's cache_write, which
// the planted backends keep.
const std::vector<PlantedBug>& planted_fp8_bugs();

// What the vllm suite lets through and the gate suite catches, each on at
// least 3 records (with bug.softmax_without_max above and the fp8 readers
// bug.fp8_reader_ignores_k_scale, bug.fp8_reader_pow2_scales and
// bug.fp8_scale_model_dtype_multiply):
// bug.block_stride_16, bug.empty_rows_nan, bug.nondeterministic.
const std::vector<PlantedBug>& planted_gate_bugs();

// Memory-layout bugs (cases/LAYOUTS.md), each exact on contiguous tensors in
// fitted pools with private pages, and INCORRECT on the layout that exposes it
// (exposed_by): bug.offset_32bit (pool4g), bug.q_stride_is_width and
// bug.writes_row_padding (strided), bug.blocks_not_shared (shared). cpu.paged
// with the fault planted in its kernel; the gate catches each on >= 3 records.
const std::vector<PlantedBug>& planted_layout_bugs();

// merge_states bugs (the op's infinities, SPEC: Ops, merge_states): broken
// merges with cpu.merge's capabilities, each NONFINITE on the merge suite and
// on the gate's merge cases: bug.merge_inf_nan (no case for infinities: NaN
// where both sides are empty or one is +inf) and bug.merge_pinf_as_value
// (+inf read as a real lse: the empty side wins, lse +inf).
const std::vector<PlantedBug>& planted_merge_bugs();

}  // namespace mlagate

namespace mlagate {

// Bugs of the calls a serving engine makes (harness/run/SERVING.md), each
// invisible to plain runs and caught by exactly one mode (`mode`):
// bug.batch_size_splits (--check batch-invariance: BATCH_VARIANT),
// bug.lse_log2 (--dcp: INCORRECT; plain runs under --policy vllm, which does
// not gate lse, pass it), bug.fp8_scale_lost_after_step (--steps: INCORRECT on
// fp8 caches with k_scale != 1), bug.graph_stale_padding (--cuda-graph:
// NONFINITE) and bug.graph_metadata_fixed_at_capture (--cuda-graph: INCORRECT
// from the second batch of a capture size on).
struct PlantedServingBug {
  PlantedBug bug;
  std::string mode;  // the flags that catch it, e.g. "--dcp 2"
};
const std::vector<PlantedServingBug>& planted_serving_bugs();
// bug.sparse_batch_size_splits: the sparse decode op's batch-size heuristic
// (BATCH_VARIANT under --check batch-invariance on the sparse and v4 suites).
PlantedServingBug planted_sparse_batch_bug();
// The sparse decode op's lse in base 2: plain runs under the vllm policy pass, --dcp catches it.
PlantedServingBug planted_sparse_lse_bug();
// The sparse decode's graph keeps the captured index rows and seq_lens: --cuda-graph catches it.
PlantedServingBug planted_sparse_graph_bug();

}  // namespace mlagate
