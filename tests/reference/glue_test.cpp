// The layer glue's up-projection: the row-wise GEMM gives every element the
// bits of a plain fma chain whatever the blocking, so rows can be shared
// between the glue, the baseline emulation and the kernel-level prefill op
// (KvProjection); rows whose latent differs from the case's own are
// projected afresh, never copied.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "cases/case.h"
#include "cases/encoding.h"
#include "cases/suite.h"
#include "reference/detail/rowwise_gemm.h"
#include "reference/glue.h"
#include "reference/kv_projection.h"
#include "reference/sdpa_emulation.h"

namespace mlagate {
namespace {

using detail::GemmIndex;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// out = a x b through rowwise_gemm, rows [first, first + n) only (others untouched).
std::vector<float> gemm_rows(const std::vector<float>& a, GemmIndex depth, const detail::PackedPanels& b,
                             GemmIndex first, GemmIndex n, GemmIndex rows) {
  std::vector<float> out(static_cast<std::size_t>(rows * b.cols()), -1.f);
  detail::rowwise_gemm(a.data() + first * depth, n, depth, b,
                       [&](GemmIndex r0, GemmIndex nr, GemmIndex c0, GemmIndex nc, const float* tile) {
                         for (GemmIndex i = 0; i < nr; ++i)
                           for (GemmIndex j = 0; j < nc; ++j)
                             out[static_cast<std::size_t>((first + r0 + i) * b.cols() + c0 + j)] =
                                 tile[i * detail::kPanelCols + j];
                       });
  return out;
}

TEST(RowwiseGemm, EveryElementIsTheFmaChainWhateverRowsComeWithIt) {
  // Sizes off every block: 203 rows (96-row blocks, 6-row tiles), 77 columns
  // (64-column panels), depth 131; values spread over many binades so that
  // any other summation order shows in the last bit.
  const GemmIndex rows = 203, depth = 131, cols = 77;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> a(static_cast<std::size_t>(rows * depth)), b(static_cast<std::size_t>(depth * cols));
  for (float& x : a) x = nd(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 16) - 8));
  for (float& x : b) x = nd(rng);
  const detail::PackedPanels packed(depth, cols, [&](GemmIndex k, float* dst) {
    std::copy_n(b.data() + k * cols, cols, dst);
  });
  const std::vector<float> whole = gemm_rows(a, depth, packed, 0, rows, rows);
  int differ_from_plain_sum = 0;
  for (GemmIndex r = 0; r < rows; ++r)
    for (GemmIndex c = 0; c < cols; ++c) {
      float chain = 0.f, plain = 0.f;
      for (GemmIndex k = 0; k < depth; ++k) {
        chain = std::fma(a[static_cast<std::size_t>(r * depth + k)], b[static_cast<std::size_t>(k * cols + c)], chain);
        plain += a[static_cast<std::size_t>(r * depth + k)] * b[static_cast<std::size_t>(k * cols + c)];
      }
      ASSERT_EQ(std::bit_cast<std::uint32_t>(whole[static_cast<std::size_t>(r * cols + c)]),
                std::bit_cast<std::uint32_t>(chain))
          << "row " << r << " column " << c;
      differ_from_plain_sum += chain != plain;
    }
  // The chain is a definite order, not any order: unfused sums differ somewhere.
  EXPECT_GT(differ_from_plain_sum, 0);
  // Each row alone, and odd runs starting anywhere: the same bits.
  for (GemmIndex first : {0, 1, 5, 95, 96, 97, 200})
    for (GemmIndex n : {1, 2, 3, 7})
      if (first + n <= rows) {
        const std::vector<float> part = gemm_rows(a, depth, packed, first, n, rows);
        for (GemmIndex r = first; r < first + n; ++r)
          ASSERT_EQ(0, std::memcmp(part.data() + r * cols, whole.data() + r * cols, cols * sizeof(float)))
              << "rows [" << first << ", " << first + n << ") row " << r;
      }
}

