// Memory layouts (cases/LAYOUTS.md): the layout's name, id and validation;
// the cache each places (shared prefix pages, the case's pages past 2^31 and
// 2^32 bytes of an unbacked pool, a layer of a stacked cache); that every
// placement holds the same entries as the contiguous cache; and that a pool
// past 4 GiB costs the memory of its pages only.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "cases/case.h"
#include "cases/errors.h"
#include "cases/paged_cache.h"

namespace mlagate {
namespace {

CaseSpec decode_spec(LayoutSpec layout) {
  CaseSpec s;
  s.batch = {"layout_t", {600, 520, 1100, 0, 700}, {1, 1, 1, 1, 1}};
  s.total_heads = 8;
  s.layout = layout;
  return s;
}

// The entry bytes of every key of every request, through the block table.
std::vector<std::byte> keys_in_order(const Case& c, const PagedCache& pc) {
  std::vector<std::byte> out, e(static_cast<std::size_t>(pc.entry_bytes));
  for (int i = 0; i < c.num_requests; ++i)
    for (int p = 0; p < c.seq_lens[static_cast<std::size_t>(i)]; ++p) {
      pc.load_entry(pc.slot_of(i, p), e.data());
      out.insert(out.end(), e.begin(), e.end());
    }
  return out;
}

// Resident set of this process in bytes (Linux).
std::int64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * 4096;
}

TEST(Layout, NamesParseBackAndGoIntoTheId) {
  for (const char* n : {"contiguous", "strided", "shared", "pool2g", "pool4g", "strided+shared+pool4g", "shared+pool2g"})
    EXPECT_EQ(layout_name(parse_layout(n)), n);
  EXPECT_TRUE(parse_layout("contiguous").contiguous());
  for (const char* bad : {"", "stride", "pool4g+pool2g", "strided+strided", "strided+", "+shared", "contiguous+shared"})
    EXPECT_THROW(parse_layout(bad), InputError) << bad;
  CaseSpec s = decode_spec({});
  EXPECT_EQ(s.id().find("/layout="), std::string::npos) << "contiguous cases keep their ids";
  s.layout = parse_layout("shared+pool4g");
  EXPECT_NE(s.id().find("/layout=shared+pool4g"), std::string::npos) << s.id();
  EXPECT_EQ(parse_layout("pool4g").pool_floor_bytes(), std::int64_t{1} << 32);
}

TEST(Layout, SharedNeedsTwoRequestsWithContextAndMergeCasesNone) {
  CaseSpec s = decode_spec({.shared = true});
  EXPECT_NO_THROW(s.validate());
  s.batch = {"one", {64, 1}, {1, 1}};  // the second request has no context
  EXPECT_THROW(s.validate(), InvalidCase);
  CaseSpec m;
  m.batch = {"m", {4}, {4}};
  m.merge.head_dim = 64;
  m.layout.strided = true;
  EXPECT_THROW(m.validate(), InvalidCase);
}

TEST(Layout, SharedPrefixRowsAreEqualAndTheirFullBlocksOnePage) {
  const Case c = generate_case(decode_spec({.shared = true}));
  const int prefix = shared_prefix_tokens(c.spec);
  EXPECT_EQ(prefix, 519);  // the smallest context, of the 520-token request
  const std::int64_t L = c.spec.dims.kv_lora_rank;
  for (int i : {1, 2, 4})
    EXPECT_EQ(std::memcmp(c.kv_c.bytes() + c.kv_start_loc[i] * L * 2, c.kv_c.bytes(), static_cast<std::size_t>(prefix * L * 2)), 0)
        << "request " << i << " holds the prefix of request 0";
  for (int bs : {1, 16, 64, 128}) {
    const PagedCache pc = build_paged_cache(c, bs);
    const int shared_blocks = prefix / bs;
    const std::int32_t* t = pc.block_table.data<std::int32_t>();
    std::set<std::int32_t> distinct;
    for (int i = 0; i < c.num_requests; ++i)
      for (int j = 0; j * bs < c.seq_lens[static_cast<std::size_t>(i)]; ++j) {
        const std::int32_t id = t[i * pc.table_width + j];
        distinct.insert(id);
        if (j < shared_blocks && i != 3) EXPECT_EQ(id, t[j]) << "bs " << bs << " request " << i << " block " << j;
      }
    EXPECT_EQ(static_cast<int>(distinct.size()), pc.used_blocks) << "bs " << bs;
    // The same keys as the contiguous layout's cache (the same inputs but for the copied prefix rows).
    CaseSpec plain = c.spec;
    plain.layout = {};
    Case pc_case = generate_case(plain);
    pc_case.kv_c = c.kv_c;
    pc_case.k_pe = c.k_pe;
    EXPECT_EQ(keys_in_order(c, pc), keys_in_order(pc_case, build_paged_cache(pc_case, bs))) << "bs " << bs;
  }
}

TEST(Layout, PoolsPlaceTheCasesPagesPastTheirFloorWithoutBackingTheGap) {
  const Case plain = generate_case(decode_spec({}));
  for (const PoolSize pool : {PoolSize::k2G, PoolSize::k4G}) {
    CaseSpec s = decode_spec({.pool = pool});
    const Case c = generate_case(s);
    for (int bs : {16, 64}) {
      const std::int64_t before = resident_bytes();
      const PagedCache pc = build_paged_cache(c, bs);
      const std::int64_t grew = resident_bytes() - before;
      const std::int64_t floor = s.layout.pool_floor_bytes();
      EXPECT_GT(static_cast<std::int64_t>(pc.data.nbytes()), floor);
      const std::int32_t* t = pc.block_table.data<std::int32_t>();
      for (int i = 0; i < c.num_requests; ++i)
        for (int j = 0; j * bs < c.seq_lens[static_cast<std::size_t>(i)]; ++j)
          EXPECT_GT(t[i * pc.table_width + j] * pc.block_bytes, floor) << "bs " << bs;
      // The live bytes: the null block, the spares and the case's blocks, a few MB.
      const std::int64_t live = (1 + pc.options.spare_blocks + pc.used_blocks) * pc.block_bytes;
      EXPECT_LT(grew, live + (std::int64_t{64} << 20)) << "a " << pc.data.nbytes() << "-byte pool backed " << grew << " bytes";
      EXPECT_EQ(keys_in_order(c, pc), keys_in_order(plain, build_paged_cache(plain, bs)));
      // A copy copies the live bytes and keeps the placement (and the gap unbacked).
      const std::int64_t before_copy = resident_bytes();
      const PagedCache copy = pc;
      EXPECT_LT(resident_bytes() - before_copy, live + (std::int64_t{64} << 20));
      EXPECT_EQ(copy.data.placement(), pc.data.placement());
      EXPECT_EQ(keys_in_order(c, copy), keys_in_order(c, pc));
    }
  }
}

TEST(Layout, AStridedCacheIsOneLayerOfAStackAndItsNeighboursAreChecked) {
  const Case c = generate_case(decode_spec({.strided = true}));
  const Case plain = generate_case(decode_spec({}));
  PagedCache pc = build_paged_cache(c, 16);
  const PagedCache contiguous = build_paged_cache(plain, 16);
  ASSERT_GT(pc.data.placement().before, 0);
  ASSERT_GT(pc.data.placement().after, 0);
  EXPECT_EQ(pc.data.bytes() - pc.data.allocation(), pc.data.placement().before);
  EXPECT_EQ(std::memcmp(pc.data.bytes(), contiguous.data.bytes(), pc.data.nbytes()), 0) << "the layer holds the same bytes";
  EXPECT_EQ(pc.data.check_other_layers(), "");
  EXPECT_EQ(first_cache_difference(pc, contiguous, {}, {}), "");
  // A write one byte past the layer's end is seen, by the check and by the cache comparison.
  const_cast<std::byte*>(pc.data.bytes())[pc.data.nbytes()] = std::byte{0};
  EXPECT_NE(pc.data.check_other_layers().find("layer after the cache changed: byte 0"), std::string::npos)
      << pc.data.check_other_layers();
  EXPECT_NE(first_cache_difference(pc, contiguous, {}, {}).find("outside the cache's layer"), std::string::npos);
}

}  // namespace
}  // namespace mlagate

