// The search loop of `mlagate explore` (explore.h): draw a round, run it
// through the binary, group failures by signature, shrink the first of each,
// save the state; until the budget or the case count is spent.
#include "harness/explore/explore.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "backends/exec/subprocess.h"
#include "cases/errors.h"
#include "harness/explore/coverage.h"
#include "harness/explore/explore_report.h"
#include "harness/explore/signature.h"
#include "harness/explore/state.h"
#include "harness/reliability/isolate.h"
#include "harness/reliability/shrink.h"
#include "harness/reliability/spawn.h"
#include "harness/verdicts/facts.h"
#include "harness/verdicts/triage.h"
#include "cases/suite.h"
#include "reports/report.h"

namespace mlagate {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::atomic<int> g_stop_signal{0};
void on_stop(int sig) { g_stop_signal = sig; }

std::string tail_of(const std::string& path, std::size_t max_bytes = 1500) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > max_bytes ? s.substr(s.size() - max_bytes) : s;
}

bool ran(Status s) { return s != Status::kSkipped && s != Status::kNotSupported; }

class Search {
 public:
  explicit Search(const ExploreOptions& o) : opt_(o), dir_(o.out_dir) {}

  int main() {
    fs::create_directories(dir_ / "rounds");
    fs::create_directories(dir_ / "findings");
    const fs::path state_path = dir_ / "state.json";
    fingerprint_ = {{"seed", opt_.seed},
                    {"backends", opt_.backends},
                    {"space", explore_space_yaml(opt_.space)},
                    {"run_flags", opt_.run_flags},
                    {"round", opt_.round},
                    {"max_work", opt_.limits.max_work}};
    if (fs::exists(state_path)) {
      if (!opt_.resume)
        throw InputError("explore: " + state_path.string() + " holds a search: --resume continues it, or give another --out");
      load(state_path);
    } else {
      state_ = {{"schema", "mlagate-explore/1"},
                {"fingerprint", fingerprint_},
                {"next_index", 0},
                {"elapsed_s", 0.0},
                {"search_s", 0.0},
                {"shrink_s", 0.0},
                {"cases", {{"drawn", 0}, {"ran", 0}, {"undrawable", 0}}},
                {"records", Json::object()},
                {"record_ms", 0.0},
                {"coverage", Json::object()},
                {"findings", Json::array()},
                {"causes", Json::array()},
                {"known", Json::object()},
                {"xpass", Json::object()},
                {"triage_s", 0.0},
                {"profile_s", Json::object()},
                {"harness_errors", Json::array()},
                {"slowest", {{"ms", 0.0}, {"case", ""}}},
                {"done", false}};
    }
    state_["space_source"] = opt_.space_source;
    // States saved before causes and --expect: the same search with nothing in them yet.
    for (const char* k : {"causes"}) if (!state_.contains(k)) state_[k] = Json::array();
    for (const char* k : {"known", "xpass"}) if (!state_.contains(k)) state_[k] = Json::object();
    if (!state_.contains("triage_s")) state_["triage_s"] = 0.0;
    if (!state_.contains("profile_s")) state_["profile_s"] = Json::object();
    for (const Json& f : state_["findings"]) known_.insert(f.at("backend").get<std::string>() + " | " + f.at("signature").get<std::string>());
    // Backends to draw within (capabilities, supports()).
    BackendOptions bo;
    backends_ = select_backends(opt_.backends, bo, opt_.extra);
    std::vector<const Backend*> ptrs;
    for (const auto& b : backends_) ptrs.push_back(b.get());
    drawer_ = std::make_unique<CaseDrawer>(opt_.space, ptrs, opt_.seed, opt_.limits);

    struct sigaction sa = {}, old_int = {}, old_term = {};
    sa.sa_handler = on_stop;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    const auto t0 = std::chrono::steady_clock::now();
    const double elapsed0 = state_["elapsed_s"].get<double>();
    auto elapsed = [&] { return elapsed0 + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    // The budget's end: no round is sized past it, no shrink runs past it.
    if (opt_.budget_s > 0)
      deadline_ = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(opt_.budget_s - elapsed0));
    if (!opt_.quiet)
      std::printf("explore: %s, seed %llu, %s%s; state in %s\n", opt_.backends.c_str(),
                  static_cast<unsigned long long>(opt_.seed),
                  opt_.max_cases ? (std::to_string(opt_.max_cases) + " cases").c_str() : "",
                  opt_.budget_s > 0 ? (" budget " + coverage_number(opt_.budget_s) + " s").c_str() : "", dir_.c_str());
    while (g_stop_signal == 0) {
      const std::uint64_t next = state_["next_index"].get<std::uint64_t>();
      if (opt_.max_cases && next >= opt_.max_cases) break;
      if (seconds_left() <= 0) break;  // the budget spent (no budget: never)
      std::uint64_t n = opt_.round > 0 ? static_cast<std::uint64_t>(opt_.round)
                                       : std::clamp<std::uint64_t>(next, 16, 256);
      if (opt_.max_cases) n = std::min(n, opt_.max_cases - next);
      n = std::min(n, cases_that_fit());
      const auto r0 = std::chrono::steady_clock::now();
      round(next, n);
      if (g_stop_signal != 0) break;  // the round was cut short: it runs again on --resume
      state_["next_index"] = next + n;
      const double round_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count() - last_shrink_s_;
      state_["search_s"] = state_["search_s"].get<double>() + round_s;
      add_profile("explore", round_s - last_runs_s_);
      state_["elapsed_s"] = elapsed();
      save(state_path);
      progress();
    }
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    state_["elapsed_s"] = elapsed();
    const bool finished = g_stop_signal == 0;
    state_["done"] = finished;
    save(state_path);
    write_reports();
    if (!finished) {
      std::fprintf(stderr, "explore: stopped by signal %d; --resume continues from case %llu\n", g_stop_signal.load(),
                   static_cast<unsigned long long>(state_["next_index"].get<std::uint64_t>()));
      return 128 + g_stop_signal;
    }
    summary();
    // Findings are new failures (known ones, XFAIL under --expect, are not findings).
    if (!state_["findings"].empty() || !state_["harness_errors"].empty()) return 1;
    return state_["cases"]["ran"].get<long long>() > 0 ? 0 : 4;
  }

