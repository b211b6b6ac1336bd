// Tests of the real-library adapters (flashmla, flashmla.sparse, flashinfer.mla.fa2/.fa3),
// built only when their checkouts are given (-DMLAGATE_FLASHMLA_SOURCE_DIR,
// -DMLAGATE_FLASHINFER_INCLUDE_DIR), so never in CI. supports() must give the
// libraries' stated limits with their reasons (no GPU needed); on a GPU every
// smoke and edges case each adapter supports must pass the decode op against
// the fp64 reference, and the bench handle must launch. Without a GPU the device
// tests skip.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backends.h"
#if MLAGATE_HAS_FLASHMLA
#include "backends/flashmla/flashmla_backend.h"
#endif
#include "backends/registry.h"
#include "cases/case.h"
#include "cases/paged_cache.h"
#include "cases/suite.h"
#include "harness/cli/cli.h"
#include "harness/run/runner.h"
#include "tests/require_gpu.h"

namespace mlagate {
namespace {

// The adapters this build has, by the registry's names.
std::vector<std::string> adapter_names() {
  std::vector<std::string> names;
  for (const BackendEntry& e : backend_registry())
    if (e.name.rfind("flashmla", 0) == 0 || e.name.rfind("flashinfer", 0) == 0) names.push_back(e.name);
  return names;
}

// The dense-decode adapters (the sparse ones run only the sparse ops).
std::vector<std::string> dense_adapter_names() {
  std::vector<std::string> names;
  for (const std::string& n : adapter_names())
    if (n.find(".sparse") == std::string::npos) names.push_back(n);
  return names;
}

std::unique_ptr<Backend> make(const std::string& name) { return std::move(select_backends(name).front()); }

CaseSpec decode_case() {
  CaseSpec s;
  s.batch = {"two", {64, 130}, {1, 1}, false, ""};
  s.tp = 16;
  return s;
}

void expect_no(const Support& s, const std::string& words) {
  EXPECT_FALSE(s.ok) << "expected NOT_SUPPORTED (" << words << ")";
  EXPECT_NE(s.reason.find(words), std::string::npos) << s.reason;
}

TEST(KernelLibs, TheRegistryHasTheEnabledAdapters) {
  const std::vector<std::string> names = adapter_names();
  std::vector<std::string> want;
#if MLAGATE_HAS_FLASHMLA
  want.push_back("flashmla");
  want.push_back("flashmla.sparse");
#endif
#if MLAGATE_HAS_FLASHINFER
  want.push_back("flashinfer.mla.fa2");
#endif
#if MLAGATE_HAS_FLASHINFER_FA3
  want.push_back("flashinfer.mla.fa3");
#endif
  EXPECT_EQ(names, want);
}

#if MLAGATE_HAS_FLASHMLA
TEST(KernelLibs, FlashMlaStatesItsLimits) {
  const auto b = make("flashmla");
  CaseSpec s = decode_case();
  EXPECT_TRUE(b->supports(s, Op::kDecode).ok) << b->supports(s, Op::kDecode).reason;
  s.block_size = 16;
  expect_no(b->supports(s, Op::kDecode), "block size 16 not in {64}");
  s = decode_case();
  s.kv_cache_dtype = KvCacheDtype::kFp8;
  expect_no(b->supports(s, Op::kDecode), "kv cache dtype fp8 not in {auto}");
  s = decode_case();
  s.batch.query_lens = {1, 2};
  expect_no(b->supports(s, Op::kDecode), "UNIFORM");
  s = decode_case();
  s.dims.kv_lora_rank = 256;
  expect_no(b->supports(s, Op::kDecode), "head_size_v (L) 256 is not 512");
  s = decode_case();
  s.dims.rope_dim = 32;
  expect_no(b->supports(s, Op::kDecode), "head_size_k (L + R) 544 not in {576, 512}");
  s = decode_case();
  expect_no(b->supports(s, Op::kPrefill), "no prefill kernel");
}
#endif

#if MLAGATE_HAS_FLASHMLA
// A case of a suite by its kv cache format and sparse pattern.
CaseSpec sparse_case(const std::string& suite, KvCacheDtype kv, ScaleRule rule = ScaleRule::kPow2,
                     IndexPattern pattern = IndexPattern::kRandom) {
  for (const CaseSpec& c : load_suite(suite).cases)
    if (c.kv_cache_dtype == kv && c.scale_rule == rule && c.sparse.pattern == pattern) return c;
  ADD_FAILURE() << "no such case in " << suite;
  return {};
}

TEST(KernelLibs, FlashMlaSparseStatesItsLimits) {
  const auto b = make("flashmla.sparse");
  CaseSpec s = sparse_case("sparse", KvCacheDtype::kFp8DsMla);
  EXPECT_TRUE(b->supports(s, Op::kSparseDecode).ok) << b->supports(s, Op::kSparseDecode).reason;
  EXPECT_TRUE(b->supports(s, Op::kSparsePrefill).ok) << b->supports(s, Op::kSparsePrefill).reason;
  expect_no(b->supports(s, Op::kDecode), "sparse case");
  s = sparse_case("sparse", KvCacheDtype::kFp8DsMla, ScaleRule::kRaw);
  expect_no(b->supports(s, Op::kSparseDecode), "exact only for power-of-two scales (pow2)");
  s = sparse_case("sparse", KvCacheDtype::kAuto);
  expect_no(b->supports(s, Op::kSparseDecode), "V3.2 needs kv fp8_ds_mla");
  EXPECT_TRUE(b->supports(s, Op::kSparsePrefill).ok) << b->supports(s, Op::kSparsePrefill).reason;
  s = sparse_case("sparse", KvCacheDtype::kAuto, ScaleRule::kPow2, IndexPattern::kLengths);
  s.kv_cache_dtype = KvCacheDtype::kFp8DsMla;
  expect_no(b->supports(s, Op::kSparseDecode), "no topk_length");
  s.dtype = DType::kF16;
  expect_no(b->supports(s, Op::kSparsePrefill), "fp16");
  s = sparse_case("v4", KvCacheDtype::kFp8V4);
  EXPECT_TRUE(b->supports(s, Op::kSparseDecode).ok) << b->supports(s, Op::kSparseDecode).reason;
  EXPECT_TRUE(b->supports(s, Op::kSparsePrefill).ok) << b->supports(s, Op::kSparsePrefill).reason;
  s.tp = 1;
  s.total_heads = 256;
  expect_no(b->supports(s, Op::kSparseDecode), "h_q 64 or 128");
  s = sparse_case("v4", KvCacheDtype::kAuto);
  expect_no(b->supports(s, Op::kSparseDecode), "V4 needs kv fp8_v4");
}

// Every sparse and v4 record flashmla.sparse supports runs and passes the
// CLI's default gate; both ops run on some cases of both suites.
TEST(KernelLibs, FlashMlaSparseSuitesPass) {
  MLAGATE_REQUIRE_GPU();
  for (const char* suite : {"sparse", "v4"}) {
    SCOPED_TRACE(suite);
    std::vector<std::unique_ptr<Backend>> backends;
    backends.push_back(make("flashmla.sparse"));
    RunConfig cfg;
    cfg.cases = load_suite(suite).cases;
    cfg.ops = {Op::kSparseDecode, Op::kSparsePrefill};
    cfg.policy = make_policy("baseline", 1e-2, 1e-2);
    std::map<std::string, int> passed, unsupported;
    for (const Record& r : run_cases(cfg, backends)) {
      if (r.status == Status::kNotSupported) {
        ++unsupported[r.op];
        continue;
      }
      EXPECT_EQ(r.status, Status::kPassed) << r.op << " " << r.case_id << ": " << r.message;
      if (r.status == Status::kPassed && !r.metrics.empty()) ++passed[r.op];
    }
    for (const char* op : {"sparse_decode", "sparse_prefill"}) {
      EXPECT_GT(passed[op], 0) << op;
      std::printf("flashmla.sparse %-6s %-15s %3d passed, %3d not supported\n", suite, op, passed[op], unsupported[op]);
    }
  }
}

// What FlashMLA's V3.2 decode does with non-power-of-two (raw) tile scales,
// which flashmla.sparse refuses: each fp32 scale becomes bf16 in the kernel.
// Every raw decode record must run (no crash); the figures go to backends/kernel_libs/README.md.
TEST(KernelLibs, FlashMlaSparseOnRawScales) {
  MLAGATE_REQUIRE_GPU();
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(detail::make_flashmla_sparse_raw_scales());
  RunConfig cfg;
  for (const CaseSpec& c : load_suite("sparse").cases)
    if (c.kv_cache_dtype == KvCacheDtype::kFp8DsMla && c.scale_rule == ScaleRule::kRaw) cfg.cases.push_back(c);
  ASSERT_FALSE(cfg.cases.empty());
  cfg.ops = {Op::kSparseDecode};
  cfg.policy = make_policy("baseline", 1e-2, 1e-2);
  int ran = 0;
  for (const Record& r : run_cases(cfg, backends)) {
    if (r.status == Status::kNotSupported) {
      std::printf("raw scales  NOT_SUPPORTED %s: %s\n", r.case_id.c_str(), r.message.c_str());
      continue;
    }
    EXPECT_TRUE(r.status == Status::kPassed || r.status == Status::kIncorrect) << status_name(r.status) << " " << r.message;
    ++ran;
    std::printf("raw scales  %-9s %s\n", std::string(status_name(r.status)).c_str(), r.case_id.c_str());
    for (const Metrics& m : r.metrics)
      std::printf("            %-3s max_abs %.3g err_baseline %.3g min_fudge %.3g\n", m.output.c_str(), m.max_abs,
                  m.err_baseline, m.min_fudge);
    if (!r.message.empty()) std::printf("            %s\n", r.message.c_str());
  }
  EXPECT_GT(ran, 0);
}

// Kernel times (CUDA events around the launches, best of 3) of flashmla.sparse
// and cuda.sparse on the largest V3.2 and V4 cases, for backends/kernel_libs/README.md; both must
// pass there.
TEST(KernelLibs, SparseKernelTimes) {
  MLAGATE_REQUIRE_GPU();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"sparse", "sparse/sparse_decode_4k/tp1/bf16/kv=fp8_ds_mla:pow2/bs=auto/seed=0/topk=2048"},
      {"v4", "v4/v4_decode/tp2/bf16/kv=fp8_v4/bs=auto/seed=0/dims=v4/win=128/cmp=4x64/sink"}};
  for (const auto& [suite, id] : cases) {
    RunConfig cfg;
    for (const CaseSpec& c : load_suite(suite).cases)
      if (c.id() == id) cfg.cases.push_back(c);
    ASSERT_EQ(cfg.cases.size(), 1u) << id;
    cfg.policy = make_policy("baseline", 1e-2, 1e-2);
    for (Op op : {Op::kSparseDecode, Op::kSparsePrefill}) {
      cfg.ops = {op};
      for (const char* name : {"flashmla.sparse", "cuda.sparse"}) {
        std::vector<std::unique_ptr<Backend>> backends;
        backends.push_back(make(name));
        double best = 1e30;
        for (int i = 0; i < 3; ++i) {
          for (const Record& r : run_cases(cfg, backends)) EXPECT_EQ(r.status, Status::kPassed) << name << " " << r.message;
          best = std::min(best, detail::cuda_last_kernel_ms(*backends.front()));
        }
        EXPECT_GT(best, 0.0);
        std::printf("kernel ms  %-15s %-14s %-70s %.3f\n", name, std::string(op_name(op)).c_str(), id.c_str(), best);
      }
    }
  }
}
#endif

