// What every op module shares: the outputs an op hands back to be judged (ProducedOutput, OpRun) and the
// checks every kernel call ends with (guard bands, a print of lent inputs).
// The bottom of harness/run/ops: it knows no op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cases/tensor.h"
#include "harness/run/guarded.h"
#include "harness/run/run_config.h"  // ExecOptions, ProducedOutput
#include "reports/record.h"

namespace mlagate {



struct OpRun {
  std::vector<ProducedOutput> outputs;
  std::vector<std::string> paths;  // layer: per request
  std::string guard_violation;     // first out-of-bounds write into a kernel output
  double run_ms = 0;               // time inside the backend's kernels
  // An op that judges itself (cache_write: bit-exact against the reference
  // writer) sets its verdict here; its outputs, if any, are not compared.
  std::optional<Status> verdict;
  std::string verdict_message;
};

// Records the first guard-band violation of a kernel output buffer in run.
void note_guard(OpRun& run, const GuardedBuffer& buf, const std::string& name);
// The end of a kernel-level op: both outputs' guard bands checked (under the
// outputs' names), each of the case's requests recorded as taking `path`, and
// the outputs moved into run.
void finish_kernel_op(OpRun& run, ProducedOutput& out, ProducedOutput& lse, int num_requests, const char* path);

// A 64-bit print of a tensor's bytes, to notice a backend that wrote into
// inputs it was lent (fast: a GB in a fraction of a second on 16 cores).
std::uint64_t fingerprint(const Tensor& t);
std::uint64_t fingerprint(const void* data, std::size_t nbytes);  // any bytes (a TensorView's)

// The lse base of a kernel's lse against the natural-log reference: "" when
// the values do not fit base 2 better than base e, else a sentence saying
// they are log2 (got * ln 2 matches the reference). Rows where either is not
// finite are skipped.
std::string lse_base_hint(const TensorView& got, const std::vector<double>& reference);

}  // namespace mlagate
