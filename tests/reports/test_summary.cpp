// Status counting, the overall verdict and the console table.
#include <gtest/gtest.h>

#include <sstream>

#include "tests/reports/snapshot.h"
#include "tests/reports/sample_records.h"

namespace mlagate {
namespace {

TEST(ReportSummary, CountsEveryStatus) {
  const std::vector<Record> records = test::sample_records();
  const StatusCounts c = count_statuses(records);
  EXPECT_EQ(c.total, 5);
  EXPECT_EQ(c.failures, 3);  // INCORRECT, NONFINITE, CRASHED
  EXPECT_EQ(c[Status::kPassed], 1);
  EXPECT_EQ(c[Status::kIncorrect], 1);
  EXPECT_EQ(c[Status::kNonfinite], 1);
  EXPECT_EQ(c[Status::kCrashed], 1);
  EXPECT_EQ(c[Status::kNotSupported], 1);
  EXPECT_EQ(c[Status::kTimeout], 0);
  EXPECT_EQ(c[Status::kSkipped], 0);
  EXPECT_EQ(c[Status::kInvalidCase], 0);
}

TEST(ReportSummary, GroupsByBackendInOrderOfAppearance) {
  const std::vector<BackendSummary> rows = summarize_by_backend(test::sample_records());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].backend, "cpu");
  EXPECT_EQ(rows[0].counts.total, 2);
  EXPECT_EQ(rows[0].counts.failures, 1);
  EXPECT_DOUBLE_EQ(rows[0].total_ms, 7.625 + 16.5);
  EXPECT_EQ(rows[1].backend, "cuda_flashmla");
  EXPECT_EQ(rows[1].counts.total, 3);
  EXPECT_EQ(rows[1].counts.failures, 2);
}

TEST(ReportSummary, VerdictNeverCallsNothingRunAPass) {
  Record r;
  r.status = Status::kPassed;
  std::vector<Record> records{r};
  EXPECT_EQ(overall_verdict(count_statuses(records)), "PASS");
  r.status = Status::kTimeout;
  records.push_back(r);
  EXPECT_EQ(overall_verdict(count_statuses(records)), "FAIL");

  r.status = Status::kSkipped;
  std::vector<Record> skipped{r};
  r.status = Status::kNotSupported;
  skipped.push_back(r);
  EXPECT_EQ(overall_verdict(count_statuses(skipped)), "NOTHING RAN");
  EXPECT_EQ(overall_verdict(count_statuses({})), "NOTHING RAN");
}

TEST(ReportSummary, TableIsAligned) {
  const std::string table = summary_table(test::sample_records());
  std::istringstream lines(table);
  std::string line;
  std::vector<std::string> all;
  while (std::getline(lines, line)) all.push_back(line);
  ASSERT_EQ(all.size(), 4u);  // header, cpu, cuda_flashmla, TOTAL
  for (const std::string& l : all) EXPECT_EQ(l.size(), all.front().size()) << l;
  EXPECT_EQ(all.back().rfind("TOTAL", 0), 0u);
}

TEST(ReportSummary, TableGolden) {
  MLAGATE_EXPECT_SNAPSHOT("summary.txt", summary_table(test::sample_records()));
}

}  // namespace
}  // namespace mlagate
