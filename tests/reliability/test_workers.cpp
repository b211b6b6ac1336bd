// --workers: several worker processes side by side, each taking the next group
// of cases from one queue. The records must be those of one worker (crashes
// included), every job run exactly once on a worker of its own group, and the
// profile must still sum to the wall; the queue keeps groups whose memory
// estimates do not fit apart.
#include <gtest/gtest.h>


#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "cases/case.h"
#include "cases/suite.h"
#include "harness/reliability/isolate.h"
#include "harness/reliability/stream.h"
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

// --workers auto (the default) with --reference eigen: a worker a core (at
// most 8) when every backend runs on the host alone (Capabilities::host_only),
// one otherwise: a plugin's backend may hold a device of its own. The records
// are one worker's either way.
TEST(Workers, AutoGivesHostOnlyBackendsAWorkerACore) {
  const fs::path d = temp_dir("workers_auto");
  auto streams = [&](const std::vector<std::string>& extra, const std::string& json, bool plugin = false) {
    std::vector<std::string> args = {"run", "--suite", "smoke", "--no-progress", "-q", "--json", (d / json).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    // The plugin's backend's records may fail (exit 1); the run must not be refused (exit 2).
    EXPECT_LE(run_mlagate(plugin ? with_plugin(args) : args, d), plugin ? 1 : 0) << slurp(d / "stderr.txt");
    return Json::parse(slurp(d / json)).at("profile").at("workers_side_by_side").get<int>();
  };
  const int cores = static_cast<int>(std::min<std::size_t>(host_cpus(), 8));
  EXPECT_EQ(streams({"--backend", "cpu.*"}, "auto.json"), cores);
  EXPECT_EQ(streams({"--backend", "cpu.*", "--workers", "1"}, "one.json"), 1);
  EXPECT_EQ(outcomes(d / "auto.json"), outcomes(d / "one.json"));
  // Not host-only (an out-of-tree backend beside a CPU one), or an order
  // asked for: one worker.
  EXPECT_EQ(streams({"--backend", "cpu.paged,rel.segv", "--filter", "small_decode"}, "plugin.json", true), 1);
  EXPECT_EQ(streams({"--backend", "cpu.paged", "--order", "reverse"}, "reverse.json"), 1);
}

// Cases made ahead (CaseAhead: a worker makes its next input set's first
// case on a thread while the case before it runs its backends) give the same
// records as cases made when their first job comes, and the profile takes the
// work that ran beside the jobs off in its "ahead" row, the rows still summing
// to the wall. With one worker, every case here is of other inputs than the
// one before it, so every NEXT names a case while the one named before it is
// still to come: a worker that dropped that one for the new one (the first
// version did) used 1 of the 47 cases it began in a run of 48).
TEST(Workers, CasesMadeAheadGiveTheSameRecords) {
  struct Env {
    const char* name;
    explicit Env(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
    ~Env() { ::unsetenv(name); }
  };
  const fs::path d = temp_dir("workers_ahead");
  auto run = [&](const std::string& json, const std::string& workers) {
    return run_mlagate({"run", "--suite", "vllm", "--seed", "0,1", "--filter", "small_decode",
                        "--backend", "cpu.paged", "--workers", workers, "--profile", "--no-progress", "-q",
                        "--json", (d / json).string()},
                       d);
  };
  auto phases = [&](const std::string& json) {
    const Json p = Json::parse(slurp(d / json)).at("profile");
    double sum = 0;
    for (const auto& [name, ms] : p.at("phases_ms").items()) sum += ms.get<double>();
    EXPECT_NEAR(sum, p.at("wall_ms").get<double>(), 1e-6 * p.at("wall_ms").get<double>() + 1e-3) << json;
    return p.at("phases_ms");
  };
  {
    const Env off("MLAGATE_PREPARE_AHEAD", "0");
    ASSERT_EQ(run("off.json", "2"), 0) << slurp(d / "stderr.txt");
  }
  {
    const Env on("MLAGATE_PREPARE_AHEAD", "1");
    ASSERT_EQ(run("on.json", "2"), 0) << slurp(d / "stderr.txt");
  }
  ASSERT_EQ(run("one.json", "1"), 0) << slurp(d / "stderr.txt");  // one worker: made ahead by default
  ASSERT_EQ(run("cpu.json", "2"), 0) << slurp(d / "stderr.txt");  // CPU workers side by side: not by default
  const auto off = outcomes(d / "off.json");
  EXPECT_EQ(off.size(), 24u);
  EXPECT_EQ(outcomes(d / "on.json"), off);
  EXPECT_EQ(outcomes(d / "one.json"), off);
  EXPECT_EQ(outcomes(d / "cpu.json"), off);
  EXPECT_FALSE(phases("off.json").contains("ahead"));
  EXPECT_FALSE(phases("cpu.json").contains("ahead"));
  EXPECT_LT(phases("on.json").value("ahead", 0.0), 0.0);
  EXPECT_LT(phases("one.json").value("ahead", 0.0), 0.0);
  // Every case begun ahead was used by its jobs. Two workers: 8 input sets
  // (groups of 3 kv cache dtypes), each made ahead but a worker's first. One
  // worker: the list's 24 cases, each of other inputs than the one before it
  // (the seeds interleave), all but the first made ahead.
  for (const auto& [json, at_least] : {std::pair{"on.json", 6}, std::pair{"one.json", 23}}) {
    const Json made = Json::parse(slurp(d / json)).at("profile").at("cases_made_ahead");
    EXPECT_EQ(made.at("begun"), made.at("used")) << json;
    EXPECT_GE(made.at("used").get<int>(), at_least) << json;
  }
  EXPECT_FALSE(Json::parse(slurp(d / "off.json")).at("profile").contains("cases_made_ahead"));
}

// Groups are the cases of one input set wherever they are in the list: a
// suite of two seeds lists each kv cache dtype's seeds side by side, so the
// cases of one input set are never neighbours there (grouping only
// neighbours, as before, made every case a group of its own and handed
// nothing on: 10% more time on the CPU, PERFORMANCE.md).
TEST(Workers, GroupsAreTheCasesOfOneInputSetWhereverTheyAre) {
  RunConfig cfg;
  for (const CaseSpec& c : load_suite("vllm").cases)
    for (std::uint64_t seed : {0, 1}) {
      cfg.cases.push_back(c);
      cfg.cases.back().seed = seed;
    }
  std::vector<Job> jobs;
  for (std::size_t ci = 0; ci < cfg.cases.size(); ++ci)
    for (std::size_t bi = 0; bi < 2; ++bi) jobs.push_back(Job{ci, bi, Op::kLayer});
  const auto groups = job_groups(cfg, jobs);
  std::set<std::string> keys;
  std::size_t jobs_in_groups = 0;
  std::size_t last_first = 0;
  for (const auto& g : groups) {
    ASSERT_FALSE(g.empty());
    const std::string key = inputs_key(cfg.cases[g.front().case_index]);
    EXPECT_TRUE(keys.insert(key).second) << key << ": one group an input set";
    for (std::size_t k = 0; k < g.size(); ++k) {
      EXPECT_EQ(inputs_key(cfg.cases[g[k].case_index]), key);
      if (k > 0) {  // the list's order within a group: a case's jobs together, its kv cache dtypes in turn
        EXPECT_TRUE(g[k - 1].case_index < g[k].case_index ||
                    (g[k - 1].case_index == g[k].case_index && g[k - 1].backend_index < g[k].backend_index));
      }
    }
    EXPECT_GE(g.front().case_index, last_first);  // groups in the order of their first jobs
    last_first = g.front().case_index;
    jobs_in_groups += g.size();
  }
  EXPECT_EQ(jobs_in_groups, jobs.size());  // every job once
  // Each input set's kv cache dtypes in one group: as many groups as input
  // sets, fewer than cases (the vllm suite has 3 kv cache dtypes an input set).
  EXPECT_EQ(groups.size() * 3, cfg.cases.size());
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

// What a worker keeps between cases (its block pool, cases/block_pool.h)
// counts beside the others: a stream that ran a large group holds the
// smaller of the pool's limit and that group's bytes while its worker lives,
// even on a small group; its own kept blocks serve its next case first.
TEST(Workers, AWorkersKeptBlocksCountBesideOtherGroups) {
  std::vector<std::vector<Job>> groups(4, std::vector<Job>{Job{}});
  GroupQueue q(groups, {8, 1, 7, 4}, 11, 2, {}, {}, 5);
  EXPECT_EQ(q.try_take(0), 0u);            // alone: 8, and its worker may keep 5 of it
  EXPECT_EQ(q.try_take(0), 1u);            // on to the 1: it still holds 5
  EXPECT_EQ(q.try_take(1), std::nullopt);  // 7 beside 5 > 11 (beside the 1 alone it would fit)
  q.release(0);                            // the worker ends, and what it kept with it
  EXPECT_EQ(q.try_take(1), 2u);
  EXPECT_EQ(q.try_take(0), 3u);            // 4 beside 7 fits: stream 0's new worker keeps nothing
  EXPECT_EQ(q.try_take_ahead(0), std::nullopt);  // none left
  // A group taken ahead: beside the others' kept blocks too.
  GroupQueue a(groups, {8, 1, 2, 4}, 10, 2, {}, {}, 5);
  EXPECT_EQ(a.try_take(0), 0u);
  EXPECT_EQ(a.try_take(0), 1u);                  // holds max(1, 5) = 5
  EXPECT_EQ(a.try_take(1), 2u);                  // 2 beside 5 fits
  EXPECT_EQ(a.try_take_ahead(1), std::nullopt);  // 2 + 4 beside 5 > 10 (beside the 1 alone it would fit)
  a.release(0);
  EXPECT_EQ(a.try_take_ahead(1), 3u);
  // Without kept blocks: the same as the budget alone.
  GroupQueue plain(groups, {8, 1, 7, 4}, 11, 2);
  EXPECT_EQ(plain.try_take(0), 0u);
  EXPECT_EQ(plain.try_take(0), 1u);
  EXPECT_EQ(plain.try_take(1), 2u);  // 7 beside 1 fits
}

// The groups of a small family (one shape, other seeds) go to one stream in
// turn, so that each worker sets a shape up once (cuDNN's compiles); a large
// family is spread, and a stream takes another's family rather than idle.
TEST(Workers, AStreamTakesTheGroupsOfItsSmallFamilyInTurn) {
  std::vector<std::vector<Job>> groups(8, std::vector<Job>{Job{}});
  // A0 A1 B0 B1 C0 C1 B2 B3: A holds 200 of 206 (not small with 2 streams:
  // more than 206 / 4), B 4 and C 2 (small).
  const std::vector<std::uint64_t> bytes = {100, 100, 1, 1, 1, 1, 1, 1};
  GroupQueue q(groups, bytes, 0, 2, {}, {0, 0, 1, 1, 2, 2, 1, 1});
  EXPECT_EQ(q.try_take(0), 0u);        // A0
  EXPECT_EQ(q.try_take(1), 1u);        // A1: a large family is spread
  EXPECT_EQ(q.try_take(0), 2u);        // B0
  EXPECT_EQ(q.try_take(1), 4u);        // C0, not B1: B is stream 0's
  EXPECT_EQ(q.try_take_ahead(0), 3u);  // B1: its own family, ahead too
  EXPECT_EQ(q.try_take(1), 5u);        // C1
  EXPECT_EQ(q.try_take(1), 6u);        // no C left, every group left is B's: it takes one rather than idle
  q.advance(0);
  EXPECT_EQ(q.try_take(0), 7u);  // B3
  EXPECT_EQ(q.try_take(0), std::nullopt);
  // Without families: the order as given.
  GroupQueue plain(groups, bytes, 0, 2);
  for (std::size_t g = 0; g < 4; ++g) EXPECT_EQ(plain.try_take(g % 2), g);
  // A stream whose worker ended has set nothing up: its family is free to others.
  GroupQueue again(groups, bytes, 0, 2, {}, {0, 0, 1, 1, 2, 2, 1, 1});
  EXPECT_EQ(again.try_take(0), 0u);
  EXPECT_EQ(again.try_take(0), 1u);
  EXPECT_EQ(again.try_take(0), 2u);  // B0 on stream 0
  again.release(0);
  EXPECT_EQ(again.try_take(1), 3u);  // B1: no working stream is on B
  // The run's families are the cases' shapes: other seeds and kv cache dtypes
  // share one, other batch specs or TP degrees do not.
  Sweep seeds;
  seeds.seeds = {0, 1};
  const std::vector<CaseSpec> cases = apply_sweep(seeds, load_suite("vllm"));
  ASSERT_GE(cases.size(), 4u);
  EXPECT_NE(inputs_key(cases[0]), inputs_key(cases[1]));  // seed 0 and 1 of one spec
  EXPECT_EQ(shape_key(cases[0]), shape_key(cases[1]));
  EXPECT_EQ(shape_key(cases[0]), shape_key(cases[2]));  // another kv cache dtype
  EXPECT_NE(shape_key(cases[0]), shape_key(cases.back()));
}

// A group taken ahead holds its host memory beside the stream's current
// one (the worker has both cases for a while), one at a time, only when both
// fit beside every other stream's; advance leaves the stream holding it alone.
TEST(Workers, AGroupTakenAheadHoldsItsMemoryBesideTheCurrentOne) {
  std::vector<std::vector<Job>> groups(4, std::vector<Job>{Job{}});
  GroupQueue q(groups, {4, 5, 3, 9}, 10, 2);
  EXPECT_EQ(q.try_take_ahead(0), std::nullopt);  // nothing running: nothing to be ahead of
  EXPECT_EQ(q.try_take(0), 0u);                  // 4
  EXPECT_EQ(q.try_take_ahead(0), 1u);            // 4 + 5 fit
  EXPECT_EQ(q.try_take_ahead(0), std::nullopt);  // one ahead at a time
  EXPECT_EQ(q.try_take(1), std::nullopt);        // 3 beside 4 + 5 > 10
  q.advance(0);                                  // stream 0 now runs the 5 alone
  EXPECT_EQ(q.try_take(1), 2u);                  // 3 beside 5 fits
  EXPECT_EQ(q.try_take_ahead(1), std::nullopt);  // 9 beside 5 + 3 does not
  q.release(0);
  EXPECT_EQ(q.try_take_ahead(1), std::nullopt);  // 3 + 9 > 10: a group ahead is never alone
  EXPECT_EQ(q.try_take(0), std::nullopt);        // nor does the 9 fit beside the 3 (order kept)
  EXPECT_THROW(q.advance(0), std::logic_error);  // stream 0 took nothing ahead
  q.release(1);
  EXPECT_EQ(q.try_take(0), 3u);  // alone, it runs
}

// A fixed list's case made ahead: named with the first job of a case when
// the case after it has other inputs (the same inputs are handed on), and
// never for a job that starts a new worker.
TEST(Workers, AListNamesTheNextInputSetsCaseWithTheFirstJobOfTheCaseBeforeIt) {
  RunConfig cfg;
  cfg.cases = load_suite("vllm").cases;
  ASSERT_GT(cfg.cases.size(), 4u);
  std::size_t a = 0, b = 1;  // two consecutive cases with other inputs, and a third beside b
  while (b + 1 < cfg.cases.size() && inputs_key(cfg.cases[a]) == inputs_key(cfg.cases[b])) ++a, ++b;
  ASSERT_NE(inputs_key(cfg.cases[a]), inputs_key(cfg.cases[b]));
  std::vector<Job> jobs = {Job{a, 0, Op::kLayer}, Job{a, 1, Op::kLayer}, Job{b, 0, Op::kLayer}, Job{b, 1, Op::kLayer}};
  using isolation_detail::ahead_in_list;
  EXPECT_EQ(ahead_in_list(cfg, jobs, 0), b);
  // Not where the two cases do not fit in memory at once.
  EXPECT_EQ(ahead_in_list(cfg, jobs, 0, [](std::size_t, std::size_t) { return false; }), std::nullopt);
  EXPECT_EQ(ahead_in_list(cfg, jobs, 0, [&](std::size_t x, std::size_t y) { return x == a && y == b; }), b);
  EXPECT_EQ(ahead_in_list(cfg, jobs, 1), std::nullopt);  // not the case's first job
  EXPECT_EQ(ahead_in_list(cfg, jobs, 2), std::nullopt);  // nothing after it
  jobs[2].fresh_worker = true;
  EXPECT_EQ(ahead_in_list(cfg, jobs, 0), std::nullopt);
  jobs[2].fresh_worker = false;
  jobs[2].case_index = jobs[3].case_index = a;  // one case throughout
  EXPECT_EQ(ahead_in_list(cfg, jobs, 0), std::nullopt);
  std::size_t same = a + 1;  // a case with a's inputs (another kv cache dtype): handed on, not made ahead
  while (same < cfg.cases.size() && inputs_key(cfg.cases[same]) != inputs_key(cfg.cases[a])) ++same;
  if (same < cfg.cases.size()) {
    jobs[2].case_index = jobs[3].case_index = same;
    EXPECT_EQ(ahead_in_list(cfg, jobs, 0), std::nullopt);
  }
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
