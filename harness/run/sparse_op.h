// Runs the sparse ops (DeepSeek V3.2 top-k and V4 window + compressed
// attention) of one backend on one case: builds the kernel's arguments from
// the case's index sets and paged caches (cases/sparse.h), calls the backend
// with guarded outputs, and returns them for comparison.
#pragma once

#include "backends/backend.h"
#include "cases/case.h"
#include "cases/paged_cache.h"
#include "harness/run/layer.h"

namespace mlagate {

// cache: the case's cache (new tokens written); extra: V4's compressed cache
// of the same block size, or nullptr; q: sparse_query's [T, N, L+R].
OpRun run_sparse_decode_op(Backend& b, const Case& c, const PagedCache& cache, const PagedCache* extra, const Tensor& q,
                           const ExecOptions& opt);
// The prefill kernel reads a flat workspace: every slot of `cache` (then of
// `extra`) dequantized to the model dtype, unused (poisoned) slots included,
// with the index sets as rows of it (V4: the window and the compressed rows in
// one row per token, with its length).
OpRun run_sparse_prefill_op(Backend& b, const Case& c, const PagedCache& cache, const PagedCache* extra, const Tensor& q,
                            const ExecOptions& opt);

}  // namespace mlagate
