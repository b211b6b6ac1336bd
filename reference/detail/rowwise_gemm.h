// An fp32 GEMM whose every element has the same bits however it is blocked,
// threaded or vectorized, and on any machine: out[r][c] starts at +0 and takes
// one fused multiply-add per term, a[r][0] * b[0][c] first, in order of the
// depth index. So a row's result depends on that row of `a` alone, never on
// which rows share its block; the layer glue and the baseline emulation can
// up-project different row sets and share each other's rows (glue.h,
// KvProjection). Eigen's GEMM cannot promise that: it sums rows that fall in a
// block's remainder in another order.
//
// The AVX-512, AVX2+FMA and scalar (std::fma) paths compute the same chain,
// so they give the same bits; the vector ones are for speed only (an
// AVX-512 core runs the 6 x 64 tile at most of its FMA peak).
//
// Where the compiler targets AVX512_BF16 (Zen 4, Sapphire Rapids), a GEMM
// whose two operands are bf16 values (the glue's case: bf16 latent rows and
// weights) runs at twice that rate on VDPBF16PS, with the same bits. The
// instruction does, per fp32 lane, acc += a[odd] * b[odd]; acc += a[even] *
// b[even], each step an fma with round-to-nearest-even, denormal inputs read
// as zero and denormal results flushed to zero. A product of two bf16 values
// is exact in fp32 (8 + 8 significant bits), so each step is the fma chain's
// step; the pairs are packed with depth index 2i in the odd slot and 2i + 1
// in the even slot, so the steps come in the chain's order. The flushing is
// kept out by bf16_pair_safe: with every nonzero operand in [2^-50, 2^41)
// each product and each partial sum is a multiple of 2^-114 and so either
// zero or far from fp32's denormals (below 2^-126), and no product or sum of
// a few thousand of them nears fp32's overflow. Operands outside that range,
// values that are not bf16 (most of an fp16 model's), NaN and odd depths take
// the fma path. The path is compiled when the build targets AVX512_BF16
// (-march=native on such a machine) and taken per block of rows at run time.
//
// Where it is compiled, the process also chooses whether bf16 operands take
// it at all (pair_path_preferred): the instruction's rate is the machine's.
// Measured (bench/bench_rowwise, the glue's TP 1 shape), a core of the CPU
// VM (AMD Zen 5) ran 385 GFLOP/s on pairs against 190 on the fma path; a core
// of the H200's host (Intel Emerald Rapids) 82 against 123-133
// (PERFORMANCE.md). So the first
// PackedPanels of a process whose b could take pairs times both paths on a
// small GEMM and keeps the faster; MLAGATE_ROWWISE_PATH=pairs or =fma chooses instead. Either way the
// bits are the chain's: only the speed depends on the choice. The baseline
// emulation's attention core (cpu_attention_emulation.cpp) takes the same
// choice for its bf16 tiles.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace mlagate::detail {

using GemmIndex = std::int64_t;

inline constexpr GemmIndex kPanelCols = 64;  // columns of b per packed panel

#if defined(__AVX512F__) && defined(__AVX512BF16__)
inline constexpr bool kBf16PairPath = true;
#else
inline constexpr bool kBf16PairPath = false;
#endif

// The variable that chooses the path of bf16 operands: "pairs" or "fma".
inline constexpr const char* kRowwisePathVariable = "MLAGATE_ROWWISE_PATH";

// The variable's value read: true for "pairs", false for "fma", nullopt for
// anything else (unset included: then the process measures).
std::optional<bool> rowwise_pairs_of(const char* value);

// Whether this process's PackedPanels offer bf16 pairs (where kBf16PairPath):
// the variable's choice, else the faster path on a small GEMM timed once (a
// few milliseconds, on first use). Always false without kBf16PairPath.
bool pair_path_preferred();

// x is a bf16 value (its low 16 bits zero) that VDPBF16PS multiplies and adds
// with the fma chain's bits: zero, or finite with |x| in [2^-50, 2^41).
inline bool bf16_pair_safe(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0xFFFFu) != 0) return false;
  if ((u & 0x7FFFFFFFu) == 0) return true;
  const std::uint32_t e = (u >> 23) & 0xFFu;  // biased exponent
  return e >= 127 - 50 && e < 127 + 41;
}

