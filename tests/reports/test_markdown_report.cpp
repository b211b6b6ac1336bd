// The Markdown job summary: pinned by a golden file; table cells must not break the table
// whatever the records hold, and the file must stay under GitHub's 1 MiB step-summary limit.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "tests/reports/snapshot.h"
#include "tests/reports/sample_records.h"

namespace mlagate {
namespace {

std::string render_markdown(std::span<const Record> records) {
  std::ostringstream os;
  write_markdown(os, test::sample_run(), records);
  return os.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Cell separators of a GFM table row: pipes not escaped by a backslash.
int count_separators(const std::string& row) {
  int n = 0;
  for (std::size_t i = 0; i < row.size(); ++i) {
    if (row[i] == '\\') {
      ++i;
    } else if (row[i] == '|') {
      ++n;
    }
  }
  return n;
}

TEST(MarkdownReport, Snapshot) {
  MLAGATE_EXPECT_SNAPSHOT("report.md", render_markdown(test::sample_records()));
}

TEST(MarkdownReport, TitleCarriesTheVerdict) {
  const std::vector<Record> records = test::sample_records();
  EXPECT_EQ(lines_of(render_markdown(records)).front(), "# mlagate: FAIL");
  const std::string pass = render_markdown(std::span(records).first(1));
  EXPECT_EQ(lines_of(pass).front(), "# mlagate: PASS");
  EXPECT_EQ(pass.find("## Failures"), std::string::npos);
  EXPECT_EQ(lines_of(render_markdown({})).front(), "# mlagate: NOTHING RAN");
}

TEST(MarkdownReport, HostileCellsKeepTheTableShape) {
  std::vector<Record> records = test::sample_records();
  records[3].case_id = "id | with ` backticks `` and | pipes\nand a newline";
  records[3].repro = "`mlagate` run --case 'a|b'";
  const std::string md = render_markdown(records);
  const std::vector<std::string> lines = lines_of(md);
  const auto header = std::find(lines.begin(), lines.end(),
                                "| case | backend | op | status | max_abs | message | repro |");
  ASSERT_NE(header, lines.end());
  int rows = 0;
  for (auto it = header + 2; it != lines.end() && it->rfind("| ", 0) == 0; ++it, ++rows) {
    EXPECT_EQ(count_separators(*it), 8) << *it;
  }
  EXPECT_EQ(rows, 3);
  // Markup is escaped rather than passed through as HTML, the control character and the
  // invalid byte show as "\xNN" (its backslash escaped), and the tab and newline as spaces.
  EXPECT_NE(md.find(R"(| kernel threw: bad \<\&"'\> value\\x01 at pos next line \\xFF caf)"),
            std::string::npos)
      << md;
}

TEST(MarkdownReport, StaysSmallForHugeRuns) {
  // 10,000 failures whose every string is long and full of characters that need escaping.
  const std::string message(500, '|');
  std::vector<Record> records;
  for (int i = 0; i < 10000; ++i) {
    Record r;
    r.case_id = "case " + std::to_string(i) + " " + std::string(5000, '`');
    r.backend = "backend" + std::to_string(i % 3);
    r.op = "decode";
    r.status = i % 2 ? Status::kIncorrect : Status::kCrashed;
    r.message = message + "\n" + message;
    r.repro = std::string(5000, '|');
    Metrics m;
    m.output = "out";
    m.max_abs = 0.5;
    r.metrics.push_back(m);
    records.push_back(std::move(r));
  }
  const std::string md = render_markdown(records);
  EXPECT_LT(md.size(), 1u << 20);
  EXPECT_NE(md.find("\n... and 9800 more failures (see the JSON report)\n"), std::string::npos);

  int failure_rows = 0;
  for (const std::string& line : lines_of(md)) {
    if (line.rfind("| `", 0) == 0) {
      ++failure_rows;
      EXPECT_EQ(count_separators(line), 8);
    }
  }
  EXPECT_EQ(failure_rows, static_cast<int>(kMarkdownMaxFailureRows));
}

}  // namespace
}  // namespace mlagate
