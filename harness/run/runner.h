// The runner: cases x backends x ops -> records. Each case's inputs and golden
// are computed once and shared by every backend; each block size's paged cache
// is built once per case and copied per run.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "cases/case_spec.h"
#include "harness/run/run_config.h"
#include "reports/record.h"

namespace mlagate {

std::vector<Record> run_cases(const RunConfig& cfg, std::vector<std::unique_ptr<Backend>>& backends);

// The run's records: each case in each of the run's ops it takes (CaseSpec::ops), per backend.
std::size_t job_count(const RunConfig& cfg, std::size_t backends);

// Runs one (case, backend, op) on an already generated case and golden; used by
// run_cases and by tests. reference_decode_* are only read for Op::kDecode.
Record run_one(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg);

// A run's cases in sequence (run_cases, isolation workers): each case's context
// is made on entry, reusing the previous case's inputs, golden and caches where
// they are the same. The returned context lives until the next enter().
class CaseStream {
 public:
  explicit CaseStream(const RunConfig& cfg);
  ~CaseStream();
  CaseContext& enter(const CaseSpec& spec);  // throws InvalidCase
 private:
  const RunConfig& cfg_;
  std::unique_ptr<CaseContext> last_;
};

// A case made ahead, on a thread of its own, with the work its jobs will
// share: an isolation worker makes the first case of its stream's next group
// while the current group's last case runs its backends (isolate.cpp), so
// that drawing the inputs, the reference, the paged caches and err_baseline
// no longer wait between a worker's backend calls. What is made ahead is what
// the jobs would make on first use, for the block sizes and layer paths the
// run's backends declare (asked here, on the caller's thread), so every record
// is the same bits either way; work that fails ahead is left to the jobs, which
// make it again and report it where they always did.
class CaseAhead {
 public:
  CaseAhead(const RunConfig& cfg, std::vector<std::unique_ptr<Backend>>& backends, std::size_t case_index);
  ~CaseAhead();  // waits for the thread
  CaseAhead(const CaseAhead&) = delete;
  CaseAhead& operator=(const CaseAhead&) = delete;
  std::size_t case_index() const { return case_index_; }
  // Waits for the thread. `stream` becomes the stream holding the made case
  // (the case's next cases hand on from it) and its context is returned, or
  // what entering the case threw (InvalidCase, InputError) is thrown.
  // `beside_ms`: the work's time that ran beside the caller's (its time less
  // the wait here), which the case's first record counts in its phases.
  CaseContext& take(std::unique_ptr<CaseStream>& stream, double& beside_ms);

  struct Plan;

 private:
  std::size_t case_index_;
  std::unique_ptr<CaseStream> stream_;
  std::unique_ptr<Plan> plan_;
  std::exception_ptr error_;  // entering the case
  CaseContext* ctx_ = nullptr;
  double work_ms_ = 0;
  std::thread thread_;
};

// The case a context holds.
const CaseSpec& context_spec(const CaseContext& ctx);

// The record of a (case, backend, op) whose case cannot be made.
Record invalid_case_record(const RunConfig& cfg, const CaseSpec& spec, const std::string& backend, Op op,
                           const std::string& why);

}  // namespace mlagate
