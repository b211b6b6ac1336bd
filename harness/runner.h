// The runner: cases x backends x ops -> records. Each case's inputs and golden
// are computed once and shared by every backend; each block size's paged cache
// is built once per case and copied per run.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "cases/case_spec.h"
#include "harness/compare.h"
#include "harness/layer.h"
#include "harness/record.h"

namespace mlagate {

struct RunConfig {
  std::vector<CaseSpec> cases;
  std::vector<Op> ops{Op::kLayer};
  Policy policy;
  ExecOptions exec;
  // One-line command that reruns exactly (case, backend, op); set by the CLI.
  std::function<std::string(const CaseSpec&, const std::string& backend, Op op)> repro;
  // Called after every record (progress, console lines).
  std::function<void(const Record&, std::size_t done, std::size_t total)> on_record;
};

std::vector<Record> run_cases(const RunConfig& cfg, std::vector<std::unique_ptr<Backend>>& backends);

// Runs one (case, backend, op) on an already generated case and golden; used by
// run_cases and by tests. golden_decode_* are only read for Op::kDecode.
struct CaseContext;
Record run_one(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg);

}  // namespace mlagate
