// How a process's host threads wait for the GPU (MLAGATE_CUDA_SYNC), set
// before its CUDA context exists: a measurement knob, and for a shared host.
// CUDA's default (spin while few contexts) stays: blocking, which frees the
// core a waiting worker spins, made the 4-seed vllm run on one H200 with 8
// workers slower once (34.2 s against 31.3 s; PERFORMANCE.md, "Where the time
// of a second GPU goes") and left it and two GPUs as fast another time, with
// a quarter to a third less user CPU (PERFORMANCE.md, "What a second GPU's
// workers wait for"). No CUDA header here: callers need none.
#pragma once

#include <string>

namespace mlagate {

// MLAGATE_CUDA_SYNC = spin | yield | block: the device's schedule flag
// (cudaDeviceScheduleSpin / Yield / BlockingSync) for the primary context,
// which libtorch shares. Unset or empty: CUDA's default (auto). Best effort:
// where a context already exists the flag may not take, which is said in the
// returned text (empty when nothing was asked for), as is an unknown value,
// which is ignored.
std::string apply_cuda_sync_policy();

// The schedule flag the current device's context has: "spin", "yield",
// "block" or "auto" (cudaGetDeviceFlags); "unknown" where it cannot be read.
std::string cuda_sync_policy_in_effect();

}  // namespace mlagate
