// The GPU's DeviceStaging (reference/device_staging.h): kept copies are
// cudaMalloc'ed buffers owned by shared pointers; the two scratch slots grow
// to the largest request and stay until release(). Every copy is complete
// when its call returns (the default stream synchronized), so whatever stream
// a backend's kernels then use, they read the finished bytes.
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "backends/cuda/device.h"
#include "reference/cuda/cuda_reference.h"
#include "reference/device_staging.h"

namespace mlagate {
namespace {

std::mutex g_mutex;
gpu::DeviceBuffer g_slots[2];

std::shared_ptr<void> upload(const void* host, std::size_t bytes) {
  gpu::require_device();  // DeviceUnavailableError: a SKIPPED record, as the backend's own check gives
  auto buf = std::make_shared<gpu::DeviceBuffer>(bytes);
  if (bytes) MLAGATE_CUDA_CHECK(cudaMemcpy(buf->data(), host, bytes, cudaMemcpyHostToDevice));
  return {buf, buf->data()};  // aliasing: the buffer lives while the address is held
}

void* to_scratch(int slot, const void* src, std::size_t bytes, bool src_on_device) {
  if (slot < 0 || slot > 1) throw std::out_of_range("device staging: scratch slot " + std::to_string(slot));
  gpu::require_device();
  const std::lock_guard lock(g_mutex);
  gpu::DeviceBuffer& b = g_slots[slot];
  if (b.size() < bytes) {
    b = gpu::DeviceBuffer();  // the old one freed before the bigger one is allocated
    b = gpu::DeviceBuffer(bytes);
  }
  if (bytes) {
    MLAGATE_CUDA_CHECK(
        cudaMemcpy(b.data(), src, bytes, src_on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice));
    MLAGATE_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // a device-to-device copy returns before it is done
  }
  return b.data();
}

void release() {
  const std::lock_guard lock(g_mutex);
  g_slots[0] = gpu::DeviceBuffer();
  g_slots[1] = gpu::DeviceBuffer();
}

const DeviceStaging kStaging{upload, to_scratch, release};

}  // namespace

const DeviceStaging* cuda_device_staging() { return &kStaging; }

}  // namespace mlagate
