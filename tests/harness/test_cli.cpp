// The CLI edge: exit codes (0 pass, 1 verdict failed, 2 usage/input error) and
// the report files, driven through cli_main as a user would.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <pugixml.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "cases/suite.h"
#include "harness/cli/cli.h"
#include "tests/cli_call.h"

namespace mlagate {
namespace {

namespace fs = std::filesystem;

using test::cli;

fs::path temp_dir() { return test::scratch_dir("mlagate_cli"); }

void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

TEST(Cli, PassingRunExitsZeroAndWritesReports) {
  const fs::path d = temp_dir();
  const int rc = cli({"run", "--suite", "smoke", "--spec", "small_decode,mixed_small", "--backend", "cpu.paged,cpu.splitkv", "--json",
                      (d / "r.json").string(), "--junit", (d / "r.xml").string(), "--markdown", (d / "r.md").string(),
                      "--no-progress"});
  EXPECT_EQ(rc, kExitPassed);
  std::ifstream js(d / "r.json");
  const auto j = nlohmann::json::parse(js);
  // smoke has small_decode once and mixed_small twice (bf16 tp16, fp16 tp8), on 2 backends.
  EXPECT_EQ(j["records"].size(), 6u);
  for (const auto& r : j["records"]) EXPECT_EQ(r["status"], "PASSED");
  pugi::xml_document doc;
  ASSERT_TRUE(doc.load_file((d / "r.xml").c_str()));
  EXPECT_EQ(doc.select_nodes("//testcase").size(), 6u);
  EXPECT_EQ(doc.select_nodes("//failure").size(), 0u);
  EXPECT_TRUE(fs::file_size(d / "r.md") > 0);
}

// A run in which no record executed must not look like a pass to a CI gate
// (a CPU-only runner given --backend 'cuda.*' used to exit 0): exit 4, the
// reports still written, unless --allow-nothing-ran. cpu.sparse takes no dense
// case, so every record is NOT_SUPPORTED on any machine.
TEST(Cli, NothingRanExitsFourUnlessAllowed) {
  const fs::path d = temp_dir();
  const fs::path json = d / "nothing.json";
  fs::remove(json);
  EXPECT_EQ(cli({"run", "--spec", "small_decode", "--tp", "16", "--backend", "cpu.sparse", "--no-progress", "--json",
                 json.string()}),
            kExitNothingRan);
  std::ifstream js(json);
  const auto j = nlohmann::json::parse(js);
  EXPECT_EQ(j["summary"]["verdict"], "NOTHING RAN");
  ASSERT_EQ(j["records"].size(), 1u);
  EXPECT_EQ(j["records"][0]["status"], "NOT_SUPPORTED");
  EXPECT_EQ(cli({"run", "--spec", "small_decode", "--tp", "16", "--backend", "cpu.sparse", "--no-progress", "-q",
                 "--allow-nothing-ran"}),
            kExitPassed);
  // One record that ran is enough: the NOT_SUPPORTED rows beside it do not fail the run.
  EXPECT_EQ(cli({"run", "--spec", "small_decode", "--tp", "16", "--backend", "cpu.sparse,cpu.paged", "--no-progress",
                 "-q"}),
            kExitPassed);
}

TEST(Cli, FailingVerdictExitsOneWithReproInJunit) {
  const fs::path d = temp_dir();
  // A zero tolerance fails any bf16 backend: a verdict failure, not an error.
  const int rc = cli({"run", "--spec", "small_decode", "--tp", "16", "--backend", "cpu.paged", "--policy", "fixed",
                      "--atol", "0", "--rtol", "0", "--junit", (d / "f.xml").string(), "--no-progress"});
  EXPECT_EQ(rc, kExitFailed);
  pugi::xml_document doc;
  ASSERT_TRUE(doc.load_file((d / "f.xml").c_str()));
  const auto failure = doc.select_node("//failure").node();
  ASSERT_TRUE(failure);
  EXPECT_NE(std::string(failure.child_value()).find("mlagate run --spec small_decode --tp 16"), std::string::npos);
}

TEST(Cli, ReproCommandRerunsExactlyThatRecord) {
  const fs::path d = temp_dir();
  EXPECT_EQ(cli({"run", "--suite", "edges", "--filter", "edge_padding/tp16/bf16/kv=auto/bs=64", "--backend",
                 "cpu.splitkv", "--policy", "fixed", "--atol", "0", "--rtol", "0", "--json", (d / "a.json").string(),
                 "--no-progress"}),
            kExitFailed);
  std::ifstream js(d / "a.json");
  const auto j = nlohmann::json::parse(js);
  ASSERT_EQ(j["records"].size(), 1u);
  const std::string repro = j["records"][0]["repro"];
  EXPECT_NE(repro.find("--filter '^edges\\/edge_padding\\/tp16\\/bf16\\/kv=auto\\/bs=64\\/seed=0$'"), std::string::npos)
      << repro;
}

TEST(Cli, UsageAndInputErrorsExitTwo) {
  const fs::path d = temp_dir();
  EXPECT_EQ(cli({"run", "--suite", "no_such_suite"}), kExitUsage);
  EXPECT_EQ(cli({"run", "--suite", "smoke", "--backend", "gpu.nothing"}), kExitUsage);
  EXPECT_EQ(cli({"run", "--suite", "smoke", "--filter", "(unclosed"}), kExitUsage);
  EXPECT_EQ(cli({"run", "--suite", "smoke", "--filter", "matches-nothing"}), kExitUsage);
  EXPECT_EQ(cli({"run", "--spec", "small_decode", "--tp", "3"}), kExitUsage);  // 128 heads not divisible by 3
  EXPECT_EQ(cli({"run", "--spec", "small_decode", "--block-size", "sixteen"}), kExitUsage);
  EXPECT_EQ(cli({"run", "--policy", "lenient"}), kExitUsage);
  EXPECT_EQ(cli({"run", "--no-such-flag"}), kExitUsage);
  EXPECT_EQ(cli({}), kExitUsage);
  write(d / "bad.yaml", "name: bad\ngroups:\n  - specs: [small_decode]\n    tp: [abc]\n");
  EXPECT_EQ(cli({"run", "--suite", (d / "bad.yaml").string()}), kExitUsage);
  write(d / "broken.yaml", "name: broken\ngroups: [ {specs: [small_decode]\n");
  EXPECT_EQ(cli({"run", "--suite", (d / "broken.yaml").string()}), kExitUsage);
  // A report path in a missing directory: an input error, and nothing is left behind.
  EXPECT_EQ(cli({"run", "--spec", "small_decode", "--tp", "16", "--backend", "cpu.paged", "--json",
                 (d / "missing" / "r.json").string(), "--no-progress"}),
            kExitUsage);
  EXPECT_FALSE(fs::exists(d / "missing"));
}

// fp8 cache formats on the command line: the kv token carries the
// fp8_ds_mla scale rule into the id, and the cache_write op runs.
TEST(Cli, Fp8FormatsAndTheCacheWriteOp) {
  const fs::path d = temp_dir();
  EXPECT_EQ(cli({"run", "--spec", "small_decode", "--tp", "16", "--kv-cache-dtype", "fp8,fp8_ds_mla:raw", "--backend",
                 "cpu.paged", "--op", "layer,cache_write", "--json", (d / "fp8.json").string(), "--no-progress"}),
            kExitPassed);
  std::ifstream js(d / "fp8.json");
  const auto j = nlohmann::json::parse(js);
  ASSERT_EQ(j["records"].size(), 4u);
  EXPECT_EQ(j["records"][2]["id"], "sweep/small_decode/tp16/bf16/kv=fp8_ds_mla:raw/bs=auto/seed=0");
  EXPECT_EQ(j["records"][3]["op"], "cache_write");
  EXPECT_EQ(j["records"][3]["status"], "PASSED");
  EXPECT_EQ(j["records"][2]["metrics"].back()["output"], "quant_error");
  EXPECT_EQ(cli({"run", "--spec", "small_decode", "--kv-cache-dtype", "fp8:raw"}), kExitUsage);
  EXPECT_EQ(cli({"run", "--spec", "small_decode", "--kv-cache-dtype", "fp8_ds_mla:ue8m0"}), kExitUsage);
  EXPECT_EQ(cli({"run", "--spec", "small_decode", "--dtype", "fp16", "--kv-cache-dtype", "fp8_ds_mla"}), kExitUsage);
  EXPECT_EQ(cli({"list", "cases", "--suite", "fp8", "--filter", "kv=fp8_ds_mla:raw/.*kscale=3"}), kExitPassed);
}

TEST(Cli, CustomSuiteFileWithItsOwnSpec) {
  const fs::path d = temp_dir();
  write(d / "mine.yaml",
        "name: mine\nspecs:\n  tiny: {seq_lens: [5, 9], query_lens: [2, 1]}\ngroups:\n  - specs: [tiny]\n    tp: [32]\n");
  EXPECT_EQ(cli({"run", "--suite", (d / "mine.yaml").string(), "--backend", "cpu.*", "--no-progress"}), kExitPassed);
}

// Each listing says what it lists: every built-in suite with its case count,
// the specs' lengths, every registered backend, exactly the filtered cases,
// and the matrix's verdicts with their reasons.
TEST(Cli, ListingsSayWhatTheyList) {
  const auto listing = [](std::initializer_list<std::string> args, int expected_rc = kExitPassed) {
    ::testing::internal::CaptureStdout();
    const int rc = cli(args);
    std::fflush(stdout);
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_EQ(rc, expected_rc) << out;
    return out;
  };
  const auto lines_of = [](const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);)
      if (!l.empty()) lines.push_back(l);
    return lines;
  };
  const std::string suites = listing({"list", "suites"});
  for (const std::string& name : builtin_suite_names()) {
    const std::regex row("(^|\\n)" + name + " +" + std::to_string(load_suite(name).cases.size()) + " cases ");
    EXPECT_TRUE(std::regex_search(suites, row)) << name << " with its case count, in:\n" << suites;
  }
  const std::string specs = listing({"list", "specs"});
  EXPECT_TRUE(std::regex_search(specs, std::regex("small_decode +seq_lens=32,40 +query_lens=1,1"))) << specs;
  const std::string backends = listing({"list", "backends"});
  for (const BackendEntry& e : backend_registry())
    EXPECT_TRUE(std::regex_search(backends, std::regex("(^|\\n)" + std::regex_replace(e.name, std::regex("\\."), "\\.") + " ")))
        << e.name << " in:\n" << backends;
  const auto cases = lines_of(listing({"list", "cases", "--suite", "vllm", "--filter", "tp8"}));
  std::size_t tp8 = 0;
  for (const CaseSpec& c : load_suite("vllm").cases) tp8 += c.tp == 8;
  EXPECT_EQ(cases.size(), tp8);
  for (const std::string& l : cases) EXPECT_NE(l.find("/tp8/"), std::string::npos) << l;
  const std::string matrix = listing({"list", "matrix", "--spec", "spec_decode_small", "--block-size", "8,16"});
  EXPECT_TRUE(std::regex_search(matrix, std::regex("sweep/spec_decode_small/tp1/bf16/kv=auto/bs=8/seed=0 +NO +NO"))) << matrix;
  EXPECT_TRUE(std::regex_search(matrix, std::regex("sweep/spec_decode_small/tp1/bf16/kv=auto/bs=16/seed=0 +yes +yes"))) << matrix;
  EXPECT_NE(matrix.find("cpu.paged: block size 8 not in {16, 1, 32, 64, 128}"), std::string::npos) << matrix;
  listing({"list", "everything"}, kExitUsage);
}

// One name per backend: the registry lists each backend under the name it
// reports itself (records, globs and plugins' duplicate check all use it),
// and no name is listed twice.
TEST(Registry, EveryNameIsTheBackendsOwn) {
  std::set<std::string> seen;
  for (const BackendEntry& e : backend_registry()) {
    EXPECT_TRUE(seen.insert(e.name).second) << e.name << " is listed twice";
    const std::unique_ptr<Backend> b = e.make({});
    ASSERT_NE(b, nullptr) << e.name;
    EXPECT_EQ(b->name(), e.name);
  }
  EXPECT_GE(seen.size(), 4u);  // cpu.paged, cpu.splitkv, cpu.sparse, cpu.sparse.splitkv at least
}

}  // namespace
}  // namespace mlagate
