// Golden files in a run: `run --golden F` (regenerate, check the inputs against
// the file by hash, compare against the stored references), `replay F` (run
// the stored inputs and caches themselves), `--save-results R` (every
// backend's outputs and metrics into a results file), and `compare A B`.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "golden/golden_file.h"
#include "harness/runner.h"

namespace mlagate {

struct GoldenRunOptions {
  std::string golden;                 // run --golden F
  std::string replay;                 // replay F
  std::vector<std::string> case_ids;  // replay --case: exact ids (empty: every case)
  std::string save_results;           // --save-results R
  std::uint64_t max_bytes = kDefaultMaxBytes;
  std::string command_line;
};

class GoldenRun {
 public:
  // Opens and checks the files (exists, schema, kind, generator version) and
  // creates the results file's temporary file; throws GoldenFileError.
  explicit GoldenRun(const GoldenRunOptions& opt);
  ~GoldenRun();
  GoldenRun(const GoldenRun&) = delete;
  GoldenRun& operator=(const GoldenRun&) = delete;

  // The cases the file holds (in file order), narrowed to --case ids and the
  // --filter regex; every case's attributes validated. Replay always takes its
  // cases from here; run --golden does when no --suite or --spec is given.
  std::vector<CaseSpec> file_cases(const std::string& filter) const;
  // Validates the whole file before anything runs (GoldenReader::validate_all:
  // every case, selected or not), and for run --golden checks that each of
  // `cases` is in the file, regenerates to its stored input hashes and was
  // exported with `exec`'s poison options. Throws GoldenFileError (exit 2).
  // The parent process calls it; isolation workers do not repeat it.
  void validate(const std::vector<CaseSpec>& cases, const ExecOptions& exec);
  // Installs cfg.prepare, cfg.on_outputs and wraps cfg.on_record. Call after
  // cfg.cases, cfg.policy, cfg.exec and cfg.on_record are set.
  void attach(RunConfig& cfg);
  // Commits the results file (if any); returns its path, empty when none.
  std::string finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct FileCompareOptions {
  double atol = 0, rtol = 0;   // |a - b| <= atol + rtol * |a| counts as within tolerance
  bool ignore_missing = false; // cases / records / outputs in one file only do not fail
  bool verbose = false;        // list identical records too
  std::uint64_t max_bytes = kDefaultMaxBytes;
};

struct FileCompareSummary {
  std::size_t identical = 0;         // every output bit-identical
  std::size_t within_tolerance = 0;  // values differ, none beyond atol/rtol
  std::size_t different = 0;         // an output differs beyond atol/rtol (or in shape/dtype)
  std::size_t only_a = 0, only_b = 0;  // cases, records or outputs present in one file only
  std::size_t inputs_differ = 0;     // cases whose input hashes differ
  bool failed(const FileCompareOptions& o) const {
    return different > 0 || inputs_differ > 0 || (!o.ignore_missing && only_a + only_b > 0);
  }
};

// Compares two results files case by case, backend by backend, output by
// output, writing a line per difference (and a summary) to `out`.
FileCompareSummary compare_results_files(const std::string& a, const std::string& b, const FileCompareOptions& opt,
                                         std::FILE* out);

}  // namespace mlagate
