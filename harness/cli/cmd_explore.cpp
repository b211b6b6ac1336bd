// `mlagate explore` on the command line: its options, and the flags each run
// of the search and each shrink candidate get (harness/explore/EXPLORE.md).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "cases/errors.h"
#include "cases/suite.h"
#include "harness/cli/commands.h"
#include "harness/explore/explore.h"
#include "harness/reliability/isolate.h"
#include "harness/reliability/memory_estimate.h"
#include "harness/verdicts/expectations.h"

namespace mlagate {

namespace {

// "90", "90s", "10m", "1.5h": seconds.
double parse_duration(const std::string& s) {
  if (s.empty()) return 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const std::string unit(end);
  const double mult = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : -1;
  if (end == s.c_str() || mult < 0 || !(v > 0) || !std::isfinite(v))
    throw InputError("--budget '" + s + "': a duration such as 600, 90s, 10m or 1h");
  return v * mult;
}

}  // namespace

void ExploreArgs::add_options(CLI::App* app) {
  app->add_option("--backend", backends, "backend globs (comma-separated); cases are drawn within each one's declaration in turn")
      ->required();
  app->add_option("--op", ops, "ops to draw (comma-separated; default: every op each backend declares)")->delimiter(',');
  app->add_option("--budget", budget, "wall time of the search, e.g. 600, 90s, 10m, 1h (shrinking included)");
  app->add_option("--cases", cases, "cases to draw (with --budget: whichever ends first)");
  app->add_option("--seed", seed, "the search's seed: the same seed draws the same cases on any machine")->capture_default_str();
  app->add_option("--suite", suite, "a suite file whose explore: block is the space to draw from");
  app->add_option("--out", out, "folder for the state, the findings (shrunk cases, bundles) and the reports")->capture_default_str();
  app->add_flag("--resume", resume, "continue the search saved in --out (after a kill or an interrupt)");
  app->add_option("--round", round,
                  "cases per `mlagate run` of the search (default auto: 16, growing with the search up to 256)");
  app->add_flag("--no-shrink", no_shrink, "do not shrink the first case of each failure signature");
  app->add_flag("--no-triage", no_triage,
                "do not triage new failures (their what-if variants) nor group signatures by cause beyond backend, "
                "status and failing outputs");
  app->add_option("--expect", expect,
                  "expectations file (repeatable): failures its entries expect are counted as known, not findings, "
                  "and are not shrunk or triaged (harness/verdicts/VERDICTS.md)");
  app->add_option("--shrink-runs", shrink_runs, "candidate runs per shrink")->capture_default_str();
  app->add_option("--max-work", max_work, "multiply-adds of one case's fp64 reference at most (default 1e9; the explore block's max_work wins)");
  app->add_option("--json", json, "a copy of the JSON report (always in --out/report.json)");
  app->add_option("--html", html, "the HTML page (default --out/report.html)");
  app->add_flag("--quiet,-q", quiet, "print only the findings");
  app->add_flag("--profile", profile,
                "at the end, where the search's time went: the runs' phases, their processes' start and end, "
                "explore's own work, shrinking and triage (always in the report's profile_s)");
  app->add_option("--reference", reference, "where the fp64 reference is computed: eigen | cuda")->capture_default_str();
  app->add_option("--devices", devices, "GPUs the runs spread their workers over (mlagate run --devices)")->delimiter(',');
  app->add_option("--workers", workers, "worker processes per run (mlagate run --workers; default: one a core, at most 8, with --reference eigen, "
                  "half of run's own a device with --reference cuda)");
  app->add_option("--timeout", timeout, "seconds per case, backend and op before it is killed: TIMEOUT")->capture_default_str();
  app->add_option("--threads", threads, "OpenMP threads of each run");
  add_handed_on_options(app, policy, poison, extra);
}

int cmd_explore(const ExploreArgs& a) {
  ExploreOptions o;
  o.backends = a.backends;
  o.extra = a.extra.entries();
  if (!a.suite.empty()) {
    const Suite s = load_suite(a.suite);
    if (!s.explore) throw InputError("explore --suite " + a.suite + ": the file has no explore: block");
    o.space = *s.explore;
    o.space_source = s.source;
  }
  if (!a.ops.empty()) {
    o.space.ops.clear();
    for (const std::string& op : a.ops) o.space.ops.push_back(std::string(op_name(parse_op(op))));
  }
  o.seed = a.seed;
  o.max_cases = a.cases;
  o.budget_s = parse_duration(a.budget);
  o.round = a.round;
  o.out_dir = a.out;
  o.json = a.json;
  o.html = a.html;
  o.resume = a.resume;
  o.shrink = !a.no_shrink;
  o.triage = !a.no_triage;
  (void)ExpectationSet::load(a.expect);  // a malformed file is an input error before anything runs
  o.environment = run_environment();
  o.shrink_runs = a.shrink_runs;
  o.quiet = a.quiet;
  o.profile = a.profile;
  if (a.shrink_runs < 1) throw InputError("--shrink-runs must be >= 1");
  if (a.timeout < 0) throw InputError("--timeout must be >= 0");
  if (a.reference != "eigen" && a.reference != "cuda") throw InputError("--reference: eigen or cuda");
  o.limits.max_work = a.max_work > 0 ? a.max_work : 1e9;
  // A case's host memory: the run's --max-bytes and half of what is free now
  // (workers run cases side by side).
  const std::uint64_t avail = available_memory_bytes();
  o.limits.max_bytes = avail ? std::min<std::uint64_t>(kDefaultMaxBytes, avail / 2) : kDefaultMaxBytes;
  RunArgs ra;
  ra.policy = a.policy;
  ra.poison = a.poison;
  ra.reference = a.reference;
  std::vector<std::string> common = a.extra.argv();
  const std::vector<std::string> comp = ra.computation_argv();
  common.insert(common.end(), comp.begin(), comp.end());
  std::ostringstream timeout;
  timeout << a.timeout;
  common.insert(common.end(), {"--timeout", timeout.str()});
  if (a.threads > 0) common.insert(common.end(), {"--threads", std::to_string(a.threads)});
  o.shrink_flags = common;
  o.run_flags = common;
  for (const std::string& e : a.expect) o.run_flags.insert(o.run_flags.end(), {"--expect", e});
  if (!a.devices.empty()) {
    std::string d;
    for (const auto& x : a.devices) d += (d.empty() ? "" : ",") + x;
    o.run_flags.insert(o.run_flags.end(), {"--devices", d});
  }
  if (!a.workers.empty()) {
    o.run_flags.insert(o.run_flags.end(), {"--workers", a.workers});
  } else {
    // A round's cases side by side: on the CPU a worker a core (at most 8):
    // explore's cases are independent draws of distinct seeds, and one
    // worker's threads leave cores idle through its drawing, glue and
    // process start (2-core VM, the default space: 2.52-2.89 cases/s with one
    // worker, 3.43-3.51 with two). On the GPU half of run's workers a device:
    // one H200 with 16 cores, the five Hopper backends: 8.04-8.08 cases/s
    // with run's 8, 9.04-9.56 with 4, 9.13 with 3, 8.58 with 2, 7.41 with 12
    // (EXPLORE.md). Outside the state's fingerprint: a search resumes on
    // another machine.
    o.default_workers = std::to_string(
        explore_workers_per_device(a.reference == "cuda", host_cpus(), std::max<std::size_t>(1, a.devices.size())));
  }
  return explore_main(o);
}

}  // namespace mlagate
