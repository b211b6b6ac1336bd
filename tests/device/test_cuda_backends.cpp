// GPU tests of the CUDA backends: every suite passes on every CUDA backend in
// every op, in every kv cache dtype and at one and many splits; planted device
// faults are caught (an out-of-bounds write by the guard bands, an unwritten
// row by the poison); results do not depend on repetition or case order; each
// case's cache is uploaded once per block size. Tests that need a GPU skip
// where there is none (CI), and there the backends must give SKIPPED records.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backends/cuda/cache_store.h"
#include "backends/cuda/cuda_backends.h"
#include "cases/errors.h"
#include "cases/suite.h"
#include "gpu/sync_policy.h"
#include "harness/cli/cli.h"
#include "harness/run/runner.h"
#include "harness/run/serving.h"
#include "tests/require_gpu.h"

namespace mlagate {
namespace {

// The gate of the CPU backends' suite tests (tests/harness/test_detection.cpp):
// tighter than the vllm policy and checks lse too.
Policy strict() { return make_policy("fixed", 5e-2, 1e-2); }

std::vector<std::unique_ptr<Backend>> cuda_backends(int splits = 0) {
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cuda_ref());
  bs.push_back(make_cuda_splitkv(BackendOptions{splits}));
  return bs;
}

const std::vector<Op> kAllOps = {Op::kLayer, Op::kDecode, Op::kPrefill, Op::kCacheWrite};

// Runs and expects every record to pass; NOT_SUPPORTED only where a backend
// lacks the kernel (cuda.splitkv has no prefill).
void expect_all_pass(const std::vector<CaseSpec>& cases, std::vector<std::unique_ptr<Backend>>& backends,
                     const std::vector<Op>& ops, const std::string& what) {
  // Q magnitudes past 16 (edges' 64 and 128) put logits beyond fp32 exp's
  // range: the output error grows with them (0.28 on the correct CPU
  // backends), so a fixed atol means nothing there; the baseline policy,
  // whose emulation makes the same error, gates those cases.
  std::vector<Record> records;
  for (const bool large_q : {false, true}) {
    RunConfig cfg;
    for (const CaseSpec& c : cases)
      if ((c.q_magnitude > 16) == large_q) cfg.cases.push_back(c);
    if (cfg.cases.empty()) continue;
    cfg.ops = ops;
    cfg.policy = large_q ? make_policy("baseline", 0, 0) : strict();
    for (Record& r : run_cases(cfg, backends)) records.push_back(std::move(r));
  }
  std::map<std::string, int> passed;
  for (const Record& r : records) {
    if (r.status == Status::kNotSupported && r.backend == "cuda.splitkv" && r.op == "prefill") continue;
    EXPECT_EQ(r.status, Status::kPassed) << what << ": " << status_name(r.status) << " " << r.backend << " " << r.op
                                         << " " << r.case_id << ": " << r.message;
    if (r.status == Status::kPassed) ++passed[r.backend + " " + r.op];
  }
  for (const auto& [k, n] : passed) std::printf("%-40s %-24s %4d passed\n", what.c_str(), k.c_str(), n);
  // An empty run passes nothing: every backend passes something in every op it has.
  for (const auto& b : backends)
    for (const Op op : ops) {
      if (b->name() == "cuda.splitkv" && op == Op::kPrefill) continue;
      const std::string key = std::string(b->name()) + " " + std::string(op_name(op));
      EXPECT_GT(passed[key], 0) << what << ": no passing record for " << key;
    }
}

TEST(CudaDevice, QueryNamesTheDevice) {
  MLAGATE_REQUIRE_GPU();
  const CudaDeviceInfo& d = cuda_device_info();
  std::printf("%s\n", d.str().c_str());
  EXPECT_FALSE(d.name.empty());
  EXPECT_EQ(d.sm_major, 9);
  EXPECT_GT(d.multiprocessors, 0);
  EXPECT_GT(d.total_bytes, std::size_t{1} << 30);
}

// MLAGATE_CUDA_SYNC sets how the process waits on its GPU: the flag the context reports afterwards is the one asked
// for, and an unknown value is refused in words, the flag left as it was.
TEST(CudaDevice, SyncPolicyTakesTheFlagAskedFor) {
  MLAGATE_REQUIRE_GPU();
  const char* before = std::getenv("MLAGATE_CUDA_SYNC");
  const std::string saved = before ? before : "";
  for (const std::string want : {"block", "yield", "spin"}) {
    ::setenv("MLAGATE_CUDA_SYNC", want.c_str(), 1);
    EXPECT_EQ(apply_cuda_sync_policy(), "MLAGATE_CUDA_SYNC=" + want);
    EXPECT_EQ(cuda_sync_policy_in_effect(), want);
  }
  ::setenv("MLAGATE_CUDA_SYNC", "sometimes", 1);
  EXPECT_NE(apply_cuda_sync_policy().find("ignored"), std::string::npos);
  EXPECT_EQ(cuda_sync_policy_in_effect(), "spin");
  if (before) ::setenv("MLAGATE_CUDA_SYNC", saved.c_str(), 1);
  else ::unsetenv("MLAGATE_CUDA_SYNC");
}

TEST(CudaDevice, WithoutADeviceEveryRecordIsSkipped) {
  if (cuda_device_info().available) GTEST_SKIP() << "a CUDA device is present";
  auto backends = cuda_backends();
  RunConfig cfg;
  cfg.cases = load_suite("smoke").cases;
  cfg.ops = kAllOps;
  for (const Record& r : run_cases(cfg, backends)) {
    if (r.status == Status::kNotSupported) continue;  // cuda.splitkv prefill: decided before any device call
    EXPECT_EQ(r.status, Status::kSkipped) << r.backend << " " << r.op << " " << r.case_id << ": " << r.message;
    EXPECT_NE(r.message.find("CUDA device"), std::string::npos) << r.message;
  }
  // --reference cuda needs a device: a usage error, not a crash.
  std::vector<std::string> args{"mlagate", "run", "--reference", "cuda", "--no-progress"};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  EXPECT_EQ(cli_main(static_cast<int>(argv.size()), argv.data()), kExitUsage);
}

class CudaSuites : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaSuites, EveryRecordPasses) {
  MLAGATE_REQUIRE_GPU();
  auto backends = cuda_backends();
  expect_all_pass(load_suite(GetParam()).cases, backends, kAllOps, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Suites, CudaSuites, ::testing::Values("smoke", "edges", "vllm"));

// The smoke cases in every fp8 cache format (fp8_ds_mla stores bf16 RoPE, so
// its cases are bf16 only).
std::vector<CaseSpec> smoke_in_fp8_formats() {
  Sweep per_tensor, ds_mla;
  per_tensor.kv_dtypes = {parse_kv_cache_format("fp8"), parse_kv_cache_format("fp8_e4m3")};
  ds_mla.kv_dtypes = {parse_kv_cache_format("fp8_ds_mla"), parse_kv_cache_format("fp8_ds_mla:raw")};
  ds_mla.dtypes = {DType::kBF16};
  std::vector<CaseSpec> cases = apply_sweep(per_tensor, load_suite("smoke"));
  for (const CaseSpec& c : apply_sweep(ds_mla, load_suite("smoke"))) cases.push_back(c);
  return cases;
}

// Every fp8 cache format through the layer, the decode kernel and the writer.
TEST(CudaFp8, SmokeInEveryCacheDtype) {
  MLAGATE_REQUIRE_GPU();
  std::vector<CaseSpec> cases = smoke_in_fp8_formats();
  // k_scale != 1 for the per-tensor formats.
  for (CaseSpec& c : cases)
    if (c.kv_cache_dtype == KvCacheDtype::kFp8 && c.batch.name == "mixed_small") c.k_scale = 3.0f;
  auto backends = cuda_backends();
  expect_all_pass(cases, backends, {Op::kLayer, Op::kDecode, Op::kCacheWrite}, "smoke x fp8 formats");
}

// Split-KV's edge cases live at one split and at more splits than keys (empty
// splits, whose lse is -inf, must weigh nothing). One run, so the three
// backends share each case's golden.
TEST(CudaSplitKv, OneAndManySplitsPass) {
  MLAGATE_REQUIRE_GPU();
  std::vector<CaseSpec> cases = load_suite("smoke").cases;
  for (const CaseSpec& c : load_suite("edges").cases) cases.push_back(c);
  std::vector<std::unique_ptr<Backend>> bs;
  for (int splits : {1, 7, 1000}) bs.push_back(make_cuda_splitkv(BackendOptions{splits}));
  expect_all_pass(cases, bs, {Op::kLayer, Op::kDecode}, "smoke+edges splits=1,7,1000");
}

// --cuda-graph on the CUDA backends: a real CUDA graph per capture size,
// replayed for every later case of that size (its inputs, metadata and cache
// copied into the captured addresses), padding rows of seq_len 0 and 1: every
// uniform decode case passes, with coarse capture sizes (every batch padded)
// and with vLLM's; graphs are reused across cases.
TEST(CudaGraph, CapturedDecodeReplaysEveryCase) {
  MLAGATE_REQUIRE_GPU();
  std::vector<CaseSpec> cases = load_suite("smoke").cases;
  for (const CaseSpec& c : load_suite("edges").cases) cases.push_back(c);
  for (const std::vector<int>& sizes : {std::vector<int>{8, 64, 512}, default_capture_sizes()}) {
    std::vector<std::unique_ptr<Backend>> bs;
    bs.push_back(make_cuda_ref());
    bs.push_back(make_cuda_splitkv(BackendOptions{}));
    RunConfig cfg;
    cfg.cases = cases;
    cfg.ops = {Op::kDecode};
    const ServingMode mode = modes::CudaGraph{sizes, make_graph_store()};
    cfg.run_job = [&cfg, mode](CaseContext& ctx, Backend& b, Op op) { return run_serving(ctx, b, op, cfg, mode); };
    int passed = 0, replayed = 0;
    for (const Record& r : run_cases(cfg, bs)) {
      EXPECT_TRUE(r.status == Status::kPassed || r.status == Status::kNotSupported)
          << r.backend << " " << r.case_id << ": " << r.message;
      passed += r.status == Status::kPassed;
      replayed += r.message.find("replayed, captured at") != std::string::npos;
      if (r.status == Status::kPassed) {
        EXPECT_EQ(r.message.rfind("CUDA graph", 0), 0u) << r.message;
      }
    }
    std::printf("cuda graphs (capture sizes %zu): %d records passed, %d replayed a graph captured earlier\n",
                sizes.size(), passed, replayed);
    EXPECT_GT(passed, 30);
    EXPECT_GT(replayed, 10);
  }
}

// A kernel that writes one element past the end of its output: the device
// guard bands catch it, INCORRECT with "out-of-bounds write", on every op.
TEST(CudaGuards, OutOfBoundsWriteIsIncorrect) {
  MLAGATE_REQUIRE_GPU();
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(detail::make_cuda_ref_with_faults({.write_past_end = true}));
  RunConfig cfg;
  cfg.cases = load_suite("smoke").cases;
  cfg.ops = {Op::kLayer, Op::kDecode, Op::kPrefill};
  cfg.policy = strict();
  int caught = 0;
  for (const Record& r : run_cases(cfg, bs)) {
    EXPECT_EQ(r.status, Status::kIncorrect) << r.op << " " << r.case_id << ": " << r.message;
    EXPECT_NE(r.message.find("out-of-bounds write: byte 0 past the end of"), std::string::npos) << r.message;
    caught += r.status == Status::kIncorrect;
  }
  std::printf("planted out-of-bounds write: %d records INCORRECT\n", caught);
}

// Layout strided on the device (cases/LAYOUTS.md): cuda.ref and cuda.splitkv
// read q_lat / q_pe as slices of one fused q and write o / lse with the
// views' strides. Both pass every strided record of the layout suite, decode
// and layer. The device copy of a strided output is the view's span, from its
// first element to its last: the planted one-past-the-end write (the element
// after the last head row, where the row's padding starts) lands in the guard
// band past the span and is INCORRECT as an out-of-bounds write, as it is for
// contiguous outputs (writes into the padding between rows come back to the
// host, where the padding check sees them: bug.writes_row_padding).
TEST(CudaStrided, StridedViewsPassAndAWritePastTheLastRowIsCaught) {
  MLAGATE_REQUIRE_GPU();
  std::vector<CaseSpec> cases;
  for (const CaseSpec& c : load_suite("layout").cases)
    if (c.layout.strided && !c.sparse.active()) cases.push_back(c);
  ASSERT_FALSE(cases.empty());
  RunConfig cfg;
  cfg.cases = cases;
  cfg.ops = {Op::kDecode, Op::kLayer};
  int passed = 0;
  {
    std::vector<std::unique_ptr<Backend>> bs;
    bs.push_back(make_cuda_ref());
    bs.push_back(make_cuda_splitkv({}));
    for (const Record& r : run_cases(cfg, bs)) {
      EXPECT_TRUE(r.status == Status::kPassed || r.status == Status::kNotSupported)
          << r.backend << " " << r.op << " " << r.case_id << ": " << r.message;
      passed += r.status == Status::kPassed;
    }
  }
  EXPECT_GE(passed, 8);
  cfg.ops = {Op::kDecode};
  int caught = 0, ran = 0;
  std::vector<std::unique_ptr<Backend>> planted;
  planted.push_back(detail::make_cuda_ref_with_faults({.write_past_end = true}));
  for (const Record& r : run_cases(cfg, planted)) {
    if (r.status == Status::kNotSupported) continue;
    ++ran;
    EXPECT_EQ(r.status, Status::kIncorrect) << r.case_id << ": " << r.message;
    EXPECT_NE(r.message.find("out-of-bounds write: byte 0 past the end of o_lat"), std::string::npos) << r.message;
    caught += r.status == Status::kIncorrect;
  }
  EXPECT_GT(ran, 0);
  std::printf("strided views on the device: %d records passed; the planted write past the last row caught on %d of %d\n",
              passed, caught, ran);
}

// Layout strided's stacked cache on the device: the device copy of the pool
// sits between the other layers' bytes (the host's placement), every kernel
// gets the layer's pointer, and a write into another layer is found.
TEST(CudaStrided, TheDeviceCacheIsOneLayerOfAStackedCache) {
  MLAGATE_REQUIRE_GPU();
  CaseSpec spec;
  spec.batch = {"stacked", {300, 40}, {1, 1}};
  spec.tp = 16;
  spec.layout.strided = true;
  const Case c = generate_case(spec);
  const PagedCache pc = build_paged_cache(c, 16);
  ASSERT_GT(pc.data.placement().before, 0);
  ASSERT_GT(pc.data.placement().after, 0);
  gpu::Stream s;
  const std::shared_ptr<const gpu::DeviceCache> dc = gpu::DeviceCacheStore::instance().get(pc, s.get());
  EXPECT_EQ(dc->before, static_cast<std::size_t>(pc.data.placement().before));
  EXPECT_EQ(dc->after, static_cast<std::size_t>(pc.data.placement().after));
  EXPECT_EQ(dc->data.size(), dc->before + pc.data.nbytes() + dc->after);
  EXPECT_EQ(dc->other_layers_change(s.get()), "");
  // The layer's first bytes are the host pool's.
  std::vector<std::byte> head(4096);
  dc->data.download(head.data(), head.size(), s.get(), dc->before);
  EXPECT_EQ(std::memcmp(head.data(), pc.data.bytes(), head.size()), 0);
  // One byte written just past the layer: named.
  MLAGATE_CUDA_CHECK(cudaMemsetAsync(static_cast<unsigned char*>(dc->layer()) + pc.data.nbytes(), 0, 1, s.get()));
  EXPECT_NE(dc->other_layers_change(s.get()).find("the layers after this one, byte 0"), std::string::npos);
  gpu::DeviceCacheStore::instance().clear();  // the entry was damaged on purpose
}

// A kernel that never writes one row: the poisoned device output comes back
// as NaN there, NONFINITE with the row located.
TEST(CudaPoison, UnwrittenRowIsNonfinite) {
  MLAGATE_REQUIRE_GPU();
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(detail::make_cuda_ref_with_faults({.skip_row = 3}));
  RunConfig cfg;
  cfg.cases = load_suite("smoke").cases;
  cfg.ops = {Op::kLayer, Op::kDecode, Op::kPrefill};
  cfg.policy = strict();
  for (const Record& r : run_cases(cfg, bs)) {
    EXPECT_EQ(r.status, Status::kNonfinite) << r.op << " " << r.case_id << ": " << r.message;
    EXPECT_NE(r.message.find("NaN"), std::string::npos) << r.message;
  }
}

// The same inputs give the same bits: run twice, and in reverse case order,
// capturing every output. A difference is a finding (nondeterminism or order
// dependence), reported with where it is.
TEST(CudaDeterminism, RepeatAndReverseOrderGiveIdenticalBits) {
  MLAGATE_REQUIRE_GPU();
  std::vector<CaseSpec> cases = load_suite("edges").cases;
  for (const CaseSpec& c : load_suite("vllm").cases)
    if (c.tp == 8 && (c.batch.name == "mixed_medium" || c.batch.name == "spec_decode_medium")) cases.push_back(c);
  using Key = std::string;
  auto capture = [&](const std::vector<CaseSpec>& order) {
    std::map<Key, std::vector<std::byte>> got;
    auto backends = cuda_backends();
    RunConfig cfg;
    cfg.cases = order;
    cfg.ops = {Op::kLayer, Op::kDecode, Op::kPrefill};
    cfg.policy = strict();
    cfg.on_outputs = [&](const Case& c, const Record& r, std::span<const ProducedOutput> outs) {
      for (const ProducedOutput& po : outs) {
        const TensorView v = po.buf.view();
        const auto* p = static_cast<const std::byte*>(v.data);
        got[c.spec.id() + " " + r.backend + " " + r.op + " " + po.name].assign(p, p + v.nbytes());
      }
    };
    run_cases(cfg, backends);
    return got;
  };
  const auto first = capture(cases);
  const auto again = capture(cases);
  std::vector<CaseSpec> reversed(cases.rbegin(), cases.rend());
  const auto backwards = capture(reversed);
  ASSERT_FALSE(first.empty());
  int differ = 0;
  for (const auto& [k, bytes] : first) {
    for (const auto* other : {&again, &backwards}) {
      const auto it = other->find(k);
      ASSERT_NE(it, other->end()) << k;
      if (it->second != bytes) {
        ++differ;
        ADD_FAILURE() << (other == &again ? "repeat" : "reverse order") << " changed the bits of " << k;
      }
    }
  }
  std::printf("determinism: %zu outputs compared over repeat and reverse order, %d differ\n", first.size(), differ);
}

// Each case's cache is uploaded once per block size and shared by both CUDA
// backends. Once only: the decode op's cache (new tokens written by the
// reference writer) is byte-identical to the layer's after the CUDA writer,
// so the store finds it by content.
TEST(CudaCache, UploadedOncePerCaseAndBlockSize) {
  MLAGATE_REQUIRE_GPU();
  Sweep sw;
  sw.block_sizes = {64};
  const std::vector<CaseSpec> cases = apply_sweep(sw, load_suite("smoke"));
  auto backends = cuda_backends();
  RunConfig cfg;
  cfg.cases = cases;
  cfg.ops = {Op::kLayer, Op::kDecode};
  cfg.policy = strict();
  const std::uint64_t before = cuda_cache_uploads();
  for (const Record& r : run_cases(cfg, backends)) EXPECT_EQ(r.status, Status::kPassed) << r.case_id << ": " << r.message;
  EXPECT_EQ(cuda_cache_uploads() - before, cases.size());
}

// Kernel time comes from CUDA events around the launches; printed for the
// decode op on a few vllm shapes at TP 1 (backends/cuda/README.md quotes them).
TEST(CudaTiming, KernelTimeIsMeasured) {
  MLAGATE_REQUIRE_GPU();
  auto backends = cuda_backends();
  for (const char* spec : {"medium_decode", "large_decode", "large_prefill"}) {
    RunConfig cfg;
    Sweep sw;
    sw.specs = {spec};
    sw.tps = {1};
    cfg.cases = apply_sweep(sw, std::nullopt);
    cfg.ops = {Op::kDecode};
    cfg.policy = strict();
    for (const Record& r : run_cases(cfg, backends)) EXPECT_EQ(r.status, Status::kPassed) << r.message;
    for (const auto& b : backends) {
      const double ms = detail::cuda_last_kernel_ms(*b);
      std::printf("%s: %s tp1 decode op, kernels %.3f ms\n", std::string(b->name()).c_str(), spec, ms);
      EXPECT_GT(ms, 0.0);
    }
  }
}

}  // namespace
}  // namespace mlagate
