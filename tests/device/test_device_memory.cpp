// The device memory estimate (harness/reliability/memory_estimate.h) against
// a real GPU. Representative cases (the vllm suite's largest, a V3.2 sparse
// and a V4 case) run in this process on every GPU backend of the build, with
// the GPU reference and the glue's up-projection and staging on the GPU, as a
// worker of `mlagate run --reference cuda` runs them. A first pass over them
// makes what a worker makes once (its kernels' modules loaded, the local
// memory they need, libtorch's handles); with every cache then released, what
// is held must be within a worker's overhead. Then each case runs again from
// released caches while a thread polls cudaMemGetInfo every millisecond: the
// peak above the usage before it must be within its estimate. Measured and
// estimated figures are printed. Also: the CLI refuses a case too big for the
// device before it runs. Run it alone on its device (other processes' memory
// counts in cudaMemGetInfo: its CTest entries are RUN_SERIAL). Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/cache_store.h"
#include "backends/registry.h"
#include "cases/suite.h"
#include "harness/cli/run_plan.h"
#include "harness/reliability/memory_estimate.h"
#include "harness/run/runner.h"
#include "mlagate/config.h"
#include "reference/cuda/cuda_reference.h"
#include "reference/device_staging.h"
#include "reference/glue.h"
#include "tests/cli_call.h"
#include "tests/require_gpu.h"
#if MLAGATE_HAS_TORCH_SDPA
#include "backends/torch/torch_backends.h"
#endif