#if MLAGATE_HAS_FLASHINFER
TEST(KernelLibs, FlashInferStatesItsLimits) {
  std::vector<std::string> names = {"flashinfer.mla.fa2"};
#if MLAGATE_HAS_FLASHINFER_FA3
  names.push_back("flashinfer.mla.fa3");
#endif
  for (const std::string& n : names) {
    SCOPED_TRACE(n);
    const auto b = make(n);
    CaseSpec s = decode_case();
    for (int bs : {1, 16, 32, 64, 128}) {
      s.block_size = bs;
      EXPECT_TRUE(b->supports(s, Op::kDecode).ok) << bs << ": " << b->supports(s, Op::kDecode).reason;
    }
    s = decode_case();
    s.batch.query_lens = {1, 2};  // VARLEN
    EXPECT_TRUE(b->supports(s, Op::kDecode).ok) << b->supports(s, Op::kDecode).reason;
    s = decode_case();
    s.kv_cache_dtype = KvCacheDtype::kFp8;
    s.dtype = DType::kF16;
    expect_no(b->supports(s, Op::kDecode), "fp8 kv cache needs bf16 queries");
    s.kv_cache_dtype = KvCacheDtype::kFp8DsMla;
    s.dtype = DType::kBF16;
    expect_no(b->supports(s, Op::kDecode), "not in {auto, fp8, fp8_e4m3}");
    s = decode_case();
    s.dims.rope_dim = 32;
    expect_no(b->supports(s, Op::kDecode), "built for head_dim_ckv 512, head_dim_kpe 64");
  }
}
#endif

