// CLI: case selection (suite, filter, sweeps), the list, run, export, replay
// and compare subcommands, progress and console output, report files, and the
// exit-code mapping.
#include "harness/cli.h"
#include "harness/shrink.h"

#include <CLI/CLI.hpp>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <ctime>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>

#include "backends/exec/exec_backend.h"
#include "backends/exec/subprocess.h"
#include "backends/plugin/plugin_backends.h"
#include "backends/registry.h"
#include "cases/errors.h"
#include "cases/generator.h"
#include "cases/suite.h"
#include "golden/golden_run.h"
#include "harness/isolate.h"
#include "harness/journal.h"
#include "harness/bench.h"
#include "harness/layer.h"
#include "harness/memory_estimate.h"
#include "harness/profile.h"
#include "harness/repeat.h"
#include "harness/sanitize.h"
#include "harness/runner.h"
#include "reference/torch/torch_reference.h"
#include "mlagate/config.h"
#include "reports/report.h"
#if MLAGATE_HAS_CUDA
#include "backends/cuda/cuda_backends.h"
#include "backends/cuda/cuda_reference.h"
#endif

namespace mlagate {

namespace {

// What the user selected; also rebuilds the repro command line.
struct Selection {
  std::string suite;
  std::string filter;
  std::vector<std::string> specs, dtypes, kv_dtypes, block_sizes;
  std::vector<int> tps;
  std::vector<std::uint64_t> seeds;

  void add_options(CLI::App* app) {
    std::string names;
    for (const auto& n : builtin_suite_names()) names += (names.empty() ? "" : ", ") + n;
    app->add_option("--suite", suite, "built-in suite (" + names + ") or a suite YAML file");
    app->add_option("--filter", filter, "keep cases whose id matches this regex (ECMAScript, search)");
    app->add_option("--spec", specs, "batch specs to sweep (comma-separated); narrows --suite")->delimiter(',');
    app->add_option("--tp", tps, "TP degrees: heads = 128 / tp (comma-separated)")->delimiter(',');
    app->add_option("--dtype", dtypes, "model dtypes: bf16, fp16")->delimiter(',');
    app->add_option("--kv-cache-dtype", kv_dtypes,
                    "kv cache dtypes: auto, fp8, fp8_e4m3, fp8_ds_mla[:pow2|:raw] (scale rule), fp8_v4 (DeepSeek V4)")->delimiter(',');
    app->add_option("--block-size", block_sizes, "block sizes, or auto (each backend's preferred)")->delimiter(',');
    app->add_option("--seed", seeds, "seeds (comma-separated)")->delimiter(',');
  }

  std::vector<CaseSpec> resolve() const {
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

  // The selected suite's repeat (Suite::repeat); 1 without a suite.
  int suite_repeat() const { return suite.empty() ? 1 : load_suite(suite).repeat; }

  // The selection flags (without --filter) as a command-line fragment.
  std::string args() const {
    std::string s;
    auto join = [](const auto& v) {
      std::string r;
      for (const auto& x : v) {
        std::ostringstream o;
        o << x;
        r += (r.empty() ? "" : ",") + o.str();
      }
      return r;
    };
    if (!suite.empty()) s += " --suite " + quote(suite);
    if (!specs.empty()) s += " --spec " + join(specs);
    if (!tps.empty()) s += " --tp " + join(tps);
    if (!dtypes.empty()) s += " --dtype " + join(dtypes);
    if (!kv_dtypes.empty()) s += " --kv-cache-dtype " + join(kv_dtypes);
    if (!block_sizes.empty()) s += " --block-size " + join(block_sizes);
    if (!seeds.empty()) s += " --seed " + join(seeds);
    return s;
  }

  static std::string quote(const std::string& s) { return exec::shell_word(s); }
};

std::string regex_escape(const std::string& s) {
  static const std::string special = R"(\^$.|?*+()[]{}/)";
  std::string r;
  for (char ch : s) {
    if (special.find(ch) != std::string::npos) r += '\\';
    r += ch;
  }
  return r;
}

std::string iso_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string caps_str(const Capabilities& caps) {
  std::string ops, bss;
  for (Op o : caps.ops) ops += (ops.empty() ? "" : ",") + std::string(op_name(o));
  for (int b : caps.block_sizes) bss += (bss.empty() ? "" : ",") + std::to_string(b);
  std::string dts, kvs;
  for (DType t : caps.dtypes) dts += (dts.empty() ? "" : ",") + std::string(dtype_short(t));
  for (KvCacheDtype k : caps.kv_dtypes) kvs += (kvs.empty() ? "" : ",") + std::string(kv_cache_dtype_name(k));
  // The same keys as --exec-caps, so a line can be pasted back as one.
  return "ops=" + ops + " block_sizes=" + bss + " query_len=" + std::string(query_len_support_name(caps.query_len_support)) +
         " reorder_threshold=" + std::to_string(caps.reorder_threshold) + " dtypes=" + dts + " kv_dtypes=" + kvs;
}

// Out-of-tree backends (--plugin, --exec): made from flags, matched by --backend
// globs like in-tree ones, and named again in every repro command.
struct OutOfTree {
  std::vector<std::string> plugins, exec_commands, exec_names, exec_caps;
  double exec_timeout = 60;

