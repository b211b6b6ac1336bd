// --steps N (SERVING.md, "Decode loops"): a case as N decode steps, requests
// joining and finishing, each step writing its tokens with the backend's own
// cache_write and judged on its own (modes/decode_loop.cpp).
#pragma once

#include <string>
#include <utility>

#include "harness/run/runner.h"

namespace mlagate {

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

namespace modes {

// Runs cases already rewritten by decode_loop_spec (the CLI rewrites them
// before planning, a golden file stores them rewritten).
struct DecodeLoop {
  int steps = 1;  // --steps N

  std::string name() const { return "steps=" + std::to_string(steps); }
  static bool takes(Op op) { return op == Op::kDecode || op == Op::kSparseDecode; }
  // InputError when the steps are not in 1..4096.
  void validate() const;
  Record run(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) const;
};

}  // namespace modes
}  // namespace mlagate
