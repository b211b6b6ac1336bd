// The CUDA stage of plugin calls: inputs uploaded, outputs in guarded device
// buffers starting as the harness's poison, one stream per call; finish()
// synchronizes, checks the guards and downloads. Built only with CUDA.
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/plugin/device_stage.h"
#include "gpu/device.h"

namespace mlagate::plugin {

namespace {

class CudaStage final : public DeviceStage {
 public:
  CudaStage(int device_id, bool persistent) : persistent_(persistent) {
    gpu::require_device();
    int count = 0;
    MLAGATE_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (device_id < 0 || device_id >= count)
      throw DeviceUnavailableError("CUDA device " + std::to_string(device_id) + " not present (" + std::to_string(count) +
                                   " device(s))");
    MLAGATE_CUDA_CHECK(cudaSetDevice(device_id));
    stream_ = std::make_unique<gpu::Stream>();
  }
  ~CudaStage() override {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }
  void* input(const void* host, std::size_t bytes) override {
    if (next_input_ < inputs_.size()) {  // a persistent stage's next call: the same buffer, refreshed in place
      gpu::DeviceBuffer& d = inputs_[next_input_++];
      if (d.size() != bytes)
        throw std::invalid_argument("plugin graph: input " + std::to_string(next_input_ - 1) + " of " +
                                    std::to_string(bytes) + " bytes where " + std::to_string(d.size()) +
                                    " were captured");
      if (bytes) d.upload(host, bytes, stream_->get());
      return d.data();
    }
    inputs_.push_back(gpu::upload_array(static_cast<const unsigned char*>(host), bytes, stream_->get()));
    ++next_input_;
    return inputs_.back().data();
  }
  void* checked_input(const void* host, std::size_t bytes, std::size_t elem_bytes, const std::string& name) override {
    void* d = input(host, bytes);
    checked_.push_back({host, d, bytes, elem_bytes, name});
    return d;
  }
  void* output(const TensorView& host, const std::string& name) override {
    if (next_output_ < outputs_.size()) {  // kept as the last call left it
      Output& o = outputs_[next_output_++];
      o.host = host;
      return o.device->data();
    }
    outputs_.push_back({host, std::make_unique<gpu::GuardedDeviceOutput>(host, name, stream_->get())});
    ++next_output_;
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
    for (const Checked& c : checked_) {
      std::vector<unsigned char> now(c.bytes);
      if (c.bytes) MLAGATE_CUDA_CHECK(cudaMemcpy(now.data(), c.device, c.bytes, cudaMemcpyDeviceToHost));
      const std::string v = input_change(c.name, c.host, now.data(), c.bytes, c.elem_bytes);
      if (!v.empty()) throw WrongOutputError(v);
    }
    for (const Output& o : outputs_) o.device->download_to(o.host, stream_->get());
  }
  void rewind() override {
    if (!persistent_) DeviceStage::rewind();
    next_input_ = next_output_ = 0;
  }
  void capture(const std::function<void()>& launch) override {
    if (!persistent_) DeviceStage::capture(launch);
    stream_->sync();
    const cudaStream_t s = stream_->get();
    MLAGATE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    cudaGraph_t g = nullptr;
    try {
      launch();
    } catch (...) {
      cudaStreamEndCapture(s, &g);  // the stream leaves capture mode whatever happened
      if (g) cudaGraphDestroy(g);
      cudaGetLastError();
      throw;
    }
    const cudaError_t end = cudaStreamEndCapture(s, &g);
    if (end != cudaSuccess || g == nullptr) {
      if (g) cudaGraphDestroy(g);
      cudaGetLastError();
      throw std::runtime_error(std::string("the plugin's run() cannot be captured in a CUDA graph (") +
                               cudaGetErrorString(end) +
                               "): a capturable run() launches on args->stream only and never synchronizes");
    }
    graph_ = g;
    MLAGATE_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  void replay() override {
    if (!exec_) DeviceStage::replay();
    MLAGATE_CUDA_CHECK(cudaGraphLaunch(exec_, stream_->get()));
  }

 private:
  struct Checked {
    const void* host;
    void* device;
    std::size_t bytes, elem_bytes;
    std::string name;
  };
  std::vector<Checked> checked_;
  struct Output {
    TensorView host;
    std::unique_ptr<gpu::GuardedDeviceOutput> device;
  };
  bool persistent_;
  std::unique_ptr<gpu::Stream> stream_;
  std::vector<gpu::DeviceBuffer> inputs_;
  std::vector<Output> outputs_;
  std::size_t next_input_ = 0, next_output_ = 0;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace

std::unique_ptr<DeviceStage> make_cuda_stage(int device_id, bool persistent) {
  return std::make_unique<CudaStage>(device_id, persistent);
}

}  // namespace mlagate::plugin
