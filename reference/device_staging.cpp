// The process-wide DeviceStaging (reference/device_staging.h).
#include "reference/device_staging.h"

#include <atomic>

namespace mlagate {
namespace {
std::atomic<const DeviceStaging*> g_staging{nullptr};
}  // namespace

void set_device_staging(const DeviceStaging* s) { g_staging.store(s); }
const DeviceStaging* device_staging() { return g_staging.load(); }

}  // namespace mlagate
