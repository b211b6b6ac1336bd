// Tests for cases/encoding: fp32 <-> bf16/fp16 must be bit-exact round to
// nearest even everywhere (ties, subnormals, overflow, NaN, signed zero), since
// the rounded values are the case inputs every backend and the reference share.
#include "cases/encoding.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace mlagate {
namespace {

float f32(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t u32(float f) { return std::bit_cast<std::uint32_t>(f); }

bool bf16_is_nan(std::uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x007Fu) != 0; }
bool f16_is_nan(std::uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0; }

// A binary format for the slow references below: precision p (with the
// implicit bit), smallest normal 2^emin, largest finite max_finite.
struct Format {
  int p;
  int emin;
  double max_finite;
};
constexpr Format kBF16Format{8, -126, 0x1.FEp127};
constexpr Format kF16Format{11, -14, 65504.0};

// Exact rational rounding in double: x has 24 significant bits, the quantum of
// its binade is a power of two, so ldexp/floor/subtraction are all exact and
// the tie test is exact. Overflow follows IEEE: round with unbounded exponent,
// then anything above max_finite is infinity.
double round_ref(float xf, const Format& f) {
  const double x = xf;
  if (x == 0 || std::isinf(x)) return x;
  const double a = std::fabs(x);
  int e2;
  std::frexp(a, &e2);                        // a = m * 2^e2, m in [0.5, 1)
  const int e = std::max(e2 - 1, f.emin);    // binade exponent, clamped to the subnormal range
  const int q = e - (f.p - 1);               // quantum 2^q
  const double scaled = std::ldexp(a, -q);  // exact
  double n = std::floor(scaled);
  const double frac = scaled - n;            // exact
  if (frac > 0.5 || (frac == 0.5 && std::fmod(n, 2.0) != 0)) n += 1;
  double r = std::ldexp(n, q);
  if (r > f.max_finite) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, x);
}

// Independent decoders (not the code under test) from the IEEE definitions.
double decode_f16(std::uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v;
  if (e == 0x1F) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0) v = std::ldexp(m, -24);
  else v = std::ldexp(1024 + m, e - 25);
  return s ? -v : v;
}
double decode_bf16(std::uint16_t b) {
  const int s = b >> 15, e = (b >> 7) & 0xFF, m = b & 0x7F;
  double v;
  if (e == 0xFF) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0) v = std::ldexp(m, -133);
  else v = std::ldexp(128 + m, e - 134);
  return s ? -v : v;
}

// Same value and, for zeros and infinities, same sign.
bool same_value(double a, double b) { return a == b && std::signbit(a) == std::signbit(b); }

TEST(Bf16, RoundsTiesToEvenBothWays) {
  EXPECT_EQ(f32_to_bf16(f32(0x3F808000u)), 0x3F80);  // tie, lower neighbour even: down
  EXPECT_EQ(f32_to_bf16(f32(0x3F818000u)), 0x3F82);  // tie, upper neighbour even: up
  EXPECT_EQ(f32_to_bf16(f32(0xBF808000u)), 0xBF80);  // sign does not change the rule
  EXPECT_EQ(f32_to_bf16(f32(0xBF818000u)), 0xBF82);
  EXPECT_EQ(f32_to_bf16(f32(0x3F808001u)), 0x3F81);  // just above a tie: up
  EXPECT_EQ(f32_to_bf16(f32(0x3F807FFFu)), 0x3F80);  // just below a tie: down
  EXPECT_EQ(f32_to_bf16(f32(0x3F81FFFFu)), 0x3F82);
  EXPECT_EQ(f32_to_bf16(f32(0x3F80FFFFu)), 0x3F81);
}

TEST(Bf16, OverflowAndSpecials) {
  EXPECT_EQ(f32_to_bf16(f32(0x7F7F8000u)), 0x7F80);  // max finite + half ulp: tie to even = inf
  EXPECT_EQ(f32_to_bf16(f32(0xFF7F8000u)), 0xFF80);
  EXPECT_EQ(f32_to_bf16(f32(0x7F7F7FFFu)), 0x7F7F);  // just below: stays max finite
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  // fp32 subnormals round like everything else (bf16 shares fp32's exponent).
  EXPECT_EQ(f32_to_bf16(f32(0x00008000u)), 0x0000);
  EXPECT_EQ(f32_to_bf16(f32(0x00018000u)), 0x0002);
  EXPECT_EQ(f32_to_bf16(f32(0x007FFFFFu)), 0x0080);  // largest subnormal rounds into the normals
}

TEST(Bf16, NaNStaysNaNAndQuiet) {
  // NaNs whose payload sits only in the 16 dropped bits: truncation would give inf.
  for (std::uint32_t u : {0x7F800001u, 0x7F808000u, 0x7FFFFFFFu, 0x7FC00000u, 0x7FA00000u, 0xFF800001u, 0xFFC00000u}) {
    const std::uint16_t b = f32_to_bf16(f32(u));
    EXPECT_TRUE(bf16_is_nan(b)) << std::hex << u << " -> " << b;
    EXPECT_TRUE(b & 0x0040u) << "quiet bit not set: " << std::hex << u << " -> " << b;
    EXPECT_EQ(b & 0x8000u, (u >> 16) & 0x8000u) << "sign lost: " << std::hex << u;
  }
  EXPECT_EQ(f32_to_bf16(f32(0x7FC00000u)), kBF16QuietNaN);
}

