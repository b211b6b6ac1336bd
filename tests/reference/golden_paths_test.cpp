// The reference reference's self-consistency on real dims: the absorbed and MHA
// paths agree in fp64 on the smoke and edges suites, reference_mqa on fp64
// latent queries reproduces the absorbed path, and no bit depends on threads.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "cases/case.h"
#include "cases/suite.h"
#include "reference/fp64_reference.h"

namespace mlagate {
namespace {

constexpr double kPathTol = 1e-10;

double rms(const std::vector<double>& v) {
  double s = 0;
  std::size_t n = 0;
  for (double x : v) {
    if (std::isfinite(x)) s += x * x, ++n;
  }
  return n == 0 ? 0.0 : std::sqrt(s / static_cast<double>(n));
}

// Rows with no visible key (seq_len-0 padding) are the only ones allowed an
// infinite lse, and their output is exactly 0; nothing is ever NaN.
void expect_finite_except_empty(const Case& c, const ReferenceOutputs& g) {
  const int N = c.spec.num_heads(), V = c.spec.dims.v_head_dim;
  for (int i = 0; i < c.num_requests; ++i) {
    for (int t = c.query_start_loc[i]; t < c.query_start_loc[i + 1]; ++t) {
      const bool empty = c.context_lens[i] + (t - c.query_start_loc[i]) + 1 <= 0;
      for (int n = 0; n < N; ++n) {
        const double l = g.lse[static_cast<std::size_t>(t) * N + n];
        if (empty) {
          ASSERT_EQ(l, -INFINITY) << "request " << i << " token " << t << " head " << n;
          for (int v = 0; v < V; ++v) ASSERT_EQ(g.out[(static_cast<std::size_t>(t) * N + n) * V + v], 0.0);
        } else {
          ASSERT_TRUE(std::isfinite(l)) << "request " << i << " token " << t << " head " << n;
        }
      }
    }
  }
  for (double x : g.out) ASSERT_TRUE(std::isfinite(x));
}

// Output elements are compared relative to max(|b|, 1e-3 * rms): elements far
// below the typical magnitude carry absolute, not relative, rounding error.
void expect_paths_agree(const CaseSpec& spec) {
  SCOPED_TRACE(spec.id());
  const Case c = generate_case(spec);
  const ReferenceOutputs a = reference_absorbed(c);
  const ReferenceOutputs m = reference_mha(c);
  expect_finite_except_empty(c, a);
  expect_finite_except_empty(c, m);
  EXPECT_TRUE(m.o_lat.empty());
  EXPECT_LE(max_rel_diff(a.out, m.out, 1e-3 * rms(m.out)), kPathTol);
  EXPECT_LE(max_rel_diff(a.lse, m.lse, 1.0), kPathTol);
}

// The reference's inputs do not depend on the block size (only the paged cache
// layout does), so cases that differ only in it are checked once.
void expect_suite_paths_agree(const std::string& name) {
  const Suite suite = load_suite(name);
  ASSERT_FALSE(suite.cases.empty()) << name;
  std::set<std::string> seen;
  for (const CaseSpec& spec : suite.cases) {
    CaseSpec key = spec;
    key.block_size = 0;
    if (seen.insert(key.id()).second) expect_paths_agree(spec);
  }
}

TEST(GoldenPaths, AgreeOnSmokeSuite) { expect_suite_paths_agree("smoke"); }
TEST(GoldenPaths, AgreeOnEdgesSuite) { expect_suite_paths_agree("edges"); }

CaseSpec inline_spec(const std::string& dims, int tp, std::vector<int> seq_lens, std::vector<int> query_lens) {
  CaseSpec s;
  s.suite = "test";
  s.batch.name = "inline";
  s.batch.seq_lens = std::move(seq_lens);
  s.batch.query_lens = std::move(query_lens);
  s.dims = dims_preset(dims);
  s.tp = tp;
  return s;
}

TEST(GoldenPaths, AgreeOnInlineMixedBatch) {
  for (const char* dims : {"deepseek", "glm"}) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      CaseSpec s = inline_spec(dims, 16, {32, 40, 0}, {1, 5, 1});
      s.dtype = dt;
      expect_paths_agree(s);
    }
  }
}

TEST(GoldenPaths, AgreeOnOddDimsAndNoRope) {
  // Widths that are not multiples of a SIMD packet, and R = 0 (no RoPE part).
  for (const Dims& d : {Dims{.kv_lora_rank = 40, .rope_dim = 0, .nope_dim = 24, .v_head_dim = 8},
                        Dims{.kv_lora_rank = 9, .rope_dim = 3, .nope_dim = 5, .v_head_dim = 7}}) {
    CaseSpec s = inline_spec("deepseek", 1, {19, 7, 0, 30}, {3, 7, 1, 1});
    s.dims = d;
    s.total_heads = 3;
    expect_paths_agree(s);
  }
}

