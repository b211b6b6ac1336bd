// The merge_states op (vLLM's merge_attn_states; SPEC: Ops, merge_states):
// merge cases (parsing, validation, deterministic bits), the fp64 reference
// on every pair of infinities and past fp32 exp's range, the layer glue on the
// same core, cpu.merge passing every merge case, the planted merge bugs caught
// by the merge suite and the gate (and passing the ordinary rows), golden
// files of merge cases (export, run --golden, results files, compare), and
// `mlagate shrink` taking a planted bug's merge case down to one row (its
// bundle replaying the failure).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backends.h"
#include "cases/case.h"
#include "cases/errors.h"
#include "cases/merge.h"
#include "cases/suite.h"
#include "harness/reliability/repeat.h"
#include "harness/reliability/shrink.h"
#include "harness/run/ops/layer/layer.h"
#include "harness/run/runner.h"
#include "reference/compare.h"
#include "reference/glue.h"
#include "reference/merge_reference.h"
#include "tests/backends/planted.h"
#include "tests/cli_call.h"

namespace mlagate {
namespace {

namespace fs = std::filesystem;
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<CaseSpec> merge_cases_of(const std::string& suite) {
  std::vector<CaseSpec> out;
  for (const CaseSpec& c : load_suite(suite).cases)
    if (c.merge.active()) out.push_back(c);
  return out;
}

TEST(MergeCases, TheSuiteCoversEveryPatternDtypeGapAndDim) {
  const std::vector<CaseSpec> cases = merge_cases_of("merge");
  ASSERT_EQ(cases.size(), load_suite("merge").cases.size());
  std::set<std::string> patterns, dtypes, ids;
  std::set<double> gaps;
  std::set<int> dims;
  for (const CaseSpec& c : cases) {
    patterns.insert(std::string(lse_pattern_name(c.merge.lse)));
    dtypes.insert(std::string(dtype_short(c.dtype)));
    gaps.insert(c.merge.gap);
    dims.insert(c.merge.head_dim);
    ids.insert(c.id());
    EXPECT_EQ(c.num_requests(), 1);
  }
  EXPECT_EQ(patterns.size(), 8u);
  EXPECT_EQ(dtypes, (std::set<std::string>{"bf16", "fp16", "f32"}));
  EXPECT_EQ(gaps, (std::set<double>{0, 30, 80, 200}));
  EXPECT_EQ(dims, (std::set<int>{128, 512, 576}));
  EXPECT_EQ(ids.size(), cases.size());
  EXPECT_GE(merge_cases_of("gate").size(), 5u);
  // The suite file a shrink writes reads back as the same cases.
  EXPECT_NO_THROW(cases_as_suite_yaml({cases.front(), cases.back()}, "merge"));
}

TEST(MergeCases, ValidationAndParsing) {
  CaseSpec dense;
  dense.batch = find_batch_spec("small_decode");
  dense.dtype = DType::kF32;
  EXPECT_THROW(dense.validate(), InvalidCase);  // fp32 is a merge case's output dtype only
  dense.dtype = DType::kBF16;
  dense.merge.lse = LsePattern::kMixed;
  EXPECT_THROW(dense.validate(), InvalidCase);  // a pattern without a merge case
  CaseSpec m = merge_cases_of("merge").front();
  m.kv_cache_dtype = KvCacheDtype::kFp8;
  EXPECT_THROW(m.validate(), InvalidCase);
  EXPECT_THROW(parse_suite_yaml("name: x\ngroups:\n  - tokens: [3]\n", "x.yaml"), InputError);
  EXPECT_THROW(parse_suite_yaml("name: x\ngroups:\n  - specs: [small_decode]\n    lse: [mixed]\n", "x.yaml"), InputError);
  EXPECT_THROW(parse_suite_yaml("name: x\ngroups:\n  - tokens: [3]\n    head_dim: [8]\n    lse: [nan]\n", "x.yaml"), InputError);
  const Suite s = parse_suite_yaml("name: x\ngroups:\n  - tokens: [3]\n    head_dim: [8]\n    dtype: [fp32]\n    lse: [both_pinf]\n"
                                   "    lse_gap: [80]\n",
                                   "x.yaml");
  ASSERT_EQ(s.cases.size(), 1u);
  EXPECT_EQ(s.cases[0].id(), "x/t3/tp1/f32/kv=auto/bs=auto/seed=0/merge=d8/lse=both_pinf/gap=80");
}

// Same seed, same bits: twice in one process, and pinned (a change of any
// generated bit must bump gen::kGeneratorVersion).
TEST(MergeCases, DeterministicBits) {
  const Suite s = parse_suite_yaml("name: x\ngroups:\n  - tokens: [7]\n    total_heads: [16]\n    head_dim: [128]\n"
                                   "    lse: [mixed]\n    lse_gap: [0, 80]\n",
                                   "x.yaml");
  ASSERT_EQ(s.cases.size(), 2u);
  std::vector<std::uint64_t> prints;
  for (const CaseSpec& spec : s.cases) {
    const Case a = generate_case(spec), b = generate_case(spec);
    std::uint64_t h = 0;
    for (const Tensor* t : {&a.merge->prefix_output, &a.merge->prefix_lse, &a.merge->suffix_output, &a.merge->suffix_lse})
      h = h * 1000003u ^ fingerprint(*t);
    EXPECT_EQ(fingerprint(a.merge->prefix_output), fingerprint(b.merge->prefix_output));
    EXPECT_EQ(fingerprint(a.merge->suffix_lse), fingerprint(b.merge->suffix_lse));
    prints.push_back(h);
    // Every kind of row is drawn in a mixed case of 112 rows.
    std::map<LsePattern, int> kinds;
    for (std::int64_t r = 0; r < 7 * 16; ++r) ++kinds[merge_row_kind(spec, r)];
    EXPECT_EQ(kinds.size(), 7u);
  }
  EXPECT_EQ(prints[0], 2510469803652921836ull);
  EXPECT_EQ(prints[1], 3577836841704064391ull);
}

// Rows built by hand: every pair of infinities, a gap past fp32 exp's range
// and equal large lses.
TEST(MergeReference, InfinitiesAndLargeGaps) {
  struct Row {
    float lp, ls;
    double want_lse;  // NaN: compute log(exp(lp) + exp(ls)) below
    int want;         // 0: zero output, 1: prefix, 2: suffix, 3: the mean of both
  };
  const std::vector<Row> rows = {
      {-kInf, 1.5f, 1.5, 2},     {2.f, -kInf, 2.0, 1},       {kInf, 0.25f, 0.25, 2},     {3.f, kInf, 3.0, 1},
      {-kInf, -kInf, -INFINITY, 0}, {kInf, kInf, -INFINITY, 0}, {kInf, -kInf, -INFINITY, 0}, {1000.f, 1000.f, 1000 + std::log(2.0), 3},
      {0.f, 200.f, NAN, 2},      {-90.f, 0.f, NAN, 2},
  };
  const std::int64_t R = static_cast<std::int64_t>(rows.size()), D = 3;
  MergeInputs in;
  in.prefix_output = Tensor(DType::kF32, {R, 1, D});
  in.suffix_output = Tensor(DType::kF32, {R, 1, D});
  in.prefix_lse = Tensor(DType::kF32, {R, 1});
  in.suffix_lse = Tensor(DType::kF32, {R, 1});
  for (std::int64_t r = 0; r < R; ++r) {
    in.prefix_lse.data<float>()[r] = rows[r].lp;
    in.suffix_lse.data<float>()[r] = rows[r].ls;
    for (std::int64_t x = 0; x < D; ++x) {
      // An empty side holds NaN here: its values must never be read.
      in.prefix_output.data<float>()[r * D + x] = std::isinf(rows[r].lp) ? NAN : 1.f + x;
      in.suffix_output.data<float>()[r * D + x] = std::isinf(rows[r].ls) ? NAN : -2.f - x;
    }
  }
  const MergeReference ref = reference_merge(in);
  for (std::int64_t r = 0; r < R; ++r) {
    SCOPED_TRACE(r);
    const Row& w = rows[r];
    const double lse = std::isnan(w.want_lse) ? std::max<double>(w.lp, w.ls) + std::log1p(std::exp(-std::fabs(double(w.lp) - w.ls)))
                                              : w.want_lse;
    if (std::isinf(lse))
      EXPECT_EQ(ref.lse[r], lse);
    else
      EXPECT_NEAR(ref.lse[r], lse, 1e-12 * std::max(1.0, std::fabs(lse)));
    for (std::int64_t x = 0; x < D; ++x) {
      const double p = 1.0 + x, s = -2.0 - x;
      const double want = w.want == 0 ? 0.0 : w.want == 1 ? p : w.want == 2 ? s : (p + s) / 2;
      const double got = ref.out[r * D + x];
      ASSERT_TRUE(std::isfinite(got));
      // The smaller side's weight: exp(-200) or exp(-90), far below the tolerance.
      EXPECT_NEAR(got, want, 1e-12) << x;
    }
  }
  // fp32 gives the same answers where exp underflows: no NaN, no overflow.
  const MergeReference f = fp32_merge(in), g = fp32_merge(in, true);
  for (std::int64_t r = 0; r < R; ++r) {
    EXPECT_FALSE(std::isnan(f.lse[r])) << r;
    EXPECT_FALSE(std::isnan(g.lse[r])) << r;
    for (std::int64_t x = 0; x < D; ++x) EXPECT_NEAR(f.out[r * D + x], ref.out[r * D + x], 1e-5) << r;
  }
}

// The layer glue's merge is the reference's core in fp32: the same bits as
// fp32_merge on an fp32 merge case.
TEST(MergeReference, LayerGlueUsesTheSameCore) {
  const Suite s = parse_suite_yaml("name: x\ngroups:\n  - tokens: [5]\n    total_heads: [4]\n    head_dim: [32]\n"
                                   "    lse: [mixed]\n    dtype: [fp32]\n",
                                   "x.yaml");
  const Case c = generate_case(s.cases.at(0));
  const MergeInputs& in = *c.merge;
  std::vector<float> acc(in.prefix_output.data<float>(), in.prefix_output.data<float>() + in.prefix_output.numel());
  std::vector<float> acc_lse(in.prefix_lse.data<float>(), in.prefix_lse.data<float>() + in.prefix_lse.numel());
  merge_states(acc, acc_lse, in.suffix_output.view(), in.suffix_lse.view(), 5, 4, 32);
  const MergeReference f = fp32_merge(in);
  for (std::size_t i = 0; i < acc.size(); ++i) ASSERT_EQ(static_cast<double>(acc[i]), f.out[i]) << i;
  for (std::size_t i = 0; i < acc_lse.size(); ++i) ASSERT_EQ(static_cast<double>(acc_lse[i]), f.lse[i]) << i;
}

std::vector<Record> run_merge(std::vector<std::unique_ptr<Backend>>& bs, std::vector<CaseSpec> cases, int repeat) {
  RunConfig cfg;
  cfg.cases = std::move(cases);
  cfg.ops = {Op::kMergeStates};
  cfg.policy = make_policy("baseline", 0, 0);
  if (repeat > 1)
    cfg.run_job = [&cfg, repeat](CaseContext& ctx, Backend& b, Op op) { return run_repeated(ctx, b, op, cfg, repeat); };
  return run_cases(cfg, bs);
}

TEST(CpuMerge, PassesEveryMergeCase) {
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cpu_merge());
  for (const char* suite : {"merge", "gate"}) {
    const std::vector<CaseSpec> cases = merge_cases_of(suite);
    const std::vector<Record> records = run_merge(bs, cases, 1);
    ASSERT_EQ(records.size(), cases.size());
    for (const Record& r : records) {
      EXPECT_EQ(r.status, Status::kPassed) << status_name(r.status) << " " << r.case_id << ": " << r.message;
      EXPECT_EQ(r.metrics.size(), 2u) << r.case_id;
    }
  }
  // A dense case is not a merge case, and a merge case runs no attention op.
  const Backend& b = *bs[0];
  CaseSpec dense;
  dense.batch = find_batch_spec("small_decode");
  EXPECT_FALSE(b.supports(dense, Op::kMergeStates).ok);
  EXPECT_FALSE(make_cpu_paged()->supports(merge_cases_of("merge").front(), Op::kLayer).ok);
}

TEST(PlantedMerge, CaughtByTheMergeSuiteAndTheGate) {
  constexpr int kGateMargin = 3;
  for (const PlantedBug& bug : planted_merge_bugs()) {
    SCOPED_TRACE(bug.name);
    std::vector<std::unique_ptr<Backend>> bs;
    bs.push_back(bug.make());
    std::vector<CaseSpec> ordinary;
    for (const CaseSpec& c : merge_cases_of("merge"))
      if (c.merge.lse == LsePattern::kOrdinary) ordinary.push_back(c);
    for (const Record& r : run_merge(bs, ordinary, 1))
      EXPECT_EQ(r.status, Status::kPassed) << r.case_id << ": only infinities expose it; " << r.message;
    int on_suite = 0, on_gate = 0;
    for (const Record& r : run_merge(bs, merge_cases_of("merge"), 1)) {
      if (!status_is_failure(r.status)) continue;
      EXPECT_EQ(r.status, bug.expected) << r.case_id << ": " << r.message;
      ++on_suite;
    }
    const Suite gate = load_suite("gate");
    for (const Record& r : run_merge(bs, merge_cases_of("gate"), gate.repeat)) {
      if (!status_is_failure(r.status)) continue;
      EXPECT_EQ(r.status, bug.expected) << r.case_id << ": " << r.message;
      ++on_gate;
    }
    EXPECT_GE(on_suite, kGateMargin);
    EXPECT_GE(on_gate, kGateMargin);
  }
}

// Golden and results files hold merge cases: export, run --golden (the
// stored references; records PASSED), --save-results twice and compare.
TEST(MergeGolden, ExportRunGoldenResultsAndCompare) {
  const fs::path d = test::scratch_dir("mlagate_merge_golden");
  const std::string g = (d / "g.h5").string(), r1 = (d / "r1.h5").string(), r2 = (d / "r2.h5").string();
  ASSERT_EQ(test::cli({"export", "--suite", "merge", "--filter", "/t1/|lse=both_pinf", "--out", g}), 0);
  ASSERT_EQ(test::cli({"run", "--golden", g, "--backend", "cpu.merge", "--no-progress", "-q", "--isolate", "none", "--json",
                       (d / "g.json").string(), "--save-results", r1}),
            0);
  std::ifstream in(d / "g.json");
  const nlohmann::json doc = nlohmann::json::parse(in);
  int passed = 0, pinf = 0;
  for (const auto& r : doc.at("records")) {
    EXPECT_EQ(r.at("status"), "PASSED") << r.at("id");
    passed += r.at("status") == "PASSED";
    pinf += r.at("id").get<std::string>().find("lse=both_pinf") != std::string::npos;
  }
  EXPECT_GE(passed, 4);
  EXPECT_GE(pinf, 3);
  ASSERT_EQ(test::cli({"run", "--suite", "merge", "--filter", "/t1/|lse=both_pinf", "--backend", "cpu.merge", "--no-progress", "-q",
                       "--isolate", "none", "--save-results", r2}),
            0);
  EXPECT_EQ(test::cli({"compare", r1, r2}), 0);  // the same outputs, from the stored and the regenerated case
  fs::remove_all(d);
}

// mlagate shrink on a planted bug's mixed merge case: down to one row of one
// element with the pattern that fails alone, and the suite file it writes
// fails the same way when run.
TEST(MergeShrink, APlantedBugsCaseShrinksToOneRow) {
  const fs::path d = fs::temp_directory_path() / ("mlagate_merge_shrink_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string bin = MLAGATE_PLANTED_CLI;
  const std::string id = "merge/t7/tp1/bf16/kv=auto/bs=auto/seed=0/heads=16/merge=d128/lse=mixed";
  auto sh = [&](const std::string& args) {
    const std::string cmd = "'" + bin + "' " + args + " >'" + (d / "out.txt").string() + "' 2>&1";
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  auto slurp = [&] {
    std::ifstream f(d / "out.txt");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  ASSERT_EQ(sh("shrink --suite merge --case '" + id + "' --backend bug.merge_inf_nan --out '" + (d / "s").string() + "'"), 0)
      << slurp();
  const std::string out = slurp();
  EXPECT_NE(out.find("from: 7 tokens, 16 heads, head dim 128, lse mixed"), std::string::npos) << out;
  EXPECT_NE(out.find("to:   1 tokens, 1 heads, head dim 1, lse "), std::string::npos) << out;
  EXPECT_NE(out.find("NONFINITE"), std::string::npos) << out;
  EXPECT_EQ(sh("run --suite '" + (d / "s" / "shrunk.yaml").string() + "' --backend bug.merge_inf_nan -q"), 1) << slurp();
  // The bundle replays the failure, and cpu.merge passes it.
  std::vector<fs::path> bundles;
  for (const auto& e : fs::directory_iterator(d / "s" / "bundle")) bundles.push_back(e.path());
  ASSERT_EQ(bundles.size(), 1u);
  EXPECT_EQ(sh("replay '" + bundles[0].string() + "' --backend bug.merge_inf_nan -q"), 1) << slurp();
  EXPECT_EQ(sh("replay '" + bundles[0].string() + "' --backend cpu.merge -q"), 0) << slurp();
  fs::remove_all(d);
}

}  // namespace
}  // namespace mlagate
