// The emulation's attention core in its fixed order (sdpa_emulation.h,
// EmulatedAttention) on the CPU at GEMM speed: the baseline emulation's
// default. It writes the bytes of emulate_attention_fixed_order, the plain
// yardstick, and so of the GPU emulator of --reference cuda
// (tests/reference/cpu_attention_emulation_test.cpp checks every path
// against the yardstick, byte for byte).
//
// Each element keeps the yardstick's order however the work is blocked:
// - a logit is one fma chain over the depth from +0; a tile of query rows by
//   64 keys runs its chains side by side;
// - the softmax's max and sum run in the 32 lanes of emulation_math.h (two
//   AVX-512 vectors are the 32 lanes), combined as the yardstick combines them;
// - an output is one fma chain over its row's visible keys and no further: a
//   tile runs its rows' common keys, then each row continues alone. A term
//   0 * v past a row's keys is not a no-op (it turns an accumulated -0 into
//   +0, and 0 * NaN is NaN), so none is ever added.
// Where the build has VDPBF16PS and the process prefers it (as the glue's
// up-projection does, detail/rowwise_gemm.h), a bf16 call's chains take two
// steps an instruction: the products of two bf16 values are exact, so each
// step is the fma chain's, and whatever the instruction would flush (values
// outside [2^-50, 2^41), subnormal probabilities) or cannot take (NaN,
// infinities, odd depths, fp16, fp32 keys) runs on the fma tiles. On the CPU
// VM (AMD Zen 5) that cut the decode form's time by a third (PERFORMANCE.md).
// Compiled with -ffp-contract=off (reference/CMakeLists.txt): GCC writes
// _mm512_mul_ps as a plain vector product, which it would otherwise fuse
// with the add that follows, and the scalar paths are plain expressions.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "cases/encoding.h"
#include "reference/detail/emulation_math.h"
#include "reference/detail/emulation_tiles.h"
#include "reference/detail/rowwise_gemm.h"
#include "reference/detail/widen.h"
#include "reference/sdpa_emulation.h"

namespace mlagate {
namespace {

using namespace detail::emu;  // the tiles (detail/emulation_tiles.h)
using Elem = EmulatedAttention::Elem;

// Query rows of a unit, the columns of its packed query panel, and the
// value columns of a packed value panel.
constexpr Index kPanel = 64;
constexpr Index kDepthBlock = 256;  // keys per pass of P V: its slices of P and of the value panel stay in L2

// n elements of `e` from base[first], widened exactly to fp32.
void widen(const void* base, Index first, Index n, Elem e, float* dst) {
  if (e == Elem::kF32) {
    std::memcpy(dst, static_cast<const float*>(base) + first, static_cast<std::size_t>(n) * sizeof(float));
    return;
  }
  detail::widen_16bit(static_cast<const std::uint16_t*>(base) + first, e == Elem::kBF16, n, dst);
}

// The start of key or value row j: rows[j] where the rows lie in pieces, else base + j * stride elements.
const void* row_start(const void* base, const void* const* rows, Index stride, Index j, Elem e) {
  if (rows) return rows[j];
  return static_cast<const std::byte*>(base) + j * stride * (e == Elem::kF32 ? 4 : 2);
}

// A buffer of 4-byte elements aligned to 64 bytes, grown on demand and reused by a thread.
template <class T>
class BasicBuffer {
  static_assert(sizeof(T) == 4);

 public:
  T* get(Index n) {
    if (static_cast<Index>(buf_.size()) < n + 16) buf_.resize(static_cast<std::size_t>(n + 16));
    const auto addr = reinterpret_cast<std::uintptr_t>(buf_.data());
    return buf_.data() + ((64 - addr % 64) % 64) / sizeof(T);
  }
  // Gives the memory back where it is more than `n` elements (a long request's).
  void trim(Index n) {
    if (static_cast<Index>(buf_.size()) > n) buf_ = {};
  }

