// Report writers: a run's Records rendered as JSON (the full record), JUnit XML
// (for CI test views), Markdown (a CI job summary), HTML (a page with error maps) and a console table.
// Every writer is deterministic: the only times in the output come from RunInfo and Timings.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "reports/record.h"

namespace mlagate {

struct RunInfo {
  std::string tool_version, git_commit;  // from the generated config header
  std::string command_line;              // the mlagate invocation
  std::string suite, policy;             // suite name(s), policy description
  std::string started_at;                // ISO 8601 UTC
  double wall_seconds = 0;
  int generator_version = 0;
  // Set when SIGINT/SIGTERM stopped the run: the records are what finished.
  std::string interrupted;               // e.g. "SIGINT: 9 of 30 records"; empty for a whole run
  // --shard I/N: which part of the selection this run is ("I/N", 0-based);
  // empty for a whole run. `mlagate merge` checks that every shard is there once.
  std::string shard;
  // Where the wall went up to the reports (reports/profile.h): (phase, ms) rows
  // summing to profile_wall_ms, from this process's start. Empty: no "profile" key.
  std::vector<std::pair<std::string, double>> profile;
  double profile_wall_ms = 0;
  // The wall with at least one backend call in flight (the rest is the
  // harness's own), and the most workers that ran side by side.
  double profile_backend_in_flight_ms = 0;
  int profile_streams = 1;
  long long profile_cases_ahead_begun = 0, profile_cases_ahead_used = 0;  // RunProfile's
  // --require batch-invariance: BATCH_VARIANT records fail the run in every
  // report's counts and verdict (JSON "run.require", read back by merge).
  bool require_batch_invariance = false;
};

// Records by status. With --expect, the records an entry made XFAIL or XPASS
// are counted there and not under their status, so the columns partition the
// records (a run's NONFINITE column holds the unexpected ones only).
struct StatusCounts {
  std::array<std::int64_t, kAllStatuses.size()> by_status{};  // indexed by the Status value
  std::int64_t xfail = 0, xpass = 0;
  std::int64_t xpass_strict = 0;  // of xpass: those whose entry is strict (counted in failures)
  std::int64_t total = 0;
  std::int64_t failures = 0;  // records that fail the run (record_fails_run)

  std::int64_t operator[](Status s) const { return by_status[static_cast<std::size_t>(s)]; }
  void add(const Record& r, bool require_batch_invariance = false);
  void add(const StatusCounts& other);
};

// Counts and the sum of every timing phase for one backend, in milliseconds.
struct BackendSummary {
  std::string backend;
  StatusCounts counts;
  double total_ms = 0;
};

StatusCounts count_statuses(std::span<const Record> records);
// The same with `failures` counting what fails this run (status_fails_run).
StatusCounts count_statuses(std::span<const Record> records, const RunInfo& run);

// One entry per backend, in the order backends first appear in `records`
// (the runner's order, which follows the registry).
std::vector<BackendSummary> summarize_by_backend(std::span<const Record> records);

// "FAIL" when any record failed, "PASS" when none failed and at least one ran
// (passed, batch-variant, or failed as expected), "NOTHING RAN" when every record was
// skipped or unsupported: never report "not run" as a pass.
std::string_view overall_verdict(const StatusCounts& counts);
// ", 5 expected (XFAIL), 1 unexpectedly passed (XPASS, 1 strict)" for a verdict
// line, empty when no record has an --expect outcome.
std::string expected_counts_text(const StatusCounts& counts);

// {"schema": "mlagate.report", "schema_version": 1, "run", "summary", "records"}: every field
// of every Record. Pretty-printed with 2-space indentation; invalid UTF-8 becomes U+FFFD.
void write_json(std::ostream& os, const RunInfo& run, std::span<const Record> records);

// A JSON report read back (mlagate merge): every key write_json writes, checked.
struct JsonReport {
  RunInfo run;
  std::vector<Record> records;
};
// Throws InputError naming the file and the key for a file that is not a JSON
// report of this schema or holds a value of the wrong type.
JsonReport read_json_report(const std::string& path);

// <testsuites> with one <testsuite> per backend and one <testcase> per record:
// INCORRECT/NONFINITE -> <failure>, CRASHED/TIMEOUT/INVALID_CASE -> <error>,
// NOT_SUPPORTED/SKIPPED -> <skipped>. Testcase time is the run phase only.
void write_junit(std::ostream& os, const RunInfo& run, std::span<const Record> records);

// A GitHub-flavoured Markdown job summary: verdict, run info, backend x status counts, and at
// most kMarkdownMaxFailureRows failures. Stays well under 1 MiB for any number of records.
inline constexpr std::size_t kMarkdownMaxFailureRows = 200;
void write_markdown(std::ostream& os, const RunInfo& run, std::span<const Record> records);

// One self-contained HTML page (inline CSS and JS; it loads nothing): the verdict, run info,
// backend x status counts, every record (failures first, filterable) with its repro command,
// and per record its metrics, error maps (Metrics::err_token_head by token x head and by
// request x position, drawn by the inline script) and worst elements.
void write_html(std::ostream& os, const RunInfo& info, const std::vector<Record>& records);

// Console table, one row per backend plus a TOTAL row; "time" sums every phase.
std::string summary_table(std::span<const Record> records);

// Writes `path` atomically: `writer` fills a temporary file in the same directory, which is
// flushed to disk and renamed over `path`, so readers see the old file or the whole new one.
// Throws std::runtime_error (with the path and errno text) on failure, leaving no temp file;
// an exception from `writer` propagates after the temp file is removed.
void write_report_file(const std::string& path,
                       const std::function<void(std::ostream&)>& writer);

}  // namespace mlagate