// Every supported smoke and edges decode record passes against the fp64
// golden (the fixed policy of the device tests, lse included), poisoning on.
TEST(KernelLibs, SmokeAndEdgesDecodePass) {
  MLAGATE_REQUIRE_GPU();
  std::vector<std::unique_ptr<Backend>> backends;
  for (const std::string& n : dense_adapter_names()) backends.push_back(make(n));
  if (backends.empty()) GTEST_SKIP() << "no dense-decode adapter in this build";
  RunConfig cfg;
  cfg.cases = load_suite("smoke").cases;
  for (const CaseSpec& c : load_suite("edges").cases) cfg.cases.push_back(c);
  cfg.ops = {Op::kDecode};
  cfg.policy = make_policy("fixed", 5e-2, 1e-2);
  std::map<std::string, int> passed;
  for (const Record& r : run_cases(cfg, backends)) {
    if (r.status == Status::kNotSupported) continue;
    EXPECT_EQ(r.status, Status::kPassed) << r.backend << " " << r.case_id << ": " << r.message;
    if (r.status == Status::kPassed) ++passed[r.backend];
  }
  for (const auto& b : backends) {
    EXPECT_GT(passed[std::string(b->name())], 5) << b->name();
    std::printf("%-20s %d smoke/edges decode records passed\n", std::string(b->name()).c_str(),
                passed[std::string(b->name())]);
  }
}

