// Reliability features end to end, through the real mlagate binary (isolation
// needs it: workers are the binary itself, exec'd) and the planted backends of
// libmlagate_reliability_plugin.so. Every test can fail: each planted fault is
// invisible unless the feature under test works.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cases/suite.h"
#include "harness/reliability/journal.h"
#include "harness/reliability/memory_estimate.h"
#include "harness/reliability/shrink.h"
#include "reports/record_json.h"
#include "tests/reliability/run_mlagate.h"

namespace mlagate {
namespace {

using namespace rel_test;

TEST(RecordJson, RoundTripsEveryField) {
  Record r;
  r.case_id = "smoke/x/tp16/bf16/kv=auto/bs=auto/seed=0";
  r.backend = "b";
  r.op = "decode";
  r.status = Status::kNondeterministic;
  r.message = "m \"quoted\"\n";
  r.details = "line1\nline2";
  r.policy = "baseline(fudge=2)";
  r.block_size = 64;
  r.paths = {"decode", "prefill"};
  Metrics m;
  m.output = "out";
  m.numel = 7;
  m.max_abs = std::numeric_limits<double>::infinity();
  m.max_rel = -std::numeric_limits<double>::infinity();
  m.nmse = 0.1 + 0.2;  // not exactly representable in short decimal: must round-trip
  m.worst = {5, 1, 2, 3, 4};
  m.passed = true;
  m.map_tokens = 2;  // the HTML report's error summary (tests/reports/test_error_map.cpp has more)
  m.map_heads = 1;
  m.err_token_head = {0.1f, std::numeric_limits<float>::quiet_NaN()};
  m.query_lens = {1, 1};
  m.worst_elements = {{{5, 1, 0, 0, 4}, 1.5, 0.1 + 0.2, kNaN}};
  r.metrics = {m};
  r.timings = {1.5, 2, kNaN, 4, 5};
  r.repro = "mlagate run ...";
  const Record b = record_from_json_line(record_to_json_line(r));
  EXPECT_EQ(record_to_json_line(b), record_to_json_line(r));
  EXPECT_EQ(b.status, Status::kNondeterministic);
  EXPECT_EQ(b.details, r.details);
  EXPECT_TRUE(std::isinf(b.metrics[0].max_abs) && b.metrics[0].max_abs > 0);
  EXPECT_TRUE(std::isinf(b.metrics[0].max_rel) && b.metrics[0].max_rel < 0);
  EXPECT_TRUE(std::isnan(b.metrics[0].max_ulp));
  EXPECT_EQ(b.metrics[0].nmse, 0.1 + 0.2);
  EXPECT_EQ(b.metrics[0].worst.head, 3);
  EXPECT_EQ(b.metrics[0].err_token_head[0], 0.1f);
  EXPECT_TRUE(std::isnan(b.metrics[0].err_token_head[1]));
  EXPECT_EQ(b.metrics[0].query_lens, m.query_lens);
  EXPECT_EQ(b.metrics[0].worst_elements[0].expected, 0.1 + 0.2);
  EXPECT_TRUE(std::isnan(b.metrics[0].worst_elements[0].err));
  EXPECT_TRUE(std::isnan(b.timings.cache_ms));
  EXPECT_THROW(record_from_json_line("{\"id\": 1}"), std::runtime_error);
  EXPECT_THROW(record_from_json_line("not json"), std::runtime_error);
}

// A segfault, an abort and an escaped exception each end their worker: the
// record is CRASHED with the worker's last words, a new worker takes the next
// job, and every other record is there and passes.
TEST(Isolation, CrashesAreRecordsAndTheRunGoesOn) {
  const fs::path d = temp_dir("crash");
  const int rc = run_mlagate(with_plugin({"run", "--suite", "smoke", "--backend", "rel.segv,rel.abort,rel.throw,cpu.paged",
                                          "--json", (d / "r.json").string()}),
                             d, "mixed_small");
  EXPECT_EQ(rc, 1) << slurp(d / "stderr.txt");
  const auto recs = records_of(d / "r.json");
  EXPECT_EQ(recs.size(), 28u);  // 7 cases x 4 backends: nothing lost
  int crashed = 0;
  for (const auto& [key, r] : recs) {
    const bool faulty = key.first != "cpu.paged" && key.second.find("mixed_small") != std::string::npos;
    if (!faulty) {
      EXPECT_EQ(r.at("status"), "PASSED") << key.first << " " << key.second << ": " << r.at("message");
      continue;
    }
    ++crashed;
    EXPECT_EQ(r.at("status"), "CRASHED") << key.first << " " << key.second;
    const std::string msg = r.at("message");
    if (key.first == "rel.segv") {
      EXPECT_NE(msg.find("killed by signal 11"), std::string::npos) << msg;
    }
    if (key.first == "rel.abort") {
      EXPECT_NE(msg.find("killed by signal 6"), std::string::npos) << msg;
      EXPECT_NE(msg.find("assertion 'num_splits <= kMaxSplits' failed"), std::string::npos) << msg;
      EXPECT_NE(r.value("details", "").find("worker stderr"), std::string::npos);
    }
    if (key.first == "rel.throw") {
      EXPECT_NE(msg.find("rel.throw: exception escaped the kernel"), std::string::npos) << msg;
    }
    EXPECT_NE(std::string(r.at("repro")).find("--backend " + key.first), std::string::npos);
  }
  EXPECT_EQ(crashed, 6);  // smoke has mixed_small twice
}

TEST(Isolation, HangIsKilledAtTimeoutAndTheRunGoesOn) {
  const fs::path d = temp_dir("hang");
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = run_mlagate(with_plugin({"run", "--spec", "small_decode,mixed_small", "--tp", "16", "--backend",
                                          "rel.hang", "--timeout", "2", "--json", (d / "r.json").string()}),
                             d, "small_decode");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(rc, 1);
  EXPECT_LT(secs, 60);
  const auto recs = records_of(d / "r.json");
  ASSERT_EQ(recs.size(), 2u);
  for (const auto& [key, r] : recs) {
    if (key.second.find("small_decode") != std::string::npos) {
      EXPECT_EQ(r.at("status"), "TIMEOUT");
      EXPECT_NE(std::string(r.at("message")).find("--timeout 2 s"), std::string::npos) << r.at("message");
      EXPECT_NE(std::string(r.at("message")).find("waiting for a barrier"), std::string::npos) << r.at("message");
    } else {
      EXPECT_EQ(r.at("status"), "PASSED");
    }
  }
}

TEST(Isolation, ProcessAndInProcessRecordsAreEqual) {
  const fs::path d = temp_dir("same");
  for (const char* iso : {"process", "none"})
    ASSERT_EQ(run_mlagate({"run", "--suite", "smoke", "--backend", "cpu.paged,cpu.splitkv", "--no-progress", "--isolate", iso, "--json",
                           (d / (std::string(iso) + ".json")).string()},
                          d),
              0);
  Json a = Json::parse(slurp(d / "process.json")).at("records"), b = Json::parse(slurp(d / "none.json")).at("records");
  for (auto* j : {&a, &b})
    for (auto& r : *j) r.erase("timings_ms");
  EXPECT_EQ(a.size(), 14u);
  EXPECT_EQ(a, b);
}

// kill -9 of a run in the middle (a worker hangs, the run waits): the journal
// holds what finished; --resume runs the rest only and the report is whole.
TEST(Journal, ResumeAfterKill9RerunsNothingFinished) {
  const fs::path d = temp_dir("kill9");
  const std::vector<std::string> args =
      with_plugin({"run", "--spec", "small_decode,small_prefill,mixed_small", "--tp", "16", "--backend", "rel.hang,cpu.paged",
                   "--json", (d / "r.json").string()});
  const fs::path journal = d / "r.json.journal.jsonl";
  {
    Child c(args, d, "mixed_small");  // hangs on the third case
    ASSERT_TRUE(wait_for([&] { return journal_records(journal) >= 4; }, 60)) << slurp(d / "stderr.txt");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::kill(c.pid, SIGKILL);
    EXPECT_EQ(c.wait(), 128 + SIGKILL);
  }
  EXPECT_FALSE(fs::exists(d / "r.json"));
  EXPECT_EQ(journal_records(journal), 4u);
  // A torn last line (a kill in the middle of a write) is dropped on resume.
  std::ofstream(journal, std::ios::app) << "{\"backend\":\"rel.hang\",\"id\":\"half a rec";
  fs::copy_file(journal, d / "kept.jsonl");
  std::vector<std::string> resume = args;
  resume.push_back("--resume");
  const fs::path d2 = d / "resume";
  fs::create_directories(d2);
  // A different run cannot resume this journal.
  std::vector<std::string> other = resume;
  other[std::find(other.begin(), other.end(), "--tp") - other.begin() + 1] = "8";
  EXPECT_EQ(run_mlagate(other, d2), 2);
  EXPECT_NE(slurp(d2 / "stderr.txt").find("written by a different run"), std::string::npos);
  EXPECT_EQ(run_mlagate(resume, d2, "no-case-matches"), 0) << slurp(d2 / "stderr.txt");
  EXPECT_NE(slurp(d2 / "stdout.txt").find("4 of 6 records already finished"), std::string::npos) << slurp(d2 / "stdout.txt");
  EXPECT_EQ(records_of(d / "r.json").size(), 6u);
  // The 4 journaled records are reported as they were (not rerun: same timings).
  {
    std::ifstream in(d / "kept.jsonl");
    std::string line;
    std::getline(in, line);  // header
    const auto report = records_of(d / "r.json");
    int same = 0;
    while (std::getline(in, line) && !in.eof()) {  // the torn last line has no newline
      const Record j = record_from_json_line(line);
      const Json& r = report.at({j.backend, j.case_id});
      same += r.at("timings_ms").at("run") == j.timings.run_ms;
    }
    EXPECT_EQ(same, 4);
  }
  EXPECT_FALSE(fs::exists(journal));  // finished: the reports hold everything
}

// Appends are not held back for the disk (a thread of the journal's own
// syncs them): each line is in the file when append returns, and a journal
// closed and resumed gives every record back.
TEST(Journal, EachLineIsInTheFileWhenAppendReturns) {
  const fs::path d = temp_dir("journal_lines");
  const std::string path = (d / "j.jsonl").string();
  auto lines = [&] {
    std::ifstream in(path);
    std::size_t n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  };
  {
    Journal j(path, "fp", false);
    for (int i = 0; i < 50; ++i) {
      Record r;
      r.case_id = "case" + std::to_string(i);
      r.backend = "b";
      r.op = "layer";
      r.status = Status::kPassed;
      j.append(r);
      ASSERT_EQ(lines(), static_cast<std::size_t>(i) + 2);  // the header and every record so far
    }
  }
  Journal again(path, "fp", true);
  ASSERT_EQ(again.previous().size(), 50u);
  EXPECT_EQ(again.previous().back().case_id, "case49");
}

// In-process resume (--isolate none) of a run killed mid-way: the cases that
// had finished are not rerun and still appear in the report; a finished run
// leaves no journal behind.
TEST(Journal, ResumeInProcessReportsEveryRecord) {
  const fs::path d = temp_dir("inproc");
  const std::vector<std::string> args =
      with_plugin({"run", "--spec", "small_decode,small_prefill,mixed_small", "--tp", "16", "--backend",
                   "rel.hang,cpu.paged", "--json", (d / "r.json").string()});
  const fs::path journal = d / "r.json.journal.jsonl";
  {
    Child c(args, d, "mixed_small");
    ASSERT_TRUE(wait_for([&] { return journal_records(journal) >= 4; }, 60));
    ::kill(c.pid, SIGKILL);
    c.wait();
  }
  std::vector<std::string> resume = args;
  resume.insert(resume.end(), {"--resume", "--isolate", "none"});
  ASSERT_EQ(run_mlagate(resume, d, "no-case-matches"), 0) << slurp(d / "stderr.txt");
  EXPECT_NE(slurp(d / "stdout.txt").find("4 of 6 records already finished"), std::string::npos);
  EXPECT_EQ(records_of(d / "r.json").size(), 6u);
  EXPECT_FALSE(fs::exists(journal));  // the run finished: its reports hold everything
  EXPECT_EQ(run_mlagate(resume, d), 2);
  EXPECT_NE(slurp(d / "stderr.txt").find("--resume: no journal"), std::string::npos);
}

// SIGINT: the run stops, the reports hold what finished (well-formed), exit 130.
TEST(Journal, SigintWritesReportsOfWhatFinished) {
  const fs::path d = temp_dir("sigint");
  Child c(with_plugin({"run", "--spec", "small_decode,small_prefill,mixed_small", "--tp", "16", "--backend",
                       "rel.hang,cpu.paged", "--json", (d / "r.json").string(), "--junit", (d / "r.xml").string()}),
          d, "mixed_small");
  const fs::path journal = d / "r.json.journal.jsonl";
  ASSERT_TRUE(wait_for([&] { return journal_records(journal) >= 4; }, 60));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(c.pid, SIGINT);
  EXPECT_EQ(c.wait(), 130);
  const Json j = Json::parse(slurp(d / "r.json"));
  EXPECT_EQ(j.at("records").size(), 4u);
  EXPECT_EQ(j.at("run").at("interrupted"), "SIGINT: 4 of 6 records");
  EXPECT_NE(slurp(d / "r.xml").find("</testsuites>"), std::string::npos);
  EXPECT_NE(slurp(d / "stdout.txt").find("INTERRUPTED by Interrupt: 4 of 6 records finished"), std::string::npos)
      << slurp(d / "stdout.txt");
}

TEST(Repeat, NondeterministicBackendIsCaught) {
  const fs::path d = temp_dir("repeat");
  EXPECT_EQ(run_mlagate(with_plugin({"run", "--spec", "small_decode", "--tp", "16", "--backend", "rel.nondet,cpu.paged",
                                     "--repeat", "3", "--json", (d / "r.json").string()}),
                        d),
            1);
  for (const auto& [key, r] : records_of(d / "r.json")) {
    if (key.first == "cpu.paged") {
      EXPECT_EQ(r.at("status"), "PASSED");
      continue;
    }
    EXPECT_EQ(r.at("status"), "NONDETERMINISTIC");
    const std::string msg = r.at("message");
    EXPECT_NE(msg.find("1 of 2 repeated runs differ from run 1"), std::string::npos) << msg;
    // One latent element changed reaches several elements of the layer output (W_UV).
    EXPECT_NE(msg.find("elements differ, first at element"), std::string::npos) << msg;
    EXPECT_NE(std::string(r.at("repro")).find("--repeat 3"), std::string::npos);
  }
  // Without --repeat the same backend passes: only repetition shows it.
  EXPECT_EQ(run_mlagate(with_plugin({"run", "--spec", "small_decode", "--tp", "16", "--backend", "rel.nondet"}), d), 0);
}

// seq_len-0 padding rows left unwritten: the NaN poison shows them in every order;
// without poison the zero-filled buffer hides them.
TEST(Poison, UnwrittenPaddingRowsAreNonfinite) {
  const fs::path d = temp_dir("poison");
  EXPECT_EQ(run_mlagate(with_plugin({"run", "--suite", "edges", "--filter", "edge_padding/tp16/bf16/kv=auto/bs=16",
                                     "--backend", "rel.skip_padding", "--json", (d / "r.json").string()}),
                        d),
            1);
  for (const auto& [key, r] : records_of(d / "r.json")) EXPECT_EQ(r.at("status"), "NONFINITE") << r.at("message");
  EXPECT_EQ(run_mlagate(with_plugin({"run", "--suite", "edges", "--filter", "edge_padding/tp16/bf16/kv=auto/bs=16",
                                     "--backend", "rel.skip_padding", "--poison", "zero"}),
                        d),
            0);
}

// Reused output buffers without poison (a caching allocator's torch.empty):
// the unwritten padding rows hold the previous case's values, so the bug
// turns order-dependent; fresh buffers hide it, poison shows it in any order.
TEST(Poison, ReusedBuffersMakeUnwrittenRowsOrderDependent) {
  const fs::path d = temp_dir("reuse");
  const std::string pad = "edges/edge_padding/tp16/bf16/kv=auto/bs=16/seed=0";
  const std::string before = "edges/edge_block_boundary/tp16/bf16/kv=auto/bs=16/seed=0";
  auto run = [&](std::vector<std::string> extra, const std::string& json) {
    std::vector<std::string> a{"run", "--suite", "edges", "--case", before, "--case", pad, "--backend", "rel.skip_padding",
                               "--json", (d / json).string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return run_mlagate(with_plugin(a), d);
  };
  EXPECT_EQ(run({"--poison", "none"}, "fresh.json"), 0);
  EXPECT_EQ(run({"--poison", "none", "--reuse-buffers"}, "reuse.json"), 1);
  const Json r = records_of(d / "reuse.json").at({"rel.skip_padding", pad});
  EXPECT_EQ(r.at("status"), "INCORRECT");
  EXPECT_NE(std::string(r.at("message")).find("order-dependent (passes alone, fails right after " + before), std::string::npos)
      << r.at("message");
  EXPECT_NE(std::string(r.at("repro")).find("--poison none --reuse-buffers"), std::string::npos) << r.at("repro");
  EXPECT_EQ(run({"--reuse-buffers"}, "poisoned.json"), 1);  // NaN poison: caught whatever ran before
  EXPECT_EQ(records_of(d / "poisoned.json").at({"rel.skip_padding", pad}).at("status"), "NONFINITE");
}

// --save-failures: the failing case as a golden file; replaying it fails the same way.
TEST(SaveFailures, BundleReplaysTheFailure) {
  const fs::path d = temp_dir("bundles");
  EXPECT_EQ(run_mlagate(with_plugin({"run", "--suite", "edges", "--filter", "edge_padding/tp16/bf16/kv=auto/bs=16",
                                     "--backend", "rel.skip_padding,cpu.paged", "--save-failures", (d / "b").string()}),
                        d),
            1);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(d / "b")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);  // the failing record only
  EXPECT_NE(slurp(d / "stdout.txt").find("replay: mlagate replay " + files[0].string()), std::string::npos);
  EXPECT_EQ(run_mlagate(with_plugin({"replay", files[0].string(), "--backend", "rel.skip_padding", "--json",
                                     (d / "r.json").string()}),
                        d),
            1);
  const auto recs = records_of(d / "r.json");
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs.begin()->second.at("status"), "NONFINITE");
}

// A workspace reused across cases: edge_padding passes alone and fails after a
// case that left values in the rows padding requests never write.
TEST(Order, StaleWorkspaceFailsOnlyAfterAnotherCase) {
  const fs::path d = temp_dir("order");
  const std::string pad = "edges/edge_padding/tp16/bf16/kv=auto/bs=16/seed=0";
  const std::string before = "edges/edge_block_boundary/tp16/bf16/kv=auto/bs=16/seed=0";
  EXPECT_EQ(run_mlagate(with_plugin({"run", "--suite", "edges", "--case", pad, "--backend", "rel.stale"}), d), 0);
  EXPECT_EQ(run_mlagate(with_plugin({"run", "--suite", "edges", "--case", before, "--case", pad, "--backend", "rel.stale",
                                     "--json", (d / "r.json").string()}),
                        d),
            1);
  const auto recs = records_of(d / "r.json");
  EXPECT_EQ(recs.at({"rel.stale", before}).at("status"), "PASSED");
  EXPECT_EQ(recs.at({"rel.stale", pad}).at("status"), "INCORRECT");
  // The run itself tells: passes alone, fails after the case before it, and
  // the repro command runs exactly that pair.
  const std::string msg = recs.at({"rel.stale", pad}).at("message");
  EXPECT_NE(msg.find("order-dependent (passes alone, fails right after " + before + ")"), std::string::npos) << msg;
  const std::string repro = recs.at({"rel.stale", pad}).at("repro");
  EXPECT_NE(repro.find("--case " + before + " --case " + pad), std::string::npos) << repro;
  EXPECT_NE(std::string(recs.at({"rel.stale", pad}).at("details")).find("fails again when run right after"), std::string::npos);
  // A deterministic failure is not called order-dependent.
  EXPECT_EQ(run_mlagate(with_plugin({"run", "--suite", "edges", "--case", before, "--case", pad, "--backend",
                                     "rel.skip_padding", "--json", (d / "s.json").string()}),
                        d),
            1);
  const std::string skip_msg = records_of(d / "s.json").at({"rel.skip_padding", pad}).at("message");
  EXPECT_EQ(skip_msg.find("order-dependent"), std::string::npos) << skip_msg;
  // --order pairs finds the pair even when the given order hides it.
  const std::string other = "edges/edge_no_context/tp16/bf16/kv=auto/bs=16/seed=0";
  EXPECT_EQ(run_mlagate(with_plugin({"run", "--suite", "edges", "--case", pad, "--case", other, "--case", before,
                                     "--backend", "rel.stale", "--order", "pairs", "--json", (d / "p.json").string()}),
                        d),
            1);
  const auto pairs = records_of(d / "p.json");
  EXPECT_EQ(pairs.size(), 3u);
  EXPECT_NE(std::string(pairs.at({"rel.stale", pad}).at("message"))
                .find("order-dependent (passes alone, fails right after " + before + ")"),
            std::string::npos);
  EXPECT_EQ(pairs.at({"rel.stale", before}).at("status"), "PASSED");
  // --order reverse runs edge_padding first: it passes.
  EXPECT_EQ(run_mlagate(with_plugin({"run", "--suite", "edges", "--case", before, "--case", pad, "--backend", "rel.stale",
                                     "--order", "reverse"}),
                        d),
            0);
}

// The order-dependence checks are capped per backend: another backend's
// ordinary failures (rel.skip_padding fails edge_padding in any order) must not
// use up rel.stale's check. With one check per run in all, rel.stale's failure
// went undiagnosed; past the cap a record says that no check was made.
TEST(Order, ChecksAreCappedPerBackend) {
  const fs::path d = temp_dir("order_cap");
  const std::string pad = "edges/edge_padding/tp16/bf16/kv=auto/bs=16/seed=0";
  const std::string pad2 = "edges/edge_padding/tp1/bf16/kv=auto/bs=16/seed=0";
  const std::string before = "edges/edge_block_boundary/tp16/bf16/kv=auto/bs=16/seed=0";
  EXPECT_EQ(run_mlagate(with_plugin({"run", "--suite", "edges", "--case", before, "--case", pad, "--case", pad2,
                                     "--backend", "rel.skip_padding,rel.stale", "--order-checks", "1", "--json",
                                     (d / "r.json").string()}),
                        d),
            1);
  const auto recs = records_of(d / "r.json");
  // rel.skip_padding's first failure used its one check (a plain failure: not
  // order-dependent); its second says no check was made.
  EXPECT_EQ(std::string(recs.at({"rel.skip_padding", pad}).at("message")).find("order-dependent"), std::string::npos);
  const std::string second = recs.at({"rel.skip_padding", pad2}).at("details");
  EXPECT_NE(second.find("no order-dependence check: this backend's 1 checks of the run are used"), std::string::npos)
      << second;
  // rel.stale's failure right after the first case still gets its own check.
  const std::string msg = recs.at({"rel.stale", pad}).at("message");
  EXPECT_NE(msg.find("order-dependent (passes alone, fails right after " + before + ")"), std::string::npos) << msg;
}

// --sanitize folds the sanitizer's findings into the record; here a stand-in
// for compute-sanitizer (same "=========" report format and exit code) so the
// parsing is checked without a GPU. With --case a passing record is rerun too
// and a finding makes it INCORRECT.
TEST(Sanitize, FindingsAreFoldedIntoTheRecord) {
  const fs::path d = temp_dir("sanitize");
  const fs::path fake = d / "fake-sanitizer.sh";
  std::ofstream(fake) << "#!/bin/sh\n"
                         "echo '========= COMPUTE-SANITIZER'\n"
                         "echo '========= Invalid __global__ write of size 2 bytes'\n"
                         "echo '=========     at zero_outputs+0x80 in cuda_fault_plugin.cu:25'\n"
                         "echo '========= ERROR SUMMARY: 1 error'\n"
                         "exit 86\n";
  fs::permissions(fake, fs::perms::owner_all);
  const std::string pad = "edges/edge_padding/tp16/bf16/kv=auto/bs=16/seed=0";
  EXPECT_EQ(run_mlagate({"run", "--suite", "edges", "--case", pad, "--backend", "cpu.paged", "--no-progress", "--sanitize",
                         "memcheck", "--sanitizer", fake.string(), "--json", (d / "r.json").string()},
                        d),
            1);
  const Json r = records_of(d / "r.json").begin()->second;
  EXPECT_EQ(r.at("status"), "INCORRECT");
  EXPECT_EQ(r.at("message"), "compute-sanitizer memcheck: 1 error, first: Invalid __global__ write of size 2 bytes");
  const std::string details = r.at("details");
  EXPECT_NE(details.find("--tool memcheck --error-exitcode 86 --launch-count 50"), std::string::npos) << details;
  EXPECT_NE(details.find("cuda_fault_plugin.cu:25"), std::string::npos) << details;
  // The rerun is the record's own repro, in process.
  EXPECT_NE(details.find("--backend cpu.paged --op layer"), std::string::npos) << details;
  EXPECT_NE(details.find("--isolate none"), std::string::npos) << details;
}

#ifdef MLAGATE_TEST_CUDA_PLUGIN
const std::string kCudaPlugin = MLAGATE_TEST_CUDA_PLUGIN;

// A kernel's illegal address: CRASHED with the CUDA error, the worker is
// replaced (its context is dead) and the next records run; compute-sanitizer
// memcheck names the faulting kernel. Skips without a GPU.
TEST(CudaFaults, IllegalAddressIsCrashedAndMemcheckNamesIt) {
  const fs::path d = temp_dir("cuda");
  run_mlagate({"run", "--plugin", kCudaPlugin, "--no-progress", "--spec", "small_decode,mixed_small", "--tp", "16",
               "--backend", "rel.cuda_illegal_address,cuda.ref", "--json", (d / "r.json").string()},
              d);
  const auto recs = records_of(d / "r.json");
  ASSERT_EQ(recs.size(), 4u) << slurp(d / "stderr.txt");
  for (const auto& [key, r] : recs)
    if (r.at("status") == "SKIPPED") GTEST_SKIP() << "no GPU: " << r.at("message");
  for (const auto& [key, r] : recs) {
    if (key.first == "cuda.ref") {
      EXPECT_EQ(r.at("status"), "PASSED") << r.at("message");
      continue;
    }
    EXPECT_EQ(r.at("status"), "CRASHED");
    EXPECT_NE(std::string(r.at("message")).find("cudaErrorIllegalAddress"), std::string::npos) << r.at("message");
  }
  EXPECT_EQ(run_mlagate({"run", "--plugin", kCudaPlugin, "--no-progress", "--spec", "small_decode", "--tp", "16",
                         "--backend", "rel.cuda_illegal_address", "--sanitize", "memcheck", "--json",
                         (d / "s.json").string()},
                        d),
            1);
  const Json r = records_of(d / "s.json").begin()->second;
  const std::string msg = r.at("message");
  if (msg.find("compute-sanitizer") == std::string::npos) GTEST_SKIP() << "no compute-sanitizer: " << r.value("details", "");
  EXPECT_NE(msg.find("compute-sanitizer memcheck: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("Invalid __global__ write"), std::string::npos) << msg;
  EXPECT_NE(std::string(r.at("details")).find("zero_outputs"), std::string::npos) << r.at("details");
}

// One element past the output: the device guard band catches it (INCORRECT).
TEST(CudaFaults, OutOfBoundsWriteHitsTheGuardBand) {
  const fs::path d = temp_dir("cuda_oob");
  run_mlagate({"run", "--plugin", kCudaPlugin, "--no-progress", "--spec", "small_decode", "--tp", "16", "--backend",
               "rel.cuda_oob_write", "--json", (d / "r.json").string()},
              d);
  const auto recs = records_of(d / "r.json");
  ASSERT_EQ(recs.size(), 1u) << slurp(d / "stderr.txt");
  const Json& r = recs.begin()->second;
  if (r.at("status") == "SKIPPED") GTEST_SKIP() << "no GPU: " << r.at("message");
  EXPECT_EQ(r.at("status"), "INCORRECT");
  EXPECT_NE(std::string(r.at("message")).find("out-of-bounds"), std::string::npos) << r.at("message");
}
#endif

#ifdef MLAGATE_TEST_CUDA_GRAPH_PLUGIN
// Graph mode through the C ABI on the GPU: the plugin's run() captured in a
// CUDA graph, prepare() before each replay. The correct plugin passes every
// uniform decode case with graphs reused across cases; the planted one (a
// fresh metadata workspace per call, vLLM #35175) passes every plain run and
// fails under replay. Skips without a GPU.
TEST(CudaGraphPlugin, ReplaysPassAndStaleMetadataIsCaught) {
  const fs::path d = temp_dir("cuda_graph");
  const std::string plugin = MLAGATE_TEST_CUDA_GRAPH_PLUGIN;
  auto run = [&](const std::string& backend, bool graph, const std::string& out) {
    // edges: cases of one shape in a row, so graphs are replayed across cases
    std::vector<std::string> args = {"run", "--plugin", plugin, "--no-progress", "--suite", "edges", "--op", "decode",
                                     "--backend", backend, "--json", (d / out).string()};
    if (graph) args.insert(args.end(), {"--cuda-graph", "--capture-sizes", "8,64,512"});
    run_mlagate(args, d);
    return records_of(d / out);
  };
  const auto good = run("rel.cuda_graph_decode", true, "good.json");
  ASSERT_FALSE(good.empty()) << slurp(d / "stderr.txt");
  if (good.begin()->second.at("status") == "SKIPPED") GTEST_SKIP() << "no GPU: " << good.begin()->second.at("message");
  int passed = 0, replayed = 0;
  for (const auto& [key, r] : good) {
    const std::string status = r.at("status"), msg = r.at("message");
    EXPECT_TRUE(status == "PASSED" || status == "NOT_SUPPORTED") << key.second << ": " << msg;
    passed += status == "PASSED";
    replayed += msg.find("replayed, captured at") != std::string::npos;
    if (status == "PASSED") {
      EXPECT_NE(msg.find("CUDA graph of the plugin's run()"), std::string::npos) << msg;
    }
  }
  int plain_failed = 0, graph_failed = 0;
  for (const auto& [key, r] : run("rel.cuda_graph_stale_metadata", false, "plain.json"))
    plain_failed += r.at("status") != "PASSED" && r.at("status") != "NOT_SUPPORTED";
  for (const auto& [key, r] : run("rel.cuda_graph_stale_metadata", true, "stale.json"))
    graph_failed += r.at("status") == "INCORRECT" || r.at("status") == "NONFINITE";
  std::printf("plugin graphs: %d passed, %d replayed a graph captured earlier; stale metadata: %d plain failures, "
              "%d graph failures\n",
              passed, replayed, plain_failed, graph_failed);
  EXPECT_GE(passed, 10);
  EXPECT_GE(replayed, 3);
  EXPECT_EQ(plain_failed, 0);
  EXPECT_GE(graph_failed, 2);  // a replay reads the capture's seq_lens: wrong wherever they differ
}
#endif

// Bad input: a clear message and exit 2, before anything runs.
TEST(BadInput, ExitTwoWithAClearMessage) {
  const fs::path d = temp_dir("bad");
  struct Bad {
    std::string yaml;       // a suite file ("" = none)
    std::vector<std::string> args;
    std::string message;    // expected in stderr
  };
  const std::vector<Bad> bad = {
      {"cases: [\n  - {spec: foo", {}, "YAML syntax error"},
      {"name: a\nspecs:\n  t: {seq_lens: [5, 9], query_lens: [7, 1]}\ngroups:\n  - specs: [t]\n", {},
       "query_len 7 > seq_len 5"},
      {"name: a\ngroups:\n  - specs: [small_decode]\n    tp: [3]\n", {}, "not divisible by tp 3"},
      {"name: a\ngroups:\n  - specs: [small_decode]\n    block_size: [0]\n", {}, "block_size 0"},
      // Under every per-tensor limit, but about 700 GiB in all (a 6M-token
      // context up-projected for a 2-token prefill): refused by the estimate on
      // any machine mlagate runs on (the GPU machine has 128 GiB).
      {"name: a\nspecs:\n  t: {seq_lens: [6000000], query_lens: [2]}\ngroups:\n  - specs: [t]\n", {},
       "refused before allocating"},
      {"", {"--spec", "small_decode", "--block-size", "0"}, "is not a block size"},
      {"", {"--spec", "small_decode", "--backend", "no.such"}, "matches no backend"},
      {"", {"--spec", "small_decode", "--isolate", "threads"}, "--isolate 'threads'"},
      {"", {"--spec", "small_decode", "--order", "shuffle:x"}, "shuffle:SEED"},
      {"", {"--spec", "small_decode", "--repeat", "0"}, "--repeat must be >= 1"},
      {"name: a\nrepeat: 0\ngroups:\n  - specs: [small_decode]\n", {}, "repeat must be in [1, 100]"},
      {"", {"--spec", "small_decode", "--order", "pairs", "--isolate", "none"}, "--order pairs needs --isolate process"},
      {"", {"--spec", "small_decode", "--sanitize", "leakcheck"}, "expected memcheck, initcheck or racecheck"},
      {"", {"--spec", "small_decode", "--resume"}, "no journal to resume"},
      {"", {"--spec", "small_decode", "--case", "no/such/case"}, "no such case"},
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    std::vector<std::string> args{"run", "--no-progress"};
    if (!bad[i].yaml.empty()) {
      const fs::path y = d / ("s" + std::to_string(i) + ".yaml");
      std::ofstream(y) << bad[i].yaml;
      args.insert(args.end(), {"--suite", y.string()});
    }
    args.insert(args.end(), bad[i].args.begin(), bad[i].args.end());
    EXPECT_EQ(run_mlagate(args, d), 2) << i << ": " << slurp(d / "stderr.txt");
    const std::string err = slurp(d / "stderr.txt");
    EXPECT_NE(err.find(bad[i].message), std::string::npos) << i << ": " << err;
    EXPECT_EQ(err.find("internal error"), std::string::npos) << err;
  }
}

// Every built-in case fits a small CI machine by the estimate (so the refusal
// above is not the estimate being silly).
TEST(BadInput, BuiltinSuitesFitInEightGiB) {
  for (const char* name : {"smoke", "edges", "vllm", "fp8"})
    for (const CaseSpec& c : load_suite(name).cases) EXPECT_LT(estimate_case_bytes(c, false), 8ull << 30) << c.id();
}

}  // namespace
}  // namespace mlagate
