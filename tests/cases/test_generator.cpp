// Tests for cases/generator: the counter-based generator's bits are pinned (any
// change must bump gen::kGeneratorVersion), its log is accurate to 2 ulp and its
// normal samples have the right moments.
#include "cases/generator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

// cases/generator.cpp built without AVX-512 (generator_portable.cpp).
namespace mlagate_portable::gen {
void normals_at(std::uint64_t stream, std::uint64_t first, std::int64_t n, double* out);
}  // namespace mlagate_portable::gen

namespace mlagate {
namespace {

std::uint64_t dbits(double d) { return std::bit_cast<std::uint64_t>(d); }

// Distance in units in the last place between two finite doubles.
std::int64_t ulp_distance(double a, double b) {
  auto ordered = [](double d) {
    const auto i = std::bit_cast<std::int64_t>(d);
    return i < 0 ? std::numeric_limits<std::int64_t>::min() - i : i;  // monotone over all finite doubles
  };
  const std::int64_t x = ordered(a), y = ordered(b);
  return x > y ? x - y : y - x;
}

TEST(Generator, HashesMatchTheirPublishedDefinitions) {
  // splitmix64's first output for state 0, and FNV-1a 64 test vectors: the
  // building blocks are the standard ones, not look-alikes.
  EXPECT_EQ(gen::mix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(gen::tensor_key(""), 0xCBF29CE484222325ull);
  EXPECT_EQ(gen::tensor_key("a"), 0xAF63DC4C8601EC8Cull);
}

// Pinned outputs. Computed once from the generator as written; changing the
// generator changes every case's inputs (and invalidates golden files), so a
// change here requires bumping gen::kGeneratorVersion and updating these.
TEST(Generator, PinnedBits) {
  ASSERT_EQ(gen::kGeneratorVersion, 2) << "generator version bumped: re-pin the values below";
  struct Pin {
    std::uint64_t seed;
    const char* tensor;
    std::uint64_t index, sub;
    std::uint64_t bits, uniform, normal;
  };
  const Pin pins[] = {
      {0, "q", 0, 0, 0x2185705A95C79033ull, 0x3FC0C2B82D4AE3CAull, 0xBFCDD1B5292E4C8Full},
      {0, "q", 1, 0, 0xC275CB1EF9A1DB5Aull, 0x3FE84EB963DF343Cull, 0xBFC605560844DE57ull},
      {42, "kv_c", 12345, 3, 0xB0A166C13FA85DA3ull, 0x3FE6142CD827F50Cull, 0x3FEA007F19A56AC3ull},
      {7, "w_uk", 7, 0, 0x4B2C02DA7B0458E8ull, 0x3FD2CB00B69EC117ull, 0xC0041396DE0FF965ull},
      {~0ull, "k_pe", 1ull << 40, 1, 0xB2C67EC4D867DF53ull, 0x3FE658CFD89B0CFCull, 0x3FF952335843C862ull},
  };
  EXPECT_EQ(gen::tensor_key("q"), 0xAF63EC4C860207BCull);
  for (const Pin& p : pins) {
    SCOPED_TRACE(std::string(p.tensor) + "[" + std::to_string(p.index) + "] seed " + std::to_string(p.seed));
    const std::uint64_t key = gen::tensor_key(p.tensor);
    EXPECT_EQ(gen::bits(p.seed, key, p.index, p.sub), p.bits);
    EXPECT_EQ(dbits(gen::uniform(p.seed, key, p.index, p.sub)), p.uniform);
    EXPECT_EQ(dbits(gen::normal(p.seed, key, p.index)), p.normal);  // normal ignores sub
  }
  EXPECT_EQ(gen::below(1000, 5, gen::tensor_key("block_perm"), 9), 573u);
}

// FNV-1a 64 over bytes: a digest pin catches a change in any one bit of many values.
std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h = 0xCBF29CE484222325ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001B3ull;
  return h;
}

// Same rule as PinnedBits: re-pin only together with a kGeneratorVersion bump.
TEST(Generator, PinnedDigests) {
  ASSERT_EQ(gen::kGeneratorVersion, 2) << "generator version bumped: re-pin the values below";
  std::uint64_t normals = 0xCBF29CE484222325ull, logs = normals;
  const std::uint64_t key = gen::tensor_key("digest");
  for (std::uint64_t i = 0; i < 100'000; ++i) {
    const double v = gen::normal(0, key, i);
    normals = fnv1a(&v, sizeof v, normals);
    const double l = gen::det_log((static_cast<double>(i) + 0.5) / 100'000.0);
    logs = fnv1a(&l, sizeof l, logs);
  }
  EXPECT_EQ(normals, 0x07BF7D584A313D9Eull);
  EXPECT_EQ(logs, 0x5D100FC877B8D829ull);
}

TEST(Generator, UniformIsItsTopBitsPlusOneHalf) {
  // Documented construction: 53 bits, offset by half a unit so 0 and 1 never occur.
  for (std::uint64_t i = 0; i < 1000; ++i) {
    const std::uint64_t b = gen::bits(3, 4, i, 5);
    EXPECT_EQ(gen::uniform(3, 4, i, 5), (static_cast<double>(b >> 11) + 0.5) * 0x1p-53);
  }
}

// The hoisted per-tensor stream used in fill loops must give the same values.
TEST(Generator, StreamFormMatchesKeyedForm) {
  for (std::uint64_t seed : {0ull, 7ull, ~0ull})
    for (const char* name : {"q", "kv_c", "w_uv"}) {
      const std::uint64_t key = gen::tensor_key(name);
      const std::uint64_t st = gen::stream(seed, key);
      for (std::uint64_t i = 0; i < 2000; ++i)
        ASSERT_EQ(dbits(gen::normal(seed, key, i)), dbits(gen::normal_at(st, i))) << name << "[" << i << "]";
    }
}

TEST(Generator, EveryKeyComponentMatters) {
  const std::uint64_t base = gen::bits(1, 2, 3, 4);
  EXPECT_NE(gen::bits(0, 2, 3, 4), base);
  EXPECT_NE(gen::bits(1, 0, 3, 4), base);
  EXPECT_NE(gen::bits(1, 2, 0, 4), base);
  EXPECT_NE(gen::bits(1, 2, 3, 0), base);
  // Swapping components must not collide (a plain XOR of the key would).
  EXPECT_NE(gen::bits(2, 1, 3, 4), base);
  EXPECT_NE(gen::bits(1, 3, 2, 4), base);
}

TEST(Generator, DetLogWithinTwoUlpOfStdLog) {
  std::mt19937_64 rng(99);
  std::vector<double> xs = {1.0,
                            std::nextafter(1.0, 0.0),
                            std::nextafter(1.0, 2.0),
                            1.4142135623730951,  // the range-reduction switch point
                            std::nextafter(1.4142135623730951, 0.0),
                            std::nextafter(1.4142135623730951, 2.0),
                            0.5,
                            2.0,
                            std::numeric_limits<double>::max(),
                            std::numeric_limits<double>::min(),
                            std::numeric_limits<double>::denorm_min(),
                            std::nextafter(std::numeric_limits<double>::min(), 0.0)};
  for (int e = -1074; e <= 1023; ++e)
    for (int k = 0; k < 48; ++k) {
      const double m = 1.0 + static_cast<double>(rng() >> 12) * 0x1p-52;  // [1, 2)
      const double x = std::ldexp(m, e);  // below 2^-1022 this rounds to a subnormal
      if (x > 0 && std::isfinite(x)) xs.push_back(x);
    }
  // Marsaglia's s = a^2 + b^2 lives in (0, 1): sample it densely.
  for (int k = 0; k < 100'000; ++k) xs.push_back((static_cast<double>(rng() >> 11) + 0.5) * 0x1p-53);
  std::int64_t worst = 0;
  double worst_x = 0;
  for (double x : xs) {
    const std::int64_t d = ulp_distance(gen::det_log(x), std::log(x));
    if (d > worst) worst = d, worst_x = x;
  }
  EXPECT_LE(worst, 2) << "at x = " << std::hexfloat << worst_x;
  EXPECT_EQ(gen::det_log(1.0), 0.0);
}

TEST(Generator, NormalMomentsOnAMillionDraws) {
  constexpr int kN = 1'000'000;
  const std::uint64_t key = gen::tensor_key("moments");
  double s1 = 0, s2 = 0, s3 = 0, s4 = 0;
  int tail = 0, negative = 0;
  for (int i = 0; i < kN; ++i) {
    const double x = gen::normal(11, key, static_cast<std::uint64_t>(i));
    s1 += x, s2 += x * x, s3 += x * x * x, s4 += x * x * x * x;
    tail += std::fabs(x) > 1.959963984540054;
    negative += x < 0;
  }
  const double mean = s1 / kN, var = s2 / kN - mean * mean;
  // Bounds at about 5 standard errors: sd(mean) = 1e-3, sd(var) = 1.4e-3,
  // sd(E x^3) = sqrt(15/n) = 3.9e-3, sd(E x^4) = sqrt(96/n) = 9.8e-3,
  // sd(5% tail) = 2.2e-4, sd(sign) = 5e-4.
  EXPECT_NEAR(mean, 0.0, 5e-3);
  EXPECT_NEAR(var, 1.0, 7e-3);
  EXPECT_NEAR(s3 / kN, 0.0, 2e-2);
  EXPECT_NEAR(s4 / kN, 3.0, 5e-2);
  EXPECT_NEAR(static_cast<double>(tail) / kN, 0.05, 1.1e-3);
  EXPECT_NEAR(static_cast<double>(negative) / kN, 0.5, 2.5e-3);
}

TEST(Generator, UniformAndBelowAreUniform) {
  constexpr int kN = 200'000;
  double s1 = 0, s2 = 0;
  std::vector<int> bins(10);
  for (int i = 0; i < kN; ++i) {
    const double u = gen::uniform(5, 6, static_cast<std::uint64_t>(i), 0);
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
    s1 += u, s2 += u * u;
    const std::uint64_t b = gen::below(10, 5, 7, static_cast<std::uint64_t>(i));
    ASSERT_LT(b, 10u);
    ++bins[b];
  }
  EXPECT_NEAR(s1 / kN, 0.5, 3.5e-3);
  EXPECT_NEAR(s2 / kN - (s1 / kN) * (s1 / kN), 1.0 / 12, 1e-3);  // 5 sd of 1.7e-4 plus slack
  double chi2 = 0;
  for (int c : bins) chi2 += (c - kN / 10.0) * (c - kN / 10.0) / (kN / 10.0);
  EXPECT_LT(chi2, 33.7) << "chi-square, 9 dof, p = 1e-4";
}

}  // namespace
}  // namespace mlagate

namespace mlagate {
namespace {

// normals_at (the vectorized fill of every input tensor) gives normal_at's
// bits exactly, built for this machine and without AVX-512: any first index
// (odd ones start at a pair's second normal), any length (full and partial
// lanes, steps and blocks of 512 normals).
TEST(Generator, NormalsAtIsNormalAtBitForBit) {
  const std::uint64_t st = gen::stream(12345, gen::tensor_key("w_uk"));
  for (const auto& [first, n] : std::vector<std::pair<std::uint64_t, std::int64_t>>{
           {0, 1}, {1, 1}, {0, 7}, {3, 9}, {1, 511}, {0, 512}, {1, 512}, {5, 513}, {0, 200003}, {1ull << 40, 4099},
           {(1ull << 40) + 1, 1025}, {~0ull - 100, 64}, {~0ull - 63, 64}}) {
    std::vector<double> got(static_cast<std::size_t>(n)), portable(got.size());
    gen::normals_at(st, first, n, got.data());
    mlagate_portable::gen::normals_at(st, first, n, portable.data());
    for (std::int64_t i = 0; i < n; ++i) {
      const double want = gen::normal_at(st, first + static_cast<std::uint64_t>(i));
      ASSERT_EQ(std::bit_cast<std::uint64_t>(got[static_cast<std::size_t>(i)]), std::bit_cast<std::uint64_t>(want))
          << "index " << first + static_cast<std::uint64_t>(i);
      ASSERT_EQ(std::bit_cast<std::uint64_t>(portable[static_cast<std::size_t>(i)]), std::bit_cast<std::uint64_t>(want))
          << "built without AVX-512, index " << first + static_cast<std::uint64_t>(i);
    }
  }
}

// The documented construction (generator.h, version 2), recomputed with the C
// library's log, sin and cos: normals 2k and 2k+1 are r (cos, sin) of one
// pair, r from index 2k's hash and the angle from index 2k+1's. Our own
// log, sine and cosine agree to about 1e-13.
TEST(Generator, NormalsAreBoxMullerPairsOfTheDocumentedHashes) {
  const std::uint64_t st = gen::stream(99, gen::tensor_key("pairs"));
  double worst = 0;
  for (std::uint64_t k = 0; k < 20'000; ++k) {
    const std::uint64_t h1 = gen::mix64(st + 2 * k * 0x9E3779B97F4A7C15ull);
    const std::uint64_t h2 = gen::mix64(st + (2 * k + 1) * 0x9E3779B97F4A7C15ull);
    const double u = (static_cast<double>(h1 >> 11) + 0.5) * 0x1p-53;
    const double r = std::sqrt(-2.0 * std::log(u));
    const double phi = static_cast<double>(h2 & ((1ull << 50) - 1)) * 0x1p-50 * 0.78539816339744830962;
    double c = std::cos(phi), s = std::sin(phi);
    if (h2 >> 63) std::swap(c, s);
    const double x = (h2 >> 62 & 1) ? -r * c : r * c, y = (h2 >> 61 & 1) ? -r * s : r * s;
    const double gx = gen::normal_at(st, 2 * k), gy = gen::normal_at(st, 2 * k + 1);
    worst = std::max({worst, std::fabs(gx - x) / std::max(1.0, std::fabs(x)), std::fabs(gy - y) / std::max(1.0, std::fabs(y))});
    ASSERT_EQ(std::signbit(gx), std::signbit(x)) << k;
    ASSERT_EQ(std::signbit(gy), std::signbit(y)) << k;
  }
  EXPECT_LT(worst, 1e-12);
}

// The two normals of a pair are uncorrelated, and the tails beyond 3.5 sd
// have their weight (the radius's log and the angle's sine and cosine at
// work far from the centre).
TEST(Generator, PairsUncorrelatedAndTailsWeighted) {
  constexpr std::int64_t kN = 2'000'000;
  std::vector<double> v(static_cast<std::size_t>(kN));
  gen::normals_at(gen::stream(3, gen::tensor_key("tails")), 0, kN, v.data());
  double xy = 0;
  std::int64_t tail = 0;
  for (std::int64_t i = 0; i < kN; i += 2) xy += v[static_cast<std::size_t>(i)] * v[static_cast<std::size_t>(i + 1)];
  for (double x : v) tail += std::fabs(x) > 3.5;
  // sd(mean of xy over 1e6 pairs) = 1e-3; P(|x| > 3.5) = 4.653e-4, sd over 2e6 draws 1.5e-5.
  EXPECT_NEAR(xy / (kN / 2), 0.0, 5e-3);
  EXPECT_NEAR(static_cast<double>(tail) / kN, 4.653e-4, 8e-5);
}

}  // namespace
}  // namespace mlagate
