// Counter-based generator: splitmix64 hashing of (seed, tensor, index, sub),
// Marsaglia's polar normal sampler and a log built from IEEE arithmetic only.
#include "cases/generator.h"

#include <algorithm>
#include <bit>
#include <cmath>

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
  double s = 1.0 / 23.0;
  for (int k = 21; k >= 1; k -= 2) s = s * z2 + 1.0 / k;
  const double log_m = 2.0 * z * s;
  constexpr double kLn2Hi = 0x1.62e42fefa3800p-1;  // ln 2 split so e * hi is exact
  constexpr double kLn2Lo = 0x1.ef35793c76730p-45;
  return static_cast<double>(e) * kLn2Hi + (log_m + static_cast<double>(e) * kLn2Lo);
}

double normal(std::uint64_t seed, std::uint64_t tensor, std::uint64_t index) {
  return normal_at(stream(seed, tensor), index);
}

double normal_at(std::uint64_t st, std::uint64_t index) {
  const std::uint64_t h = mix64(st ^ index);
  for (std::uint64_t k = 0; k < 64; ++k) {
    const double a = 2.0 * to_unit(mix64(h ^ ((2 * k) * 0xD6E8FEB86659FD93ull))) - 1.0;
    const double b = 2.0 * to_unit(mix64(h ^ ((2 * k + 1) * 0xD6E8FEB86659FD93ull))) - 1.0;
    const double s = a * a + b * b;
    if (s > 0.0 && s < 1.0) return a * std::sqrt(-2.0 * det_log(s) / s);  // sqrt is IEEE exact
  }
  return 0.0;  // 64 rejections in a row: probability 0.215^64, never seen
}

namespace {

// normals_at's lanes: GCC vector types, so that every step below is one
// vector instruction of the IEEE operation normal_at's scalar code performs
// (this folder is built with -ffp-contract=off: nothing is fused either way).
constexpr int kLanes = 8;
using VecU = std::uint64_t __attribute__((vector_size(8 * kLanes)));
using VecI = std::int64_t __attribute__((vector_size(8 * kLanes)));
using VecD = double __attribute__((vector_size(8 * kLanes)));

// Scalars broadcast as std::uint64_t (clang refuses unsigned long long there).
constexpr std::uint64_t u64(unsigned long long v) { return static_cast<std::uint64_t>(v); }

VecU mix64v(VecU x) {
  x += u64(0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * u64(0xBF58476D1CE4E5B9ull);
  x = (x ^ (x >> 27)) * u64(0x94D049BB133111EBull);
  return x ^ (x >> 31);
}

VecD to_unit_v(VecU b) { return (__builtin_convertvector(b >> 11, VecD) + 0.5) * 0x1.0p-53; }

// det_log for the polar method's s = a^2 + b^2 in (0, 1): never subnormal
// there (a, b are odd multiples of 2^-53, so s >= 2^-106), which drops its
// scaling branch; every other operation is det_log's, in its order.
VecD polar_log_v(VecD x) {
  const VecU u = __builtin_bit_cast(VecU, x);
  VecI e = reinterpret_cast<VecI>((u >> 52) & u64(0x7FF)) - std::int64_t{1023};
  const VecU mu = (u & u64(0x000FFFFFFFFFFFFFull)) | u64(0x3FF0000000000000ull);
  VecD m = __builtin_bit_cast(VecD, mu);
  const VecI high = m > 1.4142135623730951;  // -1 where true
  m = high ? m * 0.5 : m;
  e -= high;
  const VecD z = (m - 1.0) / (m + 1.0);
  const VecD z2 = z * z;
  VecD s = VecD{} + 1.0 / 23.0;
  for (int k = 21; k >= 1; k -= 2) s = s * z2 + 1.0 / k;
  const VecD log_m = 2.0 * z * s;
  constexpr double kLn2Hi = 0x1.62e42fefa3800p-1;
  constexpr double kLn2Lo = 0x1.ef35793c76730p-45;
  const VecD ed = __builtin_convertvector(e, VecD);
  return ed * kLn2Hi + (log_m + ed * kLn2Lo);
}

}  // namespace

void normals_at(std::uint64_t st, std::uint64_t first, std::int64_t n, double* out) {
  // kLanes indices go through the polar method's rounds together,
  // branch-free: every lane computes each round's candidate and keeps the
  // first it accepts, as normal_at's loop does (tests/cases: test_generator
  // checks the bits against normal_at).
  VecU lane{};
  for (int i = 0; i < kLanes; ++i) lane[i] = static_cast<std::uint64_t>(i);
  for (std::int64_t base = 0; base < n; base += kLanes) {
    const int lanes = static_cast<int>(std::min<std::int64_t>(kLanes, n - base));
    const VecU h = mix64v((lane + (first + static_cast<std::uint64_t>(base))) ^ st);
    VecD res{};  // 64 rejections in a row: normal_at's 0
    VecI done{};
    for (std::uint64_t k = 0; k < 64; ++k) {
      const VecD a = 2.0 * to_unit_v(mix64v(h ^ u64((2 * k) * 0xD6E8FEB86659FD93ull))) - 1.0;
      const VecD b = 2.0 * to_unit_v(mix64v(h ^ u64((2 * k + 1) * 0xD6E8FEB86659FD93ull))) - 1.0;
      const VecD s = a * a + b * b;
      const VecI ok = (s > 0.0) & (s < 1.0);
      // Rejected candidates compute on 0.5 and are never kept.
      const VecD si = ok ? s : VecD{} + 0.5;
      const VecD t = -2.0 * polar_log_v(si) / si;
      VecD r;
      for (int i = 0; i < kLanes; ++i) r[i] = __builtin_sqrt(t[i]);  // t > 0: IEEE sqrt, no errno
      const VecI take = ok & ~done;
      res = take ? a * r : res;
      done |= take;
      bool all = true;
      for (int i = 0; i < lanes; ++i) all = all && done[i] != 0;
      if (all) break;
    }
    for (int i = 0; i < lanes; ++i) out[base + i] = res[i];
  }
}

std::uint64_t below(std::uint64_t n, std::uint64_t seed, std::uint64_t tensor, std::uint64_t index) {
  const unsigned __int128 p = static_cast<unsigned __int128>(bits(seed, tensor, index, 0)) * n;
  return static_cast<std::uint64_t>(p >> 64);
}

}  // namespace mlagate::gen
