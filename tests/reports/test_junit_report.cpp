// The JUnit report: pinned by a golden file, parsed with pugixml to check the structure CI
// tools read (counts, failure/error/skipped elements, properties) and that escaped text
// comes back as written.
#include <gtest/gtest.h>

#include <cstdio>
#include <pugixml.hpp>
#include <sstream>

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
  EXPECT_EQ(root.attribute("tests").as_int(), 5);
  EXPECT_EQ(root.attribute("failures").as_int(), 2);  // INCORRECT, NONFINITE
  EXPECT_EQ(root.attribute("errors").as_int(), 1);    // CRASHED
  EXPECT_EQ(root.attribute("skipped").as_int(), 1);   // NOT_SUPPORTED

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
  EXPECT_EQ(suites[1].attribute("tests").as_int(), 3);
  EXPECT_EQ(suites[1].attribute("failures").as_int(), 1);
  EXPECT_EQ(suites[1].attribute("errors").as_int(), 1);
  EXPECT_EQ(suites[1].attribute("skipped").as_int(), 1);
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
  ASSERT_EQ(cases.size(), 5u);

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
