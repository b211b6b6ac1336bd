// Device memory for the layer glue's prefill inputs, for backends that read
// them there (Capabilities::device_inputs). With the glue on the GPU
// (--reference cuda) the up-projected K and V of a prefill call go to the
// device once per memo entry and are lent from there to every such backend,
// instead of each backend uploading the same gigabytes on each call.
// Process-wide, like the RowProjector (reference/glue.h): null, the default,
// means host memory only. reference/cuda provides the GPU's
// (cuda_device_staging); tests provide host stand-ins.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

#include "cases/case.h"
#include "cases/tensor.h"

namespace mlagate {

struct DeviceStaging {
  // A device copy of `bytes` host bytes, freed when the last owner goes.
  std::shared_ptr<void> (*upload)(const void* host, std::size_t bytes) = nullptr;
  // Copies `bytes` from src (device memory when src_on_device, else host
  // memory) into scratch slot `slot` (0 or 1; grown as needed and kept
  // between calls) and returns the slot's device address, valid until the
  // slot's next use or release(). A backend is lent scratch copies, never the
  // kept ones, so one that writes into its inputs changes nothing the next
  // backend gets.
  void* (*to_scratch)(int slot, const void* src, std::size_t bytes, bool src_on_device) = nullptr;
  // Frees the scratch slots (the next to_scratch makes them again).
  void (*release)() = nullptr;
  // The glue's up-projection of latent rows kv [s, L] and rope rows pe [s, R]
  // (model dtype) made in device memory, K [s, N, P+R] and V [s, N, V] with
  // the bits up_project_kv writes (glue.h), freed when the last owner goes:
  // the prefill path's K and V never pass through host memory (2.7 GB a
  // call at TP 1, a download and an upload). Null: K and V are projected into
  // host memory and uploaded.
  std::pair<std::shared_ptr<void>, std::shared_ptr<void>> (*project)(const Case& c, const TensorView& kv,
                                                                     const TensorView& pe) = nullptr;
};

void set_device_staging(const DeviceStaging* s);
const DeviceStaging* device_staging();

// Sets a staging for its lifetime, then releases its scratch and puts the
// previous one back.
class DeviceStagingScope {
 public:
  explicit DeviceStagingScope(const DeviceStaging* s) : previous_(device_staging()), mine_(s) { set_device_staging(s); }
  ~DeviceStagingScope() {
    set_device_staging(previous_);
    if (mine_ && mine_ != previous_ && mine_->release) mine_->release();
  }
  DeviceStagingScope(const DeviceStagingScope&) = delete;
  DeviceStagingScope& operator=(const DeviceStagingScope&) = delete;

 private:
  const DeviceStaging* previous_;
  const DeviceStaging* mine_;
};

}  // namespace mlagate
