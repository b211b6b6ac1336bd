// The sparse ops module (DeepSeek V3.2 top-k and V4 window + compressed
// attention): its state per case (query, reference, V4's compressed caches)
// and, for one backend on one case, the kernel's arguments built from the
// case's index sets and paged caches (cases/sparse.h), the call with guarded
// outputs, and the outputs returned for comparison.
#pragma once

#include <map>
#include <optional>

#include "backends/backend.h"
#include "cases/case.h"
#include "cases/paged_cache.h"
#include "harness/run/case_context.h"
#include "harness/run/ops/driver.h"
#include "harness/run/ops/op_run.h"
#include "reference/sparse_reference.h"

namespace mlagate {

// A sparse decode call's inputs for backend `b` on a case, as the sparse op
// hands them: the case's top-k rows as global slots of `cache` (valid-first
// where `b` declares sparse_valid_prefix, backends/sparse_convert.h) with
// their lengths, or V4's window; the compressed cache `extra` (or nullptr)
// with its rows; the batch, every request on its own table row; the sink and
// the scale. `args` views the index tensors and rows held here, so a call is
// built in place and never copied or moved. The caller sets args.o and args.lse.
class SparseDecodeCall {
 public:
  SparseDecodeCall(const Backend& b, const Case& c, const PagedCache& cache, const PagedCache* extra, const Tensor& q);
  SparseDecodeCall(const SparseDecodeCall&) = delete;
  SparseDecodeCall& operator=(const SparseDecodeCall&) = delete;

 private:
  Tensor main_slots_, extra_slots_;
  std::vector<std::int32_t> rows_;

 public:
  SparseDecodeArgs args;
};

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

// The sparse ops' state in a case's context: the kernels' query, the fp64
// reference on it, V4's compressed caches (by block size) and the
// model-dtype emulation's errors.
struct SparseState : OpState {
  std::optional<Tensor> sparse_q;
  SparseReference sparse_ref;
  std::map<int, PagedCache> extra_caches;
  std::optional<BaselineErrors> base;
  void retag(const CaseSpec& spec) override;
};

// The sparse ops' state with its query and reference made (on first use).
SparseState& sparse_state(CaseContext& ctx);
// V4's compressed cache for a block size (nullptr for cases without one).
const PagedCache* sparse_extra_cache(CaseContext& ctx, int bs, const ExecOptions& opt, double& ms);
// err_baseline of the sparse ops, made on first use.
BaselineErrors sparse_baseline(CaseContext& ctx);

}  // namespace mlagate
