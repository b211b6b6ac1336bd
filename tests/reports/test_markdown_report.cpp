// The Markdown job summary: pinned by a golden file; table cells must not break the table
// whatever the records hold, and the file must stay under GitHub's 1 MiB step-summary limit.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <utility>

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
  EXPECT_EQ(rows, 4);  // INCORRECT, NONFINITE, CRASHED and the strict XPASS
  // Markup is escaped rather than passed through as HTML, the control character and the
  // invalid byte show as "\xNN" (its backslash escaped), and the tab and newline as spaces.
  EXPECT_NE(md.find(R"(| kernel threw: bad \<\&"'\> value\\x01 at pos next line \\xFF caf)"),
            std::string::npos)
      << md;
}

// The lines of the section titled `title`, up to the next section.
std::vector<std::string> section(const std::string& md, const std::string& title) {
  std::vector<std::string> out;
  bool in = false;
  for (const std::string& line : lines_of(md)) {
    if (line.rfind("## ", 0) == 0) in = line == "## " + title;
    else if (in) out.push_back(line);
  }
  return out;
}

// Rows of the table in `lines` (after its header and delimiter rows).
std::vector<std::string> table_rows(const std::vector<std::string>& lines) {
  std::vector<std::string> rows;
  int seen = 0;
  for (const std::string& line : lines) {
    if (line.rfind("|", 0) != 0) continue;
    if (++seen > 2) rows.push_back(line);
  }
  return rows;
}

TEST(MarkdownReport, FailuresListStrictXpassAndNoXfail) {
  const std::vector<Record> records = test::sample_records();
  const std::string md = render_markdown(records);
  const std::vector<std::string> rows = table_rows(section(md, "Failures"));
  ASSERT_EQ(rows.size(), 4u) << md;
  for (const std::size_t i : {test::kXfailNan, test::kXfailIncorrect, test::kXpassNotice})
    for (const std::string& row : rows)
      EXPECT_EQ(row.find(records[i].case_id), std::string::npos) << "record " << i << " is not a failure: " << row;
  EXPECT_NE(rows.back().find("`" + records[test::kXpassStrict].case_id + "`"), std::string::npos) << rows.back();
  EXPECT_NE(rows.back().find(" | XPASS(strict) | "), std::string::npos) << rows.back();
  EXPECT_NE(rows.back().find("the entry flashmla-h128-splitkv expects a failure"), std::string::npos) << rows.back();
  EXPECT_NE(md.find("\n9 records, 4 failures, 2 expected failures (XFAIL), 2 unexpected passes (XPASS, 1 strict).\n"),
            std::string::npos)
      << md;
}

