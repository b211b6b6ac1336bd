// Where a run's wall time goes (`mlagate run --profile`, and the "profile"
// object of the JSON report): one accumulator per phase, filled by the code
// that does the work, so that the rows of the table sum to the wall and what
// no phase names shows as an explicit "unaccounted" row.
//
// Per-record phases (generate, golden, baseline, cache, glue, run, compare)
// come from the records' Timings, added once per job actually run (order
// checks included, journaled records not). Per-process phases (setup, worker
// start, the worker's own initialisation, parent-worker traffic, journal,
// reports) are added by the parent where they happen.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "reports/record.h"

namespace mlagate {

// A backend call's interval on the steady clock (CLOCK_MONOTONIC, one clock for
// every process of the machine), in nanoseconds since its epoch.
using CallSpan = std::pair<std::int64_t, std::int64_t>;

// Ends a backend call begun at t0: notes its interval (this process's list,
// drained by take_backend_calls) and returns its milliseconds. Every place
// that times a backend's call for Timings::run_ms calls this, so that a run
// whose workers run side by side can tell the wall during which some backend
// call was in flight from the harness's own (RunProfile::backend_in_flight_ms).
double backend_call_done(std::chrono::steady_clock::time_point t0);
// The intervals noted since the last call, oldest first (thread-safe).
std::vector<CallSpan> take_backend_calls();

// When this process started running its code (static initialisation): the
// worker's initialisation is measured from here to its READY line.
std::chrono::steady_clock::time_point process_start_time();

struct RunProfile {
  // Parent-side phases, milliseconds.
  double setup_ms = 0;          // flags, case selection, backend construction, journal open
  double worker_spawn_ms = 0;   // posix_spawn to READY, less the worker's own initialisation
  double worker_init_ms = 0;    // inside the worker: process start to READY (flags, cases, backends)
  int workers_started = 0;
  double ipc_ms = 0;            // a job's wall in the parent less its record's total: protocol, (de)serialisation, polling
  double lost_job_ms = 0;       // jobs whose worker crashed or timed out (no record timings)
  double record_ms = 0;         // journal append, console lines and progress per record
  double post_ms = 0;           // --sanitize reruns, --save-failures bundles, results file
  double reports_ms = 0;        // JSON, JUnit and Markdown reports, journal removal
  double worker_exit_ms = 0;    // waiting for the last workers' ends, after the reports (reap_retired_workers)
  // Sums of the records' Timings over every job run.
  Timings jobs;
  long long jobs_run = 0;
  // Workers side by side (--workers, --devices): how many ran at once at most,
  // and the worker time (spawn, init, jobs, ipc, lost jobs, per-record work)
  // that ran beside other workers': the job rows sum every worker's time, and
  // the "side_by_side" row takes this off so that the rows still sum to the wall.
  int streams = 1;
  double side_by_side_ms = 0;
  // Cases made ahead (CaseAhead: a worker makes its next group's case while
  // the current one's jobs run): the part of that work which ran beside the
  // worker's jobs. The records' phases hold it, the workers' wall does not:
  // the "ahead" row takes it off, so that the rows still sum to the wall.
  double ahead_ms = 0;
  // Cases workers began to make ahead, and those their jobs then used (the
  // rest were made for nothing: a worker that ended first, a job that went
  // elsewhere).
  long long cases_ahead_begun = 0, cases_ahead_used = 0;
  // Every backend call's interval, from every process of the run.
  std::vector<CallSpan> calls;
  // The wall covered by at least one backend call (the union of `calls`): the
  // rest of the wall is the harness's own, whatever the number of workers.
  double backend_in_flight_ms() const;
  // The per-worker rows' sum (what side_by_side_ms is measured against).
  double worker_domain_ms() const;

  // Adds a record's phases; `parent_wall_ms` < 0 when the job ran in this process.
  void add_job(const Timings& t, double parent_wall_ms = -1);

  // (phase, milliseconds) rows in run order, an "unaccounted" row making them sum to `wall_ms`.
  std::vector<std::pair<std::string, double>> rows(double wall_ms) const;
};

// The run's profile (one run per process).
RunProfile& run_profile();

// The --profile table: one row per phase with ms and % of the wall, and the total.
std::string profile_table(const RunProfile& p, double wall_ms);

// Adds every phase of `t` to `into` (total_ms included).
void accumulate(Timings& into, const Timings& t);

// The named phases of one record summed (Timings::total_ms excluded).
double named_phases_ms(const Timings& t);

}  // namespace mlagate
