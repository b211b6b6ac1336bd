// Counter-based generator: splitmix64 hashing of (seed, tensor, index, sub),
// a Box-Muller normal sampler and a log, sine and cosine built from IEEE
// arithmetic only (version 2; version 1's polar method cost 4-5x as much a
// normal, most of a case's drawing).
#include "cases/generator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace mlagate::gen {

std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::uint64_t tensor_key(std::string_view name) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001B3ull;
  }
  return h;
}

std::uint64_t stream(std::uint64_t seed, std::uint64_t tensor) {
  return mix64(mix64(seed ^ 0x6D6C6167617465ull) ^ tensor);  // "mlagate"
}

namespace {

std::uint64_t stream_bits(std::uint64_t st, std::uint64_t index, std::uint64_t sub) {
  return mix64(mix64(st ^ index) ^ (sub * 0xD6E8FEB86659FD93ull));
}

// 53 bits plus one half: strictly inside (0, 1).
double to_unit(std::uint64_t b) { return (static_cast<double>(b >> 11) + 0.5) * 0x1.0p-53; }

}  // namespace

std::uint64_t bits(std::uint64_t seed, std::uint64_t tensor, std::uint64_t index, std::uint64_t sub) {
  return stream_bits(stream(seed, tensor), index, sub);
}

double uniform(std::uint64_t seed, std::uint64_t tensor, std::uint64_t index, std::uint64_t sub) {
  return to_unit(bits(seed, tensor, index, sub));
}

namespace {

// det_log's series coefficients 1/23, 1/21, ..., 1/1 and ln 2 split so that
// e * hi is exact; det_log and the normals (a shorter series) share them. As
// constants because written `1.0 / k` inside the loop, GCC left a scalar
// division per term in the vector code (the compiler folds them with IEEE
// division: the values a run-time division gives).
constexpr double kInvOdd[12] = {1.0 / 23, 1.0 / 21, 1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13,
                                1.0 / 11, 1.0 / 9,  1.0 / 7,  1.0 / 5,  1.0 / 3,  1.0 / 1};
constexpr double kLn2Hi = 0x1.62e42fefa3800p-1;
constexpr double kLn2Lo = 0x1.ef35793c76730p-45;

}  // namespace

