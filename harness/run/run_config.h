// What a run is asked to do (RunConfig): its cases, ops, policy, where the
// reference and err_baseline come from, and the hooks the CLI, golden files
// and isolation workers set. Read by the runner and by every op module.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "cases/case.h"
#include "cases/case_spec.h"
#include "harness/run/guarded.h"
#include "reference/compare.h"
#include "reference/fp64_reference.h"
#include "reference/prepared_case.h"
#include "reference/sdpa_emulation.h"
#include "reports/record.h"

namespace mlagate {

// How a run's buffers are made: poison, block table, chunking, reuse.
struct ExecOptions {
  Poison poison = Poison::kNaN;     // outputs, workspaces and unused cache regions
  bool poison_block_table = false;  // unused block-table entries = an invalid huge id
  int prefill_chunk = 2048;         // context tokens per chunk of the MHA prefill path
  bool reuse_buffers = false;       // kernel outputs from a pool of earlier ones (GuardedBuffer reuse), not fresh
};

// One output of an op, as an op hands it back to be judged (and as the
// results files store it).
struct ProducedOutput {
  std::string name;  // "out", "lse", "o_lat", "o"
  GuardedBuffer buf;
  std::int64_t heads = 1, dim = 1;  // for locating elements
  bool is_lse = false;
};

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
  // Generated cases that take no op of `ops` but cache_write are drawn
  // keys_only (generate_case: the latent rows alone, the same values): a plain
  // run's choice, not a --repeat's or serving mode's, nor where the outputs
  // are kept with their case (on_outputs).
  bool keys_only_cases = false;
};

}  // namespace mlagate
