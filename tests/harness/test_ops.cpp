// The op modules (harness/run/ops/OPS.md): every op has one, and each judges
// its own op: a correct backend passes through it, the same backend with one
// output element planted wrong is INCORRECT, and a backend without the kernel
// is NOT_SUPPORTED. The test the "Add an op" guide says to copy.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <stdexcept>
#include <memory>
#include <string>

#include "backends/cpu/cpu_backends.h"
#include "cases/suite.h"
#include "cases/case.h"
#include "cases/paged_cache.h"
#include "harness/run/ops/cache_write/cache_write.h"
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


// A backend whose cache_write throws (the runner records CRASHED).
class ThrowingWriter final : public Backend {
 public:
  explicit ThrowingWriter(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return "throwing"; }
  std::string_view description() const override { return "cache_write throws"; }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  Support supports(const CaseSpec& spec, Op op) const override { return inner_->supports(spec, op); }
  void cache_write(PagedCache&, const TensorView&, const TensorView&, std::span<const std::int64_t>) override {
    throw std::runtime_error("planted");
  }

 private:
  std::unique_ptr<Backend> inner_;
};

// The cache_write check writes the reference's entries into the case's
// cache itself and puts them back (no second copy): the cache is the same
// bytes afterwards whether the backend was right, wrong or threw, and a
// wrong write gets the message a comparison with a whole expected copy
// gives. Every kv cache format (fp8_v4's split pages) and a huge pool.
TEST(OpModules, CacheWriteCheckLeavesTheCaseCacheAsItCame) {
  int checked = 0;
  for (const char* suite : {"smoke", "fp8", "v4", "layout"})
    for (const CaseSpec& spec : load_suite(suite).cases) {
      if (spec.sparse.active() || spec.merge.active() || checked >= 40) continue;
      auto cpu = make_cpu_paged();
      if (!cpu->supports(spec, Op::kCacheWrite).ok) continue;
      SCOPED_TRACE(spec.id());
      const Case c = generate_case(spec);
      const int bs = spec.block_size > 0 ? spec.block_size : 64;
      CacheOptions co;
      co.write_new_tokens = false;  // as the op's driver asks: the new slots hold poison until written
      PagedCache base = build_paged_cache(c, bs, co);
      const std::vector<std::byte> before(base.data.bytes(), base.data.bytes() + base.data.nbytes());
      auto unchanged = [&] { return std::memcmp(base.data.bytes(), before.data(), before.size()) == 0; };

      EXPECT_TRUE(check_cache_write(*cpu, c, base).identical);
      EXPECT_TRUE(unchanged()) << "after a correct write";

      Planted wrong(make_cpu_paged(), true);
      const CacheWriteCheck w = check_cache_write(wrong, c, base);
      EXPECT_FALSE(w.identical);
      EXPECT_TRUE(unchanged()) << "after a wrong write";
      // The message of the whole-copy comparison: the planted backend's cache
      // against a copy holding the reference writer's entries.
      const std::int64_t* sm = base.slot_mapping.data<std::int64_t>();
      std::vector<std::int64_t> slots;
      std::vector<std::int64_t> rows;
      for (int i = 0; i < c.num_requests; ++i)
        for (int u = 0; u < c.query_lens[i]; ++u)
          if (sm[c.query_start_loc[i] + u] >= 0)
            slots.push_back(sm[c.query_start_loc[i] + u]), rows.push_back(c.kv_start_loc[i] + c.context_lens[i] + u);
      const std::int64_t L = spec.dims.kv_lora_rank, R = spec.dims.rope_dim, n = static_cast<std::int64_t>(rows.size());
      Tensor kv(spec.dtype, {n, L}), pe(spec.dtype, {n, R});
      const std::size_t esz = dtype_size(spec.dtype);
      for (std::int64_t k = 0; k < n; ++k) {
        std::memcpy(kv.bytes() + k * L * esz, c.kv_c.bytes() + rows[k] * L * esz, L * esz);
        std::memcpy(pe.bytes() + k * R * esz, c.k_pe.bytes() + rows[k] * R * esz, R * esz);
      }
      PagedCache expected = base, got = base;
      reference_cache_write(expected, kv.view(), pe.view(), slots);
      wrong.cache_write(got, kv.view(), pe.view(), slots);
      EXPECT_EQ(w.message, first_cache_difference(got, expected, {sm, static_cast<std::size_t>(c.num_tokens)},
                                                  c.query_start_loc));

      ThrowingWriter thrower(make_cpu_paged());
      EXPECT_THROW(check_cache_write(thrower, c, base), std::runtime_error);
      EXPECT_TRUE(unchanged()) << "after a backend that threw";
      ++checked;
    }
  EXPECT_GE(checked, 20);
}

}  // namespace
}  // namespace mlagate
