// The kernel-level decode op module: every request decoded at once on the
// case's absorbed queries (run_decode_op), its inputs and fp64 reference made
// once per case (DecodeState), and its err_baseline. The serving modes
// (harness/run/serving*.cpp) run their calls on the same state.
#pragma once

#include <optional>
#include <vector>

#include "backends/backend.h"
#include "cases/case.h"
#include "cases/paged_cache.h"
#include "harness/run/case_context.h"
#include "harness/run/ops/driver.h"
#include "harness/run/ops/op_run.h"

namespace mlagate {

// Kernel-level decode of every request on absorbed queries (q_lat [T,N,L], q_pe [T,N,R]).
// cache: built with write_new_tokens = true.
OpRun run_decode_op(Backend& b, const Case& c, const PagedCache& cache, const Tensor& q_lat, const Tensor& q_pe,
                    const ExecOptions& opt);

// The decode op's state in a case's context.
struct DecodeState : OpState {
  // Absorbed queries of every token and the fp64 reference on exactly them.
  std::optional<Tensor> q_lat, q_pe;
  std::vector<double> mqa_o_lat, mqa_lse;
  std::optional<BaselineErrors> base;  // err_baseline (the model-dtype emulation's)
  // fp8 caches: the reference's o_lat over the unquantized inputs.
  std::optional<std::vector<double>> unquantized_mqa;
  std::unique_ptr<OpState> keep_for_inputs(bool was_fp8) override;
};

// The decode op's state with its queries and reference made (on first use).
DecodeState& decode_state(CaseContext& ctx);
// Its err_baseline, made on first use.
BaselineErrors decode_baseline(CaseContext& ctx);

}  // namespace mlagate
