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
#include "mlagate/config.h"

namespace mlagate {

int cli_main(int argc, char** argv) {
  CLI::App app{"mlagate: differential correctness and conformance harness for MLA attention kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(MLAGATE_VERSION) + " (" + MLAGATE_GIT_COMMIT + ")");

  Selection list_sel, run_sel;
  std::string list_what = "cases", list_backends = "*";
  CLI::App* list = app.add_subcommand("list", "list suites, specs, cases, backends or the support matrix");
  list->add_option("what", list_what, "suites | specs | cases | backends | matrix")->capture_default_str();
  list->add_option("--backend", list_backends, "backend globs (comma-separated)");
  list_sel.add_options(list);
  OutOfTree list_extra;
  list_extra.add_options(list);

  RunArgs ra;
  CLI::App* run = app.add_subcommand("run", "run cases on backends and compare against the fp64 reference");
  run_sel.add_options(run);
  run->add_option("--golden", ra.golden, "compare against this golden file's stored references (inputs checked by hash)");
  ra.add_options(run, false);

  // Golden files (golden/SCHEMA.md): export, replay, compare.
  Selection export_sel, replay_sel;
  ExportArgs ea;
  CLI::App* exp = app.add_subcommand("export", "write a golden file: inputs, paged caches and fp64 references");
  export_sel.add_options(exp);
  exp->add_option("--out", ea.out, "the HDF5 file to write")->required();
  exp->add_option("--backend", ea.backends, "bs=auto: store the cache of each matching backend's block size")
      ->capture_default_str();
  exp->add_option("--op", ea.ops,
                 "ops to store dense references for: layer, decode, prefill (a sparse case always stores its "
                 "sparse reference, which serves sparse_decode and sparse_prefill)")->delimiter(',')->capture_default_str();
  ea.policy.add_options(exp);
  ea.poison.add_options(exp, "unused cache regions", true);

  RunArgs rp;
  CLI::App* replay = app.add_subcommand("replay", "run a golden file's stored inputs and caches (no regeneration)");
  replay->add_option("file", rp.replay, "golden file")->required();
  replay->add_option("--filter", replay_sel.filter, "keep cases whose id matches this regex");
  rp.add_options(replay, true);

  std::string cmp_a, cmp_b;
  FileCompareOptions cmp;
  CLI::App* compare = app.add_subcommand("compare", "compare two results files: bit-identical, or how far apart");
  compare->add_option("a", cmp_a, "results file A (before)")->required();
  compare->add_option("b", cmp_b, "results file B (after)")->required();
  compare->add_option("--atol", cmp.atol, "exit 1 when |a - b| > atol + rtol * |a| anywhere")->capture_default_str();
  compare->add_option("--rtol", cmp.rtol, "relative part of the tolerance")->capture_default_str();
  compare->add_flag("--ignore-missing", cmp.ignore_missing, "cases or records in one file only do not fail");
  compare->add_flag("--verbose,-v", cmp.verbose, "list identical records too");
  compare->add_option("--max-bytes", cmp.max_bytes, "memory budget per case pair (e.g. 8GiB)")
      ->transform(CLI::AsSizeValue(false));

  MergeArgs ma;
  CLI::App* merge = app.add_subcommand(
      "merge", "join the JSON reports and results files of a run's shards (--shard I/N) into one of each");
  merge->add_option("inputs", ma.inputs, "JSON reports (*.json) and results files (*.h5) of the shards")->required();
  ma.reports.add_options(merge);
  merge->add_option("--results", ma.results, "write the merged results file here (from the *.h5 inputs)");
  merge->add_flag("--quiet,-q", ma.quiet, "print only errors");
  merge->add_flag("--allow-nothing-ran", ma.allow_nothing_ran, "exit 0 when no record of any input ran");
  merge->add_option("--expect", ma.expect,
                    "expectations file (repeatable): the merged records are judged by its entries instead of the "
                    "inputs' (harness/verdicts/VERDICTS.md)");

  // `mlagate bench` (harness/bench/bench.h): decode speed side by side on the GPU.
  BenchOptions bench_opt;
  CLI::App* bench = app.add_subcommand("bench", "time every benchmarkable backend's decode on the same cases (GPU)");
  bench->add_option("--backend", bench_opt.backends, "backend globs, comma-separated")->capture_default_str();
  bench->add_option("--case-set", bench_opt.case_set,
                    "bench case set (" + [] {
                      std::string n;
                      for (const std::string& s : bench_case_set_names()) n += (n.empty() ? "" : ", ") + s;
                      return n;
                    }() + "), or a suite name or YAML file")
      ->capture_default_str();
  bench->add_option("--json", bench_opt.json, "write the rows as JSON here");
  bench->add_option("--min-time", bench_opt.min_time_s, "minimum timed seconds per row (Google Benchmark)")
      ->capture_default_str();
  bench->add_option("--splits", bench_opt.backend_options.num_splits, "cuda.splitkv: force N splits per request");

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
  shrink->add_flag("--cuda-graph", sa.serving.cuda_graph, "the failing record's mode: CUDA-graph replay (the capture size follows the requests)");
  shrink->add_option("--capture-sizes", sa.serving.capture_sizes, "--cuda-graph: the capture sizes")->delimiter(',');
  shrink->add_option("--check", sa.serving.checks, "batch-invariance: the failing record's mode")
      ->delimiter(',')
      ->check(CLI::IsMember({"batch-invariance"}));
  shrink->add_option("--dcp", sa.serving.dcp, "the failing record's DCP ranks (shrunk toward 2)");
  shrink->add_option("--dcp-interleave", sa.serving.dcp_interleave, "the failing record's DCP interleave (shrunk toward 1)");
  shrink->add_option("--steps", sa.serving.steps, "the failing record's decode-loop steps (shrunk toward 1)");
  shrink->add_option("--expect", sa.expect,
                     "expectations file (repeatable): say whether the shrunk failure is one an entry expects");
  shrink->add_option("--max-runs", sa.max_runs, "runs at most before the final one (the first run counts)")->capture_default_str();

  ExploreArgs xa;
  CLI::App* explore = app.add_subcommand(
      "explore", "search the case space at random for failures no suite names; shrink and save each kind found");
  xa.add_options(explore);

  TriageArgs ta;
  CLI::App* triage = app.add_subcommand(
      "triage", "run a failing record's what-if variants, name the class of its cause and write a bug report");
  ta.add_options(triage);
  ExpectArgs xe;
  CLI::App* expect = app.add_subcommand(
      "expect", "expectations files: write one from a run's failures (one entry per cause), check one, list the facts");
  xe.add_options(expect);

  MatrixArgs xm;
  CLI::App* matrix = app.add_subcommand(
      "matrix", "the measured support matrix of runs' JSON reports: backends x op, dtype, kv cache, block size, queries, mode");
  xm.add_options(matrix);

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
    if (list->parsed()) return cmd_list(list_what, list_sel, list_backends, list_extra);
    if (run->parsed()) return cmd_run(run_sel, ra, command_line, args);
    if (exp->parsed()) return cmd_export(export_sel, ea, command_line);
    if (replay->parsed()) return cmd_run(replay_sel, rp, command_line, args);
    if (compare->parsed()) return cmd_compare(cmp_a, cmp_b, cmp);
    if (merge->parsed()) return cmd_merge(ma, command_line);
    if (bench->parsed()) return run_bench(bench_opt, stdout);
    if (shrink->parsed()) return cmd_shrink(shrink_sel, sa);
    if (explore->parsed()) return cmd_explore(xa);
    if (triage->parsed()) return cmd_triage(ta);
    if (expect->parsed()) return cmd_expect(xe);
    if (matrix->parsed()) return cmd_matrix(xm);
  } catch (const InputError& e) {
    std::fprintf(stderr, "mlagate: error: %s\n", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlagate: internal error: %s\n", e.what());
    return kExitInternal;
  }
  return kExitUsage;
}

}  // namespace mlagate