double det_log(double x) {
  // x = m * 2^e with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(z), z = (m-1)/(m+1).
  std::uint64_t u = std::bit_cast<std::uint64_t>(x);
  int e = static_cast<int>((u >> 52) & 0x7FF);
  if (e == 0) {  // subnormal: scale up exactly
    u = std::bit_cast<std::uint64_t>(x * 0x1.0p54);
    e = static_cast<int>((u >> 52) & 0x7FF) - 54;
  }
  e -= 1023;
  double m = std::bit_cast<double>((u & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
  if (m > 1.4142135623730951) {
    m *= 0.5;
    ++e;
  }
  const double z = (m - 1.0) / (m + 1.0);
  const double z2 = z * z;
  // |z| <= 0.1716: terms through z^23 leave < 1e-19 relative.
  double s = kInvOdd[0];
  for (int j = 1; j < 12; ++j) s = s * z2 + kInvOdd[j];
  const double log_m = 2.0 * z * s;
  return static_cast<double>(e) * kLn2Hi + (log_m + static_cast<double>(e) * kLn2Lo);
}

namespace {

// The normals' lanes: GCC vector types, so that every step below is one
// vector instruction of an IEEE operation, the same in every lane and in
// normal_at (which runs the same code and takes one lane); this folder is
// built with -ffp-contract=off, so nothing is fused either way.
constexpr int kLanes = 8;
using VecU = std::uint64_t __attribute__((vector_size(8 * kLanes)));
using VecI = std::int64_t __attribute__((vector_size(8 * kLanes)));
using VecD = double __attribute__((vector_size(8 * kLanes)));

// Scalars broadcast as std::uint64_t (clang refuses unsigned long long there).
constexpr std::uint64_t u64(unsigned long long v) { return static_cast<std::uint64_t>(v); }

[[gnu::always_inline]] inline VecU mix64v(VecU x) {
  x += u64(0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * u64(0xBF58476D1CE4E5B9ull);
  x = (x ^ (x >> 27)) * u64(0x94D049BB133111EBull);
  return x ^ (x >> 31);
}

constexpr double factorial(int n) {
  double f = 1;
  for (int i = 2; i <= n; ++i) f *= i;
  return f;
}
// sin and cos of phi in [0, pi/4) as Horner sums in phi^2, highest term
// first: sin phi = phi (1 - phi^2/3! + ... + phi^12/13!), cos phi = 1 -
// phi^2/2! + ... + phi^12/12!; the next terms are below 3e-14 and 4e-13
// (the values are rounded to 16-bit model dtypes or fp32 anyway). Exact
// factorials and the compiler's IEEE division: the constants are the same
// on every machine.
constexpr double kSin[7] = {1 / factorial(13), -1 / factorial(11), 1 / factorial(9), -1 / factorial(7),
                            1 / factorial(5),  -1 / factorial(3),  1.0};
constexpr double kCos[7] = {1 / factorial(12), -1 / factorial(10), 1 / factorial(8), -1 / factorial(6),
                            1 / factorial(4),  -1 / factorial(2),  1.0};
// pi/4 (the double nearest it) scaled by 2^-50: phi = (50 random bits) x this.
constexpr double kQuarterPiStep = 0x1.921fb54442d18p-1 * 0x1.0p-50;
// The hashes of a normal's index: splitmix64 over the stream.
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;
// log's series to 1/15 z^15: |z| <= 0.1716, so the terms left out are
// below 5e-15 of log m.
constexpr int kLogTerms = 8;

// Box-Muller, kGroups x kLanes pairs: pair k is normals 2k and 2k+1, from
// the hashes of indices 2k (the radius) and 2k+1 (the angle):
//   u = (53 bits + 1/2) 2^-53 in (0, 1), r = sqrt(-2 log u);
//   phi = (50 bits) 2^-50 pi/4 in [0, pi/4); (c, s) = (cos phi, sin phi),
//   swapped by one bit (the angle reflected about pi/4), each negated by
//   another (the quadrant): a uniform angle, so x = r c and y = r s are
//   independent standard normals.
// No rejection (the polar method of version 1 drew 1.27 candidates a
// normal) and a log and a square root per two normals. Each step is written
// once per group, so the groups' dependency chains (the division, the
// series, the square root) overlap in the pipeline.
constexpr int kGroups = 2;
[[gnu::always_inline]] inline void box_muller(std::uint64_t st, VecU k, VecD* x, VecD* y) {
  VecU h1[kGroups], h2[kGroups];
  VecD m[kGroups], ed[kGroups], z[kGroups], z2[kGroups], p[kGroups], phi[kGroups], f2[kGroups], s[kGroups],
      c[kGroups];
#pragma GCC unroll 4
  for (int g = 0; g < kGroups; ++g) {
    const VecU i = (k + u64(g * kLanes)) * u64(2);
    h1[g] = mix64v(st + i * kGolden);
    h2[g] = mix64v(st + (i + u64(1)) * kGolden);
  }
  // log u = e ln 2 + log m, m in [sqrt(1/2), sqrt(2)); u >= 2^-54 is never subnormal.
#pragma GCC unroll 4
  for (int g = 0; g < kGroups; ++g) {
    const VecD u = (__builtin_convertvector(h1[g] >> 11, VecD) + 0.5) * 0x1.0p-53;
    const VecU ub = __builtin_bit_cast(VecU, u);
    VecI e = reinterpret_cast<VecI>((ub >> 52) & u64(0x7FF)) - std::int64_t{1023};
    m[g] = __builtin_bit_cast(VecD, (ub & u64(0x000FFFFFFFFFFFFFull)) | u64(0x3FF0000000000000ull));
    const VecI high = m[g] > 1.4142135623730951;  // -1 where true
    m[g] = high ? m[g] * 0.5 : m[g];
    e -= high;
    ed[g] = __builtin_convertvector(e, VecD);
  }
#pragma GCC unroll 4
  for (int g = 0; g < kGroups; ++g) z[g] = (m[g] - 1.0) / (m[g] + 1.0);
#pragma GCC unroll 4
  for (int g = 0; g < kGroups; ++g) {
    z2[g] = z[g] * z[g];
    p[g] = VecD{} + kInvOdd[12 - kLogTerms];
    phi[g] = __builtin_convertvector(h2[g] & u64((1ull << 50) - 1), VecD) * kQuarterPiStep;
    f2[g] = phi[g] * phi[g];
    s[g] = VecD{} + kSin[0];
    c[g] = VecD{} + kCos[0];
  }
#pragma GCC unroll 8
  for (int j = 13 - kLogTerms; j < 12; ++j)
#pragma GCC unroll 4
    for (int g = 0; g < kGroups; ++g) p[g] = p[g] * z2[g] + kInvOdd[j];
#pragma GCC unroll 8
  for (int j = 1; j < 7; ++j)
#pragma GCC unroll 4
    for (int g = 0; g < kGroups; ++g) s[g] = s[g] * f2[g] + kSin[j], c[g] = c[g] * f2[g] + kCos[j];
#pragma GCC unroll 4
  for (int g = 0; g < kGroups; ++g) {
    const VecD t = -2.0 * (ed[g] * kLn2Hi + (2.0 * z[g] * p[g] + ed[g] * kLn2Lo));
#if defined(__AVX512F__)
    // IEEE sqrt in every lane; the masked form, as _mm512_sqrt_pd's undefined
    // pass-through draws GCC 12's -Wmaybe-uninitialized.
    const __m512d tv = reinterpret_cast<__m512d>(t);
    const VecD r = reinterpret_cast<VecD>(_mm512_mask_sqrt_pd(tv, static_cast<__mmask8>(0xFF), tv));
#else
    VecD r;
    for (int l = 0; l < kLanes; ++l) r[l] = __builtin_sqrt(t[l]);  // t >= 0: IEEE sqrt, no errno
#endif
    s[g] = s[g] * phi[g];
    const VecI swap = reinterpret_cast<VecI>(h2[g] >> 63) != 0;
    const VecD a = swap ? s[g] : c[g], b = swap ? c[g] : s[g];
    // Negation flips the sign bit alone: exact.
    x[g] = __builtin_bit_cast(VecD, __builtin_bit_cast(VecU, r * a) ^ ((h2[g] >> 62 & u64(1)) << 63));
    y[g] = __builtin_bit_cast(VecD, __builtin_bit_cast(VecU, r * b) ^ ((h2[g] >> 61 & u64(1)) << 63));
  }
}

}  // namespace

double normal(std::uint64_t seed, std::uint64_t tensor, std::uint64_t index) {
  return normal_at(stream(seed, tensor), index);
}

double normal_at(std::uint64_t st, std::uint64_t index) {
  // normals_at's arithmetic, one pair of its lanes used: the same bits by construction.
  VecD x[kGroups], y[kGroups];
  box_muller(st, VecU{} + (index >> 1), x, y);
  return (index & 1) ? y[0][0] : x[0][0];
}

void normals_at(std::uint64_t st, std::uint64_t first, std::int64_t n, double* out) {
  // Blocks of pairs, interleaved into normal order in a buffer on the stack
  // and copied out from the block's first wanted normal (an odd `first`
  // starts at a pair's second).
  constexpr int kStep = kGroups * kLanes;  // pairs a call of box_muller
  constexpr int kBlock = 16 * kStep;      // pairs a block
  alignas(64) double buf[2 * kBlock];
  VecU lane{};
  for (int i = 0; i < kLanes; ++i) lane[i] = static_cast<std::uint64_t>(i);
  std::uint64_t pair = first >> 1;
  std::int64_t skip = static_cast<std::int64_t>(first & 1), done = 0;
  while (done < n) {
    const std::int64_t take = std::min<std::int64_t>(2 * kBlock - skip, n - done);
    const std::int64_t pairs = (skip + take + 1) / 2;  // the block's pairs that hold wanted normals
    for (std::int64_t b = 0; b < pairs; b += kStep) {
      VecD x[kGroups], y[kGroups];
      box_muller(st, lane + (pair + static_cast<std::uint64_t>(b)), x, y);
#pragma GCC unroll 4
      for (int g = 0; g < kGroups; ++g) {
        const VecD lo = __builtin_shufflevector(x[g], y[g], 0, 8, 1, 9, 2, 10, 3, 11);
        const VecD hi = __builtin_shufflevector(x[g], y[g], 4, 12, 5, 13, 6, 14, 7, 15);
        std::memcpy(buf + 2 * (b + g * kLanes), &lo, sizeof lo);
        std::memcpy(buf + 2 * (b + g * kLanes) + kLanes, &hi, sizeof hi);
      }
    }
    std::memcpy(out + done, buf + skip, static_cast<std::size_t>(take) * sizeof(double));
    done += take;
    skip = 0;
    pair += kBlock;
  }
}

std::uint64_t below(std::uint64_t n, std::uint64_t seed, std::uint64_t tensor, std::uint64_t index) {
  const unsigned __int128 p = static_cast<unsigned __int128>(bits(seed, tensor, index, 0)) * n;
  return static_cast<std::uint64_t>(p >> 64);
}

}  // namespace mlagate::gen
