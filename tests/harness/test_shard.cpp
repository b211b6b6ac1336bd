// Sharding and merge: `run --shard I/N` splits a selection by case id, every
// case in exactly one shard; `mlagate merge` joins the shards' JSON reports and
// results files into what one run gives, and refuses shards that are missing,
// given twice, or not parts of one run.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cases/errors.h"
#include "harness/cli/cli.h"
#include "reports/shard.h"
#include "tests/cli_call.h"

namespace mlagate {
namespace {

namespace fs = std::filesystem;
using test::cli;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// (case, backend, op) -> "status max_abs of every output": what a record says.
std::map<std::string, std::string> verdicts(const nlohmann::json& report) {
  std::map<std::string, std::string> v;
  for (const auto& r : report["records"]) {
    std::string what = r["status"].get<std::string>();
    for (const auto& m : r["metrics"]) what += " " + m["output"].get<std::string>() + "=" + m["max_abs"].dump();
    v[r["id"].get<std::string>() + " " + r["backend"].get<std::string>() + " " + r["op"].get<std::string>()] = what;
  }
  return v;
}

TEST(Shard, ParseAndAssignmentByIdAlone) {
  ASSERT_TRUE(parse_shard("0/1"));
  EXPECT_EQ(parse_shard("2/5")->index, 2);
  EXPECT_EQ(parse_shard("2/5")->count, 5);
  for (const char* bad : {"", "1", "5/5", "-1/3", "1/0", "a/3", "1/3x", "1//3", " 1/3"}) EXPECT_FALSE(parse_shard(bad)) << bad;
  // FNV-1a of the id: the same shard on every machine and whatever else is selected.
  EXPECT_EQ(shard_of("", 7), static_cast<int>(0xcbf29ce484222325ull % 7));
  EXPECT_EQ(shard_of("a", 1000), static_cast<int>(0xaf63dc4c8601ec8cull % 1000));
  std::vector<std::pair<std::string, std::string>> set = {{"a", "0/2"}, {"b", "1/2"}};
  EXPECT_NO_THROW(check_shard_set(set));
  EXPECT_THROW(check_shard_set({{"a", "0/2"}}), InputError);                 // missing 1/2
  EXPECT_THROW(check_shard_set({{"a", "0/2"}, {"b", "0/2"}}), InputError);   // twice
  EXPECT_THROW(check_shard_set({{"a", "0/2"}, {"b", "1/3"}}), InputError);   // different N
  EXPECT_THROW(check_shard_set({{"a", "0/1"}, {"b", ""}}), InputError);      // mixed
  EXPECT_NO_THROW(check_shard_set({{"a", ""}, {"b", ""}}));                  // disjoint runs
}

class ShardedRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    d_ = test::scratch_dir("mlagate_shard");
    const std::vector<std::string> sel = {"run", "--suite", "smoke", "--backend", "cpu.paged,cpu.splitkv",
                                          "--isolate", "none", "--no-progress", "-q"};
    auto run = [&](std::vector<std::string> extra) {
      std::vector<std::string> a = sel;
      a.insert(a.end(), extra.begin(), extra.end());
      return cli(a);
    };
    ASSERT_EQ(run({"--json", (d_ / "whole.json").string(), "--save-results", (d_ / "whole.h5").string()}), kExitPassed);
    for (int i = 0; i < 3; ++i) {
      const std::string s = std::to_string(i);
      ASSERT_EQ(run({"--shard", s + "/3", "--json", (d_ / ("s" + s + ".json")).string(), "--save-results",
                     (d_ / ("s" + s + ".h5")).string()}),
                kExitPassed);
    }
  }
  static fs::path file(const std::string& name) { return d_ / name; }
  static inline fs::path d_;
};

