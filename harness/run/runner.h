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
#include "cases/case.h"
#include "cases/case_spec.h"
#include "cases/paged_cache.h"
#include "reference/compare.h"
#include "harness/run/layer.h"
#include "reports/record.h"
#include "reference/fp64_reference.h"
#include "reference/prepared_case.h"
#include "reference/sdpa_emulation.h"

namespace mlagate {

// Where the reference comes from (--reference): an empty member means the fp64
// Eigen reference of reference/fp64_reference.h; `cuda` puts the same math on the GPU.
struct ReferenceImpl {
  std::string name = "eigen";
  std::function<ReferenceOutputs(const Case&)> absorbed;  // as reference_absorbed
  // absorbed runs on a device and may be called on another thread while this
  // one computes the baseline emulation (their work overlaps).
  bool on_device = false;
  std::function<void(const Case&, const TensorView& q_lat, std::vector<double>& o_lat, std::vector<double>& lse)>
      mqa;  // as reference_mqa
};

// Where err_baseline comes from (--baseline; SPEC: Pass rules, rule 5): the seed test's
// SDPA reference in the model dtype, per case and op, on the paths the backend
// took. Default: the CPU emulation (reference/sdpa_emulation.h); `layer` may
// replace it for the layer op's output (the libtorch reference; lse and the
// kernel-level ops keep the emulation).
struct BaselineImpl {
  std::string name = "emulated";
  // err_baseline is computed when the policy is baseline, or for every record
  // when `always` (min_fudge in every verdict: the CLI's default).
  bool always = false;
  std::function<SdpaResult(const Case&, SdpaForm, std::span<const int> requests)> layer;
};

struct CaseContext;

struct RunConfig {
  std::vector<CaseSpec> cases;
  std::vector<Op> ops{Op::kLayer};
  Policy policy;
  ExecOptions exec;
  ReferenceImpl reference;
  BaselineImpl baseline;
  // One-line command that reruns exactly (case, backend, op); set by the CLI.
  std::function<std::string(const CaseSpec&, const std::string& backend, Op op)> repro;
  // (optional) One-line command running exactly these cases in this order on
  // one backend instance (order-dependent failures).
  std::function<std::string(const std::vector<const CaseSpec*>&, const std::string& backend, Op op)> repro_sequence;
  // Called after every record (progress, console lines).
  std::function<void(const Record&, std::size_t done, std::size_t total)> on_record;
  // (optional) makes each case instead of generate_case (golden files); InvalidCase
  // gives INVALID_CASE records, any other exception ends the run. `previous`:
  // the previous case when its inputs are this one's (inputs_key; another kv
  // cache dtype), which prepare may move from and retarget instead of
  // generating the same tensors again; else null.
  std::function<PreparedCase(const CaseSpec&, Case* previous)> prepare;
  // (optional, with prepare) true when the case `next` would be prepared with
  // exactly the references of `prev` (equal cache values): the context of prev
  // is handed on as in a generated run instead of preparing next anew.
  std::function<bool(const CaseSpec& prev, const CaseSpec& next)> prepared_same;
  // (optional) each record that ran, with its outputs, before they are freed (results files).
  std::function<void(const Case&, const Record&, std::span<const ProducedOutput>)> on_outputs;
  // (optional) polled between records: true ends the run early (SIGINT/SIGTERM).
  std::function<bool()> stop;
  // (optional) runs one (case, backend, op) instead of run_one (--repeat).
  std::function<Record(CaseContext&, Backend&, Op)> run_job;
};

std::vector<Record> run_cases(const RunConfig& cfg, std::vector<std::unique_ptr<Backend>>& backends);

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
