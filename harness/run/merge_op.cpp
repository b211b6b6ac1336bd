// merge_states op execution: the kernel's arguments from a merge case, guarded
// outputs, the input check, timings.
#include "harness/run/merge_op.h"

#include <chrono>
#include <cstring>

#include "cases/merge.h"
#include "reports/profile.h"

namespace mlagate {

OpRun run_merge_op(Backend& b, const Case& c, const ExecOptions& opt) {
  const MergeInputs& in = *c.merge;
  const std::int64_t T = c.num_tokens, N = c.spec.num_heads(), D = c.spec.merge.head_dim;
  // Copies, so a backend that writes into its inputs neither changes the next
  // backend's nor goes unnoticed (vLLM calls the merge out of place).
  Tensor po = in.prefix_output, pl = in.prefix_lse, so = in.suffix_output, sl = in.suffix_lse;
  ProducedOutput out{"out", GuardedBuffer(c.spec.dtype, {T, N, D}, opt.poison, opt.reuse_buffers), N, D, false};
  ProducedOutput lse{"lse", GuardedBuffer(DType::kF32, {T, N}, opt.poison, opt.reuse_buffers), N, 1, true};
  MergeStatesArgs a;
  a.prefix_output = po.view();
  a.prefix_lse = pl.view();
  a.suffix_output = so.view();
  a.suffix_lse = sl.view();
  a.output = out.buf.view();
  a.output_lse = lse.buf.view();
  OpRun run;
  const auto t0 = std::chrono::steady_clock::now();
  b.merge_states(a);
  run.run_ms = backend_call_done(t0);
  const std::pair<const Tensor*, const Tensor*> given[] = {{&po, &in.prefix_output}, {&pl, &in.prefix_lse},
                                                           {&so, &in.suffix_output}, {&sl, &in.suffix_lse}};
  const char* names[] = {"prefix_output", "prefix_lse", "suffix_output", "suffix_lse"};
  for (int i = 0; i < 4 && run.guard_violation.empty(); ++i)
    if (std::memcmp(given[i].first->bytes(), given[i].second->bytes(), given[i].second->nbytes()) != 0)
      run.guard_violation = std::string("merge_states wrote into its input ") + names[i];
  finish_kernel_op(run, out, lse, c.num_requests, "merge_states");
  return run;
}

}  // namespace mlagate
