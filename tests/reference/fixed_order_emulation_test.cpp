// The emulation's fixed order (sdpa_emulation.h, EmulatedAttention), which
// the GPU emulator of --reference cuda reproduces byte for byte
// (tests/device/test_cuda_emulation.cpp): its exponential is within 2 ulp of
// exp everywhere the softmax reaches, and as an AttentionEmulator it gives
// every form and op the Eigen path's results up to last-bit noise: the same
// rows filled, the same empty rows, errors against the fp64 reference of the
// same size. A wrong visibility, scale, lane sum or rounding is caught by the
// comparison with the Eigen path, which shares none of its code.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cases/case.h"
#include "cases/encoding.h"
#include "cases/suite.h"
#include "reference/detail/emulation_math.h"
#include "reference/fp64_reference.h"
#include "reference/glue.h"
#include "reference/kv_projection.h"
#include "reference/sdpa_emulation.h"
#include "tests/reference/emulation_inputs.h"

namespace mlagate {
namespace {

using test::all_requests;

// Distance in fp32 ulps (same sign, finite).
std::int64_t ulps(float a, float b) {
  const auto ia = static_cast<std::int64_t>(std::bit_cast<std::int32_t>(a));
  const auto ib = static_cast<std::int64_t>(std::bit_cast<std::int32_t>(b));
  return std::llabs(ia - ib);
}

TEST(FixedOrderEmulation, ExponentialIsWithinTwoUlpOverTheSoftmaxRange) {
  std::int64_t worst = 0;
  float at = 0;
  // Every 64th float in [-104, 0], then the normal/subnormal edge densely.
  for (std::uint32_t u = std::bit_cast<std::uint32_t>(-0.0f); u <= std::bit_cast<std::uint32_t>(-104.0f); u += 64) {
    const float x = std::bit_cast<float>(u);
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const float got = detail::emu_exp(x);
    if (want < std::numeric_limits<float>::min()) {
      // Subnormal results: at most one unit of the subnormal spacing off.
      ASSERT_LE(std::fabs(got - want), std::numeric_limits<float>::denorm_min()) << x;
      continue;
    }
    if (ulps(got, want) > worst) worst = ulps(got, want), at = x;
  }
  EXPECT_LE(worst, 2) << "at x = " << at;
  EXPECT_EQ(detail::emu_exp(0.0f), 1.0f);
  EXPECT_EQ(detail::emu_exp(-0.0f), 1.0f);
  EXPECT_EQ(detail::emu_exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(detail::emu_exp(-200.0f), 0.0f);
  EXPECT_TRUE(std::isnan(detail::emu_exp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(detail::emu_exp(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_NEAR(detail::emu_exp(1.0f), 2.7182817f, 3e-7f);
}

// A small problem written out by hand: two rows, three keys, causal.
TEST(FixedOrderEmulation, ComputesAttentionAsWrittenOnAHandCase) {
  const std::vector<float> q{1, 0, 0, 1};              // rows [2, dqk 2]
  const std::vector<float> k{1, 0, 0, 1, 1, 1};        // keys [3, 2]
  const std::vector<float> v{1, 2, 3, 4, 5, 6};        // values [3, 2]
  std::vector<float> o(4), mx(2), sum(2);
  EmulatedAttention a;
  a.q = q.data(), a.q_row = 2;
  a.k = k.data(), a.k_row = 2;
  a.v = v.data(), a.v_row = 2;
  a.rows = 2, a.context = 1, a.keys = 3, a.dqk = 2, a.dv = 2, a.scale = 0.5f, a.bf16 = true;
  a.o = o.data(), a.max = mx.data(), a.sum = sum.data();
  emulate_attention_fixed_order({&a, 1});
  // Row 0 sees keys 0, 1 (context 1 + 1): logits 1, 0 -> x 0.5, 0; m 0.5.
  EXPECT_EQ(mx[0], 0.5f);
  const double e = std::exp(-0.5);
  EXPECT_NEAR(sum[0], 1 + e, 1e-6);
  const double p1 = bf16_to_f32(f32_to_bf16(static_cast<float>(e)));
  EXPECT_NEAR(o[0], (1 + p1 * 3) / (1 + e), 1e-2);
  EXPECT_NEAR(o[1], (2 + p1 * 4) / (1 + e), 1e-2);
  // Row 1 sees all three: logits 0, 1, 1 -> m 0.5, probabilities e, 1, 1.
  EXPECT_EQ(mx[1], 0.5f);
  EXPECT_NEAR(sum[1], 2 + e, 1e-6);
  EXPECT_NEAR(o[2], (p1 * 1 + 3 + 5) / (2 + e), 2e-2);
  EXPECT_NEAR(o[3], (p1 * 2 + 4 + 6) / (2 + e), 2e-2);
  // Outputs are model-dtype values.
  for (float x : o) EXPECT_EQ(x, bf16_to_f32(f32_to_bf16(x)));
  // A row that sees nothing: context -1 -> row 0 sees 0 keys.
  a.context = -1;
  emulate_attention_fixed_order({&a, 1});
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_EQ(o[1], 0.0f);
  EXPECT_EQ(mx[0], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(sum[0], 0.0f);
}

// Eigen's path and the fixed order, both emulations of one case: the same
// shape of result, last-bit differences only.
void expect_close(const SdpaResult& eigen, const SdpaResult& fixed, const std::vector<double>& ref_out,
                  const std::vector<double>& ref_lse, bool bf16, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(eigen.out.size(), fixed.out.size());
  ASSERT_EQ(eigen.lse.size(), fixed.lse.size());
  ASSERT_EQ(eigen.out_f32_keys.size(), fixed.out_f32_keys.size());
  std::size_t differ = 0;
  double max_ref = 0;
  for (double r : ref_out)
    if (std::isfinite(r)) max_ref = std::max(max_ref, std::fabs(r));
  const double ulp = std::ldexp(1.0, std::ilogb(std::max(max_ref, 1e-30)) - (bf16 ? 7 : 10));
  for (std::size_t i = 0; i < eigen.out.size(); ++i) {
    const double a = eigen.out[i], b = fixed.out[i];
    ASSERT_EQ(std::isnan(a), std::isnan(b)) << i;  // the same rows filled
    if (std::isnan(a)) continue;
    if (a != b) ++differ;
    ASSERT_LE(std::fabs(a - b), 2 * ulp) << i;
  }
  // Most outputs agree exactly (the model-dtype rounding hides the fp32 order).
  EXPECT_LT(differ, eigen.out.size() / 4 + 1);
  for (std::size_t i = 0; i < eigen.lse.size(); ++i) {
    const double a = eigen.lse[i], b = fixed.lse[i];
    ASSERT_EQ(std::isnan(a), std::isnan(b)) << i;
    if (std::isnan(a) || std::isinf(a) || std::isinf(b)) {
      if (!std::isnan(a)) {
        ASSERT_EQ(a, b) << i;  // empty rows: -inf on both
      }
      continue;
    }
    ASSERT_NEAR(a, b, 1e-5 * std::max(1.0, std::fabs(a))) << i;
  }
  // err_baseline of the same size.
  const double e1 = baseline_error(eigen, false, ref_out, 0, ref_out.size());
  const double e2 = baseline_error(fixed, false, ref_out, 0, ref_out.size());
  EXPECT_GT(e2, 0.5 * e1);
  EXPECT_LT(e2, 2.0 * e1 + ulp);
  EXPECT_NEAR(baseline_error(fixed, true, ref_lse, 0, ref_lse.size()),
              baseline_error(eigen, true, ref_lse, 0, ref_lse.size()), 1e-4);
}

// An emulator that counts its calls (and computes the fixed order).
int g_calls = 0;
void counting_emulator(std::span<const EmulatedAttention> calls) {
  ++g_calls;
  emulate_attention_fixed_order(calls);
}

TEST(FixedOrderEmulation, AsTheEmulatorEveryFormAndOpAgreesWithEigen) {
  for (const CaseSpec& spec : test::emulation_specs()) {
    if (spec.dtype != DType::kBF16 && spec.dtype != DType::kF16) continue;
    SCOPED_TRACE(spec.id());
    const Case c = generate_case(spec);
    const bool bf16 = spec.dtype == DType::kBF16;
    const ReferenceOutputs g = reference_absorbed(c);
    test::OpInputs in(c);
    const Tensor& q_lat = in.q_lat;
    KvProjection& projection = in.projection;
    const TensorView k = projection.k_all().view(), v = projection.v_all().view();
    std::vector<double> mqa_out, mqa_lse;
    reference_mqa(c, q_lat.view(), mqa_out, mqa_lse);

    const SdpaResult decode = emulate_sdpa_layer(c, SdpaForm::kDecode, all_requests(c));
    const SdpaResult prefill = emulate_sdpa_layer(c, SdpaForm::kPrefill, all_requests(c), &projection);
    const SdpaResult decode_op = emulate_sdpa_decode_op(c, q_lat.view());
    const SdpaResult prefill_op = emulate_sdpa_prefill_op(c, k, v);
    g_calls = 0;
    const AttentionEmulatorScope scope(counting_emulator);
    expect_close(decode, emulate_sdpa_layer(c, SdpaForm::kDecode, all_requests(c)), g.out, g.lse, bf16, "decode form");
    const int decode_calls = g_calls;
    EXPECT_GT(decode_calls, 0);
    expect_close(prefill, emulate_sdpa_layer(c, SdpaForm::kPrefill, all_requests(c), &projection), g.out, g.lse, bf16,
                 "prefill form");
    EXPECT_GT(g_calls, decode_calls);
    expect_close(decode_op, emulate_sdpa_decode_op(c, q_lat.view()), mqa_out, mqa_lse, bf16, "decode op");
    expect_close(prefill_op, emulate_sdpa_prefill_op(c, k, v), g.out, g.lse, bf16, "prefill op");
  }
}

// A request whose projected rows lie in two pieces (the glue's prefill
// chunks): the prefill form names its latent rows instead of gathering K and
// V, and the fixed order projects them itself, to the same bytes as reading
// one piece's K and V. The calls' K and V are null there (the path is taken).
int g_projected_calls = 0;
void counting_latent(std::span<const EmulatedAttention> calls) {
  for (const EmulatedAttention& a : calls) g_projected_calls += a.keys > 0 && !a.k && a.latent;
  emulate_attention_fixed_order(calls);
}

TEST(FixedOrderEmulation, RowsInTwoPiecesAreProjectedFromTheirLatentRows) {
  const Case c = generate_case(load_suite("smoke").cases[2]);  // mixed_small
  test::OpInputs whole(c);
  // Half of request 0's rows offered first, as a prefill chunk would, then the rest.
  KvProjection split(c);
  const std::int64_t kv0 = c.kv_start_loc[0], half = c.seq_lens[0] / 2;
  ASSERT_GT(half, 0);
  const std::int64_t L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim;
  auto* kv = const_cast<std::uint16_t*>(split.kv().data<std::uint16_t>()) + kv0 * L;
  auto* pe = const_cast<std::uint16_t*>(split.pe().data<std::uint16_t>()) + kv0 * R;
  const TensorView kv_part{c.spec.dtype, {half, L}, kv}, pe_part{c.spec.dtype, {half, R}, pe};
  auto k = std::make_shared<Tensor>(), v = std::make_shared<Tensor>();
  up_project_kv(c, kv_part, pe_part, *k, *v);
  std::vector<std::int64_t> rows(static_cast<std::size_t>(half));
  std::iota(rows.begin(), rows.end(), kv0);
  ASSERT_EQ(split.offer(kv_part, pe_part, rows, k, v), static_cast<std::size_t>(half));
  split.ensure(all_requests(c));

  const AttentionEmulatorScope scope(counting_latent);
  g_projected_calls = 0;
  const SdpaResult from_pieces = emulate_sdpa_layer(c, SdpaForm::kPrefill, all_requests(c), &split);
  EXPECT_GT(g_projected_calls, 0) << "no call took its K and V from the latent rows";
  const int split_calls = g_projected_calls;
  const SdpaResult from_one = emulate_sdpa_layer(c, SdpaForm::kPrefill, all_requests(c), &whole.projection);
  EXPECT_EQ(g_projected_calls, split_calls) << "contiguous rows are read, not projected again";
  ASSERT_EQ(from_pieces.out.size(), from_one.out.size());
  EXPECT_EQ(std::memcmp(from_pieces.out.data(), from_one.out.data(), from_one.out.size() * sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(from_pieces.lse.data(), from_one.lse.data(), from_one.lse.size() * sizeof(double)), 0);
  // The prefill op given its projection names the latent rows too; the bytes stay.
  const SdpaResult op = emulate_sdpa_prefill_op(c, whole.projection.k_all().view(), whole.projection.v_all().view(),
                                                &whole.projection);
  const SdpaResult op_plain =
      emulate_sdpa_prefill_op(c, whole.projection.k_all().view(), whole.projection.v_all().view());
  EXPECT_EQ(std::memcmp(op.out.data(), op_plain.out.data(), op.out.size() * sizeof(double)), 0);
}

// The fixed order gives the same bits for a request alone and beside others,
// and at any thread count (its work units are rows; no sum crosses them).
TEST(FixedOrderEmulation, EachRequestsBitsDependOnItsOwnRowsAlone) {
  const Case c = generate_case(load_suite("smoke").cases[2]);  // mixed_small
  const AttentionEmulatorScope scope(emulate_attention_fixed_order);
  for (SdpaForm f : {SdpaForm::kDecode, SdpaForm::kPrefill}) {
    const SdpaResult whole = emulate_sdpa_layer(c, f, all_requests(c));
    for (int i = 0; i < c.num_requests; ++i) {
      const std::vector<int> one{i};
      const SdpaResult alone = emulate_sdpa_layer(c, f, one);
      const std::size_t per_token = whole.out.size() / static_cast<std::size_t>(c.num_tokens);
      for (std::size_t x = c.query_start_loc[i] * per_token; x < c.query_start_loc[i + 1] * per_token; ++x)
        ASSERT_EQ(std::memcmp(&alone.out[x], &whole.out[x], sizeof(double)), 0) << sdpa_form_name(f) << " " << i;
    }
  }
}

}  // namespace
}  // namespace mlagate
