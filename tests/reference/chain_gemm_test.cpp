// The fp64 chain GEMM (reference/detail/chain_gemm.h) and what it gives the
// fp64 reference: every path (AVX-512, AVX2, scalar) the scalar chain's bits
// at remainders of every block, the chain continued across calls, and a
// reference whose bits depend neither on the blocking Eigen would choose for
// this CPU's caches nor on the machine (a case's bytes pinned); and the
// layer glue's absorbed queries and projected outputs pinned likewise (the
// row-wise GEMM's chains, reference/glue.cpp).
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cases/case.h"
#include "cases/suite.h"
#include "reference/detail/chain_gemm.h"
#include "reference/fp64_reference.h"
#include "reference/glue.h"

namespace mlagate {
namespace {

using detail::chain_gemm;
using detail::chain_gemm_scalar;
using detail::ChainB;
using detail::ChainIndex;
using detail::ChainPath;

// Deterministic values of mixed sign and magnitude (a counter hash; no libm).
std::vector<double> values(std::size_t n, std::uint64_t seed) {
  std::vector<double> v(n);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (double& x : v) {
    s ^= s >> 33, s *= 0xff51afd7ed558ccdull, s ^= s >> 29, s += 0x9E3779B97F4A7C15ull;
    x = (static_cast<double>(s >> 11) / 9007199254740992.0 - 0.5) * static_cast<double>(1 + (s & 7));
  }
  return v;
}

bool same_bytes(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

TEST(ChainGemm, EveryPathGivesTheScalarChainsBitsAtEveryBlockRemainder) {
  // Rows past tiles of 6 (and 3), columns past panels of 32 (16, 8) and
  // blocks of 512, depths past blocks of 256; both layouts of b, strides wider
  // than the rows, and accumulation into values already there. Every path
  // this CPU runs (an AVX-512 machine runs all three).
  int paths = 0;
  for (ChainPath path : {ChainPath::kAvx512, ChainPath::kAvx2, ChainPath::kScalar}) {
    if (!detail::chain_path_available(path)) continue;
    ++paths;
    for (ChainIndex m : {1, 5, 7, 13, 97, 100})
      for (ChainIndex n : {1, 31, 33, 77, 515})
        for (ChainIndex k : {0, 1, 255, 257, 600})
          for (ChainB layout : {ChainB::kRowMajor, ChainB::kTransposed})
            for (bool acc : {false, true}) {
              SCOPED_TRACE(::testing::Message() << "path " << static_cast<int>(path) << " m " << m << " n " << n
                                                << " k " << k << " transposed " << (layout == ChainB::kTransposed)
                                                << " accumulate " << acc);
              const ChainIndex lda = k + 3, ldb = (layout == ChainB::kRowMajor ? n : k) + 5, ldc = n + 2;
              const std::vector<double> a = values(static_cast<std::size_t>(m * lda), 1 + m);
              const std::vector<double> b =
                  values(static_cast<std::size_t>((layout == ChainB::kRowMajor ? k : n) * ldb + 1), 2 + n);
              std::vector<double> fast = values(static_cast<std::size_t>(m * ldc), 3 + k), slow = fast;
              ASSERT_TRUE(
                  detail::chain_gemm_on(path, m, n, k, a.data(), lda, b.data(), ldb, layout, fast.data(), ldc, acc));
              chain_gemm_scalar(m, n, k, a.data(), lda, b.data(), ldb, layout, slow.data(), ldc, acc);
              ASSERT_TRUE(same_bytes(fast, slow));  // the padding between rows untouched too
            }
  }
  EXPECT_GE(paths, 1);
  EXPECT_TRUE(detail::chain_path_available(ChainPath::kScalar));
}

TEST(ChainGemm, TwoCallsAccumulatingAreOneChainOverBothDepths) {
  const ChainIndex m = 11, n = 45, k1 = 300, k2 = 70, k = k1 + k2;
  const std::vector<double> a = values(static_cast<std::size_t>(m * k), 5), b = values(static_cast<std::size_t>(n * k), 6);
  std::vector<double> whole(static_cast<std::size_t>(m * n)), parts(whole.size());
  chain_gemm(m, n, k, a.data(), k, b.data(), k, ChainB::kTransposed, whole.data(), n);
  chain_gemm(m, n, k1, a.data(), k, b.data(), k, ChainB::kTransposed, parts.data(), n);
  chain_gemm(m, n, k2, a.data() + k1, k, b.data() + k1, k, ChainB::kTransposed, parts.data(), n, true);
  EXPECT_TRUE(same_bytes(whole, parts));
  // And the chain is an order: the terms summed another way (Eigen's
  // product here) differ somewhere in their last bits.
  std::vector<double> eigen(whole.size());
  using RowMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<RowMat>(eigen.data(), m, n) =
      Eigen::Map<const RowMat>(a.data(), m, k) * Eigen::Map<const RowMat>(b.data(), n, k).transpose();
  EXPECT_FALSE(same_bytes(whole, eigen));
}

TEST(ChainGemm, NanAndInfinityReachOnlyTheirRowsAndColumns) {
  const ChainIndex m = 7, n = 40, k = 300;
  std::vector<double> a = values(static_cast<std::size_t>(m * k), 7), b = values(static_cast<std::size_t>(k * n), 8);
  a[2 * k + 100] = std::numeric_limits<double>::quiet_NaN();
  b[5 * n + 33] = std::numeric_limits<double>::infinity();
  std::vector<double> c(static_cast<std::size_t>(m * n));
  chain_gemm(m, n, k, a.data(), k, b.data(), n, ChainB::kRowMajor, c.data(), n);
  for (ChainIndex i = 0; i < m; ++i)
    for (ChainIndex j = 0; j < n; ++j) {
      const double x = c[static_cast<std::size_t>(i * n + j)];
      if (i == 2) {
        EXPECT_TRUE(std::isnan(x)) << i << "," << j;
      } else if (j == 33) {
        EXPECT_TRUE(std::isinf(x) || std::isnan(x)) << i << "," << j;
      } else {
        EXPECT_TRUE(std::isfinite(x)) << i << "," << j;
      }
    }
}

CaseSpec inline_spec(std::vector<int> seq_lens, std::vector<int> query_lens) {
  CaseSpec s;
  s.suite = "test";
  s.batch.name = "inline";
  s.batch.seq_lens = std::move(seq_lens);
  s.batch.query_lens = std::move(query_lens);
  s.dims = dims_preset("deepseek");
  s.tp = 16;
  return s;
}

// 8 heads; the 3000-key request's depth in P V runs past any L1's
// GEMM block, and its rows past the 8-lane runs of the exponentials.
Case blocking_case() { return generate_case(inline_spec({300, 3000, 0, 64}, {1, 117, 1, 63})); }

std::uint64_t fnv1a(const std::vector<double>& v, std::uint64_t h = 1469598103934665603ull) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(double); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::uint64_t bytes_of(const ReferenceOutputs& g) { return fnv1a(g.lse, fnv1a(g.o_lat, fnv1a(g.out))); }

TEST(GoldenDeterminism, BitsDoNotDependOnTheCachesEigenWouldBlockFor) {
  // Eigen's GEMM sizes its depth blocks from the L1 it finds: with it, a
  // 32 KiB L1 (Zen 4, Skylake) gave other bits than a 48 KiB one (Zen 5,
  // Sapphire Rapids). These sizes are what it would find on such machines.
  const Case c = blocking_case();
  std::ptrdiff_t l1 = 0, l2 = 0, l3 = 0;
  Eigen::internal::manage_caching_sizes(Eigen::GetAction, &l1, &l2, &l3);
  const ReferenceOutputs a0 = reference_absorbed(c), m0 = reference_mha(c);
  using Sizes = std::array<std::ptrdiff_t, 3>;
  for (const Sizes& sizes : {Sizes{32 << 10, 1 << 20, 32 << 20}, Sizes{48 << 10, 2 << 20, 105 << 20},
                             Sizes{64 << 10, 512 << 10, 8 << 20}}) {
    Eigen::setCpuCacheSizes(sizes[0], sizes[1], sizes[2]);
    const ReferenceOutputs a = reference_absorbed(c), m = reference_mha(c);
    EXPECT_EQ(bytes_of(a), bytes_of(a0)) << "L1 " << sizes[0];
    EXPECT_EQ(bytes_of(m), bytes_of(m0)) << "L1 " << sizes[0];
  }
  Eigen::setCpuCacheSizes(l1, l2, l3);
}

TEST(GoldenDeterminism, ACasesBytesArePinnedOnEveryMachine) {
  // The same bits on any x86-64 with fma, whatever its vector width and
  // caches: CI and the GPU machine's host run this on other CPUs than the
  // one that pinned it. A new value here means every record's reference
  // changed; say why in the commit.
  const Case c = blocking_case();
  EXPECT_EQ(bytes_of(reference_absorbed(c)), 0xb541e1bec2f346e8ull);
  EXPECT_EQ(bytes_of(reference_mha(c)), 0x7b7259f51c7dc1d3ull);
}

std::uint64_t tensor_bytes(const Tensor& t) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(t.bytes());
  for (std::size_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// absorb_queries, then project_latent_output of those rows taken as a
// latent output (any bf16 [T, N, L] will do): the bytes of both.
std::pair<std::uint64_t, std::uint64_t> glue_bytes(const Case& c) {
  std::vector<int> tokens(static_cast<std::size_t>(c.num_tokens));
  for (int t = 0; t < c.num_tokens; ++t) tokens[static_cast<std::size_t>(t)] = t;
  Tensor ql, qp;
  absorb_queries(c, tokens, ql, qp);
  Tensor out = Tensor::for_overwrite(c.spec.dtype, {c.num_tokens, c.spec.num_heads(), c.spec.dims.v_head_dim});
  project_latent_output(c, ql.view(), tokens, out);
  return {tensor_bytes(ql), tensor_bytes(out)};
}

TEST(GlueDeterminism, AbsorbedQueriesAndProjectedOutputsArePinnedOnEveryMachine) {
  // With Eigen's fp32 products an AVX2 build's absorbed queries differed from
  // an AVX-512 one's in 11 of the vllm and sparse suites' 100 input sets, and
  // a single token took Eigen's matrix-vector kernel, another order again.
  // Many tokens, then one (vllm's single_decode at TP 1: the input set
  // whose queries Eigen's AVX-512 build absorbed otherwise than the chain):
  const auto many = glue_bytes(blocking_case());
  EXPECT_EQ(many.first, 0xdf5b72d87eed857aull);
  EXPECT_EQ(many.second, 0x8ab91352893be6afull);
  const Suite vllm = load_suite("vllm");
  const auto spec = std::find_if(vllm.cases.begin(), vllm.cases.end(), [](const CaseSpec& x) {
    return x.id() == "vllm/single_decode/tp1/bf16/kv=auto/bs=auto/seed=0";
  });
  ASSERT_NE(spec, vllm.cases.end());
  const auto one = glue_bytes(generate_case(*spec));
  EXPECT_EQ(one.first, 0xc59a8e9074aa9fa4ull);
  EXPECT_EQ(one.second, 0xc1e7d96346e0b3f9ull);
}

}  // namespace
}  // namespace mlagate