// Depth indices 2i and 2i + 1 of bf16-exact floats as one 32-bit pair, 2i in
// the high (odd) half, which VDPBF16PS takes first.
inline std::uint32_t bf16_pair(float first, float second) {
  return (std::bit_cast<std::uint32_t>(first) & 0xFFFF0000u) | (std::bit_cast<std::uint32_t>(second) >> 16);
}

// b [depth, cols] (row stride ldb) in panels of kPanelCols columns, each
// panel [depth][kPanelCols] contiguous and 64-byte aligned, columns past
// `cols` zero. Packed once, read by every row block.
class PackedPanels {
 public:
  PackedPanels() = default;
  // row(k, dst) writes b[k][0 .. cols) as floats into dst. `allow_pairs`
  // false packs no pairs (the fma path for every row), true packs them where
  // b allows; unset, the process's choice decides, asked only where b allows
  // pairs (so a process whose weights never could, fp16 ones, never times).
  template <class RowFn>
  PackedPanels(GemmIndex depth, GemmIndex cols, RowFn&& row, std::optional<bool> allow_pairs = std::nullopt)
      : depth_(depth), cols_(cols) {
    panels_ = (cols + kPanelCols - 1) / kPanelCols;
    buf_.assign(static_cast<std::size_t>(panels_ * depth * kPanelCols + 16), 0.f);
    const auto addr = reinterpret_cast<std::uintptr_t>(buf_.data());
    data_ = buf_.data() + ((64 - addr % 64) % 64) / sizeof(float);
    std::vector<float> r(static_cast<std::size_t>(panels_ * kPanelCols), 0.f);
    bool pairs_ok = kBf16PairPath && allow_pairs.value_or(true) && depth % 2 == 0;
    for (GemmIndex k = 0; k < depth; ++k) {
      row(k, r.data());
      if (pairs_ok) pairs_ok = std::all_of(r.begin(), r.begin() + cols, bf16_pair_safe);
      for (GemmIndex p = 0; p < panels_; ++p)
        std::copy_n(r.data() + p * kPanelCols, kPanelCols, data_ + (p * depth + k) * kPanelCols);
    }
    if (pairs_ok && !allow_pairs) pairs_ok = pair_path_preferred();
    if (pairs_ok) {
      // The same panels as bf16 pairs: [depth / 2][kPanelCols] each.
      pair_buf_.assign(static_cast<std::size_t>(panels_ * depth / 2 * kPanelCols + 16), 0u);
      const auto paddr = reinterpret_cast<std::uintptr_t>(pair_buf_.data());
      pairs_ = pair_buf_.data() + ((64 - paddr % 64) % 64) / sizeof(std::uint32_t);
      for (GemmIndex p = 0; p < panels_; ++p)
        for (GemmIndex kp = 0; kp < depth / 2; ++kp) {
          const float* f0 = data_ + (p * depth + 2 * kp) * kPanelCols;
          std::uint32_t* dst = pairs_ + (p * (depth / 2) + kp) * kPanelCols;
          for (GemmIndex c = 0; c < kPanelCols; ++c) dst[c] = bf16_pair(f0[c], f0[kPanelCols + c]);
        }
    }
  }
  // data_ and pairs_ point into the buffers: a move keeps them valid, a copy would not.
  PackedPanels(const PackedPanels&) = delete;
  PackedPanels& operator=(const PackedPanels&) = delete;
  PackedPanels(PackedPanels&&) noexcept = default;
  PackedPanels& operator=(PackedPanels&&) noexcept = default;
  GemmIndex depth() const { return depth_; }
  GemmIndex cols() const { return cols_; }
  GemmIndex panels() const { return panels_; }
  const float* panel(GemmIndex p) const { return data_ + p * depth_ * kPanelCols; }
  // Whether every value of b is bf16_pair_safe (and the path compiled, the
  // depth even): then pair_panel(p) is panel p as bf16 pairs.
  bool has_pairs() const { return pairs_ != nullptr; }
  const std::uint32_t* pair_panel(GemmIndex p) const { return pairs_ + p * (depth_ / 2) * kPanelCols; }

