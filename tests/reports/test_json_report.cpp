// The JSON report: pinned by a golden file, and read back with nlohmann to check that every
// field survives, NaN becomes null, infinities become "inf"/"-inf" and strings round-trip.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/reports/golden.h"
#include "tests/reports/sample_records.h"

namespace mlagate {
namespace {

using nlohmann::json;

std::string render_json(std::span<const Record> records) {
  std::ostringstream os;
  write_json(os, test::sample_run(), records);
  return os.str();
}

TEST(JsonReport, Golden) {
  MLAGATE_EXPECT_GOLDEN("report.json", render_json(test::sample_records()));
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
  EXPECT_EQ(summary["total"], 5);
  EXPECT_EQ(summary["failures"], 3);
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

TEST(JsonReport, EmptyRunIsValid) {
  const json doc = json::parse(render_json({}));
  EXPECT_TRUE(doc["records"].is_array());
  EXPECT_TRUE(doc["records"].empty());
  EXPECT_EQ(doc["summary"]["total"], 0);
  EXPECT_EQ(doc["summary"]["verdict"], "NOTHING RAN");
}

}  // namespace
}  // namespace mlagate
