// Counter-based generator: splitmix64 hashing of (seed, tensor, index, sub),
// Marsaglia's polar normal sampler and a log built from IEEE arithmetic only.
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

// dst[i] for each bit i set in mask, from src[0..popcount) in order; the
// other lanes of dst are left alone. src has room for kLanes.
[[gnu::always_inline]] inline void expand(unsigned mask, const double* src, double* dst) {
#if defined(__AVX512F__)
  const auto k = static_cast<__mmask8>(mask);
  _mm512_mask_storeu_pd(dst, k, _mm512_maskz_expand_pd(k, _mm512_loadu_pd(src)));
#else
  for (int i = 0, j = 0; i < kLanes; ++i)
    if (mask >> i & 1) dst[i] = src[j++];
#endif
}

// Bit i set where lane i of a comparison's result is true (-1).
[[gnu::always_inline]] inline unsigned lane_mask(VecI v) {
#if defined(__AVX512DQ__)
  return _mm512_movepi64_mask(reinterpret_cast<__m512i>(v));
#else
  unsigned m = 0;
  for (int i = 0; i < kLanes; ++i) m |= static_cast<unsigned>(v[i] != 0) << i;
  return m;
#endif
}

// The lanes of v whose bit is set in mask, in lane order, to dst[0..popcount):
// one compress and one store with AVX-512, a store per lane otherwise. dst
// must have room for kLanes (the lanes past the kept ones are scratch).
template <class V, class T>
[[gnu::always_inline]] inline void keep(unsigned mask, V v, T* dst) {
  static_assert(sizeof(T) == 8 && sizeof(V) == 8 * kLanes);
#if defined(__AVX512F__)
  _mm512_storeu_si512(dst, _mm512_maskz_compress_epi64(static_cast<__mmask8>(mask), reinterpret_cast<__m512i>(v)));
#else
  int j = 0;
  for (int i = 0; i < kLanes; ++i) {
    std::memcpy(dst + j, reinterpret_cast<const char*>(&v) + 8 * i, 8);
    j += mask >> i & 1;
  }
#endif
}

[[gnu::always_inline]] inline void polar_candidate(VecU h, VecU k, VecD& a, VecD& s, VecI& ok) {
  a = 2.0 * to_unit_v(mix64v(h ^ ((k * u64(2)) * u64(0xD6E8FEB86659FD93ull)))) - 1.0;
  const VecD b = 2.0 * to_unit_v(mix64v(h ^ ((k * u64(2) + u64(1)) * u64(0xD6E8FEB86659FD93ull)))) - 1.0;
  s = a * a + b * b;
  ok = (s > 0.0) & (s < 1.0);
}

