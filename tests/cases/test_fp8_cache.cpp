// fp8 caches in the case model: ids and validation of the kv cache formats,
// paged caches whose entries are the reference encoding of the case's rows
// with every unused field poisoned in its own type, the dequantized values the
// golden reads (exactly what the reference reader returns from the cache),
// retargeting a generated case, and the conformance check's messages.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cases/case.h"
#include "cases/errors.h"
#include "cases/fp8.h"
#include "cases/paged_cache.h"
#include "cases/suite.h"

namespace mlagate {
namespace {

CaseSpec spec(KvCacheFormat kv, float k_scale = 1.f, DType dt = DType::kBF16) {
  CaseSpec s;
  s.batch = BatchSpec{.name = "varied", .seq_lens = {1, 17, 0, 130, 33}, .query_lens = {1, 2, 1, 5, 1}, .note = {}};
  s.tp = 32;
  s.dtype = dt;
  s.seed = 5;
  s.kv_cache_dtype = kv.dtype;
  s.scale_rule = kv.scale_rule;
  s.k_scale = k_scale;
  return s;
}

const KvCacheFormat kFormats[] = {{KvCacheDtype::kFp8}, {KvCacheDtype::kFp8E4m3},
                                  {KvCacheDtype::kFp8DsMla, ScaleRule::kPow2}, {KvCacheDtype::kFp8DsMla, ScaleRule::kRaw}};

TEST(KvFormat, NamesParseAndIds) {
  EXPECT_EQ(parse_kv_cache_format("fp8_ds_mla"), (KvCacheFormat{KvCacheDtype::kFp8DsMla, ScaleRule::kPow2}));
  EXPECT_EQ(parse_kv_cache_format("fp8_ds_mla:raw"), (KvCacheFormat{KvCacheDtype::kFp8DsMla, ScaleRule::kRaw}));
  EXPECT_EQ(parse_kv_cache_format("fp8_e4m3").dtype, KvCacheDtype::kFp8E4m3);
  EXPECT_THROW(parse_kv_cache_format("fp8:raw"), InputError);
  EXPECT_THROW(parse_kv_cache_format("fp8_ds_mla:ue8m0"), InputError);
  EXPECT_THROW(parse_kv_cache_format("fp8_e5m2"), InputError);
  for (const KvCacheFormat& f : kFormats) EXPECT_EQ(parse_kv_cache_format(kv_cache_format_name(f)), f);

  CaseSpec s = spec({KvCacheDtype::kFp8DsMla, ScaleRule::kRaw}, 3.f);
  s.batch.name = "small_decode";
  EXPECT_EQ(s.id(), "adhoc/small_decode/tp32/bf16/kv=fp8_ds_mla:raw/bs=auto/seed=5/kscale=3");
  s.scale_rule = ScaleRule::kPow2;
  s.k_scale = 1.f;
  EXPECT_EQ(s.id(), "adhoc/small_decode/tp32/bf16/kv=fp8_ds_mla:pow2/bs=auto/seed=5");
  s.kv_cache_dtype = KvCacheDtype::kAuto;
  EXPECT_EQ(s.id(), "adhoc/small_decode/tp32/bf16/kv=auto/bs=auto/seed=5");  // auto ids unchanged
}

TEST(KvFormat, ValidationRejectsImpossibleFormats) {
  CaseSpec raw_fp8 = spec({KvCacheDtype::kFp8});
  raw_fp8.scale_rule = ScaleRule::kRaw;  // would be invisible in the id
  EXPECT_THROW(raw_fp8.validate(), InvalidCase);
  EXPECT_THROW(spec({KvCacheDtype::kFp8DsMla}, 1.f, DType::kF16).validate(), InvalidCase);
  CaseSpec odd = spec({KvCacheDtype::kFp8DsMla});
  odd.dims.kv_lora_rank = 192;
  EXPECT_THROW(odd.validate(), InvalidCase);
  EXPECT_NO_THROW(spec({KvCacheDtype::kFp8}, 3.f, DType::kF16).validate());
  EXPECT_NO_THROW(spec({KvCacheDtype::kFp8DsMla, ScaleRule::kRaw}, 3.f).validate());
}

TEST(KvFormat, SuitesSweepFormats) {
  const Suite vllm = load_suite("vllm");
  ASSERT_EQ(vllm.cases.size(), 144u);
  int per[4] = {0, 0, 0, 0};
  for (const CaseSpec& c : vllm.cases) {
    ++per[static_cast<int>(c.kv_cache_dtype)];
    EXPECT_EQ(c.k_scale, 1.f);
  }
  EXPECT_EQ(per[0], 48);
  EXPECT_EQ(per[1], 48);
  EXPECT_EQ(per[2], 48);
  const Suite fp8 = load_suite("fp8");
  bool pow2_k3 = false, raw_k3 = false, raw_k1 = false, e4m3_k3 = false;
  for (const CaseSpec& c : fp8.cases) {
    EXPECT_TRUE(is_fp8(c.kv_cache_dtype)) << c.id();
    if (c.kv_cache_dtype == KvCacheDtype::kFp8DsMla && c.k_scale == 3.f) (c.scale_rule == ScaleRule::kPow2 ? pow2_k3 : raw_k3) = true;
    if (c.kv_cache_dtype == KvCacheDtype::kFp8DsMla && c.k_scale == 1.f && c.scale_rule == ScaleRule::kRaw) raw_k1 = true;
    if (c.kv_cache_dtype == KvCacheDtype::kFp8E4m3 && c.k_scale == 3.f) e4m3_k3 = true;
  }
  EXPECT_TRUE(pow2_k3 && raw_k3 && raw_k1 && e4m3_k3);
  // A sweep names the rule in the kv dtype.
  Sweep sw;
  sw.specs = {"small_decode"};
  sw.kv_dtypes = {parse_kv_cache_format("fp8_ds_mla:raw"), parse_kv_cache_format("auto")};
  const auto cases = apply_sweep(sw, std::nullopt);
  ASSERT_EQ(cases.size(), 2u);
  EXPECT_EQ(cases[0].id(), "sweep/small_decode/tp1/bf16/kv=fp8_ds_mla:raw/bs=auto/seed=0");
  EXPECT_EQ(parse_suite_yaml("name: x\ngroups:\n  - specs: [small_decode]\n    kv_cache_dtype: [fp8_ds_mla:raw]\n", "x.yaml")
                .cases.at(0).scale_rule,
            ScaleRule::kRaw);
  EXPECT_THROW(parse_suite_yaml("name: x\ngroups:\n  - specs: [small_decode]\n    kv_cache_dtype: [fp8:pow2]\n", "x.yaml"),
               InputError);
}

// Every entry of a request is the reference encoding of its row; every other
// entry is poison in each field's own type; the reference's values are what the
// reference reader gets back from the cache.
TEST(Fp8Cache, EntriesArePoisonOrTheReferenceEncoding) {
  for (const KvCacheFormat& kv : kFormats) {
    SCOPED_TRACE(kv_cache_format_name(kv));
    const Case c = generate_case(spec(kv, 3.f));
    const std::int64_t L = 512, R = 64;
    ASSERT_EQ(c.kv_c_cache.shape(), (Shape{c.num_kv_tokens, L}));
    ASSERT_EQ(c.k_pe_cache.dtype(), DType::kF32);
    for (int bs : {1, 16}) {
      const PagedCache pc = build_paged_cache(c, bs, CacheOptions{});
      const EntryFormat f = pc.format();
      ASSERT_EQ(pc.entry_bytes, kv.dtype == KvCacheDtype::kFp8DsMla ? 656 : 576);
      std::vector<char> owned(static_cast<std::size_t>(pc.num_blocks) * bs, 0);
      std::vector<std::byte> want(static_cast<std::size_t>(f.bytes));
      std::vector<float> kv_back(L), pe_back(R);
      for (int i = 0; i < c.num_requests; ++i)
        for (int p = 0; p < c.seq_lens[i]; ++p) {
          const std::int64_t slot = pc.slot_of(i, p), row = c.kv_start_loc[i] + p;
          owned[static_cast<std::size_t>(slot)] = 1;
          encode_entry(f, c.kv_c.data<std::uint16_t>() + row * L, c.k_pe.data<std::uint16_t>() + row * R, want.data());
          ASSERT_EQ(std::memcmp(pc.entry(slot), want.data(), want.size()), 0) << "request " << i << " position " << p;
          reference_cache_read(pc, slot, kv_back.data(), pe_back.data());
          ASSERT_EQ(std::memcmp(kv_back.data(), c.kv_c_cache.data<float>() + row * L, L * 4), 0);
          ASSERT_EQ(std::memcmp(pe_back.data(), c.k_pe_cache.data<float>() + row * R, R * 4), 0);
        }
      std::vector<std::byte> poison(static_cast<std::size_t>(f.bytes));
      poison_entry(f, Poison::kNaN, poison.data());
      for (std::int64_t slot = 0; slot < static_cast<std::int64_t>(owned.size()); ++slot)
        if (!owned[static_cast<std::size_t>(slot)])
          ASSERT_EQ(std::memcmp(pc.entry(slot), poison.data(), poison.size()), 0) << "slot " << slot;
      // Poison reads back as NaN in every field.
      reference_cache_read(pc, 0, kv_back.data(), pe_back.data());
      for (float x : kv_back) ASSERT_TRUE(std::isnan(x));
      for (float x : pe_back) ASSERT_TRUE(std::isnan(x));
    }
  }
}

TEST(Fp8Cache, SentinelPoisonIsTheLargestFiniteValueOfEachField) {
  const EntryFormat f = make_entry_format({KvCacheDtype::kFp8DsMla}, DType::kBF16, 512, 64, 1.f);
  std::vector<std::byte> e(656);
  poison_entry(f, Poison::kSentinel, e.data());
  std::vector<float> kv(512), pe(64);
  decode_entry(f, e.data(), kv.data(), pe.data());
  EXPECT_EQ(kv[0], 448.f * 0x1p127f);  // overflows to inf in fp32: visible, not NaN
  EXPECT_TRUE(std::isfinite(pe[0]));
  EXPECT_GT(pe[0], 1e38f);
}

TEST(Fp8Cache, GoldenValuesAreTheDequantizedInputs) {
  const Case a = generate_case(spec({KvCacheDtype::kAuto}));
  EXPECT_TRUE(a.kv_c_cache.empty());
  EXPECT_TRUE(a.k_pe_cache.empty());
  const Case f = generate_case(spec({KvCacheDtype::kFp8}, 3.f));
  for (std::int64_t i = 0; i < f.kv_c.numel(); ++i) {
    const float x = static_cast<float>(f.kv_c.get(i));
    ASSERT_EQ(f.kv_c_cache.data<float>()[i], e4m3_to_f32(f32_to_e4m3(x / 3.f)) * 3.f);
  }
  // fp8_ds_mla keeps RoPE verbatim.
  const Case m = generate_case(spec({KvCacheDtype::kFp8DsMla, ScaleRule::kRaw}));
  for (std::int64_t i = 0; i < m.k_pe.numel(); ++i) ASSERT_EQ(m.k_pe_cache.data<float>()[i], m.k_pe.get(i));
}

TEST(Fp8Cache, RetargetingEqualsGenerating) {
  const CaseSpec base = spec({KvCacheDtype::kAuto});
  Case c = generate_case(base);
  for (const KvCacheFormat& kv : kFormats) {
    CaseSpec s = spec(kv, 3.f);
    s.block_size = 64;
    EXPECT_EQ(inputs_key(s), inputs_key(base));
    retarget_case(c, s);
    const Case g = generate_case(s);
    EXPECT_EQ(c.spec.id(), g.spec.id());
    EXPECT_EQ(std::memcmp(c.kv_c.bytes(), g.kv_c.bytes(), g.kv_c.nbytes()), 0);
    ASSERT_EQ(c.kv_c_cache.nbytes(), g.kv_c_cache.nbytes());
    EXPECT_EQ(std::memcmp(c.kv_c_cache.bytes(), g.kv_c_cache.bytes(), g.kv_c_cache.nbytes()), 0);
    EXPECT_EQ(std::memcmp(c.k_pe_cache.bytes(), g.k_pe_cache.bytes(), g.k_pe_cache.nbytes()), 0);
  }
  CaseSpec other = base;
  other.seed = 6;
  EXPECT_NE(inputs_key(other), inputs_key(base));
  EXPECT_THROW(retarget_case(c, other), std::logic_error);
}

TEST(Fp8Cache, CacheValuesKeyGroupsEqualCaches) {
  const auto key = [](KvCacheFormat kv, float k_scale, int bs = 0) {
    CaseSpec s = spec(kv, k_scale);
    s.block_size = bs;
    return cache_values_key(s);
  };
  const KvCacheFormat fp8{KvCacheDtype::kFp8}, e4m3{KvCacheDtype::kFp8E4m3}, auto_{KvCacheDtype::kAuto};
  const KvCacheFormat pow2{KvCacheDtype::kFp8DsMla, ScaleRule::kPow2}, raw{KvCacheDtype::kFp8DsMla, ScaleRule::kRaw};
  EXPECT_EQ(key(fp8, 3.f), key(e4m3, 3.f, 64));  // one format on NVIDIA
  EXPECT_EQ(key(pow2, 1.f), key(pow2, 3.f));     // k_scale plays no part
  EXPECT_EQ(key(auto_, 1.f), key(auto_, 3.f));
  EXPECT_NE(key(fp8, 1.f), key(fp8, 3.f));
  EXPECT_NE(key(pow2, 1.f), key(raw, 1.f));
  EXPECT_NE(key(auto_, 1.f), key(fp8, 1.f));
  // Equal keys, equal values.
  const Case a = generate_case(spec(fp8, 3.f)), b = generate_case(spec(e4m3, 3.f));
  EXPECT_EQ(std::memcmp(a.kv_c_cache.bytes(), b.kv_c_cache.bytes(), a.kv_c_cache.nbytes()), 0);
  const Case c = generate_case(spec(pow2, 1.f)), d = generate_case(spec(pow2, 3.f));
  EXPECT_EQ(std::memcmp(c.kv_c_cache.bytes(), d.kv_c_cache.bytes(), c.kv_c_cache.nbytes()), 0);
}

TEST(Fp8Cache, FirstDifferenceNamesTokenFieldAndElement) {
  const Case c = generate_case(spec({KvCacheDtype::kFp8DsMla, ScaleRule::kRaw}));
  CacheOptions opt;
  opt.write_new_tokens = false;
  const PagedCache base = build_paged_cache(c, 16, opt);
  const std::int64_t* sm = base.slot_mapping.data<std::int64_t>();
  const std::span<const std::int64_t> slots(sm, static_cast<std::size_t>(c.num_tokens));
  PagedCache a = base, b = base;
  EXPECT_EQ(first_cache_difference(a, b, slots, c.query_start_loc), "");
  // Token 5 is request 3's second new token (position 126): its scale 2, then byte 17 of kv_c.
  const std::int64_t slot = sm[5];
  a.entry(slot)[512 + 4 * 2 + 1] ^= std::byte{0x10};
  a.entry(slot)[17] ^= std::byte{0x01};
  const std::string msg = first_cache_difference(a, b, slots, c.query_start_loc);
  const auto expected = std::to_integer<int>(b.entry(slot)[17]);
  char hex[64];
  std::snprintf(hex, sizeof hex, "got 0x%02x expected 0x%02x", expected ^ 1, expected);
  EXPECT_EQ(msg, "first differing byte: token 5 (request 3, position 126), field kv_c, element 17, " + std::string(hex) +
                     " (2 byte(s) in 1 entry differ)");
  PagedCache d = base;
  d.entry(slot)[512 + 4 * 2 + 1] ^= std::byte{0x10};
  EXPECT_NE(first_cache_difference(d, b, slots, c.query_start_loc).find("field scale, element 2"), std::string::npos);
  PagedCache e = base;
  e.entry(0)[600] ^= std::byte{0x01};  // the null block: no request's
  EXPECT_NE(first_cache_difference(e, b, slots, c.query_start_loc).find("owned by no request), field k_pe, element 36"),
            std::string::npos);
  // Differences far apart (chunks that compare equal between them) all count.
  PagedCache h = base;
  h.entry(slot)[17] ^= std::byte{0x01};
  h.entry(base.slot_of(0, 0))[3] ^= std::byte{0x01};
  h.entry(base.slot_of(3, 2))[5] ^= std::byte{0x01};
  EXPECT_NE(first_cache_difference(h, b, slots, c.query_start_loc).find("(3 byte(s) in 3 entries differ)"),
            std::string::npos)
      << first_cache_difference(h, b, slots, c.query_start_loc);
  PagedCache g = base;
  g.entry(base.slot_of(3, 2))[0] ^= std::byte{0x01};  // a context token
  EXPECT_NE(first_cache_difference(g, b, slots, c.query_start_loc).find("(request 3, position 2, not a new token)"),
            std::string::npos);
}

}  // namespace
}  // namespace mlagate
