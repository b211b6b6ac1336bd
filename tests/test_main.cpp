// Shared gtest main for every test binary.
#include <gtest/gtest.h>

#include "harness/run/allocator.h"

int main(int argc, char** argv) {
  mlagate::keep_freed_memory();  // suites run in-process here too
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
