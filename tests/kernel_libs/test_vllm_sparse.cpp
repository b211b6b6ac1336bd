// The adapters of vLLM's other Hopper sparse MLA backends (flash_attn.mla.sparse,
// flashinfer.mla.sparse; backends/kernel_libs/README.md): what each declares
// (no GPU needed), the sparse and nope suites with their known failures, a -1
// inside a valid count refused before launch, and the cause of
// flashinfer.mla.sparse's fp8 failures pinned. Built with the libraries'
// checkouts only, as test_kernel_libs.cpp; the device tests skip without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backends.h"
#if MLAGATE_HAS_FLASHINFER
#include "backends/flashinfer/flashinfer_backend.h"
#endif
#include "cases/suite.h"
#include "harness/run/runner.h"
#include "tests/kernel_libs/adapters.h"
#include "tests/require_gpu.h"

namespace mlagate {
namespace {

#if MLAGATE_HAS_FLASHINFER_FA3 || MLAGATE_HAS_FLASH_ATTN
// vLLM's other Hopper sparse backends (flash_attn.mla.sparse, flashinfer.mla.sparse).
std::vector<std::string> vllm_sparse_names() {
  std::vector<std::string> names;
  for (const std::string& n : adapter_names())
    if (n == "flash_attn.mla.sparse" || n == "flashinfer.mla.sparse") names.push_back(n);
  return names;
}

// What each declares, with vLLM's supports_combination texts (no GPU needed).
TEST(KernelLibs, VllmSparseBackendsStateTheirLimits) {
  for (const std::string& name : vllm_sparse_names()) {
    SCOPED_TRACE(name);
    const auto b = make(name);
    EXPECT_TRUE(b->capabilities().sparse_valid_prefix);
    CaseSpec s;
    for (const CaseSpec& c : load_suite("sparse").cases)
      if (c.kv_cache_dtype == KvCacheDtype::kAuto && c.block_size == 0 && !c.sparse.sink &&
          c.sparse.pattern == IndexPattern::kRandom) {
        s = c;
        break;
      }
    EXPECT_TRUE(b->supports(s, Op::kSparseDecode).ok) << b->supports(s, Op::kSparseDecode).reason;
    expect_no(b->supports(s, Op::kSparsePrefill), "no sparse prefill kernel");
    CaseSpec t = s;
    t.sparse.sink = true;
    expect_no(b->supports(t, Op::kSparseDecode), "sink");
    t = s;
    t.sparse.pattern = IndexPattern::kLengths;
    expect_no(b->supports(t, Op::kSparseDecode), "no topk_length");
    t = s;
    t.kv_cache_dtype = KvCacheDtype::kFp8DsMla;
    EXPECT_FALSE(b->supports(t, Op::kSparseDecode).ok);
    t = s;
    t.dims.rope_dim = 0;  // NoPE MLA
    if (name == "flash_attn.mla.sparse") {
      expect_no(b->supports(t, Op::kSparseDecode), "(R) 0");
      t = s;
      t.kv_cache_dtype = KvCacheDtype::kFp8;
      expect_no(b->supports(t, Op::kSparseDecode), "FlashAttention MLA Sparse currently supports only FP16/BF16 KV cache");
    } else {
      EXPECT_TRUE(b->supports(t, Op::kSparseDecode).ok) << b->supports(t, Op::kSparseDecode).reason;
      t = s;
      t.dims.rope_dim = 32;
      expect_no(b->supports(t, Op::kSparseDecode), "FLASHINFER_MLA_SPARSE_SM90 requires qk_rope_head_dim in (0, 64)");
      t = s;
      t.dtype = DType::kF16;
      EXPECT_FALSE(b->supports(t, Op::kSparseDecode).ok);
    }
  }
}

// On the sparse and nope suites every record runs and passes, except what
// backends/flashinfer/expect.yaml names for flashinfer.mla.sparse: rows of -1
// only (NONFINITE: vLLM plans their length from the position and clamps -1 to
// slot 0) and fp8 caches with k_scale != 1 (INCORRECT: kpe_scale 1.0).
TEST(KernelLibs, VllmSparseBackendsPassTheSparseAndNopeSuites) {
  MLAGATE_REQUIRE_GPU();
  for (const std::string& name : vllm_sparse_names()) {
    for (const char* suite : {"sparse", "nope"}) {
      SCOPED_TRACE(name + " " + suite);
      std::vector<std::unique_ptr<Backend>> backends;
      backends.push_back(make(name));
      RunConfig cfg;
      cfg.cases = load_suite(suite).cases;
      cfg.ops = {Op::kSparseDecode};
      cfg.policy = make_policy("baseline", 0, 0);
      int passed = 0, known = 0, unsupported = 0;
      for (const Record& r : run_cases(cfg, backends)) {
        if (r.status == Status::kNotSupported) {
          ++unsupported;
          continue;
        }
        const bool empty_rows = r.case_id.find("idx=invalid_rows") != std::string::npos;
        const bool fp8_scaled = r.case_id.find("kv=fp8") != std::string::npos && r.case_id.find("kscale=") != std::string::npos;
        if (name == "flashinfer.mla.sparse" && (empty_rows || fp8_scaled)) {
          EXPECT_EQ(r.status, empty_rows ? Status::kNonfinite : Status::kIncorrect) << r.case_id << ": " << r.message;
          ++known;
          continue;
        }
        EXPECT_EQ(r.status, Status::kPassed) << r.case_id << ": " << r.message;
        passed += r.status == Status::kPassed;
      }
      // FA3 takes q = q_pe: NoPE's R 0 is refused (every nope record NOT_SUPPORTED); the rest run.
      if (name == "flash_attn.mla.sparse" && std::string(suite) == "nope")
        EXPECT_EQ(passed + known, 0);
      else
        EXPECT_GT(passed, 0);
      std::printf("%-22s %-6s %3d passed, %2d known failures, %3d not supported\n", name.c_str(), suite, passed, known,
                  unsupported);
    }
  }
}

// A backend that declares valid-prefix rows and is handed scattered ones
// anyway (a wrapper that withdraws the declaration): flash_attn.mla.sparse
// refuses a row with a -1 inside its valid count before launching (a CRASHED
// record naming it, never page -1 read), and the run goes on.
class WithoutPrefixRows final : public Backend {
 public:
  explicit WithoutPrefixRows(std::unique_ptr<Backend> b) : b_(std::move(b)) {}
  std::string_view name() const override { return b_->name(); }
  std::string_view description() const override { return b_->description(); }
  Capabilities capabilities() const override {
    Capabilities c = b_->capabilities();
    c.sparse_valid_prefix = false;
    return c;
  }
  Support supports(const CaseSpec& s, Op op) const override { return b_->supports(s, op); }
  void sparse_decode(const SparseDecodeArgs& a) override { b_->sparse_decode(a); }

