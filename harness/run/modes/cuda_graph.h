// --cuda-graph (SERVING.md, "CUDA-graph replay"): the decode captured once per
// capture size and backend, kept across a run's cases, and replayed for each
// case padded up to the captured batch (modes/cuda_graph.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "harness/run/runner.h"

namespace mlagate {

// Captured graphs by backend and capture key, kept across the cases of a
// process as a serving engine keeps them across steps (modes/cuda_graph.cpp).
struct GraphStore;
std::shared_ptr<GraphStore> make_graph_store();

// vLLM's decode capture sizes (requests): 1, 2, 4, then 8 to 512 by 8.
std::vector<int> default_capture_sizes();

namespace modes {

struct CudaGraph {
  std::vector<int> capture_sizes = default_capture_sizes();  // --capture-sizes
  // The run's graphs (make_graph_store): shared by every copy of the mode so
  // that later cases replay what earlier ones captured; run() needs one.
  std::shared_ptr<GraphStore> graphs;

  std::string name() const { return "cuda-graph"; }
  static bool takes(Op op) { return op == Op::kDecode || op == Op::kSparseDecode; }
  // InputError when the sizes are not increasing within 1..65536.
  void validate() const;
  Record run(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) const;
};

}  // namespace modes
}  // namespace mlagate
