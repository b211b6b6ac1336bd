// The command line's option groups. Each group registers its flags once, holds
// each default once, and writes itself back as flags (argv()) for repro
// commands, journal fingerprints, isolation workers and shrink's candidate
// runs: one serialization, so a printed command reruns exactly what ran.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "cases/case_spec.h"
#include "cases/paged_cache.h"
#include "golden/golden_file.h"
#include "harness/cli/serving_flags.h"
#include "reference/compare.h"

// Only pointers to CLI11's App here: CLI11 is header-only and costs about
// 10 s of compile in every file that includes it (options.cpp and cli.cpp do).
namespace CLI {
class App;
}  // namespace CLI

namespace mlagate {

// Shell words joined by spaces, each quoted as needed (exec::shell_word).
std::string join_shell_words(const std::vector<std::string>& words);
// "a|b" -> "a\|b": an exact id as a --filter regex.
std::string regex_escape(const std::string& s);

// What the user selected: a suite, sweeps over it, a --filter.
struct Selection {
  std::string suite;
  std::string filter;
  std::vector<std::string> specs, dtypes, kv_dtypes, block_sizes;
  std::vector<int> tps;
  std::vector<std::uint64_t> seeds;

  void add_options(CLI::App* app);
  // The selected cases (the smoke suite when nothing is selected); throws InputError.
  std::vector<CaseSpec> resolve() const;
  // `resolve()` narrowed to exactly these ids, in this order (--case).
  std::vector<CaseSpec> resolve_ids(const std::vector<std::string>& ids) const;
  // The selected suite's repeat (Suite::repeat); 1 without a suite.
  int suite_repeat() const;
  // The selection flags (without --filter).
  std::vector<std::string> argv() const;
};

// Out-of-tree backends (--plugin, --exec): made from flags, matched by --backend
// globs like in-tree ones, and named again in every repro command.
struct OutOfTree {
  std::vector<std::string> plugins, exec_commands, exec_names, exec_caps;
  double exec_timeout = 60;

  void add_options(CLI::App* app);
  std::vector<BackendEntry> entries() const;  // loads the plugins
  std::vector<std::string> argv() const;
};

// --policy, --atol, --rtol, --fudge.
struct PolicyArgs {
  std::string name = "baseline";
  double atol = 1e-2, rtol = 1e-2, fudge = kDefaultFudge;

  void add_options(CLI::App* app);
  Policy make() const;  // throws InputError
};

// --poison and (where the command builds caches) --poison-block-table.
struct PoisonArgs {
  std::string poison = "nan";
  bool block_table = false;

  void add_options(CLI::App* app, const std::string& what, bool with_block_table);
  CacheOptions cache_options() const;  // throws InputError
  std::vector<std::string> argv() const;  // the non-default flags
};

// The policy, poison and out-of-tree flags of a command whose runs of
// `mlagate run` get them as given (explore, triage), in one order so their
// help reads alike.
void add_handed_on_options(CLI::App* app, PolicyArgs& policy, PoisonArgs& poison, OutOfTree& extra);

// --json, --junit, --markdown, --html.
struct ReportArgs {
  std::string json, junit, markdown, html;

  void add_options(CLI::App* app);
  void check_paths() const;  // before anything runs: a typo must not cost a run
  std::vector<const std::string*> paths() const { return {&json, &junit, &markdown, &html}; }
};

// The flags of `run` and `replay` beyond the selection.
struct RunArgs {
  std::string backends = "*";
  std::vector<std::string> ops{"auto"};
  PolicyArgs policy;
  std::string baseline = "emulated";  // err_baseline's reference: emulated | torch | none
  PoisonArgs poison;
  int prefill_chunk = 2048;
  int splits = 0;                     // --splits: forced splits of split-KV backends (0: from the work)
  std::string reference = "eigen";    // --reference: where the fp64 reference is computed
  ReportArgs reports;
  bool quiet = false, no_progress = false;
  bool allow_nothing_ran = false;  // exit 0, not kExitNothingRan, when no record ran
  bool profile = false;            // --profile: where the wall time went, as a table at the end
  int threads = 0;
  // Golden files (golden/): run --golden F, replay F [--case ID], --save-results R.
  std::string golden, replay, save_results;
  std::vector<std::string> case_ids;
  std::vector<std::string> devices;  // --devices 0,1,...: workers per GPU, the cases split between them
  std::string workers = "auto";      // --workers N|auto: worker processes side by side per device
  double device_memory_gib = 0;      // --device-memory: GiB of each device the run plans with (0: all of it)
  std::string shard;  // --shard I/N; empty: GTEST_SHARD_INDEX/GTEST_TOTAL_SHARDS when set, else the whole selection
  std::uint64_t max_bytes = kDefaultMaxBytes;
  OutOfTree extra;  // --plugin, --exec
  // Reliability (harness/reliability/RELIABILITY.md): isolation, journal and resume, repeat, order.
  std::string isolate;      // process | none; empty: process when available (not with --save-results)
  double timeout = 600;     // seconds per (case, backend, op) in a worker
  std::string journal;      // empty: next to the first report file
  bool resume = false;
  int repeat = 0;            // 0: the suite's repeat (Suite::repeat; 1 without a suite)
  std::string order = "given";
  bool worker = false;      // hidden: this process is an isolation worker
  std::string sanitize;     // memcheck | initcheck | racecheck: failing records rerun under compute-sanitizer
  std::string sanitizer;    // its path (default: default_sanitizer())
  int sanitize_launch_count = 50;
  std::string save_failures;  // a directory: each failing record's case as a golden file that replay runs
  // --expect FILE (repeatable): expected failures (harness/verdicts/VERDICTS.md).
  // Not a computation flag: repro commands rerun the record without it.
  std::vector<std::string> expect;
  int order_checks = 10;       // --order-checks: failures rerun alone to tell order dependence, per backend
  bool reuse_buffers = false;  // kernel outputs from a pool of earlier cases' buffers instead of fresh ones
  // Serving-engine modes (harness/run/SERVING.md): one at a time, on the decode op.
  ServingFlags serving;  // --cuda-graph, --capture-sizes, --check, --dcp, --dcp-interleave, --steps
  std::vector<std::string> requires_;  // --require batch-invariance: BATCH_VARIANT fails the run
  bool require_batch_invariance() const;

  // Every flag `run` and `replay` share (replay adds its file, run its
  // selection, --golden and --case). `replay`: the help texts say what replay
  // does with them (its caches are the file's).
  void add_options(CLI::App* app, bool replay);
  // The flags that change what a record computes, beyond the selection, the
  // backend and the op: policy, poison, prefill chunk, splits, reference,
  // repeat, buffer reuse. Repro commands, the journal's fingerprint and saved
  // failures' replay commands all take them from here.
  std::vector<std::string> computation_argv() const;
};

}  // namespace mlagate
