// The op modules (harness/run/ops/OPS.md): every op has one, and each judges
// its own op: a correct backend passes through it, the same backend with one
// output element planted wrong is INCORRECT, and a backend without the kernel
// is NOT_SUPPORTED. The test the "Add an op" guide says to copy.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "backends/cpu/cpu_backends.h"
#include "cases/suite.h"
#include "harness/run/ops/driver.h"
#include "harness/run/runner.h"

namespace mlagate {
namespace {

// A backend with `inner`'s kernels and, when `plant`, its first output
// element of every call moved by one (the smallest bug a module must see).
class Planted final : public Backend {
 public:
  Planted(std::unique_ptr<Backend> inner, bool plant) : inner_(std::move(inner)), plant_(plant) {
    name_ = std::string(inner_->name()) + (plant ? ".planted" : "");
  }
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return "a CPU backend, one output element planted wrong"; }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  Support supports(const CaseSpec& spec, Op op) const override { return inner_->supports(spec, op); }
  void decode(const DecodeArgs& a) override { inner_->decode(a), plant(a.o_lat); }
  void prefill(const PrefillArgs& a) override { inner_->prefill(a), plant(a.o); }
  void sparse_decode(const SparseDecodeArgs& a) override { inner_->sparse_decode(a), plant(a.o); }
  void sparse_prefill(const SparsePrefillArgs& a) override { inner_->sparse_prefill(a), plant(a.o); }
  void merge_states(const MergeStatesArgs& a) override { inner_->merge_states(a), plant(a.output); }
  void cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                   std::span<const std::int64_t> slots) override {
    inner_->cache_write(cache, kv_c, k_pe, slots);
    if (plant_ && !slots.empty()) cache.entry(slots[0])[0] ^= std::byte{1};
  }

 private:
  void plant(const TensorView& out) const {
    if (plant_ && out.numel() > 0) out.set(0, out.get(0) + 1.0);
  }
  std::unique_ptr<Backend> inner_;
  bool plant_;
  std::string name_;
};

struct OpCase {
  Op op;
  const char* suite;
  std::function<std::unique_ptr<Backend>()> make;
};

// The suite's first n cases, of those `b` declares it takes for `op` (all, without b).
std::vector<CaseSpec> first_cases(const char* suite, std::size_t n, const Backend* b = nullptr, Op op = Op::kLayer) {
  std::vector<CaseSpec> out;
  for (const CaseSpec& c : load_suite(suite).cases)
    if (out.size() < n && (!b || b->supports(c, op).ok)) out.push_back(c);
  return out;
}

TEST(OpModules, EveryOpHasItsModule) {
  for (const Op op : all_ops()) EXPECT_EQ(op_driver(op).op(), op) << op_name(op);
  EXPECT_EQ(op_drivers().size(), all_ops().size());
}

TEST(OpModules, EachModuleJudgesItsOp) {
  const std::vector<OpCase> ops = {
      {Op::kLayer, "smoke", make_cpu_paged},           {Op::kDecode, "smoke", make_cpu_paged},
      {Op::kPrefill, "smoke", make_cpu_paged},         {Op::kCacheWrite, "smoke", make_cpu_paged},
      {Op::kSparseDecode, "sparse", make_cpu_sparse},  {Op::kSparsePrefill, "sparse", make_cpu_sparse},
      {Op::kMergeStates, "merge", make_cpu_merge},
  };
  for (const OpCase& oc : ops) {
    SCOPED_TRACE(std::string(op_name(oc.op)));
    RunConfig cfg;
    cfg.cases = first_cases(oc.suite, 2, oc.make().get(), oc.op);
    ASSERT_EQ(cfg.cases.size(), 2u) << "the suite has too few cases the backend takes";
    cfg.ops = {oc.op};
    cfg.policy = make_policy("baseline", 0, 0);
    std::vector<std::unique_ptr<Backend>> bs;
    bs.push_back(std::make_unique<Planted>(oc.make(), false));
    bs.push_back(std::make_unique<Planted>(oc.make(), true));
    const std::vector<Record> rs = run_cases(cfg, bs);
    ASSERT_EQ(rs.size(), cfg.cases.size() * 2);
    int passed = 0, caught = 0;
    for (const Record& r : rs) {
      const bool planted = r.backend.ends_with(".planted");
      if (!planted) EXPECT_EQ(r.status, Status::kPassed) << r.case_id << ": " << r.message;
      passed += !planted && r.status == Status::kPassed;
      caught += planted && r.status == Status::kIncorrect;
    }
    EXPECT_EQ(passed, static_cast<int>(cfg.cases.size()));
    EXPECT_EQ(caught, static_cast<int>(cfg.cases.size()));
  }
}

TEST(OpModules, AnOpTheBackendLacksIsNotSupported) {
  RunConfig cfg;
  cfg.cases = first_cases("smoke", 1);
  cfg.ops = {Op::kSparseDecode, Op::kMergeStates};
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cpu_paged());
  for (const Record& r : run_cases(cfg, bs)) EXPECT_EQ(r.status, Status::kNotSupported) << r.op << ": " << r.message;
}

}  // namespace
}  // namespace mlagate
