// The run profile's accumulators and its table (profile.h).
#include "reports/profile.h"

#include <algorithm>
#include <cstdio>
#include <mutex>

namespace mlagate {

namespace {
// Initialised with the other statics, before main: the closest this process's
// own code gets to its start (after the dynamic loader).
const std::chrono::steady_clock::time_point g_process_start = std::chrono::steady_clock::now();
}  // namespace

std::chrono::steady_clock::time_point process_start_time() { return g_process_start; }

namespace {
std::mutex g_calls_mutex;
std::vector<CallSpan>& noted_calls() {
  static std::vector<CallSpan> v;
  return v;
}
std::int64_t ns_of(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
}  // namespace

double backend_call_done(std::chrono::steady_clock::time_point t0) {
  const auto t1 = std::chrono::steady_clock::now();
  {
    const std::lock_guard lock(g_calls_mutex);
    noted_calls().emplace_back(ns_of(t0), ns_of(t1));
  }
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

std::vector<CallSpan> take_backend_calls() {
  const std::lock_guard lock(g_calls_mutex);
  std::vector<CallSpan> out;
  out.swap(noted_calls());
  return out;
}

double RunProfile::backend_in_flight_ms() const {
  std::vector<CallSpan> s = calls;
  std::sort(s.begin(), s.end());
  std::int64_t covered = 0, lo = 0, hi = 0;
  bool open = false;
  for (const auto& [a, b] : s) {
    if (b <= a) continue;
    if (open && a <= hi) {
      hi = std::max(hi, b);
      continue;
    }
    if (open) covered += hi - lo;
    lo = a, hi = b, open = true;
  }
  if (open) covered += hi - lo;
  return static_cast<double>(covered) / 1e6;
}

double RunProfile::worker_domain_ms() const {
  return worker_spawn_ms + worker_init_ms + jobs.total_ms - ahead_ms + ipc_ms + lost_job_ms + record_ms;
}

double named_phases_ms(const Timings& t) {
  return t.generate_ms + t.reference_ms + t.baseline_ms + t.cache_ms + t.glue_ms + t.run_ms + t.compare_ms;
}

void accumulate(Timings& into, const Timings& t) {
  into.generate_ms += t.generate_ms;
  into.reference_ms += t.reference_ms;
  into.baseline_ms += t.baseline_ms;
  into.cache_ms += t.cache_ms;
  into.glue_ms += t.glue_ms;
  into.run_ms += t.run_ms;
  into.compare_ms += t.compare_ms;
  into.total_ms += t.total_ms;
}

void RunProfile::add_job(const Timings& t, double parent_wall_ms) {
  accumulate(jobs, t);
  ++jobs_run;
  if (parent_wall_ms >= 0) ipc_ms += std::max(0.0, parent_wall_ms - t.total_ms);
}

std::vector<std::pair<std::string, double>> RunProfile::rows(double wall_ms) const {
  std::vector<std::pair<std::string, double>> r = {
      {"setup", setup_ms},
      {"worker_spawn", worker_spawn_ms},
      {"worker_init", worker_init_ms},
      {"generate", jobs.generate_ms},
      {"reference", jobs.reference_ms},
      {"baseline", jobs.baseline_ms},
      {"cache", jobs.cache_ms},
      {"glue", jobs.glue_ms},
      {"run", jobs.run_ms},
      {"compare", jobs.compare_ms},
      // total_ms less the named phases: rounding only, or work a phase misses.
      {"job_other", jobs.total_ms - named_phases_ms(jobs)},
      {"ipc", ipc_ms},
      {"lost_jobs", lost_job_ms},
      {"per_record", record_ms},
      {"post", post_ms},
      {"reports", reports_ms},
      {"worker_exit", worker_exit_ms},
  };
  if (ahead_ms != 0) r.emplace_back("ahead", -ahead_ms);
  if (side_by_side_ms != 0) r.emplace_back("side_by_side", -side_by_side_ms);
  double named = 0;
  for (const auto& [name, ms] : r) named += ms;
  r.emplace_back("unaccounted", wall_ms - named);
  return r;
}

namespace {
// What each row holds, for the table.
const char* describe(const std::string& key) {
  static const std::pair<const char*, const char*> kWhat[] = {
      {"setup", "flags, cases, backends, journal"},
      {"worker_spawn", "exec and loading of workers"},
      {"worker_init", "workers' flags, cases, backends"},
      {"generate", "case inputs"},
      {"reference", "fp64 references"},
      {"baseline", "err_baseline emulation"},
      {"cache", "paged caches"},
      {"glue", "harness around backend calls"},
      {"run", "backend calls"},
      {"compare", "metrics and verdicts"},
      {"job_other", "jobs, in no phase"},
      {"ipc", "parent <-> worker"},
      {"lost_jobs", "crashed or timed-out jobs"},
      {"per_record", "journal, console"},
      {"post", "sanitize, save-failures, results file"},
      {"reports", "JSON, JUnit, Markdown"},
      {"worker_exit", "last workers' ends, after the reports"},
      {"ahead", "less case work made ahead, beside jobs"},
      {"side_by_side", "less worker time beside other workers'"},
      {"unaccounted", "wall less every row above"},
  };
  for (const auto& [k, what] : kWhat)
    if (key == k) return what;
  return "";
}
}  // namespace

RunProfile& run_profile() {
  static RunProfile p;
  return p;
}

std::string profile_table(const RunProfile& p, double wall_ms) {
  std::string out;
  char line[160];
  std::snprintf(line, sizeof line, "%-13s %-38s %10s %7s\n", "phase", "", "seconds", "% wall");
  out += line;
  double sum = 0;
  for (const auto& [name, ms] : p.rows(wall_ms)) {
    sum += ms;
    std::snprintf(line, sizeof line, "%-13s %-38s %10.3f %6.1f%%\n", name.c_str(), describe(name), ms / 1e3,
                  wall_ms > 0 ? 100.0 * ms / wall_ms : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-13s %-38s %10.3f %6.1f%%   (%lld jobs, %d workers started)\n", "wall", "",
                sum / 1e3,
                wall_ms > 0 ? 100.0 * sum / wall_ms : 0.0, p.jobs_run, p.workers_started);
  out += line;
  if (p.streams > 1) {
    std::snprintf(line, sizeof line, "(up to %d workers side by side: the rows above side_by_side sum their time)\n",
                  p.streams);
    out += line;
  }
  if (p.cases_ahead_begun > 0) {
    std::snprintf(line, sizeof line, "(cases made ahead by the workers: %lld used of %lld begun)\n", p.cases_ahead_used,
                  p.cases_ahead_begun);
    out += line;
  }
  if (!p.calls.empty() && wall_ms > 0) {
    // The figure that says whether the kernels or the harness bound the wall.
    const double in_flight = p.backend_in_flight_ms();
    std::snprintf(line, sizeof line,
                  "backend calls in flight %8.3f s %5.1f%% of the wall; the harness alone %8.3f s %5.1f%%\n",
                  in_flight / 1e3, 100.0 * in_flight / wall_ms, (wall_ms - in_flight) / 1e3,
                  100.0 * (wall_ms - in_flight) / wall_ms);
    out += line;
  }
  return out;
}

}  // namespace mlagate