TEST_F(ShardedRun, EveryCaseRunsInExactlyOneShard) {
  const auto whole = verdicts(read_json(file("whole.json")));
  std::map<std::string, int> seen;
  std::size_t nonempty = 0;
  for (int i = 0; i < 3; ++i) {
    const auto j = read_json(file("s" + std::to_string(i) + ".json"));
    EXPECT_EQ(j["run"]["shard"], std::to_string(i) + "/3");
    nonempty += !j["records"].empty();
    for (const auto& [key, v] : verdicts(j)) {
      ++seen[key];
      ASSERT_TRUE(whole.count(key)) << key;
      EXPECT_EQ(v, whole.at(key)) << key;  // a shard's record is the whole run's, bit for bit in its metrics
      const std::string id = key.substr(0, key.find(' '));
      EXPECT_EQ(shard_of(id, 3), i) << id;
    }
  }
  EXPECT_GE(nonempty, 2u);  // the smoke suite's 7 cases do spread
  EXPECT_EQ(seen.size(), whole.size());
  for (const auto& [key, n] : seen) EXPECT_EQ(n, 1) << key;
}

TEST_F(ShardedRun, MergeGivesTheWholeRun) {
  const fs::path mj = file("merged.json"), mh = file("merged.h5"), mhtml = file("merged.html");
  fs::remove(mj);
  fs::remove(mh);
  fs::remove(mhtml);
  ASSERT_EQ(cli({"merge", file("s2.json").string(), file("s0.json").string(), file("s1.json").string(),
                 file("s1.h5").string(), file("s0.h5").string(), file("s2.h5").string(), "--json", mj.string(),
                 "--results", mh.string(), "--html", mhtml.string(), "-q"}),
            kExitPassed);
  const auto merged = read_json(mj);
  const auto whole = read_json(file("whole.json"));
  EXPECT_EQ(verdicts(merged), verdicts(whole));
  // The error summaries travel through the shards' reports: the merged record's map is the whole run's.
  std::map<std::string, nlohmann::json> maps;
  for (const auto& r : whole["records"]) maps[r["id"].get<std::string>() + r["backend"].get<std::string>() + r["op"].get<std::string>()] = r["metrics"];
  std::size_t with_map = 0;
  for (const auto& r : merged["records"]) {
    const auto& want = maps.at(r["id"].get<std::string>() + r["backend"].get<std::string>() + r["op"].get<std::string>());
    for (std::size_t k = 0; k < r["metrics"].size(); ++k) {
      EXPECT_EQ(r["metrics"][k]["error_map"], want[k]["error_map"]);
      EXPECT_EQ(r["metrics"][k]["worst_elements"], want[k]["worst_elements"]);
      with_map += r["metrics"][k].contains("error_map");
    }
  }
  EXPECT_GT(with_map, 0u);
  std::ifstream hin(mhtml);
  const std::string html((std::istreambuf_iterator<char>(hin)), std::istreambuf_iterator<char>());
  EXPECT_NE(html.find("<title>mlagate: PASS</title>"), std::string::npos);
  for (const auto& r : merged["records"]) EXPECT_NE(html.find(">" + r["id"].get<std::string>() + "</a>"), std::string::npos);
  EXPECT_EQ(merged["summary"]["verdict"], "PASS");
  EXPECT_FALSE(merged["run"].contains("shard"));
  // Every stored output of the merged results file equals the whole run's, bit for bit.
  EXPECT_EQ(cli({"compare", mh.string(), file("whole.h5").string()}), kExitPassed);
}

