// The baseline emulation's CPU tiles (reference/cpu_attention_emulation.cpp,
// their only user): the fp32 fma tiles of AVX-512, AVX2 and scalar builds,
// and the bf16 pair path's tiles, packings and checks where the build has
// VDPBF16PS. Every tile computes the fixed order's chains (sdpa_emulation.h),
// so a tile's choice changes no bit. A header so that the core's units
// inline them; it must be included only by a file compiled with
// -ffp-contract=off (reference/CMakeLists.txt), as the core is: the compiler
// must not fuse a product with the add after it.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "reference/detail/emulation_math.h"

namespace mlagate::detail::emu {

using Index = std::int64_t;

// ---- The tile: o[r][0..16 NV) (row stride ldo) continues the fma chain
// over k in [k0, k1) of a[r * lda + k * ldk] * p[k * ldp + c], or starts it
// at +0 where `zero`. One chain per element, in order of k: the same bits on
// every path. The panel p holds 16 NV columns a row (NV = 4: 64).
#if defined(__AVX512F__)
// The most rows of a tile: its accumulators and panel registers fill the 32.
template <int NV>
constexpr int kTileRows = NV == 4 ? 6 : NV == 2 ? 12 : 24;
template <int MR, int NV>
void tile(const float* a, Index lda, Index ldk, const float* p, Index ldp, Index k0, Index k1, float* o, Index ldo,
          bool zero) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(o + r * ldo + 16 * j);
  for (Index k = k0; k < k1; ++k) {
    const float* pk = p + k * ldp;
    const float* ak = a + k * ldk;
    __m512 b[NV];
    for (int j = 0; j < NV; ++j) b[j] = _mm512_load_ps(pk + 16 * j);
    for (int r = 0; r < MR; ++r) {
      const __m512 x = _mm512_set1_ps(ak[r * lda]);
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_fmadd_ps(x, b[j], acc[r][j]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(o + r * ldo + 16 * j, acc[r][j]);
}
// Panels as narrow as the unit's rows need (16, 32 or 64 columns).
constexpr bool kNarrowPanels = true;
inline int panel_vectors(int rows) { return rows <= 16 ? 1 : rows <= 32 ? 2 : 4; }
// The lanes [0, k) of 16.
inline __mmask16 first_lanes(int k) {
  return k >= 16 ? __mmask16(0xFFFF) : k <= 0 ? __mmask16(0) : __mmask16((1u << k) - 1u);
}
#else
// One row of 64 columns at a time: no narrow panels.
template <int NV>
constexpr int kTileRows = 1;
constexpr bool kNarrowPanels = false;
inline int panel_vectors(int) { return 4; }
#if defined(__AVX2__) && defined(__FMA__)
// A row's half panel in 4 accumulators at a time (as detail/rowwise_gemm.h).
template <int MR, int NV>
void tile(const float* a, Index, Index ldk, const float* p, Index ldp, Index k0, Index k1, float* o, Index, bool zero) {
  static_assert(MR == 1 && NV == 4, "one row of 64 columns at a time");
  for (int half = 0; half < 2; ++half) {
    const float* ph = p + 32 * half;
    float* oh = o + 32 * half;
    __m256 acc[4];
    for (int j = 0; j < 4; ++j) acc[j] = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(oh + 8 * j);
    for (Index k = k0; k < k1; ++k) {
      const float* pk = ph + k * ldp;
      const __m256 x = _mm256_set1_ps(a[k * ldk]);
      acc[0] = _mm256_fmadd_ps(x, _mm256_load_ps(pk), acc[0]);
      acc[1] = _mm256_fmadd_ps(x, _mm256_load_ps(pk + 8), acc[1]);
      acc[2] = _mm256_fmadd_ps(x, _mm256_load_ps(pk + 16), acc[2]);
      acc[3] = _mm256_fmadd_ps(x, _mm256_load_ps(pk + 24), acc[3]);
    }
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(oh + 8 * j, acc[j]);
  }
}
#else
template <int MR, int NV>
void tile(const float* a, Index, Index ldk, const float* p, Index ldp, Index k0, Index k1, float* o, Index, bool zero) {
  static_assert(MR == 1 && NV == 4, "one row of 64 columns at a time");
  for (Index c = 0; c < 16 * NV; ++c) {
    float acc = zero ? 0.0f : o[c];
    for (Index k = k0; k < k1; ++k) acc = detail::emu_fma(a[k * ldk], p[k * ldp + c], acc);
    o[c] = acc;
  }
}
#endif
#endif

template <int NV, int MR = kTileRows<NV>>
void rows_tile(int m, const float* a, Index lda, Index ldk, const float* p, Index ldp, Index k0, Index k1, float* o,
               Index ldo, bool zero) {
  if constexpr (MR > 1) {
    if (m < MR) return rows_tile<NV, MR - 1>(m, a, lda, ldk, p, ldp, k0, k1, o, ldo, zero);
  }
  tile<MR, NV>(a, lda, ldk, p, ldp, k0, k1, o, ldo, zero);
}

// ---- The bf16 pair path (rowwise_gemm.h explains the instruction and why
// its bits are the fma chain's): where the build has VDPBF16PS and the
// process prefers it (detail::pair_path_preferred, the glue's choice: the
// faster path on this machine), a bf16 call's tiles do two of a chain's steps
// an instruction. The pairs are made as the tiles go: a key's two elements
// swapped in its broadcast (element 2i must be the high half, which the
// instruction takes first), the query panel and the probabilities packed
// once a unit, a value panel's rows interleaved once a pass. Whatever is not
// bf16_pair_safe (NaN, infinities, magnitudes outside [2^-50, 2^41): P's
// smallest exponentials, say) takes the fma tiles instead: a logit tile at a
// time, and for P V from the first pass of a value panel that cannot take
// pairs to the panel's end (an fma pass can leave a subnormal accumulator,
// which the instruction would read as zero). Either path gives each chain's
// bits. The range is the glue's criterion, wider in what it refuses than the
// bits need (only subnormals are flushed), so that one argument covers both.
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define MLAGATE_EMU_PAIRS 1
inline constexpr bool kEmuPairs = true;

// bf16 bits whose values are all bf16_pair_safe: zero, or an exponent in [77, 168).
inline __mmask32 unsafe_bf16_32(__m512i x) {
  const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi16(0x7FFF));
  return (_mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16((127 - 50) << 7)) &
          _mm512_test_epi16_mask(mag, mag)) |
         _mm512_cmpge_epu16_mask(mag, _mm512_set1_epi16((127 + 41) << 7));
}

inline bool bf16_run_pair_safe(const std::uint16_t* p, Index n) {
  Index k = 0;
  __mmask32 bad = 0;
  for (; k + 32 <= n; k += 32) bad |= unsafe_bf16_32(_mm512_loadu_si512(p + k));
  if (k < n) {
    const __mmask32 m = static_cast<__mmask32>((std::uint64_t{1} << (n - k)) - 1);
    bad |= unsafe_bf16_32(_mm512_maskz_loadu_epi16(m, p + k)) & m;
  }
  return bad == 0;
}

// fp32 lanes that are not bf16_pair_safe (low half set, or the exponent out of range and not zero).
inline __mmask16 unsafe_f32_16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  return _mm512_test_epi32_mask(u, _mm512_set1_epi32(0xFFFF)) |
         (_mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32((127 - 50) << 23)) & _mm512_test_epi32_mask(mag, mag)) |
         _mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32((127 + 41) << 23));
}

