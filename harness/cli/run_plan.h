// The run's plan from its flags, for cmd_run.cpp: the cases' order, the ops
// the shard, the devices and their memory. Each throws InputError on a bad
// flag or a case too big for the machine.
#pragma once

#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "cases/case_spec.h"
#include "cases/op.h"
#include "harness/reliability/memory_estimate.h"
#include "harness/run/runner.h"
#include "reports/shard.h"

namespace mlagate {

// --order: the cases in another order (every order runs the same records).
void apply_order(std::vector<CaseSpec>& cases, const std::string& order);

// --op: "auto" is the ops cases name (CaseSpec::ops), then layer for the other
// dense cases, the two sparse ops for sparse ones and merge_states for merge
// ones; each op once, in the order given.
std::vector<Op> resolve_ops(const std::vector<std::string>& names, const std::vector<CaseSpec>& cases);
// --op auto where some cases name their ops: each case that names none is
// given the ops --op names beside auto and its kind's default (layer; the
// sparse ops; merge_states), so that it runs in those alone, not in every op
// the others bring. Without auto, or with no case naming ops, nothing changes.
void give_cases_their_ops(std::vector<CaseSpec>& cases, const std::vector<std::string>& names);

// --devices: the device numbers as given, each once, or "all" alone: every GPU
// this process sees (CUDA_VISIBLE_DEVICES' entries when set, else 0 .. count - 1).
std::vector<std::string> resolve_devices(const std::vector<std::string>& flag);

// --shard I/N, else GoogleTest's sharding variables; nullopt: the whole selection.
std::optional<Shard> resolve_shard(const std::string& flag);

// --reference cuda in a CUDA build: each case's device estimate (for the
// run's ops, --splits and backends), the memory of each device the streams
// run on (`devices`, resolved --devices: CUDA_VISIBLE_DEVICES values; none:
// the first visible device; this process holds no context on any) and each
// worker's own. A case that does not fit the
// smallest of those devices alone is refused here (InputError) unless
// !refuse. An empty plan (no device budget) otherwise. cap_gib > 0
// (--device-memory): no device is planned with more than that.
DeviceMemoryPlan plan_device_memory(const RunConfig& cfg, const std::vector<std::unique_ptr<Backend>>& backends,
                                    const std::vector<std::string>& devices, int splits, bool refuse,
                                    double cap_gib = 0);

// --reference cuda's device (an InputError from get() where it cannot be
// used), checked on a thread of its own from now.
std::shared_future<void> start_device_check();

}  // namespace mlagate