 private:
  std::vector<T> buf_;
};
using Buffer = BasicBuffer<float>;
using PairBuffer = BasicBuffer<std::uint32_t>;


// ---- The softmax of a block's rows, in place over st[j][i] (row stride
// ld): row i's logits are st[j][i] for its keys j < vis[i]; they become
// P_j = round16(emu_exp(s_j * scale - m)). row_max[i] and row_sum[i] get m
// and the lanes' sum of the unrounded exponentials. Entries past a row's
// keys may be overwritten (nothing reads them).

[[maybe_unused]] void softmax_block_plain(float* st, Index ld, const int* vis, int rb, float scale, bool bf16,
                                          float* row_max, float* row_sum) {
  using namespace detail;
  for (int i = 0; i < rb; ++i) {
    const int n = vis[i];
    if (n == 0) continue;
    float lane[kEmuLanes];
    for (float& l : lane) l = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < n; ++j) {
      float& x = st[j * ld + i];
      x = emu_mul(x, scale);
      lane[j % kEmuLanes] = emu_max2(lane[j % kEmuLanes], x);
    }
    const float m = emu_combine_lanes(lane, emu_max2);
    for (float& l : lane) l = 0.0f;
    for (int j = 0; j < n; ++j) {
      float& x = st[j * ld + i];
      const float e = emu_exp(emu_sub(x, m));
      lane[j % kEmuLanes] = emu_add(lane[j % kEmuLanes], e);
      x = emu_round16(e, bf16);
    }
    row_max[i] = m;
    row_sum[i] = emu_combine_lanes(lane, emu_add);
  }
}

#if defined(__AVX512F__)
// emu_max2 lane by lane: a where a is NaN, else b where b is NaN, else the larger.
__m512 max2_16(__m512 a, __m512 b) {
  const __mmask16 b_larger = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ);
  const __mmask16 b_nan = _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q) & ~_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(b_larger | b_nan, a, b);
}

__m512 pow2_bits(__m512i biased) { return _mm512_castsi512_ps(_mm512_slli_epi32(biased, 23)); }

// emu_exp lane by lane, step for step.
__m512 exp16(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
  // Lanes outside [-104, 88.72283] (NaN included) are replaced below, so
  // their exponent may be anything here.
  const __m512i e = _mm512_cvtps_epi32(n);
  const __m512 normal = _mm512_mul_ps(y, pow2_bits(_mm512_add_epi32(e, _mm512_set1_epi32(127))));
  const __m512 big = _mm512_mul_ps(_mm512_mul_ps(y, _mm512_set1_ps(2.0f)),
                                   pow2_bits(_mm512_add_epi32(e, _mm512_set1_epi32(126))));
  const __m512 small = _mm512_mul_ps(_mm512_mul_ps(y, pow2_bits(_mm512_add_epi32(e, _mm512_set1_epi32(64 + 127)))),
                                     _mm512_castsi512_ps(_mm512_set1_epi32((-64 + 127) << 23)));
  __m512 out = _mm512_mask_blend_ps(_mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(127)), normal, big);
  out = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(-126)), out, small);
  out = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_LT_OQ), out, _mm512_setzero_ps());
  out = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(88.72283f), _CMP_GT_OQ), out,
                             _mm512_castsi512_ps(_mm512_set1_epi32(0x7F800000)));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), out, x);
}

// emu_round16 lane by lane: encoding.h's integer rounding, then the exact widening.
__m512 round16_16(__m512 x, bool bf16) {
  const __m512i u = _mm512_castps_si512(x);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  if (bf16) {
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)),
                                             _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
    // NaN: sign and top payload kept, made quiet.
    const __m512i quiet = _mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))),
                                          _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(nan, rounded, quiet));
  }
  // IEEE binary16 with round to nearest even, subnormals and overflow to
  // inf, as f32_bits_to_f16; its NaN is 0x7E00 with the sign, widened to
  // 0x7FC00000 with the sign.
  const __m512 h = _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m512i quiet = _mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0x80000000u))),
                                        _mm512_set1_epi32(0x7FC00000));
  return _mm512_mask_blend_ps(nan, h, _mm512_castsi512_ps(quiet));
}