TEST(GoldenPaths, AgreeWithLargeQueryMagnitudeAndPrefillWithoutContext) {
  CaseSpec s = inline_spec("deepseek", 16, {64, 200, 1}, {64, 3, 1});
  s.q_magnitude = 8;
  expect_paths_agree(s);
}

// ql = q_nope W_UK^T by plain loops, as an F64 tensor [T, N, L].
Tensor absorbed_queries(const Case& c) {
  const Dims& d = c.spec.dims;
  const int N = c.spec.num_heads(), L = d.kv_lora_rank, P = d.nope_dim, QW = d.nope_dim + d.rope_dim;
  const std::vector<double> q = c.q.to_f64();
  const std::vector<double> w = c.w_uk.to_f64();
  Tensor ql(DType::kF64, {c.num_tokens, N, L});
  double* out = ql.data<double>();
  for (int t = 0; t < c.num_tokens; ++t) {
    for (int n = 0; n < N; ++n) {
      for (int l = 0; l < L; ++l) {
        double acc = 0;
        for (int p = 0; p < P; ++p) acc += q[(static_cast<std::size_t>(t) * N + n) * QW + p] * w[(static_cast<std::size_t>(l) * N + n) * P + p];
        out[(static_cast<std::size_t>(t) * N + n) * L + l] = acc;
      }
    }
  }
  return ql;
}

TEST(ReferenceMqa, MatchesAbsorbedPathOnF64LatentQueries) {
  for (const char* dims : {"deepseek", "glm"}) {
    const CaseSpec s = inline_spec(dims, 16, {32, 40, 0, 70}, {1, 5, 1, 9});
    SCOPED_TRACE(s.id());
    const Case c = generate_case(s);
    const ReferenceOutputs g = reference_absorbed(c);
    std::vector<double> o_lat, lse;
    reference_mqa(c, absorbed_queries(c).view(), o_lat, lse);
    EXPECT_LE(max_rel_diff(o_lat, g.o_lat, 1e-6 * rms(g.o_lat)), 1e-12);
    EXPECT_LE(max_rel_diff(lse, g.lse, 1.0), 1e-12);
  }
}

TEST(ReferenceMqa, ReadsSixteenBitLatentQueriesByValue) {
  // A bf16 q_lat and an F64 q_lat holding the same rounded values give the same bits.
  const Case c = generate_case(inline_spec("deepseek", 16, {48, 9}, {2, 9}));
  const Tensor ql = absorbed_queries(c);
  Tensor ql16(DType::kBF16, ql.shape());
  for (std::int64_t k = 0; k < ql.numel(); ++k) ql16.set(k, ql.get(k));
  Tensor ql64(DType::kF64, ql.shape());
  for (std::int64_t k = 0; k < ql.numel(); ++k) ql64.set(k, ql16.get(k));
  std::vector<double> o16, l16, o64, l64;
  reference_mqa(c, ql16.view(), o16, l16);
  reference_mqa(c, ql64.view(), o64, l64);
  EXPECT_EQ(o16, o64);
  EXPECT_EQ(l16, l64);
}

TEST(ReferenceMqa, RejectsWrongShape) {
  const Case c = generate_case(inline_spec("deepseek", 16, {8}, {1}));
  Tensor bad(DType::kF64, {1, c.spec.num_heads(), 64});
  std::vector<double> o, l;
  EXPECT_THROW(reference_mqa(c, bad.view(), o, l), std::invalid_argument);
}

TEST(GoldenDeterminism, BitsDoNotDependOnThreadCount) {
  // 8 heads; the 1100-key request's 120 tokens x 8 heads span two row chunks.
  const Case c = generate_case(inline_spec("deepseek", 16, {300, 1100, 0, 64}, {1, 120, 1, 64}));
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const ReferenceOutputs a1 = reference_absorbed(c), m1 = reference_mha(c);
  omp_set_num_threads(std::max(2, saved));
  const ReferenceOutputs a2 = reference_absorbed(c), m2 = reference_mha(c);
  omp_set_num_threads(saved);
  EXPECT_EQ(a1.out, a2.out);
  EXPECT_EQ(a1.lse, a2.lse);
  EXPECT_EQ(a1.o_lat, a2.o_lat);
  EXPECT_EQ(m1.out, m2.out);
  EXPECT_EQ(m1.lse, m2.lse);
}

}  // namespace
}  // namespace mlagate