 private:
  GemmIndex depth_ = 0, cols_ = 0, panels_ = 0;
  std::vector<float> buf_;
  float* data_ = nullptr;
  std::vector<std::uint32_t> pair_buf_;
  std::uint32_t* pairs_ = nullptr;
};

namespace gemm_impl {

#if defined(__AVX512F__)
inline constexpr int kMaxRows = 6;  // 24 accumulators + 4 panel registers of 32
template <int MR>
inline void tile(const float* a, GemmIndex lda, const float* p, GemmIndex depth, float* o) {
  __m512 acc[MR][4];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (GemmIndex k = 0; k < depth; ++k) {
    const float* pk = p + k * kPanelCols;
    const __m512 b0 = _mm512_load_ps(pk), b1 = _mm512_load_ps(pk + 16), b2 = _mm512_load_ps(pk + 32),
                 b3 = _mm512_load_ps(pk + 48);
    for (int r = 0; r < MR; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * lda + k]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(x, b2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(x, b3, acc[r][3]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) _mm512_store_ps(o + r * kPanelCols + 16 * j, acc[r][j]);
}
#elif defined(__AVX2__) && defined(__FMA__)
// One row at a time, each half panel in 4 accumulators: measured faster (48
// against 32-39 GFLOP/s a thread) than 2 to 4 rows sharing the panel loads.
inline constexpr int kMaxRows = 1;
template <int MR>
inline void tile(const float* a, GemmIndex lda, const float* p, GemmIndex depth, float* o) {
  for (int half = 0; half < 2; ++half) {
    const float* ph = p + 32 * half;
    __m256 acc[MR][4];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
    for (GemmIndex k = 0; k < depth; ++k) {
      const float* pk = ph + k * kPanelCols;
      const __m256 b0 = _mm256_load_ps(pk), b1 = _mm256_load_ps(pk + 8), b2 = _mm256_load_ps(pk + 16),
                   b3 = _mm256_load_ps(pk + 24);
      for (int r = 0; r < MR; ++r) {
        const __m256 x = _mm256_set1_ps(a[r * lda + k]);
        acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
        acc[r][2] = _mm256_fmadd_ps(x, b2, acc[r][2]);
        acc[r][3] = _mm256_fmadd_ps(x, b3, acc[r][3]);
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < 4; ++j) _mm256_store_ps(o + r * kPanelCols + 32 * half + 8 * j, acc[r][j]);
  }
}
#else
inline constexpr int kMaxRows = 1;
template <int MR>
inline void tile(const float* a, GemmIndex lda, const float* p, GemmIndex depth, float* o) {
  for (int r = 0; r < MR; ++r)
    for (GemmIndex c = 0; c < kPanelCols; ++c) {
      float acc = 0.f;
      for (GemmIndex k = 0; k < depth; ++k) acc = std::fma(a[r * lda + k], p[k * kPanelCols + c], acc);
      o[r * kPanelCols + c] = acc;
    }
}
#endif

template <int MR = kMaxRows>
inline void rows_tile(int m, const float* a, GemmIndex lda, const float* p, GemmIndex depth, float* o) {
  if constexpr (MR > 1) {
    if (m < MR) return rows_tile<MR - 1>(m, a, lda, p, depth, o);
  }
  tile<MR>(a, lda, p, depth, o);
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
// The 6 x 64 tile on bf16 pairs: a [MR][pairs] (row stride lda pairs), p one
// pair panel. Per pair, one VDPBF16PS per accumulator does two of the chain's
// fma steps.
template <int MR>
inline void pair_tile(const std::uint32_t* a, GemmIndex lda, const std::uint32_t* p, GemmIndex pairs, float* o) {
  __m512 acc[MR][4];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (GemmIndex k = 0; k < pairs; ++k) {
    const std::uint32_t* pk = p + k * kPanelCols;
    const __m512bh b0 = (__m512bh)_mm512_load_si512(pk), b1 = (__m512bh)_mm512_load_si512(pk + 16),
                   b2 = (__m512bh)_mm512_load_si512(pk + 32), b3 = (__m512bh)_mm512_load_si512(pk + 48);
    for (int r = 0; r < MR; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * lda + k]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], x, b2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], x, b3);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) _mm512_store_ps(o + r * kPanelCols + 16 * j, acc[r][j]);
}

template <int MR = kMaxRows>
inline void rows_pair_tile(int m, const std::uint32_t* a, GemmIndex lda, const std::uint32_t* p, GemmIndex pairs,
                           float* o) {
  if constexpr (MR > 1) {
    if (m < MR) return rows_pair_tile<MR - 1>(m, a, lda, p, pairs, o);
  }
  pair_tile<MR>(a, lda, p, pairs, o);
}
#endif

// Rows [0, n) of a (row stride lda, depth columns) as bf16 pairs into dst
// [n][depth / 2]; false (dst unspecified) if any value is not bf16_pair_safe.
inline bool pack_pair_rows(const float* a, GemmIndex n, GemmIndex lda, GemmIndex depth, std::uint32_t* dst) {
  for (GemmIndex i = 0; i < n; ++i) {
    const float* row = a + i * lda;
    if (!std::all_of(row, row + depth, bf16_pair_safe)) return false;
    for (GemmIndex k = 0; k < depth / 2; ++k) dst[i * (depth / 2) + k] = bf16_pair(row[2 * k], row[2 * k + 1]);
  }
  return true;
}

}  // namespace gemm_impl

// Rows per block: the tile buffer (kBlockRows x kPanelCols floats) stays in L1/L2.
inline constexpr GemmIndex kGemmBlockRows = 96;

// a [rows, depth] (row stride lda) times b, single-threaded (callers split
// rows between threads). For each block of at most kGemmBlockRows rows and
// each panel, calls sink(row0, nrows, col0, ncols, tile): tile[i * kPanelCols
// + j] is out[row0 + i][col0 + j] for i < nrows, j < ncols.
// A block takes the bf16 pair path when b has pairs and the block's rows of a
// are all bf16_pair_safe; either path gives the same bits.
template <class Sink>
void rowwise_gemm(const float* a, GemmIndex rows, GemmIndex lda, const PackedPanels& b, Sink&& sink) {
  alignas(64) float tile[kGemmBlockRows * kPanelCols];
  constexpr GemmIndex mr = gemm_impl::kMaxRows;
  // The block's rows as pairs (this thread's, reused across calls).
  thread_local std::vector<std::uint32_t> pair_rows;
  for (GemmIndex r0 = 0; r0 < rows; r0 += kGemmBlockRows) {
    const GemmIndex n = std::min(kGemmBlockRows, rows - r0);
    [[maybe_unused]] bool pairs = false;
    if constexpr (kBf16PairPath) {
      if (b.has_pairs()) {
        pair_rows.resize(static_cast<std::size_t>(kGemmBlockRows * (b.depth() / 2)));
        pairs = gemm_impl::pack_pair_rows(a + r0 * lda, n, lda, b.depth(), pair_rows.data());
      }
    }
    for (GemmIndex p = 0; p < b.panels(); ++p) {
      for (GemmIndex i = 0; i < n; i += mr) {
        const int m = static_cast<int>(std::min(mr, n - i));
#if defined(__AVX512F__) && defined(__AVX512BF16__)
        if (pairs) {
          gemm_impl::rows_pair_tile(m, pair_rows.data() + i * (b.depth() / 2), b.depth() / 2, b.pair_panel(p),
                                    b.depth() / 2, tile + i * kPanelCols);
          continue;
        }
#endif
        gemm_impl::rows_tile(m, a + (r0 + i) * lda, lda, b.panel(p), b.depth(), tile + i * kPanelCols);
      }
      sink(r0, n, p * kPanelCols, std::min(kPanelCols, b.cols() - p * kPanelCols), static_cast<const float*>(tile));
    }
  }
}

}  // namespace mlagate::detail
