// The GPU fp64 reference (--reference cuda) against the Eigen reference on every
// smoke and edges case (and the smoke cases with fp8 caches, where both attend
// over the dequantized cache): relative 1e-10 with a floor of 1e-3 of the
// reference RMS. Also the cache writer of the CUDA backends, byte for byte
// against the reference writer on values chosen to hit every rounding case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cuda/cuda_backends.h"
#include "reference/cuda/cuda_reference.h"
#include "cases/case.h"
#include "cases/paged_cache.h"
#include "cases/suite.h"
#include "reference/glue.h"
#include "reference/fp64_reference.h"
#include "tests/require_gpu.h"

namespace mlagate {
namespace {

// The agreement backends/cuda/README.md documents for --reference cuda.
constexpr double kRelTol = 1e-10;

double rms(const std::vector<double>& v) {
  double s = 0;
  std::size_t n = 0;
  for (double x : v)
    if (std::isfinite(x)) s += x * x, ++n;
  return n ? std::sqrt(s / n) : 0;
}

double rel(const std::vector<double>& gpu, const std::vector<double>& eigen) {
  return max_rel_diff(gpu, eigen, 1e-3 * rms(eigen));
}

std::vector<CaseSpec> golden_cases() {
  std::vector<CaseSpec> cases = load_suite("smoke").cases;
  for (const CaseSpec& c : load_suite("edges").cases) cases.push_back(c);
  Sweep fp8, ds_mla;
  fp8.kv_dtypes = {parse_kv_cache_format("fp8")};
  ds_mla.kv_dtypes = {parse_kv_cache_format("fp8_ds_mla")};
  ds_mla.dtypes = {DType::kBF16};  // fp8_ds_mla stores bf16 RoPE
  for (const Sweep& sw : {fp8, ds_mla})
    for (const CaseSpec& c : apply_sweep(sw, load_suite("smoke"))) cases.push_back(c);
  return cases;
}

TEST(CudaGolden, AgreesWithEigenOnSmokeAndEdges) {
  MLAGATE_REQUIRE_GPU();
  double worst_out = 0, worst_lse = 0, worst_lat = 0, worst_mqa = 0;
  for (const CaseSpec& spec : golden_cases()) {
    SCOPED_TRACE(spec.id());
    const Case c = generate_case(spec);
    const ReferenceOutputs e = reference_absorbed(c);
    const ReferenceOutputs g = cuda_reference_absorbed(c);
    ASSERT_EQ(g.out.size(), e.out.size());
    ASSERT_EQ(g.lse.size(), e.lse.size());
    ASSERT_EQ(g.o_lat.size(), e.o_lat.size());
    const double r_out = rel(g.out, e.out), r_lse = rel(g.lse, e.lse), r_lat = rel(g.o_lat, e.o_lat);
    EXPECT_LE(r_out, kRelTol);
    EXPECT_LE(r_lse, kRelTol);
    EXPECT_LE(r_lat, kRelTol);
    // The decode op's reference on the same absorbed queries.
    std::vector<int> tokens(static_cast<std::size_t>(c.num_tokens));
    for (int t = 0; t < c.num_tokens; ++t) tokens[static_cast<std::size_t>(t)] = t;
    Tensor q_lat, q_pe;
    absorb_queries(c, tokens, q_lat, q_pe);
    std::vector<double> eo, el, go, gl;
    reference_mqa(c, q_lat.view(), eo, el);
    cuda_reference_mqa(c, q_lat.view(), go, gl);
    const double r_mqa = std::max(rel(go, eo), rel(gl, el));
    EXPECT_LE(r_mqa, kRelTol);
    worst_out = std::max(worst_out, r_out);
    worst_lse = std::max(worst_lse, r_lse);
    worst_lat = std::max(worst_lat, r_lat);
    worst_mqa = std::max(worst_mqa, r_mqa);
  }
  std::printf("cuda golden vs Eigen, max relative difference: out %.3g, lse %.3g, o_lat %.3g, mqa %.3g\n", worst_out,
              worst_lse, worst_lat, worst_mqa);
}

// The split MQA core (reference_mqa_splits): cases of few rows and many keys,
// where the GPU reference cuts each request's keys into ranges and merges them
// through their LSEs, agree with Eigen as the unsplit ones do. The splits are
// asserted, so a change that stopped splitting these shapes fails here; one
// case per kv format the reference reads (model dtype, dequantized fp8), with
// decode (one token, one head), several tokens that see different key counts
// (the causal edge inside a split) and a short request beside a long one (its
// later splits empty).
TEST(CudaGolden, SplitKeysAgreeWithEigen) {
  MLAGATE_REQUIRE_GPU();
  EXPECT_EQ(reference_mqa_splits(1, 1024), 1);
  EXPECT_EQ(reference_mqa_splits(1, 1025), 2);
  EXPECT_EQ(reference_mqa_splits(4096, 200000), 1);  // enough row groups: no split
  struct Shape {
    std::vector<int> seq, q;
    int heads;
    const char* kv;
  };
  const std::vector<Shape> shapes = {{{20000}, {1}, 1, "auto"},
                                     {{9000, 300}, {5, 2}, 2, "fp8"},
                                     {{50001, 7}, {1, 7}, 4, "auto"},
                                     {{12345}, {16}, 1, "fp8_ds_mla"}};
  for (const Shape& sh : shapes) {
    CaseSpec spec;
    spec.suite = "split";
    spec.batch.name = "long";
    spec.batch.seq_lens = sh.seq;
    spec.batch.query_lens = sh.q;
    spec.total_heads = sh.heads;
    spec.kv_cache_dtype = parse_kv_cache_format(sh.kv).dtype;
    spec.seed = 7;
    SCOPED_TRACE(spec.id());
    const Case c = generate_case(spec);
    long long groups = 0;
    for (std::size_t i = 0; i < sh.q.size(); ++i) groups += (sh.q[i] * sh.heads + 15) / 16;
    const int max_keys = *std::max_element(sh.seq.begin(), sh.seq.end());
    ASSERT_GT(reference_mqa_splits(groups, max_keys), 1);
    const ReferenceOutputs e = reference_absorbed(c);
    const ReferenceOutputs g = cuda_reference_absorbed(c);
    ASSERT_EQ(g.out.size(), e.out.size());
    EXPECT_LE(rel(g.out, e.out), kRelTol);
    EXPECT_LE(rel(g.lse, e.lse), kRelTol);
    EXPECT_LE(rel(g.o_lat, e.o_lat), kRelTol);
  }
}

// Values that exercise e4m3 rounding: ties to even, subnormals, saturation,
// signed zero, and tiles whose scale rule matters (all zero, amax on a power
// of two, tiny amax).
std::vector<double> special_values() {
  std::vector<double> v = {0.0, -0.0, 1.0, -1.0, 1.0625, 1.1875, -1.0625, 448.0, 464.0, 480.0, 1000.0, -1e4,
                           0.001953125, 0.0029296875, 0.0009765625, 0.00146484375, 1e-6, -3e-5, 0.0137, 336.0,
                           240.0, 0.5, 0.75, 3.0, 2.9, 100.5, 65504.0};
  return v;
}

TEST(CudaCacheWrite, BitExactWithTheReferenceWriterForEveryCacheDtype) {
  MLAGATE_REQUIRE_GPU();
  const std::vector<double> specials = special_values();
  int compared = 0;
  for (const char* fmt : {"auto", "fp8", "fp8_e4m3", "fp8_ds_mla", "fp8_ds_mla:raw"}) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      for (float k_scale : {1.0f, 3.0f, 0.37f}) {
        CaseSpec spec = load_suite("smoke").cases.front();  // small_decode, tp16
        spec.kv_cache_dtype = parse_kv_cache_format(fmt).dtype;
        spec.scale_rule = parse_kv_cache_format(fmt).scale_rule;
        spec.dtype = dt;
        if (spec.kv_cache_dtype == KvCacheDtype::kFp8DsMla && (dt != DType::kBF16 || k_scale != 1.0f)) continue;
        if (spec.kv_cache_dtype == KvCacheDtype::kAuto && k_scale != 1.0f) continue;
        spec.k_scale = k_scale;
        SCOPED_TRACE(spec.id());
        const Case c = generate_case(spec);
        CacheOptions co;
        co.write_new_tokens = false;
        const PagedCache base = build_paged_cache(c, 16, co);
        const int L = spec.dims.kv_lora_rank, R = spec.dims.rope_dim;
        // Tokens: one of special values in every position, then scaled normal
        // draws from the case, then an all-zero token (fp8_ds_mla: zero tiles).
        const int n = 6;
        Tensor kv(dt, {n, L}), pe(dt, {n, R});
        for (int t = 0; t < n; ++t) {
          for (int i = 0; i < L; ++i) {
            const double x = t == 0 ? specials[i % specials.size()]
                             : t == n - 1 ? 0.0
                                          : c.kv_c.get((t * 7 + i) % c.kv_c.numel()) * std::pow(4.0, t - 2);
            kv.set(t * L + i, x);
          }
          for (int i = 0; i < R; ++i)
            pe.set(t * R + i, t == 0 ? specials[(i + 5) % specials.size()] : t == n - 1 ? 0.0 : c.k_pe.get(i) * t);
        }
        // Slots: the first tokens of request 0's blocks and one skipped slot.
        std::vector<std::int64_t> slots;
        for (int t = 0; t < n; ++t) slots.push_back(t == 2 ? -1 : base.slot_of(0, t));
        PagedCache want = base, got = base;
        reference_cache_write(want, kv.view(), pe.view(), slots);
        auto be = make_cuda_ref();
        be->cache_write(got, kv.view(), pe.view(), slots);
        ASSERT_EQ(got.data.nbytes(), want.data.nbytes());
        const std::string diff = first_cache_difference(got, want, slots, c.query_start_loc);
        EXPECT_TRUE(diff.empty()) << diff;
        ++compared;
      }
    }
  }
  std::printf("cache_write: %d format x dtype x k_scale combinations bit-exact\n", compared);
}

}  // namespace
}  // namespace mlagate
