// The host stage (identity: plugins write into the harness's guarded buffers)
// and the choice of stage by device.
#include "backends/plugin/device_stage.h"

#include <stdexcept>

#include "backends/plugin/abi.h"
#include "cases/errors.h"
#include "mlagate/config.h"

namespace mlagate::plugin {

#if MLAGATE_HAS_CUDA
std::unique_ptr<DeviceStage> make_cuda_stage(int device_id, bool persistent);  // cuda_stage.cpp
#endif

namespace {

class HostStage final : public DeviceStage {
 public:
  void* input(const void* host, std::size_t) override { return const_cast<void*>(host); }
  void* output(const TensorView& host, const std::string&) override { return host.data; }
  void* stream() override { return nullptr; }
  void finish() override {}
};

}  // namespace

void DeviceStage::rewind() { throw std::logic_error("rewind() of a stage that is not persistent"); }
void DeviceStage::capture(const std::function<void()>&) {
  throw std::logic_error("capture() of a stage that is not a persistent CUDA stage");
}
void DeviceStage::replay() { throw std::logic_error("replay() of a stage that captured nothing"); }

std::unique_ptr<DeviceStage> make_device_stage(const DLDevice& device, bool persistent) {
  if (device.device_type == kDLCPU) return std::make_unique<HostStage>();
  if (device.device_type == kDLCUDA) {
#if MLAGATE_HAS_CUDA
    return make_cuda_stage(device.device_id, persistent);
#else
    throw DeviceUnavailableError("this mlagate was built without CUDA; the backend needs " + dl_device_str(device));
#endif
  }
  throw DeviceUnavailableError("device " + dl_device_str(device) + " is not supported");
}

}  // namespace mlagate::plugin