// Every element of rowwise_gemm(a, b) against its plain fma chain, bit for bit.
void expect_fma_chain_bits(const std::vector<float>& a, const std::vector<float>& b, GemmIndex rows, GemmIndex depth,
                           GemmIndex cols, const detail::PackedPanels& packed, const char* what) {
  const std::vector<float> got = gemm_rows(a, depth, packed, 0, rows, rows);
  for (GemmIndex r = 0; r < rows; ++r)
    for (GemmIndex c = 0; c < cols; ++c) {
      float chain = 0.f;
      for (GemmIndex k = 0; k < depth; ++k)
        chain = std::fma(a[static_cast<std::size_t>(r * depth + k)], b[static_cast<std::size_t>(k * cols + c)], chain);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got[static_cast<std::size_t>(r * cols + c)]),
                std::bit_cast<std::uint32_t>(chain))
          << what << ": row " << r << " column " << c;
    }
}

float to_bf16_value(float x) { return bf16_to_f32(f32_to_bf16(x)); }  // rounded to bf16, as a float

// bf16 operands over the whole range the pair path takes (2^-50 to 2^40),
// with zeros and rows that cancel exactly: on an AVX512_BF16 build they take
// VDPBF16PS, elsewhere the fma path; the bits are the chain's either way.
TEST(RowwiseGemm, Bf16OperandsGiveTheFmaChainsBits) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  for (const GemmIndex depth : {GemmIndex{512}, GemmIndex{130}}) {
    const GemmIndex rows = 203, cols = 77;
    std::vector<float> a(static_cast<std::size_t>(rows * depth)), b(static_cast<std::size_t>(depth * cols));
    const auto spread = [&](int lo, int hi) {
      const float x = to_bf16_value(std::ldexp(nd(rng), lo + static_cast<int>(rng() % static_cast<unsigned>(hi - lo))));
      return detail::bf16_pair_safe(x) ? x : 0.f;
    };
    for (float& x : a) x = spread(-48, 20);
    for (float& x : b) x = spread(-48, 18);
    for (std::size_t i = 0; i < a.size(); i += 17) a[i] = 0.f;
    for (std::size_t i = 0; i < b.size(); i += 23) b[i] = -0.f;
    // Row 3: x, -x, y, -y, ... (sums that return to zero on the way).
    for (GemmIndex k = 0; k + 1 < depth; k += 2) a[static_cast<std::size_t>(3 * depth + k + 1)] = -a[static_cast<std::size_t>(3 * depth + k)];
    const auto row = [&](GemmIndex k, float* dst) { std::copy_n(b.data() + k * cols, cols, dst); };
    // Pairs allowed whatever this machine's choice, so that an AVX512_BF16
    // build runs VDPBF16PS here; and the fma path on the same operands.
    const detail::PackedPanels packed(depth, cols, row, true), fma_only(depth, cols, row, false);
    EXPECT_EQ(packed.has_pairs(), detail::kBf16PairPath);
    EXPECT_FALSE(fma_only.has_pairs());
    expect_fma_chain_bits(a, b, rows, depth, cols, packed, "bf16 operands");
    expect_fma_chain_bits(a, b, rows, depth, cols, fma_only, "bf16 operands, fma path");
  }
}

