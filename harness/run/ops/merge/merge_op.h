// The merge_states op module (vLLM's merge_attn_states): for one backend on
// one merge case, the case's two partial results (cases/merge.h) handed over as
// fresh copies, guarded and poisoned outputs, and a check that the backend
// left its inputs as it got them.
#pragma once

#include "backends/backend.h"
#include "cases/case.h"
#include "harness/run/ops/op_run.h"

namespace mlagate {

// Outputs "out" [T, N, D] (the case's dtype) and "lse" [T, N] float32. A
// backend that wrote into an input is a guard violation naming the input.
OpRun run_merge_op(Backend& b, const Case& c, const ExecOptions& opt);

}  // namespace mlagate
