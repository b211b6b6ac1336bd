// The JSON report: pinned by a golden file, and read back with nlohmann to check that every
// field survives, NaN becomes null, infinities become "inf"/"-inf" and strings round-trip.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cases/errors.h"

#include "tests/reports/snapshot.h"
#include "tests/reports/sample_records.h"

namespace mlagate {
namespace {

using nlohmann::json;

std::string render_json(std::span<const Record> records) {
  std::ostringstream os;
  write_json(os, test::sample_run(), records);
  return os.str();
}

TEST(JsonReport, Snapshot) {
  MLAGATE_EXPECT_SNAPSHOT("report.json", render_json(test::sample_records()));
}

TEST(JsonReport, RunAndSummary) {
  const json doc = json::parse(render_json(test::sample_records()));
  EXPECT_EQ(doc["schema"], "mlagate.report");
  EXPECT_EQ(doc["schema_version"], 1);
  const json& run = doc["run"];
  EXPECT_EQ(run["tool_version"], "0.1.0");
  EXPECT_EQ(run["git_commit"], "0123456789ab");
  EXPECT_EQ(run["suite"], "smoke");
  EXPECT_EQ(run["started_at"], "2025-01-02T03:04:05Z");
  EXPECT_EQ(run["wall_seconds"], 12.5);
  EXPECT_EQ(run["generator_version"], 3);
  const json& summary = doc["summary"];
  EXPECT_EQ(summary["PASSED"], 1);
  EXPECT_EQ(summary["INCORRECT"], 1);
  EXPECT_EQ(summary["NONFINITE"], 1);
  EXPECT_EQ(summary["CRASHED"], 1);
  EXPECT_EQ(summary["TIMEOUT"], 0);
  EXPECT_EQ(summary["NOT_SUPPORTED"], 1);
  EXPECT_EQ(summary["SKIPPED"], 0);
  EXPECT_EQ(summary["INVALID_CASE"], 0);
  EXPECT_EQ(summary["XFAIL"], 2);
  EXPECT_EQ(summary["XPASS"], 2);
  EXPECT_EQ(summary["total"], 9);
  EXPECT_EQ(summary["failures"], 4);  // INCORRECT, NONFINITE, CRASHED, the strict XPASS
  EXPECT_EQ(summary["verdict"], "FAIL");
}

TEST(JsonReport, RecordFields) {
  const std::vector<Record> records = test::sample_records();
  const json doc = json::parse(render_json(records));
  ASSERT_EQ(doc["records"].size(), records.size());
  for (std::size_t i = 0; i < records.size(); ++i) {
    const json& j = doc["records"][i];
    EXPECT_EQ(j["id"], records[i].case_id);
    EXPECT_EQ(j["backend"], records[i].backend);
    EXPECT_EQ(j["op"], records[i].op);
    EXPECT_EQ(j["status"], std::string(status_name(records[i].status)));
    EXPECT_EQ(j["policy"], records[i].policy);
    EXPECT_EQ(j["block_size"], records[i].block_size);
    EXPECT_EQ(j["paths"].get<std::vector<std::string>>(), records[i].paths);
    EXPECT_EQ(j["metrics"].size(), records[i].metrics.size());
    EXPECT_EQ(j["timings_ms"]["run"], records[i].timings.run_ms);
    EXPECT_EQ(j["repro"], records[i].repro);
  }

  const json& incorrect = doc["records"][1];
  const json& out = incorrect["metrics"][0];
  EXPECT_EQ(out["output"], "out");
  EXPECT_EQ(out["numel"], 196608);
  EXPECT_EQ(out["max_abs"], 0.0123);
  EXPECT_EQ(out["min_atol"], 0.0123);
  EXPECT_TRUE(out["min_fudge"].is_null()) << "NaN must be written as null";
  EXPECT_EQ(out["worst"], json::parse(R"({"flat":54151,"request":1,"token":0,"head":3,"dim":7})"));
  EXPECT_EQ(out["passed"], false);
  EXPECT_EQ(out["message"], "max_abs 0.0123 beyond tolerance");
  const json& lse = incorrect["metrics"][1];
  EXPECT_EQ(lse["max_ulp"], "inf");
  EXPECT_TRUE(lse["worst"]["head"].is_null()) << "-1 locations must be written as null";
  EXPECT_TRUE(lse["worst"]["dim"].is_null());
  EXPECT_EQ(lse["worst"]["token"], 5);

  const json& nonfinite = doc["records"][2]["metrics"][0];
  EXPECT_TRUE(nonfinite["max_abs"].is_null());
  EXPECT_EQ(nonfinite["out_norm"], "inf");
  EXPECT_EQ(nonfinite["nonfinite_mismatches"], 3);
  EXPECT_EQ(nonfinite["first_nonfinite"]["dim"], 17);
  EXPECT_TRUE(nonfinite["worst"]["flat"].is_null());
}

TEST(JsonReport, FactsAndExpectations) {
  const std::vector<Record> records = test::sample_records();
  const json doc = json::parse(render_json(records));
  // Only records with facts or an outcome carry the keys.
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_FALSE(doc["records"][i].contains("facts")) << i;
    EXPECT_FALSE(doc["records"][i].contains("expected")) << i;
  }
  const json& xfail = doc["records"][test::kXfailNan];
  EXPECT_EQ(xfail["status"], "NONFINITE") << "an XFAIL keeps its status";
  EXPECT_EQ(xfail["facts"]["kv"], "fp8");
  EXPECT_EQ(xfail["facts"].size(), records[test::kXfailNan].facts.size());
  EXPECT_EQ(xfail["expected"], json({{"outcome", "XFAIL"},
                                     {"entry", "flashmla-fp8-long-context"},
                                     {"reason", test::kXfailReason},
                                     {"link", test::kXfailLink},
                                     {"strict", true}}));
  EXPECT_EQ(doc["records"][test::kXpassStrict]["expected"]["outcome"], "XPASS");
  EXPECT_EQ(doc["records"][test::kXpassStrict]["expected"]["strict"], true);
  EXPECT_EQ(doc["records"][test::kXpassNotice]["expected"]["strict"], false);
}

TEST(JsonReport, NegativeInfinityIsAString) {
  std::vector<Record> records = test::sample_records();
  records[0].metrics[0].cos_diff = -std::numeric_limits<double>::infinity();
  const json doc = json::parse(render_json(records));
  EXPECT_EQ(doc["records"][0]["metrics"][0]["cos_diff"], "-inf");
}

TEST(JsonReport, StringsRoundTrip) {
  const json doc = json::parse(render_json(test::sample_records()));
  // Control characters, quotes and markup survive exactly; only the invalid byte \xFF,
  // which JSON cannot hold, becomes U+FFFD.
  std::string expected = test::kHostileMessage;
  expected.replace(expected.find('\xFF'), 1, "\xEF\xBF\xBD");
  EXPECT_EQ(doc["records"][3]["message"], expected);
}

// Records are dumped on several threads and spliced into the document: the
// bytes must be those one dump of the whole document gives, for none, one and
// enough records to use every thread (with a message of invalid UTF-8, which
// both replace).
TEST(JsonReport, ManyRecordsAreTheBytesOfOneDump) {
  std::vector<Record> many;
  for (int k = 0; k < 160; ++k)
    for (const Record& r : test::sample_records()) {
      many.push_back(r);
      many.back().case_id += "/" + std::to_string(k);
    }
  many[77].message = "bytes \xff\xfe here";
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, many.size()}) {
    const std::string text = render_json(std::span<const Record>(many.data(), n));
    const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(text);
    EXPECT_EQ(doc.at("records").size(), n);
    EXPECT_EQ(text, doc.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n") << n;
  }
}