// MLAGATE_ROWWISE_PATH's values, and the process's choice where the pair
// path is not compiled (then never pairs; where it is, either choice gives
// the bits above, so no test can tell them apart but a timed one).
TEST(RowwiseGemm, ThePathVariableTakesPairsOrFma) {
  EXPECT_EQ(detail::rowwise_pairs_of("pairs"), std::optional<bool>(true));
  EXPECT_EQ(detail::rowwise_pairs_of("fma"), std::optional<bool>(false));
  EXPECT_EQ(detail::rowwise_pairs_of(nullptr), std::nullopt);
  EXPECT_EQ(detail::rowwise_pairs_of(""), std::nullopt);
  EXPECT_EQ(detail::rowwise_pairs_of("Pairs"), std::nullopt);
  EXPECT_EQ(detail::rowwise_pairs_of("fma "), std::nullopt);
  if (!detail::kBf16PairPath) {
    EXPECT_FALSE(detail::pair_path_preferred());
  }
  // The default packing follows the choice where b allows pairs, and packs
  // none where it does not (a value that is not bf16).
  const detail::PackedPanels p(4, 3, [](GemmIndex, float* dst) { std::fill_n(dst, 3, 1.f); });
  EXPECT_EQ(p.has_pairs(), detail::pair_path_preferred());
  const detail::PackedPanels q(4, 3, [](GemmIndex, float* dst) { std::fill_n(dst, 3, 1.f + 1.f / 1024); });
  EXPECT_FALSE(q.has_pairs());
}

// The guard's bounds, exactly where the header puts them.
TEST(RowwiseGemm, TheGuardAcceptsExactlyTheSafeRange) {
  using detail::bf16_pair_safe;
  EXPECT_TRUE(bf16_pair_safe(0.f));
  EXPECT_TRUE(bf16_pair_safe(-0.f));
  EXPECT_TRUE(bf16_pair_safe(std::ldexp(1.f, -50)));
  EXPECT_TRUE(bf16_pair_safe(-std::ldexp(1.f, -50)));
  EXPECT_FALSE(bf16_pair_safe(std::ldexp(1.f, -51)));
  EXPECT_FALSE(bf16_pair_safe(std::ldexp(1.9921875f, -51)));  // the largest bf16 below 2^-50
  EXPECT_TRUE(bf16_pair_safe(std::ldexp(1.9921875f, 40)));    // the largest bf16 below 2^41
  EXPECT_FALSE(bf16_pair_safe(std::ldexp(1.f, 41)));
  EXPECT_FALSE(bf16_pair_safe(std::numeric_limits<float>::infinity()));
  EXPECT_FALSE(bf16_pair_safe(std::numeric_limits<float>::quiet_NaN()));
  EXPECT_FALSE(bf16_pair_safe(std::ldexp(1.f, -130)));        // a bf16 denormal
  EXPECT_FALSE(bf16_pair_safe(1.f + std::ldexp(1.f, -10)));   // not a bf16 value
  EXPECT_TRUE(bf16_pair_safe(1.f + std::ldexp(1.f, -7)));     // 8 significant bits: a bf16 value
}