namespace mlagate {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

std::uint64_t used_now() {
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return total - free;
}

// Every cache a worker keeps between cases, released: the device cache
// store, the staging's scratch slots, the projector's weights and chunks,
// libtorch's cached blocks.
void release_caches() {
  cudaDeviceSynchronize();
  gpu::DeviceCacheStore::instance().clear();
  cuda_device_staging()->release();
  cuda_release_row_projector();
#if MLAGATE_HAS_TORCH_SDPA
  torch_sdpa_release_cached_memory();
#endif
  cudaDeviceSynchronize();
}

// The highest device usage while `work` runs, sampled every millisecond.
std::uint64_t peak_while(const std::function<void()>& work) {
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> peak{used_now()};
  std::thread poll([&] {
    while (!done) {
      const std::uint64_t u = used_now();
      if (u > peak) peak = u;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  work();
  done = true;
  poll.join();
  return std::max<std::uint64_t>(peak, used_now());
}

// The GPU backends of this build: every in-tree one but the CPU ones.
std::vector<std::unique_ptr<Backend>> gpu_backends() {
  std::string globs;
  for (const BackendEntry& e : backend_registry())
    if (e.name.rfind("cpu.", 0) != 0) globs += (globs.empty() ? "" : ",") + e.name;
  return select_backends(globs);
}

CaseSpec find_case(const std::string& suite, const std::function<bool(const CaseSpec&)>& want) {
  for (const CaseSpec& c : load_suite(suite).cases)
    if (want(c)) return c;
  throw std::runtime_error("no such case in suite " + suite);
}

TEST(DeviceMemory, ThePeakOfEachCaseStaysWithinTheEstimate) {
  MLAGATE_REQUIRE_GPU();
  const RowProjectorScope projector(cuda_project_rows);            // the glue on the GPU, as --reference cuda
  const DeviceStagingScope staging(cuda_device_staging());
  std::vector<std::unique_ptr<Backend>> backends = gpu_backends();
  DeviceEstimateOptions opt;
  opt.torch = opt.device_inputs = false;
  std::string names;
  for (const auto& b : backends) {
    names += std::string(names.empty() ? "" : ", ") + std::string(b->name());
    opt.torch = opt.torch || b->name().rfind("torch.", 0) == 0;
    opt.device_inputs = opt.device_inputs || b->capabilities().device_inputs;
  }
  std::printf("backends: %s\n", names.c_str());
  const std::uint64_t at_start = used_now();
  auto vllm = [](const char* batch, int tp, KvCacheDtype kv) {
    return [=](const CaseSpec& c) { return c.batch.name == batch && c.tp == tp && c.kv_cache_dtype == kv; };
  };
  const std::vector<CaseSpec> cases = {
      find_case("vllm", vllm("large_prefill", 1, KvCacheDtype::kAuto)),
      find_case("vllm", vllm("large_prefill", 16, KvCacheDtype::kAuto)),
      find_case("vllm", vllm("large_decode", 1, KvCacheDtype::kAuto)),
      find_case("vllm", vllm("large_decode", 1, KvCacheDtype::kFp8)),
      // V3.2: 128 heads on one rank, topk 2048 (FlashMLA's h_q 128).
      find_case("sparse", [](const CaseSpec& c) { return c.tp == 1 && c.sparse.topk == 2048; }),
      // V4: the widest window with the C4A compressed cache, fp8_v4.
      find_case("v4", [](const CaseSpec& c) { return c.sparse.window == 4096; }),
  };
  auto run = [&](const CaseSpec& c) {
    RunConfig cfg;
    cfg.cases = {c};
    cfg.ops = resolve_ops({"auto"}, cfg.cases);
    cfg.policy = make_policy("baseline", 0, 0);
    cfg.reference = ReferenceImpl{"cuda", cuda_reference_absorbed, true, cuda_reference_mqa};
    return run_cases(cfg, backends);
  };
  // What a worker makes once, made: then, with every cache released, what
  // is left (the context, the kernels' modules and the local memory they
  // asked for, libtorch's handles and workspaces) is a worker's overhead.
  for (const CaseSpec& c : cases) run(c);
  release_caches();
  const std::uint64_t left = used_now();
  std::printf("a worker's own: %.2f GiB with the context alone, %.2f GiB once every case ran (caches released); "
              "counted: %.2f GiB\n",
              at_start / kGiB, left / kGiB, worker_device_overhead_bytes(opt.torch) / kGiB);
  EXPECT_LE(left, worker_device_overhead_bytes(opt.torch));
  for (const CaseSpec& c : cases) {
    SCOPED_TRACE(c.id());
    release_caches();
    const std::uint64_t before = used_now();
    std::vector<Record> records;
    const std::uint64_t peak = peak_while([&] { records = run(c); });
    const std::uint64_t measured = peak - std::min(peak, before);
    const std::uint64_t estimated = estimate_case_device_bytes(c, opt);
    int ran = 0;
    for (const Record& r : records) ran += r.status == Status::kPassed;
    std::printf("%-75s measured %6.2f GiB  estimated %6.2f GiB  (%3.0f%%)  %d of %zu records passed\n", c.id().c_str(),
                measured / kGiB, estimated / kGiB, 100.0 * measured / estimated, ran, records.size());
    std::fflush(stdout);
    EXPECT_GT(ran, 0) << "no GPU backend ran the case";
    EXPECT_LE(measured, estimated) << "measured " << measured / kGiB << " GiB, estimated " << estimated / kGiB << " GiB";
  }
}

// mlagate run refuses a case whose device estimate and one worker's overhead
// exceed the device's memory, with exit 2 and the figures, before it runs. A
// case beyond a whole H200 is beyond the host too (or an impossible case), so
// the device is planned smaller (--device-memory, a GPU shared with other
// work): vllm's large_prefill at TP 1 (4.6 GiB estimated with cuda.ref alone,
// 1 GiB its worker's) is refused in 4 GiB and runs in the whole device.
TEST(DeviceMemory, TheCliRefusesACaseTooBigForTheDevice) {
  MLAGATE_REQUIRE_GPU();
  const std::string id = "vllm/large_prefill/tp1/bf16/kv=auto/bs=auto/seed=0";
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"run", "--suite", "vllm", "--case", id, "--backend", "cuda.ref", "--reference",
                                  "cuda", "--no-progress", "-q", "--isolate", "none"};
    a.insert(a.end(), extra.begin(), extra.end());
    testing::internal::CaptureStderr();
    const int rc = test::cli(a);
    return std::pair{rc, testing::internal::GetCapturedStderr()};
  };
  const auto [rc, err] = run({"--device-memory", "4"});
  std::printf("%s", err.c_str());
  EXPECT_EQ(rc, kExitUsage) << err;
  EXPECT_NE(err.find("case " + id + " needs about "), std::string::npos) << err;
  EXPECT_NE(err.find(" GiB of device memory (estimated: "), std::string::npos) << err;
  EXPECT_NE(err.find("more than the 4.0 GiB of device 0 as --device-memory plans it: refused before running"),
            std::string::npos)
      << err;
  const auto [rc_whole, err_whole] = run({});
  EXPECT_EQ(rc_whole, 0) << err_whole;
}

}  // namespace
}  // namespace mlagate