// The lanes of 16 rows combined by halves, each row as emu_combine_lanes combines its own.
template <class Op>
__m512 combine_lanes_16(__m512 (&lane)[detail::kEmuLanes], Op op) {
  for (int off = detail::kEmuLanes / 2; off >= 1; off /= 2) {
    __m512 next[detail::kEmuLanes];
    for (int l = 0; l < detail::kEmuLanes; ++l) next[l] = op(lane[l], lane[l ^ off]);
    for (int l = 0; l < detail::kEmuLanes; ++l) lane[l] = next[l];
  }
  return lane[0];
}

// 16 rows at a time, one vector element a row; each row's lane l is lane[l]'s element.
void softmax_block(float* st, Index ld, const int* vis, int rb, float scale, bool bf16, float* row_max,
                   float* row_sum) {
  const __m512 vscale = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  constexpr int kL = detail::kEmuLanes;
  for (int i0 = 0; i0 < rb; i0 += 16) {
    const __m512i v = _mm512_loadu_si512(vis + i0);  // vis holds kPanel entries, 0 past rb
    const int n = vis[std::min(i0 + 15, rb - 1)];    // the group's most keys
    if (n == 0) continue;
    __m512 lane[kL];
    for (__m512& l : lane) l = ninf;
    for (int j = 0; j < n; ++j) {
      const __mmask16 seen = _mm512_cmpgt_epi32_mask(v, _mm512_set1_epi32(j));
      float* at = st + j * ld + i0;
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(at), vscale);
      _mm512_storeu_ps(at, x);
      __m512& l = lane[j % kL];
      l = _mm512_mask_blend_ps(seen, l, max2_16(l, x));
    }
    const __m512 m = combine_lanes_16(lane, max2_16);
    for (__m512& l : lane) l = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j) {
      const __mmask16 seen = _mm512_cmpgt_epi32_mask(v, _mm512_set1_epi32(j));
      float* at = st + j * ld + i0;
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(at), m));
      // Rows past their keys add +0: a lane's sum is +0 or more (or NaN), which +0 leaves as it is.
      lane[j % kL] = _mm512_add_ps(lane[j % kL], _mm512_maskz_mov_ps(seen, e));
      _mm512_storeu_ps(at, round16_16(e, bf16));
    }
    const __m512 sum = combine_lanes_16(lane, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
    _mm512_storeu_ps(row_max + i0, m);
    _mm512_storeu_ps(row_sum + i0, sum);
  }
}


// o[c] = round16(acc[c] / sum) for c < n.
void finish_outputs(const float* acc, int n, float sum, bool bf16, float* o) {
  const __m512 vs = _mm512_set1_ps(sum);
  for (int c = 0; c < n; c += 16) {
    const __mmask16 m = first_lanes(n - c);
    _mm512_mask_storeu_ps(o + c, m, round16_16(_mm512_div_ps(_mm512_maskz_loadu_ps(m, acc + c), vs), bf16));
  }
}
#else
void softmax_block(float* st, Index ld, const int* vis, int rb, float scale, bool bf16, float* row_max,
                   float* row_sum) {
  softmax_block_plain(st, ld, vis, rb, scale, bf16, row_max, row_sum);
}
void finish_outputs(const float* acc, int n, float sum, bool bf16, float* o) {
  for (int c = 0; c < n; ++c) o[c] = detail::emu_round16(detail::emu_div(acc[c], sum), bf16);
}
#endif


std::atomic<int> g_pairs_forced{-1};  // set_cpu_emulation_pairs: -1 unset, else 0 or 1
std::atomic<std::uint64_t> g_pair_tiles{0}, g_pair_passes{0};