// A case id may be another's prefix (".../seed=0" and ".../seed=0/dims=glm"): in
// one results file the second's group sits inside the first's. Merged from two
// files, in either order, each is copied once and the file equals the whole run's.
TEST_F(ShardedRun, MergeKeepsNestedCaseIdsApart) {
  const std::string parent = "^smoke/small_prefill/tp16/bf16/kv=auto/bs=auto/seed=0";
  const auto part = [&](const std::string& filter, const std::string& name) {
    return cli({"run", "--suite", "smoke", "--filter", filter, "--backend", "cpu.paged", "--isolate", "none",
                "--no-progress", "-q", "--save-results", file(name).string()});
  };
  ASSERT_EQ(part(parent + "$", "parent.h5"), kExitPassed);
  ASSERT_EQ(part(parent + "/dims=glm$", "child.h5"), kExitPassed);
  ASSERT_EQ(part(parent + "(/dims=glm)?$", "both.h5"), kExitPassed);
  for (const auto& [a, b] : {std::pair{"parent.h5", "child.h5"}, std::pair{"child.h5", "parent.h5"}}) {
    const fs::path out = file(std::string("nested_") + a);
    fs::remove(out);
    ASSERT_EQ(cli({"merge", file(a).string(), file(b).string(), "--results", out.string(), "-q"}), kExitPassed) << a;
    EXPECT_EQ(cli({"compare", out.string(), file("both.h5").string()}), kExitPassed) << a;
  }
  // The same case in two files is refused.
  EXPECT_EQ(cli({"merge", file("both.h5").string(), file("child.h5").string(), "--results",
                 file("twice.h5").string(), "-q"}),
            kExitUsage);
  EXPECT_FALSE(fs::exists(file("twice.h5")));
}

TEST_F(ShardedRun, MergeRefusesShardsThatAreNotOneRun) {
  const fs::path out = file("bad.json"), outh = file("bad.h5");
  fs::remove(out);
  fs::remove(outh);
  // Missing 2/3, 0/3 twice, the whole run mixed in (its records are the shards'):
  // exit 2 and nothing written.
  EXPECT_EQ(cli({"merge", file("s0.json").string(), file("s1.json").string(), "--json", out.string()}), kExitUsage);
  EXPECT_EQ(cli({"merge", file("s0.json").string(), file("s0.json").string(), file("s1.json").string(),
                 file("s2.json").string(), "--json", out.string()}),
            kExitUsage);
  EXPECT_EQ(cli({"merge", file("whole.json").string(), file("s0.json").string(), "--json", out.string()}), kExitUsage);
  EXPECT_EQ(cli({"merge", file("s0.h5").string(), file("s2.h5").string(), "--results", outh.string()}), kExitUsage);
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(outh));
  // A file that is not a report, or a report with a key of the wrong type.
  {
    std::ofstream(file("trunc.json")) << "{\"schema\": \"mlagate.report\", \"schema_";
    auto j = read_json(file("s0.json"));
    j["records"][0]["block_size"] = "sixteen";
    std::ofstream(file("typed.json")) << j.dump();
  }
  EXPECT_EQ(cli({"merge", file("trunc.json").string(), "--json", out.string()}), kExitUsage);
  EXPECT_EQ(cli({"merge", file("typed.json").string(), "--json", out.string()}), kExitUsage);
  EXPECT_FALSE(fs::exists(out));
}

// A runner that shards with GoogleTest's variables (ctest, gtest-parallel)
// shards mlagate the same way, and sees the status file the protocol asks for.
TEST_F(ShardedRun, GoogleTestShardingVariablesAreHonoured) {
  const fs::path status = file("shard_status"), out = file("env.json");
  fs::remove(status);
  ::setenv("GTEST_TOTAL_SHARDS", "3", 1);
  ::setenv("GTEST_SHARD_INDEX", "1", 1);
  ::setenv("GTEST_SHARD_STATUS_FILE", status.c_str(), 1);
  const int rc = cli({"run", "--suite", "smoke", "--backend", "cpu.paged,cpu.splitkv", "--isolate", "none",
                      "--no-progress", "-q", "--json", out.string()});
  ::unsetenv("GTEST_TOTAL_SHARDS");
  ::unsetenv("GTEST_SHARD_INDEX");
  ::unsetenv("GTEST_SHARD_STATUS_FILE");
  EXPECT_EQ(rc, kExitPassed);
  EXPECT_TRUE(fs::exists(status));
  const auto j = read_json(out);
  EXPECT_EQ(j["run"]["shard"], "1/3");
  EXPECT_EQ(verdicts(j), verdicts(read_json(file("s1.json"))));
}

}  // namespace
}  // namespace mlagate
