// The verdicts through the real binary (harness/verdicts/VERDICTS.md), with
// the planted bugs of libmlagate_verdicts_plugin.so: a run's failures made
// known by `expect --from` turn the gate green, each entry is needed (without
// one, exit 1 naming its records), a fixed kernel is XPASS and fails under
// strict; triage names each planted bug's class and writes a report whose
// Python script shows the mismatch without mlagate; explore finds one cause
// per planted bug (a kernel and its twin are one), and known ones are no findings.
#include <gtest/gtest.h>

#include <cstdlib>

#include "harness/verdicts/expectations.h"
#include "tests/reliability/run_mlagate.h"

namespace mlagate {
namespace {

using namespace rel_test;

const std::string kVerdictsPlugin = MLAGATE_TEST_VERDICTS_PLUGIN;

int run(std::vector<std::string> args, const fs::path& dir) {
  args.insert(args.end(), {"--plugin", kVerdictsPlugin});
  return run_mlagate(args, dir);
}

Json summary_of(const fs::path& json) { return Json::parse(slurp(json))["summary"]; }

TEST(ExpectCli, ARunsFailuresMadeKnownEachEntryNeededAFixFailsStrict) {
  const fs::path d = temp_dir("verdicts_expect");
  // 40 heads meet tile16's trigger, 16 do not; reads_one_past fails everywhere.
  std::ofstream(d / "suite.yaml") << "name: s\ngroups:\n  - specs: [small_decode, single_decode, spec_decode_small]\n"
                                     "    tp: [1]\n    total_heads: [40, 16]\n";
  const std::vector<std::string> base = {"run", "--suite", (d / "suite.yaml").string(), "--backend",
                                         "verdicts.reads_one_past,verdicts.tile16", "--op", "decode", "--no-progress"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  ASSERT_EQ(run(with({"--json", (d / "r.json").string()}), d), 1) << slurp(d / "stdout.txt");
  const Json s0 = summary_of(d / "r.json");
  const long long failures = s0["failures"].get<long long>();
  ASSERT_GE(failures, 3);
  ASSERT_EQ(run_mlagate({"expect", "--from", (d / "r.json").string(), "--out", (d / "e.yaml").string()}, d), 0)
      << slurp(d / "stderr.txt");
  const ExpectationSet set = ExpectationSet::load(std::vector<std::string>{(d / "e.yaml").string()});
  ASSERT_EQ(set.entries().size(), 2u) << slurp(d / "e.yaml");  // one per planted bug, not per record

  // With the file: green, every failure XFAIL, no XPASS, nothing stale.
  ASSERT_EQ(run(with({"--json", (d / "x.json").string(), "--expect", (d / "e.yaml").string()}), d), 0) << slurp(d / "stdout.txt");
  const Json s1 = summary_of(d / "x.json");
  EXPECT_EQ(s1["XFAIL"].get<long long>(), failures);
  EXPECT_EQ(s1["XPASS"].get<long long>(), 0);
  EXPECT_EQ(s1["failures"].get<long long>(), 0);
  EXPECT_EQ(s1["verdict"], "PASS");
  EXPECT_NE(slurp(d / "stdout.txt").find(", 0 stale"), std::string::npos) << slurp(d / "stdout.txt");

  // Without one entry: exit 1, its records printed as failures.
  for (std::size_t drop = 0; drop < 2; ++drop) {
    std::vector<ExpectEntry> kept = set.entries();
    const std::string dropped_backend = kept[drop].backends.front();
    kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(drop));
    std::ofstream(d / "less.yaml") << expectations_yaml(kept, "");
    EXPECT_EQ(run(with({"--expect", (d / "less.yaml").string()}), d), 1) << dropped_backend;
    const std::string out = slurp(d / "stdout.txt");
    EXPECT_NE(out.find("  " + dropped_backend), std::string::npos) << out;
    EXPECT_NE(out.find("repro: "), std::string::npos) << out;
  }

  // A fixed kernel: cpu.paged under the same entries (their backends renamed) passes: XPASS.
  std::vector<ExpectEntry> fixed = set.entries();
  for (ExpectEntry& e : fixed) e.backends = {"cpu.paged"};
  fixed.resize(1);
  std::ofstream(d / "fixed.yaml") << expectations_yaml(fixed, "");
  const std::vector<std::string> paged = {"run", "--suite", (d / "suite.yaml").string(), "--backend", "cpu.paged", "--op", "decode", "--no-progress",
                                          "--expect", (d / "fixed.yaml").string(), "--json", (d / "f.json").string()};
  EXPECT_EQ(run_mlagate(paged, d), 1) << slurp(d / "stdout.txt");
  const Json s2 = summary_of(d / "f.json");
  EXPECT_GT(s2["XPASS"].get<long long>(), 0);
  EXPECT_EQ(s2["failures"].get<long long>(), s2["XPASS"].get<long long>());
  EXPECT_NE(slurp(d / "stdout.txt").find("XPASS"), std::string::npos);
  fixed[0].strict = false;
  std::ofstream(d / "fixed.yaml") << expectations_yaml(fixed, "");
  EXPECT_EQ(run_mlagate(paged, d), 0) << slurp(d / "stdout.txt");

  // A malformed file: exit 2 naming it, before anything runs (no report written).
  std::ofstream(d / "bad.yaml") << "schema: mlagate.expect/1\nexpect:\n  - {id: a, backend: x, reason: r, where: {colour: red}}\n";
  fs::remove(d / "none.json");
  EXPECT_EQ(run(with({"--expect", (d / "bad.yaml").string(), "--json", (d / "none.json").string()}), d), 2);
  EXPECT_NE(slurp(d / "stderr.txt").find("bad.yaml:3: expect[0].where.colour: no such fact"), std::string::npos)
      << slurp(d / "stderr.txt");
  EXPECT_FALSE(fs::exists(d / "none.json"));

  // merge --expect judges the merged records again (their facts came with them).
  EXPECT_EQ(run_mlagate({"merge", (d / "r.json").string(), "--json", (d / "m.json").string(), "--expect",
                         (d / "e.yaml").string()},
                        d),
            0)
      << slurp(d / "stdout.txt") << slurp(d / "stderr.txt");
  EXPECT_EQ(summary_of(d / "m.json")["XFAIL"].get<long long>(), failures);
}

std::string triage_class(const fs::path& d, const std::vector<std::string>& args) {
  std::vector<std::string> a = {"triage", "--plugin", kVerdictsPlugin, "--out", (d / "t").string()};
  a.insert(a.end(), args.begin(), args.end());
  EXPECT_EQ(run_mlagate(a, d), 0) << slurp(d / "stdout.txt") << slurp(d / "stderr.txt");
  const Json rep = Json::parse(slurp(d / "t" / "report.json"));
  return rep["class"].get<std::string>();
}

TEST(TriageCli, NamesEachPlantedBugsClassAndItsScriptShowsTheMismatch) {
  const fs::path d = temp_dir("verdicts_triage");
  const std::string small = "smoke/small_decode/tp16/bf16/kv=auto/bs=auto/seed=0";
  EXPECT_EQ(triage_class(d, {"--suite", "smoke", "--case", small, "--backend", "verdicts.reads_one_past", "--op", "decode"}),
            "reads memory it must not");
  const std::string md = slurp(d / "t" / "report.md");
  for (const char* part : {"## Environment", "## The case", "## Expected against actual", "## What-if variants", "poison zero",
                           "## Reproduce", "mlagate replay", "python3"})
    EXPECT_NE(md.find(part), std::string::npos) << part << "\n" << md;
  // The script needs h5py and numpy (the Quick start installs them).
  if (std::system("python3 -c 'import h5py, numpy' 2>/dev/null") == 0) {
    const std::string cmd = "cd " + (d / "t").string() + " && python3 repro.py > script.txt 2>&1";
    const int rc = std::system(cmd.c_str());
    const std::string out = slurp(d / "t" / "script.txt");
    EXPECT_EQ(WEXITSTATUS(rc), 1) << out;  // a mismatch shown
    EXPECT_NE(out.find("non-finite where the reference is finite"), std::string::npos) << out;
    EXPECT_NE(out.find("first non-finite: request"), std::string::npos) << out;
  }
  // The scale's bias shows at long contexts and larger logits (lse 5x the baseline's error here).
  std::ofstream(d / "long.yaml") << "name: long\nspecs:\n  long_decode: {seq_lens: [4096, 8192], query_lens: [1, 1]}\n"
                                    "groups:\n  - specs: [long_decode]\n    tp: [16]\n    kv_cache_dtype: [fp8]\n"
                                    "    k_scale: [0.01]\n    q_magnitude: [4]\n";
  EXPECT_EQ(triage_class(d, {"--suite", (d / "long.yaml").string(), "--backend", "verdicts.kscale_bf16", "--op", "decode",
                             "--no-bundle"}),
            "scale rounded to the model dtype")
      << slurp(d / "t" / "report.md");
  // FA2's lse class: fails in bf16 and errs about 8x less in fp16.
  EXPECT_EQ(triage_class(d, {"--suite", "smoke", "--case", small, "--backend", "verdicts.lse_rounded", "--op", "decode", "--no-bundle"}),
            "model-dtype precision")
      << slurp(d / "t" / "report.md");
  std::ofstream(d / "heads.yaml") << "name: h\ngroups:\n  - specs: [small_decode]\n    tp: [1]\n    total_heads: [40]\n";
  EXPECT_EQ(triage_class(d, {"--suite", (d / "heads.yaml").string(), "--backend", "verdicts.tile16", "--op", "decode",
                             "--no-bundle"}),
            "unexplained");
}

TEST(ExploreCauses, OnePerPlantedBugAndKnownOnesAreNoFindings) {
  const fs::path d = temp_dir("verdicts_explore");
  std::ofstream(d / "space.yaml") << "name: space\nexplore:\n  ops: [decode]\n  requests: [1, 3]\n  seq_len: [1, 300]\n"
                                     "  query_len: [1, 4]\n  heads: [17, 40]\n  dims: [deepseek]\n  dtype: [bf16]\n"
                                     "  kv_cache_dtype: [auto]\n  block_size: [16]\n  max_work: 1.0e8\n";
  const std::vector<std::string> base = {"explore", "--backend", "verdicts.tile16,verdicts.tile16_graph,verdicts.reads_one_past",
                                         "--suite", (d / "space.yaml").string(), "--cases", "6", "--round", "6",
                                         "--no-shrink", "--plugin", kVerdictsPlugin, "--seed", "3"};
  std::vector<std::string> a = base;
  a.insert(a.end(), {"--out", (d / "x").string()});
  ASSERT_EQ(run_mlagate(a, d), 1) << slurp(d / "stdout.txt") << slurp(d / "stderr.txt");
  const Json rep = Json::parse(slurp(d / "x" / "report.json"));
  const Json& causes = rep["causes"];
  ASSERT_EQ(causes.size(), 2u) << rep.dump(1);
  std::map<std::string, Json> by_backend;
  for (const Json& c : causes)
    for (const Json& b : c["backends"]) by_backend[b.get<std::string>()] = c;
  EXPECT_EQ(by_backend["verdicts.tile16"]["name"], by_backend["verdicts.tile16_graph"]["name"]) << rep.dump(1);
  EXPECT_EQ(by_backend["verdicts.reads_one_past"]["class"], "reads memory it must not") << rep.dump(1);
  EXPECT_GE(rep["findings"].size(), causes.size());
  for (const Json& f : rep["findings"]) EXPECT_TRUE(f.contains("cause")) << f.dump();
  const std::string out = slurp(d / "stdout.txt");
  EXPECT_NE(out.find("2 cause(s) of"), std::string::npos) << out;

  // The reads_one_past failures made known: they are no findings; the tile16 cause remains.
  std::ofstream(d / "known.yaml") << "schema: mlagate.expect/1\nexpect:\n  - id: one-past\n    backend: verdicts.reads_one_past\n"
                                     "    reason: reads one key past seq_len\n";
  a = base;
  a.insert(a.end(), {"--out", (d / "y").string(), "--expect", (d / "known.yaml").string()});
  ASSERT_EQ(run_mlagate(a, d), 1) << slurp(d / "stdout.txt");
  const Json rep2 = Json::parse(slurp(d / "y" / "report.json"));
  EXPECT_EQ(rep2["causes"].size(), 1u) << rep2.dump(1);
  ASSERT_TRUE(rep2["known"].contains("one-past")) << rep2.dump(1);
  EXPECT_GT(rep2["known"]["one-past"]["count"].get<long long>(), 0);
  for (const Json& f : rep2["findings"]) EXPECT_NE(f["backend"], "verdicts.reads_one_past") << f.dump();

  // An entry that selects passing records: each is an XPASS, counted under the
  // entry, and the search ends PASS (its first XPASS once stopped explore with
  // an internal error on the GPU, where the kernel libraries' entries select
  // cases a drawn search passes).
  std::ofstream(d / "xpass.yaml") << "schema: mlagate.expect/1\nexpect:\n  - id: cpu-passes\n    backend: cpu.paged\n"
                                     "    reason: no failure expected; selects every record\n";
  ASSERT_EQ(run_mlagate({"explore", "--backend", "cpu.paged", "--suite", (d / "space.yaml").string(), "--cases", "4",
                         "--no-shrink", "--seed", "3", "--expect", (d / "xpass.yaml").string(), "--out", (d / "z").string()},
                        d),
            0)
      << slurp(d / "stdout.txt") << slurp(d / "stderr.txt");
  const Json rep3 = Json::parse(slurp(d / "z" / "report.json"));
  EXPECT_EQ(rep3["xpass"]["cpu-passes"]["count"].get<long long>(), rep3["records"]["PASSED"].get<long long>()) << rep3.dump(1);
  EXPECT_GT(rep3["xpass"]["cpu-passes"]["count"].get<long long>(), 0);
}

}  // namespace
}  // namespace mlagate
