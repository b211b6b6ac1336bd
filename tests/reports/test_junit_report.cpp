// The JUnit report: pinned by a golden file, parsed with pugixml to check the structure CI
// tools read (counts, failure/error/skipped elements, properties) and that escaped text
// comes back as written.
#include <gtest/gtest.h>

#include <cstdio>
#include <pugixml.hpp>
#include <sstream>
#include <string_view>

#include "tests/reports/snapshot.h"
#include "tests/reports/sample_records.h"

namespace mlagate {
namespace {

std::string render_junit(std::span<const Record> records) {
  std::ostringstream os;
  write_junit(os, test::sample_run(), records);
  return os.str();
}

// Parses `xml` or fails the test; parse_default keeps the text of elements and expands
// character references, as CI tools do.
pugi::xml_document parse(const std::string& xml) {
  pugi::xml_document doc;
  const pugi::xml_parse_result result = doc.load_string(xml.c_str());
  EXPECT_TRUE(result) << result.description() << " at offset " << result.offset;
  return doc;
}

std::string property(const pugi::xml_node& testcase, const char* name) {
  return testcase.child("properties")
      .find_child_by_attribute("property", "name", name)
      .attribute("value")
      .value();
}

TEST(JunitReport, Snapshot) {
  MLAGATE_EXPECT_SNAPSHOT("report.xml", render_junit(test::sample_records()));
}

TEST(JunitReport, SuitesPerBackendWithCounts) {
  const pugi::xml_document doc = parse(render_junit(test::sample_records()));
  const pugi::xml_node root = doc.child("testsuites");
  ASSERT_TRUE(root);
  EXPECT_EQ(root.attribute("tests").as_int(), 9);
  EXPECT_EQ(root.attribute("failures").as_int(), 3);  // INCORRECT, NONFINITE, the strict XPASS
  EXPECT_EQ(root.attribute("errors").as_int(), 1);    // CRASHED
  EXPECT_EQ(root.attribute("skipped").as_int(), 3);   // NOT_SUPPORTED and the two XFAIL

  std::vector<pugi::xml_node> suites;
  for (pugi::xml_node s : root.children("testsuite")) suites.push_back(s);
  ASSERT_EQ(suites.size(), 2u);
  EXPECT_STREQ(suites[0].attribute("name").value(), "cpu");
  EXPECT_EQ(suites[0].attribute("tests").as_int(), 2);
  EXPECT_EQ(suites[0].attribute("failures").as_int(), 1);
  EXPECT_EQ(suites[0].attribute("errors").as_int(), 0);
  EXPECT_EQ(suites[0].attribute("skipped").as_int(), 0);
  EXPECT_DOUBLE_EQ(suites[0].attribute("time").as_double(), (2.125 + 4.5) / 1000);
  EXPECT_STREQ(suites[1].attribute("name").value(), "cuda_flashmla");
  EXPECT_EQ(suites[1].attribute("tests").as_int(), 7);
  EXPECT_EQ(suites[1].attribute("failures").as_int(), 2);  // NONFINITE, the strict XPASS
  EXPECT_EQ(suites[1].attribute("errors").as_int(), 1);
  EXPECT_EQ(suites[1].attribute("skipped").as_int(), 3);   // NOT_SUPPORTED, the two XFAIL
  EXPECT_STREQ(suites[1]
                   .child("properties")
                   .find_child_by_attribute("property", "name", "git_commit")
                   .attribute("value")
                   .value(),
               "0123456789ab");

  // Each suite holds as many testcases as it claims.
  for (const pugi::xml_node& s : suites) {
    int n = 0;
    for ([[maybe_unused]] pugi::xml_node c : s.children("testcase")) ++n;
    EXPECT_EQ(n, s.attribute("tests").as_int()) << s.attribute("name").value();
  }
}

TEST(JunitReport, OneElementPerOutcome) {
  const std::vector<Record> records = test::sample_records();
  const pugi::xml_document doc = parse(render_junit(records));
  std::vector<pugi::xml_node> cases;
  for (pugi::xml_node s : doc.child("testsuites").children("testsuite")) {
    for (pugi::xml_node c : s.children("testcase")) cases.push_back(c);
  }
  ASSERT_EQ(cases.size(), 9u);

  const pugi::xml_node pass = cases[0];
  EXPECT_STREQ(pass.attribute("classname").value(), "cpu.decode");
  EXPECT_EQ(pass.attribute("name").value(), records[0].case_id);
  EXPECT_DOUBLE_EQ(pass.attribute("time").as_double(), 0.002125);
  EXPECT_FALSE(pass.child("failure") || pass.child("error") || pass.child("skipped"));
  EXPECT_EQ(property(pass, "backend"), "cpu");
  EXPECT_EQ(property(pass, "op"), "decode");
  EXPECT_EQ(property(pass, "block_size"), "64");
  EXPECT_EQ(property(pass, "out.max_abs"), "1.52588e-05");
  EXPECT_EQ(property(pass, "repro"), records[0].repro);

  const pugi::xml_node failure = cases[1].child("failure");
  ASSERT_TRUE(failure);
  EXPECT_STREQ(failure.attribute("type").value(), "INCORRECT");
  EXPECT_EQ(failure.attribute("message").value(), records[1].message);
  const std::string body = failure.text().get();
  EXPECT_NE(body.find("max_abs=0.0123 at request 1, token 0, head 3, dim 7"), std::string::npos)
      << body;
  EXPECT_NE(body.find("min_atol=0.0123 min_fudge=nan"), std::string::npos) << body;
  EXPECT_NE(body.find("repro: " + records[1].repro), std::string::npos) << body;
  EXPECT_EQ(property(cases[1], "out.min_atol"), "0.0123");
  EXPECT_EQ(property(cases[1], "lse.min_fudge"), "0.25");

  const pugi::xml_node nonfinite = cases[2].child("failure");
  ASSERT_TRUE(nonfinite);
  EXPECT_STREQ(nonfinite.attribute("type").value(), "NONFINITE");
  EXPECT_NE(std::string(nonfinite.text().get()).find("nonfinite_mismatches=3, first at"),
            std::string::npos);

  const pugi::xml_node error = cases[3].child("error");
  ASSERT_TRUE(error);
  EXPECT_STREQ(error.attribute("type").value(), "CRASHED");
  EXPECT_FALSE(cases[3].child("failure"));

  const pugi::xml_node skipped = cases[4].child("skipped");
  ASSERT_TRUE(skipped);
  EXPECT_STREQ(skipped.attribute("message").value(),
               "NOT_SUPPORTED: block_size 16 not supported (needs 64)");
}

// The testcase of the record named `case_id`.
pugi::xml_node testcase(const pugi::xml_document& doc, const std::string& case_id) {
  for (pugi::xml_node s : doc.child("testsuites").children("testsuite"))
    for (pugi::xml_node c : s.children("testcase"))
      if (case_id == c.attribute("name").value()) return c;
  return {};
}

// Children of a testcase other than <properties>.
int outcome_elements(const pugi::xml_node& c) {
  int n = 0;
  for (pugi::xml_node e : c.children())
    if (std::string_view(e.name()) != "properties") ++n;
  return n;
}

// As pytest writes xfail: an XFAIL is <skipped> with the status and the entry's reason, never
// a failure or an error; its properties carry the entry, reason and link.
TEST(JunitReport, XfailIsSkippedWithItsReason) {
  const std::vector<Record> records = test::sample_records();
  const pugi::xml_document doc = parse(render_junit(records));
  for (const std::size_t i : {test::kXfailNan, test::kXfailIncorrect}) {
    const Record& r = records[i];
    ASSERT_EQ(r.expected.outcome, Expected::kXfail);
    const pugi::xml_node c = testcase(doc, r.case_id);
    ASSERT_TRUE(c) << r.case_id;
    EXPECT_FALSE(c.child("failure")) << r.case_id;
    EXPECT_FALSE(c.child("error")) << r.case_id;
    EXPECT_EQ(outcome_elements(c), 1) << r.case_id;
    const pugi::xml_node skipped = c.child("skipped");
    ASSERT_TRUE(skipped) << r.case_id;
    EXPECT_EQ(skipped.attribute("message").value(), "XFAIL (" + std::string(status_name(r.status)) +
                                                         "): flashmla-fp8-long-context: " + test::kXfailReason);
    EXPECT_STREQ(skipped.attribute("type").value(), "XFAIL");
    // The evidence stays in the body: the status's message, the link and the repro.
    const std::string body = skipped.text().get();
    EXPECT_NE(body.find(r.message), std::string::npos) << body;
    EXPECT_NE(body.find("link: " + test::kXfailLink), std::string::npos) << body;
    EXPECT_NE(body.find("repro: " + r.repro), std::string::npos) << body;
    EXPECT_EQ(property(c, "expected"), "XFAIL");
    EXPECT_EQ(property(c, "expected.entry"), "flashmla-fp8-long-context");
    EXPECT_EQ(property(c, "expected.reason"), test::kXfailReason);
    EXPECT_EQ(property(c, "expected.link"), test::kXfailLink);
  }
  EXPECT_STREQ(testcase(doc, records[test::kXfailNan].case_id).child("skipped").attribute("message").value(),
               ("XFAIL (NONFINITE): flashmla-fp8-long-context: " + test::kXfailReason).c_str());
}

TEST(JunitReport, StrictXpassIsAFailureAndANonStrictOnePasses) {
  const std::vector<Record> records = test::sample_records();
  const pugi::xml_document doc = parse(render_junit(records));

  const Record& strict = records[test::kXpassStrict];
  const pugi::xml_node sc = testcase(doc, strict.case_id);
  ASSERT_TRUE(sc);
  const pugi::xml_node failure = sc.child("failure");
  ASSERT_TRUE(failure);
  EXPECT_EQ(outcome_elements(sc), 1);
  EXPECT_STREQ(failure.attribute("type").value(), "XPASS");
  EXPECT_EQ(std::string(failure.attribute("message").value()),
            "XPASS(strict): flashmla-h128-splitkv: " + strict.expected.reason);
  EXPECT_NE(std::string(failure.text().get()).find("remove the entry"), std::string::npos);
  EXPECT_EQ(property(sc, "expected"), "XPASS");
  EXPECT_EQ(property(sc, "expected.strict"), "true");
  EXPECT_FALSE(sc.child("properties").find_child_by_attribute("property", "name", "expected.link"))
      << "no link property for an entry without a link";

  const Record& notice = records[test::kXpassNotice];
  const pugi::xml_node nc = testcase(doc, notice.case_id);
  ASSERT_TRUE(nc);
  EXPECT_FALSE(nc.child("failure") || nc.child("error") || nc.child("skipped")) << "a non-strict XPASS passes";
  const std::string out = nc.child("system-out").text().get();
  EXPECT_EQ(out.rfind("XPASS: expectations entry flashmla-prefill-streams", 0), 0u) << out;
  EXPECT_NE(out.find(notice.expected.reason), std::string::npos) << out;
  EXPECT_NE(out.find("link: FLASHMLA-17"), std::string::npos) << out;
  EXPECT_EQ(property(nc, "expected"), "XPASS");
  EXPECT_EQ(property(nc, "expected.strict"), "false");
  EXPECT_EQ(property(nc, "expected.link"), "FLASHMLA-17");
}

// The suites' failures + errors are the records that fail the run (record_fails_run), with
// and without --require batch-invariance, so CI's red/green agrees with the exit code.
TEST(JunitReport, CountsAgreeWithRecordFailsRun) {
  std::vector<Record> records = test::sample_records();
  Record variant = records[0];
  variant.case_id += " variant";
  variant.status = Status::kBatchVariant;
  records.push_back(variant);
  Record xfail_variant = variant;  // an entry that expects BATCH_VARIANT
  xfail_variant.case_id += " xfail";
  xfail_variant.expected = records[test::kXfailNan].expected;
  records.push_back(xfail_variant);
  for (const bool require : {false, true}) {
    RunInfo run = test::sample_run();
    run.require_batch_invariance = require;
    std::ostringstream os;
    write_junit(os, run, records);
    const pugi::xml_document doc = parse(os.str());
    const pugi::xml_node root = doc.child("testsuites");
    const StatusCounts counts = count_statuses(records, run);
    EXPECT_EQ(root.attribute("failures").as_int() + root.attribute("errors").as_int(), counts.failures) << require;
    EXPECT_EQ(root.attribute("tests").as_int(), counts.total);
    // Skipped: the records that did not run and every XFAIL.
    EXPECT_EQ(root.attribute("skipped").as_int(),
              counts[Status::kNotSupported] + counts[Status::kSkipped] + counts.xfail) << require;
    // Per record: an element that fails exactly when record_fails_run.
    for (const Record& r : records) {
      const pugi::xml_node c = testcase(doc, r.case_id);
      ASSERT_TRUE(c) << r.case_id;
      EXPECT_EQ(static_cast<bool>(c.child("failure") || c.child("error")), record_fails_run(r, require))
          << r.case_id << " require=" << require;
    }
  }
}

TEST(JunitReport, RecordsWithoutExpectationsHaveNoExpectedProperty) {
  const std::vector<Record> records = test::sample_records();
  const std::string xml = render_junit(std::span(records).first(5));
  EXPECT_EQ(xml.find("expected"), std::string::npos);
  EXPECT_EQ(xml.find("XFAIL"), std::string::npos);
  EXPECT_EQ(xml.find("XPASS"), std::string::npos);
}

TEST(JunitReport, EscapedTextRoundTrips) {
  const pugi::xml_document doc = parse(render_junit(test::sample_records()));
  const pugi::xml_node crashed =
      doc.child("testsuites").find_child_by_attribute("testsuite", "name", "cuda_flashmla")
          .find_child_by_attribute("testcase", "classname", "cuda_flashmla.prefill");
  ASSERT_TRUE(crashed);
  // Markup, quotes, the tab and the newline come back exactly; the control character and
  // the invalid byte, which XML 1.0 cannot hold, come back as "\xNN" text.
  const std::string expected =
      "kernel threw: bad <&\"'> value\\x01 at\tpos\nnext line \\xFF caf\xC3\xA9";
  EXPECT_EQ(crashed.child("error").attribute("message").value(), expected);
  EXPECT_NE(std::string(crashed.child("error").text().get()).find(expected), std::string::npos);
}

TEST(JunitReport, OutputHoldsOnlyCharactersXmlAllows) {
  std::vector<Record> records = test::sample_records();
  std::string every_byte;
  for (int b = 0; b < 256; ++b) every_byte += static_cast<char>(b);
  records[3].message = every_byte;
  records[3].case_id = every_byte;
  records[3].backend = every_byte;
  const std::string xml = render_junit(records);
  // No two bytes of 0..255 in a row form a valid UTF-8 sequence, so every byte >= 0x80 must
  // have become "\xNN" text, and the document is plain ASCII without forbidden controls.
  for (char c : xml) {
    const auto b = static_cast<unsigned char>(c);
    ASSERT_TRUE(b < 0x80 && (b >= 0x20 || b == '\n' || b == '\t')) << "raw byte " << int(b);
  }
  const pugi::xml_document doc = parse(xml);

  std::string expected;
  for (int b = 0; b < 256; ++b) {
    if ((b >= 0x20 && b < 0x80) || b == '\t' || b == '\n' || b == '\r') {
      expected += static_cast<char>(b);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", b);
      expected += buf;
    }
  }
  const pugi::xml_node suite = doc.child("testsuites").find_child_by_attribute(
      "testsuite", "name", expected.c_str());
  ASSERT_TRUE(suite) << "the backend name must round-trip as a suite name";
  const pugi::xml_node testcase = suite.child("testcase");
  EXPECT_EQ(testcase.attribute("name").value(), expected);
  EXPECT_EQ(testcase.child("error").attribute("message").value(), expected);
}

TEST(JunitReport, EmptyRunIsValid) {
  const pugi::xml_document doc = parse(render_junit({}));
  EXPECT_EQ(doc.child("testsuites").attribute("tests").as_int(), 0);
  EXPECT_FALSE(doc.child("testsuites").child("testsuite"));
}

}  // namespace
}  // namespace mlagate
