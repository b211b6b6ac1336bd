// One result: a case x backend x op, its status, metrics per output, the
// smallest tolerance that would have passed, timings and a repro command.
// Reports (JSON, JUnit, Markdown) are written from these alone.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
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
  // --check batch-invariance: correct, but a request's rows changed with its
  // batchmates (which request, which batch, how many ULPs in the message). Not a
  // failure unless the run requires it (--require batch-invariance: exit 1).
  kBatchVariant,
};
// Every Status in enum order, so that counts can be indexed by the enum value;
// the static_assert catches a status appended to the enum and not here.
inline constexpr std::array kAllStatuses = {
    Status::kPassed,  Status::kIncorrect,    Status::kNonfinite, Status::kCrashed,
    Status::kTimeout, Status::kNotSupported, Status::kSkipped,   Status::kInvalidCase,
    Status::kNondeterministic, Status::kBatchVariant,
};
static_assert(static_cast<std::size_t>(Status::kBatchVariant) + 1 == kAllStatuses.size());
std::string_view status_name(Status s);  // "PASSED", "INCORRECT", ...
// The status a name gives (status_name's inverse); nullopt for an unknown name.
std::optional<Status> status_from_name(std::string_view name);
bool status_is_failure(Status s);        // INCORRECT, NONFINITE, CRASHED, TIMEOUT, INVALID_CASE, NONDETERMINISTIC
// status_is_failure, or BATCH_VARIANT where the run requires batch invariance.
bool status_fails_run(Status s, bool require_batch_invariance);

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Where an element sits, for messages: request, token within request, head, dim.
struct Location {
  std::int64_t flat = -1;
  int request = -1, token = -1, head = -1, dim = -1;
  std::string str() const;  // "request 2, token 3, head 17, dim 100"
};

// One of an output's largest errors, for the HTML report's "worst elements".
struct WorstElement {
  Location where;  // where.flat: the element's flat index in the output
  double got = kNaN, expected = kNaN, err = kNaN;  // err = |got - expected|
};

// Bounds of Metrics' error summary: the error map has at most kErrMapMaxRows
// token bins x kErrMapMaxCols head bins (32 KiB of floats at most per output),
// and the kWorstElements largest errors are kept.
inline constexpr int kErrMapMaxRows = 64, kErrMapMaxCols = 128;
inline constexpr std::size_t kWorstElements = 8;
// Request boundaries (Metrics::query_lens) are kept up to this many requests.
inline constexpr std::size_t kErrMapMaxRequests = 4096;

// Metrics of one output against the fp64 reference (SPEC: Pass rules, rule 4).
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
  // Error summary for the HTML report, filled in compare_output's metrics pass.
  // The output read as [map_tokens, map_heads, dim] (Layout); map_tokens 0: no
  // map (shape check failed, or numel not a multiple of heads x dim). Tokens
  // are binned by token_bin and heads by head_bin so that the map has at most
  // kErrMapMaxRows x kErrMapMaxCols cells: err_token_head is row-major
  // [ceil(map_tokens / token_bin), ceil(map_heads / head_bin)], each cell the
  // max abs error over its tokens, heads and dim where both values are finite
  // (0 when none are), NaN when it holds a non-finite mismatch.
  int map_tokens = 0, map_heads = 0;
  int token_bin = 1, head_bin = 1;
  std::vector<float> err_token_head;
  // Query tokens per request (request r owns the query_lens[r] tokens from
  // sum(query_lens[0..r)) on; tokens past the sum are padding, in no request),
  // so the map can be read by request and position; empty with more than
  // kErrMapMaxRequests requests or when the layout's query_start_loc does not
  // fit in map_tokens tokens.
  std::vector<std::int32_t> query_lens;
  // The kWorstElements largest abs errors over finite pairs, largest first
  // (ties: the lower flat index first); worst_elements[0] is `worst`.
  std::vector<WorstElement> worst_elements;
};

// Milliseconds per phase of one record, in the process that ran it. Work a
// case's records share (generating it, its reference and err_baseline, a block
// size's cache) is counted once, in the record whose job triggered it, so the
// records' timings sum to the run's time without double counting.
struct Timings {
  double generate_ms = 0, reference_ms = 0, cache_ms = 0, run_ms = 0, compare_ms = 0;
  double baseline_ms = 0;  // err_baseline: the model-dtype SDPA emulation (or libtorch) against the reference
  // The harness's own work around the backend calls: gathering inputs, copying
  // the cache, absorbing queries, up-projecting keys and values, merging and
  // converting outputs (total_ms less every other phase).
  double glue_ms = 0;
  double total_ms = 0;  // the whole job: from taking it (entering its case) to its record
};

// --steps: one step of a decode loop (harness/run/SERVING.md): its rows
// against the reference, for the error-vs-step curve.
struct StepResult {
  int step = 0;
  int requests = 0;  // requests decoded in this step
  Status status = Status::kPassed;
  double max_abs_o = kNaN, max_abs_lse = kNaN;  // over this step's rows (NaN: a non-finite mismatch)
};

// --expect (harness/verdicts/VERDICTS.md): what an expectations entry made of
// a record. The record keeps the status it got; this says how a run counts it.
enum class Expected : std::uint8_t {
  kNone,   // no entry matched it (or it did not run)
  kXfail,  // it failed as an entry says it does: reported with the entry's reason, not a failure
  kXpass,  // an entry says it fails and it passed: a failure of the run when the entry is strict
};
std::string_view expected_name(Expected e);  // "", "XFAIL", "XPASS"
struct Expectation {
  Expected outcome = Expected::kNone;
  std::string entry;         // the entry's id
  std::string reason, link;  // the entry's words, for every report
  bool strict = true;        // an XPASS fails the run
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
  // The serving-engine mode that made the record (harness/run/SERVING.md), empty
  // for a plain call: "batch-invariance", "dcp=2,interleave=1", "steps=64".
  std::string mode;
  std::vector<StepResult> steps;  // --steps: every step in order
  // What --expect entries select on and reports group by (harness/verdicts/facts.h):
  // the case's parameters and the run's settings as words ("kv" -> "fp8",
  // "query_kind" -> "decode"). Filled by the process that ran the cases; empty
  // in a worker's records and in reports that predate them.
  std::map<std::string, std::string> facts;
  Expectation expected;  // --expect: XFAIL / XPASS, or kNone
};

// Whether a record fails its run: an unexpected failure (status_fails_run and
// no XFAIL) or a strict XPASS. Every count, verdict and exit code goes through it.
bool record_fails_run(const Record& r, bool require_batch_invariance);

// The shortest text that reads back as the same double (std::to_string would
// print 1e-8 as 0.000000): numbers in repro commands, journals' fingerprints
// and suite files written by shrink, so a rerun gets exactly the same flags.
std::string exact_number(double v);

// The current UTC time as ISO 8601 ("2026-11-25T10:53:23Z"): when a run
// started (reports) and when a file was created (golden files).
std::string iso_now();

}  // namespace mlagate
