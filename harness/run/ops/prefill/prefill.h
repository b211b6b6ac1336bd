// The kernel-level prefill op module: ordinary causal attention of every
// request over the case's up-projected keys and values (run_prefill_op),
// judged against the case's absorbed reference. Its K and V are the layer
// module's projected rows (ops/layer/layer.h), lent, not copied.
#pragma once

#include "backends/backend.h"
#include "cases/case.h"
#include "harness/run/ops/op_run.h"

namespace mlagate {

// Kernel-level prefill of every request over the up-projected keys (k [S,N,P+R], v [S,N,V]).
OpRun run_prefill_op(Backend& b, const Case& c, const Tensor& k, const Tensor& v, const ExecOptions& opt);

}  // namespace mlagate
