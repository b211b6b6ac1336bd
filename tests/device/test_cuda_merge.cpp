// GPU tests of cuda.merge (the merge_states op, vLLM's merge_attn_states):
// every case of the merge suite and the gate's merge cases pass against the
// fp64 reference (PASSED with metrics, none skipped), two runs give the same
// bits (no atomics), and bad arguments are refused on the host with the
// device usable afterwards. Without a GPU they are SKIPPED.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backends.h"
#include "cases/suite.h"
#include "harness/run/runner.h"
#include "reference/compare.h"
#include "tests/require_gpu.h"

namespace mlagate {
namespace {

std::vector<CaseSpec> merge_cases(const std::string& suite) {
  std::vector<CaseSpec> out;
  for (const CaseSpec& c : load_suite(suite).cases)
    if (c.merge.active()) out.push_back(c);
  return out;
}

class CudaMergeSuites : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaMergeSuites, EveryMergeCasePasses) {
  MLAGATE_REQUIRE_GPU();
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cuda_merge());
  RunConfig cfg;
  cfg.cases = merge_cases(GetParam());
  ASSERT_FALSE(cfg.cases.empty());
  cfg.ops = {Op::kMergeStates};
  cfg.policy = make_policy("baseline", 0, 0);
  const std::vector<Record> records = run_cases(cfg, bs);
  ASSERT_EQ(records.size(), cfg.cases.size());
  for (const Record& r : records) {
    EXPECT_EQ(r.status, Status::kPassed) << status_name(r.status) << " " << r.case_id << ": " << r.message;
    EXPECT_FALSE(r.metrics.empty()) << r.case_id;
  }
}

INSTANTIATE_TEST_SUITE_P(Suites, CudaMergeSuites, ::testing::Values("merge", "gate"));

TEST(CudaMerge, DeterministicAndRefusesBadShapes) {
  MLAGATE_REQUIRE_GPU();
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cuda_merge());
  RunConfig cfg;
  cfg.cases = merge_cases("gate");
  cfg.ops = {Op::kMergeStates};
  cfg.policy = make_policy("baseline", 0, 0);
  std::map<std::string, std::string> first;
  cfg.on_outputs = [&first](const Case& c, const Record&, std::span<const ProducedOutput> outs) {
    std::string bytes;
    for (const ProducedOutput& o : outs) {
      const TensorView v = o.buf.view();
      bytes.append(static_cast<const char*>(v.data), v.nbytes());
    }
    auto [it, fresh] = first.emplace(c.spec.id(), bytes);
    if (!fresh) {
      EXPECT_EQ(it->second, bytes) << c.spec.id() << ": two runs differ";
    }
  };
  run_cases(cfg, bs);
  run_cases(cfg, bs);
  EXPECT_EQ(first.size(), cfg.cases.size());

  // A wrong lse shape is refused on the host (std::invalid_argument), the device stays usable.
  Tensor po(DType::kBF16, {2, 3, 8}), so(DType::kBF16, {2, 3, 8}), out(DType::kBF16, {2, 3, 8});
  Tensor pl(DType::kF32, {3, 2}), sl(DType::kF32, {2, 3}), ol(DType::kF32, {2, 3});
  MergeStatesArgs a{po.view(), pl.view(), so.view(), sl.view(), out.view(), ol.view()};
  EXPECT_THROW(bs[0]->merge_states(a), std::invalid_argument);
  const std::vector<Record> again = run_cases(cfg, bs);
  for (const Record& r : again) EXPECT_EQ(r.status, Status::kPassed) << r.case_id << ": " << r.message;
}

}  // namespace
}  // namespace mlagate