TEST(JsonReport, EmptyRunIsValid) {
  const json doc = json::parse(render_json({}));
  EXPECT_TRUE(doc["records"].is_array());
  EXPECT_TRUE(doc["records"].empty());
  EXPECT_EQ(doc["summary"]["total"], 0);
  EXPECT_EQ(doc["summary"]["verdict"], "NOTHING RAN");
}

// The reader (mlagate merge): a written report reads back as the same records, error
// summaries included, so a merged --html report draws the run's own maps.
std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(JsonReport, ReadsBackAsTheSameRecords) {
  const std::vector<Record> records = test::sample_records();
  const JsonReport back = read_json_report(write_file("rt.json", render_json(records)));
  EXPECT_EQ(back.run.suite, test::sample_run().suite);
  ASSERT_EQ(back.records.size(), records.size());
  // Written again, the records read back give the same bytes.
  std::ostringstream again;
  write_json(again, test::sample_run(), back.records);
  EXPECT_EQ(again.str(), render_json(records));
  const Metrics& m = back.records[1].metrics[0];
  const Metrics& want = records[1].metrics[0];
  ASSERT_GT(want.map_tokens, 0);
  EXPECT_EQ(m.map_tokens, want.map_tokens);
  EXPECT_EQ(m.map_heads, want.map_heads);
  EXPECT_EQ(m.query_lens, want.query_lens);
  ASSERT_EQ(m.err_token_head.size(), want.err_token_head.size());
  for (std::size_t i = 0; i < m.err_token_head.size(); ++i)
    EXPECT_EQ(std::memcmp(&m.err_token_head[i], &want.err_token_head[i], sizeof(float)), 0) << i;
  ASSERT_EQ(m.worst_elements.size(), want.worst_elements.size());
  EXPECT_EQ(m.worst_elements[0].where.flat, want.worst_elements[0].where.flat);
  EXPECT_EQ(m.worst_elements[0].err, want.worst_elements[0].err);
  // Facts and --expect outcomes come back field by field (merge reports them again).
  for (std::size_t i = 0; i < records.size(); ++i) {
    const Record& got = back.records[i];
    const Record& r = records[i];
    EXPECT_EQ(got.facts, r.facts) << i;
    EXPECT_EQ(got.expected.outcome, r.expected.outcome) << i;
    EXPECT_EQ(got.expected.entry, r.expected.entry) << i;
    EXPECT_EQ(got.expected.reason, r.expected.reason) << i;
    EXPECT_EQ(got.expected.link, r.expected.link) << i;
    EXPECT_EQ(got.expected.strict, r.expected.strict) << i;
    EXPECT_EQ(record_fails_run(got, false), record_fails_run(r, false)) << i;
  }
  EXPECT_EQ(back.records[test::kXpassNotice].expected.strict, false);
  EXPECT_EQ(back.records[test::kXfailNan].facts.at("kv"), "fp8");
  const StatusCounts counts = count_statuses(back.records);
  EXPECT_EQ(counts.xfail, 2);
  EXPECT_EQ(counts.xpass, 2);
  EXPECT_EQ(counts.xpass_strict, 1);
}

