// The subcommands behind cli_main: each takes its parsed option groups and
// returns an exit code (cli.h); errors are exceptions (InputError: exit 2).
#pragma once

#include <string>
#include <vector>

#include "golden/compare_files.h"
#include "harness/cli/options.h"
#include "harness/run/runner.h"

namespace mlagate {

// mlagate list suites|specs|cases|backends|matrix
int cmd_list(const std::string& what, const Selection& sel, const std::string& backend_globs, const OutOfTree& ot);

// mlagate run / replay (ra.replay set). `args`: this process's argv, which
// isolation workers get again with --worker.
int cmd_run(const Selection& sel, const RunArgs& ra, const std::string& command_line,
            const std::vector<std::string>& args);

struct ExportArgs {
  std::string out, backends = "*";
  std::vector<std::string> ops{"layer"};
  PolicyArgs policy;
  PoisonArgs poison;
};
int cmd_export(const Selection& sel, const ExportArgs& ea, const std::string& command_line);

// The flags that shape what a record computes (policy, baseline, poison,
// prefill chunk, splits, reference) applied to `cfg`, each checked: `run`'s plan
// and the Python module's cases() share it. Throws InputError. check_device:
// false when the caller checks --reference cuda's device itself (run does so
// on a thread of its own, beside its workers' start).
void configure_computation(const RunArgs& ra, RunConfig& cfg, bool check_device = true);

int cmd_compare(const std::string& a, const std::string& b, const FileCompareOptions& opt);

// mlagate merge: the JSON reports and results files of a run's shards (or of
// runs of disjoint cases) into one of each; exit code of the merged verdict.
struct MergeArgs {
  std::vector<std::string> inputs;  // *.json reports, *.h5 results files
  ReportArgs reports;               // from the JSON inputs
  std::string results;              // from the results-file inputs
  std::vector<std::string> expect;  // --expect: the merged records judged by these entries
  bool quiet = false, allow_nothing_ran = false;
};
int cmd_merge(const MergeArgs& ma, const std::string& command_line);

// The op `--op auto` names for one failing record (shrink, triage): decode for a
// serving mode, merge_states for a merge case, sparse_decode for a sparse one, else layer.
Op failing_op_default(const CaseSpec& c, bool serving);

struct ShrinkArgs {
  std::string backend, op = "auto", out = "shrunk";
  std::vector<std::string> case_ids;
  PolicyArgs policy;
  PoisonArgs poison;
  int max_runs = 200, splits = 0;
  std::vector<std::string> expect;  // --expect: say whether the shrunk failure is a known one
  OutOfTree extra;
  // A serving mode's record (harness/run/SERVING.md): shrunk with the case.
  ServingFlags serving;
};
int cmd_shrink(const Selection& sel, const ShrinkArgs& sa);

// mlagate triage (harness/verdicts/VERDICTS.md): one failing record's what-if
// variants, its class, and a bug report.
struct TriageArgs {
  std::string bundle, finding, backend, op = "auto", out = "triage";
  Selection sel;
  std::vector<std::string> case_ids;
  bool no_bundle = false;
  // The failing run's computation flags (policy, poison, splits, reference,
  // serving mode), held as run holds them: the variants get its computation_argv().
  RunArgs run;
  OutOfTree extra;
  void add_options(CLI::App* app);
};
int cmd_triage(const TriageArgs& a);

// mlagate expect: expectations files written from a run's failures, checked, their facts listed.
struct ExpectArgs {
  std::vector<std::string> from, check;
  std::string out;
  bool keys = false;
  void add_options(CLI::App* app);
};
int cmd_expect(const ExpectArgs& a);

// mlagate matrix: the measured support matrix of runs' reports.
struct MatrixArgs {
  std::vector<std::string> reports, expect;
  std::string markdown, html;
  void add_options(CLI::App* app);
};
int cmd_matrix(const MatrixArgs& a);

// Lines saying where this process runs (mlagate's build, the kernel
// libraries' commits, the GPU and driver, the host), for bug reports.
std::vector<std::string> run_environment();

// mlagate explore (harness/explore/EXPLORE.md).
struct ExploreArgs {
  std::string backends, budget, suite, out = "explore", json, html, reference = "eigen", workers;
  std::vector<std::string> ops, devices;
  std::uint64_t cases = 0, seed = 0;
  int round = 0, shrink_runs = 60, threads = 0;  // round 0: auto (ExploreOptions::round)
  double max_work = 0, timeout = 120;
  bool resume = false, no_shrink = false, quiet = false, no_triage = false, profile = false;
  std::vector<std::string> expect;  // --expect: findings these entries expect are counted known, not shrunk
  PolicyArgs policy;
  PoisonArgs poison;
  OutOfTree extra;
  void add_options(CLI::App* app);
};
int cmd_explore(const ExploreArgs& ea);

}  // namespace mlagate