// Whether this process gives bf16 calls the pair path.
[[maybe_unused]] bool pairs_wanted() {
  if constexpr (!kEmuPairs) {
    return false;
  } else {
    const int forced = g_pairs_forced.load(std::memory_order_relaxed);
    return forced >= 0 ? forced == 1 : detail::pair_path_preferred();
  }
}

// A thread's buffers, reused across its units.
struct Scratch {
  Buffer qt, st, panel, acc, keys, rows;
  PairBuffer q_pairs, p_pairs, v_pairs;  // the pair path's
  std::vector<int> visible;
  std::uint64_t pair_tiles = 0, pair_passes = 0;  // logit tiles and value passes on pairs, for g_pair_counts
  // What a thread keeps between calls: 16 MiB of logits (65536 keys), as
  // the pool's threads live as long as the process, and half that of P's pairs.
  void trim() {
    st.trim(Index{1} << 22);
    p_pairs.trim(Index{1} << 21);
  }
};

// What a call's units share about the pair path: whether they take it (a
// bf16 call of even depth, where the process wants pairs), and whether all
// its keys and values were found pair-safe once for all units (the decode
// form's rows are every head's), so that no tile looks again.
struct CallPairs {
  bool on = false, keys_safe = false, values_safe = false;
};

// The logits of a unit's rows: st[j][0..16 NV) (row stride 16 NV) for keys
// j < nk against the query panel qt [dqk][16 NV], a tile of keys at a time.
// With qp (the query panel as pairs, where the call takes them and the
// unit's queries are pair-safe), a tile whose keys are pair-safe runs on pairs.
template <int NV>
void logits(const EmulatedAttention& a, int h, const float* qt, [[maybe_unused]] const std::uint32_t* qp,
            [[maybe_unused]] bool keys_safe, Index nk, float* st, float* keys, [[maybe_unused]] Scratch& t) {
  const Index dqk = a.dqk, ld = 16 * NV;
  constexpr int kKeys = kTileRows<NV>;
  for (Index j = 0; j < nk; j += kKeys) {
    const int m = static_cast<int>(std::min<Index>(kKeys, nk - j));
#ifdef MLAGATE_EMU_PAIRS
    if constexpr (kEmuPairs) {
      if (qp) {
        const std::uint16_t* key[kKeys];
        bool safe = true;
        for (int r = 0; r < m; ++r) {
          key[r] = static_cast<const std::uint16_t*>(row_start(a.k, a.k_rows, a.k_row, j + r, a.elem)) + h * a.k_head;
          safe = safe && (keys_safe || bf16_run_pair_safe(key[r], dqk));
        }
        if (safe) {
          logit_pair_rows<NV>(m, key, qp, dqk / 2, st + j * ld, ld);
          ++t.pair_tiles;
          continue;
        }
      }
    }
#endif
    const float* k = keys;
    Index ldk = dqk;
    if (a.elem == Elem::kF32 && a.k_head == 0 && !a.k_rows) {
      k = static_cast<const float*>(a.k) + j * a.k_row;  // fp32 keys: read in place
      ldk = a.k_row;
    } else {
      for (int r = 0; r < m; ++r)
        widen(row_start(a.k, a.k_rows, a.k_row, j + r, a.elem), h * a.k_head, dqk, a.elem, keys + r * dqk);
    }
    rows_tile<NV>(m, k, ldk, 1, qt, ld, 0, dqk, st + j * ld, ld, true);
  }
}

