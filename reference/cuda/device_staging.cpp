// The GPU's DeviceStaging (reference/device_staging.h): kept copies are
// cudaMalloc'ed buffers owned by shared pointers; the two scratch slots grow
// to the largest request and stay until release().
//
// Host bytes go up through two pinned buffers in turn: every thread copies a
// piece into one while the link carries the other's, about twice the rate of
// a copy from pageable memory (which the driver stages through its own small
// pinned buffer on one thread). Every copy is complete when its call returns,
// so whatever stream a backend's kernels then use, they read finished bytes.
// project() makes K and V on the device from their latent rows
// (cuda_project_rows_on_device): nothing goes through the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "cases/tensor.h"
#include "gpu/device.h"
#include "reference/cuda/cuda_reference.h"
#include "reference/device_staging.h"

namespace mlagate {
namespace {

using gpu::DeviceBuffer;
using gpu::PinnedBuffer;

constexpr std::size_t kPiece = std::size_t{32} << 20;  // bytes per pinned buffer

struct Staging {
  gpu::Stream stream;
  PinnedBuffer pinned[2];
  gpu::Event done[2];
  bool in_flight[2] = {false, false};
  DeviceBuffer slots[2];

  // bytes from host memory to device memory at dst, finished on return.
  void upload(void* dst, const void* src, std::size_t bytes) {
    const auto* from = static_cast<const std::byte*>(src);
    auto* to = static_cast<std::byte*>(dst);
    for (int b = 0; b < 2; ++b)
      if (pinned[b].size() < std::min(bytes, kPiece)) pinned[b] = PinnedBuffer(std::min(bytes, kPiece));
    for (std::size_t at = 0, i = 0; at < bytes; at += kPiece, ++i) {
      const int b = static_cast<int>(i % 2);
      const std::size_t n = std::min(kPiece, bytes - at);
      if (in_flight[b]) done[b].synchronize();  // its last piece has left
      std::byte* pin = pinned[b].as<std::byte>();
      parallel_memcpy(pin, from + at, n);
      MLAGATE_CUDA_CHECK(cudaMemcpyAsync(to + at, pin, n, cudaMemcpyHostToDevice, stream.get()));
      done[b].record(stream.get());
      in_flight[b] = true;
    }
    stream.sync();
    in_flight[0] = in_flight[1] = false;
  }
};

std::mutex g_mutex;
std::unique_ptr<Staging> g_staging;  // made on first use; release() frees it

Staging& state() {
  gpu::require_device();  // DeviceUnavailableError: a SKIPPED record, as the backend's own check gives
  if (!g_staging) g_staging = std::make_unique<Staging>();
  return *g_staging;
}

std::shared_ptr<void> upload(const void* host, std::size_t bytes) {
  const std::lock_guard lock(g_mutex);
  Staging& st = state();
  auto buf = std::make_shared<DeviceBuffer>(bytes);
  st.upload(buf->data(), host, bytes);
  return {buf, buf->data()};  // aliasing: the buffer lives while the address is held
}

void* to_scratch(int slot, const void* src, std::size_t bytes, bool src_on_device) {
  if (slot < 0 || slot > 1) throw std::out_of_range("device staging: scratch slot " + std::to_string(slot));
  const std::lock_guard lock(g_mutex);
  Staging& st = state();
  // The last backend lent this slot may have left kernels reading it on a
  // stream of its own: they finish before the slot is written again.
  MLAGATE_CUDA_CHECK(cudaDeviceSynchronize());
  DeviceBuffer& b = st.slots[slot];
  if (b.size() < bytes) {
    b = DeviceBuffer();  // the old one freed before the bigger one is allocated
    b = DeviceBuffer(bytes);
  }
  if (bytes == 0) return b.data();
  if (src_on_device) {
    MLAGATE_CUDA_CHECK(cudaMemcpyAsync(b.data(), src, bytes, cudaMemcpyDeviceToDevice, st.stream.get()));
    st.stream.sync();
  } else {
    st.upload(b.data(), src, bytes);
  }
  return b.data();
}

void release() {
  const std::lock_guard lock(g_mutex);
  g_staging.reset();
}

// K and V made on the device by the row projector's kernels (the glue's bits).
std::pair<std::shared_ptr<void>, std::shared_ptr<void>> project(const Case& c, const TensorView& kv,
                                                                const TensorView& pe) {
  gpu::require_device();
  const Dims& d = c.spec.dims;
  const std::int64_t s = kv.shape.empty() ? 0 : kv.shape[0], N = c.spec.num_heads();
  const auto k = std::make_shared<DeviceBuffer>(static_cast<std::size_t>(s * N * (d.nope_dim + d.rope_dim)) * 2);
  const auto v = std::make_shared<DeviceBuffer>(static_cast<std::size_t>(s * N * d.v_head_dim) * 2);
  cuda_project_rows_on_device(c, kv, pe, k->data(), v->data());
  return {std::shared_ptr<void>(k, k->data()), std::shared_ptr<void>(v, v->data())};
}

const DeviceStaging kStaging{upload, to_scratch, release, project};

}  // namespace

const DeviceStaging* cuda_device_staging() { return &kStaging; }

}  // namespace mlagate
