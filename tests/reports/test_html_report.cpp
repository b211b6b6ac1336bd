// The HTML report: pinned by a snapshot (expected/report.html), and checked for what a
// reader relies on: the verdict, the counts table, every record with its repro command,
// failures first, markup from records escaped (text and embedded JSON alike), the embedded
// map data readable, and nothing loaded from the network. That its script runs without an
// error in a browser is html_render_check.sh's job (headless Chromium).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "tests/reports/sample_records.h"
#include "tests/reports/snapshot.h"

namespace mlagate {
namespace {

std::string render_html(const std::vector<Record>& records, const RunInfo& run = test::sample_run()) {
  std::ostringstream os;
  write_html(os, run, records);
  return os.str();
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// The embedded data: the text of <script type="application/json" id="mlagate-data">.
nlohmann::json embedded_data(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"mlagate-data\">";
  const std::size_t begin = html.find(open);
  if (begin == std::string::npos) return nullptr;
  const std::size_t end = html.find("</script>", begin);
  return nlohmann::json::parse(html.substr(begin + open.size(), end - begin - open.size()));
}

TEST(HtmlReport, Snapshot) { MLAGATE_EXPECT_SNAPSHOT("report.html", render_html(test::sample_records())); }

TEST(HtmlReport, SummaryTableAndEveryRecordWithItsRepro) {
  const std::vector<Record> records = test::sample_records();
  const std::string html = render_html(records);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>\n", 0), 0u);
  EXPECT_NE(html.find("<title>mlagate: FAIL</title>"), std::string::npos);
  EXPECT_NE(html.find("<span class=\"verdict fail\">FAIL</span>"), std::string::npos);
  EXPECT_NE(html.find("<table class=\"counts\">"), std::string::npos);
  for (Status s : kAllStatuses) EXPECT_NE(html.find("<th>" + std::string(status_name(s)) + "</th>"), std::string::npos);
  EXPECT_NE(html.find("<tr class=\"total\"><td>TOTAL</td>"), std::string::npos);
  EXPECT_NE(html.find("<code>mlagate run --suite smoke --backend cpu,cuda_flashmla --json out/r.json</code>"),
            std::string::npos);
  for (std::size_t i = 0; i < records.size(); ++i) {
    EXPECT_NE(html.find(">" + records[i].case_id + "</a>"), std::string::npos) << records[i].case_id;
    EXPECT_NE(html.find("id=\"rec-" + std::to_string(i) + "\""), std::string::npos);
  }
  // Repro commands are selectable code with a copy button; their quotes are escaped.
  EXPECT_NE(html.find("<code class=\"repro\">mlagate run --case &#39;decode b=2 kv=[37,512] h=16 bs=64 seed=1&#39; "
                      "--backend cpu</code><button class=\"copy\" type=\"button\">copy</button>"),
            std::string::npos);
  EXPECT_NE(html.find("id=\"filter\""), std::string::npos);
}

TEST(HtmlReport, FailuresComeFirst) {
  const std::string html = render_html(test::sample_records());
  // Records 1 (INCORRECT), 2 (NONFINITE) and 3 (CRASHED) before 0 (PASSED) and 4 (NOT_SUPPORTED).
  std::vector<std::size_t> at;
  for (int i : {1, 2, 3, 0, 4}) at.push_back(html.find("<tr data-index=\"" + std::to_string(i) + "\""));
  for (std::size_t k = 0; k < at.size(); ++k) ASSERT_NE(at[k], std::string::npos) << k;
  for (std::size_t k = 1; k < at.size(); ++k) EXPECT_LT(at[k - 1], at[k]) << k;
  EXPECT_NE(html.find("<tr data-index=\"1\" data-failure=\"1\">"), std::string::npos);
  EXPECT_NE(html.find("<tr data-index=\"0\" data-failure=\"0\">"), std::string::npos);
  // The first failures' sections are open, so their maps are drawn at load.
  EXPECT_NE(html.find("<details class=\"rec\" id=\"rec-1\" open>"), std::string::npos);
  EXPECT_NE(html.find("<details class=\"rec\" id=\"rec-0\">"), std::string::npos);
}

TEST(HtmlReport, TheFailingOutputsSectionIsTheOpenOne) {
  std::vector<Record> records = test::sample_records();
  Record& r = records[1];
  ASSERT_GE(r.metrics.size(), 2u);
  r.metrics[1].worst_elements = r.metrics[0].worst_elements;  // lse gets a section too
  // Record 1's section of the page.
  const auto section = [](const std::string& html) {
    const std::size_t at = html.find("<details class=\"rec\" id=\"rec-1\"");
    return html.substr(at, html.find("<details class=\"rec\"", at + 1) - at);
  };
  const std::string out = "<details class=\"out\" open><summary>out: ";
  const std::string lse = "<details class=\"out\" open><summary>lse: ";
  std::string sec = section(render_html(records));
  EXPECT_NE(sec.find(out), std::string::npos);
  EXPECT_EQ(sec.find(lse), std::string::npos);
  r.metrics[0].passed = true;  // out passes, lse fails: lse is the open one
  r.metrics[1].passed = false;
  sec = section(render_html(records));
  EXPECT_EQ(sec.find(out), std::string::npos);
  EXPECT_NE(sec.find(lse), std::string::npos);
}

TEST(HtmlReport, MarkupFromRecordsIsEscaped) {
  std::vector<Record> records = test::sample_records();
  records[0].message = "<script>alert(1)</script>";
  records[0].case_id = "id <b>&\"quoted\"</b>";
  records[0].repro = "mlagate run --case 'x<y>' && echo \"z\"";
  records[1].metrics[0].output = "</script><script>alert(2)</script>";
  records[1].details = "<img src=x onerror=alert(3)>";
  const std::string html = render_html(records);
  EXPECT_EQ(html.find("<script>alert(1)"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(html.find("id &lt;b&gt;&amp;&quot;quoted&quot;&lt;/b&gt;"), std::string::npos);
  EXPECT_NE(html.find("--case &#39;x&lt;y&gt;&#39; &amp;&amp; echo &quot;z&quot;</code>"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("alert(2)</script>"), std::string::npos);
  // Exactly the report's own two scripts: the data and the code.
  EXPECT_EQ(count(html, "<script"), 2u);
  EXPECT_EQ(count(html, "</script>"), 2u);
  // The output name went into the embedded JSON with '<' escaped, and reads back intact.
  const nlohmann::json data = embedded_data(html);
  ASSERT_TRUE(data.is_object());
  EXPECT_EQ(data["records"]["1"][0]["output"], "</script><script>alert(2)</script>");
}

TEST(HtmlReport, HostileMessageStaysText) {
  const std::string html = render_html(test::sample_records());
  // kHostileMessage: markup escaped, the control character and the invalid byte as \xNN.
  EXPECT_NE(html.find("kernel threw: bad &lt;&amp;&quot;&#39;&gt; value\\x01 at\tpos\nnext line \\xFF caf\xC3\xA9"),
            std::string::npos);
}

TEST(HtmlReport, LoadsNothingFromTheNetwork) {
  const std::string html = render_html(test::sample_records());
  for (const char* bad : {"src=\"http", "href=\"http", "@import", "url(http", "src='http", "href='http", "<link",
                          "<iframe", "http://", "https://"})
    EXPECT_EQ(html.find(bad), std::string::npos) << bad;
  EXPECT_EQ(html.find(" src="), std::string::npos);  // no external script or image at all
}

TEST(HtmlReport, EmbedsTheErrorMaps) {
  const std::vector<Record> records = test::sample_records();
  const std::string html = render_html(records);
  const nlohmann::json data = embedded_data(html);
  ASSERT_TRUE(data.is_object());
  // Only records with maps: the INCORRECT (out) and the NONFINITE one.
  EXPECT_EQ(data["records"].size(), 2u);
  const nlohmann::json& out = data["records"]["1"][0];
  EXPECT_EQ(out["output"], "out");
  EXPECT_EQ(out["rows"], 3);
  EXPECT_EQ(out["cols"], 128);
  EXPECT_EQ(out["dim"], 512);
  EXPECT_EQ(out["query_lens"], nlohmann::json::array({1, 1, 1}));
  EXPECT_EQ(out["map"].get<std::string>().size(), (3u * 128 * 4 + 2) / 3 * 4);  // base64 of the floats
  EXPECT_NE(html.find("<div class=\"mapbox\" data-rec=\"1\" data-out=\"0\"></div>"), std::string::npos);
  // Worst elements are a table in the page itself.
  EXPECT_NE(html.find("<td class=\"n\">54151</td><td class=\"n\">0.5123</td><td class=\"n\">0.5</td>"
                      "<td class=\"n\">0.0123</td>"),
            std::string::npos);
  EXPECT_NE(html.find("data-rendered"), std::string::npos);  // the script marks the page when it is done
}

TEST(HtmlReport, VerdictsMatchTheOtherReports) {
  const std::vector<Record> records = test::sample_records();
  EXPECT_NE(render_html({records[0]}).find("<title>mlagate: PASS</title>"), std::string::npos);
  EXPECT_NE(render_html({records[4]}).find("<title>mlagate: NOTHING RAN</title>"), std::string::npos);
  EXPECT_NE(render_html({}).find("<title>mlagate: NOTHING RAN</title>"), std::string::npos);
  RunInfo run = test::sample_run();
  run.interrupted = "SIGINT: 2 of 5 records";
  const std::string html = render_html({records[0]}, run);
  EXPECT_NE(html.find("<title>mlagate: INTERRUPTED</title>"), std::string::npos);
  EXPECT_NE(html.find("Interrupted (SIGINT: 2 of 5 records): partial results."), std::string::npos);
}

}  // namespace
}  // namespace mlagate