inline std::uint32_t load_pair(const std::uint16_t* p) {
  std::uint32_t u;
  std::memcpy(&u, p, sizeof u);
  return u;
}

// Logits of MR keys against the query panel as pairs qp [pairs][16 NV]
// (element 2i high): o[r][c] (row stride ldo) = the chain over the depth
// from +0. key[r] points at key r's first element.
template <int MR, int NV>
void logit_pair_tile(const std::uint16_t* const* key, const std::uint32_t* qp, Index pairs, float* o, Index ldo) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_setzero_ps();
  for (Index k = 0; k < pairs; ++k) {
    __m512bh b[NV];
    for (int j = 0; j < NV; ++j) b[j] = (__m512bh)_mm512_load_si512(qp + k * 16 * NV + 16 * j);
    for (int r = 0; r < MR; ++r) {
      // Elements 2k and 2k + 1 as they lie (2k low), swapped: 2k high.
      const __m512bh x = (__m512bh)_mm512_rol_epi32(_mm512_set1_epi32(static_cast<int>(load_pair(key[r] + 2 * k))), 16);
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], x, b[j]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(o + r * ldo + 16 * j, acc[r][j]);
}

template <int NV, int MR = kTileRows<NV>>
void logit_pair_rows(int m, const std::uint16_t* const* key, const std::uint32_t* qp, Index pairs, float* o,
                     Index ldo) {
  if constexpr (MR > 1) {
    if (m < MR) return logit_pair_rows<NV, MR - 1>(m, key, qp, pairs, o, ldo);
  }
  logit_pair_tile<MR, NV>(key, qp, pairs, o, ldo);
}

// One fma step of MR rows over 64 value columns: acc[r] += pk[r] * v.
template <int MR>
void single_step(__m512 (&acc)[MR][4], const float* pk, const __m512 (&v)[4]) {
  for (int r = 0; r < MR; ++r) {
    const __m512 x = _mm512_set1_ps(pk[r]);
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_fmadd_ps(x, v[j], acc[r][j]);
  }
}

