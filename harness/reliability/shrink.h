// `mlagate shrink`: from one failing record, the smallest case that still
// fails the same way (the same status; an order-dependent failure stays
// order-dependent after the same predecessors). Candidates shrink one thing at
// a time: a serving mode's numbers first (half the --steps, half the --dcp
// ranks, half the --dcp-interleave), then drop a request, halve a context or a
// query (or cut a context by a power of two >= 64, which keeps its remainder
// by any tile), halve the heads, a smaller block size, one split (--splits 1),
// and for sparse cases half the top-k, window or compressed row, no compressed
// cache, no sink, the random index pattern; then Q magnitude and k_scale
// toward 1, bf16, an auto cache (the dims stay). A merge case (merge_states)
// has its own: fewer tokens, fewer heads, half the head dim, the lse pattern
// toward ordinary, no gap, bf16. Each candidate runs in a
// separate `mlagate run` process (the binary itself: crashes and hangs are
// records, plugins and exec backends come along as flags), from a suite file
// the shrink writes, so the final case is a file a user can rerun as is.
#pragma once

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "cases/case_spec.h"

namespace mlagate {

struct ShrinkOptions {
  std::vector<CaseSpec> before;  // run first, unchanged: the predecessors of an order-dependent failure
  CaseSpec target;               // the failing case
  std::string backend;           // one backend, by exact name
  Op op = Op::kLayer;
  // Flags every candidate run gets (plugins, exec backends, policy, poison, ...).
  std::vector<std::string> run_args;
  // A serving mode's flags (--steps N, --dcp N, --dcp-interleave K, --check
  // batch-invariance): the candidates start from them and shrink the numbers.
  std::vector<std::string> mode_flags;
  std::string out_dir = "shrunk";  // shrunk.yaml, the runs' scratch, the golden bundle
  // --expect files: the final run is judged by them too, so the result says
  // whether the shrunk failure is a known one (the candidates run without them).
  std::vector<std::string> expect;
  int max_runs = 200;              // candidate runs at most
  // No candidate run starts after it (explore's budget): the case shrunk so
  // far is the result, with ShrinkResult::stopped_by saying so. None: no limit.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  std::FILE* log = stdout;         // progress and result lines; nullptr: silent (mlagate explore)
};

// What shrink_case found.
struct ShrinkResult {
  CaseSpec from, to;         // the case as it first failed and as shrunk (suite "shrunk", batch "target")
  std::string status, message;  // the final run's record
  bool same = true;             // the final run failed as the first did (false: flaky)
  int runs = 0;
  std::string stopped_by;       // why the search ended before no candidate was left ("" when it ran out of them)
  std::string yaml;             // the suite file of the shrunk case (and its predecessors)
  std::string bundle;           // its golden bundle (a file in out_dir/bundle; empty when none was written)
  std::string repro;            // the mlagate run command of the shrunk case
  std::string replay;           // the mlagate replay command of the bundle (empty without one)
  // With ShrinkOptions::expect: the final record's outcome ("XFAIL", "XPASS" or
  // empty: no entry selects it) and the entry's id and reason.
  std::string expected, expected_entry, expected_reason;
};

// A case's size in words: "2 requests, 3 query tokens, 40 keys, 8 heads, block size 16".
std::string case_shape(const CaseSpec& c);

// Serializes cases as a suite file (named `name`, which must be the cases'
// suite: ids carry it; one inline batch spec per case, named by the case's
// batch.name): every field of a case, sparse ones and dims that are no preset
// included. Throws std::logic_error when the file would not read back as the
// same cases.
std::string cases_as_suite_yaml(const std::vector<CaseSpec>& cases, const std::string& name = "shrunk");

// Shrinks; throws InputError when the record does not fail to begin with.
ShrinkResult shrink_case(const ShrinkOptions& opt);

// shrink_case, printing the progress and the result; returns the CLI exit
// code (0: a failing case was saved, smaller or not).
int shrink_main(const ShrinkOptions& opt);

}  // namespace mlagate