TEST(Bf16, EveryPatternRoundTrips) {
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto b = static_cast<std::uint16_t>(i);
    const float f = bf16_to_f32(b);
    ASSERT_EQ(u32(f), i << 16) << "bf16 widening is a 16-bit shift";
    const std::uint16_t back = f32_to_bf16(f);
    if (bf16_is_nan(b)) {
      ASSERT_TRUE(bf16_is_nan(back)) << std::hex << i;
      ASSERT_EQ(back & 0x8000u, b & 0x8000u);
    } else {
      ASSERT_EQ(back, b) << std::hex << i;
    }
  }
}

// rounded_again_16bit is the round trip through fp32 on every pattern of
// both dtypes: what lets the emulation take a query's bits without its fp32.
TEST(Encoding, RoundedAgainIsTheRoundTripThroughFp32OnEveryPattern) {
  std::size_t nans = 0;
  for (std::uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    ASSERT_EQ(rounded_again_16bit(h, true), f32_to_bf16(bf16_to_f32(h))) << std::hex << b;
    ASSERT_EQ(rounded_again_16bit(h, false), f32_to_f16(f16_to_f32(h))) << std::hex << b;
    nans += rounded_again_16bit(h, true) != h;
  }
  EXPECT_EQ(nans, 126u) << "bf16's signalling NaNs change (63 payloads of each sign), nothing else";
}

TEST(F16, EveryPatternRoundTripsAndDecodesExactly) {
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float f = f16_to_f32(h);
    const double want = decode_f16(h);
    if (f16_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      // Sign and payload kept: the bits shifted into fp32's places.
      ASSERT_EQ(std::bit_cast<std::uint32_t>(f), ((i & 0x8000u) << 16) | 0x7F800000u | ((i & 0x3FFu) << 13)) << std::hex << i;
      ASSERT_TRUE(f16_is_nan(f32_to_f16(f))) << std::hex << i;
    } else {
      ASSERT_TRUE(same_value(f, want)) << std::hex << i << ": " << f << " vs " << want;
      ASSERT_EQ(f32_to_f16(f), h) << std::hex << i;
    }
  }
}

// The case-by-case statement of fp32 -> fp16 (RNE, subnormals, overflow to
// inf, quiet NaN), against which f32_bits_to_f16's branch-free form is held.
std::uint16_t f16_by_cases(std::uint32_t u) {
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x0200u : 0u));
  if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  const int exp = static_cast<int>(abs >> 23) - 127;
  const std::uint32_t mant = (abs & 0x007FFFFFu) | 0x00800000u;
  if (exp < -25) return sign;
  if (exp < -14) {
    const int shift = -exp - 1;
    const std::uint32_t kept = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    return static_cast<std::uint16_t>(sign | (kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u)));
  }
  std::uint32_t h = (static_cast<std::uint32_t>(exp + 15) << 10) | ((mant >> 13) & 0x3FFu);
  const std::uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

TEST(F16, BranchFreeFormEqualsTheCaseByCaseOneOnEveryBoundary) {
  // Every half value, the fp32 midpoint to the next one and its neighbours
  // (where RNE decides), both signs; the ends of each path; then a sweep of
  // all 2^32 patterns in steps of 997 (every exponent, NaN payloads).
  std::vector<std::uint32_t> at;
  for (std::uint32_t h = 0; h < 0x7C00u; ++h) {
    const float lo = f16_to_f32(static_cast<std::uint16_t>(h)), hi = f16_to_f32(static_cast<std::uint16_t>(h + 1));
    const std::uint32_t mid = u32(static_cast<float>((static_cast<double>(lo) + hi) / 2));  // exact in fp32
    for (std::uint32_t v : {u32(lo), mid - 1, mid, mid + 1}) at.push_back(v), at.push_back(v | 0x80000000u);
  }
  for (std::uint32_t v : {0x33000000u, 0x33000001u, 0x387FFFFFu, 0x38800000u, 0x477FEFFFu, 0x477FF000u, 0x7F7FFFFFu,
                          0x7F800000u, 0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu, 0x00000001u, 0x007FFFFFu})
    at.push_back(v), at.push_back(v | 0x80000000u);
  for (std::uint64_t v = 0; v <= 0xFFFFFFFFull; v += 997) at.push_back(static_cast<std::uint32_t>(v));
  for (std::uint32_t u : at) ASSERT_EQ(f32_bits_to_f16(u), f16_by_cases(u)) << std::hex << u;
  EXPECT_GT(at.size(), 4000000u);
}

