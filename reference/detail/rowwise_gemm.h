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
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace mlagate::detail {

using GemmIndex = std::int64_t;

inline constexpr GemmIndex kPanelCols = 64;  // columns of b per packed panel

// b [depth, cols] (row stride ldb) in panels of kPanelCols columns, each
// panel [depth][kPanelCols] contiguous and 64-byte aligned, columns past
// `cols` zero. Packed once, read by every row block.
class PackedPanels {
 public:
  PackedPanels() = default;
  // row(k, dst) writes b[k][0 .. cols) as floats into dst.
  template <class RowFn>
  PackedPanels(GemmIndex depth, GemmIndex cols, RowFn&& row) : depth_(depth), cols_(cols) {
    panels_ = (cols + kPanelCols - 1) / kPanelCols;
    buf_.assign(static_cast<std::size_t>(panels_ * depth * kPanelCols + 16), 0.f);
    const auto addr = reinterpret_cast<std::uintptr_t>(buf_.data());
    data_ = buf_.data() + ((64 - addr % 64) % 64) / sizeof(float);
    std::vector<float> r(static_cast<std::size_t>(panels_ * kPanelCols), 0.f);
    for (GemmIndex k = 0; k < depth; ++k) {
      row(k, r.data());
      for (GemmIndex p = 0; p < panels_; ++p)
        std::copy_n(r.data() + p * kPanelCols, kPanelCols, data_ + (p * depth + k) * kPanelCols);
    }
  }
  GemmIndex depth() const { return depth_; }
  GemmIndex cols() const { return cols_; }
  GemmIndex panels() const { return panels_; }
  const float* panel(GemmIndex p) const { return data_ + p * depth_ * kPanelCols; }

 private:
  GemmIndex depth_ = 0, cols_ = 0, panels_ = 0;
  std::vector<float> buf_;
  float* data_ = nullptr;
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

}  // namespace gemm_impl

// Rows per block: the tile buffer (kBlockRows x kPanelCols floats) stays in L1/L2.
inline constexpr GemmIndex kGemmBlockRows = 96;

// a [rows, depth] (row stride lda) times b, single-threaded (callers split
// rows between threads). For each block of at most kGemmBlockRows rows and
// each panel, calls sink(row0, nrows, col0, ncols, tile): tile[i * kPanelCols
// + j] is out[row0 + i][col0 + j] for i < nrows, j < ncols.
template <class Sink>
void rowwise_gemm(const float* a, GemmIndex rows, GemmIndex lda, const PackedPanels& b, Sink&& sink) {
  alignas(64) float tile[kGemmBlockRows * kPanelCols];
  constexpr GemmIndex mr = gemm_impl::kMaxRows;
  for (GemmIndex r0 = 0; r0 < rows; r0 += kGemmBlockRows) {
    const GemmIndex n = std::min(kGemmBlockRows, rows - r0);
    for (GemmIndex p = 0; p < b.panels(); ++p) {
      for (GemmIndex i = 0; i < n; i += mr)
        gemm_impl::rows_tile(static_cast<int>(std::min(mr, n - i)), a + (r0 + i) * lda, lda, b.panel(p), b.depth(),
                             tile + i * kPanelCols);
      sink(r0, n, p * kPanelCols, std::min(kPanelCols, b.cols() - p * kPanelCols), static_cast<const float*>(tile));
    }
  }
}

}  // namespace mlagate::detail
