// An fp64 GEMM whose every element has the same bits on any machine, however
// it is blocked, threaded or vectorized: c[i][j] starts at +0 and takes one
// fused multiply-add per term, a[i][0] * b[0][j] first, in order of the depth
// index (a chain; DESIGN.md, Reference). The fp64 reference computes in it.
//
// Eigen's GEMM, which the reference used before, cannot promise that: it
// splits the depth into blocks whose size it derives from the CPU's L1 data
// cache and vector width, and adds the blocks' partial sums. So a reference
// made on a CPU with a 32 KiB L1 (Zen 4, Skylake) differed in its last bits
// from one made on a 48 KiB L1 (Zen 5, Sapphire Rapids), and an AVX2 build
// from an AVX-512 one (tests/reference/chain_gemm_test.cpp shows it).
//
// Blocking the depth keeps the chain here: a block starts from the element's
// value after the block before (fp64 stored and loaded exactly), never from
// zero. The AVX-512, AVX2+FMA and scalar (std::fma) paths compute the same
// chain, so they give the same bits; the vector ones are for speed, taken
// where the CPU has them (whatever -march the build had).
#pragma once

#include <cstdint>

namespace mlagate::detail {

using ChainIndex = std::int64_t;

// How b is laid out: kRowMajor, b[p][j] at b[p * ldb + j] (depth rows);
// kTransposed, b[p][j] at b[j * ldb + p] (a row per column of the product,
// as keys are for Q K^T).
enum class ChainB { kRowMajor, kTransposed };

// c[i][j] (row stride ldc), for i < m, j < n: the chain over p < k of
// a[i * lda + p] * b[p][j]. With `accumulate`, each chain starts from c[i][j]
// instead of +0: two calls over depths k1 then k2 give the bits of one chain
// over the depths concatenated. Single-threaded (callers parallelize over
// independent products); c must not overlap a or b.
void chain_gemm(ChainIndex m, ChainIndex n, ChainIndex k, const double* a, ChainIndex lda, const double* b,
                ChainIndex ldb, ChainB layout, double* c, ChainIndex ldc, bool accumulate = false);

// The kernels: kAuto is the fastest this CPU runs (what chain_gemm takes).
enum class ChainPath { kAuto, kAvx512, kAvx2, kScalar };

// Whether this CPU (and build) runs `path`.
bool chain_path_available(ChainPath path);

// chain_gemm on one path; false (and c untouched) where it is not available.
// For tests: every path gives the same bits.
bool chain_gemm_on(ChainPath path, ChainIndex m, ChainIndex n, ChainIndex k, const double* a, ChainIndex lda,
                   const double* b, ChainIndex ldb, ChainB layout, double* c, ChainIndex ldc, bool accumulate = false);

// The scalar chain, element by element: the definition the fast paths are
// tested against.
void chain_gemm_scalar(ChainIndex m, ChainIndex n, ChainIndex k, const double* a, ChainIndex lda, const double* b,
                       ChainIndex ldb, ChainB layout, double* c, ChainIndex ldc, bool accumulate = false);

}  // namespace mlagate::detail
