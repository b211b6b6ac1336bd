// CLI: case selection (suite, filter, sweeps), list and run subcommands,
// progress and console output, report files, and the exit-code mapping.
#include "harness/cli.h"

#include <CLI/CLI.hpp>
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <ctime>
#include <iostream>
#include <optional>
#include <regex>
#include <sstream>

#include "backends/registry.h"
#include "cases/errors.h"
#include "cases/generator.h"
#include "cases/suite.h"
#include "harness/layer.h"
#include "harness/runner.h"
#include "mlagate/config.h"
#include "reports/report.h"

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
    app->add_option("--suite", suite, "built-in suite (vllm, smoke, edges) or a suite YAML file");
    app->add_option("--filter", filter, "keep cases whose id matches this regex (ECMAScript, search)");
    app->add_option("--spec", specs, "batch specs to sweep (comma-separated); narrows --suite")->delimiter(',');
    app->add_option("--tp", tps, "TP degrees: heads = 128 / tp (comma-separated)")->delimiter(',');
    app->add_option("--dtype", dtypes, "model dtypes: bf16, fp16")->delimiter(',');
    app->add_option("--kv-cache-dtype", kv_dtypes, "kv cache dtypes: auto")->delimiter(',');
    app->add_option("--block-size", block_sizes, "block sizes, or auto (each backend's preferred)")->delimiter(',');
    app->add_option("--seed", seeds, "seeds (comma-separated)")->delimiter(',');
  }

  std::vector<CaseSpec> resolve() const {
    Sweep sw;
    sw.specs = specs;
    sw.tps = tps;
    for (const auto& d : dtypes) sw.dtypes.push_back(parse_model_dtype(d));
    for (const auto& k : kv_dtypes) sw.kv_dtypes.push_back(parse_kv_cache_dtype(k));
    for (const auto& b : block_sizes) {
      if (b == "auto") {
        sw.block_sizes.push_back(0);
        continue;
      }
      try {
        std::size_t pos = 0;
        const int v = std::stoi(b, &pos);
        if (pos != b.size()) throw std::invalid_argument(b);
        sw.block_sizes.push_back(v);
      } catch (const std::exception&) {
        throw InputError("--block-size: '" + b + "' is not a number or auto");
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

  static std::string quote(const std::string& s) {
    if (s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=,:") == std::string::npos)
      return s;
    std::string r = "'";
    for (char ch : s) r += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return r + "'";
  }
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
  return "ops=" + ops + " block_sizes=" + bss + " query_len=" + std::string(query_len_support_name(caps.query_len_support)) +
         " reorder_threshold=" + std::to_string(caps.reorder_threshold);
}

int cmd_list(const std::string& what, const Selection& sel, const std::string& backend_globs) {
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
    for (const auto& b : select_backends(backend_globs))
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
    auto backends = select_backends(backend_globs);
    std::printf("%-64s", "case (layer op)");
    for (const auto& b : backends) std::printf(" %-14s", std::string(b->name()).c_str());
    std::printf("\n");
    for (const auto& c : cases) {
      std::printf("%-64s", c.id().c_str());
      std::vector<std::string> reasons;
      for (const auto& b : backends) {
        Support s = b->supports(c, Op::kLayer);
        if (s.ok) s = route_requests(b->capabilities(), c).support;
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
  std::vector<std::string> ops{"layer"};
  std::string policy = "vllm";
  double atol = 1e-2, rtol = 1e-2;
  std::string poison = "nan";
  bool poison_block_table = false;
  int prefill_chunk = 2048;
  std::string json, junit, markdown;
  bool quiet = false, no_progress = false;
  int threads = 0;
};

int cmd_run(const Selection& sel, const RunArgs& ra, const std::string& command_line) {
  const auto wall0 = std::chrono::steady_clock::now();
  if (ra.threads > 0) omp_set_num_threads(ra.threads);
  RunConfig cfg;
  cfg.cases = sel.resolve();
  cfg.ops.clear();
  for (const auto& o : ra.ops) {
    const Op op = parse_op(o);
    if (op == Op::kCacheWrite) throw InputError("--op cache_write arrives with the fp8 cache work");
    cfg.ops.push_back(op);
  }
  cfg.policy = make_policy(ra.policy, ra.atol, ra.rtol);
  cfg.exec.poison = parse_poison(ra.poison);
  cfg.exec.poison_block_table = ra.poison_block_table;
  if (ra.prefill_chunk < 1) throw InputError("--prefill-chunk must be >= 1");
  cfg.exec.prefill_chunk = ra.prefill_chunk;
  auto backends = select_backends(ra.backends);
  // Report paths are checked before anything runs: a typo must not cost a run.
  for (const std::string* path : {&ra.json, &ra.junit, &ra.markdown}) {
    if (path->empty()) continue;
    const std::filesystem::path dir = std::filesystem::absolute(*path).parent_path();
    if (!std::filesystem::is_directory(dir)) throw InputError("report path " + *path + ": no directory " + dir.string());
    if (std::filesystem::is_directory(*path)) throw InputError("report path " + *path + " is a directory");
  }

  std::string exec_args;
  if (ra.poison != "nan") exec_args += " --poison " + ra.poison;
  if (ra.poison_block_table) exec_args += " --poison-block-table";
  if (ra.prefill_chunk != 2048) exec_args += " --prefill-chunk " + std::to_string(ra.prefill_chunk);
  const std::string sel_args = sel.args();
  const std::string policy_args = cfg.policy.cli_args();
  cfg.repro = [&](const CaseSpec& c, const std::string& backend, Op op) {
    return "mlagate run" + sel_args + " --filter " + Selection::quote("^" + regex_escape(c.id()) + "$") + " --backend " +
           backend + " --op " + std::string(op_name(op)) + " " + policy_args + exec_args;
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
  const std::vector<Record> records = run_cases(cfg, backends);

  RunInfo info;
  info.tool_version = MLAGATE_VERSION;
  info.git_commit = MLAGATE_GIT_COMMIT;
  info.command_line = command_line;
  info.suite = sel.suite.empty() ? (sel.specs.empty() ? "smoke" : "sweep") : sel.suite;
  info.policy = cfg.policy.describe();
  info.started_at = iso_now();
  info.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  info.generator_version = gen::kGeneratorVersion;
  if (!ra.json.empty()) write_report_file(ra.json, [&](std::ostream& os) { write_json(os, info, records); });
  if (!ra.junit.empty()) write_report_file(ra.junit, [&](std::ostream& os) { write_junit(os, info, records); });
  if (!ra.markdown.empty()) write_report_file(ra.markdown, [&](std::ostream& os) { write_markdown(os, info, records); });

  const StatusCounts counts = count_statuses(records);
  if (!ra.quiet) {
    std::printf("\n%s", summary_table(records).c_str());
    std::printf("%s: %lld records, %lld failed, policy %s, %.1f s\n", std::string(overall_verdict(counts)).c_str(),
                static_cast<long long>(counts.total), static_cast<long long>(counts.failures), info.policy.c_str(),
                info.wall_seconds);
  }
  return counts.failures > 0 ? kExitFailed : kExitPassed;
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

  RunArgs ra;
  CLI::App* run = app.add_subcommand("run", "run cases on backends and compare against the fp64 golden");
  run_sel.add_options(run);
  run->add_option("--backend", ra.backends, "backend globs, comma-separated (e.g. 'cpu.*')")->capture_default_str();
  run->add_option("--op", ra.ops, "ops: layer, decode, prefill (comma-separated)")->delimiter(',')->capture_default_str();
  run->add_option("--policy", ra.policy, "tolerance policy: vllm | fixed")->capture_default_str();
  run->add_option("--atol", ra.atol, "absolute tolerance (fixed policy)")->capture_default_str();
  run->add_option("--rtol", ra.rtol, "relative tolerance (fixed policy)")->capture_default_str();
  run->add_option("--poison", ra.poison, "poison for outputs and unused cache: nan | sentinel | zero | none")->capture_default_str();
  run->add_flag("--poison-block-table", ra.poison_block_table, "unused block-table entries hold an invalid huge id");
  run->add_option("--prefill-chunk", ra.prefill_chunk, "context tokens per chunk of the prefill path")->capture_default_str();
  run->add_option("--json", ra.json, "write the JSON report here");
  run->add_option("--junit", ra.junit, "write a JUnit XML report here");
  run->add_option("--markdown", ra.markdown, "write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)");
  run->add_option("--threads", ra.threads, "OpenMP threads (results do not depend on it)");
  run->add_flag("--quiet,-q", ra.quiet, "print only failures");
  run->add_flag("--no-progress", ra.no_progress, "no progress bar");

  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + Selection::quote(argv[i]);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitPassed : kExitUsage;
  }
  try {
    if (list->parsed()) return cmd_list(list_what, list_sel, list_backends);
    if (run->parsed()) return cmd_run(run_sel, ra, command_line);
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
