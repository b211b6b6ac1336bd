// --dcp N [--dcp-interleave K] (SERVING.md, "DCP"): each request's keys
// sharded over N virtual ranks as vLLM's decode context parallelism shards
// them, the backend called per shard and the partials merged through their
// LSEs (modes/dcp.cpp; the sparse decode op's in modes/dcp_sparse.cpp).
#pragma once

#include <string>

#include "harness/run/dcp_layout.h"
#include "harness/run/runner.h"

namespace mlagate {

namespace modes {

struct Dcp {
  int ranks = 2;       // --dcp N
  int interleave = 1;  // --dcp-interleave K: consecutive tokens per rank in turn

  std::string name() const;  // "dcp=2,interleave=1"
  static bool takes(Op op) { return op == Op::kDecode || op == Op::kSparseDecode; }
  // InputError when the ranks are not in 2..64 or the interleave is below 1.
  void validate() const;
  Record run(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) const;
  // run() on the sparse decode op (modes/dcp_sparse.cpp).
  Record run_sparse(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) const;
};

}  // namespace modes
}  // namespace mlagate
