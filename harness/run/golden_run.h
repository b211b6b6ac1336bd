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
#include "harness/run/runner.h"

namespace mlagate {

struct GoldenRunOptions {
  std::string golden;                 // run --golden F
  std::string replay;                 // replay F
  std::vector<std::string> case_ids;  // replay --case: exact ids (empty: every case)
  std::string save_results;           // --save-results R
  std::uint64_t max_bytes = kDefaultMaxBytes;
  std::string command_line;
  std::string shard;  // --shard I/N: recorded in the results file for mlagate merge
  // An isolation worker: the parent validated the file (validate()), so the
  // stored references' hashes may be compared between cases (prepared_same).
  // The regenerated inputs and rebuilt caches are checked by the worker.
  bool validated_by_parent = false;
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
  // every case, selected or not; for run --golden without reading the bytes of
  // the stored inputs and cache data, which it regenerates), and for run --golden checks that each of
  // `cases` is in the file and its caches were exported with `exec`'s poison
  // options. Throws GoldenFileError (exit 2). The parent process calls it;
  // isolation workers do not repeat it. The regenerated inputs and rebuilt
  // caches are checked against the stored hashes as each case is made (the
  // worker's GoldenFileError ends the run with exit 2: harness/reliability).
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

}  // namespace mlagate