// o[r][0..64) (row stride ldo) continues the chain over keys [s, e) (relative
// to the pass's first key, which is even) of P and the value panel's pairs vp
// [(e + 1) / 2][64], or starts it at +0 where `zero`. p: P's fp32 values
// p[k * ld + r]; pp: P's pairs pp[(k / 2) * ld + r]. A key that is not one of
// a whole pair in [s, e) (s odd, e odd) is one fma step, its value taken
// from its half of the pair.
template <int MR>
void pv_pair_tile(const float* p, const std::uint32_t* pp, Index ld, const std::uint32_t* vp, Index s, Index e,
                  float* o, Index ldo, bool zero) {
  __m512 acc[MR][4];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(o + r * ldo + 16 * j);
  Index k = s;
  if (k < e && k % 2 == 1) {  // the low half of its pair
    __m512 v[4];
    for (int j = 0; j < 4; ++j)
      v[j] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_load_si512(vp + (k / 2) * 64 + 16 * j), 16));
    single_step<MR>(acc, p + k * ld, v);
    ++k;
  }
  for (; k + 2 <= e; k += 2) {
    __m512bh b[4];
    for (int j = 0; j < 4; ++j) b[j] = (__m512bh)_mm512_load_si512(vp + (k / 2) * 64 + 16 * j);
    const std::uint32_t* pk = pp + (k / 2) * ld;
    for (int r = 0; r < MR; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(pk[r]));
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], x, b[j]);
    }
  }
  if (k < e) {  // the high half of its pair
    __m512 v[4];
    for (int j = 0; j < 4; ++j)
      v[j] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_load_si512(vp + (k / 2) * 64 + 16 * j),
                                                  _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
    single_step<MR>(acc, p + k * ld, v);
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(o + r * ldo + 16 * j, acc[r][j]);
}

template <int MR = kTileRows<4>>
void pv_pair_rows(int m, const float* p, const std::uint32_t* pp, Index ld, const std::uint32_t* vp, Index s, Index e,
                  float* o, Index ldo, bool zero) {
  if constexpr (MR > 1) {
    if (m < MR) return pv_pair_rows<MR - 1>(m, p, pp, ld, vp, s, e, o, ldo, zero);
  }
  pv_pair_tile<MR>(p, pp, ld, vp, s, e, o, ldo, zero);
}

// P's pairs pp[jp][i] (row stride ld) for keys 2 jp, 2 jp + 1 < nk (a last
// odd key's low half zero), from st[j][i]; whether every P a row reads (its
// keys j < vis[i]) is bf16_pair_safe.
inline bool pack_p_pairs(const float* st, Index ld, Index nk, const int* vis, int rb, std::uint32_t* pp) {
  __mmask16 bad = 0;
  for (Index i0 = 0; i0 < ld; i0 += 16) {
    const __m512i v = _mm512_loadu_si512(vis + i0);
    const __mmask16 live = first_lanes(rb - static_cast<int>(i0));
    for (Index j = 0; j < nk; j += 2) {
      const __m512 a = _mm512_load_ps(st + j * ld + i0);
      bad |= unsafe_f32_16(a) & _mm512_cmpgt_epi32_mask(v, _mm512_set1_epi32(static_cast<int>(j))) & live;
      __m512i lo = _mm512_setzero_si512();
      if (j + 1 < nk) {
        const __m512 b = _mm512_load_ps(st + (j + 1) * ld + i0);
        bad |= unsafe_f32_16(b) & _mm512_cmpgt_epi32_mask(v, _mm512_set1_epi32(static_cast<int>(j + 1))) & live;
        lo = _mm512_srli_epi32(_mm512_castps_si512(b), 16);
      }
      const __m512i hi = _mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
      _mm512_store_si512(pp + (j / 2) * ld + i0, _mm512_or_si512(hi, lo));
    }
  }
  return bad == 0;
}

// The value panel's keys [0, n) as pairs vp[jp][0..64): row(j) points at key
// j's nc values, columns past nc zero; whether every value is
// bf16_pair_safe (check: else not looked at).
template <class Row>
bool pack_v_pairs(Row&& row, Index n, Index nc, bool check, std::uint32_t* vp) {
  __mmask32 bad = 0;
  for (Index j = 0; j < n; j += 2) {
    const std::uint16_t* a = row(j);
    const std::uint16_t* b = j + 1 < n ? row(j + 1) : nullptr;
    for (Index c = 0; c < 64; c += 16) {
      const __mmask16 m = first_lanes(static_cast<int>(nc - c));
      const __m256i x = _mm256_maskz_loadu_epi16(m, a + c);
      const __m256i y = b ? _mm256_maskz_loadu_epi16(m, b + c) : _mm256_setzero_si256();
      if (check) bad |= unsafe_bf16_32(_mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1));
      const __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16);
      _mm512_store_si512(vp + (j / 2) * 64 + c, _mm512_or_si512(hi, _mm512_cvtepu16_epi32(y)));
    }
  }
  return bad == 0;
}
#else
inline constexpr bool kEmuPairs = false;
#endif

}  // namespace mlagate::detail::emu
