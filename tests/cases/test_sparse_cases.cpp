// The sparse inputs (cases/sparse.h) and the fp8_v4 cache format (cases/fp8.h):
// the V4 entry's contract values and per-page layout, the writer/reader round
// trip, the index sets' rules (causal, distinct, -1 scattered, duplicates,
// empty rows, lengths with poisoned slots past them, indices past the end,
// windows, compressed rows),
// and the fp64 reference against a brute-force evaluation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <limits>
#include <set>
#include <string>

#include "cases/case.h"
#include "cases/encoding.h"
#include "cases/errors.h"
#include "cases/fp8.h"
#include "cases/paged_cache.h"
#include "cases/sparse.h"
#include "cases/suite.h"
#include "reference/glue.h"
#include "reference/sparse_reference.h"

namespace mlagate {
namespace {

CaseSpec v4_spec(KvCacheDtype kv = KvCacheDtype::kFp8V4) {
  CaseSpec s;
  s.batch = {"t", {300, 77, 0}, {5, 1, 1}};
  s.dims = dims_preset("v4");
  s.tp = 32;
  s.kv_cache_dtype = kv;
  s.sparse.window = 64;
  s.sparse.compress = 4;
  s.sparse.extra_topk = 16;
  s.sparse.sink = true;
  return s;
}

CaseSpec v32_spec(IndexPattern p, int topk = 50) {
  CaseSpec s;
  s.batch = {"t", {300, 40, 1, 0}, {6, 1, 1, 1}};
  s.tp = 32;
  s.sparse.topk = topk;
  s.sparse.pattern = p;
  return s;
}

TEST(SparseFormat, V4EntryContractValuesAndPageLayout) {
  const EntryFormat f = make_entry_format({KvCacheDtype::kFp8V4}, DType::kBF16, 448, 64, 1.f);
  EXPECT_EQ(f.bytes, 584);
  EXPECT_EQ(f.data_bytes, 576);
  EXPECT_EQ(f.scale_offset, 576);
  EXPECT_EQ(f.scale_count, 7);
  EXPECT_EQ(f.k_pe_offset, 448);
  EXPECT_EQ(block_bytes(f, 64), 37440);  // 64 * 584 = 37376, padded to 65 * 576
  EXPECT_EQ(block_bytes(f, 1), 1152);
  EXPECT_THROW(make_entry_format({KvCacheDtype::kFp8V4}, DType::kBF16, 512, 64, 1.f), InvalidCase);
  EXPECT_THROW(make_entry_format({KvCacheDtype::kFp8V4}, DType::kF16, 448, 64, 1.f), InvalidCase);

  // Tile 0 amax 336 stores scale 1.0 (UE8M0 127); an all-zero tile stores 2^-13 (114).
  std::vector<std::uint16_t> kv(448, f32_to_bf16(0.f)), pe(64);
  kv[3] = f32_to_bf16(-336.f);
  kv[64 + 1] = f32_to_bf16(1.f);  // tile 1: amax 1 -> 1/448 -> 2^-8 (119)
  for (int i = 0; i < 64; ++i) pe[i] = f32_to_bf16(static_cast<float>(i) - 3.5f);
  std::vector<std::byte> e(584);
  encode_entry(f, kv.data(), pe.data(), e.data());
  const auto* u = reinterpret_cast<const std::uint8_t*>(e.data());
  EXPECT_EQ(u[576 + 0], 127);
  EXPECT_EQ(u[576 + 1], 119);
  EXPECT_EQ(u[576 + 2], 114);
  EXPECT_EQ(u[583], 0) << "the pad byte";
  EXPECT_EQ(u[3], f32_to_e4m3(-336.f));
  std::uint16_t rope0;
  std::memcpy(&rope0, e.data() + 448, 2);
  EXPECT_EQ(rope0, pe[0]) << "RoPE as bf16 verbatim at byte 448";
  std::vector<float> kvd(448), ped(64);
  decode_entry(f, e.data(), kvd.data(), ped.data());
  EXPECT_EQ(kvd[3], -320.f);  // 336 is a tie between e4m3 320 and 352: to even
  EXPECT_EQ(kvd[65], 1.f);
  EXPECT_EQ(ped[10], 6.5f);
  EXPECT_EQ(entry_field(f, 450).name, "k_pe");
  EXPECT_EQ(entry_field(f, 578).name, "scale");
  EXPECT_EQ(entry_field(f, 578).element, 2);
  EXPECT_EQ(entry_field(f, 583).name, "pad");
}

TEST(SparseFormat, V4PagedCacheSplitsEveryBlockIntoDataThenScales) {
  const Case c = generate_case(v4_spec());
  const PagedCache pc = build_paged_cache(c, 16);
  ASSERT_TRUE(pc.split_pages());
  EXPECT_EQ(pc.data.shape(), (Shape{pc.num_blocks, 9792}));  // 16 * 584 = 9344 bytes, padded to 17 * 576
}

TEST(SparseFormat, V4SlotsLandWhereFlashMlaLooksForThem) {
  const Case c = generate_case(v4_spec());
  const int bs = 16;
  const PagedCache pc = build_paged_cache(c, bs);
  const std::int64_t stride = (bs * 584 + 575) / 576 * 576;
  ASSERT_EQ(pc.block_bytes, stride);
  const EntryFormat f = pc.format();
  std::vector<std::byte> e(584);
  // Request 0, position 37: data at block * stride + offset * 576, scales at block * stride + bs * 576 + offset * 8.
  const std::int64_t slot = pc.slot_of(0, 37), block = slot / bs, off = slot % bs;
  const auto* kv = c.kv_c.data<std::uint16_t>() + 37 * 448;
  const auto* pe = c.k_pe.data<std::uint16_t>() + 37 * 64;
  encode_entry(f, kv, pe, e.data());
  const std::byte* base = pc.data.bytes() + block * stride;
  EXPECT_EQ(std::memcmp(base + off * 576, e.data(), 576), 0);
  EXPECT_EQ(std::memcmp(base + bs * 576 + off * 8, e.data() + 576, 8), 0);
  // load/store round trip, and locate_byte's inverse mapping.
  std::vector<std::byte> back(584);
  pc.load_entry(slot, back.data());
  EXPECT_EQ(std::memcmp(back.data(), e.data(), 584), 0);
  EXPECT_EQ(pc.locate_byte(block * stride + off * 576 + 5), (std::pair<std::int64_t, int>{slot, 5}));
  EXPECT_EQ(pc.locate_byte(block * stride + bs * 576 + off * 8 + 2), (std::pair<std::int64_t, int>{slot, 578}));
  EXPECT_EQ(pc.locate_byte(block * stride + bs * 584).first, -1) << "block padding";
  // The reference reader gives the case's dequantized values.
  std::vector<float> a(448), b(64);
  reference_cache_read(pc, slot, a.data(), b.data());
  EXPECT_EQ(a[100], c.kv_c_cache.data<float>()[37 * 448 + 100]);
  EXPECT_EQ(b[7], c.k_pe_cache.data<float>()[37 * 64 + 7]);
}

TEST(SparseIndices, TopkRowsAreCausalDistinctAndScatterTheirInvalidSlots) {
  const Case c = generate_case(v32_spec(IndexPattern::kRandom));
  const IndexSet& m = c.sparse->main;
  ASSERT_EQ(m.width, 50);
  const std::vector<int> req = token_requests(c);
  int rows_with_inner_invalid = 0;
  for (int t = 0; t < c.num_tokens; ++t) {
    const int p = token_position(c, req[t], t);
    std::set<int> seen;
    int valid = 0;
    bool gap = false;
    for (int k = 0; k < m.width; ++k) {
      const int v = m.pos[static_cast<std::size_t>(t) * m.width + k];
      if (v == kIndexInvalid) {
        gap = true;
        continue;
      }
      EXPECT_GE(v, 0);
      EXPECT_LE(v, p) << "an index past the token's own position";
      EXPECT_TRUE(seen.insert(v).second) << "a duplicate in a random row";
      ++valid;
      if (gap) ++rows_with_inner_invalid, gap = false;
    }
    EXPECT_EQ(valid, std::max(0, std::min(50, p + 1))) << "token " << t;
  }
  EXPECT_GT(rows_with_inner_invalid, 0) << "-1 must not only sit at the end of rows";
}

TEST(SparseIndices, PatternsDuplicatesEmptyRowsAndLengths) {
  {
    const Case c = generate_case(v32_spec(IndexPattern::kDuplicates));
    std::vector<int> mp;
    main_positions(c, 0, mp);  // request 0, position 294: a full row
    std::set<int> distinct(mp.begin(), mp.end());
    EXPECT_EQ(mp.size(), 50u);
    EXPECT_LT(distinct.size(), mp.size()) << "duplicates are kept (each counts)";
  }
  {
    const Case c = generate_case(v32_spec(IndexPattern::kInvalidRows));
    std::vector<int> mp;
    main_positions(c, 1, mp);
    EXPECT_TRUE(mp.empty()) << "every third token (t % 3 == 1) has no key";
    main_positions(c, 0, mp);
    EXPECT_EQ(mp.size(), 50u);
  }
  {
    const Case c = generate_case(v32_spec(IndexPattern::kLengths));
    const IndexSet& m = c.sparse->main;
    ASSERT_EQ(m.length.size(), static_cast<std::size_t>(c.num_tokens));
    const int t = c.num_tokens - 2;  // the seq_len-1 request: one key
    EXPECT_EQ(m.length[t], 1);
    EXPECT_EQ(m.pos[static_cast<std::size_t>(t) * 50], 0);
    for (int k = 1; k < 50; ++k) EXPECT_EQ(m.pos[static_cast<std::size_t>(t) * 50 + k], kIndexPoisoned);
    // Converted for a cache, the poisoned slots name the null block.
    const PagedCache pc = build_paged_cache(c, 64);
    const Tensor g = global_slots(c, m, pc);
    EXPECT_EQ(g.data<std::int32_t>()[t * 50 + 1] / 64, 0);
    EXPECT_EQ(g.data<std::int32_t>()[t * 50], pc.slot_of(token_requests(c)[t], 0));
  }
}

// lens_garbage (flashinfer #5095): the lens pattern's valid slots and lengths,
// and past each length garbage of three kinds and never -1: real keys of the
// request, poisoned null-block slots, and indices past the pool.
TEST(SparseIndices, LensGarbageFillsThePastLengthLanesWithGarbageNeverInvalid) {
  EXPECT_EQ(parse_index_pattern("lens_garbage"), IndexPattern::kLengthsGarbage);
  EXPECT_TRUE(has_topk_length(IndexPattern::kLengthsGarbage));
  EXPECT_NE(v32_spec(IndexPattern::kLengthsGarbage).id().find("/idx=lens_garbage"), std::string::npos);
  const Case g = generate_case(v32_spec(IndexPattern::kLengthsGarbage));
  const Case l = generate_case(v32_spec(IndexPattern::kLengths));
  const IndexSet& m = g.sparse->main;
  ASSERT_EQ(m.length, l.sparse->main.length);
  const PagedCache pc = build_paged_cache(g, 16);
  const std::int64_t capacity = static_cast<std::int64_t>(pc.num_blocks) * pc.block_size;
  const Tensor slots = global_slots(g, m, pc);
  int real = 0, poisoned = 0, past = 0;
  std::vector<int> a, b;
  for (int t = 0; t < g.num_tokens; ++t) {
    main_positions(g, t, a);
    main_positions(l, t, b);
    EXPECT_EQ(a, b) << "token " << t << ": the keys within the length are lens's";
    for (int k = m.length[static_cast<std::size_t>(t)]; k < m.width; ++k) {
      const std::int32_t p = m.pos[static_cast<std::size_t>(t) * m.width + k];
      const std::int32_t s = slots.data<std::int32_t>()[t * m.width + k];
      EXPECT_NE(s, -1) << "token " << t << " slot " << k;
      if (p >= 0) {
        ++real;
        EXPECT_EQ(s, pc.slot_of(token_requests(g)[static_cast<std::size_t>(t)], p));
      } else if (p == kIndexPoisoned) {
        ++poisoned;
        EXPECT_EQ(s / 16, 0) << "the null block";
      } else {
        ++past;
        EXPECT_TRUE(is_past_end(p));
        EXPECT_GE(s, capacity) << "an index past the pool";
      }
    }
  }
  EXPECT_GT(real, 0);
  EXPECT_GT(poisoned, 0);
  EXPECT_GT(past, 0);
}

// The oob pattern: the random pattern's rows with every -1 replaced by a
// past-the-end code of each kind; global_slots gives the decode op -1 there
// and the prefill op indices >= s_kv (exactly s_kv, s_kv + 1..64, INT32_MAX
// and large ones between); the valid indices and the reference are the random
// pattern's, so such slots name no key.
TEST(SparseIndices, OutOfRangeRowsNameIndicesAtOrPastTheEnd) {
  EXPECT_EQ(parse_index_pattern("oob"), IndexPattern::kOutOfRange);
  EXPECT_EQ(index_pattern_name(IndexPattern::kOutOfRange), "oob");
  EXPECT_NE(v32_spec(IndexPattern::kOutOfRange).id().find("/topk=50/idx=oob"), std::string::npos);
  const Case oob = generate_case(v32_spec(IndexPattern::kOutOfRange));
  const Case random = generate_case(v32_spec(IndexPattern::kRandom));
  const IndexSet& m = oob.sparse->main;
  const IndexSet& r = random.sparse->main;
  ASSERT_EQ(m.pos.size(), r.pos.size());
  for (std::size_t k = 0; k < m.pos.size(); ++k) {
    if (r.pos[k] == kIndexInvalid) EXPECT_TRUE(is_past_end(m.pos[k])) << "slot " << k << ": " << m.pos[k];
    else EXPECT_EQ(m.pos[k], r.pos[k]) << "slot " << k;
  }
  std::vector<int> a, b;
  for (int t = 0; t < oob.num_tokens; ++t) {
    main_positions(oob, t, a);
    main_positions(random, t, b);
    EXPECT_EQ(a, b) << "token " << t << ": a past-the-end slot names no key";
  }
  // The reference sees the same keys: the same outputs, bit for bit.
  {
    std::vector<int> tokens(static_cast<std::size_t>(oob.num_tokens));
    for (int t = 0; t < oob.num_tokens; ++t) tokens[static_cast<std::size_t>(t)] = t;
    Tensor ql, qp;
    absorb_queries(oob, tokens, ql, qp);
    const Tensor q = sparse_query(oob, ql.view());
    const SparseReference x = sparse_golden(oob, q.view()), y = sparse_golden(random, q.view());
    EXPECT_EQ(x.o, y.o);
    EXPECT_EQ(x.lse, y.lse);
  }
  for (int bs : {1, 64}) {
    SCOPED_TRACE(bs);
    const PagedCache pc = build_paged_cache(oob, bs);
    const std::int64_t s_kv = static_cast<std::int64_t>(pc.num_blocks) * pc.block_size;
    const Tensor dec = global_slots(oob, m, pc), pre = global_slots(oob, m, pc, s_kv);
    const Tensor ref = global_slots(random, r, build_paged_cache(random, bs));
    std::set<std::string> kinds;
    for (std::int64_t k = 0; k < dec.numel(); ++k) {
      const std::int32_t want = ref.data<std::int32_t>()[k], d = dec.data<std::int32_t>()[k], p = pre.data<std::int32_t>()[k];
      EXPECT_EQ(d, want) << "decode: -1 where the prefill gets an index >= s_kv";
      if (want != -1) {
        EXPECT_EQ(p, want);
        continue;
      }
      ASSERT_GE(p, s_kv) << "element " << k;
      kinds.insert(p == s_kv                                     ? "s_kv"
                   : p <= s_kv + kPastEndNear                    ? "s_kv + small"
                   : p == std::numeric_limits<std::int32_t>::max() ? "INT32_MAX"
                                                                   : "large");
    }
    EXPECT_EQ(kinds.size(), 4u) << "every kind of index past the end";
    EXPECT_EQ(check_slots(dec.view(), pc, "indices"), "");
    EXPECT_NE(check_slots(pre.view(), pc, "indices"), "") << "the decode form refuses indices past the end";
    EXPECT_EQ(check_slots(pre.view(), pc, "indices", true), "");
    // Other garbage stays refused in the prefill form too.
    Tensor bad = pre;
    bad.data<std::int32_t>()[3] = -5;
    EXPECT_NE(check_slots(bad.view(), pc, "indices", true), "");
  }
  EXPECT_EQ(past_end_index(kIndexPastEnd, 1000), 1000);
  EXPECT_EQ(past_end_index(kIndexPastEnd - kPastEndNear, 1000), 1064);
  EXPECT_EQ(past_end_index(kIndexFar, 1000), std::numeric_limits<std::int32_t>::max());
  EXPECT_EQ(past_end_index(kIndexPastEnd - 5, std::numeric_limits<std::int32_t>::max()),
            std::numeric_limits<std::int32_t>::max()) << "saturates";
  EXPECT_FALSE(is_past_end(kIndexInvalid));
  EXPECT_FALSE(is_past_end(kIndexPoisoned));
  EXPECT_FALSE(is_past_end(kIndexPastEnd - kPastEndNear - 1));
  EXPECT_THROW(past_end_index(-100, 1000), std::logic_error);
  // V4 has no top-k row for the pattern to fill.
  CaseSpec v4 = v4_spec();
  v4.sparse.pattern = IndexPattern::kOutOfRange;
  EXPECT_THROW(generate_case(v4), InvalidCase);
}

TEST(SparseIndices, V4WindowAndCompressedRows) {
  const Case c = generate_case(v4_spec());
  const std::vector<int> req = token_requests(c);
  std::vector<int> mp, ep;
  for (int t = 0; t < c.num_tokens; ++t) {
    const int p = token_position(c, req[t], t);
    main_positions(c, t, mp);
    ASSERT_EQ(static_cast<int>(mp.size()), p < 0 ? 0 : std::min(64, p + 1)) << "token " << t;
    if (!mp.empty()) {
      EXPECT_EQ(mp.front(), std::max(0, p - 63));
      EXPECT_EQ(mp.back(), p);
    }
    extra_positions(c, t, ep);
    const int visible = p < 0 ? 0 : (p + 1) / 4;
    EXPECT_EQ(static_cast<int>(ep.size()), std::min(16, visible));
    for (int e : ep) EXPECT_LT(e, visible) << "a compressed entry not yet complete";
    // Past the length: other entries of the request (never to be read), or -1.
    const IndexSet& x = c.sparse->extra;
    for (int k = x.count(t); k < x.width; ++k) {
      const int v = x.pos[static_cast<std::size_t>(t) * x.width + k];
      EXPECT_TRUE(v == kIndexInvalid || std::find(ep.begin(), ep.end(), v) == ep.end());
    }
  }
  EXPECT_EQ(c.sparse->compressed.seq_lens, (std::vector<std::int32_t>{75, 19, 0}));
  EXPECT_EQ(c.sparse->sink.size(), 4u);
}

// The fp64 reference against a direct evaluation of the definition (long
// double, no matrices), on V3.2 rows with duplicates and empty rows and on V4
// with a window, a compressed cache and sinks.
void expect_reference_matches_definition(const Case& c) {
  std::vector<int> tokens(static_cast<std::size_t>(c.num_tokens));
  for (int t = 0; t < c.num_tokens; ++t) tokens[t] = t;
  Tensor ql, qp;
  absorb_queries(c, tokens, ql, qp);
  const Tensor q = sparse_query(c, ql.view());
  const SparseReference r = sparse_golden(c, q.view());
  const int N = c.spec.num_heads(), D = c.spec.dims.kv_lora_rank + c.spec.dims.rope_dim, Dv = c.spec.sparse_dv();
  const int L = c.spec.dims.kv_lora_rank;
  const std::vector<int> req = token_requests(c);
  std::vector<int> mp, ep;
  auto key = [&](const Case& owner, int i, int pos, int k) -> long double {
    const std::int64_t row = owner.kv_start_loc[i] + pos;
    const Tensor& kv = owner.kv_c_cache.empty() ? owner.kv_c : owner.kv_c_cache;
    const Tensor& pe = owner.k_pe_cache.empty() ? owner.k_pe : owner.k_pe_cache;
    const TensorView v = k < L ? kv.view() : pe.view();
    return v.get(k < L ? row * L + k : row * (D - L) + (k - L));
  };
  for (int t = 0; t < c.num_tokens; ++t) {
    main_positions(c, t, mp);
    extra_positions(c, t, ep);
    for (int h = 0; h < N; ++h) {
      std::vector<long double> logit;
      std::vector<std::pair<const Case*, int>> keys;
      for (int p : mp) keys.emplace_back(&c, p);
      for (int p : ep) keys.emplace_back(&c.sparse->compressed, p);
      for (auto [owner, p] : keys) {
        long double dot = 0;
        for (int k = 0; k < D; ++k) dot += static_cast<long double>(q.view().get((static_cast<std::int64_t>(t) * N + h) * D + k)) * key(*owner, req[t], p, k);
        logit.push_back(dot * c.spec.softmax_scale());
      }
      const double got_lse = r.lse[static_cast<std::size_t>(t) * N + h];
      if (keys.empty()) {
        EXPECT_TRUE(std::isinf(got_lse) && got_lse < 0);
        for (int k = 0; k < Dv; ++k) EXPECT_EQ(r.o[(static_cast<std::size_t>(t) * N + h) * Dv + k], 0.0);
        continue;
      }
      long double sum = 0;
      for (long double l : logit) sum += std::exp(l);
      const long double lse = std::log(sum);
      EXPECT_NEAR(got_lse, static_cast<double>(lse), 1e-11);
      const long double sink = c.sparse->sink.empty() ? -INFINITY : c.sparse->sink[h];
      const long double denom = sum + std::exp(sink);
      for (int k = 0; k < Dv; k += 37) {
        long double o = 0;
        for (std::size_t j = 0; j < keys.size(); ++j) o += std::exp(logit[j]) / denom * key(*keys[j].first, req[t], keys[j].second, k);
        EXPECT_NEAR(r.o[(static_cast<std::size_t>(t) * N + h) * Dv + k], static_cast<double>(o), 1e-12) << t << " " << h << " " << k;
      }
    }
  }
}

TEST(SparseReference, MatchesTheDefinition) {
  CaseSpec a = v32_spec(IndexPattern::kDuplicates, 70);
  a.sparse.sink = true;
  a.kv_cache_dtype = KvCacheDtype::kFp8DsMla;
  expect_reference_matches_definition(generate_case(a));
  expect_reference_matches_definition(generate_case(v32_spec(IndexPattern::kInvalidRows, 5)));
  expect_reference_matches_definition(generate_case(v4_spec()));
}

TEST(SparseSpec, IdsValidationAndSuites) {
  CaseSpec s = v4_spec();
  EXPECT_NE(s.id().find("/win=64/cmp=4x16/sink"), std::string::npos) << s.id();
  EXPECT_NE(v32_spec(IndexPattern::kLengths).id().find("/topk=50/idx=lens"), std::string::npos);
  CaseSpec bad = v32_spec(IndexPattern::kRandom);
  bad.sparse.window = 8;
  EXPECT_THROW(bad.validate(), InvalidCase);  // topk and window exclude each other
  bad = v4_spec();
  bad.sparse.extra_topk = 0;
  EXPECT_THROW(bad.validate(), InvalidCase);  // compress without extra_topk
  bad = v4_spec();
  bad.dims = Dims{};
  EXPECT_THROW(bad.validate(), InvalidCase);  // fp8_v4 needs the v4 dims
  EXPECT_THROW(parse_suite_yaml("name: x\ngroups:\n  - specs: [small_decode]\n    window: [8]\n    compressed: [\"4y2\"]\n",
                                "x.yaml"),
               InputError);
  for (const char* name : {"sparse", "v4"}) {
    const Suite su = load_suite(name);
    EXPECT_GT(su.cases.size(), 10u);
    for (const CaseSpec& c : su.cases) EXPECT_TRUE(c.sparse.active()) << c.id();
  }
}

}  // namespace
}  // namespace mlagate