// prepare_decode_bench gives a handle whose launch() runs without error, twice,
// on a stream of the caller's (the bench's use of it).
TEST(KernelLibs, BenchHandlesLaunch) {
  MLAGATE_REQUIRE_GPU();
  const Case c = generate_case(decode_case());
  for (const std::string& n : dense_adapter_names()) {
    SCOPED_TRACE(n);
    auto b = make(n);
    const int bs = resolve_block_size(b->capabilities(), c.spec);
    const PagedCache cache = build_paged_cache(c, bs);
    const std::int64_t T = c.num_tokens, N = c.spec.num_heads(), L = c.spec.dims.kv_lora_rank;
    // Zero queries: this checks that the handle launches, the suites check values.
    Tensor q_lat(c.spec.dtype, {T, N, L}), q_pe(c.spec.dtype, {T, N, c.spec.dims.rope_dim});
    Tensor o(c.spec.dtype, {T, N, L}), lse(DType::kF32, {T, N});
    DecodeArgs a;
    a.q_lat = q_lat.view();
    a.q_pe = q_pe.view();
    a.cache = &cache;
    a.seq_lens = c.seq_lens;
    a.query_start_loc = c.query_start_loc;
    std::vector<std::int32_t> rows(c.num_requests);
    for (int i = 0; i < c.num_requests; ++i) rows[i] = i;
    a.block_table_rows = rows;
    a.scale = c.spec.softmax_scale();
    a.o_lat = o.view();
    a.lse = lse.view();
    std::unique_ptr<DecodeBench> h = b->prepare_decode_bench(a);
    ASSERT_NE(h, nullptr);
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    h->launch(s);
    h->launch(s);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaStreamDestroy(s);
  }
}

}  // namespace
}  // namespace mlagate
