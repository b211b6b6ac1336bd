// mlagate shrink end to end, through the real binary and the planted backends
// of libmlagate_reliability_plugin.so: a NaN, a crash and an order-dependent
// failure shrink to their smallest cases, and what shrink saves reruns them.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "cases/suite.h"
#include "harness/reliability/isolate.h"
#include "harness/reliability/shrink.h"
#include "tests/reliability/run_mlagate.h"

namespace mlagate {
namespace {

using namespace rel_test;

// mlagate shrink: a padding NaN (rel.skip_padding) on a 4-request, 8-head
// case shrinks to the padding request alone, one head, block size 1; the
// suite file it writes and the golden bundle fail the same way when rerun.
TEST(Shrink, PaddingNanShrinksToThePaddingRequestAlone) {
  const fs::path d = temp_dir("shrink_pad");
  const std::string pad = "edges/edge_padding/tp16/bf16/kv=auto/bs=64/seed=0";
  ASSERT_EQ(run_mlagate({"shrink", "--plugin", kPlugin, "--suite", "edges", "--case", pad, "--backend",
                         "rel.skip_padding", "--out", (d / "s").string()},
                        d),
            0)
      << slurp(d / "stderr.txt");
  const std::string out = slurp(d / "stdout.txt");
  EXPECT_NE(out.find("from: 4 requests, 4 query tokens, 72 keys, 8 heads, block size 64"), std::string::npos) << out;
  EXPECT_NE(out.find("to:   1 requests, 1 query tokens, 0 keys, 1 heads, block size 1"), std::string::npos) << out;
  EXPECT_NE(out.find("NONFINITE: out: NaN where the reference has 0 at request 0, token 0, head 0, dim 0"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("stopped by"), std::string::npos) << out;  // it ran out of candidates, nothing cut it short
  // The suite file reruns it; the bundle replays it.
  EXPECT_EQ(run_mlagate(with_plugin({"run", "--suite", (d / "s" / "shrunk.yaml").string(), "--backend",
                                     "rel.skip_padding", "--json", (d / "r.json").string()}),
                        d),
            1);
  const auto recs = records_of(d / "r.json");
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs.begin()->second.at("status"), "NONFINITE");
  std::vector<fs::path> bundles;
  for (const auto& e : fs::directory_iterator(d / "s" / "bundle")) bundles.push_back(e.path());
  ASSERT_EQ(bundles.size(), 1u);
  EXPECT_EQ(run_mlagate(with_plugin({"replay", bundles[0].string(), "--backend", "rel.skip_padding"}), d), 1);
}

// A shrink given a deadline (explore's budget) or --max-runs stops there
// with the case shrunk so far, says which limit stopped it, and still makes
// the final run (suite file, bundle, repro) of that case. Called in this
// process, each run in the real binary.
TEST(Shrink, ADeadlineOrMaxRunsStopsItWithTheCaseSoFar) {
  set_worker_executable(kBin);
  const fs::path d = temp_dir("shrink_limits");
  CaseSpec pad;
  for (const CaseSpec& c : load_suite("edges").cases)
    if (c.id() == "edges/edge_padding/tp16/bf16/kv=auto/bs=64/seed=0") pad = c;
  ASSERT_EQ(pad.batch.seq_lens.size(), 4u);
  ShrinkOptions so;
  so.target = pad;
  so.backend = "rel.skip_padding";
  so.op = Op::kDecode;
  so.run_args = {"--plugin", kPlugin};
  so.log = nullptr;
  // Past already: the first run (the status to keep) and the final one, nothing between.
  so.out_dir = (d / "past").string();
  so.deadline = std::chrono::steady_clock::now();
  ShrinkResult r = shrink_case(so);
  EXPECT_EQ(r.stopped_by, "the time given (explore's budget)");
  EXPECT_EQ(r.runs, 2);
  EXPECT_EQ(r.to.batch.seq_lens, pad.batch.seq_lens);
  EXPECT_EQ(r.status, "NONFINITE");
  EXPECT_TRUE(r.same);
  EXPECT_TRUE(fs::exists(r.yaml));
  // Three runs: the first and two candidates, then the final one.
  so.out_dir = (d / "runs").string();
  so.deadline.reset();
  so.max_runs = 3;
  r = shrink_case(so);
  EXPECT_EQ(r.stopped_by, "--max-runs 3");
  EXPECT_EQ(r.runs, 4);
  EXPECT_EQ(r.status, "NONFINITE");
}

// A crash shrinks too (each candidate runs in its own process); an
// order-dependent failure keeps its predecessor and stays order-dependent; a
// passing record is an input error (nothing to shrink).
TEST(Shrink, CrashesAndOrderDependentFailures) {
  const fs::path d = temp_dir("shrink_more");
  ASSERT_EQ(run_mlagate({"shrink", "--plugin", kPlugin, "--suite", "smoke", "--case",
                         "smoke/mixed_small/tp16/bf16/kv=auto/bs=auto/seed=0", "--backend", "rel.segv", "--max-runs", "4", "--out", (d / "c").string()},
                        d),
            0)
      << slurp(d / "stderr.txt");
  std::string out = slurp(d / "stdout.txt");
  EXPECT_NE(out.find("shrinking rel.segv layer: CRASHED"), std::string::npos) << out;
  EXPECT_NE(out.find("drop request 0                     CRASHED"), std::string::npos) << out;
  EXPECT_NE(out.find("(5 runs)"), std::string::npos) << out;  // the first run, 3 candidates, the final run

  const std::string pad = "edges/edge_padding/tp16/bf16/kv=auto/bs=16/seed=0";
  const std::string before = "edges/edge_block_boundary/tp16/bf16/kv=auto/bs=16/seed=0";
  ASSERT_EQ(run_mlagate({"shrink", "--plugin", kPlugin, "--suite", "edges", "--case", before, "--case", pad, "--backend",
                         "rel.stale", "--max-runs", "3", "--out", (d / "o").string()},
                        d),
            0)
      << slurp(d / "stderr.txt");
  out = slurp(d / "stdout.txt");
  EXPECT_NE(out.find("shrinking rel.stale layer: INCORRECT"), std::string::npos) << out;
  EXPECT_NE(out.find("order-dependent (passes alone, fails right after shrunk/before0/"), std::string::npos) << out;
  EXPECT_NE(out.find("--case shrunk/before0/"), std::string::npos) << out;  // the repro runs the pair

  EXPECT_EQ(run_mlagate({"shrink", "--suite", "smoke", "--spec", "small_decode", "--tp", "16", "--backend", "cpu.paged",
                         "--out", (d / "p").string()},
                        d),
            2);
  EXPECT_NE(slurp(d / "stderr.txt").find("is PASSED: nothing to shrink"), std::string::npos) << slurp(d / "stderr.txt");
}

// A serving mode's record shrinks with its numbers: a log2 lse (rel.lse_log2)
// caught by DCP over 8 ranks with interleave 4 shrinks to 2 ranks, interleave
// 1 and one request; caught by a decode loop (the baseline policy gates lse),
// to one step. The repro commands carry the mode's flags.
TEST(Shrink, ServingModesShrinkTheirNumbers) {
  const fs::path d = temp_dir("shrink_serving");
  const std::string c = "smoke/small_decode/tp16/bf16/kv=auto/bs=auto/seed=0";
  ASSERT_EQ(run_mlagate({"shrink", "--plugin", kPlugin, "--suite", "smoke", "--case", c, "--backend", "rel.lse_log2",
                         "--policy", "vllm", "--dcp", "8", "--dcp-interleave", "4", "--out", (d / "dcp").string()},
                        d),
            0)
      << slurp(d / "stderr.txt");
  std::string out = slurp(d / "stdout.txt");
  EXPECT_NE(out.find("shrinking rel.lse_log2 decode: INCORRECT"), std::string::npos) << out;
  EXPECT_NE(out.find("base 2"), std::string::npos) << out;
  EXPECT_NE(out.find("ranks 4 -> 2"), std::string::npos) << out;
  EXPECT_NE(out.find("interleave 2 -> 1"), std::string::npos) << out;
  EXPECT_NE(out.find("to:   1 requests"), std::string::npos) << out;
  EXPECT_NE(out.find("--dcp 2 --dcp-interleave 1"), std::string::npos) << out;
  // The golden bundle replays the same failure in the same mode.
  std::vector<fs::path> bundles;
  for (const auto& e : fs::directory_iterator(d / "dcp" / "bundle")) bundles.push_back(e.path());
  ASSERT_EQ(bundles.size(), 1u);
  EXPECT_EQ(run_mlagate(with_plugin({"replay", bundles[0].string(), "--backend", "rel.lse_log2", "--op", "decode",
                                     "--policy", "vllm", "--dcp", "2", "--json", (d / "replay.json").string()}),
                        d),
            1);
  const auto recs = records_of(d / "replay.json");
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs.begin()->second.at("status"), "INCORRECT");
  EXPECT_EQ(recs.begin()->second.at("mode"), "dcp=2,interleave=1");
  ASSERT_EQ(run_mlagate({"shrink", "--plugin", kPlugin, "--suite", "smoke", "--case", c, "--backend", "rel.lse_log2",
                         "--steps", "8", "--out", (d / "steps").string()},
                        d),
            0)
      << slurp(d / "stderr.txt");
  out = slurp(d / "stdout.txt");
  EXPECT_NE(out.find("shrinking rel.lse_log2 decode: INCORRECT"), std::string::npos) << out;
  EXPECT_NE(out.find("steps 2 -> 1"), std::string::npos) << out;
  EXPECT_NE(out.find("step 0 of 1 is the first to fail"), std::string::npos) << out;
  EXPECT_NE(out.find("base 2"), std::string::npos) << out;
  EXPECT_NE(out.find("--steps 1"), std::string::npos) << out;
}

// BATCH_VARIANT is not a failure of the run unless it is required: the same
// run of a batch-dependent backend (rel.batch_bits) exits 0, then 1 with
// --require batch-invariance; the record is BATCH_VARIANT either way.
TEST(Shrink, RequireBatchInvarianceFailsTheRun) {
  const fs::path d = temp_dir("require_bi");
  const std::vector<std::string> run = {"run", "--suite", "smoke", "--filter", "small_decode", "--backend",
                                        "rel.batch_bits", "--check", "batch-invariance"};
  auto args = with_plugin(run);
  args.insert(args.end(), {"--json", (d / "a.json").string()});
  EXPECT_EQ(run_mlagate(args, d), 0) << slurp(d / "stderr.txt");
  auto recs = records_of(d / "a.json");
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs.begin()->second.at("status"), "BATCH_VARIANT");
  EXPECT_EQ(recs.begin()->second.at("mode"), "batch-invariance");
  args = with_plugin(run);
  args.insert(args.end(), {"--require", "batch-invariance", "--json", (d / "b.json").string(), "--junit",
                           (d / "b.xml").string(), "--markdown", (d / "b.md").string()});
  EXPECT_EQ(run_mlagate(args, d), 1) << slurp(d / "stderr.txt");
  EXPECT_NE(slurp(d / "stdout.txt").find("BATCH_VARIANT records fail the run (--require batch-invariance)"),
            std::string::npos)
      << slurp(d / "stdout.txt");
  recs = records_of(d / "b.json");
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs.begin()->second.at("status"), "BATCH_VARIANT");
  // Every report counts it failed under --require (without it, none does).
  const Json b = Json::parse(slurp(d / "b.json")), a = Json::parse(slurp(d / "a.json"));
  EXPECT_EQ(b.at("summary").at("failures"), 1);
  EXPECT_EQ(b.at("summary").at("verdict"), "FAIL");
  EXPECT_EQ(b.at("run").at("require"), Json::array({"batch-invariance"}));
  EXPECT_EQ(a.at("summary").at("failures"), 0);
  EXPECT_FALSE(a.at("run").contains("require"));
  EXPECT_NE(slurp(d / "b.xml").find("<failure message="), std::string::npos) << slurp(d / "b.xml");
  EXPECT_NE(slurp(d / "b.md").find("# mlagate: FAIL"), std::string::npos) << slurp(d / "b.md");
  // mlagate merge keeps the requirement: the merged run fails as the run did.
  EXPECT_EQ(run_mlagate({"merge", (d / "b.json").string(), "--json", (d / "m.json").string()}, d), 1)
      << slurp(d / "stderr.txt");
  EXPECT_EQ(Json::parse(slurp(d / "m.json")).at("summary").at("failures"), 1);
  EXPECT_EQ(run_mlagate({"merge", (d / "a.json").string(), "--json", (d / "n.json").string()}, d), 0)
      << slurp(d / "stderr.txt");
}

}  // namespace
}  // namespace mlagate
