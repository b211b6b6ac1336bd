// The fp64 chain GEMM (chain_gemm.h): b packed a block at a time into panels
// of a path's width, each row tile's accumulators taking the block's terms in
// order of depth, starting from the element's value after the block before.
// The vector paths are compiled for their instruction sets whatever the
// build targets and chosen by the CPU at run time, so a build without
// -march=native (a wheel to copy elsewhere) is not left on std::fma calls.
#include "reference/detail/chain_gemm.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MLAGATE_CHAIN_X86 1
#else
#define MLAGATE_CHAIN_X86 0
#endif

namespace mlagate::detail {
namespace {

// Blocks: kKc depth steps of kNc columns of b packed (kKc * kNc * 8 bytes,
// 1 MiB: within a core's L2), kMc rows of a read per panel.
constexpr ChainIndex kKc = 256;
constexpr ChainIndex kNc = 512;
constexpr ChainIndex kMc = 96;

// A tile: rows of a (row stride lda) times a packed panel [kc][Nr] into c,
// whose first ncols columns are the product's; from_c continues c's chains.
using TileFn = void (*)(ChainIndex kc, const double* a, ChainIndex lda, const double* panel, double* c, ChainIndex ldc,
                        int ncols, bool from_c);

struct Path {
  int nr;      // panel width
  int max_mr;  // rows a tile takes at most
  std::array<TileFn, 8> tiles;  // tiles[r - 1]: the kernel of r rows
};

// The definition itself: scalar fma, kNr 8.
template <int MR>
void tile_scalar(ChainIndex kc, const double* a, ChainIndex lda, const double* panel, double* c, ChainIndex ldc,
                 int ncols, bool from_c) {
  constexpr int nr = 8;
  double acc[MR][nr];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < nr; ++j) acc[r][j] = from_c && j < ncols ? c[r * ldc + j] : 0.0;
  for (ChainIndex p = 0; p < kc; ++p)
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < nr; ++j) acc[r][j] = std::fma(a[r * lda + p], panel[p * nr + j], acc[r][j]);
  for (int r = 0; r < MR; ++r) std::copy_n(acc[r], ncols, c + r * ldc);
}

#if MLAGATE_CHAIN_X86
// AVX-512: 6 rows x 4 vectors of 8, 24 accumulators and 4 panel registers of 32.
__attribute__((target("avx512f"))) inline __mmask8 lanes(int ncols, int v) {
  const int n = std::clamp(ncols - 8 * v, 0, 8);
  return static_cast<__mmask8>((1u << n) - 1u);
}