 private:
  void load(const fs::path& p) {
    std::ifstream in(p);
    try {
      state_ = Json::parse(in);
    } catch (const std::exception& e) {
      throw InputError("explore: " + p.string() + " is not a search state: " + e.what());
    }
    validate_explore_state(state_, p.string());  // every key, before anything is written or run (state.h)
    if (state_.value("schema", "") != "mlagate-explore/1" || !state_.contains("fingerprint"))
      throw InputError("explore: " + p.string() + " is not a search state of this mlagate");
    if (state_["fingerprint"] != fingerprint_)
      throw InputError("explore: " + p.string() + " is a search with other options (seed, backends, space or flags): "
                       "--resume takes the same ones");
  }

  void save(const fs::path& p) const {
    write_report_file(p.string(), [&](std::ostream& os) { os << state_.dump(1) << "\n"; });
  }

  // Cases [first, first + n): drawn, run op by op, judged.
  // Seconds to the budget's end (infinite without a budget).
  double seconds_left() const {
    if (!deadline_) return INFINITY;
    return std::chrono::duration<double>(*deadline_ - std::chrono::steady_clock::now()).count();
  }

  // How many cases the next round may take so that it ends by the budget's
  // end: at the search's own pace so far (its rounds' time over the cases they
  // drew, shrinking and triage apart), at least one. No budget: no limit.
  // Under a budget with no round yet, a probe learns the pace: one case per
  // 30 s of budget, 1 to 4 (a first round of 16 cases at 1.7 s each overran
  // an 8 s budget threefold); then rounds at most double.
  std::uint64_t cases_that_fit() const {
    const double drawn = static_cast<double>(state_["cases"]["drawn"].get<long long>());
    const double search_s = state_["search_s"].get<double>();
    if (!deadline_) return UINT64_MAX;
    const auto probe = static_cast<std::uint64_t>(std::clamp(opt_.budget_s / 30, 1.0, 4.0));
    if (drawn <= 0 || search_s <= 0) return probe;
    const double fit = seconds_left() / (search_s / drawn);
    // At most as many as drawn so far (rounds double): a pace from a few
    // cases of very different cost says little (a fast probe case let a
    // round of 16 overrun an 8 s budget by 12 s).
    const auto most = std::max<std::uint64_t>(probe, static_cast<std::uint64_t>(drawn));
    return fit < 1 ? 1 : std::min(most, static_cast<std::uint64_t>(fit));
  }

