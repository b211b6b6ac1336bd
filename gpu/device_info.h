// The process's view of its CUDA devices, free of CUDA headers so that the
// harness, the registry and CPU-only code can ask whether there is a usable
// GPU (and why not) without including the runtime. Implemented in
// gpu/device.cpp; built only when MLAGATE_HAS_CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mlagate {

// What the process sees: a device or the reason there is none.
struct CudaDeviceInfo {
  bool available = false;
  int count = 0;           // devices this process sees (CUDA_VISIBLE_DEVICES applied), usable or not
  std::string error;       // why not, when !available ("no CUDA device: ...")
  int device = 0;
  std::string name;        // "NVIDIA H100 80GB HBM3"
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  std::size_t total_bytes = 0, free_bytes = 0;
  std::string sync_policy;  // what MLAGATE_CUDA_SYNC set (sync_policy.h); empty: CUDA's default
  std::string str() const; // one line for logs
};
// Queried once per process (free memory at that moment).
const CudaDeviceInfo& cuda_device_info();

// The devices this process sees (CUDA_VISIBLE_DEVICES applied), counted
// without making a context; 0 with `why` saying why where there are none.
int cuda_visible_device_count(std::string& why);
// Total memory of the device of this ordinal (CUDA_VISIBLE_DEVICES applied)
// from its properties, which need no CUDA context: the parent of a run's
// workers sizes their devices without holding one on each. 0 when it cannot
// be had (no such device, no driver).
std::uint64_t cuda_device_total_bytes(int ordinal);

}  // namespace mlagate
