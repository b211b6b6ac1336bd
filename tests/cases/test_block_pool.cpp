// The pool of large blocks behind Tensor's storage (cases/block_pool.h): a
// freed block serves the next request of its size, the limit holds, and a
// tensor made on a reused block holds what its constructor says (zeros), not
// the bytes of the tensor before it.
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

TEST_F(BlockPool, ASmallRequestDoesNotTakeAFarLargerBlock) {
  void* big = block_pool_take(100 * kMiB);
  block_pool_give(big, 100 * kMiB);
  const std::size_t fresh = block_pool_stats().fresh;
  void* small = block_pool_take(5 * kMiB);
  EXPECT_NE(small, big);
  EXPECT_EQ(block_pool_stats().fresh, fresh + 1);
  block_pool_give(small, 5 * kMiB);
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

}  // namespace
}  // namespace mlagate
