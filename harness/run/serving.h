// The calls a serving engine makes (SERVING.md): a case judged across several
// backend calls instead of one. CUDA-graph replay (a decode captured once per
// capture size and replayed for padded batches), batch invariance (every request alone, in its
// batch, shuffled and beside extra requests: bitwise equal rows), decode
// context parallelism (each request's keys sharded over virtual ranks as vLLM
// shards them, the partial results merged through their LSEs) and decode loops
// (a case as N decode steps, each writing its token with the backend's own
// cache_write). Each mode turns the kernel-level decode op's record into the
// mode's record; the plain call still runs first and its verdict stands when it
// fails.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "harness/run/ops/op_run.h"
#include "harness/run/runner.h"

namespace mlagate {

// Captured graphs by backend and capture key, kept across the cases of a
// process as a serving engine keeps them across steps (serving.cpp).
struct GraphStore;
std::shared_ptr<GraphStore> make_graph_store();

// vLLM's decode capture sizes (requests): 1, 2, 4, then 8 to 512 by 8.
std::vector<int> default_capture_sizes();

struct ServingMode {
  bool cuda_graph = false;        // --cuda-graph
  std::vector<int> capture_sizes = default_capture_sizes();  // --capture-sizes
  std::shared_ptr<GraphStore> graphs;  // made on first use when null
  bool batch_invariance = false;  // --check batch-invariance
  int dcp = 0;                    // --dcp N: ranks (>= 2); 0: off
  int dcp_interleave = 1;         // --dcp-interleave K: tokens per rank in turn
  int steps = 0;                  // --steps N: decode steps (>= 1); 0: off
  bool active() const { return cuda_graph || batch_invariance || dcp > 0 || steps > 0; }
  // The ops the modes run: the decode op and the sparse decode op.
  bool takes(Op op) const;
  // A run's ops under the mode: with --op auto the decode op for dense cases
  // and sparse_decode for sparse ones; `asked` (the resolved --op) otherwise,
  // where any op the mode does not run is an InputError.
  std::vector<Op> ops(bool auto_ops, const std::vector<Op>& asked, const std::vector<CaseSpec>& cases) const;
  // "cuda-graph", "batch-invariance", "dcp=2,interleave=1", "steps=64"; "" when off.
  std::string name() const;
  // Throws InputError for values out of range or two modes at once.
  void validate() const;
};

// The mode's record for (case, backend, decode op); any other op throws
// std::logic_error (the CLI runs modes on the decode op only).
Record run_serving(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg, const ServingMode& mode);

// Decode loops: when request i of an N-step loop over a batch of B joins and
// how many tokens it decodes. Requests 0, 3, 6, ... run every step; 1, 4, ...
// join late (after N/4 steps) and 2, 5, ... finish early (N/4 steps before the
// end), so the batch changes composition as requests join and finish.
// `tokens`: the request's query length in an already rewritten case; a request
// with more tokens than steps throws InvalidCase.
std::pair<int, int> loop_join_and_count(int request, int steps);  // {join step, tokens}
int loop_join(int request, int tokens, int steps);
// The case of an N-step loop: request i keeps its context (seq_len - query_len)
// and decodes loop_join_and_count(i, N).second tokens, one per step; the id is
// unchanged (the mode is in the record and the repro command).
CaseSpec decode_loop_spec(const CaseSpec& spec, int steps);

// DCP's sharding of one request's keys (vLLM's interleaved layout): token p
// belongs to rank (p / interleave) % ranks, at local position
// (p / (ranks * interleave)) * interleave + p % interleave.
int dcp_rank_of(int pos, int ranks, int interleave);
int dcp_local_pos(int pos, int ranks, int interleave);
// How many of the first `visible` keys rank r holds.
int dcp_local_count(int visible, int rank, int ranks, int interleave);

}  // namespace mlagate
