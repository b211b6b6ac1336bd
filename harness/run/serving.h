// The calls a serving engine makes (SERVING.md): a case judged across several
// backend calls instead of one. A serving mode is one of the structs of
// harness/run/modes/ (CUDA-graph replay, batch invariance, decode context
// parallelism, decode loops), each with its own values, name, ops, validation
// and run; ServingMode holds exactly one of them (or the plain call), so two
// modes at once cannot be written down. Each mode turns the kernel-level decode
// op's record into the mode's record; the plain call still runs first and its
// verdict stands when it fails.
#pragma once

#include <concepts>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "harness/run/modes/batch_invariance.h"
#include "harness/run/modes/cuda_graph.h"
#include "harness/run/modes/dcp.h"
#include "harness/run/modes/decode_loop.h"
#include "harness/run/ops/op_run.h"  // lse_base_hint
#include "harness/run/runner.h"

namespace mlagate {

namespace modes {

// No mode: the plain call (run_one) on any op; the record's mode stays "".
struct Plain {
  std::string name() const { return {}; }
  static bool takes(Op) { return true; }
  void validate() const {}
  Record run(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) const { return run_one(ctx, b, op, cfg); }
};

}  // namespace modes

struct ServingMode {
  // A new mode is one more alternative here (SERVING.md, "Add a serving mode").
  using Kind = std::variant<modes::Plain, modes::CudaGraph, modes::BatchInvariance, modes::Dcp, modes::DecodeLoop>;
  Kind kind;

  ServingMode() = default;
  // Implicit, so that a mode is written as itself: `ServingMode m = modes::Dcp{2, 1};`.
  template <class Mode>
    requires(!std::same_as<std::remove_cvref_t<Mode>, ServingMode> && std::constructible_from<Kind, Mode>)
  ServingMode(Mode&& m) : kind(std::forward<Mode>(m)) {}

  bool active() const { return !std::holds_alternative<modes::Plain>(kind); }
  // The mode's values when it is that mode, else null.
  template <class Mode>
  const Mode* get() const {
    return std::get_if<Mode>(&kind);
  }
  template <class Mode>
  Mode* get() {
    return std::get_if<Mode>(&kind);
  }
  // "cuda-graph", "batch-invariance", "dcp=2,interleave=1", "steps=64"; "" when plain.
  std::string name() const;
  // The ops the mode runs: each mode's the decode op and the sparse decode op.
  bool takes(Op op) const;
  // A run's ops under the mode: with --op auto the decode op for dense cases
  // and sparse_decode for sparse ones; `asked` (the resolved --op) otherwise,
  // where any op the mode does not run is an InputError.
  std::vector<Op> ops(bool auto_ops, const std::vector<Op>& asked, const std::vector<CaseSpec>& cases) const;
  // Throws InputError for the mode's values out of range.
  void validate() const;
};

// The mode's record for (case, backend, op); an op the mode does not take
// throws std::logic_error (the CLI runs modes on the decode ops only).
Record run_serving(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg, const ServingMode& mode);


}  // namespace mlagate
