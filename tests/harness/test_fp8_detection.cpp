// The fp8 cache bugs of SPEC: KV cache dtypes and Bug classes, caught: each planted fp8
// bug (writers and readers disagreeing about scales, rounding and range) fails
// INCORRECT on the fp8 cases that expose it and passes on the others; the
// writer bugs fail the cache_write conformance op with the first differing
// byte and, on some cases, the layer op; the reader bugs fail the layer op
// wherever a request takes the decode path. And the correct CPU backends pass
// the whole fp8 suite, their cache writer bit-exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "backends/cpu/cpu_backends.h"
#include "cases/suite.h"
#include "harness/run/runner.h"
#include "../backends/planted.h"

namespace mlagate {
namespace {

// The detection tests' gate (test_detection.cpp): fixed(atol 0.05, rtol 0.01).
Policy strict() { return make_policy("fixed", 5e-2, 1e-2); }

// fp8 suite cases at TP 16 that expose and hide every fp8 bug: every format
// at k_scale 1 and 3 (small_decode, mixed_small: decode and prefill paths),
// a single-key request whose only key is the new token (edge_seq_len_1), and
// values beyond 240 * k_scale (mixed_small at k_scale 0.01).
std::vector<CaseSpec> fp8_detection_cases() {
  std::vector<CaseSpec> cases;
  const std::set<std::string> specs = {"small_decode", "mixed_small", "edge_seq_len_1"};
  for (const CaseSpec& c : load_suite("fp8").cases)
    if (c.tp == 16 && specs.count(c.batch.name) && (c.block_size == 0 || c.block_size == 16) && c.q_magnitude == 1 &&
        c.dims == Dims{})
      cases.push_back(c);
  return cases;
}

TEST(Fp8Detection, EveryFp8BugFailsOnTheCasesThatExposeItOnly) {
  const std::vector<CaseSpec> cases = fp8_detection_cases();
  std::map<std::string, const CaseSpec*> by_id;
  for (const CaseSpec& c : cases) by_id[c.id()] = &c;
  for (const PlantedBug& bug : planted_fp8_bugs()) {
    SCOPED_TRACE(bug.name);
    const bool writer = bug.name.find("writer") != std::string::npos;
    // k_scale multiplied in the model dtype (FlashInfer's MLA kernels) scales
    // every key and value by bf16(0.01) / 0.01 = 1.00098: far below
    // fixed(0.05, 0.01), and the one case here that exposes it (mixed_small
    // at k_scale 0.01, 32 to 56 keys) is too short for the baseline policy
    // too (min_fudge 1.2). The gate suite's k_scale 0.01 group catches it
    // (Gate.CatchesWhatTheVllmSuiteMisses); here it must pass wherever
    // k_scale is exact in the model dtype (1, 3: the same bits as cpu.paged).
    const bool below_flat_tolerances = bug.name == "bug.fp8_scale_model_dtype_multiply";
    std::vector<std::unique_ptr<Backend>> bs;
    bs.push_back(bug.make());
    RunConfig cfg;
    cfg.cases = cases;
    cfg.ops = {Op::kLayer, Op::kCacheWrite};
    cfg.policy = strict();
    int exposing = 0, layer_caught = 0, cache_write_caught = 0;
    for (const Record& r : run_cases(cfg, bs)) {
      SCOPED_TRACE(r.case_id + " " + r.op + ": " + r.message);
      const bool exposed = bug.exposed_by(*by_id.at(r.case_id));
      if (!exposed) {
        EXPECT_EQ(r.status, Status::kPassed) << "a case that cannot expose the bug";
        continue;
      }
      if (r.op == "cache_write") {
        ++exposing;
        if (writer) {
          EXPECT_EQ(r.status, Status::kIncorrect);
          EXPECT_EQ(r.message.rfind("first differing byte: token ", 0), 0u);
          EXPECT_NE(r.message.find(", field kv_c, element "), std::string::npos);
          cache_write_caught += r.status == Status::kIncorrect;
        } else {
          EXPECT_EQ(r.status, Status::kPassed) << "a reader bug writes correctly";
        }
        continue;
      }
      // Layer op: INCORRECT or PASSED, never another verdict.
      EXPECT_TRUE(r.status == Status::kIncorrect || r.status == Status::kPassed) << status_name(r.status);
      layer_caught += r.status == Status::kIncorrect;
      // cpu.paged routes q_len 1 requests to its decode kernel, the reader under test.
      if (!writer && !below_flat_tolerances)
        EXPECT_EQ(r.status, Status::kIncorrect) << "every case here has a decode-path request";
    }
    if (below_flat_tolerances) {
      EXPECT_GE(exposing, 1);
    } else {
      EXPECT_GE(exposing, 4);
      EXPECT_GT(layer_caught, 0) << "the layer op never caught it";
    }
    if (writer) EXPECT_EQ(cache_write_caught, exposing);
    std::printf("%-34s exposed by %2d of %zu cases: cache_write caught %2d, layer caught %2d\n", bug.name.c_str(),
                exposing, cases.size(), cache_write_caught, layer_caught);
  }
}

// The runner shares inputs, references and caches between consecutive cases
// that allow it (auto -> fp8 -> fp8_e4m3, k_scale 1 -> 3 on fp8_ds_mla): each
// record must be what the case gives when run alone.
TEST(Fp8Runner, SharingBetweenCasesChangesNoResult) {
  std::vector<CaseSpec> cases;
  for (const char* kv : {"auto", "fp8", "fp8_e4m3", "fp8_ds_mla:raw"})
    for (float ks : {1.f, 3.f}) {
      CaseSpec c;
      c.batch = find_batch_spec("mixed_small");
      c.tp = 16;
      c.kv_cache_dtype = parse_kv_cache_format(kv).dtype;
      c.scale_rule = parse_kv_cache_format(kv).scale_rule;
      c.k_scale = ks;
      cases.push_back(c);
    }
  auto run = [](const std::vector<CaseSpec>& cs) {
    std::vector<std::unique_ptr<Backend>> bs;
    bs.push_back(make_cpu_paged());
    bs.push_back(make_cpu_splitkv());
    RunConfig cfg;
    cfg.cases = cs;
    cfg.ops = {Op::kLayer, Op::kDecode, Op::kPrefill};
    cfg.policy = strict();
    return run_cases(cfg, bs);
  };
  const std::vector<Record> together = run(cases);
  std::size_t k = 0;
  for (const CaseSpec& c : cases)
    for (const Record& alone : run({c})) {
      ASSERT_LT(k, together.size());
      const Record& r = together[k++];
      SCOPED_TRACE(alone.case_id + " " + alone.backend + " " + alone.op);
      EXPECT_EQ(r.case_id, alone.case_id);
      EXPECT_EQ(r.status, alone.status);
      EXPECT_EQ(r.message, alone.message);
      ASSERT_EQ(r.metrics.size(), alone.metrics.size());
      for (std::size_t m = 0; m < r.metrics.size(); ++m) {
        EXPECT_EQ(r.metrics[m].output, alone.metrics[m].output);
        EXPECT_EQ(r.metrics[m].max_abs, alone.metrics[m].max_abs) << r.metrics[m].output;
        EXPECT_EQ(r.metrics[m].nmse, alone.metrics[m].nmse) << r.metrics[m].output;
      }
    }
  EXPECT_EQ(k, together.size());
}

// The correct backends on the whole fp8 suite; cpu.paged's own cache writer
// bit-exact on every case, cpu.splitkv (no writer of its own) NOT_SUPPORTED there,
// and at block size 1 (the raw_fa_* cases). fixed(0.05, 0.01) below Q
// magnitude 16; from it a fixed atol means nothing (the logits' own fp32
// rounding needs atol 0.28 at 64, reference/POLICIES.md; at 16 cpu.paged's
// layer output on mixed_small, kv=fp8_ds_mla:raw, needs 0.0503 with generator
// version 2's inputs, 0.05 or less with version 1's) and those cases are held
// to the baseline policy, the gate there.
TEST(Fp8Detection, CorrectBackendsPassTheFp8Suite) {
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cpu_paged());
  bs.push_back(make_cpu_splitkv());
  RunConfig cfg;
  RunConfig large_q;
  for (const CaseSpec& c : load_suite("fp8").cases) (c.q_magnitude >= 16 ? large_q : cfg).cases.push_back(c);
  ASSERT_FALSE(large_q.cases.empty());
  cfg.ops = large_q.ops = {Op::kLayer, Op::kCacheWrite};
  cfg.policy = strict();
  large_q.policy = make_policy("baseline", 0, 0);
  std::vector<Record> records = run_cases(cfg, bs);
  for (Record& r : run_cases(large_q, bs)) records.push_back(std::move(r));
  int quant_reported = 0, splitkv_bs1 = 0;
  for (const Record& r : records) {
    SCOPED_TRACE(r.case_id + " " + r.backend + " " + r.op);
    if (r.op == "cache_write" && r.backend == "cpu.splitkv") {
      EXPECT_EQ(r.status, Status::kNotSupported);
      continue;
    }
    if (r.backend == "cpu.splitkv" && r.case_id.find("/bs=1/") != std::string::npos) {
      EXPECT_EQ(r.status, Status::kNotSupported) << r.message;
      ++splitkv_bs1;
      continue;
    }
    EXPECT_EQ(r.status, Status::kPassed) << status_name(r.status) << ": " << r.message;
    if (r.op == "layer") {
      // The quantization error is reported for information, and it is larger
      // than the backend's own error: why the reference reads the dequantized cache.
      ASSERT_EQ(r.metrics.size(), 3u);
      EXPECT_EQ(r.metrics[2].output, "quant_error");
      EXPECT_TRUE(r.metrics[2].passed);
      EXPECT_GT(r.metrics[2].max_abs, r.metrics[0].max_abs);
      ++quant_reported;
    }
  }
  EXPECT_EQ(splitkv_bs1, 3);
  EXPECT_EQ(quant_reported, 2 * static_cast<int>(cfg.cases.size() + large_q.cases.size()) - splitkv_bs1);
}

// Issue 36's false alarms, found by a random search (the fp8 suite's raw_fa_*
// cases; cases/KV_CACHE.md, "err_baseline on inexact fp8 caches"): with raw
// tile scales the correct backends failed the layer op under the default
// policy (needs fudge 7.65, 2.38, 3.15) where a request took the decode path:
// err_baseline read the dequantized keys rounded to bf16, the backends read
// them in fp32, two different random errors. Every record passes now (or is
// NOT_SUPPORTED: cpu.splitkv has no block size 1); the pow2 twins pass as
// before; and the planted reader that keeps only each raw tile scale's
// exponent is still caught, on the raw cases whose decode-path request has
// keys (on raw_fa_padding that request is the padding one, and cpu.paged
// routes raw_fa_prefill_33's 2- and 33-token requests to prefill, where the
// harness dequantizes the workspace).
TEST(Fp8Detection, RawScaleFalseAlarmsPassAndTheRawScaleReaderBugIsCaught) {
  std::vector<CaseSpec> cases;
  for (const CaseSpec& c : load_suite("fp8").cases)
    if (c.batch.name.starts_with("raw_fa_")) cases.push_back(c);
  ASSERT_EQ(cases.size(), 6u);
  RunConfig cfg;
  cfg.cases = cases;
  cfg.ops = {Op::kLayer};
  cfg.policy = make_policy("baseline", 0, 0);  // the default gate, fudge 2
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cpu_paged());
  bs.push_back(make_cpu_splitkv());
  const PlantedBug* pow2_reader = nullptr;
  for (const PlantedBug& b : planted_fp8_bugs())
    if (b.name == "bug.fp8_reader_pow2_scales") pow2_reader = &b;
  ASSERT_NE(pow2_reader, nullptr);
  bs.push_back(pow2_reader->make());
  std::map<std::string, int> passed;
  std::set<std::string> caught;
  double worst = 0;
  for (const Record& r : run_cases(cfg, bs)) {
    SCOPED_TRACE(r.case_id + " " + r.backend + ": " + r.message);
    if (r.status == Status::kNotSupported) {
      EXPECT_EQ(r.backend, "cpu.splitkv");
      EXPECT_NE(r.message.find("block size 1 not in"), std::string::npos);
      continue;
    }
    if (r.backend == pow2_reader->name) {
      if (r.status == Status::kIncorrect) caught.insert(r.case_id);
      EXPECT_TRUE(r.status == Status::kPassed || r.status == Status::kIncorrect) << status_name(r.status);
      continue;
    }
    EXPECT_EQ(r.status, Status::kPassed) << status_name(r.status);
    ++passed[r.backend];
    for (const Metrics& m : r.metrics)
      if (!std::isnan(m.err_baseline)) worst = std::max(worst, m.min_fudge);
  }
  EXPECT_EQ(passed["cpu.paged"], 6);
  EXPECT_EQ(passed["cpu.splitkv"], 3);  // the bs 16 and bs 128 cases
  EXPECT_EQ(caught, (std::set<std::string>{"fp8/raw_fa_seq_len_1/tp128/bf16/kv=fp8_ds_mla:raw/bs=1/seed=0",
                                           "fp8/raw_fa_two_decodes/tp32/bf16/kv=fp8_ds_mla:raw/bs=16/seed=0/qmag=64"}));
  std::printf("raw_fa_*: correct backends' largest min_fudge %.3g; the pow2-scale reader caught on %zu cases\n", worst,
              caught.size());
}

}  // namespace
}  // namespace mlagate
