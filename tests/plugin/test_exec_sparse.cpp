// The exec backend's sparse ops (sparse_decode, sparse_prefill; SCHEMA.md):
// the bundle carries the V3.2 and V4 inputs, examples/exec_python/sparse.py
// passes the sparse and v4 suites' cases through it, each bug planted in that
// program (tests/plugin/planted_sparse_exec.py) is caught, and a dense answer
// to a sparse op is an INCORRECT record naming the output and the rule.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/exec/bundle.h"
#include "backends/exec/exec_backend.h"
#include "cases/suite.h"
#include "harness/run/runner.h"
#include "tests/cli_call.h"
#include "tests/plugin/exec_backends.h"

namespace mlagate {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const std::string kPython = MLAGATE_TEST_PYTHON;  // empty: no python3 with h5py and numpy
const std::string kSource = MLAGATE_TEST_SOURCE_DIR;
const std::string kExample = kSource + "/examples/exec_python/sparse.py";
const std::string kPlanted = kSource + "/tests/plugin/planted_sparse_exec.py";
const std::string kCaps = "ops=sparse_decode,sparse_prefill block_sizes=64,1,16 kv_dtypes=auto,fp8_ds_mla,fp8_v4";

#define SKIP_WITHOUT_PYTHON() \
  if (kPython.empty()) GTEST_SKIP() << "no python3 with h5py and numpy (scripts/bootstrap.sh installs them)"

std::vector<CaseSpec> cases_of(const std::string& suite, const std::string& id_part) {
  std::vector<CaseSpec> out;
  for (const CaseSpec& s : load_suite(suite).cases)
    if (contains(s.id(), id_part)) out.push_back(s);
  if (out.empty()) throw std::logic_error("no case of " + suite + " has " + id_part);
  return out;
}

// Both sparse ops of `cases` on `command`, in this process (records in case, op order).
std::vector<Record> run_sparse(const std::string& command, const std::vector<CaseSpec>& cases) {
  auto bs = test::exec_backends("exec.sparse", command, kCaps);
  RunConfig cfg;
  cfg.cases = cases;
  cfg.ops = {Op::kSparseDecode, Op::kSparsePrefill};
  cfg.policy = make_policy("baseline", 0, 0);
  return run_cases(cfg, bs);
}

std::string planted(const std::string& mode) { return kPython + " " + kPlanted + " " + mode + " {in} {out}"; }

const char* kV4Case = "v4/v4_mixed/tp16/bf16/kv=fp8_v4/bs=auto/seed=0/dims=v4/win=128/cmp=4x96/sink";

TEST(ExecSparse, CapsTakeTheSparseOpsAndFormats) {
  const Capabilities c = parse_exec_caps("ops=sparse_decode,sparse_prefill kv_dtypes=fp8_ds_mla,fp8_v4");
  EXPECT_EQ(c.ops, (std::vector<Op>{Op::kSparseDecode, Op::kSparsePrefill}));
  EXPECT_EQ(c.kv_dtypes, (std::vector<KvCacheDtype>{KvCacheDtype::kFp8DsMla, KvCacheDtype::kFp8V4}));
}

// Dense bundles keep version 1 (a version-1 program that checks it still
// runs); a bundle with a sparse call is version 2.
TEST(ExecSparse, SchemaVersionOfABundle) {
  std::vector<exec::BundleCall> calls(1);
  calls[0].problem.op = Op::kDecode;
  EXPECT_EQ(exec::bundle_schema_version(calls), 1);
  calls.push_back({});
  calls[1].problem.op = Op::kSparsePrefill;
  EXPECT_EQ(exec::bundle_schema_version(calls), 2);
}

// No Python needed: the bundle copied back as the outputs file has no o, and
// the INCORRECT record lists what the sparse call's group holds (the V3.2
// row inputs, the V4 window and compressed-cache inputs, the sinks).
TEST(ExecSparse, BundleCarriesTheSparseInputs) {
  const std::vector<Record> v32 = run_sparse("cp {in} {out}", cases_of("sparse", "topk=128/idx=lens/sink"));
  ASSERT_EQ(v32.size(), 4u);
  for (const Record& r : v32) {
    EXPECT_EQ(r.status, Status::kIncorrect) << r.message;
    EXPECT_TRUE(contains(r.message, "o is missing (the group holds ")) << r.message;
    for (const char* name : {"indices", "q", "sink", "topk_length"}) EXPECT_TRUE(contains(r.message, name)) << r.message;
  }
  EXPECT_TRUE(contains(v32[0].message, "block_table, indices, kv_cache, q, query_lens, query_start_loc, seq_lens, sink, topk_length"))
      << v32[0].message;
  EXPECT_TRUE(contains(v32[1].message, "indices, kv, q, query_lens, seq_lens, sink, topk_length")) << v32[1].message;
  const std::vector<Record> v4 = run_sparse("cp {in} {out}", cases_of("v4", kV4Case));
  ASSERT_EQ(v4.size(), 2u);
  EXPECT_TRUE(contains(v4[0].message,
                       "block_table, extra_block_table, extra_indices, extra_kv_cache, extra_topk_length, kv_cache, q, "
                       "query_lens, query_start_loc, seq_lens, sink"))
      << v4[0].message;
  EXPECT_TRUE(contains(v4[0].message, "o [T, N, Dv] = [26, 8, 512]")) << v4[0].message;
}

// The example passes a cheap cross-section of both suites (10 cases, 20
// records): V3.2 on fp8_ds_mla (raw) with sinks, duplicates, rows of -1 and
// topk_length, past-the-end indices (pow2), an auto cache of block size 16;
// V4 with fp8_v4 caches and C4A and C128A compressed caches, an auto one,
// block size 16 with large-magnitude Q. Through the CLI: exit 0. (The whole
// sparse and v4 suites pass too: 94 records, 30 to 80 s; the commands are in SCHEMA.md.)
TEST(ExecSparse, ExampleProgramPassesTheSparseSuites) {
  SKIP_WITHOUT_PYTHON();
  const std::string cmd = kPython + " " + kExample + " {in} {out}";
  for (const auto& [suite, filter] : std::vector<std::pair<std::string, std::string>>{
           {"sparse", "sparse_mixed/.*(kv=fp8_ds_mla:raw.*topk=128|idx=oob|bs=16)"},
           {"v4", "v4_mixed/.*(kv=fp8_v4/bs=auto/.*cmp=|kv=auto/.*cmp=128x64|bs=16)"}}) {
    const std::string json = (test::scratch_dir("mlagate_exec_sparse") / (suite + ".json")).string();
    EXPECT_EQ(test::cli({"run", "--suite", suite, "--filter", filter, "--exec", cmd, "--exec-name", "py.sparse", "--exec-caps",
                         kCaps, "--backend", "py.sparse", "--no-progress", "-q", "--json", json}),
              kExitPassed)
        << suite;
  }
}

// Each planted bug is caught through exec, and the CLI exits 1.
TEST(ExecSparse, PlantedBugsAreCaught) {
  SKIP_WITHOUT_PYTHON();
  struct Want {
    const char* mode;
    const char* suite;
    const char* id_part;
    Status decode, prefill;  // of every case selected
  };
  for (const Want& w : std::vector<Want>{
           {"ignore_topk_length", "sparse", "idx=lens", Status::kNonfinite, Status::kNonfinite},
           // Decode reads the null block; prefill gets no -1 of its own to misread here.
           {"minus_one_as_slot0", "sparse", "sparse_mixed/tp16/bf16/kv=auto/bs=auto/seed=0/topk=100", Status::kNonfinite,
            Status::kPassed},
           {"drop_sink", "v4", kV4Case, Status::kIncorrect, Status::kIncorrect},
           {"none", "v4", kV4Case, Status::kPassed, Status::kPassed},
       }) {
    const std::vector<Record> rs = run_sparse(planted(w.mode), cases_of(w.suite, w.id_part));
    ASSERT_FALSE(rs.empty());
    for (const Record& r : rs)
      EXPECT_EQ(r.status, r.op == "sparse_decode" ? w.decode : w.prefill)
          << w.mode << " " << r.op << " " << r.case_id << ": " << r.message;
  }
  EXPECT_EQ(test::cli({"run", "--suite", "sparse", "--filter", "idx=lens", "--exec", planted("ignore_topk_length"),
                       "--exec-name", "py.bug", "--exec-caps", kCaps, "--backend", "py.bug", "--no-progress", "-q"}),
            kExitFailed);
}

// A dense answer to a sparse op: INCORRECT naming the output and the rule, never a crash.
TEST(ExecSparse, DenseAnswersAreIncorrectNamingTheOutput) {
  SKIP_WITHOUT_PYTHON();
  struct Want {
    const char* mode;
    const char* message;
  };
  for (const Want& w : std::vector<Want>{
           {"dense_answer", "o is missing (the group holds lse, o_lat)"},
           {"latent_only", "o has shape [26, 8, 448], expected [26, 8, 512]"},
           {"no_lse", "lse is missing (the group holds o)"},
           {"int_o", "o is stored as int32, expected bfloat16"},
       }) {
    const std::vector<Record> rs = run_sparse(planted(w.mode), cases_of("v4", kV4Case));
    ASSERT_EQ(rs.size(), 2u);
    for (const Record& r : rs) {
      EXPECT_EQ(r.status, Status::kIncorrect) << w.mode << ": " << r.message;
      EXPECT_TRUE(contains(r.message, w.message)) << w.mode << ": " << r.message;
      EXPECT_TRUE(contains(r.message, "rule: " + r.op + " answers o [T, N, Dv] = [26, 8, 512]"))
          << w.mode << ": " << r.message;
    }
  }
}

}  // namespace
}  // namespace mlagate
