// --devices on a machine without GPUs: the device is only an environment
// variable to a worker, so a CPU run shows what the flag does: each device gets
// its own workers, started with CUDA_VISIBLE_DEVICES set to it, every case on
// one of them, and the records are those of a one-device run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

#include "cases/block_pool.h"
#include "harness/reliability/isolate.h"
#include "mlagate/config.h"
#include "tests/reliability/run_mlagate.h"

namespace mlagate::rel_test {
namespace {

// What a record says, less what differs between runs by nature (timings, the
// exec backend's scratch paths in its messages).
std::map<std::pair<std::string, std::string>, std::string> verdicts(const fs::path& json) {
  std::map<std::pair<std::string, std::string>, std::string> v;
  for (const auto& [key, r] : records_of(json)) {
    std::string what = r.at("op").get<std::string>() + " " + r.at("status").get<std::string>();
    if (key.first != "exec.0")
      for (const Json& m : r.at("metrics")) what += " " + m.at("output").get<std::string>() + "=" + m.at("max_abs").dump();
    v[key] = what;
  }
  return v;
}

TEST(Devices, OneWorkerStreamPerDeviceAndTheRecordsOfOneDevice) {
  const fs::path d = temp_dir("devices");
  const fs::path log = d / "visible.log";
  // An exec backend that notes the device its worker was given, then fails
  // (`:` takes the bundle and outputs paths the exec backend requires and ignores them).
  const std::string exec = "echo \"$CUDA_VISIBLE_DEVICES\" >> '" + log.string() + "'; : {in} {out}; exit 3";
  auto run = [&](const std::string& json, std::vector<std::string> extra) {
    std::vector<std::string> a = {"run", "--suite", "smoke", "--backend", "cpu.paged,exec.0", "--exec", exec,
                                  "--no-progress", "-q", "--json", (d / json).string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return run_mlagate(a, d);
  };
  ASSERT_EQ(run("one.json", {}), 1) << slurp(d / "stderr.txt");
  fs::remove(log);
  ASSERT_EQ(run("two.json", {"--devices", "0,1"}), 1) << slurp(d / "stderr.txt");
  const auto one = verdicts(d / "one.json"), two = verdicts(d / "two.json");
  EXPECT_EQ(one, two);
  EXPECT_EQ(one.size(), 14u);  // smoke's 7 cases on 2 backends
  std::set<std::string> seen;
  std::istringstream lines(slurp(log));
  for (std::string l; std::getline(lines, l);) seen.insert(l);
  EXPECT_EQ(seen, (std::set<std::string>{"0", "1"}));
  // A device twice, one that is not a number, or no workers to put on them.
  EXPECT_EQ(run("bad.json", {"--devices", "0,0"}), 2);
  EXPECT_EQ(run("bad.json", {"--devices", "gpu0"}), 2);
  EXPECT_EQ(run("bad.json", {"--devices", "0,1", "--isolate", "none"}), 2);
}

// `--workers auto` of a GPU run, one device or several.
TEST(Devices, AutoWorkersADevice) {
  struct Want {
    std::size_t cpus, devices, workers;
  };
  for (const Want& w : {
           // One GPU: one worker per 2 cores, 1 to 8.
           Want{2, 1, 1}, Want{8, 1, 4}, Want{16, 1, 8}, Want{32, 1, 8}, Want{128, 1, 8},
           // Several: the same in all up to 16, never fewer than one per 4
           // cores in all, at most 8 a device.
           Want{32, 2, 8}, Want{16, 2, 4}, Want{64, 4, 4}, Want{64, 2, 8}, Want{128, 8, 4}, Want{256, 8, 8},
           Want{4, 8, 1}, Want{0, 0, 1}})
    EXPECT_EQ(auto_workers_per_device(w.cpus, w.devices), w.workers) << w.cpus << " cores, " << w.devices << " devices";
}

// explore's rounds: a worker a core (at most 8) on the CPU, half of run's
// auto a device on the GPU.
TEST(Devices, ExploreWorkersADevice) {
  EXPECT_EQ(explore_workers_per_device(false, 2, 1), 2u);
  EXPECT_EQ(explore_workers_per_device(false, 64, 1), 8u);
  EXPECT_EQ(explore_workers_per_device(false, 0, 1), 1u);
  EXPECT_EQ(explore_workers_per_device(true, 16, 1), 4u);  // run's 8 on one H200's 16 cores
  EXPECT_EQ(explore_workers_per_device(true, 2, 1), 1u);
  EXPECT_EQ(explore_workers_per_device(true, 32, 2), 4u);
  EXPECT_EQ(explore_workers_per_device(true, 128, 8), 2u);
}

// A worker's share of the cores: cores / (workers - 1) where about one
// worker at a time waits on its GPU, cores / workers where every backend runs
// on the host (a CPU backend's call computes too).
TEST(Devices, HostOnlyWorkersShareTheCoresEvenly) {
  auto threads = [](std::size_t workers, bool host_only) {
    IsolationOptions io;
    io.workers = workers;
    io.argv = {"mlagate", "run", "--worker"};
    share_cores(io, 0, host_only);
    const auto at = std::find(io.argv.begin(), io.argv.end(), "--threads");
    return at == io.argv.end() ? std::size_t{0} : static_cast<std::size_t>(std::stoul(*(at + 1)));
  };
  const std::size_t cpus = host_cpus();
  EXPECT_EQ(threads(2, true), std::max<std::size_t>(1, cpus / 2));
  EXPECT_EQ(threads(2, false), std::max<std::size_t>(1, cpus));
  EXPECT_EQ(threads(3, true), std::max<std::size_t>(1, cpus / 3));
  EXPECT_EQ(threads(3, false), std::max<std::size_t>(1, cpus / 2));
  EXPECT_EQ(threads(1, true), 0u);  // one worker: its threads are the run's own
}

// Each worker's block pool keeps its share of half the memory
// (cases/block_pool.h), set in its environment unless the user's sets it:
// the default's 736 MB on the 2-core VM left a TP 1 prefill's 2.7 GB of keys
// and values to be zeroed again case after case.
TEST(Devices, EachWorkerKeepsItsShareOfTheMemoryInItsBlockPool) {
  const char* kVar = kBlockPoolVariable;
  const bool had = std::getenv(kVar) != nullptr;
  const std::string saved = had ? std::getenv(kVar) : "";
  ::unsetenv(kVar);
  auto pool_mb = [&](std::size_t workers) -> std::string {
    IsolationOptions io;
    io.workers = workers;
    io.argv = {"mlagate", "run", "--worker"};
    share_cores(io, 0, true);
    const std::string key = std::string(kVar) + "=";
    for (const std::string& e : io.env)
      if (e.rfind(key, 0) == 0) return e.substr(key.size());
    return "unset";
  };
  EXPECT_EQ(pool_mb(2), std::to_string(block_pool_share(2) >> 20));
  EXPECT_EQ(pool_mb(1), std::to_string(block_pool_share(1) >> 20)) << "one worker keeps its share too";
  ::setenv(kVar, "123", 1);
  EXPECT_EQ(pool_mb(2), "unset") << "the user's setting is the workers' (inherited), not replaced";
  if (had) ::setenv(kVar, saved.c_str(), 1); else ::unsetenv(kVar);

  // The share: half the memory between the processes, at most 8 GiB
  // each, never below the default (a 32nd, at most 2 GiB).
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const std::size_t phys = static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
  const std::size_t fallback = std::min(phys / 32, std::size_t{2} << 30);
  for (std::size_t n : {1u, 2u, 3u, 16u, 64u, 1000u}) {
    EXPECT_EQ(block_pool_share(n), std::max(fallback, std::min(phys / 2 / n, std::size_t{8} << 30))) << n;
    EXPECT_LE(block_pool_share(n), std::max(fallback, std::size_t{8} << 30)) << n;
  }
  EXPECT_GE(block_pool_share(1), block_pool_share(2));
  EXPECT_EQ(block_pool_share(0), block_pool_share(1));
}

// Workers side by side never spin idle OpenMP threads, also with a --threads
// of the user's (OMP_WAIT_POLICY=passive in their environment unless set):
// spinning teams made a 2-GPU run 3.5x slower.
TEST(Devices, WorkersSideBySideSleepWhenIdleWithAnyThreadCount) {
  // The test presets set OMP_WAIT_POLICY=passive for every test (tests side by
  // side share the cores); unset here, the workers' passive must be the run's.
  struct Unset {
    const char* name;
    std::string saved;
    bool had;
    explicit Unset(const char* n) : name(n), had(std::getenv(n) != nullptr) {
      if (had) saved = std::getenv(n);
      ::unsetenv(n);
    }
    ~Unset() {
      if (had) ::setenv(name, saved.c_str(), 1);
    }
  } omp("OMP_WAIT_POLICY"), malloc_tunables("GLIBC_TUNABLES"), pool(kBlockPoolVariable);
  const fs::path d = temp_dir("devices_omp");
  const fs::path log = d / "policy.log";
  const std::string exec =
      "s=0; [ -d \"$MLAGATE_DEVICE_START_SLOTS\" ] && s=1; p=0; [ \"$MLAGATE_BLOCK_POOL_MB\" -gt 0 ] && p=1; "
      "echo \"[$OMP_WAIT_POLICY][$GLIBC_TUNABLES][$s][$p]\" >> '" +
      log.string() + "'; : {in} {out}; exit 3";
  for (const std::vector<std::string>& extra : std::vector<std::vector<std::string>>{
           {"--workers", "2", "--threads", "1"}, {"--devices", "0,1", "--threads", "2"}, {"--workers", "2"}}) {
    fs::remove(log);
    std::vector<std::string> a = {"run", "--suite", "smoke", "--backend", "exec.0", "--exec", exec, "--op", "decode",
                                  "--no-progress", "-q"};
    a.insert(a.end(), extra.begin(), extra.end());
    ASSERT_EQ(run_mlagate(a, d), 1) << slurp(d / "stderr.txt");
    std::istringstream lines(slurp(log));
    int n = 0;
    // And glibc's malloc takes huge pages for their large buffers (fewer page
    // faults), and with CUDA built the workers start it in the run's slots
    // (cases/process_slot.h), a folder that exists while they run.
    const std::string slots = MLAGATE_HAS_CUDA ? "[1]" : "[0]";
    for (std::string l; std::getline(lines, l); ++n)
      EXPECT_EQ(l, "[passive][glibc.malloc.hugetlb=1]" + slots + "[1]") << extra[0] << " " << extra[1];
    EXPECT_GT(n, 0) << extra[0];
  }
}

// --profile with several workers: the rows sum to the wall whether the
// workers run one per device, several per device, or several on one (the
// "side_by_side" row takes off the worker time that ran beside another's;
// with one worker per device it was missing, and "unaccounted" went negative).
TEST(Devices, ProfileRowsSumToTheWallWithDevicesAndWorkers) {
  const fs::path d = temp_dir("devices_profile");
  for (const std::vector<std::string>& extra : std::vector<std::vector<std::string>>{
           {"--devices", "0,1"}, {"--devices", "0,1", "--workers", "2"}, {"--workers", "2"}}) {
    std::vector<std::string> a = {"run", "--suite", "smoke", "--backend", "cpu.paged", "--op", "decode",
                                  "--no-progress", "-q", "--profile", "--json", (d / "p.json").string()};
    a.insert(a.end(), extra.begin(), extra.end());
    ASSERT_EQ(run_mlagate(a, d), 0) << slurp(d / "stderr.txt");
    const Json p = Json::parse(slurp(d / "p.json")).at("profile");
    const double wall = p.at("wall_ms").get<double>();
    double named = 0, side = 0, unaccounted = 0;
    for (const auto& [name, ms] : p.at("phases_ms").items()) {
      if (name == "unaccounted") unaccounted = ms.get<double>();
      else named += ms.get<double>();
      if (name == "side_by_side") side = ms.get<double>();
    }
    EXPECT_NEAR(named + unaccounted, wall, 1e-6 * wall + 1e-3) << extra[1];
    // Nothing the rows miss beyond the parent's own bookkeeping between phases.
    EXPECT_LT(std::abs(unaccounted), 0.10 * wall) << extra[1] << ": unaccounted " << unaccounted << " of " << wall;
    EXPECT_LT(side, 0.0) << extra[1] << ": workers side by side, so some of their time overlapped";
    EXPECT_GE(p.at("workers_side_by_side").get<int>(), 2) << extra[1];
  }
}

}  // namespace
}  // namespace mlagate::rel_test
