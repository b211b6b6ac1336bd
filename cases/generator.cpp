// Counter-based generator: splitmix64 hashing of (seed, tensor, index, sub),
// Marsaglia's polar normal sampler and a log built from IEEE arithmetic only.
#include "cases/generator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

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
// e * hi is exact; det_log and normals_at's vector form share them. As
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

[[gnu::always_inline]] inline VecU mix64v(VecU x) {
  x += u64(0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * u64(0xBF58476D1CE4E5B9ull);
  x = (x ^ (x >> 27)) * u64(0x94D049BB133111EBull);
  return x ^ (x >> 31);
}

[[gnu::always_inline]] inline VecD to_unit_v(VecU b) { return (__builtin_convertvector(b >> 11, VecD) + 0.5) * 0x1.0p-53; }

// kGroups x kLanes polar-method candidates: lane (g, i) takes index hash
// h[g][i] in round k[g][i] (normal_at's loop variable). ok: accepted
// (0 < s < 1); res: its normal where accepted (rejected lanes compute on
// s = 0.5 and their res is never read). Each step is written once per group,
// so the groups' dependency chains (the series, the two divisions, the square
// root) overlap in the pipeline; one group alone waits on each in turn.
// det_log for s in (0, 1): never subnormal there (a, b are odd multiples of
// 2^-53, so s >= 2^-106), which drops its scaling branch; every other
// operation is det_log's, in its order.
constexpr int kGroups = 2;
[[gnu::always_inline]] inline void polar_candidates(const VecU* h, const VecU* k, VecD* res, VecI* ok) {
  VecD a[kGroups], s[kGroups], m[kGroups], ed[kGroups], z[kGroups], z2[kGroups], p[kGroups];
#pragma GCC unroll 4
  for (int g = 0; g < kGroups; ++g) {
    a[g] = 2.0 * to_unit_v(mix64v(h[g] ^ ((k[g] * u64(2)) * u64(0xD6E8FEB86659FD93ull)))) - 1.0;
    const VecD b = 2.0 * to_unit_v(mix64v(h[g] ^ ((k[g] * u64(2) + u64(1)) * u64(0xD6E8FEB86659FD93ull)))) - 1.0;
    const VecD s0 = a[g] * a[g] + b * b;
    ok[g] = (s0 > 0.0) & (s0 < 1.0);
    s[g] = ok[g] ? s0 : VecD{} + 0.5;
    const VecU u = __builtin_bit_cast(VecU, s[g]);
    VecI e = reinterpret_cast<VecI>((u >> 52) & u64(0x7FF)) - std::int64_t{1023};
    m[g] = __builtin_bit_cast(VecD, (u & u64(0x000FFFFFFFFFFFFFull)) | u64(0x3FF0000000000000ull));
    const VecI high = m[g] > 1.4142135623730951;  // -1 where true
    m[g] = high ? m[g] * 0.5 : m[g];
    e -= high;
    ed[g] = __builtin_convertvector(e, VecD);
  }
#pragma GCC unroll 4
  for (int g = 0; g < kGroups; ++g) z[g] = (m[g] - 1.0) / (m[g] + 1.0);
#pragma GCC unroll 4
  for (int g = 0; g < kGroups; ++g) z2[g] = z[g] * z[g], p[g] = VecD{} + kInvOdd[0];
#pragma GCC unroll 11
  for (int j = 1; j < 12; ++j)
#pragma GCC unroll 4
    for (int g = 0; g < kGroups; ++g) p[g] = p[g] * z2[g] + kInvOdd[j];
#pragma GCC unroll 4
  for (int g = 0; g < kGroups; ++g) {
    const VecD log_m = 2.0 * z[g] * p[g];
    const VecD log_s = ed[g] * kLn2Hi + (log_m + ed[g] * kLn2Lo);
    const VecD t = -2.0 * log_s / s[g];
    VecD r;
    for (int i = 0; i < kLanes; ++i) r[i] = __builtin_sqrt(t[i]);  // t > 0: IEEE sqrt, no errno
    res[g] = a[g] * r;
  }
}

}  // namespace

