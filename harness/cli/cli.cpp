// The command line (CLI11): the subcommands and their option groups
// (options.h), dispatched to commands.h; exceptions become exit codes here and
// nowhere else.
#include "harness/cli/cli.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "backends/exec/subprocess.h"
#include "cases/errors.h"
#include "cases/suite.h"
#include "harness/bench/bench.h"
#include "harness/cli/commands.h"
#include "harness/cli/options.h"
#include "mlagate/version.h"

namespace mlagate {

namespace {

// What the subcommands parse into. CLI11 keeps pointers to these members from
// add_option until parse, so one object holds them for the whole of cli_main
// (neither copied nor moved) and dispatch reads them after.
struct Commands {
  Commands() = default;
  Commands(const Commands&) = delete;
  Commands& operator=(const Commands&) = delete;

  Selection list_sel, run_sel, export_sel, replay_sel;
  std::string list_what = "cases", list_backends = "*";
  OutOfTree list_extra;
  RunArgs ra, rp;
  ExportArgs ea;
  std::string cmp_a, cmp_b;
  FileCompareOptions cmp;
  MergeArgs ma;
  BenchOptions bench_opt;
  ExploreArgs xa;
  TriageArgs ta;
  ExpectArgs xe;
  MatrixArgs xm;

  CLI::App *list = nullptr, *run = nullptr, *exp = nullptr, *replay = nullptr, *compare = nullptr;
  CLI::App *merge = nullptr, *bench = nullptr, *explore = nullptr, *triage = nullptr, *expect = nullptr;
  CLI::App* matrix = nullptr;
};

// A subcommand whose options are all one Args struct's.
template <class Args>
CLI::App* add_command(CLI::App& app, const std::string& name, const std::string& description, Args& args) {
  CLI::App* sub = app.add_subcommand(name, description);
  args.add_options(sub);
  return sub;
}

void add_list_and_run(CLI::App& app, Commands& c) {
  c.list = app.add_subcommand("list", "list suites, specs, cases, backends or the support matrix");
  c.list->add_option("what", c.list_what, "suites | specs | cases | backends | matrix")->capture_default_str();
  c.list->add_option("--backend", c.list_backends, "backend globs (comma-separated)");
  c.list_sel.add_options(c.list);
  c.list_extra.add_options(c.list);

  c.run = app.add_subcommand("run", "run cases on backends and compare against the fp64 reference");
  c.run_sel.add_options(c.run);
  c.run->add_option("--golden", c.ra.golden, "compare against this golden file's stored references (inputs checked by hash)");
  c.ra.add_options(c.run, false);
}

// Golden files (golden/SCHEMA.md): export, replay, compare.
void add_golden_commands(CLI::App& app, Commands& c) {
  c.exp = app.add_subcommand("export", "write a golden file: inputs, paged caches and fp64 references");
  c.export_sel.add_options(c.exp);
  c.exp->add_option("--out", c.ea.out, "the HDF5 file to write")->required();
  c.exp->add_option("--backend", c.ea.backends, "bs=auto: store the cache of each matching backend's block size")
      ->capture_default_str();
  c.exp->add_option("--op", c.ea.ops,
                    "ops to store dense references for: layer, decode, prefill (a sparse case always stores its "
                    "sparse reference, which serves sparse_decode and sparse_prefill)")->delimiter(',')->capture_default_str();
  c.ea.policy.add_options(c.exp);
  c.ea.poison.add_options(c.exp, "unused cache regions", true);

  c.replay = app.add_subcommand("replay", "run a golden file's stored inputs and caches (no regeneration)");
  c.replay->add_option("file", c.rp.replay, "golden file")->required();
  c.replay->add_option("--filter", c.replay_sel.filter, "keep cases whose id matches this regex");
  c.rp.add_options(c.replay, true);

  c.compare = app.add_subcommand("compare", "compare two results files: bit-identical, or how far apart");
  c.compare->add_option("a", c.cmp_a, "results file A (before)")->required();
  c.compare->add_option("b", c.cmp_b, "results file B (after)")->required();
  c.compare->add_option("--atol", c.cmp.atol, "exit 1 when |a - b| > atol + rtol * |a| anywhere")->capture_default_str();
  c.compare->add_option("--rtol", c.cmp.rtol, "relative part of the tolerance")->capture_default_str();
  c.compare->add_flag("--ignore-missing", c.cmp.ignore_missing, "cases or records in one file only do not fail");
  c.compare->add_flag("--verbose,-v", c.cmp.verbose, "list identical records too");
  c.compare->add_option("--max-bytes", c.cmp.max_bytes, "memory budget per case pair (e.g. 8GiB)")
      ->transform(CLI::AsSizeValue(false));
}

void add_merge_and_bench(CLI::App& app, Commands& c) {
  c.merge = app.add_subcommand(
      "merge", "join the JSON reports and results files of a run's shards (--shard I/N) into one of each");
  c.merge->add_option("inputs", c.ma.inputs, "JSON reports (*.json) and results files (*.h5) of the shards")->required();
  c.ma.reports.add_options(c.merge);
  c.merge->add_option("--results", c.ma.results, "write the merged results file here (from the *.h5 inputs)");
  c.merge->add_flag("--quiet,-q", c.ma.quiet, "print only errors");
  c.merge->add_flag("--allow-nothing-ran", c.ma.allow_nothing_ran, "exit 0 when no record of any input ran");
  c.merge->add_option("--expect", c.ma.expect,
                      "expectations file (repeatable): the merged records are judged by its entries instead of the "
                      "inputs' (harness/verdicts/VERDICTS.md)");

  // `mlagate bench` (harness/bench/bench.h): decode speed side by side on the GPU.
  c.bench = app.add_subcommand("bench", "time every benchmarkable backend's decode on the same cases (GPU)");
  c.bench->add_option("--backend", c.bench_opt.backends, "backend globs, comma-separated")->capture_default_str();
  c.bench->add_option("--case-set", c.bench_opt.case_set,
                      "bench case set (" + [] {
                        std::string n;
                        for (const std::string& s : bench_case_set_names()) n += (n.empty() ? "" : ", ") + s;
                        return n;
                      }() + "), or a suite name or YAML file")
      ->capture_default_str();
  c.bench->add_option("--json", c.bench_opt.json, "write the rows as JSON here");
  c.bench->add_option("--min-time", c.bench_opt.min_time_s, "minimum timed seconds per row (Google Benchmark)")
      ->capture_default_str();
  c.bench->add_option("--splits", c.bench_opt.backend_options.num_splits, "cuda.splitkv: force N splits per request");
}

void add_verdict_commands(CLI::App& app, Commands& c) {
  c.explore = add_command(app, "explore",
                          "search the case space at random for failures no suite names; shrink and save each kind found",
                          c.xa);
  c.triage = add_command(app, "triage",
                         "run a failing record's what-if variants, name the class of its cause and write a bug report",
                         c.ta);
  c.expect = add_command(
      app, "expect",
      "expectations files: write one from a run's failures (one entry per cause), check one, list the facts", c.xe);
  c.matrix = add_command(
      app, "matrix",
      "the measured support matrix of runs' JSON reports: backends x op, dtype, kv cache, block size, queries, mode",
      c.xm);
}

// The parsed subcommand's exit code; kExitUsage when none matched.
int dispatch(Commands& c, CLI::App* shrink, const Selection& shrink_sel, const ShrinkArgs& sa,
             const std::string& command_line, const std::vector<std::string>& args) {
  if (c.list->parsed()) return cmd_list(c.list_what, c.list_sel, c.list_backends, c.list_extra);
  if (c.run->parsed()) return cmd_run(c.run_sel, c.ra, command_line, args);
  if (c.exp->parsed()) return cmd_export(c.export_sel, c.ea, command_line);
  if (c.replay->parsed()) return cmd_run(c.replay_sel, c.rp, command_line, args);
  if (c.compare->parsed()) return cmd_compare(c.cmp_a, c.cmp_b, c.cmp);
  if (c.merge->parsed()) return cmd_merge(c.ma, command_line);
  if (c.bench->parsed()) return run_bench(c.bench_opt, stdout);
  if (shrink->parsed()) return cmd_shrink(shrink_sel, sa);
  if (c.explore->parsed()) return cmd_explore(c.xa);
  if (c.triage->parsed()) return cmd_triage(c.ta);
  if (c.expect->parsed()) return cmd_expect(c.xe);
  if (c.matrix->parsed()) return cmd_matrix(c.xm);
  return kExitUsage;
}

}  // namespace

int cli_main(int argc, char** argv) {
  CLI::App app{"mlagate: differential correctness and conformance harness for MLA attention kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(MLAGATE_VERSION) + " (" + MLAGATE_GIT_COMMIT + ")");

  // Subcommands are added in the order `mlagate --help` lists them.
  Commands c;
  add_list_and_run(app, c);
  add_golden_commands(app, c);
  add_merge_and_bench(app, c);

  Selection shrink_sel;
  ShrinkArgs sa;
  CLI::App* shrink = app.add_subcommand(
      "shrink", "from a failing record, the smallest case that still fails the same way; saves it and prints its repro");
  shrink_sel.add_options(shrink);
  shrink->add_option("--case", sa.case_ids,
                     "the failing case's exact id; earlier --case ids run before it (an order-dependent failure)");
  shrink->add_option("--backend", sa.backend, "the failing backend (one exact name)")->required();
  shrink->add_option("--op", sa.op, "the failing op (auto: layer, sparse_decode for sparse cases, merge_states for merge cases)")->capture_default_str();
  sa.extra.add_options(shrink);
  sa.policy.add_options(shrink);
  sa.poison.add_options(shrink, "outputs and unused cache", false);
  shrink->add_option("--splits", sa.splits, "forced splits of split-KV backends (0: from the work)")->capture_default_str();
  shrink->add_option("--out", sa.out, "folder for shrunk.yaml, the golden bundle and the runs' scratch")
      ->capture_default_str();
  sa.serving.add_options(shrink, true);  // shrunk with the case: steps toward 1, ranks toward 2, interleave toward 1
  shrink->add_option("--expect", sa.expect,
                     "expectations file (repeatable): say whether the shrunk failure is one an entry expects");
  shrink->add_option("--max-runs", sa.max_runs, "runs at most before the final one (the first run counts)")->capture_default_str();

  add_verdict_commands(app, c);

  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + exec::shell_word(argv[i]);
  const std::vector<std::string> args(argv, argv + argc);  // isolation workers get the same flags
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitPassed : kExitUsage;
  }
  try {
    return dispatch(c, shrink, shrink_sel, sa, command_line, args);
  } catch (const InputError& e) {
    std::fprintf(stderr, "mlagate: error: %s\n", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlagate: internal error: %s\n", e.what());
    return kExitInternal;
  }
}

}  // namespace mlagate
