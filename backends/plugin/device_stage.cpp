// The host stage (identity: plugins write into the harness's guarded buffers)
// and the choice of stage by device.
#include "backends/plugin/device_stage.h"

#include <cstdint>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <vector>

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
  void* checked_input(const void* host, std::size_t bytes, std::size_t elem_bytes, const std::string& name) override {
    Checked& c = checked_.emplace_back(Checked{host, std::vector<unsigned char>(bytes), elem_bytes, name});
    if (bytes) std::memcpy(c.copy.data(), host, bytes);
    return bytes ? c.copy.data() : nullptr;
  }
  void* output(const TensorView& host, const std::string&) override { return host.data; }
  void* stream() override { return nullptr; }
  void finish() override {
    for (const Checked& c : checked_) {
      const std::string v = input_change(c.name, c.host, c.copy.data(), c.copy.size(), c.elem_bytes);
      if (!v.empty()) throw WrongOutputError(v);
    }
  }

 private:
  struct Checked {
    const void* host;
    std::vector<unsigned char> copy;
    std::size_t elem_bytes;
    std::string name;
  };
  std::deque<Checked> checked_;  // deque: the copies' addresses stay put as it grows
};

}  // namespace

std::string input_change(const std::string& name, const void* was, const void* now, std::size_t bytes,
                         std::size_t elem_bytes) {
  if (bytes == 0 || std::memcmp(was, now, bytes) == 0) return "";
  const auto* a = static_cast<const unsigned char*>(was);
  const auto* b = static_cast<const unsigned char*>(now);
  std::size_t i = 0;
  while (a[i] == b[i]) ++i;
  const std::size_t e = elem_bytes ? elem_bytes : 1, first = i / e;
  std::size_t changed = 0;
  for (std::size_t k = 0; k < bytes / e; ++k) changed += std::memcmp(a + k * e, b + k * e, e) != 0;
  std::string what = "element " + std::to_string(first);
  if (e == 4) {  // the sparse ops' index rows, lengths and sinks are 4-byte elements
    std::int32_t x = 0, y = 0;
    std::memcpy(&x, a + first * 4, 4);
    std::memcpy(&y, b + first * 4, 4);
    what += " (" + std::to_string(x) + " -> " + std::to_string(y) + " as int32)";
  }
  return "run() wrote into its input " + name + ": " + std::to_string(changed) + " of " + std::to_string(bytes / e) +
         " elements changed, first " + what + "; inputs are read only (include/mlagate/plugin.h)";
}

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