  void add_options(CLI::App* app) {
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

  std::vector<BackendEntry> entries() const {
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
    return out;
  }

  std::string args() const {
    std::string s;
    for (const auto& p : plugins) s += " --plugin " + Selection::quote(p);
    for (const auto& c : exec_commands) s += " --exec " + Selection::quote(c);
    for (const auto& n : exec_names) s += " --exec-name " + Selection::quote(n);
    for (const auto& c : exec_caps) s += " --exec-caps " + Selection::quote(c);
    if (!exec_commands.empty() && exec_timeout != 60) {
      std::ostringstream o;
      o << exec_timeout;
      s += " --exec-timeout " + o.str();
    }
    return s;
  }
};

int cmd_list(const std::string& what, const Selection& sel, const std::string& backend_globs, const OutOfTree& ot) {
  if (what == "suites") {
    for (const auto& n : builtin_suite_names()) {
      const Suite s = load_suite(n);
      std::printf("%-8s %4zu cases  %s\n", n.c_str(), s.cases.size(), s.description.c_str());
    }
    return kExitPassed;
  }
  if (what == "specs") {
    for (const auto& b : batch_specs()) {
      std::string s, q;
      for (int x : b.seq_lens) s += (s.empty() ? "" : ",") + std::to_string(x);
      for (int x : b.query_lens) q += (q.empty() ? "" : ",") + std::to_string(x);
      if (s.size() > 40) s = s.substr(0, 37) + "...";
      if (q.size() > 30) q = q.substr(0, 27) + "...";
      std::printf("%-26s seq_lens=%-40s query_lens=%-30s%s\n", b.name.c_str(), s.c_str(), q.c_str(),
                  b.spec_decode ? " spec_decode" : "");
    }
    return kExitPassed;
  }
  if (what == "backends") {
    const std::vector<BackendEntry> extra = ot.entries();
    for (const auto& b : select_backends(backend_globs, {}, extra))
      std::printf("%-12s %s\n             %s\n", std::string(b->name()).c_str(), std::string(b->description()).c_str(),
                  caps_str(b->capabilities()).c_str());
    return kExitPassed;
  }
  const std::vector<CaseSpec> cases = sel.resolve();
  if (what == "cases") {
    for (const auto& c : cases) std::printf("%s\n", c.id().c_str());
    return kExitPassed;
  }
  if (what == "matrix") {
    const std::vector<BackendEntry> extra = ot.entries();
    auto backends = select_backends(backend_globs, {}, extra);
    std::printf("%-64s", "case (layer op; sparse_decode for sparse cases)");
    for (const auto& b : backends) std::printf(" %-14s", std::string(b->name()).c_str());
    std::printf("\n");
    for (const auto& c : cases) {
      std::printf("%-64s", c.id().c_str());
      std::vector<std::string> reasons;
      for (const auto& b : backends) {
        const Op op = c.sparse.active() ? Op::kSparseDecode : Op::kLayer;
        Support s = b->supports(c, op);
        if (s.ok && op == Op::kLayer) s = route_requests(b->capabilities(), c).support;
        std::printf(" %-14s", s.ok ? "yes" : "NO");
        if (!s.ok) reasons.push_back(std::string(b->name()) + ": " + s.reason);
      }
      std::printf("\n");
      for (const auto& r : reasons) std::printf("    %s\n", r.c_str());
    }
    return kExitPassed;
  }
  throw InputError("mlagate list: unknown listing '" + what + "' (suites, specs, cases, backends, matrix)");
}

struct RunArgs {
  std::string backends = "*";
  std::vector<std::string> ops{"auto"};
  std::string policy = "baseline";
  double atol = 1e-2, rtol = 1e-2;
  double fudge = kDefaultFudge;
  std::string baseline = "emulated";  // err_baseline's reference: emulated | torch
  std::string poison = "nan";
  bool poison_block_table = false;
  int prefill_chunk = 2048;
  int splits = 0;                     // --splits: forced splits of split-KV backends (0: from the work)
  std::string reference = "eigen";    // --reference: where the golden is computed
  std::string json, junit, markdown;
  bool quiet = false, no_progress = false;
  bool allow_nothing_ran = false;  // exit 0, not kExitNothingRan, when no record ran
  int threads = 0;
  // Golden files (golden/): run --golden F, replay F [--case ID], --save-results R.
  std::string golden, replay, save_results;
  std::vector<std::string> case_ids;
  std::uint64_t max_bytes = kDefaultMaxBytes;
  OutOfTree extra;  // --plugin, --exec
  // Reliability (README, "Chasing a NaN"): isolation, journal and resume, repeat, order.
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
  int order_checks = 10;       // --order-checks: failures rerun alone to tell order dependence, per backend
  bool reuse_buffers = false;  // kernel outputs from a pool of earlier cases' buffers instead of fresh ones
  bool profile = false;        // --profile: where the wall time went, as a table at the end
};

void add_reliability_options(CLI::App* app, RunArgs& ra) {
  app->add_option("--isolate", ra.isolate,
                  "process: backends run in a worker process (crashes and hangs become records; the default) | "
                  "none: in this process (debugging)");
  app->add_option("--timeout", ra.timeout, "seconds per case, backend and op before the worker is killed (TIMEOUT); 0: none")
      ->capture_default_str();
  app->add_option("--journal", ra.journal,
                  "append every record here as it completes (default: <first report path>.journal.jsonl)");
  app->add_flag("--resume", ra.resume, "continue an interrupted run from its journal: finished records are not rerun");
  app->add_option("--repeat", ra.repeat,
                  "run each case N times and compare outputs bitwise (NONDETERMINISTIC); default: the suite's "
                  "repeat (2 for the gate suite, else 1)")
      ->check([](const std::string& v) { return std::atoi(v.c_str()) >= 1 ? std::string() : "--repeat must be >= 1"; });
  app->add_option("--order", ra.order,
                  "case order: given | reverse | shuffle:SEED | pairs (each case alone, then after every other one)")
      ->capture_default_str();
  app->add_option("--order-checks", ra.order_checks,
                  "per backend: failures after other cases rerun alone (and after their predecessor) to tell "
                  "order-dependent ones; past this many a record says no check was made")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  app->add_flag("--worker", ra.worker, "internal: run as an isolation worker")->group("");
  app->add_option("--sanitize", ra.sanitize,
                  "rerun failing records (every record with --case) under compute-sanitizer: memcheck | initcheck | racecheck");
  app->add_option("--sanitizer", ra.sanitizer, "the compute-sanitizer executable (default: from CUDA_HOME, /usr/local/cuda/bin, PATH)");
  app->add_option("--sanitize-launch-count", ra.sanitize_launch_count, "kernel launches the sanitizer checks")
      ->capture_default_str();
  app->add_flag("--reuse-buffers", ra.reuse_buffers,
                "kernel outputs come from a pool of earlier cases' buffers (a caching allocator) instead of fresh "
                "allocations; with --poison none they hold stale data");
  app->add_option("--save-failures", ra.save_failures,
                  "write each failing record's case to DIR as a golden file (inputs, caches, references) that "
                  "`mlagate replay` runs");
}

// --order: the cases in another order (every order runs the same records).
void apply_order(std::vector<CaseSpec>& cases, const std::string& order) {
  if (order == "given" || order == "pairs") return;  // pairs: the isolated runner pairs them (isolate.h)
  if (order == "reverse") {
    std::reverse(cases.begin(), cases.end());
    return;
  }
  if (order.rfind("shuffle:", 0) == 0) {
    std::uint64_t seed = 0;
    try {
      std::size_t pos = 0;
      seed = std::stoull(order.substr(8), &pos);
      if (pos != order.size() - 8) throw std::invalid_argument(order);
    } catch (const std::exception&) {
      throw InputError("--order '" + order + "': shuffle:SEED needs a non-negative integer seed");
    }
    // Fisher-Yates over splitmix64: the same order on every platform and library
    // (std::shuffle's use of the engine is implementation-defined).
    auto next = [&seed] {
      std::uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return z ^ (z >> 31);
    };
    for (std::size_t i = cases.size(); i > 1; --i) std::swap(cases[i - 1], cases[next() % i]);
    return;
  }
  throw InputError("--order '" + order + "' (expected given, reverse, shuffle:SEED or pairs)");
}

// SIGINT/SIGTERM during a run: the run stops between records, writes the
// reports of what finished and exits 128 + signal. A second signal acts as usual.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

struct StopSignals {
  struct sigaction old_int {}, old_term {};
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;  // no SA_RESTART: waits wake up at once
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
};

// --baseline: where err_baseline comes from.
BaselineImpl make_baseline(const std::string& name) {
  BaselineImpl b;
  b.always = true;  // min_fudge in every verdict, whatever the policy
  if (name == "emulated") return b;
  if (name == "none") {
    b.name = "none";
    b.always = false;
    return b;
  }
  if (name == "torch") {
    if (!torch_reference_available())
      throw InputError("--baseline torch: this build has no libtorch (" + torch_reference_info() + ")");
    b.name = "torch";
    const TorchReferenceOptions options{.cuda = torch_cuda_available()};  // the GPU when there is one
    b.layer = [options](const Case& c, SdpaForm form, std::span<const int> requests) {
      return torch_sdpa_layer(c, form, requests, options);
    };
    return b;
  }
  throw InputError("--baseline '" + name + "' (expected emulated, torch or none)");
}

// --reference: the fp64 golden on the CPU (Eigen) or on the GPU.
ReferenceImpl make_reference(const std::string& name) {
  ReferenceImpl r;
  if (name == "eigen") return r;
  if (name == "cuda") {
#if MLAGATE_HAS_CUDA
    if (!cuda_device_info().available) throw InputError("--reference cuda: " + cuda_device_info().error);
    r.name = "cuda";
    r.absorbed = cuda_golden_absorbed;
    r.mqa = cuda_reference_mqa;
    return r;
#else
    throw InputError("--reference cuda: this build has no CUDA");
#endif
  }
  throw InputError("--reference '" + name + "' (expected eigen or cuda)");
}

int cmd_run(const Selection& sel, const RunArgs& ra, const std::string& command_line,
            const std::vector<std::string>& args) {
  if (ra.worker && !ra.save_results.empty()) {
    // The results file is the parent's to write; the worker only runs.
    RunArgs w = ra;
    w.save_results.clear();
    return cmd_run(sel, w, command_line, args);
  }
  if (ra.repeat == 0) {
    // No --repeat: the suite's (a golden file's cases run once).
    RunArgs r = ra;
    r.repeat = ra.replay.empty() ? sel.suite_repeat() : 1;
    return cmd_run(sel, r, command_line, args);
  }
  const auto wall0 = std::chrono::steady_clock::now();
  if (ra.threads > 0) omp_set_num_threads(ra.threads);
  RunConfig cfg;
  // Golden files: replay takes the file's cases, so does run --golden when no
  // selection flag is given; stored references replace the recomputed ones.
  std::optional<GoldenRun> golden;
  if (!ra.golden.empty() || !ra.replay.empty() || !ra.save_results.empty())
    golden.emplace(GoldenRunOptions{ra.golden, ra.replay, ra.case_ids, ra.save_results, ra.max_bytes, command_line});
  const bool from_file = !ra.replay.empty() || (!ra.golden.empty() && sel.args().empty());
  cfg.cases = from_file ? golden->file_cases(sel.filter) : sel.resolve();
  if (!from_file && !ra.case_ids.empty()) {
    // --case: exactly these cases, in this order (order-dependent failures' repro).
    std::vector<CaseSpec> picked;
    for (const std::string& id : ra.case_ids) {
      auto it = std::find_if(cfg.cases.begin(), cfg.cases.end(), [&](const CaseSpec& c) { return c.id() == id; });
      if (it == cfg.cases.end()) throw InputError("--case '" + id + "': no such case in the selection");
      picked.push_back(*it);
    }
    cfg.cases = std::move(picked);
  }
  apply_order(cfg.cases, ra.order);
  if (ra.repeat < 1) throw InputError("--repeat must be >= 1");
  cfg.ops.clear();
  for (const auto& o : ra.ops) {
    if (o == "auto") {
      // The layer op for dense cases, the two sparse ops for sparse ones.
      const bool any_sparse = std::any_of(cfg.cases.begin(), cfg.cases.end(), [](const CaseSpec& c) { return c.sparse.active(); });
      const bool any_dense = std::any_of(cfg.cases.begin(), cfg.cases.end(), [](const CaseSpec& c) { return !c.sparse.active(); });
      if (any_dense || cfg.cases.empty()) cfg.ops.push_back(Op::kLayer);
      if (any_sparse) cfg.ops.insert(cfg.ops.end(), {Op::kSparseDecode, Op::kSparsePrefill});
      continue;
    }
    cfg.ops.push_back(parse_op(o));
  }
  for (std::size_t i = 1; i < cfg.ops.size(); ++i)  // each op once, in the order given
    if (std::find(cfg.ops.begin(), cfg.ops.begin() + static_cast<std::ptrdiff_t>(i), cfg.ops[i]) !=
        cfg.ops.begin() + static_cast<std::ptrdiff_t>(i))
      cfg.ops.erase(cfg.ops.begin() + static_cast<std::ptrdiff_t>(i--));
  // A case beyond this machine's memory is refused before anything is allocated.
  const bool prefill_op = std::find(cfg.ops.begin(), cfg.ops.end(), Op::kPrefill) != cfg.ops.end();
  if (const std::uint64_t avail = available_memory_bytes(); avail > 0 && !from_file)
    for (const CaseSpec& c : cfg.cases)
      if (const std::uint64_t need = estimate_case_bytes(c, prefill_op); need > avail) {
        char msg[160];
        std::snprintf(msg, sizeof msg, " needs about %.1f GiB (estimated), more than the %.1f GiB available",
                      static_cast<double>(need) / (1ull << 30), static_cast<double>(avail) / (1ull << 30));
        throw InputError("case " + c.id() + msg + ": refused before allocating");
      }
  cfg.policy = make_policy(ra.policy, ra.atol, ra.rtol, ra.fudge);
  cfg.baseline = make_baseline(ra.baseline);
  if (cfg.baseline.name == "none" && cfg.policy.kind == Policy::Kind::kBaseline)
    throw InputError("--baseline none: the baseline policy needs err_baseline (choose --policy vllm or fixed)");
  cfg.exec.poison = parse_poison(ra.poison);
  cfg.exec.poison_block_table = ra.poison_block_table;
  cfg.exec.reuse_buffers = ra.reuse_buffers;
  if (ra.prefill_chunk < 1) throw InputError("--prefill-chunk must be >= 1");
  cfg.exec.prefill_chunk = ra.prefill_chunk;
  if (ra.splits < 0) throw InputError("--splits must be >= 1 (or 0: chosen from the work)");
  cfg.reference = make_reference(ra.reference);
  const std::vector<BackendEntry> extra = ra.extra.entries();
  auto backends = select_backends(ra.backends, BackendOptions{ra.splits}, extra);
  // Report paths are checked before anything runs: a typo must not cost a run.
  for (const std::string* path : {&ra.json, &ra.junit, &ra.markdown}) {
    if (path->empty()) continue;
    const std::filesystem::path dir = std::filesystem::absolute(*path).parent_path();
    if (!std::filesystem::is_directory(dir)) throw InputError("report path " + *path + ": no directory " + dir.string());
    if (std::filesystem::is_directory(*path)) throw InputError("report path " + *path + " is a directory");
  }
  // A golden file is validated whole here, in the parent, before any worker
  // starts: a bad file is exit 2 with one message, never a backend's record.
  if (golden && !ra.worker) golden->validate(cfg.cases, cfg.exec);

  std::string exec_args;
  if (ra.poison != "nan") exec_args += " --poison " + ra.poison;
  if (ra.poison_block_table) exec_args += " --poison-block-table";
  if (ra.prefill_chunk != 2048) exec_args += " --prefill-chunk " + std::to_string(ra.prefill_chunk);
  if (ra.splits != 0) exec_args += " --splits " + std::to_string(ra.splits);
  if (ra.reference != "eigen") exec_args += " --reference " + ra.reference;
  if (ra.repeat > 1) exec_args += " --repeat " + std::to_string(ra.repeat);
  if (ra.reuse_buffers) exec_args += " --reuse-buffers";
  const std::string sel_args = sel.args();
  const std::string policy_args = cfg.policy.cli_args();
  const std::string golden_args = ra.golden.empty() ? "" : " --golden " + Selection::quote(ra.golden);
  const std::string extra_args = ra.extra.args();
  cfg.repro = [&](const CaseSpec& c, const std::string& backend, Op op) {
    const std::string tail =
        extra_args + " --backend " + backend + " --op " + std::string(op_name(op)) + " " + policy_args + exec_args;
    if (!ra.replay.empty()) return "mlagate replay " + Selection::quote(ra.replay) + " --case " + Selection::quote(c.id()) + tail;
    return "mlagate run" + sel_args + golden_args + " --filter " + Selection::quote("^" + regex_escape(c.id()) + "$") + tail;
  };
  if (!from_file)
    cfg.repro_sequence = [&](const std::vector<const CaseSpec*>& seq, const std::string& backend, Op op) {
      std::string cases;
      for (const CaseSpec* c : seq) cases += " --case " + Selection::quote(c->id());
      return "mlagate run" + sel_args + golden_args + cases + extra_args + " --backend " + backend + " --op " +
             std::string(op_name(op)) + " " + policy_args + exec_args;
    };
  const bool tty = isatty(STDERR_FILENO) && !ra.no_progress && !ra.quiet;
  std::size_t failed_so_far = 0;
  cfg.on_record = [&](const Record& r, std::size_t done, std::size_t total) {
    if (status_is_failure(r.status)) {
      ++failed_so_far;
      if (tty) std::fprintf(stderr, "\r\033[K");
      std::printf("%-10s %-12s %-7s %s\n  %s\n  repro: %s\n", std::string(status_name(r.status)).c_str(),
                  r.backend.c_str(), r.op.c_str(), r.case_id.c_str(), r.message.c_str(), r.repro.c_str());
      std::fflush(stdout);
    }
    if (tty) {
      const int width = 30;
      const int filled = static_cast<int>(width * done / std::max<std::size_t>(total, 1));
      std::fprintf(stderr, "\r\033[K[%.*s%*s] %zu/%zu  failed %zu  %s", filled, "##############################",
                   width - filled, "", done, total, failed_so_far, r.case_id.c_str());
      if (done == total) std::fprintf(stderr, "\r\033[K");
      std::fflush(stderr);
    }
  };
  if (golden) golden->attach(cfg);
  if (ra.repeat > 1)
    cfg.run_job = [&cfg, n = ra.repeat](CaseContext& ctx, Backend& b, Op op) { return run_repeated(ctx, b, op, cfg, n); };
  if (ra.worker) return worker_main(cfg, backends);

  // Isolation: worker processes unless asked otherwise or unavailable.
  std::string isolate = ra.isolate;
  if (isolate.empty()) isolate = !worker_executable().empty() && ra.save_results.empty() ? "process" : "none";
  if (isolate != "process" && isolate != "none") throw InputError("--isolate '" + isolate + "' (expected process or none)");
  if (isolate == "process" && worker_executable().empty())
    throw InputError("--isolate process: no worker executable (mlagate is embedded); use --isolate none");
  if (isolate == "process" && !ra.save_results.empty())
    throw InputError("--save-results keeps every output in this process: use it with --isolate none");
  if (!(ra.timeout >= 0)) throw InputError("--timeout must be >= 0");
  if (ra.order == "pairs" && isolate != "process") throw InputError("--order pairs needs --isolate process");
  if (!ra.save_failures.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(ra.save_failures, ec);
    if (!std::filesystem::is_directory(ra.save_failures))
      throw InputError("--save-failures " + ra.save_failures + ": not a directory" + (ec ? " (" + ec.message() + ")" : ""));
  }
  if (!ra.sanitize.empty()) {
    check_sanitize_tool(ra.sanitize);
    if (worker_executable().empty()) throw InputError("--sanitize: no mlagate executable to rerun (mlagate is embedded)");
    if (ra.sanitize_launch_count < 1) throw InputError("--sanitize-launch-count must be >= 1");
  }

  // The journal: every record on disk as it completes; --resume reads it back.
  std::string journal_path = ra.journal;
  for (const std::string* p : {&ra.json, &ra.junit, &ra.markdown})
    if (journal_path.empty() && !p->empty()) journal_path = *p + ".journal.jsonl";
  if (ra.resume && journal_path.empty())
    throw InputError("--resume: no journal to resume (give --journal FILE, or the interrupted run's report path)");
  std::string ops_args;
  for (Op o : cfg.ops) ops_args += (ops_args.empty() ? "" : ",") + std::string(op_name(o));
  std::string id_args;
  for (const auto& id : ra.case_ids) id_args += " --case " + Selection::quote(id);
  const std::string fingerprint =
      (ra.replay.empty() ? "run" + sel_args + golden_args : "replay " + Selection::quote(ra.replay)) +
      (sel.filter.empty() ? "" : " --filter " + Selection::quote(sel.filter)) + id_args + extra_args +
      " --backend " + Selection::quote(ra.backends) + " --op " + ops_args + " " + policy_args + exec_args +
      (ra.order == "given" ? "" : " --order " + ra.order);
  std::optional<Journal> journal;
  if (!journal_path.empty()) journal.emplace(journal_path, fingerprint, ra.resume);
  std::map<std::string, Record> finished, fresh;
  if (journal)
    for (const Record& r : journal->previous()) finished[Journal::key(r)] = r;
  const std::vector<CaseSpec> all_cases = cfg.cases;  // in-process resume narrows cfg.cases
  auto job_key = [&](std::size_t ci, std::size_t bi, Op op) {
    return Journal::key(all_cases[ci].id(), std::string(backends[bi]->name()), std::string(op_name(op)));
  };
  const std::size_t total = cfg.cases.size() * backends.size() * cfg.ops.size();
  std::size_t done_count = 0;
  for (std::size_t ci = 0; ci < cfg.cases.size(); ++ci)
    for (std::size_t bi = 0; bi < backends.size(); ++bi)
      for (Op op : cfg.ops) done_count += finished.count(job_key(ci, bi, op));
  if (ra.resume && !ra.quiet)
    std::printf("resuming from %s: %zu of %zu records already finished\n", journal_path.c_str(), done_count, total);
  const auto progress = cfg.on_record;
  auto record_done = [&](const Record& r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (journal) journal->append(r);
    fresh[Journal::key(r)] = r;
    ++done_count;
    if (progress) progress(r, done_count, total);
    run_profile().record_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  auto profile_ms_since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  run_profile().setup_ms = profile_ms_since(process_start_time());

  StopSignals stop_signals;
  cfg.stop = [] { return g_stop_signal != 0; };
  if (isolate == "none") {
    std::erase_if(cfg.cases, [&](const CaseSpec& c) {
      for (const auto& b : backends)
        for (Op op : cfg.ops)
          if (!finished.count(Journal::key(c.id(), std::string(b->name()), std::string(op_name(op))))) return false;
      return true;
    });
    auto inner = cfg.run_job;
    cfg.run_job = [&, inner](CaseContext& ctx, Backend& b, Op op) -> Record {
      const auto it = finished.find(Journal::key(context_spec(ctx).id(), std::string(b.name()), std::string(op_name(op))));
      if (it != finished.end()) return it->second;
      return inner ? inner(ctx, b, op) : run_one(ctx, b, op, cfg);
    };
    cfg.on_record = [&](const Record& r, std::size_t, std::size_t) {
      if (!finished.count(Journal::key(r))) record_done(r);
    };
    run_cases(cfg, backends);
  } else {
    std::vector<std::string> names;
    for (const auto& b : backends) names.emplace_back(b->name());
    std::vector<Job> jobs;
    for (std::size_t ci = 0; ci < cfg.cases.size(); ++ci)
      for (std::size_t bi = 0; bi < backends.size(); ++bi)
        for (Op op : cfg.ops)
          if (!finished.count(job_key(ci, bi, op))) jobs.push_back(Job{ci, bi, op});
    IsolationOptions io;
    io.argv.push_back(worker_executable());
    io.argv.insert(io.argv.end(), args.begin() + 1, args.end());
    io.argv.push_back("--worker");
    io.timeout_s = ra.timeout;
    io.pairs = ra.order == "pairs";
    io.max_order_checks = static_cast<std::size_t>(ra.order_checks);
    run_isolated(cfg, names, jobs, io, record_done);
  }
  const int stop_signal = g_stop_signal;
  const auto post0 = std::chrono::steady_clock::now();
  // Records in run order: journaled ones where this run did not redo them.
  std::vector<Record> records;
  for (std::size_t ci = 0; ci < all_cases.size(); ++ci)
    for (std::size_t bi = 0; bi < backends.size(); ++bi)
      for (Op op : cfg.ops) {
        const std::string k = job_key(ci, bi, op);
        if (auto it = fresh.find(k); it != fresh.end()) records.push_back(it->second);
        else if (auto jt = finished.find(k); jt != finished.end()) records.push_back(jt->second);
      }
  // --sanitize: failing records (or every selected one) rerun under compute-sanitizer.
  if (!ra.sanitize.empty() && stop_signal == 0) {
    SanitizeOptions so;
    so.tool = ra.sanitize;
    so.sanitizer = ra.sanitizer.empty() ? default_sanitizer() : ra.sanitizer;
    const std::filesystem::path self = worker_executable();
    so.mlagate = (std::filesystem::is_symlink(self) ? std::filesystem::read_symlink(self) : self).string();
    so.launch_count = ra.sanitize_launch_count;
    int budget = 20;  // reruns per run: each is a whole process under the sanitizer
    for (Record& r : records) {
      if (r.status == Status::kNotSupported || r.status == Status::kSkipped || r.status == Status::kInvalidCase) continue;
      if (!status_is_failure(r.status) && ra.case_ids.empty()) continue;
      if (budget-- <= 0) break;
      if (!ra.quiet) std::printf("sanitizing (%s): %s %s %s\n", so.tool.c_str(), r.backend.c_str(), r.op.c_str(), r.case_id.c_str());
      sanitize_record(r, so);
      if (journal) journal->append(r);
    }
  }
  // --save-failures: each failing record's case as a golden file, and the command that replays it.
  if (!ra.save_failures.empty() && stop_signal == 0) {
    std::string replay_tail = " " + policy_args;
    if (ra.poison != "nan") replay_tail += " --poison " + ra.poison;
    if (ra.prefill_chunk != 2048) replay_tail += " --prefill-chunk " + std::to_string(ra.prefill_chunk);
    if (ra.repeat > 1) replay_tail += " --repeat " + std::to_string(ra.repeat);
    for (Record& r : records) {
      if (!status_is_failure(r.status) || r.status == Status::kInvalidCase) continue;
      const Op op = parse_op(r.op);
      if (op == Op::kCacheWrite) continue;  // golden files hold no cache_write reference
      const auto spec =
          std::find_if(all_cases.begin(), all_cases.end(), [&](const CaseSpec& c) { return c.id() == r.case_id; });
      const auto b =
          std::find_if(backends.begin(), backends.end(), [&](const auto& x) { return x->name() == r.backend; });
      if (spec == all_cases.end() || b == backends.end()) continue;
      std::string file;
      for (char ch : r.case_id + "__" + r.backend + "__" + r.op)
        file += std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' || ch == '_' ? ch : '_';
      const std::string path = (std::filesystem::path(ra.save_failures) / (file + ".h5")).string();
      ExportOptions eo;
      eo.ops = {op};
      eo.policy = cfg.policy;
      eo.cache.poison = cfg.exec.poison;
      eo.cache.poison_block_table = cfg.exec.poison_block_table;
      eo.command_line = command_line;
      const int bs = r.block_size > 0 ? r.block_size : resolve_block_size((*b)->capabilities(), *spec);
      eo.block_sizes = [bs](const CaseSpec&) { return std::vector<int>{bs}; };
      try {
        export_golden({*spec}, path, eo);
        const std::string cmd = "mlagate replay " + Selection::quote(path) + extra_args + " --backend " + r.backend +
                                " --op " + r.op + replay_tail;
        r.details += (r.details.empty() ? "" : "\n") + std::string("repro bundle: ") + cmd;
        if (!ra.quiet) std::printf("saved %s\n  replay: %s\n", path.c_str(), cmd.c_str());
      } catch (const std::exception& e) {
        r.details += (r.details.empty() ? "" : "\n") + std::string("repro bundle not written: ") + e.what();
      }
    }
  }
  const std::string results_file = golden ? golden->finish() : std::string();
  run_profile().post_ms += profile_ms_since(post0);

  RunInfo info;
  info.tool_version = MLAGATE_VERSION;
  info.git_commit = MLAGATE_GIT_COMMIT;
  info.command_line = command_line;
  info.suite = sel.suite.empty() ? (sel.specs.empty() ? "smoke" : "sweep") : sel.suite;
  if (from_file) info.suite = ra.replay.empty() ? ra.golden : ra.replay;
  info.policy = cfg.policy.describe();
  info.started_at = iso_now();
  info.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  info.generator_version = gen::kGeneratorVersion;
  if (stop_signal != 0)
    info.interrupted = (stop_signal == SIGINT ? std::string("SIGINT") : stop_signal == SIGTERM ? std::string("SIGTERM")
                                                                   : "signal " + std::to_string(stop_signal)) +
                       ": " + std::to_string(records.size()) + " of " + std::to_string(total) + " records";
  const auto reports0 = std::chrono::steady_clock::now();
  // The JSON report's profile covers the run up to its own writing (the --profile table has the reports too).
  info.profile_wall_ms = profile_ms_since(process_start_time());
  info.profile = run_profile().rows(info.profile_wall_ms);
  if (!ra.json.empty()) write_report_file(ra.json, [&](std::ostream& os) { write_json(os, info, records); });
  if (!ra.junit.empty()) write_report_file(ra.junit, [&](std::ostream& os) { write_junit(os, info, records); });
  if (!ra.markdown.empty()) write_report_file(ra.markdown, [&](std::ostream& os) { write_markdown(os, info, records); });
  // A whole run's reports hold every record: its journal has done its job.
  if (journal && stop_signal == 0) {
    const std::string jp = journal->path();
    journal.reset();
    std::error_code ec;
    std::filesystem::remove(jp, ec);
  }
  run_profile().reports_ms += profile_ms_since(reports0);

  const StatusCounts counts = count_statuses(records);
  if (!ra.quiet) {
    std::printf("\n%s", summary_table(records).c_str());
    std::printf("%s: %lld records, %lld failed, policy %s, %.1f s\n",
                stop_signal != 0 ? "INTERRUPTED" : std::string(overall_verdict(counts)).c_str(),
                static_cast<long long>(counts.total), static_cast<long long>(counts.failures), info.policy.c_str(),
                info.wall_seconds);
    if (!results_file.empty()) std::printf("results: %s\n", results_file.c_str());
  }
  if (ra.profile) {
    const RunProfile& p = run_profile();
    std::printf("\nprofile (every process of the run; jobs' phases from their records):\n%s",
                profile_table(p, profile_ms_since(process_start_time())).c_str());
  }
  if (stop_signal != 0) {
    std::printf("INTERRUPTED by %s: %zu of %zu records finished (reports hold them)\n", strsignal(stop_signal),
                records.size(), total);
    if (journal) std::printf("continue with: %s%s\n", command_line.c_str(), ra.resume ? "" : " --resume");
    std::fflush(stdout);
    return kExitInterruptedBase + stop_signal;
  }
  if (counts.failures > 0) return kExitFailed;
  if (counts[Status::kPassed] == 0 && !ra.allow_nothing_ran) {
    std::fprintf(stderr,
                 "mlagate: nothing ran: %lld records, none executed (skipped or not supported); exit %d "
                 "(--allow-nothing-ran accepts this)\n",
                 static_cast<long long>(counts.total), kExitNothingRan);
    return kExitNothingRan;
  }
  return kExitPassed;
}

struct ShrinkArgs {
  std::string backend, op = "auto", out = "shrunk", policy = "baseline", poison = "nan";
  std::vector<std::string> case_ids;
  double atol = 1e-2, rtol = 1e-2, fudge = kDefaultFudge;
  int max_runs = 200, splits = 0;
  OutOfTree extra;
};

// mlagate shrink: the selection resolves to the failing case (the last --case;
// earlier --case ids are its predecessors, as an order-dependent record's
// repro gives them); every candidate run gets the backend flags given here.
int cmd_shrink(const Selection& sel, const ShrinkArgs& sa) {
  std::vector<CaseSpec> cases = sel.resolve();
  if (!sa.case_ids.empty()) {
    std::vector<CaseSpec> picked;
    for (const std::string& id : sa.case_ids) {
      auto it = std::find_if(cases.begin(), cases.end(), [&](const CaseSpec& c) { return c.id() == id; });
      if (it == cases.end()) throw InputError("--case '" + id + "': no such case in the selection");
      picked.push_back(*it);
    }
    cases = std::move(picked);
  } else if (cases.size() != 1) {
    throw InputError("shrink: the selection has " + std::to_string(cases.size()) +
                     " cases; name the failing one with --case (or narrow --filter to one)");
  }
  ShrinkOptions o;
  o.target = cases.back();
  o.before.assign(cases.begin(), cases.end() - 1);
  o.backend = sa.backend;
  o.op = sa.op == "auto" ? (o.target.sparse.active() ? Op::kSparseDecode : Op::kLayer) : parse_op(sa.op);
  o.out_dir = sa.out;
  o.max_runs = sa.max_runs;
  if (sa.max_runs < 1) throw InputError("--max-runs must be >= 1");
  // The backend must exist (a plugin or exec backend is loaded here to check).
  bool found = false;
  for (const auto& e : sa.extra.entries()) found = found || e.name == sa.backend;
  for (const auto& e : backend_registry()) found = found || e.name == sa.backend;
  if (!found) throw InputError("shrink: no backend named '" + sa.backend + "' (one exact name)");
  auto& a = o.run_args;
  for (const auto& p : sa.extra.plugins) a.insert(a.end(), {"--plugin", p});
  for (std::size_t i = 0; i < sa.extra.exec_commands.size(); ++i) {
    a.insert(a.end(), {"--exec", sa.extra.exec_commands[i]});
    if (i < sa.extra.exec_names.size()) a.insert(a.end(), {"--exec-name", sa.extra.exec_names[i]});
    if (i < sa.extra.exec_caps.size()) a.insert(a.end(), {"--exec-caps", sa.extra.exec_caps[i]});
  }
  if (!sa.extra.exec_commands.empty()) a.insert(a.end(), {"--exec-timeout", exact_number(sa.extra.exec_timeout)});
  a.insert(a.end(), {"--policy", sa.policy});
  if (sa.policy == "fixed") a.insert(a.end(), {"--atol", exact_number(sa.atol), "--rtol", exact_number(sa.rtol)});
  if (sa.policy == "baseline") a.insert(a.end(), {"--fudge", exact_number(sa.fudge)});
  if (sa.poison != "nan") a.insert(a.end(), {"--poison", sa.poison});
  if (sa.splits != 0) a.insert(a.end(), {"--splits", std::to_string(sa.splits)});
  return shrink_main(o);
}

struct ExportArgs {
  std::string out, backends = "*", policy = "baseline", poison = "nan";
  std::vector<std::string> ops{"layer"};
  double atol = 1e-2, rtol = 1e-2, fudge = kDefaultFudge;
  bool poison_block_table = false;
};

int cmd_export(const Selection& sel, const ExportArgs& ea, const std::string& command_line) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<CaseSpec> cases = sel.resolve();
  ExportOptions opt;
  opt.ops.clear();
  for (const auto& o : ea.ops) {
    const Op op = parse_op(o);
    if (op != Op::kLayer && op != Op::kDecode && op != Op::kPrefill) throw InputError("export --op: layer, decode, prefill");
    opt.ops.push_back(op);
  }
  opt.policy = make_policy(ea.policy, ea.atol, ea.rtol, ea.fudge);
  opt.cache.poison = parse_poison(ea.poison);
  opt.cache.poison_block_table = ea.poison_block_table;
  opt.command_line = command_line;
  // bs=auto: a cache for the block size each selected backend runs the case with.
  const auto backends = select_backends(ea.backends);
  opt.block_sizes = [&backends](const CaseSpec& spec) {
    std::vector<int> sizes;
    for (const auto& b : backends) {
      const int bs = resolve_block_size(b->capabilities(), spec);
      if (std::find(sizes.begin(), sizes.end(), bs) == sizes.end()) sizes.push_back(bs);
    }
    return sizes;
  };
  const ExportSummary s = export_golden(cases, ea.out, opt);
  std::printf("exported %zu cases (%zu caches) to %s: %.1f MiB, %.1f s\n", s.cases, s.caches, ea.out.c_str(),
              static_cast<double>(s.file_bytes) / (1 << 20),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return kExitPassed;
}

int cmd_compare(const std::string& a, const std::string& b, const FileCompareOptions& opt) {
  if (!(opt.atol >= 0) || !(opt.rtol >= 0)) throw InputError("--atol and --rtol must be >= 0");
  return compare_results_files(a, b, opt, stdout).failed(opt) ? kExitFailed : kExitPassed;
}

}  // namespace

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
  CLI::App* run = app.add_subcommand("run", "run cases on backends and compare against the fp64 golden");
  run_sel.add_options(run);
  run->add_option("--backend", ra.backends, "backend globs, comma-separated (e.g. 'cpu.*')")->capture_default_str();
  ra.extra.add_options(run);
  run->add_option("--op", ra.ops,
                  "ops: auto (layer for dense cases, sparse_decode and sparse_prefill for sparse ones), layer, decode, "
                  "prefill, cache_write, sparse_decode, sparse_prefill (comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  run->add_option("--policy", ra.policy, "tolerance policy: baseline | vllm | fixed")->capture_default_str();
  run->add_option("--atol", ra.atol, "absolute tolerance (fixed policy)")->capture_default_str();
  run->add_option("--rtol", ra.rtol, "relative tolerance (fixed policy)")->capture_default_str();
  run->add_option("--fudge", ra.fudge, "baseline policy: pass when err <= fudge * err_baseline + floor")->capture_default_str();
  run->add_option("--baseline", ra.baseline,
                  "err_baseline from: emulated (CPU emulation) | torch (libtorch SDPA, layer output) | none (no min_fudge)")
      ->capture_default_str();
  run->add_option("--poison", ra.poison, "poison for outputs and unused cache: nan | sentinel | zero | none")->capture_default_str();
  run->add_flag("--poison-block-table", ra.poison_block_table, "unused block-table entries hold an invalid huge id");
  run->add_option("--prefill-chunk", ra.prefill_chunk, "context tokens per chunk of the prefill path")->capture_default_str();
  run->add_option("--json", ra.json, "write the JSON report here");
  run->add_option("--junit", ra.junit, "write a JUnit XML report here");
  run->add_option("--markdown", ra.markdown, "write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)");
  run->add_option("--threads", ra.threads, "OpenMP threads (results do not depend on it)");
  run->add_option("--splits", ra.splits, "split-KV backends (cpu.splitkv, cuda.splitkv): force N splits per request");
  run->add_option("--reference", ra.reference, "where the fp64 golden is computed: eigen (CPU) | cuda (GPU)")
      ->capture_default_str();
  run->add_flag("--quiet,-q", ra.quiet, "print only failures");
  run->add_flag("--no-progress", ra.no_progress, "no progress bar");
  run->add_flag("--allow-nothing-ran", ra.allow_nothing_ran,
                "exit 0 when no record ran (every one skipped or not supported); default: exit 4");
  run->add_flag("--profile", ra.profile, "print where the wall time went (a table of phases summing to the wall)");
  run->add_option("--golden", ra.golden, "compare against this golden file's stored references (inputs checked by hash)");
  run->add_option("--save-results", ra.save_results, "write every backend's outputs and metrics to this HDF5 file");
  run->add_option("--max-bytes", ra.max_bytes, "memory budget per case read from a file (e.g. 8GiB)")
      ->transform(CLI::AsSizeValue(false));
  run->add_option("--case", ra.case_ids, "exact case id (repeatable): only these cases, run in the order given");
  add_reliability_options(run, ra);

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
  exp->add_option("--policy", ea.policy, "tolerance policy recorded with the cases: baseline | vllm | fixed")
      ->capture_default_str();
  exp->add_option("--fudge", ea.fudge, "baseline policy's fudge (recorded)")->capture_default_str();
  exp->add_option("--atol", ea.atol, "absolute tolerance (fixed policy)")->capture_default_str();
  exp->add_option("--rtol", ea.rtol, "relative tolerance (fixed policy)")->capture_default_str();
  exp->add_option("--poison", ea.poison, "poison of unused cache regions: nan | sentinel | zero | none")->capture_default_str();
  exp->add_flag("--poison-block-table", ea.poison_block_table, "unused block-table entries hold an invalid huge id");

  RunArgs rp;
  CLI::App* replay = app.add_subcommand("replay", "run a golden file's stored inputs and caches (no regeneration)");
  replay->add_option("file", rp.replay, "golden file")->required();
  replay->add_option("--case", rp.case_ids, "exact case id (repeatable); default every case");
  replay->add_option("--filter", replay_sel.filter, "keep cases whose id matches this regex");
  replay->add_option("--backend", rp.backends, "backend globs, comma-separated")->capture_default_str();
  replay->add_option("--op", rp.ops,
                    "ops: auto (layer for dense cases, sparse_decode and sparse_prefill for sparse ones), layer, "
                    "decode, prefill, cache_write, sparse_decode, sparse_prefill (comma-separated)")->delimiter(',')->capture_default_str();
  replay->add_option("--policy", rp.policy, "tolerance policy: baseline | vllm | fixed")->capture_default_str();
  replay->add_option("--atol", rp.atol, "absolute tolerance (fixed policy)")->capture_default_str();
  replay->add_option("--rtol", rp.rtol, "relative tolerance (fixed policy)")->capture_default_str();
  replay->add_option("--fudge", rp.fudge, "baseline policy: pass when err <= fudge * err_baseline + floor")->capture_default_str();
  replay->add_option("--poison", rp.poison, "poison of output buffers: nan | sentinel | zero | none")->capture_default_str();
  replay->add_option("--prefill-chunk", rp.prefill_chunk, "context tokens per chunk of the prefill path")->capture_default_str();
  replay->add_option("--json", rp.json, "write the JSON report here");
  replay->add_option("--junit", rp.junit, "write a JUnit XML report here");
  replay->add_option("--markdown", rp.markdown, "write a Markdown summary here");
  replay->add_option("--save-results", rp.save_results, "write every backend's outputs and metrics to this HDF5 file");
  replay->add_option("--max-bytes", rp.max_bytes, "memory budget per case read from the file (e.g. 8GiB)")
      ->transform(CLI::AsSizeValue(false));
  replay->add_option("--threads", rp.threads, "OpenMP threads");
  replay->add_flag("--quiet,-q", rp.quiet, "print only failures");
  replay->add_flag("--no-progress", rp.no_progress, "no progress bar");
  replay->add_flag("--allow-nothing-ran", rp.allow_nothing_ran,
                   "exit 0 when no record ran (every one skipped or not supported); default: exit 4");
  replay->add_flag("--profile", rp.profile, "print where the wall time went (a table of phases summing to the wall)");
  rp.extra.add_options(replay);  // --plugin, --exec: repro bundles of out-of-tree backends replay too
  add_reliability_options(replay, rp);

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

  // `mlagate bench` (harness/bench.h): decode speed side by side on the GPU.
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
  shrink->add_option("--op", sa.op, "the failing op (auto: layer, or sparse_decode for sparse cases)")->capture_default_str();
  sa.extra.add_options(shrink);
  shrink->add_option("--policy", sa.policy, "tolerance policy: baseline | vllm | fixed")->capture_default_str();
  shrink->add_option("--atol", sa.atol, "absolute tolerance (fixed policy)")->capture_default_str();
  shrink->add_option("--rtol", sa.rtol, "relative tolerance (fixed policy)")->capture_default_str();
  shrink->add_option("--fudge", sa.fudge, "baseline policy's fudge")->capture_default_str();
  shrink->add_option("--poison", sa.poison, "poison: nan | sentinel | zero | none")->capture_default_str();
  shrink->add_option("--splits", sa.splits, "forced splits of split-KV backends (0: from the work)")->capture_default_str();
  shrink->add_option("--out", sa.out, "folder for shrunk.yaml, the golden bundle and the runs' scratch")
      ->capture_default_str();
  shrink->add_option("--max-runs", sa.max_runs, "runs at most before the final one (the first run counts)")->capture_default_str();

  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + Selection::quote(argv[i]);
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
    if (bench->parsed()) return run_bench(bench_opt, stdout);
    if (shrink->parsed()) return cmd_shrink(shrink_sel, sa);
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
