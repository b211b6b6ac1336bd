// Memory a case needs, estimated from its spec before anything is allocated,
// so that a case beyond the machine's memory is refused with a message (exit
// 2) instead of ending in the OOM killer or std::bad_alloc mid-run, and so
// that workers side by side (--workers, --devices) are given groups of cases
// only while their estimates fit: host memory for the machine, device memory
// for each GPU (RELIABILITY.md, "Memory").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cases/case_spec.h"

namespace mlagate {

// Host bytes of one case in the runner: inputs, weights, the fp64 reference and
// references, the paged caches, up-projected keys and values, outputs. A
// deliberate over-estimate (a safety factor of 1.5) of the largest terms.
// prefill_op: the kernel-level prefill op runs (keys and values of every
// token up-projected); otherwise only multi-token requests may need them.
std::uint64_t estimate_case_bytes(const CaseSpec& spec, bool prefill_op);

// MemAvailable of /proc/meminfo (0 when unknown).
std::uint64_t available_memory_bytes();

// Whether the kernel-level prefill op runs on this case in a run of these ops
// (estimate_case_bytes' prefill_op): the run has it and the case takes it
// (CaseSpec::ops; explore's rounds give each case its own op).
bool runs_prefill_op(const CaseSpec& spec, const std::vector<Op>& ops);

// Refuses (InputError, exit 2) the first case whose host estimate exceeds
// `available` bytes (0: unknown, nothing refused), before anything is allocated.
void refuse_cases_beyond_host(const std::vector<CaseSpec>& cases, const std::vector<Op>& ops, std::uint64_t available);

// What the device estimate depends on besides the case: the run's ops, flags
// and backends. The defaults assume the most (every in-tree GPU backend).
struct DeviceEstimateOptions {
  bool prefill_op = false;    // the kernel-level prefill op runs: K and V of every token go to the device
  int forced_splits = 0;      // --splits: split-KV partials of that many splits (0: the kernels choose)
  bool device_inputs = true;  // a backend reads prefill K and V in device memory (the glue's staged copies)
  bool torch = true;          // a torch.sdpa.* backend runs: libtorch's caching allocator keeps what it took
  std::uint64_t device_bytes = 0;  // the device's memory, when known: forced split partials beyond a
                                   // quarter of it are declined (cuda.splitkv: NOT_SUPPORTED), not allocated
};

// Peak device bytes of one case inside a worker with the GPU reference
// (--reference cuda) and the GPU backends: the fp64 reference, the glue's
// up-projection, the device cache store shared by the CUDA backends, the
// staged prefill inputs, libtorch's reserve and the largest backend call
// (outputs with guard bands, split-KV workspaces). A deliberate over-estimate
// (a safety factor of 1.25 over terms that are each upper bounds); what a
// worker keeps between cases is bounded by the largest estimate of the cases
// it ran. Not counted: a plugin's, exec program's or Python backend's own
// memory, and the serving modes' graph copies (--cuda-graph keeps a cache per
// captured size).
std::uint64_t estimate_case_device_bytes(const CaseSpec& spec, const DeviceEstimateOptions& opt = {});

// Device bytes every worker process holds before its first case: its CUDA
// context, and libtorch's when `torch` (memory_estimate.cpp says why these numbers).
std::uint64_t worker_device_overhead_bytes(bool torch);

// The device side of a run with workers: each case's estimate, each device's
// memory and each worker's own; empty when there is no device budget (no
// CUDA, no --reference cuda).
struct DeviceMemoryPlan {
  std::vector<std::uint64_t> case_bytes;    // per case of the run, in RunConfig::cases' order
  std::vector<std::uint64_t> device_bytes;  // per device of the streams (--devices' order; one without): 0 unknown
  std::uint64_t worker_bytes = 0;           // worker_device_overhead_bytes
  bool active() const { return !case_bytes.empty() && !device_bytes.empty(); }
};

// Refuses (InputError, exit 2) the first case whose device estimate plus one
// worker's overhead exceeds `device_bytes` (0: unknown, nothing refused), the
// memory of `device` (its name in the message: "device 0").
void refuse_cases_beyond_device(const std::vector<CaseSpec>& cases, const std::vector<std::uint64_t>& case_bytes,
                                std::uint64_t worker_bytes, std::uint64_t device_bytes, const std::string& device);

}  // namespace mlagate
