// `mlagate triage` (VERDICTS.md, "Triage"): a failing record's what-if
// variants, each one `mlagate run` of the case with one thing changed (the
// poison, a repeat, the request alone, the batch reversed, another block
// size, a smaller Q, an exact k_scale, fp16, the reference with the scale
// rounded), and the class of cause their verdicts point to. Its report is a
// bug report a kernel team can take as it is: the environment, the case in
// words, expected against actual with positions, the variants table, the
// replay line and bundle, and a standalone Python script (h5py + numpy) that
// shows the mismatch without mlagate.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "cases/case_spec.h"
#include "reports/record.h"

namespace mlagate {

// The classes, in the order they are tested: the first whose evidence holds names the cause.
inline constexpr const char* kClassNondeterministic = "nondeterministic";
inline constexpr const char* kClassPoison = "reads memory it must not";
inline constexpr const char* kClassScaleRounding = "scale rounded to the model dtype";
inline constexpr const char* kClassLargeQ = "large logits";
inline constexpr const char* kClassBatch = "batch-dependent";
inline constexpr const char* kClassBlockSize = "block-size dependent";
inline constexpr const char* kClassPrecision = "model-dtype precision";
inline constexpr const char* kClassUnexplained = "unexplained";
inline constexpr const char* kClassNotReproduced = "not reproduced";

struct TriageOptions {
  CaseSpec spec;      // the failing case
  std::string backend;
  Op op = Op::kLayer;
  Capabilities caps;  // the backend's (which block sizes and dtypes it takes)
  // Flags every variant's `mlagate run` gets: out-of-tree backends, policy,
  // poison, splits, reference, a serving mode's flags.
  std::vector<std::string> run_args;
  std::string out_dir = "triage";
  // The report (report.md, report.json) is always written; with bundle, also
  // the golden bundle, the kernel's outputs and repro.py (one more run).
  bool bundle = true;
  // Lines about where it ran (mlagate, GPU, driver, libraries), for the report.
  std::vector<std::string> environment;
  std::FILE* log = stdout;  // a line per variant; nullptr: silent
};

struct TriageVariant {
  std::string name;     // "poison zero"
  std::string change;   // what differs, in words: "--poison zero (unused cache and outputs hold 0)"
  bool applicable = true;
  std::string why_not;  // when not applicable
  std::string status;   // the record's status ("" when it did not run)
  std::string message;
  std::string output;   // the output the metric below is of
  double max_abs = kNaN, min_fudge = kNaN;
  std::string verdict;  // "fails the same way", "passes", "fails otherwise (INCORRECT)", "not supported: ..."
  std::string command;  // the run, as a command line
};

struct TriageResult {
  std::string cls;          // one of the kClass* names
  std::string explanation;  // one sentence: which variants say so
  std::string status;       // the given case's status
  Record record;            // the given case's record
  std::vector<TriageVariant> variants;
  std::string dir, report_md, report_json, repro_py, bundle, results;  // written files (empty: not written)
};

// Runs the variants (a few `mlagate run` processes) and writes the report.
// Throws InputError when the case does not run to a record.
TriageResult triage(const TriageOptions& opt);

// Whether `given` (a failing record of opt.spec) belongs to class `cls`: runs
// only the variants that decide that class (one or two runs) and returns the
// class they point to (cls when they confirm it). explore uses it to attach a
// new failure signature to a cause already triaged.
std::string confirm_class(const TriageOptions& opt, const Record& given, const std::string& cls);

// opt.backend and opt.op on case `c` with opt.run_args, once, in a worker
// process: its record (SKIPPED with the reason when the run gave none).
Record rerun(const TriageOptions& opt, const CaseSpec& c);

// The verdict rules alone (for tests): the class and its explanation from
// the given status and the variants.
std::pair<std::string, std::string> classify(const std::string& given_status, const std::vector<TriageVariant>& v,
                                             double given_max_abs);

}  // namespace mlagate
