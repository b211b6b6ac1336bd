// --repeat N: one (case, backend, op) run N times on the same inputs, outputs
// compared bit for bit. Any difference (or a different verdict) makes the
// record NONDETERMINISTIC, with how many runs differed from the first and the
// first differing element of each output.
#pragma once

#include "harness/run/runner.h"

namespace mlagate {

Record run_repeated(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg, int repeat);

}  // namespace mlagate