TEST(JsonReport, ReaderRejectsABadExpectation) {
  const auto expect_error = [](json doc, const std::string& name, const std::string& what) {
    const std::string path = write_file(name, doc.dump());
    try {
      read_json_report(path);
      ADD_FAILURE() << name << ": no error";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const json doc = json::parse(render_json(test::sample_records()));
  json bad = doc;
  bad["records"][test::kXfailNan]["expected"]["outcome"] = "MAYBE";
  expect_error(bad, "outcome.json", "records[5].expected.outcome");
  bad = doc;
  bad["records"][test::kXfailNan]["expected"].erase("strict");
  expect_error(bad, "strict.json", "records[5].expected");
  bad = doc;
  bad["records"][test::kXfailNan]["facts"]["kv"] = 8;
  expect_error(bad, "facts.json", "records[5].facts.kv");
}

TEST(JsonReport, ReaderRejectsAMapThatDisagreesWithItsGeometry) {
  json doc = json::parse(render_json(test::sample_records()));
  json& map = doc["records"][1]["metrics"][0]["error_map"];
  ASSERT_TRUE(map.is_object());
  const auto expect_error = [&](const std::string& name, const std::string& what) {
    const std::string path = write_file(name, doc.dump());
    try {
      read_json_report(path);
      ADD_FAILURE() << name << ": no error";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  map["heads"] = 127;  // 3 x 127 cells, the data holds 3 x 128
  expect_error("geom.json", "records[1].metrics[0].error_map.err_token_head: expected 381 cells");
  map["heads"] = 128;
  map["query_lens"] = json::array({2, 2});  // 4 query tokens in a 3-token map
  expect_error("qlens.json", "more query tokens than the map has");
  map["query_lens"] = json::array({1, 1, 1});
  map["err_token_head"] = "not base64!";
  expect_error("b64.json", "error_map.err_token_head");
  map["err_token_head"] = "";
  map["token_bin"] = 0;
  expect_error("bin.json", "error_map.token_bin: out of range");
}

}  // namespace
}  // namespace mlagate