 private:
  std::unique_ptr<Backend> b_;
};

TEST(KernelLibs, FlashAttnSparseRefusesAMinusOneInsideTheValidCount) {
  MLAGATE_REQUIRE_GPU();
  const std::vector<std::string> names = vllm_sparse_names();
  if (std::find(names.begin(), names.end(), "flash_attn.mla.sparse") == names.end())
    GTEST_SKIP() << "no flash_attn.mla.sparse in this build";
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(std::make_unique<WithoutPrefixRows>(make("flash_attn.mla.sparse")));
  RunConfig cfg;
  cfg.cases = load_suite("sparse").cases;
  cfg.ops = {Op::kSparseDecode};
  int refused = 0, passed = 0;
  for (const Record& r : run_cases(cfg, backends)) {
    if (r.status == Status::kCrashed) {
      EXPECT_NE(r.message.find("inside its valid count"), std::string::npos) << r.message;
      ++refused;
    }
    passed += r.status == Status::kPassed;
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(passed, 0);  // rows whose -1s happen to be a tail, and the rest of the run, still pass
  std::printf("flash_attn.mla.sparse on scattered rows: %d refused before launch, %d passed\n", refused, passed);
}
#endif

#if MLAGATE_HAS_FLASHINFER_FA3
// The cause of flashinfer.mla.sparse's fp8 failures: vLLM's kpe_scale 1.0.
// With kpe_scale = k_scale the same records pass.
TEST(KernelLibs, FlashInferSparseFp8FailuresAreTheUnscaledRopePart) {
  MLAGATE_REQUIRE_GPU();
  RunConfig cfg;
  for (const CaseSpec& c : load_suite("sparse").cases)
    if (c.kv_cache_dtype == KvCacheDtype::kFp8 && c.k_scale != 1.f && c.sparse.pattern != IndexPattern::kInvalidRows)
      cfg.cases.push_back(c);
  ASSERT_FALSE(cfg.cases.empty());
  cfg.ops = {Op::kSparseDecode};
  cfg.policy = make_policy("baseline", 0, 0);
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(make("flashinfer.mla.sparse"));
  backends.push_back(detail::make_flashinfer_mla_sparse_kpe_scaled());
  std::map<std::string, std::map<Status, int>> st;
  for (const Record& r : run_cases(cfg, backends)) ++st[r.backend][r.status];
  EXPECT_EQ(st["flashinfer.mla.sparse"][Status::kIncorrect], static_cast<int>(cfg.cases.size()));
  EXPECT_EQ(st["flashinfer.mla.sparse+kpe_scaled"][Status::kPassed], static_cast<int>(cfg.cases.size()));
  std::printf("fp8 k_scale != 1: vLLM's kpe_scale 1.0 INCORRECT on %d of %zu; kpe_scale = k_scale passes %d\n",
              st["flashinfer.mla.sparse"][Status::kIncorrect], cfg.cases.size(),
              st["flashinfer.mla.sparse+kpe_scaled"][Status::kPassed]);
}
#endif


}  // namespace
}  // namespace mlagate
