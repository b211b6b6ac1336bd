// The CUDA stage of plugin calls: inputs uploaded, outputs in guarded device
// buffers starting as the harness's poison, one stream per call; finish()
// synchronizes, checks the guards and downloads. Built only with CUDA.
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "backends/cuda/device.h"
#include "backends/plugin/device_stage.h"

namespace mlagate::plugin {

namespace {

class CudaStage final : public DeviceStage {
 public:
  explicit CudaStage(int device_id) {
    gpu::require_device();
    int count = 0;
    MLAGATE_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (device_id < 0 || device_id >= count)
      throw DeviceUnavailableError("CUDA device " + std::to_string(device_id) + " not present (" + std::to_string(count) +
                                   " device(s))");
    MLAGATE_CUDA_CHECK(cudaSetDevice(device_id));
    stream_ = std::make_unique<gpu::Stream>();
  }
  void* input(const void* host, std::size_t bytes) override {
    inputs_.push_back(gpu::upload_array(static_cast<const unsigned char*>(host), bytes, stream_->get()));
    return inputs_.back().data();
  }
  void* output(const TensorView& host, const std::string& name) override {
    outputs_.push_back({host, std::make_unique<gpu::GuardedDeviceOutput>(host, name, stream_->get())});
    return outputs_.back().device->data();
  }
  void* stream() override { return stream_->get(); }
  void finish() override {
    stream_->sync();
    MLAGATE_CUDA_CHECK(cudaGetLastError());
    for (const Output& o : outputs_) {
      const std::string v = o.device->check_guards(stream_->get());
      if (!v.empty()) throw OutOfBoundsWriteError(v);
    }
    for (const Output& o : outputs_) o.device->download_to(o.host, stream_->get());
  }

 private:
  struct Output {
    TensorView host;
    std::unique_ptr<gpu::GuardedDeviceOutput> device;
  };
  std::unique_ptr<gpu::Stream> stream_;
  std::vector<gpu::DeviceBuffer> inputs_;
  std::vector<Output> outputs_;
};

}  // namespace

std::unique_ptr<DeviceStage> make_cuda_stage(int device_id) { return std::make_unique<CudaStage>(device_id); }

}  // namespace mlagate::plugin
