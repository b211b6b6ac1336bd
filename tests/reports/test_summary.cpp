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
  EXPECT_EQ(c.total, 9);
  EXPECT_EQ(c.failures, 4);  // INCORRECT, NONFINITE, CRASHED, the strict XPASS
  // The records an entry made XFAIL / XPASS are counted there, not under their status.
  EXPECT_EQ(c[Status::kPassed], 1);
  EXPECT_EQ(c[Status::kIncorrect], 1);
  EXPECT_EQ(c[Status::kNonfinite], 1);
  EXPECT_EQ(c.xfail, 2);
  EXPECT_EQ(c.xpass, 2);
  EXPECT_EQ(c.xpass_strict, 1);
  std::int64_t sum = c.xfail + c.xpass;
  for (Status s : kAllStatuses) sum += c[s];
  EXPECT_EQ(sum, c.total) << "the columns partition the records";
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
  EXPECT_EQ(rows[1].counts.total, 7);
  EXPECT_EQ(rows[1].counts.failures, 3);  // NONFINITE, CRASHED, the strict XPASS
  EXPECT_EQ(rows[1].counts.xfail, 2);
  EXPECT_EQ(rows[1].counts.xpass, 2);
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

TEST(ReportSummary, VerdictCountsExpectations) {
  const std::vector<Record> records = test::sample_records();
  // Only expected failures: PASS (they ran, and failed as the entries say).
  const std::vector<Record> xfails{records[test::kXfailNan], records[test::kXfailIncorrect]};
  const StatusCounts c = count_statuses(xfails);
  EXPECT_EQ(c.failures, 0);
  EXPECT_EQ(overall_verdict(c), "PASS");
  // A non-strict XPASS is a notice; a strict one fails the run.
  EXPECT_EQ(overall_verdict(count_statuses(std::vector<Record>{records[test::kXpassNotice]})), "PASS");
  EXPECT_EQ(overall_verdict(count_statuses(std::vector<Record>{records[test::kXpassStrict]})), "FAIL");
  // The same records without their entries: two failures, and two passes.
  std::vector<Record> bare = xfails;
  for (Record& r : bare) r.expected = {};
  EXPECT_EQ(count_statuses(bare).failures, 2);
  EXPECT_EQ(overall_verdict(count_statuses(bare)), "FAIL");
}

TEST(ReportSummary, TableShowsExpectationColumnsOnlyWhenUsed) {
  const std::vector<Record> records = test::sample_records();
  const std::string with = summary_table(records);
  const std::string header = with.substr(0, with.find('\n'));
  EXPECT_NE(header.find("BATCHVAR  XFAIL  XPASS"), std::string::npos) << with;
  const std::string without = summary_table(std::span(records).first(5));
  EXPECT_EQ(without.find("XFAIL"), std::string::npos) << without;
  EXPECT_EQ(without.find("XPASS"), std::string::npos) << without;
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
