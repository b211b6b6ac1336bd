// One op of the harness as a module (harness/run/ops/<op>/): how a case is
// admitted for it, how a backend runs it, what its outputs are judged against
// and its err_baseline. The runner knows ops only through this interface
// (run_one: admit -> run -> judge); an op's own state lives in a slot of the
// case's context (CaseContext::slot), made on first use. A new op is a new
// module, its reference, and one line in ops/registry.cpp (OPS.md).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "cases/case_spec.h"
#include "harness/run/ops/op_run.h"
#include "harness/run/run_config.h"
#include "reference/prepared_case.h"
#include "reports/record.h"

namespace mlagate {

struct CaseContext;

// err_baseline of an op's main output and lse (NaN: none).
struct BaselineErrors {
  double out = kNaN, lse = kNaN;
};

// The fp64 values an op's outputs are compared with.
struct JudgedAgainst {
  const std::vector<double>* main = nullptr;  // "out", "o_lat" or "o"
  const std::vector<double>* lse = nullptr;
  bool zero_ok = false;  // every reference row empty: zero is the answer (compare.h's zero_reference_ok)
};

// What a case made ahead (CaseAhead) prepares for its jobs: tasks in the order
// added, each once (by key), run on the thread that makes the case.
struct AheadPlan {
  struct Task {
    std::string key;
    std::function<void(CaseContext&)> work;
  };
  std::vector<Task> caches, inputs;  // paged caches first, then the ops' own work
  void add(std::vector<Task>& to, std::string key, std::function<void(CaseContext&)> work);
  bool has(const std::vector<Task>& in, const std::string& key) const;
};

class OpDriver {
 public:
  virtual ~OpDriver() = default;
  virtual Op op() const = 0;
  // Beyond the backend's supports(): whether the op runs this case on a
  // backend with these capabilities (Support::no: NOT_SUPPORTED, its reason).
  virtual Support admit(const Capabilities&, const CaseSpec&) const { return Support::yes(); }
  // Whether the op reads the paged cache of the backend's block size (a
  // golden file's missing block size is then SKIPPED).
  virtual bool reads_cache() const { return true; }
  // Whether the op runs merge cases (cases/merge.h) rather than attention cases.
  virtual bool runs_merge_cases() const { return false; }
  // Makes (or takes from the context) the op's inputs, calls the backend and
  // returns its outputs. r: the record so far (block size; the cache time
  // the op spends goes to r.timings.cache_ms). Backend errors propagate.
  virtual OpRun run(CaseContext& ctx, Backend& b, const RunConfig& cfg, Record& r) const = 0;
  // What the outputs of `run` are judged against.
  virtual JudgedAgainst reference(CaseContext& ctx) const = 0;
  // err_baseline for the outputs, on the paths the backend took. Throws
  // BaselineUnavailableError when there is nothing to judge against.
  virtual BaselineErrors baseline(CaseContext&, const OpRun&, const RunConfig&) const { return {}; }
  // The lse floor's count of fp32 roundings (compare.h's dqk).
  virtual int lse_roundings(const CaseSpec& spec) const {
    return spec.dims.kv_lora_rank + spec.dims.rope_dim;
  }
  // fp8 caches: the reference of the main output over the unquantized
  // inputs, for the quantization error a record reports for information
  // (null: the op reports none).
  virtual const std::vector<double>* unquantized_main(CaseContext&) const { return nullptr; }
  // A golden file's prepared parts of this op into its slot.
  virtual void adopt(PreparedCase&, CaseContext&) const {}
  // The work this op's job on backend `b` will share, made ahead (CaseAhead).
  virtual void plan_ahead(const Backend&, const CaseSpec&, const RunConfig&, AheadPlan&) const {}
};

// The module of an op (ops/registry.cpp); every op has one.
const OpDriver& op_driver(Op op);
// Every op's module, in Op order (adopting a prepared case, plans ahead).
const std::vector<const OpDriver*>& op_drivers();

}  // namespace mlagate