// Operands on which VDPBF16PS would give other bits (denormals read as zero or
// flushed, values that are not bf16) take the fma path; a test that would fail
// on an AVX512_BF16 build if they took the pair path.
TEST(RowwiseGemm, OperandsThePairPathWouldChangeTakeTheFmaPath) {
  const GemmIndex rows = 100, depth = 64, cols = 70;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> a(static_cast<std::size_t>(rows * depth)), b(static_cast<std::size_t>(depth * cols));
  for (float& x : a) x = to_bf16_value(nd(rng));
  for (float& x : b) x = to_bf16_value(nd(rng));
  const auto pack = [&](const std::vector<float>& w, GemmIndex d) {
    return detail::PackedPanels(d, cols, [&](GemmIndex k, float* dst) { std::copy_n(w.data() + k * cols, cols, dst); },
                                true);  // pairs wherever compiled, whatever this machine's choice
  };
  {  // a bf16 denormal in a (read as zero by the instruction): 2^-130 x 2^40 is 2^-90
    std::vector<float> a2 = a, b2 = b;
    std::fill_n(a2.begin() + 10 * depth, depth, 0.f);
    a2[static_cast<std::size_t>(10 * depth + 4)] = std::ldexp(1.f, -130);
    for (GemmIndex c = 0; c < cols; ++c) b2[static_cast<std::size_t>(4 * cols + c)] = std::ldexp(1.f, 40);
    const auto packed = pack(b2, depth);
    EXPECT_EQ(packed.has_pairs(), detail::kBf16PairPath);  // b is safe: the rows decide
    expect_fma_chain_bits(a2, b2, rows, depth, cols, packed, "denormal in a");
  }
  {  // normal operands whose product is an fp32 denormal (flushed by the instruction)
    std::vector<float> a2 = a, b2 = b;
    std::fill_n(a2.begin() + 97 * depth, depth, 0.f);
    a2[static_cast<std::size_t>(97 * depth + 9)] = std::ldexp(1.f, -100);
    for (GemmIndex c = 0; c < cols; ++c) b2[static_cast<std::size_t>(9 * cols + c)] = std::ldexp(1.f, -30);
    const auto packed = pack(b2, depth);
    EXPECT_EQ(packed.has_pairs(), detail::kBf16PairPath);
    expect_fma_chain_bits(a2, b2, rows, depth, cols, packed, "denormal product");
    // The same product from b's side: b has no pairs.
    std::vector<float> a3 = a, b3 = b;
    for (GemmIndex c = 0; c < cols; ++c) b3[static_cast<std::size_t>(9 * cols + c)] = std::ldexp(1.f, -100);
    std::fill_n(a3.begin() + 97 * depth, depth, 0.f);
    a3[static_cast<std::size_t>(97 * depth + 9)] = std::ldexp(1.f, -30);
    const auto packed3 = pack(b3, depth);
    EXPECT_FALSE(packed3.has_pairs());
    expect_fma_chain_bits(a3, b3, rows, depth, cols, packed3, "denormal product, small b");
  }
  {  // a value that is not bf16 (an fp16 model's): the instruction would drop its low bits
    std::vector<float> a2 = a;
    a2[static_cast<std::size_t>(50 * depth + 1)] = 1.f + std::ldexp(1.f, -10);
    expect_fma_chain_bits(a2, b, rows, depth, cols, pack(b, depth), "non-bf16 value in a");
  }
  {  // the same in b: no pairs at all
    std::vector<float> b2 = b;
    b2[static_cast<std::size_t>(3 * cols + 2)] = 1.f + std::ldexp(1.f, -10);
    const auto packed = pack(b2, depth);
    EXPECT_FALSE(packed.has_pairs());
    expect_fma_chain_bits(a, b2, rows, depth, cols, packed, "non-bf16 value in b");
  }
  {  // an odd depth: no pairs
    const GemmIndex odd = depth - 1;
    std::vector<float> a2(static_cast<std::size_t>(rows * odd));
    for (GemmIndex r = 0; r < rows; ++r) std::copy_n(a.begin() + r * depth, odd, a2.begin() + r * odd);
    const auto packed = pack(b, odd);
    EXPECT_FALSE(packed.has_pairs());
    expect_fma_chain_bits(a2, b, rows, odd, cols, packed, "odd depth");
  }
}

// The smoke suite's mixed_small cases (bf16 at TP 16, fp16 at TP 8) on the given cache dtype.
std::vector<Case> mixed_cases(KvCacheDtype kv) {
  std::vector<Case> out;
  for (CaseSpec s : load_suite("smoke").cases)
    if (s.batch.name == "mixed_small") {
      s.kv_cache_dtype = kv;
      s.validate();
      out.push_back(generate_case(s));
    }
  if (out.size() < 2) throw std::runtime_error("smoke has no bf16 and fp16 mixed_small cases");
  return out;
}

std::vector<int> all_requests(const Case& c) {
  std::vector<int> r(static_cast<std::size_t>(c.num_requests));
  std::iota(r.begin(), r.end(), 0);
  return r;
}