namespace mlagate {
namespace {

// What the GPU adapters copy of a strided view (gpu::upload_view, the
// packed outputs): span_bytes ends at the last element, not at the last
// row's padding; pack_into / unpack_from move exactly the view's elements,
// leaving the bytes between its rows alone.
TEST(Layout, AStridedViewsSpanPackAndUnpackTouchOnlyItsElements) {
  // A [2, 3, 4] uint16 view with rows of 6 (2 elements of padding per head row).
  std::vector<std::uint16_t> buf(2 * 3 * 6, 0xEEEE);
  for (std::size_t i = 0; i < buf.size(); ++i)
    if (i % 6 < 4) buf[i] = static_cast<std::uint16_t>(i);
  TensorView v{DType::kBF16, {2, 3, 4}, buf.data()};
  v.strides = {18, 6, 1};
  EXPECT_FALSE(v.contiguous());
  EXPECT_EQ(v.span_bytes(), 68u) << "to the last element, at 1 * 18 + 2 * 6 + 3 = 33: 34 elements";
  std::vector<std::uint16_t> packed(24);
  v.pack_into(packed.data());
  for (std::size_t i = 0; i < 24; ++i) EXPECT_EQ(packed[i], static_cast<std::uint16_t>((i / 4) * 6 + i % 4)) << i;
  for (std::uint16_t& x : packed) x = static_cast<std::uint16_t>(x + 1000);
  v.unpack_from(packed.data());
  for (std::size_t i = 0; i < buf.size(); ++i)
    EXPECT_EQ(buf[i], static_cast<std::uint16_t>(i % 6 < 4 ? i + 1000 : 0xEEEE)) << i;  // the padding untouched
  // Contiguous: the whole buffer.
  const TensorView c{DType::kF32, {2, 3}, buf.data()};
  EXPECT_EQ(c.span_bytes(), c.nbytes());
  EXPECT_EQ((TensorView{DType::kF32, {0, 3}, nullptr}).span_bytes(), 0u);
}

}  // namespace
}  // namespace mlagate
