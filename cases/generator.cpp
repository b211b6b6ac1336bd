// Counter-based generator: splitmix64 hashing of (seed, tensor, index, sub),
// Marsaglia's polar normal sampler and a log built from IEEE arithmetic only.
#include "cases/generator.h"

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

std::uint64_t below(std::uint64_t n, std::uint64_t seed, std::uint64_t tensor, std::uint64_t index) {
  const unsigned __int128 p = static_cast<unsigned __int128>(bits(seed, tensor, index, 0)) * n;
  return static_cast<std::uint64_t>(p >> 64);
}

}  // namespace mlagate::gen
