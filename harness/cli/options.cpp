// The command line's option groups (options.h): registration, defaults,
// validation and their serialization back into flags.
#include "harness/cli/options.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <regex>
#include <sstream>

#include "backends/exec/exec_backend.h"
#include "backends/exec/subprocess.h"
#include "backends/plugin/plugin_backends.h"
#include "cases/errors.h"
#include "cases/suite.h"
#include "reports/record.h"

namespace mlagate {

std::string join_shell_words(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words) s += (s.empty() ? "" : " ") + exec::shell_word(w);
  return s;
}

std::string regex_escape(const std::string& s) {
  static const std::string special = R"(\^$.|?*+()[]{}/)";
  std::string r;
  for (char ch : s) {
    if (special.find(ch) != std::string::npos) r += '\\';
    r += ch;
  }
  return r;
}

namespace {

template <class T>
std::string join_commas(const std::vector<T>& v) {
  std::string r;
  for (const auto& x : v) {
    std::ostringstream o;
    o << x;
    r += (r.empty() ? "" : ",") + o.str();
  }
  return r;
}

}  // namespace

// ---------------------------------------------------------------- Selection

void Selection::add_options(CLI::App* app) {
  std::string names;
  for (const auto& n : builtin_suite_names()) names += (names.empty() ? "" : ", ") + n;
  app->add_option("--suite", suite, "built-in suite (" + names + ") or a suite YAML file");
  app->add_option("--filter", filter, "keep cases whose id matches this regex (ECMAScript, search)");
  app->add_option("--spec", specs, "batch specs to sweep (comma-separated); narrows --suite")->delimiter(',');
  app->add_option("--tp", tps, "TP degrees: heads = 128 / tp (comma-separated)")->delimiter(',');
  app->add_option("--dtype", dtypes, "model dtypes: bf16, fp16")->delimiter(',');
  app->add_option("--kv-cache-dtype", kv_dtypes,
                  "kv cache dtypes: auto, fp8, fp8_e4m3, fp8_ds_mla[:pow2|:raw] (scale rule), fp8_v4 (DeepSeek V4)")
      ->delimiter(',');
  app->add_option("--block-size", block_sizes, "block sizes, or auto (each backend's preferred)")->delimiter(',');
  app->add_option("--seed", seeds, "seeds (comma-separated)")->delimiter(',');
}

