// The emulation's fixed order (sdpa_emulation.h, EmulatedAttention) in its
// plain yardstick, which the CPU's fast core (cpu_attention_emulation_test.cpp)
// and the GPU emulator of --reference cuda (tests/device/test_cuda_emulation.cpp)
// reproduce byte for byte: its exponential is within 2 ulp of exp everywhere
// the softmax reaches, a hand case comes out as written, and as an
// AttentionEmulator it gives every form and op the default's bytes. A wrong
// visibility, scale or rounding in the order itself is caught by the hand case
// and by sdpa_emulation_test.cpp's errors against the fp64 reference.
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

// An emulator that counts its calls (and computes the fixed order).
int g_calls = 0;
void counting_emulator(std::span<const EmulatedAttention> calls) {
  ++g_calls;
  emulate_attention_fixed_order(calls);
}

// Set as the emulator, the yardstick is called by every form and op and gives
// each the default's bytes (the CPU's fast core computes the same order:
// cpu_attention_emulation_test.cpp).
TEST(FixedOrderEmulation, AsTheEmulatorEveryFormAndOpGivesTheDefaultsBytes) {
  for (const CaseSpec& spec : test::emulation_specs()) {
    if (spec.dtype != DType::kBF16 && spec.dtype != DType::kF16) continue;
    SCOPED_TRACE(spec.id());
    const Case c = generate_case(spec);
    test::OpInputs in(c);
    const Tensor& q_lat = in.q_lat;
    KvProjection& projection = in.projection;
    const TensorView k = projection.k_all().view(), v = projection.v_all().view();
    const SdpaResult decode = emulate_sdpa_layer(c, SdpaForm::kDecode, all_requests(c));
    const SdpaResult prefill = emulate_sdpa_layer(c, SdpaForm::kPrefill, all_requests(c), &projection);
    const SdpaResult decode_op = emulate_sdpa_decode_op(c, q_lat.view());
    const SdpaResult prefill_op = emulate_sdpa_prefill_op(c, k, v);
    g_calls = 0;
    const AttentionEmulatorScope scope(counting_emulator);
    test::expect_same_results(decode, emulate_sdpa_layer(c, SdpaForm::kDecode, all_requests(c)), "decode form");
    const int decode_calls = g_calls;
    EXPECT_GT(decode_calls, 0);
    test::expect_same_results(prefill, emulate_sdpa_layer(c, SdpaForm::kPrefill, all_requests(c), &projection),
                              "prefill form");
    EXPECT_GT(g_calls, decode_calls);
    test::expect_same_results(decode_op, emulate_sdpa_decode_op(c, q_lat.view()), "decode op");
    test::expect_same_results(prefill_op, emulate_sdpa_prefill_op(c, k, v), "prefill op");
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
  const test::TwoPieces pieces = test::project_in_two_pieces(c, split);
  ASSERT_GT(pieces.half, 0);
  ASSERT_EQ(pieces.offered, static_cast<std::size_t>(pieces.half));

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
