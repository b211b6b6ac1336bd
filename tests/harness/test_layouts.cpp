// Memory layouts through the runner (cases/LAYOUTS.md): the correct CPU
// backends pass the layout suite; each planted layout bug passes every case
// but the layout that exposes it and fails that one on >= 3 records; a backend
// that declares no strided views and a 2 GiB pool is never handed either.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backends.h"
#include "cases/suite.h"
#include "harness/run/runner.h"
#include "harness/run/serving.h"
#include "tests/backends/planted.h"

namespace mlagate {
namespace {

std::vector<Record> run_layout_suite(std::vector<std::unique_ptr<Backend>>& bs, std::vector<Op> ops) {
  RunConfig cfg;
  cfg.cases = load_suite("layout").cases;
  cfg.ops = std::move(ops);
  cfg.policy = make_policy("baseline", 0, 0);
  return run_cases(cfg, bs);
}

TEST(Layouts, CorrectCpuBackendsPassTheLayoutSuite) {
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cpu_paged());
  bs.push_back(make_cpu_splitkv());
  bs.push_back(make_cpu_sparse());
  std::map<std::string, int> passed;  // per layout
  for (const Record& r : run_layout_suite(bs, {Op::kDecode, Op::kLayer, Op::kCacheWrite, Op::kSparseDecode})) {
    SCOPED_TRACE(r.case_id + " " + r.backend + " " + r.op);
    EXPECT_FALSE(status_is_failure(r.status)) << status_name(r.status) << ": " << r.message;
    if (r.status == Status::kPassed) ++passed[r.case_id.substr(r.case_id.find("/layout=") + 8)];
  }
  for (const char* l : {"strided", "shared", "pool2g", "pool4g", "strided+shared+pool4g"})
    EXPECT_GE(passed[l], 8) << l << ": too few records passed to say the layout works";
}

TEST(Layouts, EachPlantedBugFailsOnlyTheLayoutThatExposesIt) {
  std::vector<std::unique_ptr<Backend>> bs;
  for (const PlantedBug& b : planted_layout_bugs()) bs.push_back(b.make());
  ASSERT_EQ(bs.size(), 4u);
  RunConfig cfg;
  // The contiguous twins of the layout suite's dense cases, and the suite itself.
  for (const CaseSpec& c : load_suite("layout").cases) {
    if (c.sparse.active() || c.tp != 16) continue;  // TP 16 keeps it short; the TP 1 group is in the test above
    CaseSpec plain = c;
    plain.layout = {};
    cfg.cases.push_back(plain);
    cfg.cases.push_back(c);
  }
  cfg.ops = {Op::kDecode, Op::kLayer};
  cfg.policy = make_policy("baseline", 0, 0);
  std::map<std::string, int> failures;
  for (const Record& r : run_cases(cfg, bs)) {
    const PlantedBug* bug = nullptr;
    for (const PlantedBug& b : planted_layout_bugs())
      if (b.name == r.backend) bug = &b;
    ASSERT_NE(bug, nullptr);
    CaseSpec spec;
    for (const CaseSpec& c : cfg.cases)
      if (c.id() == r.case_id) spec = c;
    SCOPED_TRACE(r.case_id + " " + r.backend + " " + r.op);
    if (!bug->exposed_by(spec)) {
      EXPECT_FALSE(status_is_failure(r.status)) << status_name(r.status) << ": " << r.message;
    } else if (status_is_failure(r.status)) {
      ++failures[r.backend];
      // A shifted page can be a poisoned one (NONFINITE): the same bug.
      EXPECT_TRUE(r.status == bug->expected || (r.backend == "bug.blocks_not_shared" && r.status == Status::kNonfinite))
          << status_name(r.status);
    }
  }
  for (const PlantedBug& b : planted_layout_bugs()) {
    EXPECT_GE(failures[b.name], 3) << b.name;
    std::printf("%-24s fails %d records of the layout suite, passes every other\n", b.name.c_str(), failures[b.name]);
  }
}

// `run --suite gate` catches each on >= 3 records (the gate's layout group;
// every other gate case is contiguous, where each bug is exact: the test above).
TEST(Layouts, TheGateCatchesEachPlantedBugOnThreeRecords) {
  std::vector<std::unique_ptr<Backend>> bs;
  for (const PlantedBug& b : planted_layout_bugs()) bs.push_back(b.make());
  RunConfig cfg;
  for (const CaseSpec& c : load_suite("gate").cases)
    if (!c.layout.contiguous()) cfg.cases.push_back(c);
  ASSERT_FALSE(cfg.cases.empty());
  cfg.policy = make_policy("baseline", 0, 0);  // the gate's default ops and policy
  std::map<std::string, int> failures;
  for (const Record& r : run_cases(cfg, bs))
    if (status_is_failure(r.status)) ++failures[r.backend];
  for (const PlantedBug& b : planted_layout_bugs()) {
    EXPECT_GE(failures[b.name], 3) << b.name;
    std::printf("%-24s gate: fails %d of its %zu layout records\n", b.name.c_str(), failures[b.name], cfg.cases.size());
  }
}

// cpu.paged with a contiguous-only, 2 GiB declaration, recording the views its decode gets.
class ContiguousOnly final : public Backend {
 public:
  std::string_view name() const override { return "contiguous_only"; }
  std::string_view description() const override { return "cpu.paged declaring no strided views and a 2 GiB pool"; }
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    c.strided_views = false;
    c.max_pool_bytes = std::int64_t{1} << 31;
    return c;
  }
  void decode(const DecodeArgs& a) override {
    strided_seen = strided_seen || !a.q_lat.strides.empty() || !a.q_pe.strides.empty() || !a.o_lat.strides.empty() ||
                   !a.lse.strides.empty();
    inner_->decode(a);
  }
  void prefill(const PrefillArgs& a) override { inner_->prefill(a); }
  bool strided_seen = false;