std::vector<CaseSpec> Selection::resolve() const {
  Sweep sw;
  sw.specs = specs;
  sw.tps = tps;
  for (const auto& d : dtypes) sw.dtypes.push_back(parse_model_dtype(d));
  for (const auto& k : kv_dtypes) sw.kv_dtypes.push_back(parse_kv_cache_format(k));
  for (const auto& b : block_sizes) {
    if (b == "auto") {
      sw.block_sizes.push_back(0);
      continue;
    }
    try {
      std::size_t pos = 0;
      const int v = std::stoi(b, &pos);
      if (pos != b.size() || v < 1) throw std::invalid_argument(b);
      sw.block_sizes.push_back(v);
    } catch (const std::exception&) {
      throw InputError("--block-size: '" + b + "' is not a block size (a power of two in [1, 1024]) or auto");
    }
  }
  sw.seeds = seeds;
  std::optional<Suite> base;
  if (!suite.empty()) base = load_suite(suite);
  if (base && base->cases.empty())
    throw InputError("suite " + base->source + " has no groups: its explore block is for `mlagate explore --suite`");
  if (!base && specs.empty()) base = load_suite("smoke");  // nothing selected: the smoke suite
  std::vector<CaseSpec> cases = apply_sweep(sw, base);
  if (!filter.empty()) {
    std::regex re;
    try {
      re = std::regex(filter, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw InputError("--filter: invalid regex '" + filter + "': " + e.what());
    }
    std::erase_if(cases, [&](const CaseSpec& c) { return !std::regex_search(c.id(), re); });
  }
  if (cases.empty()) throw InputError("the selection matches no case");
  return cases;
}

std::vector<CaseSpec> Selection::resolve_ids(const std::vector<std::string>& ids) const {
  const std::vector<CaseSpec> cases = resolve();
  std::vector<CaseSpec> picked;
  for (const std::string& id : ids) {
    auto it = std::find_if(cases.begin(), cases.end(), [&](const CaseSpec& c) { return c.id() == id; });
    if (it == cases.end()) throw InputError("--case '" + id + "': no such case in the selection");
    picked.push_back(*it);
  }
  return picked;
}

int Selection::suite_repeat() const { return suite.empty() ? 1 : load_suite(suite).repeat; }

std::vector<std::string> Selection::argv() const {
  std::vector<std::string> a;
  if (!suite.empty()) a.insert(a.end(), {"--suite", suite});
  if (!specs.empty()) a.insert(a.end(), {"--spec", join_commas(specs)});
  if (!tps.empty()) a.insert(a.end(), {"--tp", join_commas(tps)});
  if (!dtypes.empty()) a.insert(a.end(), {"--dtype", join_commas(dtypes)});
  if (!kv_dtypes.empty()) a.insert(a.end(), {"--kv-cache-dtype", join_commas(kv_dtypes)});
  if (!block_sizes.empty()) a.insert(a.end(), {"--block-size", join_commas(block_sizes)});
  if (!seeds.empty()) a.insert(a.end(), {"--seed", join_commas(seeds)});
  return a;
}

// ---------------------------------------------------------------- OutOfTree

void OutOfTree::add_options(CLI::App* app) {
  app->add_option("--plugin", plugins, "backend library built against include/mlagate/plugin.h (repeatable)")
      ->allow_extra_args(false);
  app->add_option("--exec", exec_commands,
                  "a program as a backend, run per kernel call: 'CMD {in} {out}' (repeatable; backends/exec/SCHEMA.md)")
      ->allow_extra_args(false);
  app->add_option("--exec-name", exec_names, "name of the i-th --exec backend (default exec.0, exec.1, ...)")
      ->allow_extra_args(false);
  app->add_option("--exec-caps", exec_caps,
                  "capabilities of the i-th --exec backend, e.g. 'ops=decode,prefill block_sizes=16,64 "
                  "query_len=VARLEN reorder_threshold=1 dtypes=bf16,fp16 kv_dtypes=auto'")
      ->allow_extra_args(false);
  app->add_option("--exec-timeout", exec_timeout, "seconds per --exec invocation")->capture_default_str();
}

std::vector<BackendEntry> OutOfTree::entries() const {
  if (exec_names.size() > exec_commands.size()) throw InputError("more --exec-name than --exec options");
  if (exec_caps.size() > exec_commands.size()) throw InputError("more --exec-caps than --exec options");
  std::vector<BackendEntry> out;
  for (const auto& path : plugins)
    for (auto& e : load_plugin(path)) out.push_back(std::move(e));
  for (std::size_t i = 0; i < exec_commands.size(); ++i) {
    ExecConfig c;
    c.name = i < exec_names.size() ? exec_names[i] : "exec." + std::to_string(i);
    c.command = exec_commands[i];
    c.caps = i < exec_caps.size() ? parse_exec_caps(exec_caps[i]) : default_exec_caps();
    c.timeout_s = exec_timeout;
    out.push_back(exec_backend_entry(c));
  }
  for (const BackendEntry& e : embedded_backends()) out.push_back(e);
  return out;
}

std::vector<std::string> OutOfTree::argv() const {
  std::vector<std::string> a;
  for (const auto& p : plugins) a.insert(a.end(), {"--plugin", p});
  for (std::size_t i = 0; i < exec_commands.size(); ++i) {
    a.insert(a.end(), {"--exec", exec_commands[i]});
    if (i < exec_names.size()) a.insert(a.end(), {"--exec-name", exec_names[i]});
    if (i < exec_caps.size()) a.insert(a.end(), {"--exec-caps", exec_caps[i]});
  }
  if (!exec_commands.empty() && exec_timeout != OutOfTree{}.exec_timeout)
    a.insert(a.end(), {"--exec-timeout", exact_number(exec_timeout)});
  return a;
}

// ---------------------------------------------------------------- policy, poison, reports

void PolicyArgs::add_options(CLI::App* app) {
  app->add_option("--policy", name, "tolerance policy: baseline | vllm | fixed")->capture_default_str();
  app->add_option("--atol", atol, "absolute tolerance (fixed policy)")->capture_default_str();
  app->add_option("--rtol", rtol, "relative tolerance (fixed policy)")->capture_default_str();
  app->add_option("--fudge", fudge, "baseline policy: pass when err <= fudge * err_baseline + floor")
      ->capture_default_str();
}

Policy PolicyArgs::make() const { return make_policy(name, atol, rtol, fudge); }

void PoisonArgs::add_options(CLI::App* app, const std::string& what, bool with_block_table) {
  app->add_option("--poison", poison, "poison of " + what + ": nan | sentinel | zero | none")->capture_default_str();
  if (with_block_table)
    app->add_flag("--poison-block-table", block_table, "unused block-table entries hold an invalid huge id");
}

CacheOptions PoisonArgs::cache_options() const {
  CacheOptions o;
  o.poison = parse_poison(poison);
  o.poison_block_table = block_table;
  return o;
}

std::vector<std::string> PoisonArgs::argv() const {
  std::vector<std::string> a;
  if (poison != PoisonArgs{}.poison) a.insert(a.end(), {"--poison", poison});
  if (block_table) a.push_back("--poison-block-table");
  return a;
}

void add_handed_on_options(CLI::App* app, PolicyArgs& policy, PoisonArgs& poison, OutOfTree& extra) {
  policy.add_options(app);
  poison.add_options(app, "outputs and unused cache", false);
  extra.add_options(app);
}

void ReportArgs::add_options(CLI::App* app) {
  app->add_option("--json", json, "write the JSON report here");
  app->add_option("--junit", junit, "write a JUnit XML report here");
  app->add_option("--markdown", markdown, "write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)");
  app->add_option("--html", html, "write a self-contained HTML report here");
}

void ReportArgs::check_paths() const {
  for (const std::string* path : paths()) {
    if (path->empty()) continue;
    const std::filesystem::path dir = std::filesystem::absolute(*path).parent_path();
    if (!std::filesystem::is_directory(dir)) throw InputError("report path " + *path + ": no directory " + dir.string());
    if (std::filesystem::is_directory(*path)) throw InputError("report path " + *path + " is a directory");
  }
}

// ---------------------------------------------------------------- run and replay

void RunArgs::add_options(CLI::App* app, bool for_replay) {
  app->add_option("--backend", backends, "backend globs, comma-separated (e.g. 'cpu.*')")->capture_default_str();
  extra.add_options(app);  // replay too: repro bundles of out-of-tree backends replay
  app->add_option("--op", ops,
                  "ops: auto (the ops a suite group names in `ops`, else layer for dense cases, sparse_decode and "
                  "sparse_prefill for sparse ones, merge_states for merge cases), layer, decode, "
                  "prefill, cache_write, sparse_decode, sparse_prefill, merge_states (comma-separated; a case whose group "
                  "names ops runs in those of them only)")
      ->delimiter(',')
      ->capture_default_str();
  policy.add_options(app);
  app->add_option("--baseline", baseline,
                  "err_baseline from: emulated (CPU emulation) | torch (libtorch SDPA, layer output) | none (no min_fudge)")
      ->capture_default_str();
  // replay's caches are the file's: its poison is the output buffers'; the
  // block-table flag is accepted (repro commands carry it) and changes nothing stored.
  poison.add_options(app, for_replay ? "output buffers" : "outputs and unused cache", true);
  app->add_option("--prefill-chunk", prefill_chunk, "context tokens per chunk of the prefill path")->capture_default_str();
  reports.add_options(app);
  app->add_option("--threads", threads, "OpenMP threads (results do not depend on it)");
  app->add_option("--splits", splits, "split-KV backends (cpu.splitkv, cuda.splitkv): force N splits per request");
  app->add_option("--reference", reference, "where the fp64 reference is computed: eigen (CPU) | cuda (GPU)")
      ->capture_default_str();
  app->add_flag("--quiet,-q", quiet, "print only failures");
  app->add_flag("--no-progress", no_progress, "no progress bar");
  app->add_flag("--allow-nothing-ran", allow_nothing_ran,
                "exit 0 when no record ran (every one skipped or not supported); default: exit 4");
  app->add_flag("--profile", profile, "print where the wall time went (a table of phases summing to the wall)");
  app->add_option("--save-results", save_results, "write every backend's outputs and metrics to this HDF5 file");
  app->add_option("--max-bytes", max_bytes,
                  std::string("memory budget per case read from ") + (for_replay ? "the file" : "a file") + " (e.g. 8GiB)")
      ->transform(CLI::AsSizeValue(false));
  app->add_option("--case", case_ids,
                  for_replay ? "exact case id (repeatable); default every case"
                             : "exact case id (repeatable): only these cases, run in the order given");

  app->add_option("--devices", devices,
                  "GPUs to run on, comma-separated (e.g. 0,1,2,3), or all (every GPU visible): --workers worker "
                  "processes per device (CUDA_VISIBLE_DEVICES set to it), the cases dealt out between them; "
                  "records as on one device")
      ->delimiter(',');
  app->add_option("--device-memory", device_memory_gib,
                  "with --reference cuda: GiB of each device the run may plan with (a GPU shared with other "
                  "work); cases too big for it are refused, workers side by side keep within it (default: "
                  "the device's whole memory)")
      ->check(CLI::Range(0.0, 1e6));
  app->add_option("--workers", workers,
                  "worker processes side by side per device (in all without --devices), each taking the next "
                  "group of cases as it finishes its last, while their host memory estimates fit: one's case "
                  "preparation runs beside another's backend calls. auto with --reference cuda: one per 4 host CPUs "
                  "in all, at most 8 per device, unless an --order other than given, else 1. Records as with 1; "
                  "their run times (and --timeout) then include waiting for the other workers' GPU work")
      ->capture_default_str();
  app->add_option("--shard", shard,
                  "run shard I of N (0-based, I/N) of the selection, cases assigned by a hash of their id; default: "
                  "GTEST_SHARD_INDEX/GTEST_TOTAL_SHARDS when set. `mlagate merge` joins the shards' reports");

  // Reliability: isolation, journal and resume, repeat, order, sanitizer, saved failures.
  app->add_option("--isolate", isolate,
                  "process: backends run in a worker process (crashes and hangs become records; the default) | "
                  "none: in this process (debugging)");
  app->add_option("--timeout", timeout, "seconds per case, backend and op before the worker is killed (TIMEOUT); 0: none")
      ->capture_default_str();
  app->add_option("--journal", journal,
                  "append every record here as it completes (default: <first report path>.journal.jsonl)");
  app->add_flag("--resume", resume, "continue an interrupted run from its journal: finished records are not rerun");
  app->add_option("--repeat", repeat,
                  "run each case N times and compare outputs bitwise (NONDETERMINISTIC); default: the suite's "
                  "repeat (2 for the gate suite, else 1)")
      ->check([](const std::string& v) { return std::atoi(v.c_str()) >= 1 ? std::string() : "--repeat must be >= 1"; });
  app->add_option("--order", order,
                  "case order: given | reverse | shuffle:SEED | pairs (each case alone, then after every other one)")
      ->capture_default_str();
  app->add_option("--order-checks", order_checks,
                  "per backend: failures after other cases rerun alone (and after their predecessor) to tell "
                  "order-dependent ones; past this many a record says no check was made")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  app->add_flag("--worker", worker, "internal: run as an isolation worker")->group("");
  app->add_option("--sanitize", sanitize,
                  "rerun failing records (every record with --case) under compute-sanitizer: memcheck | initcheck | racecheck");
  app->add_option("--sanitizer", sanitizer, "the compute-sanitizer executable (default: from CUDA_HOME, /usr/local/cuda/bin, PATH)");
  app->add_option("--sanitize-launch-count", sanitize_launch_count, "kernel launches the sanitizer checks")
      ->capture_default_str();
  app->add_flag("--reuse-buffers", reuse_buffers,
                "kernel outputs come from a pool of earlier cases' buffers (a caching allocator) instead of fresh "
                "allocations; with --poison none they hold stale data");
  // Serving-engine modes (harness/run/SERVING.md).
  serving.add_options(app, false);
  app->add_option("--require", requires_, "batch-invariance: BATCH_VARIANT records fail the run (exit 1)")
      ->delimiter(',')
      ->check(CLI::IsMember({"batch-invariance"}));
  app->add_option("--expect", expect,
                  "an expectations file (repeatable): failures it names are XFAIL (reported with their reason, not "
                  "failed), a strict entry whose records pass is XPASS and fails the run (harness/verdicts/VERDICTS.md)");
  app->add_option("--save-failures", save_failures,
                  "write each failing record's case to DIR as a golden file (inputs, caches, references) that "
                  "`mlagate replay` runs");
}

std::vector<std::string> RunArgs::computation_argv() const {
  const RunArgs defaults;
  std::vector<std::string> a = policy.make().cli_argv();
  if (baseline != defaults.baseline) a.insert(a.end(), {"--baseline", baseline});
  const std::vector<std::string> p = poison.argv();
  a.insert(a.end(), p.begin(), p.end());
  if (prefill_chunk != defaults.prefill_chunk) a.insert(a.end(), {"--prefill-chunk", std::to_string(prefill_chunk)});
  if (splits != defaults.splits) a.insert(a.end(), {"--splits", std::to_string(splits)});
  if (reference != defaults.reference) a.insert(a.end(), {"--reference", reference});
  if (repeat > 1) a.insert(a.end(), {"--repeat", std::to_string(repeat)});
  if (reuse_buffers) a.push_back("--reuse-buffers");
  const std::vector<std::string> mode = serving.argv();
  a.insert(a.end(), mode.begin(), mode.end());
  // After the mode's flags: --require needs --check batch-invariance, which no
  // later mode flag may join, so the words are where they always were.
  for (const std::string& r : requires_) a.insert(a.end(), {"--require", r});
  return a;
}

bool RunArgs::require_batch_invariance() const {
  return std::find(requires_.begin(), requires_.end(), "batch-invariance") != requires_.end();
}

}  // namespace mlagate
