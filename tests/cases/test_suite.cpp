// Tests for cases/suite: the built-in suites hold exactly the SPEC: Batch specs
// cases, malformed suite files fail with file:line, suite files may define
// their own specs, and command-line sweeps expand and replace axes.
#include "cases/suite.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "cases/case.h"
#include "cases/errors.h"

namespace mlagate {
namespace {

std::vector<int> rep(int value, int times) { return std::vector<int>(static_cast<std::size_t>(times), value); }

// the table of SPEC: Batch specs, written out independently of specs.yaml.
const std::map<std::string, std::pair<std::vector<int>, std::vector<int>>>& vllm_table() {
  static const std::map<std::string, std::pair<std::vector<int>, std::vector<int>>> t = {
      {"small_decode", {{32, 40}, {1, 1}}},
      {"small_prefill", {{32, 40}, {8, 8}}},
      {"mixed_small", {{32, 40, 48, 56}, {1, 1, 5, 5}}},
      {"medium_decode", {{128, 256, 512, 1024, 128, 256, 512, 1024}, rep(1, 8)}},
      {"medium_prefill", {{256, 512, 1024, 2048}, rep(16, 4)}},
      {"mixed_medium", {{512, 1024, 2048, 512, 1024, 2048}, {1, 1, 1, 7, 7, 7}}},
      {"large_decode", {rep(2048, 32), rep(1, 32)}},
      {"large_prefill", {rep(4096, 8), rep(32, 8)}},
      {"single_decode", {{1024}, {1}}},
      {"single_prefill", {{1024}, {64}}},
      {"spec_decode_small", {{128, 256, 512, 1024}, rep(4, 4)}},
      {"spec_decode_medium", {{512, 1024, 2048, 512, 1024, 2048}, rep(8, 6)}},
  };
  return t;
}

void expect_unique_ids(const std::vector<CaseSpec>& cases) {
  std::set<std::string> ids;
  for (const auto& c : cases) EXPECT_TRUE(ids.insert(c.id()).second) << "duplicate id " << c.id();
}

TEST(Suites, BuiltinNames) {
  const std::vector<std::string> names = builtin_suite_names();
  for (const char* n : {"vllm", "smoke", "edges", "fp8"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  EXPECT_EQ(std::find(names.begin(), names.end(), "specs"), names.end()) << "specs.yaml is not a suite";
}

TEST(Suites, VllmIsTheSeedSweep) {
  const Suite s = load_suite("vllm");
  EXPECT_EQ(s.name, "vllm");
  ASSERT_EQ(s.cases.size(), 144u);  // 12 specs x TP {1, 4, 8, 16} x kv {auto, fp8, fp8_e4m3}
  expect_unique_ids(s.cases);
  std::map<std::string, std::set<int>> tps;
  std::map<std::string, std::set<std::string>> kvs;
  for (const CaseSpec& c : s.cases) {
    SCOPED_TRACE(c.id());
    const auto it = vllm_table().find(c.batch.name);
    ASSERT_NE(it, vllm_table().end()) << "not in SPEC: Batch specs";
    EXPECT_EQ(c.batch.seq_lens, it->second.first);
    EXPECT_EQ(c.batch.query_lens, it->second.second);
    EXPECT_EQ(c.batch.spec_decode, c.batch.name.starts_with("spec_decode"));
    EXPECT_EQ(c.block_size, 0) << "each backend picks its block size, as in the seed";
    EXPECT_EQ(c.dtype, DType::kBF16);
    kvs[c.batch.name + "/tp" + std::to_string(c.tp)].insert(kv_cache_format_name(c.kv_format()));
    EXPECT_EQ(c.k_scale, 1.0f);
    EXPECT_EQ(c.dims, Dims{});
    EXPECT_EQ(c.total_heads, 128);
    EXPECT_EQ(c.seed, 0u);
    EXPECT_EQ(c.suite, "vllm");
    EXPECT_NO_THROW(c.validate());
    tps[c.batch.name].insert(c.tp);
  }
  ASSERT_EQ(tps.size(), 12u);
  for (const auto& [name, t] : tps) EXPECT_EQ(t, (std::set<int>{1, 4, 8, 16})) << name;
  for (const auto& [name, k] : kvs) EXPECT_EQ(k, (std::set<std::string>{"auto", "fp8", "fp8_e4m3"})) << name;
  // The same table through the spec registry.
  for (const auto& [name, lens] : vllm_table()) {
    EXPECT_EQ(find_batch_spec(name).seq_lens, lens.first) << name;
    EXPECT_EQ(find_batch_spec(name).query_lens, lens.second) << name;
  }
  EXPECT_THROW(find_batch_spec("no_such_spec"), InputError);
}

TEST(Suites, SmokeAndEdgesLoadAndValidate) {
  for (const char* name : {"smoke", "edges", "fp8"}) {
    const Suite s = load_suite(name);
    EXPECT_EQ(s.name, name);
    EXPECT_FALSE(s.cases.empty());
    expect_unique_ids(s.cases);
    for (const CaseSpec& c : s.cases) {
      EXPECT_NO_THROW(c.validate()) << c.id();
      EXPECT_EQ(c.suite, name);
    }
  }
  // One small built-in case generates end to end.
  const Suite smoke = load_suite("smoke");
  const auto it = std::find_if(smoke.cases.begin(), smoke.cases.end(),
                               [](const CaseSpec& c) { return c.batch.name == "small_decode"; });
  ASSERT_NE(it, smoke.cases.end());
  EXPECT_EQ(generate_case(*it).num_tokens, 2);
}

TEST(Suites, EdgesCoverSection4) {
  const Suite s = load_suite("edges");
  auto any = [&](auto pred) { return std::any_of(s.cases.begin(), s.cases.end(), pred); };
  auto has_len = [](const CaseSpec& c, auto pred) {
    for (std::size_t i = 0; i < c.batch.seq_lens.size(); ++i)
      if (pred(c.batch.seq_lens[i], c.batch.query_lens[i])) return true;
    return false;
  };
  EXPECT_TRUE(any([&](const CaseSpec& c) { return has_len(c, [](int sl, int ql) { return sl == 0 && ql == 1; }); }))
      << "padding request";
  EXPECT_TRUE(any([&](const CaseSpec& c) { return has_len(c, [](int sl, int) { return sl == 1; }); })) << "seq_len 1";
  EXPECT_TRUE(any([&](const CaseSpec& c) { return has_len(c, [](int sl, int ql) { return sl == ql && sl > 1; }); }))
      << "no context";
  for (int bs : {16, 32, 64, 128}) {
    EXPECT_TRUE(any([&](const CaseSpec& c) { return has_len(c, [bs](int sl, int) { return sl == bs; }); })) << bs;
    EXPECT_TRUE(any([&](const CaseSpec& c) { return has_len(c, [bs](int sl, int) { return sl == bs + 1; }); })) << bs;
  }
  EXPECT_TRUE(any([&](const CaseSpec& c) { return has_len(c, [](int sl, int) { return sl >= 32768; }); }))
      << ">= 32k context";
  EXPECT_TRUE(any([](const CaseSpec& c) {
    const auto& q = c.batch.query_lens;
    return c.batch.spec_decode && std::adjacent_find(q.begin(), q.end(), std::not_equal_to<>()) != q.end();
  })) << "non-uniform spec decode";
  EXPECT_TRUE(any([](const CaseSpec& c) { return c.q_magnitude >= 8; })) << "large-magnitude q";
  EXPECT_TRUE(any([](const CaseSpec& c) { return c.dims == dims_preset("glm"); })) << "glm dims";
  EXPECT_TRUE(any([](const CaseSpec& c) { return c.block_size == 16; }));
  EXPECT_TRUE(any([](const CaseSpec& c) { return c.dtype == DType::kF16; }));
}

// Parses `text` as "bad.yaml" and returns the InputError message.
std::string parse_error(const std::string& text) {
  try {
    parse_suite_yaml(text, "bad.yaml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SuiteYaml, ErrorsNameFileAndLine) {
  struct Bad {
    const char* what;
    std::string text;
    const char* prefix;  // "file:line:" the message must start with
    const char* reason;
  };
  const Bad bad[] = {
      {"unknown group key", "name: b\ngroups:\n  - specs: [small_decode]\n    tps: [1]\n", "bad.yaml:4:",
       "unknown group key 'tps'"},
      {"unknown top-level key", "name: b\ncases: 3\ngroups:\n  - specs: [small_decode]\n", "bad.yaml:2:",
       "unknown top-level key"},
      {"unknown spec", "name: b\ngroups:\n  - specs: [small_decode, nope]\n", "bad.yaml:3:",
       "unknown batch spec 'nope'"},
      {"unknown tag", "name: b\ngroups:\n  - spec_tags: [nope]\n", "bad.yaml:3:", "tag 'nope'"},
      {"bad tp", "name: b\ngroups:\n  - specs: [small_decode]\n    tp: [1, abc]\n", "bad.yaml:4:",
       "bad value 'abc' for tp"},
      {"bad block size", "name: b\ngroups:\n  - specs: [small_decode]\n    block_size: [16, abc]\n", "bad.yaml:4:",
       "'abc' for block_size"},
      {"bad dtype", "name: b\ngroups:\n  - specs: [small_decode]\n    dtype: [fp8]\n", "bad.yaml:4:", "fp8"},
      {"bad dims", "name: b\ngroups:\n  - specs: [small_decode]\n    dims: [llama]\n", "bad.yaml:4:", "llama"},
      {"empty groups", "name: b\ngroups: []\n", "bad.yaml:2:", "groups"},
      {"group selects nothing", "name: b\ngroups:\n  - tp: [1]\n", "bad.yaml:3:", "selects no batch spec"},
      {"impossible case", "name: b\ngroups:\n  - specs: [small_decode]\n    tp: [1, 3]\n", "bad.yaml:3:",
       "not divisible by tp 3"},
      {"bad local spec", "name: b\nspecs:\n  x: {seq_lens: [4], query_lens: [1], colour: red}\ngroups:\n  - specs: [x]\n",
       "bad.yaml:3:", "unknown key 'colour'"},
      {"redefined spec", "name: b\nspecs:\n  small_decode: {seq_lens: [4], query_lens: [1]}\ngroups:\n  - specs: [x]\n",
       "bad.yaml:3:", "defined twice"},
      {"duplicate cases", "name: b\ngroups:\n  - specs: [small_decode]\n  - specs: [small_decode]\n", "bad.yaml", "duplicate"},
      {"unknown op", "name: b\ngroups:\n  - specs: [small_decode]\n    ops: [decode, attend]\n", "bad.yaml:4:",
       "attend"},
      {"repeat without times", "name: b\nspecs:\n  x: {seq_lens: {repeat: 4}, query_lens: [1]}\ngroups:\n  - specs: [x]\n",
       "bad.yaml:3:", "needs both keys"},
      {"no op", "name: b\ngroups:\n  - specs: [small_decode]\n    ops: []\n", "bad.yaml:4:", "at least one op"},
  };
  for (const Bad& b : bad) {
    const std::string msg = parse_error(b.text);
    EXPECT_TRUE(msg.starts_with(b.prefix)) << b.what << ": " << msg;
    EXPECT_NE(msg.find(b.reason), std::string::npos) << b.what << ": " << msg;
  }
  // Where a parser reports a syntax error depends on yaml-cpp; that it names a line does not.
  const std::string syntax = parse_error("name: b\ngroups:\n  - specs: [small_decode\n    tp: [1]\n");
  EXPECT_TRUE(std::regex_search(syntax, std::regex("^bad\\.yaml:[34]: YAML syntax error"))) << syntax;
  EXPECT_THROW(load_suite("no_such_suite"), InputError);
}

TEST(SuiteYaml, FileWithItsOwnSpecs) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("mlagate_test_suite_" + std::to_string(::getpid()) + ".yaml");
  {
    std::ofstream out(path);
    out << "name: mine\n"
           "specs:\n"
           "  tiny: {seq_lens: [5, 9], query_lens: [1, 3], note: local}\n"
           "  tiny_spec: {seq_lens: {repeat: 7, times: 3}, query_lens: {repeat: 2, times: 3}, spec_decode: true}\n"
           "groups:\n"
           "  - specs: [tiny, tiny_spec, small_decode]\n"
           "    tp: [16]\n"
           "    seed: [4]\n"
           "  - specs: [tiny]\n"
           "    tp: [2]\n"
           "    block_size: [32]\n";
  }
  const Suite s = load_suite(path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(s.name, "mine");
  EXPECT_EQ(s.source, path.string());
  ASSERT_EQ(s.cases.size(), 4u);
  EXPECT_EQ(s.cases[0].id(), "mine/tiny/tp16/bf16/kv=auto/bs=auto/seed=4");
  EXPECT_EQ(s.cases[0].batch.seq_lens, (std::vector<int>{5, 9}));
  EXPECT_EQ(s.cases[0].batch.query_lens, (std::vector<int>{1, 3}));
  EXPECT_EQ(s.cases[0].batch.note, "local");
  EXPECT_EQ(s.cases[1].batch.seq_lens, (std::vector<int>{7, 7, 7}));
  EXPECT_TRUE(s.cases[1].batch.spec_decode);
  EXPECT_EQ(s.cases[2].id(), "mine/small_decode/tp16/bf16/kv=auto/bs=auto/seed=4");
  EXPECT_EQ(s.cases[3].id(), "mine/tiny/tp2/bf16/kv=auto/bs=32/seed=0");
  // Local specs stay local to the file.
  EXPECT_THROW(find_batch_spec("tiny"), InputError);
}

// A group's `ops` is not an axis: its cases carry the ops (each once, in the
// order given) and take only those; a case of a group without it takes every
// op, and its id does not say which ops it takes.
TEST(SuiteYaml, AGroupNamesTheOpsItsCasesRunIn) {
  const Suite s = parse_suite_yaml(
      "name: ops\n"
      "groups:\n"
      "  - specs: [small_decode]\n"
      "    tp: [16, 8]\n"
      "    ops: [decode, layer, decode]\n"
      "  - specs: [mixed_small]\n"
      "    tp: [16]\n",
      "ops.yaml");
  ASSERT_EQ(s.cases.size(), 3u);
  for (int i : {0, 1}) {
    EXPECT_EQ(s.cases[i].ops, (std::vector<Op>{Op::kDecode, Op::kLayer}));
    EXPECT_TRUE(s.cases[i].takes(Op::kDecode));
    EXPECT_TRUE(s.cases[i].takes(Op::kLayer));
    EXPECT_FALSE(s.cases[i].takes(Op::kPrefill));
  }
  EXPECT_EQ(s.cases[0].id(), "ops/small_decode/tp16/bf16/kv=auto/bs=auto/seed=0");
  EXPECT_TRUE(s.cases[2].ops.empty());
  for (Op op : all_ops()) EXPECT_TRUE(s.cases[2].takes(op)) << op_name(op);
}

TEST(SuiteYaml, FileErrorsNameThePath) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("mlagate_test_bad_" + std::to_string(::getpid()) + ".yaml");
  {
    std::ofstream out(path);
    out << "name: b\ngroups:\n  - specs: [small_decode]\n    tp: [abc]\n";
  }
  std::string msg;
  try {
    load_suite(path.string());
  } catch (const InputError& e) {
    msg = e.what();
  }
  std::filesystem::remove(path);
  EXPECT_TRUE(msg.starts_with(path.string() + ":4:")) << msg;
}

TEST(Sweep, SpecsTimesTpTimesBlockSize) {
  Sweep sw;
  sw.specs = {"small_decode", "mixed_small"};
  sw.tps = {1, 8};
  sw.block_sizes = {16, 64};
  const std::vector<CaseSpec> cases = apply_sweep(sw, std::nullopt);
  ASSERT_EQ(cases.size(), 8u);
  std::vector<std::string> ids;
  for (const auto& c : cases) ids.push_back(c.id());
  EXPECT_EQ(ids, (std::vector<std::string>{
                     "sweep/small_decode/tp1/bf16/kv=auto/bs=16/seed=0",
                     "sweep/small_decode/tp1/bf16/kv=auto/bs=64/seed=0",
                     "sweep/small_decode/tp8/bf16/kv=auto/bs=16/seed=0",
                     "sweep/small_decode/tp8/bf16/kv=auto/bs=64/seed=0",
                     "sweep/mixed_small/tp1/bf16/kv=auto/bs=16/seed=0",
                     "sweep/mixed_small/tp1/bf16/kv=auto/bs=64/seed=0",
                     "sweep/mixed_small/tp8/bf16/kv=auto/bs=16/seed=0",
                     "sweep/mixed_small/tp8/bf16/kv=auto/bs=64/seed=0",
                 }));
  EXPECT_EQ(cases[4].batch.seq_lens, (std::vector<int>{32, 40, 48, 56}));
}

TEST(Sweep, AxesReplaceTheSuites) {
  const Suite smoke = load_suite("smoke");
  Sweep sw;
  sw.block_sizes = {16, 64};
  const std::vector<CaseSpec> cases = apply_sweep(sw, smoke);
  ASSERT_EQ(cases.size(), 2 * smoke.cases.size());
  expect_unique_ids(cases);
  std::set<std::string> ids;
  for (const auto& c : cases) {
    EXPECT_TRUE(c.block_size == 16 || c.block_size == 64) << c.id();
    EXPECT_EQ(c.suite, "smoke");
    ids.insert(c.id());
  }
  // Every suite case appears once per block size with everything else kept.
  for (CaseSpec c : smoke.cases)
    for (int bs : {16, 64}) {
      c.block_size = bs;
      EXPECT_TRUE(ids.count(c.id())) << c.id();
    }

  Sweep narrow;
  narrow.specs = {"mixed_small"};
  narrow.dtypes = {DType::kF16};
  narrow.seeds = {1, 2};
  const std::vector<CaseSpec> mixed = apply_sweep(narrow, smoke);
  ASSERT_FALSE(mixed.empty());
  for (const auto& c : mixed) {
    EXPECT_EQ(c.batch.name, "mixed_small");
    EXPECT_EQ(c.dtype, DType::kF16);
    EXPECT_TRUE(c.seed == 1 || c.seed == 2);
  }
  expect_unique_ids(mixed);
}

TEST(Sweep, Errors) {
  EXPECT_THROW(apply_sweep(Sweep{}, std::nullopt), InputError);  // neither suite nor spec
  Sweep unknown;
  unknown.specs = {"nope"};
  EXPECT_THROW(apply_sweep(unknown, std::nullopt), InputError);
  Sweep tp3;
  tp3.specs = {"small_decode"};
  tp3.tps = {3};
  EXPECT_THROW(apply_sweep(tp3, std::nullopt), InvalidCase);
  Sweep absent;
  absent.specs = {"large_decode"};
  EXPECT_THROW(apply_sweep(absent, load_suite("smoke")), InputError);
  EXPECT_TRUE(Sweep{}.empty());
  EXPECT_FALSE(tp3.empty());
}

}  // namespace
}  // namespace mlagate