TEST(KvProjection, RequestsProjectedAloneEqualTheWholeUpProjection) {
  for (KvCacheDtype kv : {KvCacheDtype::kAuto, KvCacheDtype::kFp8})
    for (const Case& c : mixed_cases(kv)) {
      SCOPED_TRACE(c.spec.id());
    KvProjection whole(c);
    whole.ensure(all_requests(c));
    Tensor k, v;
    up_project_kv(c, whole.kv().view(), whole.pe().view(), k, v);
    EXPECT_TRUE(same_bits(whole.k_all(), k));
    EXPECT_TRUE(same_bits(whole.v_all(), v));
    // Request by request, in reverse, on other thread counts: the same rows.
    KvProjection parts(c);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    for (int i = c.num_requests - 1; i >= 0; --i) parts.ensure(std::vector<int>{i});
    omp_set_num_threads(threads);
    EXPECT_TRUE(same_bits(parts.k_all(), k));
    EXPECT_TRUE(same_bits(parts.v_all(), v));
    }
}

TEST(KvProjection, RowsOfADifferentLatentAreProjectedNotCopied) {
  const Case c = mixed_cases(KvCacheDtype::kAuto).front();
  KvProjection known(c);
  known.ensure(all_requests(c));
  // The rows of request 1 then request 0, one latent value changed (a cache
  // writer's damage): that row must come out as its own projection.
  std::vector<std::int64_t> rows;
  for (int i : {1, 0})
    for (int p = 0; p < c.seq_lens[i]; ++p) rows.push_back(std::int64_t{c.kv_start_loc[i]} + p);
  const std::int64_t L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim;
  Tensor kv(c.spec.dtype, {static_cast<std::int64_t>(rows.size()), L});
  Tensor pe(c.spec.dtype, {static_cast<std::int64_t>(rows.size()), R});
  for (std::size_t j = 0; j < rows.size(); ++j) {
    std::memcpy(kv.bytes() + j * L * 2, c.kv_c.bytes() + rows[j] * L * 2, L * 2);
    std::memcpy(pe.bytes() + j * R * 2, c.k_pe.bytes() + rows[j] * R * 2, R * 2);
  }
  const std::size_t damaged = 3;
  kv.data<std::uint16_t>()[damaged * L + 5] ^= 0x0100;
  Tensor k_ref, v_ref, k, v;
  up_project_kv(c, kv.view(), pe.view(), k_ref, v_ref);
  up_project_kv_known(c, kv.view(), pe.view(), rows, known, k, v);
  EXPECT_TRUE(same_bits(k, k_ref));
  EXPECT_TRUE(same_bits(v, v_ref));
  // And the damaged row differs from the known row it claims to be.
  const std::int64_t N = c.spec.num_heads(), P = c.spec.dims.nope_dim, V = c.spec.dims.v_head_dim;
  EXPECT_NE(0, std::memcmp(k.bytes() + damaged * N * (P + R) * 2, known.k_row(rows[damaged]),
                           N * (P + R) * 2));
  EXPECT_NE(0, std::memcmp(v.bytes() + damaged * N * V * 2, known.v_row(rows[damaged]), N * V * 2));
  // Without the projected request the rows are projected too (same bits).
  KvProjection none(c);
  up_project_kv_known(c, kv.view(), pe.view(), rows, none, k, v);
  EXPECT_TRUE(same_bits(k, k_ref));
}

