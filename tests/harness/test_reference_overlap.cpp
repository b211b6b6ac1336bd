// A reference on the device (--reference cuda) runs on another thread while
// the runner emulates the model-dtype baseline (runner.cpp,
// overlap_reference_and_baseline): the records are the same bits as when the
// two follow each other, the reference is computed once per case, and a
// reference that throws gives the record it gave before. The "device"
// reference here is the Eigen one, noting the thread it was called on.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backends.h"
#include "cases/suite.h"
#include "harness/run/runner.h"
#include "reference/fp64_reference.h"

namespace mlagate {
namespace {

std::atomic<int> g_on_caller{0}, g_elsewhere{0};
std::thread::id g_caller;

ReferenceOutputs noting_reference(const Case& c) {
  ++(std::this_thread::get_id() == g_caller ? g_on_caller : g_elsewhere);
  return reference_absorbed(c);
}

RunConfig config(const char* batch) {
  RunConfig cfg;
  CaseSpec s;
  s.batch = find_batch_spec(batch);
  s.tp = 16;
  cfg.cases = {s};
  cfg.policy = make_policy("baseline", 0, 0);  // err_baseline in every record
  return cfg;
}

// cpu.paged (decode and prefill forms) and cpu.splitkv (every request a decode).
std::vector<std::unique_ptr<Backend>> backends() {
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cpu_paged());
  bs.push_back(make_cpu_splitkv());
  return bs;
}

void expect_same_records(const std::vector<Record>& want, const std::vector<Record>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(got[i].backend);
    EXPECT_EQ(want[i].status, got[i].status) << got[i].message;
    EXPECT_EQ(want[i].message, got[i].message);
    ASSERT_EQ(want[i].metrics.size(), got[i].metrics.size());
    for (std::size_t k = 0; k < want[i].metrics.size(); ++k) {
      const Metrics& a = want[i].metrics[k];
      const Metrics& b = got[i].metrics[k];
      EXPECT_EQ(a.max_abs, b.max_abs) << a.output;
      EXPECT_EQ(a.nmse, b.nmse) << a.output;
      EXPECT_EQ(a.err_baseline, b.err_baseline) << a.output;
    }
  }
}

TEST(ReferenceOverlap, ADeviceReferenceRunsBesideTheEmulationWithTheSameBits) {
  for (const char* batch : {"mixed_small", "small_prefill", "small_decode"}) {
    SCOPED_TRACE(batch);
    RunConfig cfg = config(batch);
    auto bs = backends();
    const std::vector<Record> want = run_cases(cfg, bs);
    ASSERT_EQ(want.size(), 2u);
    for (const Record& r : want) ASSERT_EQ(r.status, Status::kPassed) << r.backend << ": " << r.message;

    g_caller = std::this_thread::get_id();
    for (const bool on_device : {true, false}) {
      g_on_caller = 0, g_elsewhere = 0;
      cfg.reference.name = "test-device";
      cfg.reference.absorbed = noting_reference;
      cfg.reference.on_device = on_device;
      auto bs2 = backends();
      expect_same_records(want, run_cases(cfg, bs2));
      // Once per case, on another thread only when it is on a device.
      EXPECT_EQ(g_elsewhere.load(), on_device ? 1 : 0);
      EXPECT_EQ(g_on_caller.load(), on_device ? 0 : 1);
    }
  }
}

TEST(ReferenceOverlap, WithoutTheBaselineTheReferenceStaysOnTheCaller) {
  RunConfig cfg = config("mixed_small");
  cfg.policy = make_policy("fixed", 1e-2, 1e-2);
  cfg.baseline.always = false;
  cfg.reference.absorbed = noting_reference;
  cfg.reference.on_device = true;
  g_caller = std::this_thread::get_id();
  g_on_caller = 0, g_elsewhere = 0;
  auto bs = backends();
  const std::vector<Record> got = run_cases(cfg, bs);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(g_elsewhere.load(), 0);  // nothing to overlap with
  EXPECT_EQ(g_on_caller.load(), 1);
}

TEST(ReferenceOverlap, AReferenceThatThrowsGivesTheRecordItGaveBefore) {
  std::vector<Record> seen[2];
  for (const bool on_device : {false, true}) {
    RunConfig cfg = config("mixed_small");
    cfg.reference.absorbed = [](const Case&) -> ReferenceOutputs { throw std::runtime_error("device lost"); };
    cfg.reference.on_device = on_device;
    auto bs = backends();
    seen[on_device] = run_cases(cfg, bs);
  }
  ASSERT_EQ(seen[0].size(), 2u);
  EXPECT_NE(seen[0][0].message.find("device lost"), std::string::npos) << seen[0][0].message;
  expect_same_records(seen[0], seen[1]);
}

}  // namespace
}  // namespace mlagate
