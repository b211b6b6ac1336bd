// Golden-file comparison for the report tests: expected/<name> pins a format byte for byte.
// Set MLAGATE_UPDATE_SNAPSHOTS=1 to rewrite the files after an intended change (the tests
// that rewrote one are reported as skipped, never as passed); review the diff before committing.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace mlagate::test {

bool update_snapshots();
std::string read_snapshot(const std::string& name);
void write_snapshot(const std::string& name, const std::string& text);

}  // namespace mlagate::test

#define MLAGATE_EXPECT_SNAPSHOT(name, actual)                                      \
  do {                                                                           \
    if (::mlagate::test::update_snapshots()) {                                      \
      ::mlagate::test::write_snapshot(name, actual);                               \
      GTEST_SKIP() << "rewrote expected/" << (name);                             \
    }                                                                            \
    EXPECT_EQ(::mlagate::test::read_snapshot(name), actual) << "expected/" << (name); \
  } while (0)
