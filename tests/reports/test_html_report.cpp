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
  // Records 1 (INCORRECT), 2 (NONFINITE), 3 (CRASHED) and 7 (strict XPASS), then 5 and 6
  // (XFAIL), then 8 (non-strict XPASS), then 0 (PASSED) and 4 (NOT_SUPPORTED).
  std::vector<std::size_t> at;
  for (int i : {1, 2, 3, 7, 5, 6, 8, 0, 4}) at.push_back(html.find("<tr data-index=\"" + std::to_string(i) + "\""));
  for (std::size_t k = 0; k < at.size(); ++k) ASSERT_NE(at[k], std::string::npos) << k;
  for (std::size_t k = 1; k < at.size(); ++k) EXPECT_LT(at[k - 1], at[k]) << k;
  EXPECT_NE(html.find("<tr data-index=\"1\" data-failure=\"1\">"), std::string::npos);
  EXPECT_NE(html.find("<tr data-index=\"0\" data-failure=\"0\">"), std::string::npos);
  EXPECT_NE(html.find("<tr data-index=\"7\" data-failure=\"1\" data-expected=\"XPASS\">"), std::string::npos);
  EXPECT_NE(html.find("<tr data-index=\"5\" data-failure=\"0\" data-expected=\"XFAIL\">"), std::string::npos);
  EXPECT_NE(html.find("<tr data-index=\"8\" data-failure=\"0\" data-expected=\"XPASS\">"), std::string::npos);
  // The sections follow the rows' order.
  EXPECT_LT(html.find("id=\"rec-7\""), html.find("id=\"rec-5\""));
  EXPECT_LT(html.find("id=\"rec-6\""), html.find("id=\"rec-0\""));
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
  std::string html = render_html(test::sample_records());
  // The XFAIL entry's link is the one URL in the page: an <a> to follow, which loads nothing.
  const std::string anchor = "<a class=\"xlink\" href=\"" + test::kXfailLink + "\" rel=\"noopener noreferrer\">" +
                             test::kXfailLink + "</a>";
  ASSERT_NE(html.find(anchor), std::string::npos);
  for (std::size_t at = html.find(test::kXfailLink); at != std::string::npos; at = html.find(test::kXfailLink))
    html.erase(at, test::kXfailLink.size());
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

TEST(HtmlReport, BadgesShowExpectationsWithTheirReason) {
  const std::vector<Record> records = test::sample_records();
  const std::string html = render_html(records);
  const std::string reason = "fp8 dequant overflows when |k| &gt; 448: &lt;Inf&gt; becomes NaN &amp; spreads";
  const std::string link = "<a class=\"xlink\" href=\"" + test::kXfailLink + "\" rel=\"noopener noreferrer\">" +
                           test::kXfailLink + "</a>";
  // The records table: the badge, and the entry, reason and link above the message.
  EXPECT_NE(html.find("<td class=\"st xfail\">XFAIL (NONFINITE)</td>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"st xfail\">XFAIL (INCORRECT)</td>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"st fail\">XPASS(strict)</td>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"st xpass\">XPASS</td>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"msg\"><div class=\"expect\"><code>flashmla-fp8-long-context</code>: " + reason +
                      " (" + link + ")</div>out: 12 NaN/Inf"),
            std::string::npos);
  EXPECT_NE(html.find("<div class=\"expect\"><code>flashmla-prefill-streams</code>: mismatches now and then under "
                      "concurrent streams (<code>FLASHMLA-17</code>)</div>"),
            std::string::npos)
      << "a link that is no URL is text";
  // The sections: the badge in the summary, and what the entry made of the record.
  EXPECT_NE(html.find("<summary><span class=\"st xfail\">XFAIL (NONFINITE)</span> <code>" +
                      records[test::kXfailNan].case_id + "</code>"),
            std::string::npos);
  EXPECT_NE(html.find("<p class=\"expect\"><span class=\"st xfail\">XFAIL (NONFINITE)</span> expectations entry "
                      "<code>flashmla-fp8-long-context</code>: " + reason + " (" + link +
                      "). It failed as the entry says it does: not a failure of the run.</p>"),
            std::string::npos);
  EXPECT_NE(html.find("<summary><span class=\"st fail\">XPASS(strict)</span>"), std::string::npos);
  EXPECT_NE(html.find("and it did not (PASSED): a failure of the run, as the entry is strict."), std::string::npos);
  EXPECT_NE(html.find("<p class=\"facts\">facts: kv=fp8 query_kind=decode requests=1 seq_len_max=8192 suite=smoke</p>"),
            std::string::npos);
  // The first three failures open at load (records 1, 2 and 3): the strict XPASS is the
  // fourth failure and stays closed, and an XFAIL is no failure.
  EXPECT_NE(html.find("<details class=\"rec\" id=\"rec-5\">"), std::string::npos);
  EXPECT_NE(html.find("<details class=\"rec\" id=\"rec-7\">"), std::string::npos);
}

