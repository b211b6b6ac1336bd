// A run's start and end around its workers: --reference cuda's device is
// checked by each worker while it makes its first case (or, in one process,
// before anything runs) and is an input error (exit 2, its own message)
// wherever it fails; the last workers are killed when their streams end but waited for
// only after the reports (IsolationOptions::reap_later), never left behind.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cerrno>
#include <fstream>

#include "cases/errors.h"
#include "cases/suite.h"
#include "harness/reliability/isolate.h"
#include "tests/reliability/run_mlagate.h"

namespace mlagate::rel_test {
namespace {

TEST(StartAndEnd, ReferenceDeviceIsAnInputErrorWhereverItIsChecked) {
  const fs::path d = temp_dir("device");
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"run", "--suite", "smoke", "--backend", "cpu.paged", "--reference", "cuda",
                                     "--no-progress", "-q", "--json", (d / "r.json").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    fs::remove(d / "r.json");
    return run_mlagate(args, d);
  };
  const int rc = run({});
  if (rc == 2) {
    // No usable device here: the workers' checks (one, two; the parent
    // makes no context), or this process's before anything runs.
    for (const std::vector<std::string>& extra :
         {std::vector<std::string>{}, {"--workers", "2"}, {"--isolate", "none"}}) {
      ASSERT_EQ(run(extra), 2) << slurp(d / "stderr.txt");
      EXPECT_NE(slurp(d / "stderr.txt").find("mlagate: error: --reference cuda: "), std::string::npos)
          << slurp(d / "stderr.txt");
      EXPECT_FALSE(fs::exists(d / "r.json"));  // no report: nothing ran
    }
    return;
  }
  // A device here: a worker given a device that does not exist fails its
  // own check, which is the run's input error.
  ASSERT_TRUE(rc == 0 || rc == 1) << rc << slurp(d / "stderr.txt");
  ASSERT_EQ(run({"--devices", "97"}), 2) << slurp(d / "stderr.txt");
  EXPECT_NE(slurp(d / "stderr.txt").find("--reference cuda: no CUDA device"), std::string::npos)
      << slurp(d / "stderr.txt");
}

// Whether this process has a child that ended and is not yet reaped (left
// unreaped), or no child at all.
enum class Children { kUnreaped, kNone, kRunning };
Children children() {
  siginfo_t info{};
  if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return errno == ECHILD ? Children::kNone : Children::kRunning;
  return info.si_pid != 0 ? Children::kUnreaped : Children::kRunning;
}

// How many children this process has now (every thread's, from /proc).
std::size_t live_children() {
  std::size_t n = 0;
  for (const auto& t : fs::directory_iterator("/proc/self/task")) {
    std::ifstream in(t.path() / "children");
    for (long pid = 0; in >> pid;) ++n;
  }
  return n;
}

TEST(StartAndEnd, LastWorkersAreKilledAtOnceAndReapedLater) {
  ASSERT_EQ(children(), Children::kNone);
  RunConfig cfg;
  cfg.cases = load_suite("smoke").cases;
  const std::vector<std::string> names = {"cpu.paged"};
  const std::vector<Job> jobs = {Job{0, 0, Op::kLayer}, Job{1, 0, Op::kLayer}};
  IsolationOptions io;
  io.argv = {kBin, "run", "--suite", "smoke", "--backend", "cpu.paged", "--worker"};
  int started = 0;
  io.after_start = [&started] { ++started; };
  for (const bool later : {false, true}) {
    io.reap_later = later;
    std::size_t seen = 0;
    const std::vector<Record> records = run_isolated(cfg, names, jobs, io, [&seen](const Record&) { ++seen; });
    ASSERT_EQ(records.size(), 2u);
    EXPECT_EQ(seen, 2u);
    for (const Record& r : records) EXPECT_EQ(r.status, Status::kPassed) << r.message;
    if (!later) {
      EXPECT_EQ(children(), Children::kNone);  // reaped before run_isolated returned
      continue;
    }
    // Killed, not waited for: a child is left until reap_retired_workers.
    for (int i = 0; i < 500 && children() == Children::kRunning; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(children(), Children::kUnreaped);
    reap_retired_workers();
    EXPECT_EQ(children(), Children::kNone);
  }
  EXPECT_EQ(started, 2);  // once per worker, before its first job
}

TEST(StartAndEnd, AnAfterStartFailureEndsTheRunBeforeAnyJob) {
  RunConfig cfg;
  cfg.cases = load_suite("smoke").cases;
  IsolationOptions io;
  io.argv = {kBin, "run", "--suite", "smoke", "--backend", "cpu.paged", "--worker"};
  io.after_start = [] { throw InputError("the device is not there"); };
  for (const std::size_t workers : {std::size_t{1}, std::size_t{2}}) {
    io.workers = workers;
    std::size_t seen = 0;
    const std::vector<Job> jobs = {Job{0, 0, Op::kLayer}, Job{1, 0, Op::kLayer}, Job{2, 0, Op::kLayer}};
    EXPECT_THROW(run_isolated(cfg, {"cpu.paged"}, jobs, io, [&seen](const Record&) { ++seen; }), InputError);
    EXPECT_EQ(seen, 0u);
    EXPECT_EQ(children(), Children::kNone);  // its workers ended and reaped
  }
}

// Workers started before the run (while the parent plans: prestart_workers)
// are the ones its streams run on: one a stream with a group to take, no
// more. rel.segv crashes unless its worker's environment names a case for its
// fault other than these: only the started ones get that, so a job run on a
// worker started later is CRASHED. What is never taken is ended with the
// pool, and reaped.
TEST(StartAndEnd, PrestartedWorkersAreTheOnesThatRun) {
  ASSERT_EQ(children(), Children::kNone);
  RunConfig cfg;
  cfg.cases = load_suite("smoke").cases;
  IsolationOptions io;
  io.argv = {kBin, "run", "--plugin", kPlugin, "--suite", "smoke", "--backend", "rel.segv", "--worker"};
  io.workers = 4;
  // Two input sets (two groups) whose layer op calls the decode kernel.
  const std::vector<Job> jobs = {Job{0, 0, Op::kLayer}, Job{3, 0, Op::kLayer}};
  auto statuses = [&](const IsolationOptions& opt) {
    std::vector<Status> st;
    for (const Record& r : run_isolated(cfg, {"rel.segv"}, jobs, opt, {})) st.push_back(r.status);
    return st;
  };
  const std::vector<Status> crashed = {Status::kCrashed, Status::kCrashed};
  ASSERT_EQ(statuses(io), crashed);  // the workers the run starts itself
  IsolationOptions spared = io;
  spared.env.push_back("MLAGATE_TEST_FAULT_ON=no such case");
  io.prestarted = prestart_workers(cfg, jobs, spared);
  ASSERT_NE(io.prestarted, nullptr);
  EXPECT_EQ(live_children(), 2u);  // 4 streams, 2 groups
  EXPECT_EQ(statuses(io), (std::vector<Status>{Status::kPassed, Status::kPassed}));
  // One stream may have taken both groups (the second ahead, before another
  // stream asked): the worker left is ended with the pool.
  io.prestarted.reset();
  reap_retired_workers();
  EXPECT_EQ(children(), Children::kNone);
  // A run that ends before its streams (a case its device cannot hold):
  // the pool's workers are ended with it and reaped later.
  io.prestarted = prestart_workers(cfg, jobs, spared);
  io.prestarted.reset();
  reap_retired_workers();
  EXPECT_EQ(children(), Children::kNone);
  // --order pairs starts a worker a job: none ahead.
  io.pairs = true;
  EXPECT_EQ(prestart_workers(cfg, jobs, io), nullptr);
}

}  // namespace
}  // namespace mlagate::rel_test
