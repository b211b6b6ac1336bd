// The baseline emulation's attention core on the GPU (cuda_emulate_attention,
// the emulator --reference cuda sets) against its fixed order on the CPU
// (emulate_attention_fixed_order), byte for byte: random problems of every
// element type with odd depths and widths, empty rows, no keys, values whose
// exponentials are subnormal, NaN keys, rows in several chunks; every form
// and op of real cases, the prefill form's K and V uploaded or projected on
// the device from the latent rows (smoke, fp8 caches whose rounded keys are inexact, a
// TP 1 vllm prefill); and whole records of the CUDA backends: bit for bit
// those of the fixed order on the CPU, the default's and the yardstick's.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "cases/case.h"
#include "cases/encoding.h"
#include "cases/suite.h"
#include "harness/run/runner.h"
#include "reference/cuda/cuda_reference.h"
#include "reference/glue.h"
#include "reference/kv_projection.h"
#include "reference/sdpa_emulation.h"
#include "tests/reference/emulation_inputs.h"
#include "tests/require_gpu.h"

namespace mlagate {
namespace {

using test::difference;
using test::make;
using test::Problem;
using test::run;

void expect_same(const EmulatedAttention& a, const std::string& what) {
  SCOPED_TRACE(what);
  test::expect_same_outputs(a, cuda_emulate_attention, emulate_attention_fixed_order, false);
}

TEST(CudaEmulation, RandomProblemsGiveTheFixedOrdersBytes) {
  MLAGATE_REQUIRE_GPU();
  using E = EmulatedAttention::Elem;
  struct Shape {
    E elem;
    int rows, heads, keys, dqk, dv, context;
    float spread;
  };
  const Shape shapes[] = {
      {E::kF32, 64, 1, 300, 576, 512, 200, 1.0f},    // decode form, 16 tokens of 4 heads
      {E::kF32, 5, 1, 17, 70, 33, 15, 1.0f},         // odd depth and width, a partial tile everywhere
      {E::kBF16, 7, 3, 130, 192, 128, 120, 1.0f},    // prefill form
      {E::kF16, 9, 2, 65, 100, 100, 56, 1.0f},       // fp16
      {E::kBF16, 6, 2, 40, 48, 24, -3, 1.0f},        // the first rows see no key
      {E::kBF16, 3, 2, 0, 64, 64, 0, 1.0f},          // no keys at all
      {E::kBF16, 8, 2, 90, 64, 64, 80, 12.0f},       // logits far apart: subnormal and zero exponentials
      {E::kF16, 70, 2, 333, 32, 16, 300, 3.0f},      // rows over several tiles, long rows
  };
  std::uint32_t seed = 1;
  for (const Shape& s : shapes) {
    Problem p = make(s.elem, s.rows, s.heads, s.keys, s.dqk, s.dv, s.context, s.spread, seed++);
    expect_same(p.a, "shape " + std::to_string(seed - 1));
  }
  // A NaN in one key's row: NaN where it is seen, the same bits elsewhere.
  Problem p = make(E::kBF16, 8, 2, 50, 64, 32, 40, 1.0f, 99);
  p.k16[static_cast<std::size_t>(45) * 2 * 64 + 3] = kBF16QuietNaN;
  expect_same(p.a, "a NaN key");
}

// Rows in several chunks of the GPU's logits scratch (256 MiB: 64 heads of
// 8192 keys make chunks of 128 rows) give the bytes of one pass on the CPU.
TEST(CudaEmulation, RowsInSeveralChunksGiveTheSameBytes) {
  MLAGATE_REQUIRE_GPU();
  Problem p = make(EmulatedAttention::Elem::kBF16, 260, 64, 8192, 32, 16, 7900, 1.0f, 7);
  expect_same(p.a, "260 rows of 64 heads over 8192 keys");
}

using test::all_requests;

TEST(CudaEmulation, EveryFormAndOpOfRealCasesGivesTheFixedOrdersBytes) {
  MLAGATE_REQUIRE_GPU();
  std::vector<CaseSpec> specs = test::emulation_specs();
  CaseSpec big;  // vllm's medium prefill at TP 1: 128 heads, long contexts
  big.batch = find_batch_spec("medium_prefill");
  big.tp = 1;
  specs.push_back(big);
  for (const CaseSpec& spec : specs) {
    if (spec.dtype != DType::kBF16 && spec.dtype != DType::kF16) continue;
    SCOPED_TRACE(spec.id());
    const Case c = generate_case(spec);
    test::OpInputs in(c);
    const Tensor& q_lat = in.q_lat;
    KvProjection& projection = in.projection;
    const TensorView k = projection.k_all().view(), v = projection.v_all().view();
    auto all = [&](AttentionEmulator e) {
      const AttentionEmulatorScope scope(e);
      return std::vector<SdpaResult>{emulate_sdpa_layer(c, SdpaForm::kDecode, all_requests(c)),
                                     emulate_sdpa_layer(c, SdpaForm::kPrefill, all_requests(c), &projection),
                                     emulate_sdpa_decode_op(c, q_lat.view()), emulate_sdpa_prefill_op(c, k, v),
                                     emulate_sdpa_prefill_op(c, k, v, &projection)};
    };
    const std::vector<SdpaResult> gpu = all(cuda_emulate_attention), cpu = all(emulate_attention_fixed_order);
    // The prefill form and the last prefill op name their latent rows: the GPU
    // projects K and V itself there, and reads the uploaded ones in the other.
    const char* names[] = {"decode form", "prefill form", "decode op", "prefill op", "prefill op from the latent"};
    for (std::size_t i = 0; i < gpu.size(); ++i) test::expect_same_results(gpu[i], cpu[i], names[i]);
  }
}

bool same(double a, double b) { return std::isnan(a) ? std::isnan(b) : a == b; }

// Whole records of the CUDA backends (layer, decode and prefill ops, every
// kv cache of the vllm suite's medium cases at TP 16 and the smoke suite):
// with the GPU emulator, bit for bit those of the CPU's default core and of
// the yardstick, so `--reference cuda` changes no record.
TEST(CudaEmulation, RecordsAreTheCpusBitForBit) {
  MLAGATE_REQUIRE_GPU();
  std::vector<std::unique_ptr<Backend>> backends = select_backends("cuda.ref,cuda.splitkv");
  ASSERT_FALSE(backends.empty());
  RunConfig cfg;
  cfg.cases = load_suite("smoke").cases;
  for (const char* batch : {"mixed_medium", "medium_prefill", "spec_decode_medium"})
    for (KvCacheDtype kv : {KvCacheDtype::kAuto, KvCacheDtype::kFp8}) {
      CaseSpec s;
      s.batch = find_batch_spec(batch);
      s.tp = 16;
      s.kv_cache_dtype = kv;
      cfg.cases.push_back(s);
    }
  cfg.ops = {Op::kLayer, Op::kDecode, Op::kPrefill};
  cfg.policy = make_policy("baseline", 0, 0);
  const std::vector<Record> cpu = run_cases(cfg, backends);
  std::vector<Record> fixed, gpu;
  {
    const AttentionEmulatorScope scope(emulate_attention_fixed_order);
    fixed = run_cases(cfg, backends);
  }
  {
    const AttentionEmulatorScope scope(cuda_emulate_attention);
    gpu = run_cases(cfg, backends);
  }
  ASSERT_EQ(cpu.size(), gpu.size());
  ASSERT_EQ(fixed.size(), gpu.size());
  int passed = 0, metrics = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    SCOPED_TRACE(gpu[i].case_id + " " + gpu[i].backend + " " + gpu[i].op);
    EXPECT_EQ(cpu[i].status, gpu[i].status) << gpu[i].message;
    EXPECT_EQ(fixed[i].status, gpu[i].status) << gpu[i].message;
    passed += gpu[i].status == Status::kPassed;
    ASSERT_EQ(fixed[i].metrics.size(), gpu[i].metrics.size());
    ASSERT_EQ(cpu[i].metrics.size(), gpu[i].metrics.size());
    for (std::size_t k = 0; k < gpu[i].metrics.size(); ++k, ++metrics) {
      EXPECT_TRUE(same(fixed[i].metrics[k].err_baseline, gpu[i].metrics[k].err_baseline))
          << gpu[i].metrics[k].output << " " << fixed[i].metrics[k].err_baseline << " vs "
          << gpu[i].metrics[k].err_baseline;
      EXPECT_TRUE(same(cpu[i].metrics[k].err_baseline, gpu[i].metrics[k].err_baseline))
          << gpu[i].metrics[k].output << " " << cpu[i].metrics[k].err_baseline << " vs "
          << gpu[i].metrics[k].err_baseline;
      EXPECT_TRUE(same(fixed[i].metrics[k].max_abs, gpu[i].metrics[k].max_abs));
    }
  }
  std::printf("%zu records, %d passed; %d metrics' err_baseline the same on the CPU and the GPU\n", gpu.size(), passed,
              metrics);
  EXPECT_GT(passed, 0);
}

}  // namespace
}  // namespace mlagate
