// The reference reference against values worked out by hand on tiny dims
// (L=2, R=1, P=1, V=1): the causal mask, the softmax scale, the lse, the head
// layout of the weights and outputs, and the seq_len-0 padding row.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "cases/case.h"
#include "reference/fp64_reference.h"

namespace mlagate {
namespace {

constexpr double kTol = 1e-12;
constexpr double kInf = std::numeric_limits<double>::infinity();

CaseSpec tiny_spec(std::vector<int> seq_lens, std::vector<int> query_lens, int heads, std::optional<double> scale) {
  CaseSpec s;
  s.suite = "test";
  s.batch.name = "tiny";
  s.batch.seq_lens = std::move(seq_lens);
  s.batch.query_lens = std::move(query_lens);
  s.dims = Dims{.kv_lora_rank = 2, .rope_dim = 1, .nope_dim = 1, .v_head_dim = 1};
  s.total_heads = heads;
  s.tp = 1;
  s.scale = scale;
  return s;
}

// Overwrites every element; the values are chosen exactly representable in bf16.
void fill(Tensor& t, const std::vector<double>& values) {
  ASSERT_EQ(t.numel(), static_cast<std::int64_t>(values.size())) << shape_str(t.shape());
  for (std::size_t i = 0; i < values.size(); ++i) {
    t.set(static_cast<std::int64_t>(i), values[i]);
    ASSERT_EQ(t.get(static_cast<std::int64_t>(i)), values[i]) << "not exact in the model dtype";
  }
}

// Softmax over explicit logits and the weighted sum of explicit latent rows.
struct Row {
  std::array<double, 2> o_lat;
  double lse;
};
Row attend(const std::vector<double>& logits, const std::vector<std::array<double, 2>>& kv_c) {
  double z = 0;
  for (double a : logits) z += std::exp(a);
  Row r{{0, 0}, std::log(z)};
  for (std::size_t j = 0; j < logits.size(); ++j) {
    const double p = std::exp(logits[j]) / z;
    r.o_lat[0] += p * kv_c[j][0];
    r.o_lat[1] += p * kv_c[j][1];
  }
  return r;
}

// One request, context 2 (keys 0, 1) and 2 new tokens (keys 2, 3), one head.
//   W_UK[:, 0, 0] = (1, -1)  so ql = q_nope * (1, -1)
//   W_UV[:, 0, 0] = (2, 1)   so out = 2 o_lat[0] + o_lat[1]
//   q:    t0 = (q_nope 1, q_pe 0.5), t1 = (0.5, -1)
//   kv_c: (1, 0), (0, 1), (1, 1), (2, -1); k_pe: 1, 0, 2, -1
Case prefill_case(std::optional<double> scale) {
  Case c = generate_case(tiny_spec({4}, {2}, 1, scale));
  fill(c.w_uk, {1, -1});
  fill(c.w_uv, {2, 1});
  fill(c.q, {1, 0.5, 0.5, -1});
  fill(c.kv_c, {1, 0, 0, 1, 1, 1, 2, -1});
  fill(c.k_pe, {1, 0, 2, -1});
  return c;
}
const std::vector<std::array<double, 2>> kPrefillKv = {{1, 0}, {0, 1}, {1, 1}, {2, -1}};

void expect_prefill(const ReferenceOutputs& g, double s, const char* path) {
  SCOPED_TRACE(path);
  // t0 at position 2 sees the context (keys 0, 1) and itself (key 2), not key 3,
  // whose logit s*(2*1 + (-1)*(-1) + 0.5*(-1)) = 2.5s would dominate.
  const Row t0 = attend({s * (1 * 1 + (-1) * 0 + 0.5 * 1),    // key 0: 1.5s
                         s * (1 * 0 + (-1) * 1 + 0.5 * 0),    // key 1: -s
                         s * (1 * 1 + (-1) * 1 + 0.5 * 2)},   // key 2: s
                        {kPrefillKv[0], kPrefillKv[1], kPrefillKv[2]});
  // t1 at position 3 sees all four keys.
  const Row t1 = attend({s * (0.5 * 1 - 0.5 * 0 - 1 * 1),     // -0.5s
                         s * (0.5 * 0 - 0.5 * 1 - 1 * 0),     // -0.5s
                         s * (0.5 * 1 - 0.5 * 1 - 1 * 2),     // -2s
                         s * (0.5 * 2 - 0.5 * (-1) - 1 * (-1))},  // 2.5s
                        kPrefillKv);
  ASSERT_EQ(g.out.size(), 2u);
  ASSERT_EQ(g.lse.size(), 2u);
  EXPECT_NEAR(g.out[0], 2 * t0.o_lat[0] + t0.o_lat[1], kTol);
  EXPECT_NEAR(g.out[1], 2 * t1.o_lat[0] + t1.o_lat[1], kTol);
  EXPECT_NEAR(g.lse[0], t0.lse, kTol);
  EXPECT_NEAR(g.lse[1], t1.lse, kTol);
  if (!g.o_lat.empty()) {
    ASSERT_EQ(g.o_lat.size(), 4u);
    EXPECT_NEAR(g.o_lat[0], t0.o_lat[0], kTol);
    EXPECT_NEAR(g.o_lat[1], t0.o_lat[1], kTol);
    EXPECT_NEAR(g.o_lat[2], t1.o_lat[0], kTol);
    EXPECT_NEAR(g.o_lat[3], t1.o_lat[1], kTol);
  }
}

TEST(GoldenHand, MaskSeesContextAndEarlierTokensOnly) {
  const Case c = prefill_case(0.5);
  expect_prefill(reference_absorbed(c), 0.5, "absorbed");
  expect_prefill(reference_mha(c), 0.5, "mha");
}

TEST(GoldenHand, LaterTokenDoesNotLeakIntoEarlierQuery) {
  // Changing key 3 (t1's own token) must leave t0 bit-identical and move t1.
  const Case c = prefill_case(0.5);
  Case d = prefill_case(0.5);
  d.kv_c.set(6, 8);
  d.k_pe.set(3, 4);
  for (auto golden : {reference_absorbed, reference_mha}) {
    const ReferenceOutputs a = golden(c), b = golden(d);
    EXPECT_EQ(a.out[0], b.out[0]);
    EXPECT_EQ(a.lse[0], b.lse[0]);
    EXPECT_NE(a.out[1], b.out[1]);
  }
}

TEST(GoldenHand, ExplicitScale) {
  const Case c = prefill_case(0.125);
  expect_prefill(reference_absorbed(c), 0.125, "absorbed");
  expect_prefill(reference_mha(c), 0.125, "mha");
}

TEST(GoldenHand, DefaultScaleIsInverseSqrtOfHeadSize) {
  const Case c = prefill_case(std::nullopt);
  const double s = 1 / std::sqrt(2.0 + 1.0);  // 1/sqrt(L+R)
  ASSERT_EQ(c.spec.softmax_scale(), s);
  expect_prefill(reference_absorbed(c), s, "absorbed");
  expect_prefill(reference_mha(c), s, "mha");
}

TEST(GoldenHand, LseIsNaturalLogOfSumOfExp) {
  // Two keys with equal logits a: lse = a + ln 2 and both get p = 1/2.
  // One decode token (context 1), scale 1; q = (q_nope 1, q_pe 1),
  // W_UK = (1, 0), kv_c = (1, 4), (1, -4), k_pe = 0, 0: both logits 1.
  Case c = generate_case(tiny_spec({2}, {1}, 1, 1.0));
  fill(c.w_uk, {1, 0});
  fill(c.w_uv, {0, 1});  // out = o_lat[1] = (4 - 4) / 2
  fill(c.q, {1, 1});
  fill(c.kv_c, {1, 4, 1, -4});
  fill(c.k_pe, {0, 0});
  for (auto golden : {reference_absorbed, reference_mha}) {
    const ReferenceOutputs g = golden(c);
    EXPECT_NEAR(g.lse[0], 1 + std::log(2.0), kTol);
    EXPECT_NEAR(g.out[0], 0.0, kTol);
  }
}

TEST(GoldenHand, TwoHeadsUseTheirOwnWeightSlices) {
  // One decode token (context key 0, itself key 1), two heads, scale 1.
  //   W_UK[l, n, 0]: head 0 = (1, 0), head 1 = (0, 2); flat [l][n] = 1, 0, 0, 2
  //   W_UV[l, n, 0]: head 0 = (1, -1), head 1 = (0.5, 1); flat 1, 0.5, -1, 1
  //   q[0, n, :]: head 0 = (1, 0), head 1 = (-0.5, 1)
  //   kv_c: (1, 2), (-1, 0.5); k_pe: 0.5, -1
  Case c = generate_case(tiny_spec({2}, {1}, 2, 1.0));
  fill(c.w_uk, {1, 0, 0, 2});
  fill(c.w_uv, {1, 0.5, -1, 1});
  fill(c.q, {1, 0, -0.5, 1});
  fill(c.kv_c, {1, 2, -1, 0.5});
  fill(c.k_pe, {0.5, -1});
  // Head 0: ql = (1, 0); logits 1*1 + 0*2 + 0*0.5 = 1 and 1*(-1) + 0*0.5 + 0*(-1) = -1.
  const Row h0 = attend({1, -1}, {{1, 2}, {-1, 0.5}});
  // Head 1: ql = -0.5 * (0, 2) = (0, -1); logits 0 - 2 + 0.5 = -1.5 and 0 - 0.5 - 1 = -1.5,
  // so p = 1/2 each, o_lat = (0, 1.25), out = 0.5*0 + 1*1.25, lse = -1.5 + ln 2.
  for (auto golden : {reference_absorbed, reference_mha}) {
    const ReferenceOutputs g = golden(c);
    ASSERT_EQ(g.out.size(), 2u);
    EXPECT_NEAR(g.out[0], 1 * h0.o_lat[0] - 1 * h0.o_lat[1], kTol);
    EXPECT_NEAR(g.lse[0], h0.lse, kTol);
    EXPECT_NEAR(g.out[1], 1.25, kTol);
    EXPECT_NEAR(g.lse[1], -1.5 + std::log(2.0), kTol);
  }
}

// Copies element i of src into element j of dst for the pairs the map gives.
void copy_rows(const Tensor& src, Tensor& dst, std::int64_t row_width, const std::vector<std::pair<int, int>>& rows) {
  for (auto [from, to] : rows) {
    for (std::int64_t k = 0; k < row_width; ++k) dst.set(to * row_width + k, src.get(from * row_width + k));
  }
}

TEST(GoldenHand, EmptyRowIsZeroWithNegativeInfinityLse) {
  // The same two requests with and without a seq_len-0 padding request between
  // them. The padding token has nonzero q but no key: out 0, lse -inf, and the
  // other requests must not change.
  const Case base = generate_case(tiny_spec({3, 2}, {2, 1}, 2, std::nullopt));
  Case pad = generate_case(tiny_spec({3, 0, 2}, {2, 1, 1}, 2, std::nullopt));
  ASSERT_EQ(pad.num_tokens, 4);
  ASSERT_EQ(pad.num_kv_tokens, base.num_kv_tokens);
  const std::int64_t q_width = 2 * (1 + 1);  // N * (P + R)
  copy_rows(base.q, pad.q, q_width, {{0, 0}, {1, 1}, {0, 2}, {2, 3}});  // the padding token reuses t0's q
  pad.kv_c = base.kv_c;
  pad.k_pe = base.k_pe;
  pad.w_uk = base.w_uk;
  pad.w_uv = base.w_uv;

  for (auto golden : {reference_absorbed, reference_mha}) {
    const ReferenceOutputs a = golden(base), b = golden(pad);
    ASSERT_EQ(b.out.size(), 4u * 2);  // [T, N*V]
    ASSERT_EQ(b.lse.size(), 4u * 2);  // [T, N]
    for (int n = 0; n < 2; ++n) {
      EXPECT_EQ(b.out[2 * 2 + n], 0.0);
      EXPECT_EQ(b.lse[2 * 2 + n], -kInf);
    }
    for (auto [ta, tb] : {std::pair{0, 0}, {1, 1}, {2, 3}}) {
      for (int n = 0; n < 2; ++n) {
        EXPECT_NEAR(b.out[tb * 2 + n], a.out[ta * 2 + n], kTol);
        EXPECT_NEAR(b.lse[tb * 2 + n], a.lse[ta * 2 + n], kTol);
      }
    }
    if (!b.o_lat.empty()) {
      for (int k = 0; k < 2 * 2; ++k) EXPECT_EQ(b.o_lat[2 * 2 * 2 + k], 0.0);  // token 2, [N, L]
    }
  }
}

TEST(MaxRelDiff, FloorInfinitiesAndNaN) {
  EXPECT_EQ(max_rel_diff({1.0, 2.0}, {1.0, 2.0}, 1e-6), 0.0);
  EXPECT_DOUBLE_EQ(max_rel_diff({1.5, 2.0}, {1.0, 2.0}, 1e-6), 0.5);
  // |b| below the floor: divide by the floor.
  EXPECT_DOUBLE_EQ(max_rel_diff({1e-3}, {0.0}, 1e-2), 0.1);
  EXPECT_EQ(max_rel_diff({-kInf, 1.0}, {-kInf, 1.0}, 1e-6), 0.0);
  EXPECT_EQ(max_rel_diff({kInf}, {-kInf}, 1e-6), kInf);
  EXPECT_EQ(max_rel_diff({1.0}, {kInf}, 1e-6), kInf);
  EXPECT_EQ(max_rel_diff({std::nan("")}, {1.0}, 1e-6), kInf);
  EXPECT_THROW(max_rel_diff({1.0}, {1.0, 2.0}, 1e-6), std::invalid_argument);
}

}  // namespace
}  // namespace mlagate