// a * sqrt(-2 det_log(s) / s) for kGroups x kLanes accepted candidates, s in
// (0, 1). det_log's scaling branch is dropped: s is never subnormal there (a,
// b are odd multiples of 2^-53, so s >= 2^-106). Each step is written once
// per group, so the groups' dependency chains (the series, the two
// divisions, the square root) overlap in the pipeline.
constexpr int kGroups = 2;
[[gnu::always_inline]] inline void polar_finish(const VecD* a, const VecD* s, VecD* res) {
  VecD m[kGroups], ed[kGroups], z[kGroups], z2[kGroups], p[kGroups];
#pragma GCC unroll 4
  for (int g = 0; g < kGroups; ++g) {
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

// out[at[i]] = v[i]. Kept scalar: GCC would vectorize it into AVX-512
// scatters, several times slower than plain stores on AMD's Zen 4.
#if defined(__clang__)
[[gnu::noinline]] void scatter(double* out, const std::int64_t* at, const double* v, int n) {
#pragma clang loop vectorize(disable)
  for (int i = 0; i < n; ++i) out[at[i]] = v[i];
}
#else
[[gnu::noinline, gnu::optimize("no-tree-vectorize")]] void scatter(double* out, const std::int64_t* at, const double* v, int n) {
  for (int i = 0; i < n; ++i) out[at[i]] = v[i];
}
#endif

}  // namespace

void normals_at(std::uint64_t st, std::uint64_t first, std::int64_t n, double* out) {
  // Two passes over each block of indices. The first draws polar-method
  // candidates (two hashes and a sum of squares each) and sorts them: an
  // accepted one (0 < s < 1) joins the accepted list, a rejected one the
  // queue with its next round, until the queue is empty. The second takes
  // the accepted list a step at a time for a * sqrt(-2 log s / s): the two
  // divisions, the square root and the log's series, most of a normal's
  // time, run once a normal and never on a candidate then rejected (about
  // 21% of first ones: every candidate's would be about 1.27 a normal). The
  // lists are compacted with AVX-512's compress where the build has it, a
  // lane at a time otherwise. Each index's accepted candidate is
  // normal_at's (the first in its round order) and every operation is
  // normal_at's, in its order, so the bits are its bits (tests/cases:
  // test_generator, run built for Zen 4 and Sapphire Rapids; 16.7 million
  // normals compared built for x86-64 and x86-64-v3 too). A normal took
  // 5.2-6.3 ns against 5.8-8.3 with every candidate finished in its lane on
  // a 2-core Zen 4 VM, 7.9-8.3 against 9.0-9.9 on an H200 host's Xeon.
  constexpr int kBlock = 512;
  constexpr int kStep = kLanes * kGroups;
  // The queue (hash, round, slot) and the accepted list (a, s; the slot of
  // those of later rounds), with a step's room past the end: whole vectors
  // are read and written, padding included.
  alignas(64) std::uint64_t queue_h[kBlock + kStep], queue_k[kBlock + kStep];
  alignas(64) std::int64_t queue_at[kBlock + kStep];
  alignas(64) double acc_a[kBlock + kStep], acc_s[kBlock + kStep], acc_res[kBlock + kStep];
  alignas(64) std::int64_t acc_at[kBlock + kStep];
  std::uint8_t first_accepted[kBlock / kLanes];  // each lane group's accepted first candidates
  VecU lane{};
  VecI lane_i{};
  for (int i = 0; i < kLanes; ++i) lane[i] = static_cast<std::uint64_t>(i), lane_i[i] = i;
  for (std::int64_t block = 0; block < n; block += kBlock) {
    const int m = static_cast<int>(std::min<std::int64_t>(kBlock, n - block));
    int accepted = 0, queued = 0;
    // Round 0: every index's first candidate. Which lanes were accepted is
    // kept per lane group: their results go back by one expand, no slots.
    for (int base = 0; base < m; base += kLanes) {
      const VecU h = mix64v((lane + (first + static_cast<std::uint64_t>(block + base))) ^ st);
      VecD a, s;
      VecI ok;
      polar_candidate(h, VecU{}, a, s, ok);
      const unsigned valid = (1u << std::min(kLanes, m - base)) - 1;  // past m: computed, never kept
      const unsigned taken = lane_mask(ok), yes = taken & valid, no = ~taken & valid;
      const VecI at = lane_i + base;
      keep(yes, a, acc_a + accepted), keep(yes, s, acc_s + accepted);
      keep(no, h, queue_h + queued), keep(no, VecU{} + u64(1), queue_k + queued), keep(no, at, queue_at + queued);
      first_accepted[base / kLanes] = static_cast<std::uint8_t>(yes);
      accepted += std::popcount(yes);
      queued += std::popcount(no);
    }
    const int accepted_first = accepted;
    // Later rounds: the queue is read kLanes at a time and compacted in place
    // (an entry goes to a slot at or before its own, after its vector is read).
    while (queued > 0) {
      int kept = 0;
      for (int base = 0; base < queued; base += kLanes) {
        VecU h, k;
        std::memcpy(&h, queue_h + base, sizeof h);
        std::memcpy(&k, queue_k + base, sizeof k);
        VecD a, s;
        VecI ok;
        polar_candidate(h, k, a, s, ok);
        VecI at;
        std::memcpy(&at, queue_at + base, sizeof at);
        const unsigned valid = (1u << std::min(kLanes, queued - base)) - 1;
        const unsigned taken = lane_mask(ok), yes = taken & valid;
        unsigned no = ~taken & valid;
        const VecU next = k + u64(1);
        if (const unsigned last = no & lane_mask(reinterpret_cast<VecI>(next == u64(64)))) [[unlikely]] {
          for (int i = 0; i < kLanes; ++i)
            if (last >> i & 1) out[block + at[i]] = 0.0;  // 64 rejections in a row: normal_at's 0
          no &= ~last;
        }
        keep(yes, a, acc_a + accepted), keep(yes, s, acc_s + accepted), keep(yes, at, acc_at + accepted);
        keep(no, h, queue_h + kept), keep(no, next, queue_k + kept), keep(no, at, queue_at + kept);
        accepted += std::popcount(yes);
        kept += std::popcount(no);
      }
      queued = kept;
    }
    // The accepted list, a step at a time; its padding (s = 0.5) is computed, never written.
    for (int i = accepted; i < accepted + kStep; ++i) acc_a[i] = 0.0, acc_s[i] = 0.5;
    for (int base = 0; base < accepted; base += kStep) {
      VecD a[kGroups], s[kGroups], res[kGroups];
      std::memcpy(a, acc_a + base, sizeof a);
      std::memcpy(s, acc_s + base, sizeof s);
      polar_finish(a, s, res);
      std::memcpy(acc_res + base, res, sizeof res);
    }
    // First candidates' results go back to their lanes in order, later
    // rounds' one by one to their slots.
    for (int base = 0, from = 0; base < m; base += kLanes) {
      const unsigned yes = first_accepted[base / kLanes];
      expand(yes, acc_res + from, out + block + base);
      from += std::popcount(yes);
    }
    scatter(out + block, acc_at + accepted_first, acc_res + accepted_first, accepted - accepted_first);
  }
}

std::uint64_t below(std::uint64_t n, std::uint64_t seed, std::uint64_t tensor, std::uint64_t index) {
  const unsigned __int128 p = static_cast<unsigned __int128>(bits(seed, tensor, index, 0)) * n;
  return static_cast<std::uint64_t>(p >> 64);
}

}  // namespace mlagate::gen