// Rows [r0, r0 + rb) (rb <= kPanel) of head h of call a. The unit's logits
// and probabilities are held transposed, st[j][i] for key j and row i (row
// stride: the query panel's width): the logits' tiles run over keys against
// the unit's queries as one packed panel, and the softmax runs across 16 rows
// at a time, each row in its own lanes.
void unit(const EmulatedAttention& a, const CallPairs& cp, int h, int r0, int rb, Scratch& t) {
  const Index dqk = a.dqk, dv = a.dv;
  t.visible.assign(static_cast<std::size_t>(kPanel), 0);
  for (int i = 0; i < rb; ++i) t.visible[i] = detail::emu_visible(r0 + i, a.rows_per_token, a.context, a.keys);
  const int* vis = t.visible.data();
  // Visibility never falls as r grows: the last row sees the most keys.
  const Index nk = vis[rb - 1];
  for (int i = 0; i < rb && vis[i] == 0; ++i) {
    const Index u = Index{r0 + i} * a.heads + h;
    std::fill_n(a.o + u * dv, dv, 0.0f);
    a.max[u] = -std::numeric_limits<float>::infinity();
    a.sum[u] = 0;
  }
  if (nk == 0) return;
  // The unit's queries as one panel [dqk][ld], columns past rb zero.
  const int nv = panel_vectors(rb);
  const Index ld = 16 * nv;
  float* qt = t.qt.get(dqk * ld);
  if (rb < ld) std::fill_n(qt, dqk * ld, 0.0f);
  float* keys = t.keys.get(24 * dqk);
  for (int i = 0; i < rb; ++i) {
    widen(a.q, Index{r0 + i} * a.q_row + h * a.q_head, dqk, a.elem, keys);
    for (Index d = 0; d < dqk; ++d) qt[d * ld + i] = keys[d];
  }
  // The same panel as pairs [dqk / 2][ld] (element 2i high), where the call
  // takes them and every query of the unit is pair-safe; else null.
  std::uint32_t* qp = nullptr;
#ifdef MLAGATE_EMU_PAIRS
  if constexpr (kEmuPairs) {
    if (cp.on) {
      qp = t.q_pairs.get(dqk / 2 * ld);
      if (rb < ld) std::fill_n(qp, dqk / 2 * ld, 0u);
      for (int i = 0; i < rb && qp; ++i) {
        const auto* q = static_cast<const std::uint16_t*>(a.q) + Index{r0 + i} * a.q_row + h * a.q_head;
        if (!bf16_run_pair_safe(q, dqk)) {
          qp = nullptr;
          break;
        }
        for (Index k = 0; k < dqk / 2; ++k) qp[k * ld + i] = std::rotl(load_pair(q + 2 * k), 16);
      }
    }
  }
#endif
  float* st = t.st.get(nk * ld);
  if constexpr (kNarrowPanels) {
    if (nv == 1) {
      logits<1>(a, h, qt, qp, cp.keys_safe, nk, st, keys, t);
    } else if (nv == 2) {
      logits<2>(a, h, qt, qp, cp.keys_safe, nk, st, keys, t);
    } else {
      logits<4>(a, h, qt, qp, cp.keys_safe, nk, st, keys, t);
    }
  } else {
    logits<4>(a, h, qt, qp, cp.keys_safe, nk, st, keys, t);
  }
  // The softmax of every row over its own keys; st becomes P.
  float* row_max = t.rows.get(2 * kPanel);
  float* row_sum = row_max + kPanel;
  softmax_block(st, ld, vis, rb, a.scale, a.bf16, row_max, row_sum);
  for (int i = 0; i < rb; ++i) {
    if (vis[i] == 0) continue;
    const Index u = Index{r0 + i} * a.heads + h;
    a.max[u] = row_max[i];
    a.sum[u] = row_sum[i];
  }
  // o = P V: per panel of 64 value columns, in passes of kDepthBlock keys; a
  // tile of rows runs up to its first row's keys, each row then on to its own.
  constexpr int kRows = kTileRows<4>;
  float* acc = t.acc.get(kPanel * kPanel);
  float* vp = t.panel.get(kDepthBlock * kPanel);
  // P as pairs [(nk + 1) / 2][ld] where the call takes them and every P a
  // row reads is pair-safe; the passes whose values are too run on them.
  [[maybe_unused]] std::uint32_t* pp = nullptr;
  [[maybe_unused]] std::uint32_t* vpp = nullptr;
#ifdef MLAGATE_EMU_PAIRS
  if constexpr (kEmuPairs) {
    if (cp.on) {
      pp = t.p_pairs.get((nk + 1) / 2 * ld);
      if (!pack_p_pairs(st, ld, nk, vis, rb, pp)) pp = nullptr;
      vpp = t.v_pairs.get(kDepthBlock / 2 * kPanel);
    }
  }
#endif
  for (Index c0 = 0; c0 < dv; c0 += kPanel) {
    const Index nc = std::min(kPanel, dv - c0);
    // A pass on the fma tiles (a value the pairs refuse) can leave a
    // subnormal accumulator, which VDPBF16PS would read as zero: once one
    // pass of the panel ran on fma, its later passes do too.
    [[maybe_unused]] bool panel_pairs = true;
    for (Index k0 = 0; k0 < nk; k0 += kDepthBlock) {
      const Index k1 = std::min(nk, k0 + kDepthBlock);
#ifdef MLAGATE_EMU_PAIRS
      if constexpr (kEmuPairs) {
        const auto value_row = [&](Index j) {
          return static_cast<const std::uint16_t*>(row_start(a.v, a.v_rows, a.v_row, k0 + j, a.elem)) +
                 h * a.v_head + c0;
        };
        if (pp && panel_pairs && pack_v_pairs(value_row, k1 - k0, nc, !cp.values_safe, vpp)) {
          for (int i = 0; i < rb; i += kRows) {
            const int m = std::min(kRows, rb - i);
            const Index common = std::min<Index>(vis[i], k1);
            const float* p = st + k0 * ld;
            const std::uint32_t* pk = pp + k0 / 2 * ld;
            if (k0 == 0 || common > k0)
              pv_pair_rows(m, p + i, pk + i, ld, vpp, 0, std::max<Index>(common - k0, 0), acc + i * kPanel, kPanel,
                           k0 == 0);
            for (int r = i + 1; r < i + m; ++r) {
              const Index from = std::max<Index>(k0, vis[i]), to = std::min<Index>(vis[r], k1);
              if (to > from)
                pv_pair_rows<1>(1, p + r, pk + r, ld, vpp, from - k0, to - k0, acc + r * kPanel, kPanel, false);
            }
          }
          ++t.pair_passes;
          continue;
        }
        panel_pairs = false;
      }
#endif
      // Keys [k0, k1) of the value panel, at its rows [0, k1 - k0).
      for (Index j = k0; j < k1; ++j) {
        float* row = vp + (j - k0) * kPanel;
        widen(row_start(a.v, a.v_rows, a.v_row, j, a.elem), h * a.v_head + c0, nc, a.elem, row);
        if (nc < kPanel) std::fill(row + nc, row + kPanel, 0.0f);
      }
      const float* p = st + k0 * ld;  // P's keys from k0: p[(j - k0) * ld + i]
      for (int i = 0; i < rb; i += kRows) {
        const int m = std::min(kRows, rb - i);
        const Index common = std::min<Index>(vis[i], k1);
        if (k0 == 0 || common > k0)
          rows_tile<4>(m, p + i, 1, ld, vp, kPanel, 0, std::max<Index>(common - k0, 0), acc + i * kPanel, kPanel,
                       k0 == 0);
        for (int r = i + 1; r < i + m; ++r) {
          const Index from = std::max<Index>(k0, vis[i]), to = std::min<Index>(vis[r], k1);
          if (to > from) rows_tile<4, 1>(1, p + r, 1, ld, vp, kPanel, from - k0, to - k0, acc + r * kPanel, kPanel, false);
        }
      }
    }
    for (int i = 0; i < rb; ++i) {
      if (vis[i] == 0) continue;
      const Index u = Index{r0 + i} * a.heads + h;
      float* o = a.o + u * dv + c0;
      if (row_sum[i] == 0) {
        std::fill_n(o, nc, 0.0f);
      } else {
        finish_outputs(acc + i * kPanel, static_cast<int>(nc), row_sum[i], a.bf16, o);
      }
    }
  }
}

}  // namespace