 private:
  std::unique_ptr<Backend> inner_ = make_cpu_paged();
};

TEST(Layouts, ABackendIsHandedOnlyTheLayoutsItDeclares) {
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(std::make_unique<ContiguousOnly>());
  auto* b = static_cast<ContiguousOnly*>(bs.front().get());
  RunConfig cfg;
  CaseSpec s;
  s.batch = {"two", {64, 80}, {1, 1}};
  s.total_heads = 8;
  for (const char* l : {"strided", "pool2g", "pool4g", "shared"}) {
    s.layout = parse_layout(l);
    cfg.cases.push_back(s);
  }
  cfg.ops = {Op::kDecode, Op::kLayer};
  std::map<std::string, std::string> got;
  for (const Record& r : run_cases(cfg, bs))
    got[r.op + " " + r.case_id.substr(r.case_id.find("/layout=") + 8)] =
        std::string(status_name(r.status)) + " " + r.message;
  EXPECT_NE(got["decode strided"].find("NOT_SUPPORTED layout strided: the decode kernel takes contiguous tensors only"),
            std::string::npos) << got["decode strided"];
  for (const char* op : {"decode", "layer"})
    for (const char* l : {"pool2g", "pool4g"})
      EXPECT_NE(got[std::string(op) + " " + l].find("the backend addresses pools of at most 2147483648 bytes"), std::string::npos)
          << op << " " << l << ": " << got[std::string(op) + " " + l];
  // The layer op runs the strided layout's stacked cache with contiguous views for this backend.
  EXPECT_EQ(got["layer strided"].substr(0, 6), "PASSED") << got["layer strided"];
  EXPECT_EQ(got["decode shared"].substr(0, 6), "PASSED") << "shared pages need no declaration";
  EXPECT_FALSE(b->strided_seen) << "a strided view reached a backend that declares none";
}

// The serving modes' persistent buffers and steps place no layout: a layout
// case is NOT_SUPPORTED there, with the reason (a graph's persistent copy of a
// 4 GiB pool would be 4 GiB of memory), and its contiguous twin runs.
TEST(Layouts, ServingModesRunTheContiguousLayoutOnly) {
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cpu_paged());
  RunConfig cfg;
  CaseSpec s;
  s.batch = {"two", {64, 80}, {1, 1}};
  s.total_heads = 8;
  cfg.cases.push_back(s);
  s.layout = parse_layout("pool4g");
  cfg.cases.push_back(s);
  cfg.ops = {Op::kDecode};
  const ServingMode mode = modes::DecodeLoop{2};
  cfg.run_job = [&cfg, &mode](CaseContext& ctx, Backend& b, Op op) { return run_serving(ctx, b, op, cfg, mode); };
  const std::vector<Record> rs = run_cases(cfg, bs);
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].status, Status::kPassed) << rs[0].message;
  EXPECT_EQ(rs[1].status, Status::kNotSupported);
  EXPECT_EQ(rs[1].message, "serving mode steps=2 runs the contiguous layout only (this case's: pool4g)");
}

}  // namespace
}  // namespace mlagate
