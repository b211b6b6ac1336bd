// The pool of large blocks behind Tensor's storage (cases/block_pool.h): a
// freed block serves the next request of its size, a larger one is split, a
// request larger than every kept block gathers them (their pages moved, not
// new), the limit holds, and a tensor made on a reused block holds what its
// constructor says (zeros), not the bytes of the tensor before it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cases/block_pool.h"
#include "cases/tensor.h"

namespace mlagate {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

class BlockPool : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = block_pool_limit();
    block_pool_release();
    block_pool_set_limit(256 * kMiB);
  }
  void TearDown() override {
    block_pool_release();
    block_pool_set_limit(saved_);
  }
  std::size_t saved_ = 0;
};

TEST_F(BlockPool, AFreedBlockServesTheNextRequestOfItsSize) {
  void* a = block_pool_take(10 * kMiB);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % (2 * kMiB), 0u) << "not at a huge page boundary";
  std::memset(a, 1, 10 * kMiB);
  block_pool_give(a, 10 * kMiB);
  EXPECT_GE(block_pool_stats().kept_bytes, 10 * kMiB);
  const std::size_t taken = block_pool_stats().taken;
  void* b = block_pool_take(9 * kMiB);  // a smaller request of the same or a near class
  EXPECT_EQ(b, a);
  EXPECT_EQ(block_pool_stats().taken, taken + 1);
  EXPECT_EQ(block_pool_stats().kept_bytes, 0u);
  block_pool_give(b, 9 * kMiB);  // given back under its own size: the block's size is the pool's record
  EXPECT_GE(block_pool_stats().kept_bytes, 10 * kMiB);
}

TEST_F(BlockPool, ASmallRequestTakesTheFirstPartOfALargerBlock) {
  void* big = block_pool_take(100 * kMiB);
  block_pool_give(big, 100 * kMiB);
  const BlockPoolStats before = block_pool_stats();
  void* small = block_pool_take(5 * kMiB);  // class 6 MiB: the big block's first 6 MiB
  EXPECT_EQ(small, big);
  EXPECT_EQ(block_pool_stats().fresh, before.fresh);
  EXPECT_EQ(block_pool_stats().kept_bytes, before.kept_bytes - 6 * kMiB) << "the rest of the block stays kept";
  void* rest = block_pool_take(90 * kMiB);  // served by the rest, at a huge page boundary
  EXPECT_EQ(rest, static_cast<std::byte*>(big) + 6 * kMiB);
  EXPECT_EQ(block_pool_stats().fresh, before.fresh);
  EXPECT_EQ(block_pool_stats().fresh_bytes, before.fresh_bytes);
  block_pool_give(small, 5 * kMiB);
  block_pool_give(rest, 90 * kMiB);
}

// Two kept blocks too small for a request are moved side by side into it:
// their bytes are where they were written (the pages moved, they were not
// cleared: a new page reads zero), and only the rest is new memory.
TEST_F(BlockPool, KeptBlocksTooSmallAreGatheredIntoALargerRequest) {
  void* a = block_pool_take(40 * kMiB);
  void* b = block_pool_take(24 * kMiB);
  std::memset(a, 0xA1, 40 * kMiB);
  std::memset(b, 0xB2, 24 * kMiB);
  block_pool_give(a, 40 * kMiB);
  block_pool_give(b, 24 * kMiB);
  const BlockPoolStats before = block_pool_stats();
  ASSERT_EQ(before.kept_bytes, 64 * kMiB);
  void* g = block_pool_take(80 * kMiB);
  const BlockPoolStats after = block_pool_stats();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(g) % (2 * kMiB), 0u);
  EXPECT_EQ(after.gathered, before.gathered + 1);
  EXPECT_EQ(after.fresh, before.fresh);
  EXPECT_EQ(after.fresh_bytes, before.fresh_bytes + 16 * kMiB) << "80 MiB asked, 64 MiB kept";
  EXPECT_EQ(after.kept_bytes, 0u);
  const auto* p = static_cast<const unsigned char*>(g);
  // The largest first: a's 40 MiB, then b's 24 MiB, then 16 MiB of new pages.
  EXPECT_TRUE(std::all_of(p, p + 40 * kMiB, [](unsigned char c) { return c == 0xA1; }));
  EXPECT_TRUE(std::all_of(p + 40 * kMiB, p + 64 * kMiB, [](unsigned char c) { return c == 0xB2; }));
  EXPECT_TRUE(std::all_of(p + 64 * kMiB, p + 80 * kMiB, [](unsigned char c) { return c == 0; }));
  std::memset(g, 0x5A, 80 * kMiB);  // every page of it writable
  block_pool_give(g, 80 * kMiB);
  EXPECT_EQ(block_pool_stats().kept_bytes, 80 * kMiB);
  // Gathering takes only what it needs: the last block's rest stays kept.
  void* c = block_pool_take(30 * kMiB);
  void* d = block_pool_take(20 * kMiB);
  block_pool_give(c, 30 * kMiB);
  block_pool_give(d, 20 * kMiB);
  ASSERT_EQ(block_pool_stats().kept_bytes, 80 * kMiB) << "split, not lost";
  void* e = block_pool_take(96 * kMiB);  // a size class of its own (64 + 2 x 16 MiB)
  EXPECT_EQ(block_pool_stats().fresh_bytes, after.fresh_bytes + 16 * kMiB);
  EXPECT_EQ(block_pool_stats().kept_bytes, 0u);
  block_pool_give(e, 96 * kMiB);
}