void emulate_attention_cpu(std::span<const EmulatedAttention> calls) {
  // Calls that name latent rows instead of keys read them projected, as the yardstick does.
  std::vector<EmulatedAttention> work(calls.begin(), calls.end());
  std::vector<CallPairs> pairs(calls.size());
  std::vector<Tensor> projected(2 * calls.size());
  struct Unit {
    std::size_t call;
    int head, row0, rows;
  };
  std::vector<Unit> units;
  for (std::size_t k = 0; k < work.size(); ++k) {
    EmulatedAttention& a = work[k];
    if (a.rows < 0 || a.heads < 1 || a.rows_per_token < 1 || a.keys < 0 || a.dqk < 1 || a.dv < 1)
      throw std::invalid_argument("emulate_attention_cpu: bad dimensions");
    if (a.keys > 0 && !((a.k || a.k_rows) && (a.v || a.v_rows)))
      a = with_projected_kv(a, projected[2 * k], projected[2 * k + 1]);
#ifdef MLAGATE_EMU_PAIRS
    if constexpr (kEmuPairs) {
      CallPairs& cp = pairs[k];
      // The process's choice asked only for calls that could take pairs (an
      // fp16 process never times the paths).
      cp.on = a.elem == Elem::kBF16 && a.dqk % 2 == 0 && a.keys > 0 && pairs_wanted();
      // Rows every head reads (the decode form's): looked at once here, not by each unit's tiles.
      const auto all_safe = [&](const void* base, const void* const* rows, Index stride, Index width) {
        for (Index j = 0; j < a.keys; ++j)
          if (!bf16_run_pair_safe(static_cast<const std::uint16_t*>(row_start(base, rows, stride, j, a.elem)), width))
            return false;
        return true;
      };
      if (cp.on && a.heads == 1) {
        cp.keys_safe = all_safe(a.k, a.k_rows, a.k_row, a.dqk);
        cp.values_safe = all_safe(a.v, a.v_rows, a.v_row, a.dv);
      }
    }
#endif
    for (int h = 0; h < a.heads; ++h)
      for (int r0 = 0; r0 < a.rows; r0 += static_cast<int>(kPanel))
        units.push_back({k, h, r0, std::min(static_cast<int>(kPanel), a.rows - r0)});
  }
  const auto n = static_cast<std::int64_t>(units.size());
#pragma omp parallel
  {
    // Kept by the pool's threads from call to call: growing them zeroes and
    // faults in their pages.
    thread_local Scratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t u = 0; u < n; ++u) {
      const Unit& un = units[static_cast<std::size_t>(u)];
      unit(work[un.call], pairs[un.call], un.head, un.row0, un.rows, scratch);
    }
    scratch.trim();
    g_pair_tiles.fetch_add(std::exchange(scratch.pair_tiles, 0), std::memory_order_relaxed);
    g_pair_passes.fetch_add(std::exchange(scratch.pair_passes, 0), std::memory_order_relaxed);
  }
}

std::optional<bool> set_cpu_emulation_pairs(std::optional<bool> use) {
  const int was = g_pairs_forced.exchange(use ? int{*use} : -1);
  return was < 0 ? std::nullopt : std::optional<bool>(was == 1);
}

bool cpu_emulation_has_pairs() { return kEmuPairs; }

CpuEmulationPairCounts cpu_emulation_pair_counts() {
  return {g_pair_tiles.load(std::memory_order_relaxed), g_pair_passes.load(std::memory_order_relaxed)};
}

}  // namespace mlagate
