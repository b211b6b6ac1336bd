// One result: a case x backend x op, its status, metrics per output, the
// smallest tolerance that would have passed, timings and a repro command.
// Reports (JSON, JUnit, Markdown) are written from these alone.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace mlagate {

// SPEC: Pass rules. Never report "not run" as a pass.
enum class Status : std::uint8_t {
  kPassed,
  kIncorrect,     // wrong shape/dtype, guard band touched, or error beyond tolerance
  kNonfinite,     // NaN/Inf where the reference has none (or the reverse)
  kCrashed,       // the backend threw, aborted or faulted
  kTimeout,
  kNotSupported,  // with the backend's reason
  kSkipped,       // e.g. no GPU
  kInvalidCase,
  kNondeterministic,  // --repeat: the same case gave different bits (count and first position in the message)
};
// Every Status in enum order, so that counts can be indexed by the enum value;
// the static_assert catches a status appended to the enum and not here.
inline constexpr std::array kAllStatuses = {
    Status::kPassed,  Status::kIncorrect,    Status::kNonfinite, Status::kCrashed,
    Status::kTimeout, Status::kNotSupported, Status::kSkipped,   Status::kInvalidCase,
    Status::kNondeterministic,
};
static_assert(static_cast<std::size_t>(Status::kNondeterministic) + 1 == kAllStatuses.size());
std::string_view status_name(Status s);  // "PASSED", "INCORRECT", ...
bool status_is_failure(Status s);        // INCORRECT, NONFINITE, CRASHED, TIMEOUT, INVALID_CASE, NONDETERMINISTIC

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Where an element sits, for messages: request, token within request, head, dim.
struct Location {
  std::int64_t flat = -1;
  int request = -1, token = -1, head = -1, dim = -1;
  std::string str() const;  // "request 2, token 3, head 17, dim 100"
};

// Metrics of one output against the fp64 golden (SPEC: Pass rules, rule 4).
struct Metrics {
  std::string output;           // "out", "lse", "o_lat"
  std::int64_t numel = 0;
  double max_abs = kNaN;
  double max_rel = kNaN;        // |x-y| / max(|y|, rel_floor)
  double rel_floor = 0;
  double mean_abs = kNaN;
  double nmse = kNaN;           // sum (x-y)^2 / sum y^2
  double cos_diff = kNaN;       // 1 - 2 sum xy / sum (x^2 + y^2)
  double max_ulp = kNaN;        // in the output dtype
  double ref_norm = kNaN, out_norm = kNaN;  // L2 norms over finite elements
  Location worst;               // of max_abs
  std::int64_t nonfinite_mismatches = 0;
  Location first_nonfinite;
  // Smallest tolerances that would have passed this output.
  double min_atol = kNaN;       // with rtol = the policy's rtol (fixed/vllm policies)
  double min_fudge = kNaN;      // baseline: (max_abs - baseline_floor) / err_baseline, at least 0
  // The baseline policy's terms: max abs error of the model-dtype SDPA
  // reference on this case, op and paths (NaN when not computed), and the floor.
  double err_baseline = kNaN;
  double baseline_floor = kNaN;
  bool passed = false;
  std::string message;          // why it failed, empty when it passed
};

// Milliseconds per phase of one record, in the process that ran it. Work a
// case's records share (generating it, its golden and err_baseline, a block
// size's cache) is counted once, in the record whose job triggered it, so the
// records' timings sum to the run's time without double counting.
struct Timings {
  double generate_ms = 0, golden_ms = 0, cache_ms = 0, run_ms = 0, compare_ms = 0;
  double baseline_ms = 0;  // err_baseline: the model-dtype SDPA emulation (or libtorch) against the golden
  // The harness's own work around the backend calls: gathering inputs, copying
  // the cache, absorbing queries, up-projecting keys and values, merging and
  // converting outputs (total_ms less every other phase).
  double glue_ms = 0;
  double total_ms = 0;  // the whole job: from taking it (entering its case) to its record
};

struct Record {
  std::string case_id;
  std::string backend;
  std::string op;           // "layer", "decode", "prefill"
  Status status = Status::kSkipped;
  std::string message;      // reason / first failure, one line
  // Multi-line evidence, empty for most records: a crashed worker's last
  // stderr lines, compute-sanitizer findings, a nondeterminism breakdown.
  std::string details;
  std::string policy;       // tolerance policy name and parameters
  int block_size = 0;       // the block size actually used (0 when not run)
  std::vector<std::string> paths;  // layer: "decode" | "prefill" per request
  std::vector<Metrics> metrics;
  Timings timings;
  std::string repro;        // one-line command that reruns exactly this record
};

// The shortest text that reads back as the same double (std::to_string would
// print 1e-8 as 0.000000): numbers in repro commands, journals' fingerprints
// and suite files written by shrink, so a rerun gets exactly the same flags.
std::string exact_number(double v);

// The current UTC time as ISO 8601 ("2026-11-25T10:53:23Z"): when a run
// started (reports) and when a file was created (golden files).
std::string iso_now();

}  // namespace mlagate