  // Where the search's time goes (--profile; the state's profile_s): each
  // run's own profile phases (its JSON report's), "process" (a run's start
  // before its main and its end after its report: exec, loading, exit) and
  // "explore" (drawing, the suite file, reading the reports, the state), in
  // seconds summed over the rounds; with shrink_s and triage_s beside them
  // they add up to the search's wall.
  void add_profile(const std::string& phase, double s) {
    Json& p = state_["profile_s"];
    p[phase] = p.value(phase, 0.0) + s;
  }
  void add_run_profile(const RunInfo& run, double run_s) {
    double sum_s = 0;
    for (const auto& [phase, ms] : run.profile) {
      add_profile(phase, ms / 1000);
      sum_s += ms / 1000;
    }
    add_profile("process", run_s - sum_s);
  }

  void round(std::uint64_t first, std::uint64_t n) {
    last_shrink_s_ = 0;
    last_runs_s_ = 0;
    std::vector<DrawnCase> drawn;
    for (std::uint64_t i = first; i < first + n; ++i) {
      std::optional<DrawnCase> d = drawer_->draw(i);
      if (!d) {
        state_["cases"]["undrawable"] = state_["cases"]["undrawable"].get<long long>() + 1;
        continue;
      }
      drawn.push_back(std::move(*d));
    }
    state_["cases"]["drawn"] = state_["cases"]["drawn"].get<long long>() + static_cast<long long>(n);
    if (drawn.empty()) return;
    // One run for the round: each case carries the op it was drawn for
    // (CaseSpec::ops; a case drawn twice, for two ops, carries both), so the
    // run's processes, their memory and their workers serve every op. A round
    // ran one process per op before: 14 starts where 2 do now on the CPU's
    // default space, each with the block pool cold (PERFORMANCE.md).
    std::vector<CaseSpec> specs;
    std::map<std::pair<std::string, Op>, const DrawnCase*> by_job;
    std::map<std::string, std::size_t> spec_at;
    std::set<Op> ops;
    for (const DrawnCase& d : drawn) {
      ops.insert(d.op);
      by_job.emplace(std::pair{d.spec.id(), d.op}, &d);
      const auto [it, fresh] = spec_at.emplace(d.spec.id(), specs.size());
      if (fresh) {
        specs.push_back(d.spec);
        specs.back().ops = {d.op};
      } else if (!specs[it->second].takes(d.op)) {
        specs[it->second].ops.push_back(d.op);
      }
    }
    const std::string yaml = (dir_ / "rounds" / "round.yaml").string();
    {
      std::ofstream f(yaml);
      f << cases_as_suite_yaml(specs, "explore");
    }
    const std::string op_list = op_names(std::vector<Op>(ops.begin(), ops.end()));
    std::set<std::string> ran_cases;
    const std::string json = (dir_ / "rounds" / "round.json").string();
    const std::string log = (dir_ / "rounds" / "round.log").string();
    const auto spawned = std::chrono::steady_clock::now();
    fs::remove(json);
    std::vector<std::string> argv = {worker_executable(), "run", "--suite", yaml, "--backend", opt_.backends, "--op", op_list};
    argv.insert(argv.end(), opt_.run_flags.begin(), opt_.run_flags.end());
    if (!opt_.default_workers.empty()) argv.insert(argv.end(), {"--workers", opt_.default_workers});
    for (const char* s : {"--no-progress", "-q", "--allow-nothing-ran", "--json"}) argv.push_back(s);
    argv.push_back(json);
    const int rc = spawn_and_wait(argv, log);
    const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - spawned).count();
    last_runs_s_ += run_s;
    if (g_stop_signal != 0) return;
    JsonReport report;
    try {
      report = read_json_report(json);
    } catch (const std::exception& e) {
      // The run itself failed (an input error on a drawn case is explore's
      // bug): kept as a harness error with its output, the search goes on.
      Json err = {{"round_first_case", first}, {"op", op_list}, {"exit_code", rc}, {"output", tail_of(log)}};
      state_["harness_errors"].push_back(err);
      add_profile("process", run_s);  // a run that gave no report: all of it is the process
      if (!opt_.quiet) std::fprintf(stderr, "explore: the run of round %llu (%s) failed (exit %d): see %s\n",
                                    static_cast<unsigned long long>(first), op_list.c_str(), rc, log.c_str());
      return;
    }
    add_run_profile(report.run, run_s);
    // The records op by op, each op's in the run's order: the order a run per
    // op gave them in, so findings are named and counted as they were.
    std::vector<const Record*> records;
    for (const Record& r : report.records) records.push_back(&r);
    std::stable_sort(records.begin(), records.end(), [](const Record* a, const Record* b) {
      return static_cast<int>(parse_op(a->op)) < static_cast<int>(parse_op(b->op));
    });
    std::map<std::string, double> case_ms;
    for (const Record* rp : records) {
      const Record& r = *rp;
      Json& counts = state_["records"];
      const std::string st(status_name(r.status));
      counts[st] = counts.value(st, 0) + 1;
      state_["record_ms"] = state_["record_ms"].get<double>() + r.timings.total_ms;
      case_ms[r.case_id] += r.timings.total_ms;
      const Op op = parse_op(r.op);
      const auto it = by_job.find({r.case_id, op});
      if (it == by_job.end()) continue;
      if (ran(r.status)) {
        if (ran_cases.insert(r.case_id).second) cover(state_["coverage"], it->second->spec, op, r.block_size);
      }
      if (r.expected.outcome == Expected::kXfail) known(r, *it->second);
      else if (r.expected.outcome == Expected::kXpass) {
        // A drawn case an entry selects that passed: counted, never a failure
        // of the search (the entry's trigger is narrower than its selector).
        Json& x = state_["xpass"][r.expected.entry];
        if (!x.is_object()) x = Json::object();  // the entry's first XPASS (value() throws on null)
        x["count"] = x.value("count", 0LL) + 1;
      } else if (status_is_failure(r.status)) failure(r, *it->second);
    }
    for (const auto& [id, ms] : case_ms)
      if (ms > state_["slowest"]["ms"].get<double>()) state_["slowest"] = {{"ms", ms}, {"case", id}};
    state_["cases"]["ran"] = state_["cases"]["ran"].get<long long>() + static_cast<long long>(ran_cases.size());
  }

  // A failure an --expect entry names: counted under its entry, never shrunk or triaged again.
  void known(const Record& r, const DrawnCase& d) {
    Json& k = state_["known"][r.expected.entry];
    if (!k.is_object()) k = {{"count", 0}, {"reason", r.expected.reason}, {"link", r.expected.link},
                             {"backends", Json::array()}, {"signatures", Json::array()}};
    k["count"] = k["count"].get<long long>() + 1;
    auto add_unique = [](Json& arr, const std::string& v, std::size_t cap) {
      for (const Json& x : arr)
        if (x == v) return;
      if (arr.size() < cap) arr.push_back(v);
    };
    add_unique(k["backends"], r.backend, 64);
    add_unique(k["signatures"], failure_signature(r, d.spec), 32);
  }

  void failure(const Record& r, const DrawnCase& d) {
    // A failure kind is per backend: two kernels failing alike are two bugs.
    const std::string sig = failure_signature(r, d.spec);
    const std::string key = r.backend + " | " + sig;
    Json& findings = state_["findings"];
    if (known_.count(key)) {
      for (Json& f : findings)
        if (f["signature"] == sig && f["backend"] == r.backend) {
          f["count"] = f["count"].get<long long>() + 1;
          if (f["examples"].size() < 5) f["examples"].push_back(r.case_id + " " + r.backend);
          for (Json& c : state_["causes"])
            if (f.contains("cause") && c["name"] == f["cause"]) c["count"] = c["count"].get<long long>() + 1;
        }
      return;
    }
    known_.insert(key);
    const std::string name = "f" + std::to_string(findings.size() + 1);
    const fs::path fdir = dir_ / "findings" / name;
    fs::create_directories(fdir);
    {
      std::ofstream f(fdir / "case.yaml");
      f << cases_as_suite_yaml({d.spec}, "explore");
    }
    Json f = {{"name", name},
              {"signature", sig},
              {"status", status_name(r.status)},
              {"backend", r.backend},
              {"op", r.op},
              {"count", 1},
              {"case", r.case_id},
              {"case_file", (fdir / "case.yaml").string()},
              {"shape", case_shape(d.spec)},
              {"message", r.message},
              {"examples", Json::array({r.case_id + " " + r.backend})}};
    if (!opt_.quiet) {
      std::printf("  new failure %s: %s\n    %s on %s\n    %s\n", name.c_str(), sig.c_str(), r.backend.c_str(),
                  r.case_id.c_str(), r.message.c_str());
      std::fflush(stdout);
    }
    // Shrink the first case of each signature, while the budget lasts.
    // Asked now, not at the round's start: an earlier failure's shrink may have spent it.
    const bool time_left = opt_.budget_s <= 0 || seconds_left() > 0.1 * opt_.budget_s;
    if (opt_.shrink && time_left && r.mode.empty()) {
      const auto s0 = std::chrono::steady_clock::now();
      ShrinkOptions so;
      so.target = d.spec;
      so.backend = r.backend;
      so.op = parse_op(r.op);
      so.run_args = opt_.shrink_flags;
      so.out_dir = (fdir / "shrunk").string();
      so.max_runs = opt_.shrink_runs;
      so.deadline = deadline_;
      so.log = nullptr;
      try {
        const ShrinkResult res = shrink_case(so);
        f["shrunk"] = {{"case", res.to.id()},      {"shape", case_shape(res.to)}, {"status", res.status},
                       {"message", res.message},   {"same", res.same},            {"runs", res.runs},
                       {"suite_file", res.yaml},   {"bundle", res.bundle},        {"repro", res.repro},
                       {"replay", res.replay}};
        if (!res.stopped_by.empty()) f["shrunk"]["stopped_by"] = res.stopped_by;
        if (!opt_.quiet)
          std::printf("    shrunk in %d runs to %s\n    repro: %s\n", res.runs, case_shape(res.to).c_str(), res.repro.c_str());
      } catch (const std::exception& e) {
        f["shrunk"] = {{"error", e.what()}};
        if (!opt_.quiet) std::printf("    not shrunk: %s\n", e.what());
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
      last_shrink_s_ += s;
      state_["shrink_s"] = state_["shrink_s"].get<double>() + s;
    } else {
      f["shrunk"] = {{"error", !opt_.shrink ? "--no-shrink" : !r.mode.empty() ? "serving modes are shrunk with mlagate shrink"
                                                                              : "the budget was nearly spent"}};
    }
    std::fflush(stdout);
    {
      // What `mlagate triage --finding DIR` needs.
      const Json fj = {{"backend", r.backend}, {"op", r.op}, {"case_file", (fdir / "case.yaml").string()},
                       {"case", r.case_id}, {"signature", sig}, {"flags", opt_.shrink_flags}};
      write_report_file((fdir / "finding.json").string(), [&](std::ostream& os) { os << fj.dump(1) << "\n"; });
    }
    if (r.mode.empty()) assign_cause(f, r, d, fdir, time_left);
    else f["cause"] = new_cause(f, r, "not triaged", "serving modes are triaged with mlagate triage", Json::object(), d.spec);
    std::fflush(stdout);
    findings.push_back(std::move(f));
  }

  // The cause-grouping key of a record: backend, status, which outputs fail, mode and scale class.
  static std::string cause_key(const Record& r) {
    return r.backend + "|" + std::string(status_name(r.status)) + "|" + failing_outputs_kind(r) + "|" + r.mode + "|" +
           scale_class(r.facts);
  }

  TriageOptions triage_options(const Record& r, const fs::path& out) const {
    TriageOptions to;
    to.backend = r.backend;
    to.op = parse_op(r.op);
    for (const auto& b : backends_)
      if (b->name() == r.backend) to.caps = b->capabilities();
    to.run_args = opt_.shrink_flags;
    to.out_dir = out.string();
    to.environment = opt_.environment;
    to.log = nullptr;
    return to;
  }

  std::string new_cause(Json& f, const Record& r, const std::string& cls, const std::string& why, const Json& triage,
                        const CaseSpec& rep) {
    Json& causes = state_["causes"];
    const std::string name = "c" + std::to_string(causes.size() + 1);
    const fs::path file = dir_ / "findings" / f["name"].get<std::string>() / "cause_case.yaml";
    {
      CaseSpec c = rep;
      c.suite = "explore";
      std::ofstream(file) << cases_as_suite_yaml({c}, "explore");
    }
    causes.push_back({{"name", name},
                      {"class", cls},
                      {"explanation", why},
                      {"status", status_name(r.status)},
                      {"outputs", failing_outputs_kind(r)},
                      {"backends", Json::array({r.backend})},
                      {"findings", Json::array({f["name"]})},
                      {"signatures", Json::array({f["signature"]})},
                      {"keys", Json::array({cause_key(r)})},
                      {"count", 1},
                      {"triage", triage},
                      {"representative", {{"backend", r.backend}, {"op", r.op}, {"case_file", file.string()}}}});
    if (!opt_.quiet) {
      std::printf("    cause %s: %s%s\n", name.c_str(), cls.c_str(), why.empty() ? "" : (": " + why).c_str());
      std::fflush(stdout);
    }
    return name;
  }

  void attach(Json& cause, Json& f, const Record& r, const std::string& how) {
    cause["findings"].push_back(f["name"]);
    cause["signatures"].push_back(f["signature"]);
    cause["count"] = cause["count"].get<long long>() + 1;
    bool has_backend = false, has_key = false;
    for (const Json& b : cause["backends"]) has_backend = has_backend || b == r.backend;
    for (const Json& k : cause["keys"]) has_key = has_key || k == cause_key(r);
    if (!has_backend) cause["backends"].push_back(r.backend);
    if (!has_key) cause["keys"].push_back(cause_key(r));
    f["cause"] = cause["name"];
    f["cause_by"] = how;
    if (!opt_.quiet) {
      std::printf("    same cause as %s (%s): %s\n", cause["name"].get<std::string>().c_str(),
                  cause["class"].get<std::string>().c_str(), how.c_str());
      std::fflush(stdout);
    }
  }

  // One finding per cause: a new signature joins a cause that has a finding
  // of the same backend, status, failing outputs, mode and scale class when
  // its own decisive variants confirm that cause's class; else it is
  // triaged, and joins a cause of the same class and status on another
  // backend when each one's case fails the other's backend the same way (an
  // adapter and its cudagraph variant, FA2 and FA3 with a common cause);
  // else it is a new cause.
  void assign_cause(Json& f, const Record& r, const DrawnCase& d, const fs::path& fdir, bool time_left) {
    const auto t0 = std::chrono::steady_clock::now();
    struct Timer {
      std::chrono::steady_clock::time_point t0;
      Json& s;
      double& last;
      ~Timer() {
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        s["triage_s"] = s["triage_s"].get<double>() + dt;
        last += dt;
      }
    } timer{t0, state_, last_shrink_s_};
    Json& causes = state_["causes"];
    const std::string key = cause_key(r);
    const std::string status(status_name(r.status));
    for (Json& c : causes) {
      bool same_key = false;
      for (const Json& k : c["keys"]) same_key = same_key || k == key;
      if (!same_key) continue;
      const std::string cls = c["class"].get<std::string>();
      if (!opt_.triage || cls == kClassUnexplained || cls == "not triaged") {
        attach(c, f, r, "the same backend, status and failing outputs");
        return;
      }
      TriageOptions to = triage_options(r, fdir / "confirm");
      to.spec = d.spec;
      to.bundle = false;
      try {
        if (confirm_class(to, r, cls) == cls) {
          attach(c, f, r, "its own variants confirm " + cls);
          return;
        }
      } catch (const std::exception&) {
      }
    }
    if (!opt_.triage || !time_left) {
      f["cause"] = new_cause(f, r, "not triaged", !opt_.triage ? "--no-triage" : "the budget was nearly spent", Json::object(), d.spec);
      return;
    }
    // The case to triage: the shrunk one where it failed the same way.
    CaseSpec tcase = d.spec;
    if (f.contains("shrunk") && f["shrunk"].value("same", false) && f["shrunk"].contains("suite_file")) {
      try {
        const Suite s = load_suite(f["shrunk"]["suite_file"].get<std::string>());
        if (!s.cases.empty()) tcase = s.cases.back();
      } catch (const std::exception&) {
      }
    }
    TriageOptions to = triage_options(r, fdir / "triage");
    to.spec = tcase;
    TriageResult t;
    try {
      t = triage(to);
    } catch (const std::exception& e) {
      f["cause"] = new_cause(f, r, "not triaged", std::string("triage failed: ") + e.what(), Json::object(), tcase);
      return;
    }
    Json tj = {{"dir", t.dir}, {"report", t.report_md}, {"repro_py", t.repro_py}, {"bundle", t.bundle}, {"variants", Json::array()}};
    for (const TriageVariant& v : t.variants) tj["variants"].push_back({{"name", v.name}, {"status", v.status}, {"verdict", v.verdict}});
    f["triage"] = {{"class", t.cls}, {"report", t.report_md}};
    const bool explained = t.cls != kClassUnexplained && t.cls != kClassNotReproduced && t.cls != "not triaged";
    for (Json& c : causes) {
      // Unexplained ones are compared too where the same outputs fail: the
      // cross runs are the evidence then (an adapter and its variant share a
      // kernel whatever its bug is).
      const bool comparable =
          explained || (t.cls == kClassUnexplained && c.value("outputs", "") == failing_outputs_kind(r));
      if (!comparable || c["class"] != t.cls || c["status"] != status) continue;
      bool same_backend = false;
      for (const Json& b : c["backends"]) same_backend = same_backend || b == r.backend;
      if (same_backend) {
        // The same backend, status and class (and failing outputs): nothing tells them apart.
        attach(c, f, r, "the same backend, status and class (" + t.cls + ")");
        return;
      }
      // Each one's case on the other's backend, the same way.
      try {
        const Json& rep = c["representative"];
        const Suite rs = load_suite(rep["case_file"].get<std::string>());
        TriageOptions here = triage_options(r, fdir / "cross");
        here.op = parse_op(rep["op"].get<std::string>());
        here.bundle = false;
        Record theirs_here = rerun(here, rs.cases.back());
        Record other;
        other.backend = rep["backend"].get<std::string>();
        other.op = r.op;
        TriageOptions there = triage_options(other, fdir / "cross");
        Record ours_there = rerun(there, tcase);
        if (c["status"] == std::string(status_name(theirs_here.status)) && std::string(status_name(ours_there.status)) == status) {
          attach(c, f, r, "each one's case fails the other's backend " + status);
          return;
        }
      } catch (const std::exception&) {
      }
    }
    f["cause"] = new_cause(f, r, t.cls, t.explanation, tj, tcase);
  }

  void progress() const {
    if (opt_.quiet) return;
    long long records = 0;
    for (const auto& [k, v] : state_["records"].items()) records += v.get<long long>();
    std::printf("  %llu cases drawn, %lld ran, %lld records, %zu signatures, %.1f s\n",
                static_cast<unsigned long long>(state_["next_index"].get<std::uint64_t>()),
                state_["cases"]["ran"].get<long long>(), records, state_["findings"].size(), state_["elapsed_s"].get<double>());
    std::fflush(stdout);
  }

  void write_reports() {
    const Json report = explore_report(state_);
    write_report_file((dir_ / "report.json").string(), [&](std::ostream& os) { os << report.dump(1) << "\n"; });
    if (!opt_.json.empty()) write_report_file(opt_.json, [&](std::ostream& os) { os << report.dump(1) << "\n"; });
    const std::string html = opt_.html.empty() ? (dir_ / "report.html").string() : opt_.html;
    write_report_file(html, [&](std::ostream& os) { write_explore_html(os, report); });
  }

  void summary() const {
    if (opt_.quiet && state_["findings"].empty()) return;
    const Json report = explore_report(state_);
    std::printf("%s", explore_summary_text(report).c_str());
    if (opt_.profile) std::printf("%s", explore_profile_text(report).c_str());
  }

  const ExploreOptions& opt_;
  fs::path dir_;
  Json state_, fingerprint_;
  std::set<std::string> known_;
  std::vector<std::unique_ptr<Backend>> backends_;
  std::unique_ptr<CaseDrawer> drawer_;
  double last_shrink_s_ = 0;
  double last_runs_s_ = 0;  // the round's mlagate runs, start to end
  std::optional<std::chrono::steady_clock::time_point> deadline_;  // --budget's end
};

}  // namespace

int explore_main(const ExploreOptions& opt) {
  if (opt.max_cases == 0 && opt.budget_s <= 0) throw InputError("explore: give --cases N or --budget (e.g. 10m)");
  if (opt.round < 0) throw InputError("explore: --round must be >= 1 (or 0: auto)");
  if (worker_executable().empty()) throw InputError("explore runs the mlagate binary: unavailable in this process");
  g_stop_signal = 0;
  Search s(opt);
  return s.main();
}

}  // namespace mlagate
