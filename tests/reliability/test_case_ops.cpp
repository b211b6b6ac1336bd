// Suite groups that name their ops (CaseSpec::ops): a case runs only in the
// ops of the run it lists, in workers and in process, and a case drawn for
// cache_write alone (keys_only) is never handed on to a case of other ops.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cases/suite.h"
#include "harness/reliability/shrink.h"
#include "tests/reliability/run_mlagate.h"

namespace mlagate {
namespace {

using namespace rel_test;

// A suite group's `ops` (CaseSpec::ops): its cases run in those of the run's
// ops alone, in a worker as in this process; `--op auto` brings them, the
// other cases take the default. explore's rounds depend on it (one run for
// every op), and on cases_as_suite_yaml writing the ops back.
TEST(Isolation, CasesRunInTheOpsTheirGroupsName) {
  const fs::path d = temp_dir("case_ops");
  std::ofstream(d / "ops.yaml") << "name: ops\n"
                                   "groups:\n"
                                   "  - specs: [small_decode]\n"
                                   "    tp: [16]\n"
                                   "    ops: [decode]\n"
                                   "  - specs: [mixed_small]\n"
                                   "    tp: [16]\n"
                                   "    ops: [prefill, cache_write]\n"
                                   "  - specs: [small_prefill]\n"
                                   "    tp: [16]\n";
  using Jobs = std::multiset<std::string>;
  auto jobs = [&](const std::string& op, const char* iso) {
    const fs::path json = d / (op + "_" + iso + ".json");
    EXPECT_EQ(run_mlagate({"run", "--suite", (d / "ops.yaml").string(), "--backend", "cpu.paged", "--op", op, "--isolate",
                           iso, "--no-progress", "--json", json.string()},
                          d),
              0)
        << slurp(d / "stderr.txt");
    Jobs out;
    const Json report = Json::parse(slurp(json));
    for (const Json& r : report.at("records")) {
      EXPECT_EQ(r.at("status"), "PASSED") << r.dump();
      const std::string id = r.at("id").get<std::string>();  // "ops/SPEC/tp16/..."
      out.insert(id.substr(4, id.find('/', 4) - 4) + " " + r.at("op").get<std::string>());
    }
    return out;
  };
  for (const char* iso : {"process", "none"}) {
    EXPECT_EQ(jobs("auto", iso),
              (Jobs{"small_decode decode", "mixed_small prefill", "mixed_small cache_write", "small_prefill layer"}))
        << iso;
    EXPECT_EQ(jobs("decode,layer,prefill", iso), (Jobs{"small_decode decode", "mixed_small prefill", "small_prefill decode",
                                                       "small_prefill layer", "small_prefill prefill"}))
        << iso;
  }
  Suite s = load_suite((d / "ops.yaml").string());
  for (std::size_t i = 0; i < s.cases.size(); ++i) s.cases[i].batch.name = "b" + std::to_string(i);  // apart from specs.yaml's
  const Suite back = parse_suite_yaml(cases_as_suite_yaml(s.cases, "ops"), "back.yaml");
  ASSERT_EQ(back.cases.size(), 3u);
  EXPECT_EQ(back.cases[1].ops, (std::vector<Op>{Op::kPrefill, Op::kCacheWrite}));
  EXPECT_TRUE(back.cases[2].ops.empty());
}

// A case that takes only cache_write is drawn keys_only (no queries, weights
// or cache values); the next case of its input set, fp8_e4m3 (the same cache
// values: the whole context would move on) taking decode and layer, is drawn
// anew, and its records are those of a run without the cache_write case.
TEST(Isolation, AKeysOnlyCaseIsNeverHandedOnToOtherOps) {
  const fs::path d = temp_dir("keys_only");
  const std::string second = "  - specs: [small_decode]\n"
                             "    tp: [16]\n"
                             "    kv_cache_dtype: [fp8_e4m3]\n"
                             "    ops: [decode, layer]\n";
  std::ofstream(d / "both.yaml") << "name: k\ngroups:\n"
                                    "  - specs: [small_decode]\n"
                                    "    tp: [16]\n"
                                    "    kv_cache_dtype: [fp8]\n"
                                    "    ops: [cache_write]\n"
                                 << second;
  std::ofstream(d / "second.yaml") << "name: k\ngroups:\n" << second;
  auto records = [&](const std::string& suite, const char* iso) {
    const fs::path json = d / (suite + "_" + iso + ".json");
    EXPECT_EQ(run_mlagate({"run", "--suite", (d / (suite + ".yaml")).string(), "--backend", "cpu.paged", "--op", "auto",
                           "--isolate", iso, "--workers", "1", "--no-progress", "--json", json.string()},
                          d),
              0)
        << slurp(d / "stderr.txt");
    std::map<std::string, std::string> out;
    const Json report = Json::parse(slurp(json));
    for (const Json& r : report.at("records")) {
      EXPECT_EQ(r.at("status"), "PASSED") << r.dump();
      out[r.at("id").get<std::string>() + " " + r.at("op").get<std::string>()] = r.at("metrics").dump();
    }
    return out;
  };
  for (const char* iso : {"process", "none"}) {
    auto both = records("both", iso);
    const auto alone = records("second", iso);
    EXPECT_EQ(both.size(), 3u) << iso;
    EXPECT_EQ(std::erase_if(both, [](const auto& kv) { return kv.first.ends_with(" cache_write"); }), 1u) << iso;
    EXPECT_EQ(both, alone) << iso;
  }
}

}  // namespace
}  // namespace mlagate
