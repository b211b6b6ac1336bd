// Device memory of workers side by side (RELIABILITY.md, "Memory"): the
// per-case device estimate grows with what a case puts on the GPU, the queue
// keeps each device's groups within its memory (and only its own: another
// device's streams are not held up), and a case too big for its device alone
// is refused with a message naming the case, the estimate and the device. The
// estimate against a real GPU's peak is tests/device/test_device_memory.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "cases/errors.h"
#include "cases/suite.h"
#include "harness/reliability/isolate.h"
#include "harness/reliability/memory_estimate.h"
#include "tests/reliability/drain_queue.h"

namespace mlagate {
namespace {

constexpr std::uint64_t kGiB = 1ull << 30;

CaseSpec dense(const std::string& batch, int tp) {
  CaseSpec s;
  s.batch = find_batch_spec(batch);
  s.tp = tp;
  return s;
}

TEST(DeviceMemory, TheEstimateGrowsWithContextHeadsAndTokens) {
  const CaseSpec base = dense("medium_decode", 16);
  const std::uint64_t e = estimate_case_device_bytes(base);
  CaseSpec longer = base;  // context
  for (int& s : longer.batch.seq_lens) s *= 8;
  CaseSpec heads = base;  // heads
  heads.tp = 1;
  CaseSpec tokens = base;  // query tokens (within each request's length)
  for (int& q : tokens.batch.query_lens) q = 64;
  for (const CaseSpec* c : {&longer, &heads, &tokens}) EXPECT_GT(estimate_case_device_bytes(*c), e) << c->id();
  // Each grows without bound: 64x the context is far more than 8x.
  CaseSpec longest = base;
  for (int& s : longest.batch.seq_lens) s *= 512;
  EXPECT_GT(estimate_case_device_bytes(longest) - e, 8 * (estimate_case_device_bytes(longer) - e));
  // What the run adds: the prefill op's K and V, forced splits, libtorch's
  // reserve and the staged prefill inputs each cost more, never less.
  const CaseSpec prefill = dense("mixed_medium", 1);  // decodes and prefills
  DeviceEstimateOptions lean;
  lean.torch = lean.device_inputs = false;
  const std::uint64_t p = estimate_case_device_bytes(prefill, lean);
  DeviceEstimateOptions o = lean;
  o.prefill_op = true;
  EXPECT_GT(estimate_case_device_bytes(prefill, o), p);
  o = lean;
  o.forced_splits = 64;
  EXPECT_GT(estimate_case_device_bytes(prefill, o), p);
  o = lean;
  o.torch = true;
  EXPECT_GT(estimate_case_device_bytes(prefill, o), p);
  o = lean;
  o.device_inputs = true;
  EXPECT_GT(estimate_case_device_bytes(prefill, o), p);
  EXPECT_GT(estimate_case_device_bytes(prefill), p);  // the defaults assume the most
  // Sparse cases grow with their index width and context too.
  CaseSpec sparse = load_suite("sparse").cases.front();  // sparse_decode_4k, topk 2048
  ASSERT_TRUE(sparse.sparse.active());
  sparse.sparse.topk = 64;
  CaseSpec wider = sparse;
  wider.sparse.topk = 2048;
  EXPECT_GT(estimate_case_device_bytes(wider), estimate_case_device_bytes(sparse));
  // A worker's own memory: its context, more with libtorch.
  EXPECT_GT(worker_device_overhead_bytes(true), worker_device_overhead_bytes(false));
  EXPECT_GT(worker_device_overhead_bytes(false), 0u);
}

// Every built-in case fits an 80 GB H100 with the worker's overhead, with
// room for a few side by side (so the budget is not the estimate being silly).
TEST(DeviceMemory, BuiltinSuitesFitOnOneH100) {
  const std::uint64_t h100 = 79ull * kGiB;  // about what an H100 80GB reports
  for (const char* name : {"smoke", "edges", "vllm", "fp8", "gate", "sparse", "v4", "merge"})
    for (const CaseSpec& c : load_suite(name).cases) {
      const std::uint64_t need = estimate_case_device_bytes(c) + worker_device_overhead_bytes(true);
      EXPECT_LT(need, h100 / 2) << c.id() << ": " << need / double(kGiB) << " GiB";
    }
}

std::vector<std::vector<Job>> groups_of(std::size_t n) {
  std::vector<std::vector<Job>> g;
  for (std::size_t k = 0; k < n; ++k) g.push_back({Job{k, 0, Op::kLayer}});
  return g;
}

// Streams 0 and 2 on device 0, 1 and 3 on device 1 (--devices 0,1 --workers 2).
DeviceBudget two_devices(std::vector<std::uint64_t> group_bytes, std::uint64_t memory = 10,
                         std::uint64_t per_worker = 1) {
  DeviceBudget b;
  b.stream_device = {0, 1, 0, 1};
  b.memory = {memory, memory};
  b.group_bytes = std::move(group_bytes);
  b.per_worker = per_worker;
  return b;
}

// A group taken ahead (its worker makes the first case while the current
// group's last one runs) holds its device bytes beside the current group's,
// on its stream's device only, and is never taken where both do not fit.
TEST(DeviceMemory, AGroupTakenAheadHoldsItsDeviceBytesToo) {
  GroupQueue q(groups_of(4), {1, 1, 1, 1}, 0, 4, two_devices({4, 6, 3, 2}));
  EXPECT_EQ(q.try_take(0), 0u);                  // device 0: 4 + 1
  EXPECT_EQ(q.try_take_ahead(0), std::nullopt);  // 4 + 6 + 1 > 10, even alone
  EXPECT_EQ(q.try_take(1), 1u);                  // device 1: 6 + 1
  EXPECT_EQ(q.try_take_ahead(0), 2u);            // device 0: 4 + 3 + 1
  EXPECT_EQ(q.try_take(2), std::nullopt);        // 2 + 1 beside 8 > 10: the group ahead counts
  q.advance(0);                                  // stream 0 runs the 3: its worker keeps the larger, 4
  EXPECT_EQ(q.try_take(2), 3u);                  // 2 + 1 beside 4 + 1 fits
}

TEST(DeviceMemory, EachDeviceKeepsItsGroupsWithinItsMemory) {
  // Device bytes 4, 6, 3, 8 (+1 a worker) on devices of 10; no host budget.
  GroupQueue q(groups_of(4), {1, 1, 1, 1}, 0, 4, two_devices({4, 6, 3, 8}));
  EXPECT_EQ(q.try_take(0), 0u);            // device 0: 4 + 1
  EXPECT_EQ(q.try_take(2), std::nullopt);  // device 0: 6 + 1 beside 5 > 10, waits...
  EXPECT_EQ(q.try_take(1), 1u);            // ...but device 1 is not held up: its stream takes the 6
  EXPECT_EQ(q.try_take(3), std::nullopt);  // device 1: 3 + 1 beside 7 > 10
  EXPECT_EQ(q.try_take(2), 2u);            // device 0: 3 + 1 beside 5 fits
  EXPECT_EQ(q.try_take(3), std::nullopt);  // order kept: the 8 fits nowhere beside others, nothing overtakes it
  q.release(1);                            // device 1 empty
  EXPECT_EQ(q.try_take(3), 3u);            // alone on its device the 8 runs
  EXPECT_EQ(q.try_take(1), std::nullopt);  // none left
  // Alone on its device a group always runs, however large.
  GroupQueue big(groups_of(2), {1, 1}, 0, 4, two_devices({50, 50}));
  EXPECT_EQ(big.try_take(0), 0u);
  EXPECT_EQ(big.try_take(2), std::nullopt);  // not beside it
  EXPECT_EQ(big.try_take(3), 1u);            // the other device, alone
  // The host budget still applies across devices.
  GroupQueue host(groups_of(2), {6, 6}, 10, 4, two_devices({1, 1}));
  EXPECT_EQ(host.try_take(0), 0u);
  EXPECT_EQ(host.try_take(1), std::nullopt);  // another device, but 6 + 6 host bytes > 10
  // A device of unknown memory (0) has no budget.
  DeviceBudget unknown = two_devices({8, 8, 8});
  unknown.memory = {0, 0};
  GroupQueue free(groups_of(3), {1, 1, 1}, 0, 4, unknown);
  EXPECT_EQ(free.try_take(0), 0u);
  EXPECT_EQ(free.try_take(2), 1u);
  EXPECT_EQ(free.try_take(1), 2u);
}

// A worker keeps what its largest group left on the device (caches, scratch,
// libtorch's blocks): its stream holds that until the worker ends.
TEST(DeviceMemory, AStreamHoldsItsWorkersLargestGroupUntilTheWorkerEnds) {
  GroupQueue q(groups_of(4), {1, 1, 1, 1}, 0, 4, two_devices({7, 1, 2, 2}));
  EXPECT_EQ(q.try_take(0), 0u);            // 7 + 1
  EXPECT_EQ(q.try_take(0), 1u);            // the same worker goes on: it still holds 7
  EXPECT_EQ(q.try_take(2), std::nullopt);  // 2 + 1 beside 8 > 10
  q.release(0);                            // its worker ended
  EXPECT_EQ(q.try_take(2), 2u);
  EXPECT_EQ(q.try_take(0), 3u);            // a new worker: 2 + 1 beside 3 fits
}

// Streams that wait for device memory give theirs up first (their worker
// ends), so streams of one device never wait for each other in a circle.
TEST(DeviceMemory, WaitingStreamsOfOneDeviceNeverWaitForEachOther) {
  GroupQueue q(groups_of(3), {0, 0, 0}, 0, 4, two_devices({5, 3, 9}));
  // Device 0's streams: 5 and 3 side by side, then the 9 only once one of
  // them has let its group go (its worker ended) and the other is done.
  const test::Drained d = test::drain_with_two_streams(q, 0, 2, 3);
  EXPECT_EQ(d.taken, 3);
  EXPECT_GE(d.ended, 1);
}

TEST(DeviceMemory, ACaseTooBigForItsDeviceIsRefusedBeforeItRuns) {
  const std::vector<CaseSpec> cases = {dense("small_decode", 16), dense("large_prefill", 1)};
  std::vector<std::uint64_t> bytes;
  for (const CaseSpec& c : cases) bytes.push_back(estimate_case_device_bytes(c));
  ASSERT_LT(bytes[0], bytes[1]);
  const std::uint64_t worker = worker_device_overhead_bytes(false);
  // A device that holds both: nothing refused, neither without a known size.
  EXPECT_NO_THROW(refuse_cases_beyond_device(cases, bytes, worker, bytes[1] + worker, "device 0"));
  EXPECT_NO_THROW(refuse_cases_beyond_device(cases, bytes, worker, 0, "device 0"));
  // One that holds the small case with its worker but not the large one.
  const std::uint64_t device = bytes[1] + worker - 1;
  try {
    refuse_cases_beyond_device(cases, bytes, worker, device, "device 3");
    FAIL() << "not refused";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("case " + cases[1].id() + " needs about ", 0), 0u) << m;
    EXPECT_NE(m.find("GiB of device memory (estimated: "), std::string::npos) << m;
    char figures[120];
    std::snprintf(figures, sizeof figures,
                  "%.1f GiB for the case, %.1f GiB for its worker), more than the %.1f GiB of device 3",
                  bytes[1] / double(kGiB), worker / double(kGiB), device / double(kGiB));
    EXPECT_NE(m.find(figures), std::string::npos) << m;
    EXPECT_NE(m.find("refused before running"), std::string::npos) << m;
  }
  // The small case alone passes there.
  EXPECT_NO_THROW(refuse_cases_beyond_device({cases[0]}, {bytes[0]}, worker, device, "device 3"));
  // The worker's own memory counts: the case alone fits, with its worker it does not.
  EXPECT_THROW(refuse_cases_beyond_device({cases[0]}, {bytes[0]}, worker, bytes[0] + worker / 2, "device 0"),
               InputError);
}

// A run of several ops estimates each case in the ops it takes (CaseSpec::ops):
// explore's rounds run a decode case beside prefill cases, and a decode case
// estimated with the prefill op's up-projected keys (more than double here)
// refused whole rounds on a machine it fits.
TEST(DeviceMemory, EachCaseIsEstimatedInTheOpsItTakes) {
  CaseSpec c = dense("large_decode", 1);
  const std::uint64_t decode = estimate_case_bytes(c, false), prefill = estimate_case_bytes(c, true);
  ASSERT_LT(decode, prefill);
  const std::vector<Op> both = {Op::kDecode, Op::kPrefill};
  c.ops = {Op::kDecode};
  EXPECT_FALSE(runs_prefill_op(c, both));
  EXPECT_NO_THROW(refuse_cases_beyond_host({c}, both, decode));
  c.ops = {Op::kPrefill};
  EXPECT_TRUE(runs_prefill_op(c, both));
  EXPECT_FALSE(runs_prefill_op(c, {Op::kDecode}));
  EXPECT_THROW(refuse_cases_beyond_host({c}, both, decode), InputError);
  c.ops.clear();  // every op of the run
  EXPECT_THROW(refuse_cases_beyond_host({c}, both, decode), InputError);
  EXPECT_NO_THROW(refuse_cases_beyond_host({c}, {Op::kDecode}, decode));
}

TEST(DeviceMemory, TheHostRefusalIsUnchanged) {
  const std::vector<CaseSpec> cases = {dense("large_prefill", 1)};
  const std::uint64_t need = estimate_case_bytes(cases[0], false);
  EXPECT_NO_THROW(refuse_cases_beyond_host(cases, {Op::kLayer}, need));
  EXPECT_NO_THROW(refuse_cases_beyond_host(cases, {Op::kLayer}, 0));
  try {
    refuse_cases_beyond_host(cases, {Op::kLayer}, need - 1);
    FAIL() << "not refused";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(" GiB (estimated), more than the "), std::string::npos) << m;
    EXPECT_NE(m.find(" GiB available: refused before allocating"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace mlagate
