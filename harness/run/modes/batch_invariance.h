// --check batch-invariance (SERVING.md, "Batch invariance"): every request's
// rows must be bitwise equal alone, in its batch, shuffled and beside extra
// requests (modes/batch_invariance.cpp).
#pragma once

#include <string>

#include "harness/run/runner.h"

namespace mlagate::modes {

struct BatchInvariance {
  std::string name() const { return "batch-invariance"; }
  static bool takes(Op op) { return op == Op::kDecode || op == Op::kSparseDecode; }
  void validate() const {}  // nothing to choose
  Record run(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) const;
};

}  // namespace mlagate::modes
