// Tests of the real-library adapters (flashmla, flashmla.sparse, flashinfer.mla.fa2/.fa3,
// flash_attn.mla), built only when their checkouts are given (-DMLAGATE_FLASHMLA_SOURCE_DIR,
// -DMLAGATE_FLASHINFER_INCLUDE_DIR, -DMLAGATE_FLASH_ATTN_SOURCE_DIR), so never in CI. supports() must give the
// libraries' stated limits with their reasons (no GPU needed); on a GPU every
// smoke and edges case each adapter supports must pass the decode op against
// the fp64 reference (flash_attn.mla* under the conditions of its own tests:
// its paged-KV TMA path reads NaN from a page's unused tail), and the bench
// handle must launch. Without a GPU the device tests skip.
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
#if MLAGATE_HAS_FLASH_ATTN
#include "backends/flash_attn/flash_attn_backend.h"
#endif
#if MLAGATE_HAS_FLASHINFER
#include "backends/flashinfer/flashinfer_backend.h"
#endif
#include "backends/registry.h"
#include "cases/case.h"
#include "cases/paged_cache.h"
#include "cases/suite.h"
#include "harness/cli/cli.h"
#include "harness/run/runner.h"
#include "tests/kernel_libs/adapters.h"
#include "tests/require_gpu.h"

