// Memory a case needs, estimated from its spec before anything is allocated,
// so that a case beyond the machine's memory is refused with a message (exit
// 2) instead of ending in the OOM killer or std::bad_alloc mid-run.
#pragma once

#include <cstdint>

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

}  // namespace mlagate
