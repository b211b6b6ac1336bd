// The run's plan from its flags, for cmd_run.cpp: the cases' order, the ops
// the shard and the devices. Each throws InputError on a bad flag.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cases/case_spec.h"
#include "cases/op.h"
#include "reports/shard.h"

namespace mlagate {

// --order: the cases in another order (every order runs the same records).
void apply_order(std::vector<CaseSpec>& cases, const std::string& order);

// --op: "auto" is layer for dense cases and the two sparse ops for sparse ones;
// each op once, in the order given.
std::vector<Op> resolve_ops(const std::vector<std::string>& names, const std::vector<CaseSpec>& cases);

// --devices: the device numbers as given, each once, or "all" alone: every GPU
// this process sees (CUDA_VISIBLE_DEVICES' entries when set, else 0 .. count - 1).
std::vector<std::string> resolve_devices(const std::vector<std::string>& flag);

// --shard I/N, else GoogleTest's sharding variables; nullopt: the whole selection.
std::optional<Shard> resolve_shard(const std::string& flag);

}  // namespace mlagate
