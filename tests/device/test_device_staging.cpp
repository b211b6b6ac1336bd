// The GPU's DeviceStaging (reference/cuda/device_staging.cpp) under the layer
// op: the torch.sdpa.* backends, which read prefill inputs in device memory,
// give the same records (status and every metric, bit for bit) whether the
// glue lends them K and V on the device or on the host, and the device path is
// the one taken (uploads made, and more scratch copies lent than uploads: the
// backends after the first took the kept copies); and the same records again
// when K and V are made on the device (the staging's project, as --reference
// cuda sets it): no upload from the host at all.
// Skips without a GPU or without the torch.sdpa.* backends in this build.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "cases/suite.h"
#include "cases/errors.h"
#include "harness/run/runner.h"
#include "reference/cuda/cuda_reference.h"
#include "reference/device_staging.h"
#include "tests/require_gpu.h"

namespace mlagate {
namespace {

int g_uploads = 0, g_lent = 0;
std::shared_ptr<void> counting_upload(const void* host, std::size_t bytes) {
  ++g_uploads;
  return cuda_device_staging()->upload(host, bytes);
}
void* counting_to_scratch(int slot, const void* src, std::size_t bytes, bool on_device) {
  ++g_lent;
  return cuda_device_staging()->to_scratch(slot, src, bytes, on_device);
}
void counting_release() { cuda_device_staging()->release(); }
const DeviceStaging kCounting{counting_upload, counting_to_scratch, counting_release};
int g_projected = 0;
std::pair<std::shared_ptr<void>, std::shared_ptr<void>> counting_project(const Case& c, const TensorView& kv,
                                                                         const TensorView& pe) {
  ++g_projected;
  return cuda_device_staging()->project(c, kv, pe);
}
// The GPU staging as --reference cuda sets it: K and V made on the device.
const DeviceStaging kCountingProjecting{counting_upload, counting_to_scratch, counting_release, counting_project};

// Equal, or both NaN (a metric an output does not have).
bool same(double a, double b) { return std::isnan(a) ? std::isnan(b) : a == b; }

// The torch.sdpa.* backends' records under the host path and under `staging`.
void expect_same_records_with(const DeviceStaging& staging) {
  MLAGATE_REQUIRE_GPU();
  std::vector<std::unique_ptr<Backend>> backends;
  try {
    backends = select_backends("torch.sdpa.*");
  } catch (const InputError&) {  // a pattern that matches nothing is refused: none built here
  }
  if (backends.empty()) GTEST_SKIP() << "this build has no torch.sdpa.* backends (libtorch >= 2)";
  RunConfig cfg;
  for (const char* batch : {"mixed_small", "medium_prefill", "single_prefill"})
    for (int tp : {1, 16})
      for (KvCacheDtype kv : {KvCacheDtype::kAuto, KvCacheDtype::kFp8}) {
        CaseSpec s;
        s.batch = find_batch_spec(batch);
        s.tp = tp;
        s.kv_cache_dtype = kv;
        cfg.cases.push_back(s);
      }
  cfg.policy = make_policy("baseline", 0, 0);
  cfg.exec.prefill_chunk = 256;  // medium_prefill's context in several chunks
  const std::vector<Record> host = run_cases(cfg, backends);
  g_uploads = g_lent = g_projected = 0;
  std::vector<Record> device;
  {
    const DeviceStagingScope scope(&staging);
    device = run_cases(cfg, backends);
  }
  ASSERT_EQ(host.size(), device.size());
  int ran = 0;
  for (std::size_t i = 0; i < host.size(); ++i) {
    const Record& a = host[i];
    const Record& b = device[i];
    SCOPED_TRACE(a.case_id + " " + a.backend);
    ASSERT_EQ(a.backend, b.backend);
    EXPECT_EQ(a.status, b.status) << b.message;
    ran += a.status == Status::kPassed;
    ASSERT_EQ(a.metrics.size(), b.metrics.size());
    for (std::size_t k = 0; k < a.metrics.size(); ++k) {
      const std::string& what = a.metrics[k].output;
      EXPECT_TRUE(same(a.metrics[k].max_abs, b.metrics[k].max_abs)) << what << " " << a.metrics[k].max_abs;
      EXPECT_TRUE(same(a.metrics[k].nmse, b.metrics[k].nmse)) << what << " " << a.metrics[k].nmse;
      EXPECT_TRUE(same(a.metrics[k].err_baseline, b.metrics[k].err_baseline))
          << what << " " << a.metrics[k].err_baseline << " vs " << b.metrics[k].err_baseline;
    }
  }
  EXPECT_GT(ran, 0);
}

TEST(CudaStaging, TorchBackendsGiveTheSameRecordsFromDeviceInputs) {
  expect_same_records_with(kCounting);
  if (HasFatalFailure() || IsSkipped()) return;
  EXPECT_GT(g_uploads, 0);
  // More lending than uploading: the backends after the first took kept copies.
  EXPECT_GT(g_lent, g_uploads);
  EXPECT_EQ(g_projected, 0);
}

TEST(CudaStaging, TorchBackendsGiveTheSameRecordsFromKAndVMadeOnTheDevice) {
  expect_same_records_with(kCountingProjecting);
  if (HasFatalFailure() || IsSkipped()) return;
  EXPECT_GT(g_projected, 0);
  EXPECT_EQ(g_uploads, 0);  // no K and V went up from the host
  EXPECT_GT(g_lent, 2 * g_projected);  // the backends after the first took kept copies
}

}  // namespace
}  // namespace mlagate
