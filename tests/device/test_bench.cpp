// `mlagate bench`: the ideal-work accounting to the byte and FLOP, the case
// sets, and the command itself on a tiny case set (GPU: every row runs, the
// figures agree with the accounting and stay below the HBM peak; without a GPU
// it must exit 2 and the test skips).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backends.h"
#include "cases/case.h"
#include "cases/errors.h"
#include "harness/bench/bench.h"
#include "harness/cli/cli.h"
#include "tests/cli_call.h"

namespace mlagate {
namespace {

const CaseSpec& tiny(const std::string& batch) {
  static const BenchCaseSet set = bench_case_set("tiny");
  for (const CaseSpec& c : set.cases)
    if (c.batch.name == batch) return c;
  throw std::runtime_error("no tiny case " + batch);
}

// b=2, s=256, q=1, 8 heads, bf16 auto entries of 2 * (512 + 64) = 1152 bytes.
TEST(BenchAccounting, DecodeBytesAndFlopsByHand) {
  const CaseSpec& c = tiny("b2_s256");
  ASSERT_EQ(c.num_heads(), 8);
  const DecodeWork w16 = ideal_decode_work(c, 16), w64 = ideal_decode_work(c, 64);
  // entries 2 * 256 * 1152 + table 2 * 16 (or 2 * 4) * 4 + q 2 * 8 * 576 * 2
  EXPECT_EQ(w16.bytes_read, 589824.0 + 128.0 + 18432.0);
  EXPECT_EQ(w64.bytes_read, 589824.0 + 32.0 + 18432.0);
  EXPECT_EQ(w16.bytes_written, 2.0 * 8 * 512 * 2 + 2.0 * 8 * 4);  // o_lat bf16, lse fp32
  EXPECT_EQ(w16.flops, 2.0 * (2.0 * 8 * 256 * (576 + 512)));      // 2 tokens, 256 keys each
}

// Spec decode, q=2: token 0 sees 255 keys, token 1 all 256; each entry is read once.
TEST(BenchAccounting, SpecDecodeCountsVisibleKeysPerToken) {
  const CaseSpec& c = tiny("spec2_b2_s256");
  ASSERT_TRUE(c.batch.spec_decode);
  const DecodeWork w = ideal_decode_work(c, 64);
  EXPECT_EQ(w.bytes_read, 589824.0 + 32.0 + 4.0 * 8 * 576 * 2);
  EXPECT_EQ(w.bytes_written, 4.0 * 8 * 512 * 2 + 4.0 * 8 * 4);
  EXPECT_EQ(w.flops, 2.0 * (2.0 * 8 * (255 + 256) * (576 + 512)));
}

// The cache dtype sets the entry bytes read: fp8 576, fp8_ds_mla 656 (cases/fp8.h).
TEST(BenchAccounting, EntryBytesFollowTheCacheDtype) {
  CaseSpec c = tiny("b2_s256");
  const double base = ideal_decode_work(c, 64).bytes_read - 2 * 256 * 1152.0;
  c.kv_cache_dtype = KvCacheDtype::kFp8;
  EXPECT_EQ(ideal_decode_work(c, 64).bytes_read, base + 2 * 256 * 576.0);
  c.kv_cache_dtype = KvCacheDtype::kFp8DsMla;
  EXPECT_EQ(ideal_decode_work(c, 64).bytes_read, base + 2 * 256 * 656.0);
  EXPECT_THROW(ideal_decode_work(c, 0), InputError);
}

// Issue 9's shapes: large_decode, b=128 x s_k 8192 / 32768, spec decode s_q=2; 128 and 16 heads each.
TEST(BenchCaseSets, FullHasTheIssueShapes) {
  const BenchCaseSet set = bench_case_set("full");
  std::map<std::string, std::vector<int>> heads;
  for (const CaseSpec& c : set.cases) {
    heads[c.batch.name].push_back(c.num_heads());
    const int b = c.num_requests(), s = c.batch.seq_lens.front(), q = c.batch.query_lens.front();
    const std::map<std::string, std::vector<int>> want = {
        {"large_decode", {32, 2048, 1}}, {"b128_s8192", {128, 8192, 1}}, {"b128_s32768", {128, 32768, 1}},
        {"spec2_b128_s8192", {128, 8192, 2}}};
    ASSERT_TRUE(want.count(c.batch.name)) << c.batch.name;
    EXPECT_EQ(want.at(c.batch.name), (std::vector<int>{b, s, q})) << c.batch.name;
    EXPECT_EQ(c.batch.spec_decode, q == 2) << c.batch.name;
    EXPECT_EQ(c.dtype, DType::kBF16);
    EXPECT_EQ(c.kv_cache_dtype, KvCacheDtype::kAuto);
  }
  const std::vector<int> both{128, 16};
  EXPECT_EQ(heads.size(), 4u);
  for (const auto& [name, h] : heads) EXPECT_EQ(h, both) << name;
}

const CaseSpec& sparse_tiny(const std::string& batch, KvCacheDtype kv) {
  static const BenchCaseSet set = bench_case_set("sparse-tiny");
  for (const CaseSpec& c : set.cases)
    if (c.batch.name == batch && c.kv_cache_dtype == kv) return c;
  throw std::runtime_error("no sparse-tiny case " + batch);
}

// Top-k 128 of 256 keys: each token's row names 128 distinct keys (the random
// pattern draws min(topk, visible) of them), read once per token in the
// cache's entry bytes, plus the [T, 128] int32 rows and q [T, 8, 576] bf16.
TEST(BenchAccounting, SparseDecodeCountsTheKeysEachRowNames) {
  const std::map<KvCacheDtype, double> entry{
      {KvCacheDtype::kAuto, 1152.0}, {KvCacheDtype::kFp8DsMla, 656.0}, {KvCacheDtype::kFp8, 576.0}};
  for (const auto& [kv, bytes] : entry) {
    const Case c = generate_case(sparse_tiny("sparse_b2_s256", kv));
    ASSERT_EQ(c.num_tokens, 2);
    const DecodeWork w = ideal_sparse_decode_work(c);
    EXPECT_EQ(w.bytes_read, 2 * 128 * bytes + 2 * 128 * 4.0 + 2.0 * 8 * 576 * 2) << kv_cache_dtype_name(kv);
    EXPECT_EQ(w.bytes_written, 2.0 * 8 * 512 * 2 + 2.0 * 8 * 4);
    EXPECT_EQ(w.flops, 2.0 * (2.0 * 8 * 128 * (576 + 512)));
  }
  // Spec decode: 4 tokens, each its own 128 keys.
  const Case spec = generate_case(sparse_tiny("sparse_spec2_b2_s256", KvCacheDtype::kAuto));
  ASSERT_EQ(spec.num_tokens, 4);
  EXPECT_EQ(ideal_sparse_decode_work(spec).flops, 4.0 * (2.0 * 8 * 128 * (576 + 512)));
  // -1 slots are not read: a top-k wider than the context names only its keys.
  CaseSpec wide = sparse_tiny("sparse_b2_s256", KvCacheDtype::kAuto);
  wide.sparse.topk = 512;
  const DecodeWork ww = ideal_sparse_decode_work(generate_case(wide));
  EXPECT_EQ(ww.bytes_read, 2 * 256 * 1152.0 + 2 * 512 * 4.0 + 2.0 * 8 * 576 * 2);
  EXPECT_THROW(ideal_sparse_decode_work(generate_case(tiny("b2_s256"))), InputError);
}

// The sparse sets: top-k 2048 (V3.2's index_topk) at 128 and 16 heads, each
// batch in the three cache dtypes the sparse backends read.
TEST(BenchCaseSets, SparseFullHasV32Shapes) {
  const BenchCaseSet set = bench_case_set("sparse-full");
  EXPECT_EQ(set.cases.size(), 3u * 2u * 3u);
  std::map<std::string, int> per_batch;
  for (const CaseSpec& c : set.cases) {
    EXPECT_EQ(c.sparse.topk, 2048);
    EXPECT_FALSE(c.sparse.v4());
    EXPECT_TRUE(c.num_heads() == 128 || c.num_heads() == 16) << c.id();
    EXPECT_EQ(c.batch.seq_lens.front(), 8192);
    ++per_batch[c.batch.name];
  }
  EXPECT_EQ(per_batch, (std::map<std::string, int>{{"sparse_b128_s8192", 6}, {"sparse_b64_s8192", 6}, {"sparse_spec2_b64_s8192", 6}}));
}

TEST(BenchCaseSets, SuitesWorkAndUnknownNamesAreInputErrors) {
  EXPECT_FALSE(bench_case_set("smoke").cases.empty());
  EXPECT_THROW(bench_case_set("no_such_set"), InputError);
  BenchOptions opt;
  opt.case_set = "no_such_set";
  EXPECT_THROW(run_bench(opt, stdout), InputError);
  opt.case_set = "tiny";
  opt.backends = "no.such.backend";  // with or without a GPU
  EXPECT_THROW(run_bench(opt, stdout), InputError);
}

using test::cli;

// `mlagate bench ARGS --json FILE` in this process: its exit code and, on a
// GPU, the JSON it wrote. Without a GPU the command must say so and exit 2
// (checked here); `gpu` is false and the caller skips.
struct BenchRun {
  bool gpu = false;
  int rc = -1;
  nlohmann::json j;
};
BenchRun bench_run(std::vector<std::string> args, const std::string& tag) {
  const std::string json =
      (std::filesystem::temp_directory_path() / ("mlagate_bench_" + tag + std::to_string(::getpid()) + ".json")).string();
  args.insert(args.begin(), "bench");
  args.insert(args.end(), {"--json", json});
  BenchRun out;
  out.rc = cli(args);
  if (!cuda_device_info().available) {
    EXPECT_EQ(out.rc, kExitUsage) << "without a GPU the bench must say so and exit 2";
    return out;
  }
  out.gpu = true;
  if (std::ifstream f(json); f) out.j = nlohmann::json::parse(f);
  std::filesystem::remove(json);
  return out;
}

// The command end to end on the tiny set: every (case, CUDA backend) row runs;
// the JSON's bytes are the accounting's, GB/s is bytes / median time, the
// fastest of each case has ratio 1 and nobody beats the HBM peak (L2 is flushed).
TEST(Bench, TinyCaseSetOnTheGpu) {
  // The dense decode backends by name: cuda.sparse (also cuda.*) has no decode.
  const BenchRun b = bench_run({"--case-set", "tiny", "--backend", "cuda.ref,cuda.splitkv", "--min-time", "0.02"}, "");
  if (!b.gpu) GTEST_SKIP() << cuda_device_info().error;
  ASSERT_EQ(b.rc, kExitPassed);
  const nlohmann::json& j = b.j;
  const double peak = j.at("hbm_peak_gbs");
  EXPECT_GT(peak, 1000.0);  // H100 / H200: 3.35 / 4.9 TB/s
  ASSERT_EQ(j.at("rows").size(), 4u);  // 2 cases x {cuda.ref, cuda.splitkv}
  std::map<std::string, double> fastest;
  for (const auto& r : j.at("rows")) {
    ASSERT_EQ(r.at("status"), "ok") << r.dump();
    const CaseSpec& c = tiny(r.at("case").get<std::string>().find("spec2") != std::string::npos ? "spec2_b2_s256"
                                                                                                  : "b2_s256");
    const DecodeWork w = ideal_decode_work(c, r.at("block_size"));
    EXPECT_EQ(r.at("bytes_read").get<double>(), w.bytes_read);
    EXPECT_EQ(r.at("flops").get<double>(), w.flops);
    EXPECT_GE(r.at("iterations").get<int>(), 3);  // a median of at least kMinSamples
    const double ms = r.at("time_ms_median");
    EXPECT_GT(ms, 0.0);
    EXPECT_GE(ms, r.at("time_ms_min").get<double>());
    EXPECT_NEAR(r.at("gbs").get<double>(), w.bytes() / (ms * 1e-3) / 1e9, 1e-6 * w.bytes());
    EXPECT_LT(r.at("pct_hbm_peak").get<double>(), 100.0);
    EXPECT_GE(r.at("x_fastest").get<double>(), 1.0);
    auto& best = fastest[r.at("case")];
    best = best == 0 ? r.at("x_fastest").get<double>() : std::min(best, r.at("x_fastest").get<double>());
  }
  ASSERT_EQ(fastest.size(), 2u);
  for (const auto& [id, x] : fastest) EXPECT_EQ(x, 1.0) << id;
}

// The sparse decode op on the tiny sparse set: cuda.sparse times every case
// (it reads the three cache dtypes); every other GPU sparse backend in the
// build times the cases it declares and is NOT_SUPPORTED on the rest, never
// ERROR or NO_BENCH (the host's cpu.sparse* are NO_BENCH); the bytes are the
// sparse accounting's.
TEST(Bench, SparseTinyCaseSetOnTheGpu) {
  const BenchRun b = bench_run({"--case-set", "sparse-tiny", "--backend", "*sparse*", "--min-time", "0.02"}, "sparse_");
  if (!b.gpu) GTEST_SKIP() << cuda_device_info().error;
  ASSERT_EQ(b.rc, kExitPassed);
  const nlohmann::json& j = b.j;
  std::map<std::string, int> ok;
  for (const auto& r : j.at("rows")) {
    const std::string backend = r.at("backend"), status = r.at("status");
    if (backend.rfind("cpu.", 0) == 0) {  // host backends time nothing
      EXPECT_EQ(status, "NO_BENCH") << r.dump();
      continue;
    }
    ASSERT_TRUE(status == "ok" || status == "NOT_SUPPORTED") << r.dump();
    if (backend == "cuda.sparse") EXPECT_EQ(status, "ok") << r.dump();
    if (status != "ok") continue;
    ++ok[backend];
    const std::string id = r.at("case");
    for (const KvCacheDtype kv : {KvCacheDtype::kAuto, KvCacheDtype::kFp8DsMla, KvCacheDtype::kFp8})
      for (const char* batch : {"sparse_b2_s256", "sparse_spec2_b2_s256"}) {
        const CaseSpec& c = sparse_tiny(batch, kv);
        if (c.id() != id) continue;
        const DecodeWork w = ideal_sparse_decode_work(generate_case(c));
        EXPECT_EQ(r.at("bytes_read").get<double>(), w.bytes_read) << id;
        EXPECT_EQ(r.at("flops").get<double>(), w.flops) << id;
      }
    EXPECT_GT(r.at("time_ms_median").get<double>(), 0.0);
    EXPECT_LT(r.at("pct_hbm_peak").get<double>(), 100.0);
  }
  EXPECT_EQ(ok["cuda.sparse"], 6);
  for (const auto& [backend, n] : ok) std::printf("%-24s %d sparse-tiny rows timed\n", backend.c_str(), n);
}

}  // namespace
}  // namespace mlagate
