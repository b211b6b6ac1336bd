// Tests for cases/paged_cache against SPEC: The paged cache: gathering through the
// block table returns the case's rows bit-exactly, blocks are a seeded
// permutation of 1..used, and every byte no request owns holds the poison.
#include "cases/paged_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "cases/encoding.h"
#include "cases/errors.h"

namespace mlagate {
namespace {

constexpr int kBlockSizes[] = {1, 16, 32, 64, 128};

// Varied lengths: a single token, block size + 1, a padding request (s 0),
// two blocks + 2, an exact 64 with no context, and a seq_len 129 = 128 + 1.
CaseSpec varied_spec(DType dt = DType::kBF16, std::uint64_t seed = 0) {
  CaseSpec s;
  s.batch = BatchSpec{.name = "varied", .seq_lens = {1, 17, 0, 130, 64, 33, 129}, .query_lens = {1, 2, 1, 5, 64, 1, 3}, .note = {}};
  s.tp = 16;
  s.dtype = dt;
  s.seed = seed;
  return s;
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

std::int32_t table_at(const PagedCache& pc, int i, int j) {
  return pc.block_table.data<std::int32_t>()[static_cast<std::int64_t>(i) * pc.table_width + j];
}

// Slot of token p of request i, computed here from the table (not slot_of).
std::int64_t slot_at(const PagedCache& pc, int i, int p) {
  return static_cast<std::int64_t>(table_at(pc, i, p / pc.block_size)) * pc.block_size + p % pc.block_size;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.nbytes() == b.nbytes() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}
bool same_bytes(const PageStore& a, const PageStore& b) {
  return a.shape() == b.shape() && a.nbytes() == b.nbytes() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

// Everything section 5 promises about one cache. `new_written`: whether the
// new tokens are expected in the cache (false: their slots are still poison).
void check_cache(const Case& c, const PagedCache& pc, int bs, const CacheOptions& opt, bool new_written) {
  SCOPED_TRACE("block size " + std::to_string(bs));
  const Dims& d = c.spec.dims;
  const std::int64_t L = d.kv_lora_rank, R = d.rope_dim;
  const int B = c.num_requests;
  ASSERT_EQ(pc.block_size, bs);
  ASSERT_EQ(pc.elem_dtype, c.spec.dtype);
  ASSERT_EQ(pc.entry_bytes, 2 * (L + R));

  // Sizes: each request ceil(s_i / bs) blocks; width a multiple of 128/bs.
  int used = 0, widest = 1;
  for (int i = 0; i < B; ++i) {
    used += ceil_div(c.seq_lens[i], bs);
    widest = std::max(widest, ceil_div(c.seq_lens[i], bs));
  }
  const int divisor = std::max(1, 128 / bs);
  EXPECT_EQ(pc.used_blocks, used);
  EXPECT_EQ(pc.num_blocks, used + 1 + opt.spare_blocks);
  EXPECT_EQ(pc.table_width % divisor, 0);
  EXPECT_EQ(pc.table_width, ceil_div(widest, divisor) * divisor) << "padded further than needed";
  ASSERT_EQ(pc.data.shape(), (Shape{pc.num_blocks, bs, pc.entry_bytes}));
  ASSERT_EQ(pc.block_table.shape(), (Shape{B, pc.table_width}));
  ASSERT_EQ(pc.slot_mapping.shape(), (Shape{c.num_tokens}));

  // Physical blocks: never 0, in range, never shared, and exactly 1..used
  // (consecutive from 1, then permuted); unused entries 0 or the poison id.
  std::set<std::int32_t> seen;
  for (int i = 0; i < B; ++i)
    for (int j = 0; j < pc.table_width; ++j) {
      const std::int32_t b = table_at(pc, i, j);
      if (j < ceil_div(c.seq_lens[i], bs)) {
        EXPECT_GT(b, 0) << "request " << i << " uses the null block";
        EXPECT_LT(b, pc.num_blocks);
        EXPECT_TRUE(seen.insert(b).second) << "block " << b << " used twice";
      } else {
        EXPECT_EQ(b, opt.poison_block_table ? kPoisonBlockId : 0) << "unused entry " << i << "," << j;
      }
    }
  ASSERT_EQ(static_cast<int>(seen.size()), used);
  if (used > 0) {
    EXPECT_EQ(*seen.rbegin(), used);  // with the above: the set is {1..used}
  }

  // Gather: token p of request i is row kv_start_loc[i] + p, L then R elements.
  std::vector<char> live(static_cast<std::size_t>(pc.num_blocks) * bs, 0);
  for (int i = 0; i < B; ++i) {
    const int written = new_written ? c.seq_lens[i] : std::max(0, c.context_lens[i]);
    for (int p = 0; p < written; ++p) {
      const std::int64_t slot = slot_at(pc, i, p);
      ASSERT_EQ(pc.slot_of(i, p), slot);
      live[static_cast<std::size_t>(slot)] = 1;
      const std::int64_t row = c.kv_start_loc[i] + p;
      const std::byte* e = pc.entry(slot);
      ASSERT_EQ(std::memcmp(e, c.kv_c.bytes() + row * L * 2, static_cast<std::size_t>(L * 2)), 0)
          << "kv_c of request " << i << " token " << p;
      ASSERT_EQ(std::memcmp(e + L * 2, c.k_pe.bytes() + row * R * 2, static_cast<std::size_t>(R * 2)), 0)
          << "k_pe of request " << i << " token " << p;
    }
  }

  // Poison: the null block, spare blocks, unused tails (and unwritten new
  // tokens) hold the pattern in every element.
  const std::uint16_t poison = poison_bits16(opt.poison, c.spec.dtype);
  for (std::int64_t slot = 0; slot < static_cast<std::int64_t>(live.size()); ++slot) {
    if (live[static_cast<std::size_t>(slot)]) continue;
    const std::byte* e = pc.entry(slot);
    for (int k = 0; k < pc.entry_bytes / 2; ++k) {
      std::uint16_t v;
      std::memcpy(&v, e + 2 * k, 2);
      ASSERT_EQ(v, poison) << "slot " << slot << " (block " << slot / bs << ") element " << k;
    }
  }

  // slot_mapping: new token u of request i sits at position c_i + u; padding skips.
  const std::int64_t* sm = pc.slot_mapping.data<std::int64_t>();
  for (int i = 0; i < B; ++i)
    for (int u = 0; u < c.query_lens[i]; ++u) {
      const std::int64_t got = sm[c.query_start_loc[i] + u];
      if (c.seq_lens[i] == 0) EXPECT_LT(got, 0) << "padding request " << i;
      else EXPECT_EQ(got, slot_at(pc, i, c.context_lens[i] + u)) << "request " << i << " new token " << u;
    }
}

TEST(PagedCache, GatherIsBitExactForEveryBlockSize) {
  const Case c = generate_case(varied_spec());
  for (int bs : kBlockSizes) {
    const CacheOptions opt;  // defaults: NaN poison, new tokens written, 100 spare blocks
    check_cache(c, build_paged_cache(c, bs, opt), bs, opt, true);
  }
}

TEST(PagedCache, PoisonPatterns) {
  EXPECT_EQ(poison_bits16(Poison::kNaN, DType::kBF16), 0x7FC0);
  EXPECT_EQ(poison_bits16(Poison::kNaN, DType::kF16), 0x7E00);
  EXPECT_TRUE(std::isnan(bf16_to_f32(poison_bits16(Poison::kNaN, DType::kBF16))));
  EXPECT_TRUE(std::isnan(f16_to_f32(poison_bits16(Poison::kNaN, DType::kF16))));
  // Sentinels are huge but finite, so a kernel reading them overflows visibly.
  const float sb = bf16_to_f32(poison_bits16(Poison::kSentinel, DType::kBF16));
  const float sh = f16_to_f32(poison_bits16(Poison::kSentinel, DType::kF16));
  EXPECT_TRUE(std::isfinite(sb) && sb > 1e38f);
  EXPECT_TRUE(std::isfinite(sh) && sh >= 65504.0f);
  EXPECT_EQ(poison_bits16(Poison::kZero, DType::kBF16), 0);
  EXPECT_EQ(poison_bits16(Poison::kZero, DType::kF16), 0);

  for (DType dt : model_dtypes()) {
    const Case c = generate_case(varied_spec(dt));
    for (Poison p : {Poison::kNaN, Poison::kSentinel, Poison::kZero}) {
      SCOPED_TRACE(std::string(poison_name(p)) + " " + std::string(dtype_short(dt)));
      CacheOptions opt;
      opt.poison = p;
      opt.spare_blocks = 7;
      check_cache(c, build_paged_cache(c, 16, opt), 16, opt, true);
    }
  }
  EXPECT_EQ(parse_poison("sentinel"), Poison::kSentinel);
  EXPECT_THROW(parse_poison("garbage"), InputError);
}

// Layer-level ops write the new tokens themselves: the harness leaves their
// slots poisoned, and the reference writer through slot_mapping completes the
// cache to exactly the kernel-level one.
TEST(PagedCache, NewTokensLeftForTheCacheWriter) {
  const Case c = generate_case(varied_spec());
  const std::int64_t L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim;
  // The new tokens' rows, contiguous in token order (the layer op's input).
  Tensor kv_new(c.spec.dtype, {c.num_tokens, L}), pe_new(c.spec.dtype, {c.num_tokens, R});
  for (int i = 0; i < c.num_requests; ++i)
    for (int u = 0; u < c.query_lens[i]; ++u) {
      if (c.seq_lens[i] == 0) continue;  // padding: no row, slot -1
      const std::int64_t t = c.query_start_loc[i] + u, row = c.kv_start_loc[i] + c.context_lens[i] + u;
      std::memcpy(kv_new.bytes() + t * L * 2, c.kv_c.bytes() + row * L * 2, static_cast<std::size_t>(L * 2));
      std::memcpy(pe_new.bytes() + t * R * 2, c.k_pe.bytes() + row * R * 2, static_cast<std::size_t>(R * 2));
    }
  for (int bs : kBlockSizes) {
    CacheOptions opt;
    opt.write_new_tokens = false;
    PagedCache pc = build_paged_cache(c, bs, opt);
    check_cache(c, pc, bs, opt, false);
    const PagedCache full = build_paged_cache(c, bs);
    EXPECT_TRUE(same_bytes(pc.slot_mapping, full.slot_mapping));
    EXPECT_FALSE(same_bytes(pc.data, full.data));
    const std::int64_t* sm = pc.slot_mapping.data<std::int64_t>();
    reference_cache_write(pc, kv_new.view(), pe_new.view(), {sm, static_cast<std::size_t>(c.num_tokens)});
    check_cache(c, pc, bs, opt, true);
    EXPECT_TRUE(same_bytes(pc.data, full.data)) << "block size " << bs;
  }
}

TEST(PagedCache, PoisonedBlockTable) {
  const Case c = generate_case(varied_spec());
  for (int bs : kBlockSizes) {
    CacheOptions opt;
    opt.poison_block_table = true;
    const PagedCache pc = build_paged_cache(c, bs, opt);
    check_cache(c, pc, bs, opt, true);
    // Same blocks as the plain table; only the unused entries change.
    const PagedCache plain = build_paged_cache(c, bs);
    int poisoned = 0;
    for (int i = 0; i < c.num_requests; ++i)
      for (int j = 0; j < pc.table_width; ++j) {
        const bool unused = j >= ceil_div(c.seq_lens[i], bs);
        EXPECT_EQ(table_at(pc, i, j), unused ? kPoisonBlockId : table_at(plain, i, j));
        EXPECT_EQ(table_at(plain, i, j) == 0, unused);
        poisoned += unused;
      }
    EXPECT_GT(poisoned, 0) << "the padding request alone leaves a whole row unused";
    EXPECT_TRUE(same_bytes(pc.data, plain.data));
  }
}

TEST(PagedCache, SpareBlocksOption) {
  const Case c = generate_case(varied_spec());
  for (int spare : {0, 1, 5}) {
    CacheOptions opt;
    opt.spare_blocks = spare;
    check_cache(c, build_paged_cache(c, 32, opt), 32, opt, true);
  }
  CacheOptions bad;
  bad.spare_blocks = -1;
  EXPECT_THROW(build_paged_cache(c, 32, bad), InputError);
  EXPECT_THROW(build_paged_cache(c, 24), InvalidCase);
  EXPECT_THROW(build_paged_cache(c, 0), InvalidCase);
}

// Used ids of every request's blocks in table order; logical block k + 1 sits at k.
std::vector<std::int32_t> used_ids(const Case& c, const PagedCache& pc) {
  std::vector<std::int32_t> ids;
  for (int i = 0; i < c.num_requests; ++i)
    for (int j = 0; j < ceil_div(c.seq_lens[i], pc.block_size); ++j) ids.push_back(table_at(pc, i, j));
  return ids;
}

TEST(PagedCache, PermutationDependsOnSeedAndIsNotIdentity) {
  const Case c0 = generate_case(varied_spec(DType::kBF16, 0));
  const Case c1 = generate_case(varied_spec(DType::kBF16, 1));
  for (int bs : {1, 16, 32}) {
    SCOPED_TRACE("block size " + std::to_string(bs));
    const std::vector<std::int32_t> a = used_ids(c0, build_paged_cache(c0, bs));
    const std::vector<std::int32_t> b = used_ids(c1, build_paged_cache(c1, bs));
    EXPECT_NE(a, b);
    int fixed = 0;
    for (std::size_t k = 0; k < a.size(); ++k) fixed += a[k] == static_cast<std::int32_t>(k + 1);
    // A random permutation has one fixed point on average.
    EXPECT_LT(fixed, static_cast<int>(a.size()) / 4) << "of " << a.size() << " blocks";
  }
}

// Over many seeds every request lands on every block equally often. A
// Fisher-Yates off-by-one (Sattolo's algorithm: never a fixed point) or a
// biased index fails the chi-square.
TEST(PagedCache, PermutationIsUniform) {
  constexpr int kSeeds = 2000, kBlocks = 6;
  std::vector<int> count(kBlocks * kBlocks, 0);
  CaseSpec s;
  s.batch = BatchSpec{.name = "ones", .seq_lens = std::vector<int>(kBlocks, 1),
                      .query_lens = std::vector<int>(kBlocks, 1), .note = {}};
  s.dims = Dims{8, 8, 8, 8};
  s.total_heads = 1;
  // The permutation reads only the seed; the data need not be redrawn per seed.
  Case c = generate_case(s);
  CacheOptions opt;
  opt.spare_blocks = 0;
  for (int seed = 0; seed < kSeeds; ++seed) {
    c.spec.seed = static_cast<std::uint64_t>(seed);
    const PagedCache pc = build_paged_cache(c, 1, opt);
    for (int i = 0; i < kBlocks; ++i) ++count[i * kBlocks + table_at(pc, i, 0) - 1];
  }
  const double expect = static_cast<double>(kSeeds) / kBlocks;
  double chi2 = 0;
  for (int n : count) chi2 += (n - expect) * (n - expect) / expect;
  EXPECT_LT(chi2, 60.0) << "chi-square, 25 dof: p ~ 1e-4 at 55";
}

// The permutation is drawn from the case generator: pinned like its other bits
// (re-pin only with a gen::kGeneratorVersion bump).
TEST(PagedCache, PinnedBlockTables) {
  CaseSpec s;
  s.batch = BatchSpec{.name = "mixed_small", .seq_lens = {32, 40, 48, 56}, .query_lens = {1, 1, 5, 5}, .note = {}};
  s.tp = 16;
  s.seed = 3;
  const Case c = generate_case(s);
  const PagedCache p16 = build_paged_cache(c, 16), p64 = build_paged_cache(c, 64);
  auto table = [](const PagedCache& pc) {
    const std::int32_t* bt = pc.block_table.data<std::int32_t>();
    return std::vector<std::int32_t>(bt, bt + pc.block_table.numel());
  };
  EXPECT_EQ(table(p16), (std::vector<std::int32_t>{11, 9, 0, 0, 0, 0, 0, 0, 3,  6, 2, 0, 0, 0, 0, 0,
                                                   5,  8, 4, 0, 0, 0, 0, 0, 10, 12, 1, 7, 0, 0, 0, 0}));
  EXPECT_EQ(table(p64), (std::vector<std::int32_t>{3, 0, 4, 0, 1, 0, 2, 0}));
}

TEST(PagedCache, SameCaseBuildsIdenticalCaches) {
  for (int bs : {16, 64}) {
    const Case a = generate_case(varied_spec(DType::kF16, 9));
    const Case b = generate_case(varied_spec(DType::kF16, 9));
    const PagedCache x = build_paged_cache(a, bs), y = build_paged_cache(b, bs);
    EXPECT_TRUE(same_bytes(x.data, y.data));
    EXPECT_TRUE(same_bytes(x.block_table, y.block_table));
    EXPECT_TRUE(same_bytes(x.slot_mapping, y.slot_mapping));
  }
}

TEST(PagedCache, ReferenceWriterSkipsNegativeAndChecksRange) {
  const Case c = generate_case(varied_spec());
  PagedCache pc = build_paged_cache(c, 16);
  const PageStore before = pc.data;
  const std::int64_t L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim;
  const TensorView kv{c.kv_c.dtype(), {1, L}, const_cast<std::byte*>(c.kv_c.bytes())};
  const TensorView pe{c.k_pe.dtype(), {1, R}, const_cast<std::byte*>(c.k_pe.bytes())};
  const std::int64_t skip[] = {-1};
  reference_cache_write(pc, kv, pe, skip);
  EXPECT_TRUE(same_bytes(pc.data, before));
  const std::int64_t past_end[] = {static_cast<std::int64_t>(pc.num_blocks) * 16};
  EXPECT_THROW(reference_cache_write(pc, kv, pe, past_end), std::out_of_range);
  const Tensor f16_rows(DType::kF16, {1, L});
  const std::int64_t zero[] = {0};
  EXPECT_THROW(reference_cache_write(pc, f16_rows.view(), pe, zero), std::invalid_argument);
}

}  // namespace
}  // namespace mlagate
