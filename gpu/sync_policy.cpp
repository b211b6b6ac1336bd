// MLAGATE_CUDA_SYNC (sync_policy.h): the primary context's schedule flag.
#include "gpu/sync_policy.h"

#include <cuda_runtime.h>

#include <cstdlib>

namespace mlagate {

std::string apply_cuda_sync_policy() {
  const char* v = std::getenv("MLAGATE_CUDA_SYNC");
  if (!v || !*v) return {};
  const std::string s = v;
  unsigned flag = 0;
  if (s == "spin") flag = cudaDeviceScheduleSpin;
  else if (s == "yield") flag = cudaDeviceScheduleYield;
  else if (s == "block") flag = cudaDeviceScheduleBlockingSync;
  else return "MLAGATE_CUDA_SYNC='" + s + "' ignored (expected spin, yield or block)";
  const cudaError_t e = cudaSetDeviceFlags(flag);
  if (e == cudaSuccess) return "MLAGATE_CUDA_SYNC=" + s;
  cudaGetLastError();  // not sticky: later checks start clean
  return "MLAGATE_CUDA_SYNC=" + s + " not applied: " + cudaGetErrorString(e);
}

std::string cuda_sync_policy_in_effect() {
  unsigned flags = 0;
  if (cudaGetDeviceFlags(&flags) != cudaSuccess) {
    cudaGetLastError();
    return "unknown";
  }
  switch (flags & cudaDeviceScheduleMask) {
    case cudaDeviceScheduleSpin: return "spin";
    case cudaDeviceScheduleYield: return "yield";
    case cudaDeviceScheduleBlockingSync: return "block";
    default: return "auto";
  }
}

}  // namespace mlagate
