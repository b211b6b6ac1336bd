// Tests for cases/case: generate_case lays out the inputs of SPEC: Inputs,
// each element is the generator's normal scaled and rounded, the bits are
// pinned, and the data does not depend on thread count or case order.
#include "cases/case.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cases/encoding.h"
#include "cases/errors.h"
#include "cases/generator.h"
#include "cases/suite.h"

namespace mlagate {
namespace {

CaseSpec spec_of(const std::string& batch, int tp, std::uint64_t seed = 0) {
  CaseSpec s;
  s.batch = find_batch_spec(batch);
  s.tp = tp;
  s.seed = seed;
  return s;
}

std::uint16_t raw16(const Tensor& t, std::int64_t i) {
  std::uint16_t v;
  std::memcpy(&v, t.bytes() + 2 * i, 2);
  return v;
}

std::uint64_t fnv1a(const Tensor& t) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  const auto* b = reinterpret_cast<const unsigned char*>(t.bytes());
  for (std::size_t i = 0; i < t.nbytes(); ++i) h = (h ^ b[i]) * 0x100000001B3ull;
  return h;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

void expect_identical(const Case& a, const Case& b) {
  EXPECT_TRUE(same_bytes(a.q, b.q));
  EXPECT_TRUE(same_bytes(a.kv_c, b.kv_c));
  EXPECT_TRUE(same_bytes(a.k_pe, b.k_pe));
  EXPECT_TRUE(same_bytes(a.w_uk, b.w_uk));
  EXPECT_TRUE(same_bytes(a.w_uv, b.w_uv));
}

TEST(GenerateCase, LayoutAndOffsets) {
  const Case c = generate_case(spec_of("mixed_small", 16));  // s {32,40,48,56}, q {1,1,5,5}
  EXPECT_EQ(c.num_requests, 4);
  EXPECT_EQ(c.num_tokens, 12);
  EXPECT_EQ(c.num_kv_tokens, 176);
  EXPECT_EQ(c.seq_lens, (std::vector<std::int32_t>{32, 40, 48, 56}));
  EXPECT_EQ(c.query_lens, (std::vector<std::int32_t>{1, 1, 5, 5}));
  EXPECT_EQ(c.context_lens, (std::vector<std::int32_t>{31, 39, 43, 51}));
  EXPECT_EQ(c.query_start_loc, (std::vector<std::int32_t>{0, 1, 2, 7, 12}));
  EXPECT_EQ(c.kv_start_loc, (std::vector<std::int32_t>{0, 32, 72, 120, 176}));
  // [T, N, P+R], [S, L], [S, R], [L, N, P], [L, N, V] with N = 128 / 16.
  EXPECT_EQ(c.q.shape(), (Shape{12, 8, 192}));
  EXPECT_EQ(c.kv_c.shape(), (Shape{176, 512}));
  EXPECT_EQ(c.k_pe.shape(), (Shape{176, 64}));
  EXPECT_EQ(c.w_uk.shape(), (Shape{512, 8, 128}));
  EXPECT_EQ(c.w_uv.shape(), (Shape{512, 8, 128}));
  for (const Tensor* t : {&c.q, &c.kv_c, &c.k_pe, &c.w_uk, &c.w_uv}) EXPECT_EQ(t->dtype(), DType::kBF16);

  CaseSpec glm = spec_of("small_prefill", 8);
  glm.dims = dims_preset("glm");
  glm.dtype = DType::kF16;
  const Case g = generate_case(glm);
  EXPECT_EQ(g.q.shape(), (Shape{16, 16, 256}));
  EXPECT_EQ(g.w_uk.shape(), (Shape{512, 16, 192}));
  EXPECT_EQ(g.w_uv.shape(), (Shape{512, 16, 256}));
  EXPECT_EQ(g.q.dtype(), DType::kF16);
}

TEST(GenerateCase, PaddingRequestHasNoKvRows) {
  const Case c = generate_case(spec_of("edge_padding", 16));  // s {32,0,40,0}, q 1 each
  EXPECT_EQ(c.kv_start_loc, (std::vector<std::int32_t>{0, 32, 32, 72, 72}));
  EXPECT_EQ(c.query_start_loc, (std::vector<std::int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(c.context_lens, (std::vector<std::int32_t>{31, -1, 39, -1}));  // s - q, as documented
  EXPECT_EQ(c.kv_c.dim(0), 72);
}

// Every element is round(normal(seed, key(name), flat index) * factor): q scaled
// by q_magnitude, weights by 1/sqrt(L), caches unscaled (SPEC: Inputs).
TEST(GenerateCase, ElementsAreScaledRoundedNormals) {
  for (DType dt : model_dtypes()) {
    CaseSpec s = spec_of("small_decode", 16, 5);
    s.dtype = dt;
    s.q_magnitude = 8;
    const Case c = generate_case(s);
    const double w = 1.0 / std::sqrt(512.0);
    struct Check {
      const Tensor* t;
      const char* name;
      double factor;
    };
    for (const Check& k : {Check{&c.q, "q", 8.0}, Check{&c.kv_c, "kv_c", 1.0}, Check{&c.k_pe, "k_pe", 1.0},
                           Check{&c.w_uk, "w_uk", w}, Check{&c.w_uv, "w_uv", w}}) {
      const std::uint64_t key = gen::tensor_key(k.name);
      for (std::int64_t i = 0; i < k.t->numel(); ++i) {
        const float v = static_cast<float>(gen::normal(5, key, static_cast<std::uint64_t>(i)) * k.factor);
        const std::uint16_t want = dt == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
        ASSERT_EQ(raw16(*k.t, i), want) << k.name << "[" << i << "] " << dtype_short(dt);
      }
    }
  }
}

// Pinned raw 16-bit inputs of two cases. Changing them requires bumping
// gen::kGeneratorVersion (the golden files depend on every one of these bits).
TEST(GenerateCase, PinnedBits) {
  ASSERT_EQ(gen::kGeneratorVersion, 2) << "generator version bumped: re-pin the values below";
  const Case a = generate_case(spec_of("small_decode", 16, 7));
  EXPECT_EQ(raw16(a.q, 0), 0x3D49);
  EXPECT_EQ(raw16(a.q, 1), 0x3FC0);
  EXPECT_EQ(raw16(a.kv_c, 12345), 0xBDEE);
  EXPECT_EQ(raw16(a.k_pe, 100), 0xBDB3);
  EXPECT_EQ(raw16(a.w_uk, 7), 0xBDE3);
  EXPECT_EQ(raw16(a.w_uv, 65535), 0xBC33);

  CaseSpec s = spec_of("small_decode", 16, 1);
  s.dtype = DType::kF16;
  s.q_magnitude = 8;
  const Case b = generate_case(s);
  EXPECT_EQ(raw16(b.q, 0), 0xBE80);
  EXPECT_EQ(raw16(b.q, 1), 0x4818);
  EXPECT_EQ(raw16(b.kv_c, 12345), 0x393C);
  EXPECT_EQ(raw16(b.k_pe, 100), 0x3BD5);
  EXPECT_EQ(raw16(b.w_uk, 7), 0x29E7);
  EXPECT_EQ(raw16(b.w_uv, 65535), 0xA9FB);

  // Digests (FNV-1a 64 of the bytes) of every tensor, seed 7, both dtypes.
  const std::uint64_t digests[2][5] = {
      {0xC6A2598B0C26F826ull, 0x6B24AAECA3F3A97Cull, 0xC29C66960E03EB93ull, 0x38EF38E5B9A26273ull, 0xB89679A0F760C945ull},
      {0xBEC8863E1D444E2Dull, 0x4F11FDF33ABCCFD3ull, 0xDC98A697414DB130ull, 0x346A5755CCBE2040ull, 0xBECF530EAE331D00ull}};
  for (int d = 0; d < 2; ++d) {
    CaseSpec sd = spec_of("small_decode", 16, 7);
    sd.dtype = d == 0 ? DType::kBF16 : DType::kF16;
    const Case c = generate_case(sd);
    const Tensor* tensors[] = {&c.q, &c.kv_c, &c.k_pe, &c.w_uk, &c.w_uv};
    for (int k = 0; k < 5; ++k) EXPECT_EQ(fnv1a(*tensors[k]), digests[d][k]) << dtype_short(sd.dtype) << " tensor " << k;
  }
}

TEST(GenerateCase, IndependentOfThreadCount) {
  const int before = omp_get_max_threads();
  const CaseSpec s = spec_of("mixed_small", 16, 3);
  omp_set_num_threads(1);
  const Case one = generate_case(s);
  omp_set_num_threads(2);
  const Case two = generate_case(s);
  omp_set_num_threads(7);  // more threads than cores: uneven static chunks
  const Case seven = generate_case(s);
  omp_set_num_threads(before);
  expect_identical(one, two);
  expect_identical(one, seven);
}

// set_keep_drawn_inputs(false) (a run whose seeds are all distinct): the
// tensors drawn without keeping equal those drawn and kept, and those read
// back from the kept copies.
TEST(GenerateCase, TheSameInputsWhetherDrawnTensorsAreKeptOrNot) {
  const CaseSpec s = spec_of("mixed_small", 16, 9191);  // a seed no other test draws
  set_keep_drawn_inputs(false);
  const Case unkept = generate_case(s);
  set_keep_drawn_inputs(true);
  const Case drawn = generate_case(s);
  const Case from_kept = generate_case(s);
  expect_identical(unkept, drawn);
  expect_identical(unkept, from_kept);
}

// seeds_repeat decides whether a run keeps drawn tensors and gives its
// workers an input store: only where two cases share a seed.
TEST(GenerateCase, SeedsRepeatOnlyWhereTwoCasesShareASeed) {
  std::vector<CaseSpec> cases = {spec_of("mixed_small", 16, 1), spec_of("mixed_small", 16, 2),
                                 spec_of("small_decode", 16, 3)};
  EXPECT_FALSE(seeds_repeat(cases));
  EXPECT_FALSE(seeds_repeat({}));
  cases.push_back(spec_of("small_decode", 8, 2));  // another case of seed 2 (a TP degree's, say)
  EXPECT_TRUE(seeds_repeat(cases));
}

// A case drawn for cache_write alone has the full case's latent rows, bit for
// bit, and nothing else: no queries, weights or cache values; retargeted to
// an fp8 cache it still draws none.
TEST(GenerateCase, KeysOnlyDrawsTheSameLatentRowsAndNothingElse) {
  CaseSpec s = spec_of("mixed_small", 16, 9192);
  s.kv_cache_dtype = KvCacheDtype::kFp8;
  const Case full = generate_case(s);
  const Case keys = generate_case(s, true);
  EXPECT_TRUE(keys.keys_only);
  EXPECT_FALSE(full.keys_only);
  EXPECT_TRUE(same_bytes(full.kv_c, keys.kv_c));
  EXPECT_TRUE(same_bytes(full.k_pe, keys.k_pe));
  EXPECT_FALSE(full.kv_c_cache.empty());
  for (const Tensor* t : {&keys.q, &keys.w_uk, &keys.w_uv, &keys.kv_c_cache, &keys.k_pe_cache}) EXPECT_TRUE(t->empty());
  EXPECT_EQ(keys.kv_start_loc, full.kv_start_loc);
  CaseSpec e4m3 = s;
  e4m3.kv_cache_dtype = KvCacheDtype::kFp8E4m3;
  Case moved = generate_case(s, true);
  retarget_case(moved, e4m3);
  EXPECT_TRUE(moved.kv_c_cache.empty());
  EXPECT_TRUE(same_bytes(moved.kv_c, full.kv_c));
}

TEST(GenerateCase, IndependentOfCaseOrder) {
  const CaseSpec a = spec_of("small_prefill", 16, 1);
  const CaseSpec b = spec_of("mixed_small", 16, 2);
  const Case b_alone = generate_case(b);
  const Case a_first = generate_case(a);
  const Case b_after = generate_case(b);
  expect_identical(b_alone, b_after);
  EXPECT_FALSE(same_bytes(a_first.kv_c, b_after.kv_c));
}

TEST(GenerateCase, SeedAndTensorNameChangeTheData) {
  const Case s0 = generate_case(spec_of("small_decode", 16, 0));
  const Case s1 = generate_case(spec_of("small_decode", 16, 1));
  EXPECT_FALSE(same_bytes(s0.q, s1.q));
  EXPECT_FALSE(same_bytes(s0.kv_c, s1.kv_c));
  EXPECT_FALSE(same_bytes(s0.w_uk, s1.w_uk));
  // Same shape, different name: w_uk and w_uv must be different draws.
  EXPECT_FALSE(same_bytes(s0.w_uk, s0.w_uv));
  // kv_c and k_pe share row indices; their first rows must still differ.
  EXPECT_NE(std::memcmp(s0.kv_c.bytes(), s0.k_pe.bytes(), s0.k_pe.nbytes() / 72), 0);
}

TEST(GenerateCase, RejectsInvalidSpec) {
  CaseSpec s = spec_of("small_decode", 3);  // 128 heads over tp 3
  EXPECT_THROW(generate_case(s), InvalidCase);
}

}  // namespace
}  // namespace mlagate