TEST(KvProjection, OfferedRowsAreHeldUntilWithdrawn) {
  // The glue projects a backend's rows first and offers them: the projection
  // holds them without projecting again; rows of another latent are refused;
  // once the backend wrote into them they are withdrawn and projected afresh.
  const Case c = mixed_cases(KvCacheDtype::kAuto).front();
  KvProjection reference(c);
  const std::vector<int> all = all_requests(c);
  reference.ensure(all);
  const int i = 1;
  std::vector<std::int64_t> rows;
  for (int p = 0; p < c.seq_lens[i]; ++p) rows.push_back(std::int64_t{c.kv_start_loc[i]} + p);
  const std::int64_t L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim;
  const TensorView kv{c.spec.dtype, {static_cast<std::int64_t>(rows.size()), L},
                      const_cast<std::byte*>(c.kv_c.bytes()) + rows[0] * L * 2};
  const TensorView pe{c.spec.dtype, {static_cast<std::int64_t>(rows.size()), R},
                      const_cast<std::byte*>(c.k_pe.bytes()) + rows[0] * R * 2};
  auto k = std::make_shared<Tensor>(), v = std::make_shared<Tensor>();
  up_project_kv(c, kv, pe, *k, *v);
  KvProjection shared(c);
  // Claimed as other rows (whose latent differs): nothing taken.
  std::vector<std::int64_t> wrong(rows.size());
  std::iota(wrong.begin(), wrong.end(), std::int64_t{c.kv_start_loc[0]});
  EXPECT_EQ(0u, shared.offer(kv, pe, wrong, k, v));
  EXPECT_EQ(rows.size(), shared.offer(kv, pe, rows, k, v));
  EXPECT_TRUE(shared.has(i));
  EXPECT_EQ(shared.k_row(rows[0]), k->data<std::uint16_t>());  // held, not copied
  shared.ensure(all);
  EXPECT_TRUE(same_bits(shared.k_all(), reference.k_all()));
  EXPECT_TRUE(same_bits(shared.v_all(), reference.v_all()));
  // A backend wrote into the lent keys: withdrawn, and the emulation gets fresh rows.
  KvProjection again(c);
  again.offer(kv, pe, rows, k, v);
  k->data<std::uint16_t>()[7] ^= 0x0040;
  again.withdraw(k.get());
  EXPECT_FALSE(again.has(i));
  again.ensure(all);
  EXPECT_TRUE(same_bits(again.k_all(), reference.k_all()));
}

TEST(KvProjection, TheEmulationGivesTheSameBitsWithASharedProjection) {
  const Case c = mixed_cases(KvCacheDtype::kFp8).front();
  const std::vector<int> req = all_requests(c);
  const SdpaResult own = emulate_sdpa_layer(c, SdpaForm::kPrefill, req);
  KvProjection shared(c);
  shared.ensure(req);
  const SdpaResult with = emulate_sdpa_layer(c, SdpaForm::kPrefill, req, &shared);
  EXPECT_TRUE(same_bits(own.out, with.out));
  EXPECT_TRUE(same_bits(own.lse, with.lse));
  // A shared projection lacking the requests is a caller's error, not garbage.
  KvProjection empty(c);
  EXPECT_THROW(emulate_sdpa_layer(c, SdpaForm::kPrefill, req, &empty), std::logic_error);
}

TEST(GenerateCase, KeptTensorsAreTheTensorsDrawnAfresh) {
  // A case drawn twice (the second takes its weights and latent rows from
  // the kept ones) and a case of other heads in between: the same bits. The
  // committed golden files pin the values themselves (H5Regression).
  CaseSpec a = load_suite("smoke").cases.front(), b = a;
  b.tp = a.tp == 1 ? 2 : 1;
  b.validate();
  const Case first = generate_case(a);
  const Case other = generate_case(b);
  const Case again = generate_case(a);
  EXPECT_TRUE(same_bits(first.w_uk, again.w_uk));
  EXPECT_TRUE(same_bits(first.w_uv, again.w_uv));
  EXPECT_FALSE(same_bits(first.w_uk, other.w_uk));
  EXPECT_TRUE(same_bits(first.q, again.q));
  // The latent rows do not depend on the heads: kept across TP degrees.
  EXPECT_TRUE(same_bits(first.kv_c, other.kv_c));
  EXPECT_TRUE(same_bits(first.kv_c, again.kv_c));
  EXPECT_TRUE(same_bits(first.k_pe, again.k_pe));
}

}  // namespace
}  // namespace mlagate
