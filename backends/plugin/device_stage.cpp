// The host stage (identity: plugins write into the harness's guarded buffers)
// and the choice of stage by device.
#include "backends/plugin/device_stage.h"

#include "backends/plugin/abi.h"
#include "cases/errors.h"
#include "mlagate/config.h"

namespace mlagate::plugin {

#if MLAGATE_HAS_CUDA
std::unique_ptr<DeviceStage> make_cuda_stage(int device_id);  // cuda_stage.cpp
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

std::unique_ptr<DeviceStage> make_device_stage(const DLDevice& device) {
  if (device.device_type == kDLCPU) return std::make_unique<HostStage>();
  if (device.device_type == kDLCUDA) {
#if MLAGATE_HAS_CUDA
    return make_cuda_stage(device.device_id);
#else
    throw DeviceUnavailableError("this mlagate was built without CUDA; the backend needs " + dl_device_str(device));
#endif
  }
  throw DeviceUnavailableError("device " + dl_device_str(device) + " is not supported");
}

}  // namespace mlagate::plugin
