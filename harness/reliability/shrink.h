// `mlagate shrink`: from one failing record, the smallest case that still
// fails the same way (the same status; an order-dependent failure stays
// order-dependent after the same predecessors). Candidates shrink one thing at
// a time: a serving mode's numbers first (half the --steps, half the --dcp
// ranks, half the --dcp-interleave), then drop a request, halve a context or a
// query, double TP (fewer heads), a smaller block size, one split (--splits 1). Each candidate runs in a
// separate `mlagate run` process (the binary itself: crashes and hangs are
// records, plugins and exec backends come along as flags), from a suite file
// the shrink writes, so the final case is a file a user can rerun as is.
#pragma once

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
  int max_runs = 200;              // candidate runs at most
};

// Serializes cases as a suite file (name "shrunk", one inline batch spec per
// case, named by the case's batch.name). Throws InputError for what a suite
// file cannot express (dims other than the presets, sparse cases).
std::string cases_as_suite_yaml(const std::vector<CaseSpec>& cases);

// Prints the progress and the result; returns the CLI exit code (0: a failing
// case was saved, smaller or not). Throws InputError when the record does not
// fail to begin with.
int shrink_main(const ShrinkOptions& opt);

}  // namespace mlagate
