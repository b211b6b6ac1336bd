// mlagate explore (harness/explore/EXPLORE.md), end to end through the real
// binary: the draw is deterministic and reaches the boundaries; the planted
// shape bugs of libmlagate_explore_plugin.so pass every built-in suite (no
// built-in case meets their triggers) and a search finds each, shrinks it to
// a few tokens, and its bundle replays; a crash costs one record; --resume
// after a kill continues to the same report; a suite file's explore block is
// the space; exit codes 1 / 0 / 4 / 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "backends/cpu/cpu_backends.h"
#include "cases/errors.h"
#include "cases/suite.h"
#include "harness/explore/draw.h"
#include "harness/explore/signature.h"
#include "tests/reliability/run_mlagate.h"

namespace mlagate {
namespace {

using namespace rel_test;

const std::string kExplorePlugin = MLAGATE_TEST_EXPLORE_PLUGIN;
const std::string kPlantedSpace = MLAGATE_TEST_PLANTED_SPACE;

Json report_of(const fs::path& dir) { return Json::parse(slurp(dir / "report.json")); }

// FNV-1a of the drawn ids: the draw pinned across machines and compilers.
std::uint64_t fnv(const std::string& s, std::uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

TEST(ExploreDraw, SameSeedSameCasesAndTheBoundariesAreReached) {
  const auto paged = make_cpu_paged();
  DrawLimits lim;
  lim.max_work = 1e9;
  const CaseDrawer a(ExploreSpace{}, {paged.get()}, 7, lim), b(ExploreSpace{}, {paged.get()}, 7, lim),
      other(ExploreSpace{}, {paged.get()}, 8, lim);
  std::uint64_t h = 1469598103934665603ull;
  int differ = 0, pow2_heads = 0, odd_heads = 0, padding = 0, long_q = 0, bs1 = 0, long_ctx = 0, ops_seen = 0;
  std::set<Op> ops;
  std::set<std::string> dims, kvs, layouts;
  for (std::uint64_t i = 0; i < 400; ++i) {
    const auto x = a.draw(i), y = b.draw(i), z = other.draw(i);
    ASSERT_TRUE(x && y && z) << i;
    ASSERT_EQ(x->spec.id(), y->spec.id());
    ASSERT_EQ(x->op, y->op);
    differ += x->spec.id() != z->spec.id();
    h = fnv(x->spec.id() + std::string(op_name(x->op)), h);
    const CaseSpec& c = x->spec;
    EXPECT_NO_THROW(c.validate());
    EXPECT_TRUE(paged->supports(c, x->op).ok) << c.id();
    EXPECT_LE(reference_work(c, x->op), lim.max_work) << c.id();
    EXPECT_LE(c.num_kv_tokens(), ExploreSpace{}.max_keys);
    const int n = c.num_heads();
    pow2_heads += (n & (n - 1)) == 0;
    odd_heads += n > 16 && n % 16 != 0;
    for (std::size_t r = 0; r < c.batch.seq_lens.size(); ++r) {
      padding += c.batch.seq_lens[r] == 0;
      long_q += c.batch.query_lens[r] > 64;
      long_ctx += c.batch.seq_lens[r] > 65536;
      bs1 += c.block_size == 1 && c.batch.seq_lens[r] > 2048 && c.batch.seq_lens[r] % 64 == 1;
    }
    ops.insert(x->op);
    dims.insert(dims_label(c.dims));
    kvs.insert(kv_cache_format_name(c.kv_format()));
    layouts.insert(layout_name(c.layout));
  }
  (void)ops_seen;
  EXPECT_EQ(layouts.size(), 5u) << "contiguous and every layout part (cases/LAYOUTS.md) are drawn";
  EXPECT_GT(differ, 390) << "another seed draws other cases";
  // The whole draw, pinned: integer arithmetic only, so any machine draws these ids.
  EXPECT_EQ(h, 6936444809200538718u) << "draw hash (update when the draw changes on purpose): " << h;
  EXPECT_GT(pow2_heads, 40);
  EXPECT_GT(odd_heads, 40);
  EXPECT_GT(padding, 10);
  EXPECT_GT(long_q, 10);
  EXPECT_GT(long_ctx, 0);
  EXPECT_GT(bs1, 0);
  EXPECT_EQ(ops.size(), 4u) << "layer, decode, prefill, cache_write";
  EXPECT_EQ(dims.size(), 4u) << "deepseek, glm, v4, nope";
  EXPECT_EQ(kvs.size(), 5u) << "auto, fp8, fp8_e4m3, fp8_ds_mla:pow2, fp8_ds_mla:raw";
}

// The planted bugs' triggers (explore_plugin.cpp); no built-in case meets
// one, so every fixed suite passes the planted backends (they are cpu.paged
// elsewhere, bit for bit).
bool triggers(const CaseSpec& c, int block_size) {
  const int n = c.num_heads();
  if (n > 16 && n % 16 != 0) return true;
  for (std::size_t r = 0; r < c.batch.seq_lens.size(); ++r) {
    const int s = c.batch.seq_lens[r], q = c.batch.query_lens[r];
    if (q > 64 || s >= 65536 || (block_size == 1 && s > 2048 && s % 64 == 1)) return true;
  }
  return false;
}

TEST(ExplorePlanted, NoBuiltinSuiteMeetsATrigger) {
  const auto paged = make_cpu_paged();
  int cases = 0;
  for (const std::string& name : builtin_suite_names()) {
    for (const CaseSpec& c : load_suite(name).cases) {
      ++cases;
      EXPECT_FALSE(triggers(c, resolve_block_size(paged->capabilities(), c))) << c.id();
    }
  }
  EXPECT_GT(cases, 400);
}

// One search over the four planted backends finds each one's bug, shrinks
// it to a handful of query tokens, and the shrunk bundle replays. Triage is
// off: it was a third of this test's time on 2 cores, and ExploreCauses and
// TriageCli test it.
TEST(ExplorePlanted, OneSearchFindsShrinksAndReplaysEachBug) {
  const fs::path d = temp_dir("explore_planted");
  const fs::path out = d / "x";
  ASSERT_EQ(run_mlagate({"explore", "--plugin", kExplorePlugin, "--backend", "explore.*", "--suite", kPlantedSpace,
                         "--cases", "16", "--seed", "3", "--shrink-runs", "40", "--no-triage", "--out", out.string()},
                        d),
            1)
      << slurp(d / "stderr.txt") << slurp(d / "stdout.txt");
  const Json r = report_of(out);
  EXPECT_EQ(r.at("verdict"), "FAIL");
  std::map<std::string, Json> first;  // backend -> its first finding
  for (const Json& f : r.at("findings")) first.emplace(f.at("backend").get<std::string>(), f);
  for (const char* b : {"explore.heads_tile16", "explore.qlen_past_64", "explore.seq_past_64k", "explore.bs1_mod64"}) {
    SCOPED_TRACE(b);
    ASSERT_TRUE(first.count(b)) << slurp(d / "stdout.txt");
    const Json& f = first.at(b);
    // The 16-bit seq_len reads a 65,536-key request as empty: lse -inf, NONFINITE.
    const std::string want = std::string(b) == "explore.seq_past_64k" ? "NONFINITE" : "INCORRECT";
    EXPECT_EQ(f.at("status"), want) << f.dump(1);
    ASSERT_TRUE(f.at("shrunk").contains("case")) << f.dump(1);
    const Json& s = f.at("shrunk");
    EXPECT_EQ(s.at("status"), want);
    // A handful of query tokens (the q_len bug needs 65 of them).
    const Suite shrunk = load_suite(s.at("suite_file").get<std::string>());
    ASSERT_EQ(shrunk.cases.size(), 1u);
    EXPECT_LE(shrunk.cases[0].num_tokens(), std::string(b) == "explore.qlen_past_64" ? 65 : 4) << s.dump(1);
    EXPECT_LE(shrunk.cases[0].num_requests(), 2) << s.dump(1);
    EXPECT_LE(shrunk.cases[0].num_heads(), std::string(b) == "explore.heads_tile16" ? 33 : 4) << s.dump(1);
    ASSERT_FALSE(s.at("bundle").get<std::string>().empty());
    EXPECT_EQ(run_mlagate({"replay", s.at("bundle").get<std::string>(), "--plugin", kExplorePlugin, "--backend", b,
                           "--op", f.at("op").get<std::string>(), "--no-progress"},
                          d),
              1)
        << "the bundle replays the failure";
  }
}

// A small space for the tests of the search's mechanics (seconds, not minutes).
fs::path small_space(const fs::path& d) {
  const fs::path p = d / "small.yaml";
  std::ofstream(p) << "name: small\n"
                      "explore:\n"
                      "  ops: [decode]\n"
                      "  requests: [1, 4]\n"
                      "  seq_len: [0, 300]\n"
                      "  query_len: [1, 4]\n"
                      "  heads: [1, 24]\n"
                      "  dims: [deepseek]\n"
                      "  kv_cache_dtype: [auto, fp8]\n"
                      "  max_work: 1.0e7\n";
  return p;
}

// Killed after its first round, a search resumed reaches the report of one
// that ran through: the same records, coverage and cases.
TEST(ExploreRun, ResumeAfterAKillReachesTheSameReport) {
  const fs::path d = temp_dir("explore_resume");
  const std::string space = small_space(d).string();
  const std::vector<std::string> base = {"explore", "--backend", "cpu.paged", "--suite", space, "--cases", "24",
                                         "--round", "6", "--seed", "5"};
  auto with_out = [&](const fs::path& out, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = base;
    a.insert(a.end(), {"--out", out.string()});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  ASSERT_EQ(run_mlagate(with_out(d / "whole", {"--profile"}), d), 0) << slurp(d / "stderr.txt");
  {
    // --profile: where the search's time went, rows that add up to its wall
    // (the runs' phases, their processes, explore's own work).
    const std::string out = slurp(d / "stdout.txt");
    EXPECT_NE(out.find("profile of the search"), std::string::npos) << out;
    for (const char* row : {"\ngenerate ", "\nreference ", "\nrun ", "\nprocess ", "\nexplore ", "\nsearch (wall) "})
      EXPECT_NE(out.find(row), std::string::npos) << row << "\n" << out;
    const Json r = report_of(d / "whole");
    double sum = 0;
    for (const auto& [phase, s] : r.at("profile_s").items()) sum += s.get<double>();
    EXPECT_NEAR(sum, r.at("search_s").get<double>(), 1e-6) << r.at("profile_s").dump();
    EXPECT_GT(r.at("profile_s").at("process").get<double>(), 0);
    EXPECT_GT(r.at("profile_s").at("reference").get<double>(), 0);
  }
  {
    Child c(with_out(d / "cut"), d, "");
    ASSERT_TRUE(wait_for(
        [&] {
          std::ifstream in(d / "cut" / "state.json");
          if (!in) return false;
          try {
            return Json::parse(in).at("next_index").get<int>() >= 6;
          } catch (...) {
            return false;
          }
        },
        120));
    ::kill(c.pid, SIGKILL);
    ::waitpid(c.pid, nullptr, 0);
    c.pid = -1;
  }
  const int next = Json::parse(slurp(d / "cut" / "state.json")).at("next_index").get<int>();
  EXPECT_LT(next, 24) << "killed before the end";
  // Not resumed: refused (the folder holds a search); another seed: refused.
  EXPECT_EQ(run_mlagate(with_out(d / "cut"), d), 2);
  EXPECT_NE(slurp(d / "stderr.txt").find("--resume continues it"), std::string::npos);
  std::vector<std::string> other = with_out(d / "cut", {"--resume"});
  *(std::find(other.begin(), other.end(), "--seed") + 1) = "6";
  EXPECT_EQ(run_mlagate(other, d), 2);
  EXPECT_NE(slurp(d / "stderr.txt").find("other options"), std::string::npos);
  ASSERT_EQ(run_mlagate(with_out(d / "cut", {"--resume"}), d), 0) << slurp(d / "stderr.txt");
  const Json a = report_of(d / "whole"), b = report_of(d / "cut");
  for (const char* k : {"records", "coverage", "cases", "findings", "next_index"}) EXPECT_EQ(a.at(k), b.at(k)) << k;
  EXPECT_EQ(a.at("cases").at("ran"), 24);
  EXPECT_EQ(a.at("verdict"), "PASS");
  EXPECT_TRUE(fs::exists(d / "whole" / "report.html"));
}

// The default rounds grow with the search: 16, 16, 32, then up to 256 (the
// progress line after each round shows the cases drawn so far); --round N
// keeps N.
TEST(ExploreRun, DefaultRoundsGrowWithTheSearch) {
  const fs::path d = temp_dir("explore_rounds");
  const std::string space = small_space(d).string();
  ASSERT_EQ(run_mlagate({"explore", "--backend", "cpu.paged", "--suite", space, "--cases", "64", "--seed", "5", "--no-shrink",
                         "--out", (d / "auto").string()},
                        d),
            0)
      << slurp(d / "stderr.txt");
  std::string out = slurp(d / "stdout.txt");
  for (const char* drawn : {"\n  16 cases drawn", "\n  32 cases drawn", "\n  64 cases drawn"})
    EXPECT_NE(out.find(drawn), std::string::npos) << drawn << "\n" << out;
  EXPECT_EQ(out.find("\n  48 cases drawn"), std::string::npos) << out;
  ASSERT_EQ(run_mlagate({"explore", "--backend", "cpu.paged", "--suite", space, "--cases", "64", "--seed", "5", "--no-shrink",
                         "--round", "16", "--out", (d / "fixed").string()},
                        d),
            0)
      << slurp(d / "stderr.txt");
  out = slurp(d / "stdout.txt");
  EXPECT_NE(out.find("\n  48 cases drawn"), std::string::npos) << out;
  // The same cases either way: the records and what they cover.
  const Json a = report_of(d / "auto"), b = report_of(d / "fixed");
  for (const char* k : {"records", "coverage", "cases"}) EXPECT_EQ(a.at(k), b.at(k)) << k;
}

// A backend that segfaults on every call costs one record per case, and the
// search goes on to the end: one finding (CRASHED) counted on every case.
TEST(ExploreRun, CrashesAndHangsAreRecordsAndTheSearchGoesOn) {
  const fs::path d = temp_dir("explore_crash");
  const std::string space = small_space(d).string();
  ASSERT_EQ(run_mlagate({"explore", "--plugin", kPlugin, "--backend", "rel.segv", "--suite", space, "--cases", "8",
                         "--round", "4", "--shrink-runs", "3", "--out", (d / "x").string()},
                        d),
            1)
      << slurp(d / "stderr.txt");
  Json r = report_of(d / "x");
  EXPECT_EQ(r.at("cases").at("ran"), 8);
  EXPECT_EQ(r.at("records").at("CRASHED"), 8);
  ASSERT_EQ(r.at("findings").size(), 1u) << r.at("findings").dump(1);
  EXPECT_EQ(r.at("findings")[0].at("status"), "CRASHED");
  EXPECT_EQ(r.at("findings")[0].at("count"), 8);
  EXPECT_NE(r.at("findings")[0].at("signature").get<std::string>().find("killed by signal # (Segmentation fault)"),
            std::string::npos)
      << r.at("findings")[0].dump(1);
  // A hang: TIMEOUT records, one finding, the search ends.
  ASSERT_EQ(run_mlagate({"explore", "--plugin", kPlugin, "--backend", "rel.hang", "--suite", space, "--cases", "2",
                         "--timeout", "1", "--no-shrink", "--out", (d / "h").string()},
                        d),
            1)
      << slurp(d / "stderr.txt");
  r = report_of(d / "h");
  EXPECT_EQ(r.at("records").at("TIMEOUT"), 2);
  ASSERT_EQ(r.at("findings").size(), 1u);
  EXPECT_EQ(r.at("findings")[0].at("status"), "TIMEOUT");
}

TEST(ExploreRun, ExitCodesAndBadInput) {
  const fs::path d = temp_dir("explore_exit");
  // Nothing to draw (cpu.paged has no sparse op): nothing ran, 4.
  EXPECT_EQ(run_mlagate({"explore", "--backend", "cpu.paged", "--op", "sparse_decode", "--cases", "3", "--out",
                         (d / "none").string()},
                        d),
            4);
  EXPECT_EQ(report_of(d / "none").at("verdict"), "NOTHING_RAN");
  EXPECT_EQ(run_mlagate({"explore", "--backend", "cpu.paged", "--out", (d / "a").string()}, d), 2);  // no --cases/--budget
  EXPECT_NE(slurp(d / "stderr.txt").find("--cases N or --budget"), std::string::npos);
  EXPECT_EQ(run_mlagate({"explore", "--backend", "cpu.paged", "--budget", "ten", "--out", (d / "b").string()}, d), 2);
  EXPECT_EQ(run_mlagate({"explore", "--backend", "cpu.paged", "--suite", "smoke", "--cases", "2", "--out", (d / "c").string()}, d), 2);
  EXPECT_NE(slurp(d / "stderr.txt").find("no explore: block"), std::string::npos);
  std::ofstream(d / "bad.yaml") << "name: bad\nexplore:\n  seq_len: [10, 5]\n";
  EXPECT_EQ(run_mlagate({"explore", "--backend", "cpu.paged", "--suite", (d / "bad.yaml").string(), "--cases", "2"}, d), 2);
  EXPECT_NE(slurp(d / "stderr.txt").find("bad.yaml:3: seq_len must be [lo, hi]"), std::string::npos) << slurp(d / "stderr.txt");
  std::ofstream(d / "typo.yaml") << "name: typo\nexplore:\n  heads: [1, 8]\n  sequence: [1, 2]\n";
  EXPECT_EQ(run_mlagate({"explore", "--backend", "cpu.paged", "--suite", (d / "typo.yaml").string(), "--cases", "2"}, d), 2);
  EXPECT_NE(slurp(d / "stderr.txt").find("typo.yaml:4: unknown explore key 'sequence'"), std::string::npos);
  // A space alone is no suite to run.
  EXPECT_EQ(run_mlagate({"run", "--suite", small_space(d).string(), "--backend", "cpu.paged"}, d), 2);
  EXPECT_NE(slurp(d / "stderr.txt").find("has no groups"), std::string::npos);
  // A corrupt state file: refused, not overwritten.
  fs::create_directories(d / "corrupt");
  std::ofstream(d / "corrupt" / "state.json") << "{\"schema\": 1";
  EXPECT_EQ(run_mlagate({"explore", "--backend", "cpu.paged", "--cases", "2", "--resume", "--out", (d / "corrupt").string()}, d), 2);
  EXPECT_EQ(slurp(d / "corrupt" / "state.json"), "{\"schema\": 1");
}

// The explore block parses to the space it names, and the space written back
// as YAML parses to the same space.
TEST(ExploreSpaceFile, ParsesAndRoundTrips) {
  const Suite s = parse_suite_yaml(
      "name: s\nexplore:\n  ops: [decode, layer]\n  requests: [2, 9]\n  seq_len: [0, 4096]\n  heads: [3, 40]\n"
      "  dims: [glm, 256.64.64.64]\n  dtype: [fp16]\n  kv_cache_dtype: [fp8_ds_mla:raw, auto]\n  block_size: [1, 64]\n"
      "  q_magnitude: [1, 96]\n  k_scale: [3]\n  topk: [5, 77]\n  window: [2, 9]\n  compressed: [none, 4]\n"
      "  index_pattern: [oob, dup]\n  padding_percent: 50\n  max_keys: 999\n  max_work: 123456\n",
      "s.yaml");
  ASSERT_TRUE(s.explore);
  const ExploreSpace& x = *s.explore;
  EXPECT_TRUE(s.cases.empty());
  EXPECT_EQ(x.ops, (std::vector<std::string>{"decode", "layer"}));
  EXPECT_EQ(x.requests, (IntRange{2, 9}));
  EXPECT_EQ(x.heads, (IntRange{3, 40}));
  EXPECT_EQ(x.dims, (std::vector<std::string>{"glm", "256.64.64.64"}));
  EXPECT_EQ(x.kv_dtypes.size(), 2u);
  EXPECT_EQ(x.compress, (std::vector<int>{0, 4}));
  EXPECT_EQ(x.patterns, (std::vector<IndexPattern>{IndexPattern::kOutOfRange, IndexPattern::kDuplicates}));
  EXPECT_EQ(x.padding_percent, 50);
  EXPECT_EQ(x.max_keys, 999);
  EXPECT_EQ(x.max_work, 123456);
  const Suite back = parse_suite_yaml("name: t\n" + explore_space_yaml(x), "t.yaml");
  ASSERT_TRUE(back.explore);
  EXPECT_EQ(*back.explore, x);
  const Suite dflt = parse_suite_yaml("name: u\n" + explore_space_yaml(ExploreSpace{}), "u.yaml");
  EXPECT_EQ(*dflt.explore, ExploreSpace{});
}

// Failure signatures do not depend on how many heads or requests a bug touches.
TEST(ExploreSignature, HeadsTailsPaddingAndMessages) {
  CaseSpec c;
  c.batch.name = "x";
  c.batch.seq_lens = {10, 0, 70};
  c.batch.query_lens = {2, 1, 68};
  Metrics m;
  m.output = "out";
  m.map_tokens = 71;
  m.map_heads = 20;
  m.err_token_head.assign(71 * 20, 1e-3f);
  m.query_lens = {2, 1, 68};
  Record r;
  r.status = Status::kIncorrect;
  r.op = "layer";
  m.passed = false;
  auto sig = [&] {
    r.metrics = {m};
    return failure_signature(r, c);
  };
  for (int t = 0; t < 71; ++t) m.err_token_head[t * 20 + 17] = 2.0f;  // head 17 everywhere
  EXPECT_EQ(sig(), "INCORRECT layer out: some heads");
  m.err_token_head.assign(71 * 20, 1e-3f);
  for (int t = 3 + 64; t < 71; ++t)
    for (int h = 0; h < 20; ++h) m.err_token_head[t * 20 + h] = 2.0f;  // tokens 64.. of request 2
  EXPECT_EQ(sig(), "INCORRECT layer out: the tail of a request");
  m.err_token_head.assign(71 * 20, 1e-3f);
  for (int h = 0; h < 20; ++h) m.err_token_head[2 * 20 + h] = NAN;  // the padding request's row
  r.status = Status::kNonfinite;
  EXPECT_EQ(sig(), "NONFINITE layer out: padding requests (seq_len 0)");
  r.status = Status::kCrashed;
  r.metrics.clear();
  r.message = "worker killed by signal 11 (SIGSEGV) after 1.25 s";
  EXPECT_EQ(failure_signature(r, c), "CRASHED layer: worker killed by signal # (SIGSEGV) after # s");
}

// mlagate shrink on a sparse V4 case and on dims that are no preset (a
// correct backend made to fail by a zero tolerance): the shrunk suite file
// holds the sparse fields and the L.R.P.V dims, and reruns the failure.
TEST(ExploreShrink, SparseCasesAndDimsThatAreNoPreset) {
  const fs::path d = temp_dir("explore_shrink");
  const std::string v4 = "v4/v4_decode/tp16/bf16/kv=auto/bs=auto/seed=0/dims=v4/win=128/cmp=4x96/sink";
  ASSERT_EQ(run_mlagate({"shrink", "--suite", "v4", "--case", v4, "--backend", "cpu.sparse", "--op", "sparse_decode",
                         "--policy", "fixed", "--atol", "0", "--rtol", "0", "--max-runs", "25", "--out", (d / "s").string()},
                        d),
            0)
      << slurp(d / "stderr.txt") << slurp(d / "stdout.txt");
  const Suite s = load_suite((d / "s" / "shrunk.yaml").string());
  ASSERT_EQ(s.cases.size(), 1u);
  EXPECT_TRUE(s.cases[0].sparse.v4());
  const CaseSpec full = load_suite("v4").cases[0];
  EXPECT_LT(s.cases[0].num_tokens() + s.cases[0].num_heads() + s.cases[0].sparse.window + s.cases[0].sparse.extra_topk,
            full.num_tokens() + full.num_heads() + 128 + 96)
      << slurp(d / "stdout.txt");
  EXPECT_EQ(run_mlagate({"run", "--suite", (d / "s" / "shrunk.yaml").string(), "--backend", "cpu.sparse", "--op",
                         "sparse_decode", "--policy", "fixed", "--atol", "0", "--rtol", "0", "--no-progress"},
                        d),
            1);
  std::ofstream(d / "dims.yaml") << "name: dims\nspecs:\n  two: {seq_lens: [40, 9], query_lens: [3, 1]}\n"
                                    "groups:\n  - {specs: [two], tp: [16], dims: [256.64.64.32]}\n";
  const std::string id = load_suite((d / "dims.yaml").string()).cases.at(0).id();
  EXPECT_NE(id.find("/dims=256.64.64.32"), std::string::npos);
  ASSERT_EQ(run_mlagate({"shrink", "--suite", (d / "dims.yaml").string(), "--case", id, "--backend", "cpu.paged",
                         "--policy", "fixed", "--atol", "0", "--rtol", "0", "--max-runs", "15", "--out", (d / "p").string()},
                        d),
            0)
      << slurp(d / "stderr.txt") << slurp(d / "stdout.txt");
  EXPECT_NE(slurp(d / "p" / "shrunk.yaml").find("256.64.64.32"), std::string::npos);
}

}  // namespace
}  // namespace mlagate