TEST(F16, RoundsTiesToEvenInNormals) {
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3C00);      // tie between 0x3C00 and 0x3C01: even is down
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie between 0x3C01 and 0x3C02: even is up
  EXPECT_EQ(f32_to_f16(-(1.0f + 3 * 0x1p-11f)), 0xBC02);
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + 0x1p-11f, 2.0f)), 0x3C01);  // just above a tie: up
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + 3 * 0x1p-11f, 0.0f)), 0x3C01);
  EXPECT_EQ(f32_to_f16(2047.5f), 0x6800);  // 2047.5 ties 2047 (odd) and 2048: to 2048
  EXPECT_EQ(f32_to_f16(2046.5f), 0x67FE);  // ties 2046 (even) and 2047
}

TEST(F16, Subnormals) {
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // exactly half of it: tie to even (0)
  EXPECT_EQ(f32_to_f16(-0x1p-25f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);  // just above half: up
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 0.0f)), 0x0000);
  EXPECT_EQ(f32_to_f16(0x1p-26f), 0x0000);
  EXPECT_EQ(f32_to_f16(1e-30f), 0x0000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);  // 1.5 units: tie, even is 2
  EXPECT_EQ(f32_to_f16(5 * 0x1p-25f), 0x0002);  // 2.5 units: tie, even is 2
  EXPECT_EQ(f32_to_f16(7 * 0x1p-25f), 0x0004);  // 3.5 units: tie, even is 4
  EXPECT_EQ(f32_to_f16(1023 * 0x1p-24f), 0x03FF);        // largest subnormal
  EXPECT_EQ(f32_to_f16(1023.5f * 0x1p-24f), 0x0400);     // tie with the smallest normal (even)
  EXPECT_EQ(f32_to_f16(1022.5f * 0x1p-24f), 0x03FE);
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);               // smallest normal
}

TEST(F16, OverflowAndSpecials) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);  // largest finite stays
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7BFF);  // below max + half ulp
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // max + half ulp: tie to even = inf
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xFC00);
  EXPECT_EQ(f32_to_f16(1e10f), 0x7C00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  for (std::uint32_t u : {0x7F800001u, 0x7FC00000u, 0xFFC00001u, 0x7F802000u}) {
    const std::uint16_t h = f32_to_f16(f32(u));
    EXPECT_TRUE(f16_is_nan(h)) << std::hex << u;
    EXPECT_TRUE(h & 0x0200u) << "quiet bit not set: " << std::hex << u;
    EXPECT_EQ(h & 0x8000u, (u >> 16) & 0x8000u);
  }
  EXPECT_EQ(f32_to_f16(f32(0x7FC00000u)), kF16QuietNaN);
}

// Random fp32 values over every exponent the formats care about, plus exact
// midpoints between neighbouring 16-bit values and their fp32 neighbours
// (random mantissas almost never hit a tie).
template <class Encode, class Decode>
void check_against_reference(const Format& f, Encode encode, Decode decode, int exp_lo, int exp_hi,
                             std::uint16_t finite_max) {
  std::mt19937_64 rng(12345);  // fully specified engine: the sample is the same everywhere
  int checked = 0;
  auto check = [&](float x) {
    const std::uint16_t got = encode(x);
    const double want = round_ref(x, f);
    ASSERT_TRUE(same_value(decode(got), want)) << std::hexfloat << x << " -> 0x" << std::hex << got << ", want "
                                               << std::hexfloat << want;
    ++checked;
  };
  for (int n = 0; n < 500'000; ++n) {
    const std::uint64_t r = rng();
    const auto biased = static_cast<std::uint32_t>(exp_lo + static_cast<int>(r % static_cast<unsigned>(exp_hi - exp_lo + 1)));
    const std::uint32_t u = (static_cast<std::uint32_t>(r >> 32) & 0x80000000u) | (biased << 23) |
                            (static_cast<std::uint32_t>(r >> 8) & 0x007FFFFFu);
    check(f32(u));
  }
  for (int n = 0; n < 170'000; ++n) {
    // Any finite non-negative value up to the largest, whose upper neighbour is inf.
    const auto h = static_cast<std::uint16_t>(rng() % (finite_max + 1u));
    const double lo = decode(h), hi = decode(static_cast<std::uint16_t>(h + 1));
    // Midpoints need p+1 bits: exact in fp32 for both formats, subnormals included.
    const float mid = static_cast<float>(std::isinf(hi) ? f.max_finite + (f.max_finite - decode(h - 1)) / 2
                                                        : (lo + hi) / 2);
    const float sign = (n & 1) ? -1.0f : 1.0f;
    check(sign * mid);
    check(sign * std::nextafter(mid, 0.0f));
    check(sign * std::nextafter(mid, std::numeric_limits<float>::infinity()));
  }
  EXPECT_GT(checked, 1'000'000);
}

TEST(F16, MatchesExactReferenceOnAMillionValues) {
  // Biased fp32 exponents 97..145: 2^-30 (below the subnormals) to 2^18 (overflow).
  check_against_reference(kF16Format, f32_to_f16, decode_f16, 97, 145, 0x7BFF);
}

TEST(Bf16, MatchesExactReferenceOnAMillionValues) {
  // Every fp32 exponent, subnormals (0) included; 255 is inf/NaN, tested above.
  check_against_reference(kBF16Format, f32_to_bf16, decode_bf16, 0, 254, 0x7F7F);
}

}  // namespace
}  // namespace mlagate