TEST(MarkdownReport, CountsTableHasExpectationColumnsOnlyWhenUsed) {
  const std::vector<Record> records = test::sample_records();
  const std::string md = render_markdown(records);
  EXPECT_NE(md.find("| BATCH_VARIANT | XFAIL | XPASS | time |\n"), std::string::npos) << md;
  // TOTAL: 1 NONFINITE (the unexpected one only), 2 XFAIL, 2 XPASS; every row as wide as the header.
  EXPECT_NE(md.find("| **TOTAL** | 1 | 1 | 1 | 1 | 0 | 1 | 0 | 0 | 0 | 0 | 2 | 2 |"), std::string::npos) << md;
  const std::vector<std::string> lines = lines_of(md);
  const auto header = std::find_if(lines.begin(), lines.end(), [](const std::string& l) { return l.rfind("| backend |", 0) == 0; });
  ASSERT_NE(header, lines.end());
  for (auto it = header; it != lines.end() && it->rfind("|", 0) == 0; ++it)
    EXPECT_EQ(count_separators(*it), count_separators(*header)) << *it;

  const std::string plain = render_markdown(std::span(records).first(5));
  EXPECT_EQ(plain.find("XFAIL"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("XPASS"), std::string::npos) << plain;
  EXPECT_NE(plain.find("\n5 records, 3 failures.\n"), std::string::npos) << plain;
}

TEST(MarkdownReport, XfailSectionGroupsByEntry) {
  const std::vector<Record> records = test::sample_records();
  const std::string md = render_markdown(records);
  const std::vector<std::string> rows = table_rows(section(md, "Expected failures (XFAIL)"));
  ASSERT_EQ(rows.size(), 1u) << md;  // two records, one entry
  // The entry, its count, both statuses, the reason escaped, the link as an autolink and
  // the first record as the example.
  EXPECT_EQ(rows[0],
            "| `flashmla-fp8-long-context` | 2 | NONFINITE, INCORRECT | fp8 dequant overflows when \\|k\\| \\> 448: "
            "\\<Inf\\> becomes NaN \\& spreads | <https://github.com/example/FlashMLA/issues/42> | "
            "`decode b=1 kv=[8192] h=16 bs=64 seed=5 enc=fp8` (cuda\\_flashmla, decode) |");
  EXPECT_EQ(count_separators(rows[0]), 7);
}

TEST(MarkdownReport, XpassSectionListsStrictFirst) {
  std::vector<Record> records = test::sample_records();
  std::swap(records[test::kXpassStrict], records[test::kXpassNotice]);  // the strict one last in the run
  const std::string md = render_markdown(records);
  const std::vector<std::string> rows = table_rows(section(md, "Unexpected passes (XPASS)"));
  ASSERT_EQ(rows.size(), 2u) << md;
  EXPECT_NE(rows[0].find(" | XPASS(strict) | `flashmla-h128-splitkv` | "), std::string::npos) << rows[0];
  EXPECT_NE(rows[1].find(" | XPASS | `flashmla-prefill-streams` | "), std::string::npos) << rows[1];
  EXPECT_NE(rows[1].find(" | `FLASHMLA-17` |"), std::string::npos) << "a link that is no URL is code: " << rows[1];
  for (const std::string& row : rows) EXPECT_EQ(count_separators(row), 8) << row;
}

TEST(MarkdownReport, VerdictIsPassWithOnlyExpectedFailures) {
  const std::vector<Record> records = test::sample_records();
  const std::vector<Record> xfails{records[test::kXfailNan], records[test::kXfailIncorrect]};
  const std::string md = render_markdown(xfails);
  EXPECT_EQ(lines_of(md).front(), "# mlagate: PASS");
  EXPECT_EQ(md.find("## Failures"), std::string::npos) << md;
  EXPECT_NE(md.find("## Expected failures (XFAIL)"), std::string::npos) << md;
  EXPECT_NE(md.find("\n2 records, 0 failures, 2 expected failures (XFAIL), 0 unexpected passes (XPASS).\n"),
            std::string::npos)
      << md;
  // A non-strict XPASS is a notice: still PASS; a strict one fails the run.
  EXPECT_EQ(lines_of(render_markdown(std::span(records).subspan(test::kXpassNotice, 1))).front(), "# mlagate: PASS");
  const std::string strict = render_markdown(std::span(records).subspan(test::kXpassStrict, 1));
  EXPECT_EQ(lines_of(strict).front(), "# mlagate: FAIL");
  EXPECT_NE(strict.find("## Failures"), std::string::npos);
}

TEST(MarkdownReport, AHostileLinkStaysInert) {
  std::vector<Record> records = test::sample_records();
  records[test::kXfailNan].expected.link = "https://x.example/a|b <script>";
  records[test::kXfailIncorrect].expected.link = records[test::kXfailNan].expected.link;
  const std::string md = render_markdown(records);
  const std::vector<std::string> rows = table_rows(section(md, "Expected failures (XFAIL)"));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_NE(rows[0].find(" | `https://x.example/a\\|b <script>` | "), std::string::npos) << rows[0];
  EXPECT_EQ(count_separators(rows[0]), 7) << rows[0];
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

// The same with --expect outcomes: 10,000 failures, 10,000 strict XPASS and 10,000 XFAIL of
// as many entries, every string long and hostile: the file stays under 1 MiB, each table is
// capped, and the failure table still holds kMarkdownMaxFailureRows rows.
TEST(MarkdownReport, StaysSmallForHugeRunsWithExpectations) {
  const std::string text(5000, '|');
  std::vector<Record> records;
  for (int i = 0; i < 30000; ++i) {
    Record r;
    r.case_id = "case " + std::to_string(i) + " " + std::string(5000, '`');
    r.backend = "backend" + std::to_string(i % 3);
    r.op = "decode";
    r.status = i % 3 == 1 ? Status::kPassed : Status::kIncorrect;
    r.message = text;
    r.repro = text;
    if (i % 3 != 0) {
      r.expected.outcome = i % 3 == 1 ? Expected::kXpass : Expected::kXfail;
      r.expected.entry = "entry" + std::to_string(i) + std::string(5000, '_');
      r.expected.reason = text;
      r.expected.link = "https://example.com/" + std::string(5000, '|');
    }
    records.push_back(std::move(r));
  }
  const std::string md = render_markdown(records);
  EXPECT_LT(md.size(), 1u << 20);
  EXPECT_EQ(lines_of(md).front(), "# mlagate: FAIL");
  EXPECT_NE(md.find("\n30000 records, 20000 failures, 10000 expected failures (XFAIL), 10000 unexpected passes "
                    "(XPASS, 10000 strict).\n"),
            std::string::npos);
  EXPECT_NE(md.find("\n... and 19800 more failures (see the JSON report)\n"), std::string::npos);
  EXPECT_EQ(table_rows(section(md, "Failures")).size(), kMarkdownMaxFailureRows);
  EXPECT_NE(md.find("\n... and 9950 more XPASS records (see the JSON report)\n"), std::string::npos);
  EXPECT_NE(md.find("\n... and 9950 more entries (see the JSON report)\n"), std::string::npos);
  // Separators per row: 7 columns in the failure and XPASS tables, 6 in the XFAIL table.
  for (const auto& [title, separators] : {std::pair{"Failures", 8}, std::pair{"Unexpected passes (XPASS)", 8},
                                          std::pair{"Expected failures (XFAIL)", 7}})
    for (const std::string& row : table_rows(section(md, title))) EXPECT_EQ(count_separators(row), separators) << title;
}

}  // namespace
}  // namespace mlagate