void normals_at(std::uint64_t st, std::uint64_t first, std::int64_t n, double* out) {
  // Every index's first candidate, kStep at a time; the indices whose
  // candidate was rejected (about 21%) queue with their next round and go
  // through again, kStep at a time, until none is left. That computes about
  // 1.3 candidates a normal, where lanes kept in step until their last one
  // was accepted computed about 2.7. Each index's candidates are normal_at's,
  // in its order, so the bits are its bits (tests/cases: test_generator).
  constexpr int kStep = kLanes * kGroups;
  constexpr int kBlock = 512;
  std::uint64_t pending_h[kBlock], pending_k[kBlock];
  std::int64_t pending_at[kBlock];
  VecU lane{};
  for (int i = 0; i < kLanes; ++i) lane[i] = static_cast<std::uint64_t>(i);
  for (std::int64_t block = 0; block < n; block += kBlock) {
    const int m = static_cast<int>(std::min<std::int64_t>(kBlock, n - block));
    int pending = 0;
    for (int base = 0; base < m; base += kStep) {
      VecU h[kGroups], k[kGroups] = {};
#pragma GCC unroll 4
      for (int g = 0; g < kGroups; ++g)
        h[g] = mix64v((lane + (first + static_cast<std::uint64_t>(block + base + g * kLanes))) ^ st);
      VecD res[kGroups];
      VecI ok[kGroups];
      polar_candidates(h, k, res, ok);
      const int lanes = std::min(kStep, m - base);  // past n: computed, never written
      if (lanes == kStep) {
        // Every lane stored (a rejected lane's slot is written again when its
        // index comes out of the queue below) and the rejected queued without
        // a branch: a branch per lane on ok, taken about one time in five at
        // random, cost more than the stores.
        for (int g = 0; g < kGroups; ++g) std::memcpy(out + block + base + g * kLanes, &res[g], sizeof(VecD));
        for (int i = 0; i < kStep; ++i) {
          const int g = i / kLanes, l = i % kLanes;
          pending_h[pending] = h[g][l];
          pending_k[pending] = 1;
          pending_at[pending] = block + base + i;
          pending += ok[g][l] == 0;
        }
        continue;
      }
      for (int i = 0; i < lanes; ++i) {
        const int g = i / kLanes, l = i % kLanes;
        if (ok[g][l]) {
          out[block + base + i] = res[g][l];
        } else {
          pending_h[pending] = h[g][l];
          pending_k[pending] = 1;
          pending_at[pending++] = block + base + i;
        }
      }
    }
    while (pending > 0) {
      // Compacted in place: the kept entry j goes to a slot at or before j,
      // and a batch's lanes are loaded before any of them is written.
      int kept = 0;
      for (int base = 0; base < pending; base += kStep) {
        const int lanes = std::min(kStep, pending - base);
        VecU h[kGroups] = {}, k[kGroups] = {};
        for (int i = 0; i < lanes; ++i)
          h[i / kLanes][i % kLanes] = pending_h[base + i], k[i / kLanes][i % kLanes] = pending_k[base + i];
        VecD res[kGroups];
        VecI ok[kGroups];
        polar_candidates(h, k, res, ok);
        for (int i = 0; i < lanes; ++i) {
          const int g = i / kLanes, l = i % kLanes;
          const std::int64_t at = pending_at[base + i];
          if (ok[g][l]) {
            out[at] = res[g][l];
          } else if (k[g][l] + 1 == 64) {
            out[at] = 0.0;  // 64 rejections in a row: normal_at's 0
          } else {
            pending_h[kept] = h[g][l];
            pending_k[kept] = k[g][l] + 1;
            pending_at[kept++] = at;
          }
        }
      }
      pending = kept;
    }
  }
}

std::uint64_t below(std::uint64_t n, std::uint64_t seed, std::uint64_t tensor, std::uint64_t index) {
  const unsigned __int128 p = static_cast<unsigned __int128>(bits(seed, tensor, index, 0)) * n;
  return static_cast<std::uint64_t>(p >> 64);
}

}  // namespace mlagate::gen