TEST_F(BlockPool, KeepsNoMoreThanItsLimit) {
  block_pool_set_limit(16 * kMiB);
  void* a = block_pool_take(10 * kMiB);
  void* b = block_pool_take(10 * kMiB);
  block_pool_give(a, 10 * kMiB);
  block_pool_give(b, 10 * kMiB);
  EXPECT_LE(block_pool_stats().kept_bytes, 16 * kMiB);
  EXPECT_GT(block_pool_stats().kept_bytes, 0u);
  block_pool_set_limit(0);  // nothing kept from here on
  EXPECT_EQ(block_pool_stats().kept_bytes, 0u);
  void* c = block_pool_take(10 * kMiB);
  block_pool_give(c, 10 * kMiB);
  EXPECT_EQ(block_pool_stats().kept_bytes, 0u);
}

TEST_F(BlockPool, ATensorOnAReusedBlockIsZeroFilledAsAFreshOne) {
  if (!kBlockPoolForTensors) GTEST_SKIP() << "AddressSanitizer build: tensors do not use the pool";
  const Shape shape{8, static_cast<std::int64_t>(kMiB)};
  {
    Tensor dirty = Tensor::for_overwrite(DType::kU8, shape);
    std::memset(dirty.bytes(), 0xA5, dirty.nbytes());
  }
  const std::size_t taken = block_pool_stats().taken;
  const Tensor t(DType::kU8, shape);
  ASSERT_EQ(block_pool_stats().taken, taken + 1) << "the tensor did not get the freed block: the test proves nothing";
  EXPECT_TRUE(std::all_of(t.bytes(), t.bytes() + t.nbytes(), [](std::byte b) { return b == std::byte{0}; }));
  // A copy on a reused block holds the source's bytes.
  Tensor src = Tensor::for_overwrite(DType::kU8, shape);
  for (std::size_t i = 0; i < src.nbytes(); ++i) src.bytes()[i] = static_cast<std::byte>(i * 7 + 3);
  { Tensor gone = Tensor::for_overwrite(DType::kU8, shape); }
  const Tensor copy(src);
  EXPECT_EQ(std::memcmp(copy.bytes(), src.bytes(), src.nbytes()), 0);
}

// MLAGATE_BLOCK_POOL_MB's values as the pool and the run's queue (which
// counts what workers keep) both read them: whole MiB up to a pebibyte, else
// nothing (the pool's default).
TEST(BlockPoolVariable, WholeMebibytesOrNothing) {
  EXPECT_EQ(block_pool_bytes_of("12"), 12 * kMiB);
  EXPECT_EQ(block_pool_bytes_of("0"), 0u);
  EXPECT_EQ(block_pool_bytes_of("1073741824"), std::size_t{1} << 50);
  for (const char* bad : {"1073741825", "-1", "+1", "12MB", "1.5", "", " 12"})
    EXPECT_EQ(block_pool_bytes_of(bad), std::nullopt) << bad;
  EXPECT_EQ(block_pool_bytes_of(nullptr), std::nullopt);
}

}  // namespace
}  // namespace mlagate