namespace mlagate {
namespace {

// The dense-decode adapters (the sparse ones run only the sparse ops).
std::vector<std::string> dense_adapter_names() {
  std::vector<std::string> names;
  for (const std::string& n : adapter_names())
    if (n.find(".sparse") == std::string::npos) names.push_back(n);
  return names;
}


CaseSpec decode_case() {
  CaseSpec s;
  s.batch = {"two", {64, 130}, {1, 1}, false, ""};
  s.tp = 16;
  return s;
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
  want.push_back("flashinfer.mla.sparse");
#endif
#if MLAGATE_HAS_FLASH_ATTN
  want.push_back("flash_attn.mla");
  want.push_back("flash_attn.mla.cudagraph");
  want.push_back("flash_attn.mla.sparse");
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
  expect_no(b->supports(s, Op::kDecode), "head_size_k (L + R) 544 is not 576");
  s = decode_case();
  s.dims.rope_dim = 0;  // NoPE MLA: the sm90 dense kernel would abort on its HEAD_DIM_K assert
  expect_no(b->supports(s, Op::kDecode), "head_size_k (L + R) 512 is not 576");
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

#if MLAGATE_HAS_FLASH_ATTN
TEST(KernelLibs, FlashAttnStatesItsLimits) {
  for (const char* n : {"flash_attn.mla", "flash_attn.mla.cudagraph"}) {
    SCOPED_TRACE(n);
    const auto b = make(n);
    CaseSpec s = decode_case();
    for (int bs : {16, 32, 48, 64, 128, 256}) {
      s.block_size = bs;
      EXPECT_TRUE(b->supports(s, Op::kDecode).ok) << bs << ": " << b->supports(s, Op::kDecode).reason;
    }
    s.block_size = 8;
    expect_no(b->supports(s, Op::kDecode), "block size 8 not in");
    s = decode_case();
    s.batch.query_lens = {1, 300};  // VARLEN, both under the reorder threshold
    EXPECT_TRUE(b->supports(s, Op::kLayer).ok) << b->supports(s, Op::kLayer).reason;
    EXPECT_EQ(b->capabilities().reorder_threshold, 512);
    EXPECT_EQ(b->capabilities().query_len_support, QueryLenSupport::kVarlen);
    s = decode_case();
    s.kv_cache_dtype = KvCacheDtype::kFp8;
    expect_no(b->supports(s, Op::kDecode), "FP8 KV cache not yet supported");
    s = decode_case();
    s.dims.kv_lora_rank = 256;
    expect_no(b->supports(s, Op::kDecode), "hdim64_512 only");
    s = decode_case();
    s.dims.rope_dim = 96;
    expect_no(b->supports(s, Op::kDecode), "head dim <= 64");
    // The layer op's prefill path: hdim192_128 (P + R = 192, V = 128) only.
    s = decode_case();
    s.batch.query_lens = {1, 600};
    s.batch.seq_lens = {64, 700};
    if (detail::flash_attn_has_prefill()) {
      EXPECT_TRUE(b->supports(s, Op::kLayer).ok) << b->supports(s, Op::kLayer).reason;
      s.dims.nope_dim = 192;
      s.dims.v_head_dim = 256;
      expect_no(b->supports(s, Op::kLayer), "hdim192_128 only");
      expect_no(b->supports(s, Op::kPrefill), "hdim192_128 only");
    } else {
      expect_no(b->supports(s, Op::kPrefill), "not in");
    }
  }
  std::vector<std::unique_ptr<Backend>> forced = select_backends("flash_attn.mla", BackendOptions{300});
  expect_no(forced.front()->supports(decode_case(), Op::kDecode), "num_splits 300 > 256");
}

// The smoke and edges suites' decode and layer records pass the default gate
// with FA3's heuristic split count and with num_splits 1, 3 and 64 (the bound
// of the per-request counts: the split path, its combine and the semaphore it
// resets): at block size 16, where FA3 reads the paged cache without TMA, with
// NaN poison; and at block size 64 (the TMA path for more than 64 query rows
// per kv head) with the sentinel (the largest finite value) in the unused
// cache regions and the outputs (FlashAttnTmaPathLeaksTailNaN says why not NaN).
TEST(KernelLibs, FlashAttnForcedSplitsPass) {
  MLAGATE_REQUIRE_GPU();
  for (const auto& [bs, poison] : {std::pair{16, Poison::kNaN}, std::pair{64, Poison::kSentinel}}) {
    RunConfig cfg;
    for (const char* suite : {"smoke", "edges"})
      for (CaseSpec c : load_suite(suite).cases) {
        c.block_size = bs;
        cfg.cases.push_back(c);
      }
    cfg.ops = {Op::kDecode, Op::kLayer};
    cfg.policy = make_policy("baseline", 1e-2, 1e-2);
    cfg.exec.poison = poison;
    for (int splits : {0, 1, 3, 64}) {
      std::vector<std::unique_ptr<Backend>> backends = select_backends("flash_attn.mla", BackendOptions{splits});
      int passed = 0;
      for (const Record& r : run_cases(cfg, backends)) {
        if (r.status == Status::kNotSupported) continue;
        EXPECT_EQ(r.status, Status::kPassed)
            << "bs " << bs << " splits " << splits << " " << r.op << " " << r.case_id << ": " << r.message;
        passed += r.status == Status::kPassed;
      }
      EXPECT_GT(passed, 20) << splits;
      std::printf("flash_attn.mla bs %d poison %s splits %-2d: %d smoke/edges decode+layer records passed\n", bs,
                  std::string(poison_name(poison)).c_str(), splits, passed);
    }
  }
}

// Whether FA3 takes its paged-KV TMA path for the case (page size a multiple
// of kBlockN 64, more than kBlockM 64 query rows per kv head: get_pagedkv_tma)
// and some request's last page is not full.
bool tma_with_partial_page(const CaseSpec& c) {
  const int max_q = *std::max_element(c.batch.query_lens.begin(), c.batch.query_lens.end());
  bool partial = false;
  for (int s : c.batch.seq_lens) partial = partial || s % 64 != 0;
  return c.block_size % 64 == 0 && max_q * c.num_heads() > 64 && partial;
}

// FA3's paged-KV TMA path loads whole pages, the unused tail of a request's
// last page too, and multiplies the masked probabilities (exactly 0) by those
// rows: NaN there comes out as NaN (0 * NaN), finite values vanish. On edges at
// block size 64: with NaN poison exactly the cases that take the TMA path with
// a last page not full are NONFINITE and nothing else fails; with the sentinel
// (the largest finite value) and zero all pass. The non-TMA path (block size
// 16) passes with NaN poison (FlashAttnForcedSplitsPass).
TEST(KernelLibs, FlashAttnTmaPathLeaksTailNaN) {
  MLAGATE_REQUIRE_GPU();
  RunConfig cfg;
  std::map<std::string, CaseSpec> by_id;
  for (CaseSpec c : load_suite("edges").cases) {
    c.block_size = 64;
    if (by_id.emplace(c.id(), c).second) cfg.cases.push_back(c);  // the suite's bs 16 and 64 cases become one
  }
  cfg.ops = {Op::kDecode};
  cfg.policy = make_policy("baseline", 1e-2, 1e-2);
  for (Poison poison : {Poison::kNaN, Poison::kSentinel, Poison::kZero}) {
    cfg.exec.poison = poison;
    std::vector<std::unique_ptr<Backend>> backends;
    backends.push_back(make("flash_attn.mla"));
    int passed = 0, nonfinite = 0;
    for (const Record& r : run_cases(cfg, backends)) {
      if (r.status == Status::kNotSupported) continue;
      if (poison == Poison::kNaN && r.status == Status::kNonfinite) {
        ++nonfinite;
        EXPECT_TRUE(tma_with_partial_page(by_id.at(r.case_id))) << "NONFINITE off the TMA path: " << r.case_id;
        std::printf("tma tail: NONFINITE %s: %s\n", r.case_id.c_str(), r.message.c_str());
        continue;
      }
      EXPECT_EQ(r.status, Status::kPassed) << poison_name(poison) << " " << r.case_id << ": " << r.message;
      passed += r.status == Status::kPassed;
    }
    if (poison == Poison::kNaN) {
      EXPECT_GT(nonfinite, 0) << "the TMA path no longer reads the page tail";
    }
    std::printf("tma tail: poison %s: %d passed, %d NONFINITE\n", std::string(poison_name(poison)).c_str(), passed,
                nonfinite);
  }
}

// The prefill op on FA3 (hdim192_128), where the build has it: the smoke
// suite's records with DeepSeek dims pass (GLM's 192 / 256 is not built).
TEST(KernelLibs, FlashAttnPrefillPasses) {
  MLAGATE_REQUIRE_GPU();
  if (!detail::flash_attn_has_prefill()) GTEST_SKIP() << "built without MLAGATE_FLASH_ATTN_PREFILL";
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(make("flash_attn.mla"));
  RunConfig cfg;
  cfg.cases = load_suite("smoke").cases;
  cfg.ops = {Op::kPrefill};
  cfg.policy = make_policy("baseline", 1e-2, 1e-2);
  int passed = 0;
  for (const Record& r : run_cases(cfg, backends)) {
    if (r.status == Status::kNotSupported) continue;
    EXPECT_EQ(r.status, Status::kPassed) << r.case_id << ": " << r.message;
    passed += r.status == Status::kPassed;
  }
  EXPECT_GT(passed, 0);
  std::printf("flash_attn.mla prefill: %d smoke records passed\n", passed);
}

// The layer op with prefills past the reorder threshold (512): FA3's varlen
// MHA (hdim192_128) on the new tokens (causal) and on the cached context (not
// causal), merged through the lses, beside a decode, in bf16 and fp16.
TEST(KernelLibs, FlashAttnLayerPrefillPasses) {
  MLAGATE_REQUIRE_GPU();
  if (!detail::flash_attn_has_prefill()) GTEST_SKIP() << "built without MLAGATE_FLASH_ATTN_PREFILL";
  RunConfig cfg;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    CaseSpec c;
    c.batch = {"long_prefill", {1500, 700, 64}, {1000, 600, 1}, false, ""};
    c.tp = 16;
    c.dtype = dt;
    c.block_size = 16;
    cfg.cases.push_back(c);
  }
  cfg.ops = {Op::kLayer};
  cfg.policy = make_policy("baseline", 1e-2, 1e-2);
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(make("flash_attn.mla"));
  int passed = 0;
  for (const Record& r : run_cases(cfg, backends)) {
    EXPECT_EQ(r.status, Status::kPassed) << r.case_id << ": " << r.message;
    passed += r.status == Status::kPassed;
  }
  EXPECT_EQ(passed, 2);
  std::printf("flash_attn.mla layer with 1000- and 600-token prefills: %d of 2 passed\n", passed);
}

// The state FA3 leaves to its caller. A second forward on the same scheduler
// metadata without resetting the tile-count semaphore (two layers of one step)
// skips the tiles fetched through it: the gate must catch it (poisoned outputs
// stay NaN). The persistent buffer without its tail zeroed must pass: the
// kernels read only the head this batch's metadata fills (the suite's order
// puts smaller batches after larger ones, e.g. single_decode after
// large_decode's 32 requests, so the tail holds an earlier batch's metadata).
TEST(KernelLibs, FlashAttnCallerStateIsCaught) {
  MLAGATE_REQUIRE_GPU();
  RunConfig cfg;
  // The vllm suite's auto-cache cases at TP 1: batches with more tiles than
  // SMs, so the persistent scheduler fetches tiles through the semaphore.
  // Block size 16: the non-TMA path, where only the planted state can fail
  // (FlashAttnTmaPathLeaksTailNaN).
  for (CaseSpec c : load_suite("vllm").cases)
    if (c.kv_cache_dtype == KvCacheDtype::kAuto && c.tp == 1) {
      c.block_size = 16;
      cfg.cases.push_back(c);
    }
  ASSERT_FALSE(cfg.cases.empty());
  cfg.ops = {Op::kDecode};
  cfg.policy = make_policy("baseline", 1e-2, 1e-2);
  {
    std::vector<std::unique_ptr<Backend>> backends;
    backends.push_back(detail::make_flash_attn_mla_stale_semaphore());
    int failed = 0, ran = 0;
    for (const Record& r : run_cases(cfg, backends)) {
      if (r.status == Status::kNotSupported) continue;
      ++ran;
      failed += r.status == Status::kNonfinite || r.status == Status::kIncorrect;
    }
    EXPECT_GT(failed, 0) << "a stale semaphore went unseen in " << ran << " records";
    std::printf("stale semaphore: %d of %d vllm tp1 decode records caught\n", failed, ran);
  }
  {
    std::vector<std::unique_ptr<Backend>> backends;
    backends.push_back(detail::make_flash_attn_mla_stale_tail());
    std::map<std::string, int> by_status;
    for (const Record& r : run_cases(cfg, backends)) ++by_status[std::string(status_name(r.status))];
    for (const auto& [st, n] : by_status) std::printf("stale tail: %s %d\n", st.c_str(), n);
    // The kernels read only the head of the buffer that this batch's metadata fills.
    EXPECT_GT(by_status["PASSED"], 0);
    for (const auto& [st, n] : by_status) EXPECT_TRUE(st == "PASSED" || st == "NOT_SUPPORTED") << st << " " << n;
  }
}
#endif

// Every supported smoke and edges decode record passes against the fp64
// golden (the fixed policy of the device tests, lse included), poisoning on.
TEST(KernelLibs, SmokeAndEdgesDecodePass) {
  MLAGATE_REQUIRE_GPU();
  std::vector<std::unique_ptr<Backend>> backends;
  // flash_attn.mla* have their own (FlashAttnForcedSplitsPass, FlashAttnTmaPathLeaksTailNaN):
  // at the suites' block size 64 FA3's TMA path fails edges with NaN poison.
  for (const std::string& n : dense_adapter_names())
    if (n.rfind("flash_attn", 0) != 0) backends.push_back(make(n));
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