template <int MR>
__attribute__((target("avx512f"))) void tile_avx512(ChainIndex kc, const double* a, ChainIndex lda,
                                                    const double* panel, double* c, ChainIndex ldc, int ncols,
                                                    bool from_c) {
  constexpr int nr = 32;
  __m512d acc[MR][4];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < 4; ++v)
      acc[r][v] = from_c ? _mm512_maskz_loadu_pd(lanes(ncols, v), c + r * ldc + 8 * v) : _mm512_setzero_pd();
  for (ChainIndex p = 0; p < kc; ++p) {
    const double* bp = panel + p * nr;
    const __m512d b0 = _mm512_load_pd(bp), b1 = _mm512_load_pd(bp + 8), b2 = _mm512_load_pd(bp + 16),
                  b3 = _mm512_load_pd(bp + 24);
    for (int r = 0; r < MR; ++r) {
      const __m512d x = _mm512_set1_pd(a[r * lda + p]);
      acc[r][0] = _mm512_fmadd_pd(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_pd(x, b1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_pd(x, b2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_pd(x, b3, acc[r][3]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < 4; ++v) _mm512_mask_storeu_pd(c + r * ldc + 8 * v, lanes(ncols, v), acc[r][v]);
}

// AVX2 + FMA: 3 rows x 4 vectors of 4, 12 accumulators, 3 broadcasts and one
// panel register of the 16.
template <int MR>
__attribute__((target("avx2,fma"))) void tile_avx2(ChainIndex kc, const double* a, ChainIndex lda,
                                                   const double* panel, double* c, ChainIndex ldc, int ncols,
                                                   bool from_c) {
  constexpr int nr = 16;
  alignas(32) double t[MR][nr];
  __m256d acc[MR][4];
  for (int r = 0; r < MR; ++r) {
    if (from_c) {
      for (int j = 0; j < nr; ++j) t[r][j] = j < ncols ? c[r * ldc + j] : 0.0;
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm256_load_pd(&t[r][4 * v]);
    } else {
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm256_setzero_pd();
    }
  }
  for (ChainIndex p = 0; p < kc; ++p) {
    const double* bp = panel + p * nr;
    __m256d x[MR];
    for (int r = 0; r < MR; ++r) x[r] = _mm256_broadcast_sd(a + r * lda + p);
    for (int v = 0; v < 4; ++v) {
      const __m256d b = _mm256_load_pd(bp + 4 * v);
      for (int r = 0; r < MR; ++r) acc[r][v] = _mm256_fmadd_pd(x[r], b, acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < 4; ++v) _mm256_store_pd(&t[r][4 * v], acc[r][v]);
    std::copy_n(t[r], ncols, c + r * ldc);
  }
}
#endif

constexpr Path kScalar{8, 4, {&tile_scalar<1>, &tile_scalar<2>, &tile_scalar<3>, &tile_scalar<4>}};
#if MLAGATE_CHAIN_X86
constexpr Path kAvx512{32, 6,
                       {&tile_avx512<1>, &tile_avx512<2>, &tile_avx512<3>, &tile_avx512<4>, &tile_avx512<5>,
                        &tile_avx512<6>}};
constexpr Path kAvx2{16, 3, {&tile_avx2<1>, &tile_avx2<2>, &tile_avx2<3>}};
#endif

const Path* path_of(ChainPath p) {
  switch (p) {
    case ChainPath::kScalar: return &kScalar;
#if MLAGATE_CHAIN_X86
    case ChainPath::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &kAvx2 : nullptr;
    case ChainPath::kAvx512: return __builtin_cpu_supports("avx512f") ? &kAvx512 : nullptr;
#else
    case ChainPath::kAvx2:
    case ChainPath::kAvx512: return nullptr;
#endif
    case ChainPath::kAuto: break;
  }
  static const Path* const best = [] {
    for (ChainPath q : {ChainPath::kAvx512, ChainPath::kAvx2})
      if (const Path* found = path_of(q)) return found;
    return &kScalar;
  }();
  return best;
}

// A thread's panel buffer, 64-byte aligned, kept between calls.
double* panel_buffer() {
  constexpr std::size_t size = kKc * kNc + 8;
  thread_local std::vector<double> buf(size);
  const auto addr = reinterpret_cast<std::uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / sizeof(double);
}

// b[k0 .. k0+kc)[j0 .. j0+nc) as panels [ceil(nc / nr)][kc][nr], columns past nc zero.
void pack(const double* b, ChainIndex ldb, ChainB layout, ChainIndex k0, ChainIndex kc, ChainIndex j0, ChainIndex nc,
          int nr, double* dst) {
  const ChainIndex panels = (nc + nr - 1) / nr;
  for (ChainIndex q = 0; q < panels; ++q) {
    double* panel = dst + q * kc * nr;
    const ChainIndex jq = j0 + q * nr, w = std::min<ChainIndex>(nr, j0 + nc - jq);
    for (ChainIndex p = 0; p < kc; ++p) {
      double* row = panel + p * nr;
      if (layout == ChainB::kRowMajor) {
        std::copy_n(b + (k0 + p) * ldb + jq, w, row);
      } else {
        // Written in order, read as w streams (one a column of the product):
        // the panel's rows stay in L1 while each column's run of depth is read once.
        const double* src = b + jq * ldb + k0 + p;
        for (ChainIndex j = 0; j < w; ++j) row[j] = src[j * ldb];
      }
      std::fill(row + w, row + nr, 0.0);
    }
  }
}

}  // namespace

bool chain_path_available(ChainPath path) { return path_of(path) != nullptr; }

namespace {

// The blocked product on one path, b packed a block at a time.
void run(const Path& pt, ChainIndex m, ChainIndex n, ChainIndex k, const double* a, ChainIndex lda, const double* b,
         ChainIndex ldb, ChainB layout, double* c, ChainIndex ldc, bool accumulate) {
  double* panels = panel_buffer();
  const int nr = pt.nr;
  for (ChainIndex j0 = 0; j0 < n; j0 += kNc) {
    const ChainIndex nc = std::min(kNc, n - j0);
    for (ChainIndex k0 = 0; k0 < k; k0 += kKc) {
      const ChainIndex kc = std::min(kKc, k - k0);
      const bool from_c = accumulate || k0 > 0;
      pack(b, ldb, layout, k0, kc, j0, nc, nr, panels);
      for (ChainIndex i0 = 0; i0 < m; i0 += kMc) {
        const ChainIndex mc = std::min(kMc, m - i0);
        for (ChainIndex q = 0; q * nr < nc; ++q) {
          const int w = static_cast<int>(std::min<ChainIndex>(nr, nc - q * nr));
          const double* panel = panels + q * kc * nr;
          for (ChainIndex i = i0; i < i0 + mc; i += pt.max_mr) {
            const int rows = static_cast<int>(std::min<ChainIndex>(pt.max_mr, i0 + mc - i));
            pt.tiles[static_cast<std::size_t>(rows - 1)](kc, a + i * lda + k0, lda, panel, c + i * ldc + j0 + q * nr,
                                                         ldc, w, from_c);
          }
        }
      }
    }
  }
}

// Rows of the product's transpose made per block when few rows of a meet
// many of a transposed b (Q K^T of a long request in chunks of 64 rows).
constexpr ChainIndex kSwapBlock = 256;

// c = a b^T as (b a^T)^T: each element is the same chain (an fma's product
// does not depend on its operands' order), but b's rows are read in place
// and only a is packed, where packing b (a transpose) cost about as much as
// the arithmetic of 64 rows. Made kSwapBlock rows of c^T at a time in a
// thread's buffer, then written to c transposed.
void run_swapped(const Path& pt, ChainIndex m, ChainIndex n, ChainIndex k, const double* a, ChainIndex lda,
                 const double* b, ChainIndex ldb, double* c, ChainIndex ldc, bool accumulate) {
  thread_local std::vector<double> buf;
  buf.resize(static_cast<std::size_t>(kSwapBlock * m));
  double* t = buf.data();
  for (ChainIndex j0 = 0; j0 < n; j0 += kSwapBlock) {
    const ChainIndex nb = std::min(kSwapBlock, n - j0);
    if (accumulate)
      for (ChainIndex i = 0; i < m; ++i)
        for (ChainIndex j = 0; j < nb; ++j) t[j * m + i] = c[i * ldc + j0 + j];
    run(pt, nb, m, k, b + j0 * ldb, ldb, a, lda, ChainB::kTransposed, t, m, accumulate);
    for (ChainIndex i = 0; i < m; ++i)
      for (ChainIndex j = 0; j < nb; ++j) c[i * ldc + j0 + j] = t[j * m + i];
  }
}

}  // namespace

bool chain_gemm_on(ChainPath path, ChainIndex m, ChainIndex n, ChainIndex k, const double* a, ChainIndex lda,
                   const double* b, ChainIndex ldb, ChainB layout, double* c, ChainIndex ldc, bool accumulate) {
  const Path* pt = path_of(path);
  if (pt == nullptr) return false;
  if (m <= 0 || n <= 0) return true;
  if (k <= 0) {
    if (!accumulate)
      for (ChainIndex i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0);
    return true;
  }
  if (layout == ChainB::kTransposed && m <= 128 && n >= 4 * m)
    run_swapped(*pt, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  else
    run(*pt, m, n, k, a, lda, b, ldb, layout, c, ldc, accumulate);
  return true;
}

void chain_gemm(ChainIndex m, ChainIndex n, ChainIndex k, const double* a, ChainIndex lda, const double* b,
                ChainIndex ldb, ChainB layout, double* c, ChainIndex ldc, bool accumulate) {
  chain_gemm_on(ChainPath::kAuto, m, n, k, a, lda, b, ldb, layout, c, ldc, accumulate);
}

void chain_gemm_scalar(ChainIndex m, ChainIndex n, ChainIndex k, const double* a, ChainIndex lda, const double* b,
                       ChainIndex ldb, ChainB layout, double* c, ChainIndex ldc, bool accumulate) {
  for (ChainIndex i = 0; i < m; ++i)
    for (ChainIndex j = 0; j < n; ++j) {
      double acc = accumulate ? c[i * ldc + j] : 0.0;
      for (ChainIndex p = 0; p < k; ++p) {
        const double bv = layout == ChainB::kRowMajor ? b[p * ldb + j] : b[j * ldb + p];
        acc = std::fma(a[i * lda + p], bv, acc);
      }
      c[i * ldc + j] = acc;
    }
}

}  // namespace mlagate::detail
