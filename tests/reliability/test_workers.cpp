// --workers: several worker processes side by side, each taking the next group
// of cases from one queue. The records must be those of one worker (crashes
// included), every job run exactly once on a worker of its own group, and the
// profile must still sum to the wall; the queue keeps groups whose memory
// estimates do not fit apart.
#include <gtest/gtest.h>


#include <atomic>
#include <chrono>
#include <thread>

#include "cases/case.h"
#include "cases/suite.h"
#include "harness/reliability/isolate.h"
#include "tests/reliability/drain_queue.h"
#include "tests/reliability/run_mlagate.h"

namespace mlagate::rel_test {
namespace {

// Status and metrics of each record (not messages: the exec backend's name
// its scratch paths).
std::map<std::pair<std::string, std::string>, std::string> outcomes(const fs::path& json) {
  std::map<std::pair<std::string, std::string>, std::string> v;
  for (const auto& [key, r] : records_of(json)) {
    std::string what = r.at("op").get<std::string>() + " " + r.at("status").get<std::string>();
    if (key.first != "exec.0") {
      what += ' ';
      what += r.at("metrics").dump();
    }
    v[key] = what;
  }
  return v;
}

TEST(Workers, SideBySideTheyGiveOneWorkersRecords) {
  const fs::path d = temp_dir("workers");
  const fs::path calls = d / "calls.log", met = d / "met.log";
  // exec.0 runs (and fails, exit 3) on smoke's three decode-only cases. Side
  // by side, each call waits until two calls have begun: only workers that
  // run at the same time get past that within 30 s, and each notes it.
  std::string barrier = "echo begun >> '";
  barrier += calls.string();
  barrier += "'; i=0; while [ $(wc -l < '";
  barrier += calls.string();
  barrier += "') -lt 2 ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; [ $i -lt 600 ] && echo met >> '";
  barrier += met.string();
  barrier += "'; : {in} {out}; exit 3";
  auto run = [&](const std::string& json, const std::string& workers, const std::string& exec) {
    return run_mlagate(with_plugin({"run", "--suite", "smoke", "--backend", "rel.segv,cpu.paged,exec.0", "--exec", exec,
                                    "--workers", workers, "--no-progress", "-q", "--json", (d / json).string()}),
                       d, "mixed_small");
  };
  ASSERT_EQ(run("one.json", "1", ": {in} {out}; exit 3"), 1) << slurp(d / "stderr.txt");
  ASSERT_EQ(run("three.json", "3", barrier), 1) << slurp(d / "stderr.txt");
  const auto one = outcomes(d / "one.json"), three = outcomes(d / "three.json");
  EXPECT_EQ(one.size(), 21u);  // smoke's 7 cases on 3 backends
  EXPECT_EQ(Json::parse(slurp(d / "three.json")).at("records").size(), 21u);  // each once
  EXPECT_EQ(one, three);
  int crashed = 0;
  for (const auto& [key, what] : three) crashed += key.first == "rel.segv" && what.find(" CRASHED") != std::string::npos;
  EXPECT_EQ(crashed, 2);  // smoke's two mixed_small cases; a new worker took each next job
  EXPECT_EQ(slurp(calls), "begun\nbegun\nbegun\n");
  EXPECT_EQ(slurp(met), "met\nmet\nmet\n");  // two calls were in flight at once
  // The profile: three streams, the rows (side_by_side among them) summing
  // to the wall, and the backend calls' share within it.
  const Json doc = Json::parse(slurp(d / "three.json"));
  const Json& prof = doc.at("profile");
  EXPECT_EQ(prof.at("workers_side_by_side"), 3);
  double sum = 0;
  for (const auto& [name, ms] : prof.at("phases_ms").items()) sum += ms.get<double>();
  EXPECT_NEAR(sum, prof.at("wall_ms").get<double>(), 1e-6 * prof.at("wall_ms").get<double>() + 1e-6);
  EXPECT_LT(prof.at("phases_ms").at("side_by_side").get<double>(), 0);
  EXPECT_GT(prof.at("backend_in_flight_ms").get<double>(), 0);
  EXPECT_LE(prof.at("backend_in_flight_ms").get<double>(), prof.at("wall_ms").get<double>());
  // Bad values are input errors, and so is an order that workers side by side
  // could not keep.
  EXPECT_EQ(run("bad.json", "0", "true"), 2);
  EXPECT_EQ(run("bad.json", "three", "true"), 2);
  EXPECT_EQ(run_mlagate({"run", "--suite", "smoke", "--backend", "cpu.paged", "--workers", "2", "--order", "reverse"}, d), 2);
  EXPECT_NE(slurp(d / "stderr.txt").find("--order reverse needs --workers 1"), std::string::npos);
  EXPECT_EQ(run_mlagate({"run", "--suite", "smoke", "--backend", "cpu.paged", "--threads", "-1"}, d), 2);
  // A --threads 0 of the run's own is replaced in the workers, not given twice.
  EXPECT_EQ(run_mlagate({"run", "--suite", "smoke", "--backend", "cpu.paged", "--workers", "2", "--threads", "0",
                         "--no-progress", "-q"}, d), 0)
      << slurp(d / "stderr.txt");
}

TEST(Workers, GroupsAreRunsOfCasesWithTheSameInputs) {
  RunConfig cfg;
  cfg.cases = load_suite("vllm").cases;
  std::vector<Job> jobs;
  for (std::size_t ci = 0; ci < cfg.cases.size(); ++ci)
    for (std::size_t bi = 0; bi < 2; ++bi) jobs.push_back(Job{ci, bi, Op::kLayer});
  const auto groups = job_groups(cfg, jobs);
  std::vector<Job> joined;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    ASSERT_FALSE(groups[g].empty());
    const std::string key = inputs_key(cfg.cases[groups[g].front().case_index]);
    for (const Job& j : groups[g]) EXPECT_EQ(inputs_key(cfg.cases[j.case_index]), key);
    if (g > 0) {
      EXPECT_NE(inputs_key(cfg.cases[groups[g - 1].back().case_index]), key);
    }
    joined.insert(joined.end(), groups[g].begin(), groups[g].end());
  }
  ASSERT_EQ(joined.size(), jobs.size());  // every job once, in order
  for (std::size_t i = 0; i < jobs.size(); ++i)
    EXPECT_TRUE(joined[i].case_index == jobs[i].case_index && joined[i].backend_index == jobs[i].backend_index);
  EXPECT_GT(groups.size(), 1u);
  EXPECT_LT(groups.size(), cfg.cases.size());  // the kv cache dtypes of one input set share a group
}

TEST(Workers, TheSmallestGroupGoesFirstThenTheLargest) {
  auto groups_of = [](std::vector<std::size_t> jobs) {
    std::vector<std::vector<Job>> g;
    for (std::size_t k = 0; k < jobs.size(); ++k) g.emplace_back(jobs[k], Job{k, 0, Op::kLayer});
    return g;
  };
  // Work (bytes times jobs): 10, 40, 3, 40, 25 -> the 3 first, then 40, 40 (as given), 25, 10.
  std::vector<std::vector<Job>> g = groups_of({1, 4, 3, 2, 5});
  std::vector<std::uint64_t> bytes = {10, 10, 1, 20, 5};
  order_groups(g, bytes, 2);
  std::vector<std::size_t> firsts;
  for (const auto& grp : g) firsts.push_back(grp.front().case_index);
  EXPECT_EQ(firsts, (std::vector<std::size_t>{2, 1, 3, 4, 0}));
  EXPECT_EQ(bytes, (std::vector<std::uint64_t>{1, 10, 20, 5, 10}));
  // No more groups than streams: each stream takes one, largest first.
  g = groups_of({1, 4});
  bytes = {10, 10};
  order_groups(g, bytes, 2);
  EXPECT_EQ(g.front().front().case_index, 1u);
  EXPECT_EQ(bytes, (std::vector<std::uint64_t>{10, 10}));
}

TEST(Workers, GroupsRunSideBySideOnlyWithinTheMemoryBudget) {
  std::vector<std::vector<Job>> groups(4, std::vector<Job>{Job{}});
  GroupQueue q(groups, {6, 6, 3, 20}, 10, 2);
  EXPECT_EQ(q.try_take(0), 0u);             // alone: 6
  EXPECT_EQ(q.try_take(1), std::nullopt);   // 6 beside 6 > 10: waits
  EXPECT_EQ(q.try_take(0), 1u);             // stream 0 let its first go: alone again
  EXPECT_EQ(q.try_take(1), 2u);             // 3 beside 6 fits
  EXPECT_EQ(q.try_take(0), std::nullopt);   // 20 beside 3 does not (order kept: nothing overtakes it)
  EXPECT_EQ(q.try_take(1), std::nullopt);
  q.release(1);
  EXPECT_EQ(q.try_take(0), 3u);             // alone, a group always runs
  EXPECT_EQ(q.try_take(1), std::nullopt);   // none left
  EXPECT_EQ(q.take(1, {}), std::nullopt);   // take does not wait when none is left
  // No budget: everything side by side.
  GroupQueue free(groups, {6, 6, 3, 20}, 0, 2);
  EXPECT_EQ(free.try_take(0), 0u);
  EXPECT_EQ(free.try_take(1), 1u);
  EXPECT_EQ(free.try_take(0), 2u);
  EXPECT_EQ(free.try_take(1), 3u);
}

// Streams that wait hold nothing: two streams that finish groups which leave
// no room for the next beside either must not wait for each other (each gives
// its memory up, its worker ending, before it waits).
TEST(Workers, WaitingStreamsNeverWaitForEachOther) {
  std::vector<std::vector<Job>> groups(3, std::vector<Job>{Job{}});
  GroupQueue q(groups, {6, 3, 20}, 10, 2);
  const test::Drained d = test::drain_with_two_streams(q, 0, 1, 3);
  EXPECT_EQ(d.taken, 3);
  EXPECT_GE(d.ended, 1);  // the 20 could only start once a stream let its 6 or 3 go
}

}  // namespace
}  // namespace mlagate::rel_test