TEST(HtmlReport, CountsAndVerdictWithExpectations) {
  const std::vector<Record> records = test::sample_records();
  const std::string html = render_html(records);
  EXPECT_NE(html.find("<th>BATCH_VARIANT</th><th>XFAIL</th><th>XPASS</th><th>time</th>"), std::string::npos);
  // cuda_flashmla: 2 XFAIL; 2 XPASS, one strict, so the count is a failure's colour.
  EXPECT_NE(html.find("<td class=\"n\"><span class=\"st xfail\">2</span></td><td class=\"n\"><span class=\"st "
                      "fail\">2</span></td>"),
            std::string::npos);
  EXPECT_NE(html.find("<tr><th>records</th><td>9 records, 4 failures, 2 expected failures (XFAIL), 2 unexpected "
                      "passes (XPASS, 1 strict)</td></tr>"),
            std::string::npos);
  // The filter can select XFAIL or XPASS records.
  EXPECT_NE(html.find("<select id=\"expected-filter\">"), std::string::npos);
  EXPECT_NE(html.find("<option value=\"XFAIL\">"), std::string::npos);
  EXPECT_NE(html.find("<option value=\"XPASS\">"), std::string::npos);
  EXPECT_NE(html.find("tr.getAttribute('data-expected') === expected.value"), std::string::npos);

  // Without outcomes: no columns, no filter, no badges.
  const std::string plain = render_html(std::vector<Record>(records.begin(), records.begin() + 5));
  EXPECT_EQ(plain.find("<th>XFAIL</th>"), std::string::npos);
  EXPECT_EQ(plain.find("id=\"expected-filter\""), std::string::npos);
  EXPECT_EQ(plain.find("data-expected=\""), std::string::npos);
  EXPECT_EQ(plain.find("class=\"st xfail\""), std::string::npos);

  // Verdicts: only XFAIL or a non-strict XPASS pass; a strict XPASS fails.
  const std::vector<Record> xfails{records[test::kXfailNan], records[test::kXfailIncorrect]};
  EXPECT_NE(render_html(xfails).find("<title>mlagate: PASS</title>"), std::string::npos);
  EXPECT_NE(render_html({records[test::kXpassNotice]}).find("<title>mlagate: PASS</title>"), std::string::npos);
  EXPECT_NE(render_html({records[test::kXpassStrict]}).find("<title>mlagate: FAIL</title>"), std::string::npos);
}

TEST(HtmlReport, ExpectationTextIsEscapedAndOnlyWebLinksAreLinks) {
  std::vector<Record> records = test::sample_records();
  records[test::kXfailNan].expected.entry = "<b>entry</b>";
  records[test::kXfailNan].expected.reason = "<script>alert(4)</script>";
  records[test::kXfailNan].expected.link = "javascript:alert(5)";
  records[test::kXfailIncorrect].expected.link = "https://x.example/\"><script>alert(6)</script>";
  const std::string html = render_html(records);
  EXPECT_EQ(html.find("alert(4)</script>"), std::string::npos);
  EXPECT_EQ(html.find("<b>entry"), std::string::npos);
  EXPECT_NE(html.find("<code>&lt;b&gt;entry&lt;/b&gt;</code>: &lt;script&gt;alert(4)&lt;/script&gt;"), std::string::npos);
  EXPECT_EQ(html.find("href=\"javascript"), std::string::npos) << "only http(s) links are followed";
  EXPECT_NE(html.find("<code>javascript:alert(5)</code>"), std::string::npos);
  EXPECT_EQ(html.find("alert(6)</script>"), std::string::npos);
  EXPECT_NE(html.find("href=\"https://x.example/&quot;&gt;&lt;script&gt;alert(6)&lt;/script&gt;\""), std::string::npos);
  EXPECT_EQ(count(html, "<script"), 2u);
}

// Failures are what record_fails_run says, as in every other report: BATCH_VARIANT is one
// under --require batch-invariance (row first, marked a failure, section open), else not.
TEST(HtmlReport, RequiredBatchInvarianceIsAFailure) {
  std::vector<Record> records = test::sample_records();
  records.resize(1);
  records.push_back(records[0]);
  records[1].case_id += " variant";
  records[1].status = Status::kBatchVariant;
  RunInfo run = test::sample_run();
  std::string html = render_html(records, run);
  EXPECT_NE(html.find("<tr data-index=\"1\" data-failure=\"0\">"), std::string::npos);
  EXPECT_LT(html.find("<tr data-index=\"0\""), html.find("<tr data-index=\"1\""));
  run.require_batch_invariance = true;
  html = render_html(records, run);
  EXPECT_NE(html.find("<title>mlagate: FAIL</title>"), std::string::npos);
  EXPECT_NE(html.find("<tr data-index=\"1\" data-failure=\"1\">"), std::string::npos);
  EXPECT_LT(html.find("<tr data-index=\"1\""), html.find("<tr data-index=\"0\""));
  EXPECT_NE(html.find("<td class=\"st fail\">BATCH_VARIANT</td>"), std::string::npos);
  EXPECT_NE(html.find("<details class=\"rec\" id=\"rec-1\" open>"), std::string::npos);
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
