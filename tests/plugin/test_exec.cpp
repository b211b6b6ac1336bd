// The exec backend: a program that fails in any way (exit status, signal,
// hang, no outputs, garbage, wrong shapes or dtypes) is a record with its
// status and the program's last words, never the end of the run; the bundle
// carries what the Python example needs to pass.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "backends/exec/exec_backend.h"
#include "cases/errors.h"
#include "cases/suite.h"
#include "harness/run/runner.h"
#include "tests/plugin/exec_backends.h"

namespace mlagate {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const std::string kPython = MLAGATE_TEST_PYTHON;  // empty: no python3 with h5py and numpy
const std::string kHostile = std::string(MLAGATE_TEST_SOURCE_DIR) + "/tests/plugin/hostile_exec.py";

Record run_exec(const std::string& command, double timeout_s = 60, Op op = Op::kDecode,
                const std::string& caps = "ops=decode,prefill,cache_write") {
  auto bs = test::exec_backends("exec.test", command, caps, timeout_s);
  RunConfig cfg;
  for (const CaseSpec& s : load_suite("smoke").cases)
    if (s.batch.name == "small_decode") cfg.cases.push_back(s);
  cfg.ops = {op};
  cfg.policy = make_policy("fixed", 5e-2, 1e-2);
  const std::vector<Record> r = run_cases(cfg, bs);
  if (r.size() != 1) throw std::logic_error("expected one record");
  return r.front();
}

// Strided views (strided_views=1): the example program reads q_lat / q_pe
// through their spans and strides and writes o_lat / lse in place into their
// spans, and every strided decode case of the layout suite passes; the same
// values with one byte past a head row's end changed fail as a write past the
// view (the padding comes back with the span and is checked). Without the
// declaration the program is never handed a strided case.
TEST(ExecLayouts, StridedViewsReachTheProgramAsSpans) {
  if (kPython.empty()) GTEST_SKIP() << "no python3 with h5py and numpy";
  const std::string example = std::string(MLAGATE_TEST_SOURCE_DIR) + "/examples/exec_python/decode.py";
  const auto run = [](const std::string& command, const std::string& caps) {
    auto bs = test::exec_backends("exec.strided", command, caps);
    RunConfig cfg;
    for (const CaseSpec& s : load_suite("layout").cases)
      if (s.layout.strided && s.layout.pool == PoolSize::kFitted && !s.sparse.active()) cfg.cases.push_back(s);
    cfg.ops = {Op::kDecode};
    return run_cases(cfg, bs);
  };
  const std::string caps = "ops=decode block_sizes=16,1,64 query_len=VARLEN reorder_threshold=1000000 kv_dtypes=auto,fp8,fp8_e4m3";
  int passed = 0;
  for (const Record& r : run(kPython + " " + example + " {in} {out}", caps + " strided_views=1")) {
    if (r.status == Status::kNotSupported) continue;
    EXPECT_EQ(r.status, Status::kPassed) << r.case_id << ": " << r.message;
    passed += r.status == Status::kPassed;
  }
  EXPECT_GE(passed, 4);
  int caught = 0;
  for (const Record& r : run(kPython + " " + kHostile + " strided_pad {in} {out}", caps + " strided_views=1")) {
    if (r.status == Status::kNotSupported) continue;
    EXPECT_NE(r.status, Status::kPassed) << r.case_id;
    EXPECT_NE(r.message.find("o_lat: a write past the view into its larger buffer"), std::string::npos) << r.message;
    ++caught;
  }
  EXPECT_EQ(caught, passed);
  for (const Record& r : run(kPython + " " + example + " {in} {out}", caps))
    EXPECT_EQ(r.status, Status::kNotSupported) << r.case_id;
}

TEST(ExecConfig, CommandMustNameBothFilesAndCapsParse) {
  ExecConfig c;
  c.command = "prog {in}";
  EXPECT_THROW(exec_backend_entry(c), InputError);
  c.command = "prog {in} {out}";
  c.name = "bad name";
  EXPECT_THROW(exec_backend_entry(c), InputError);
  const Capabilities caps = parse_exec_caps("ops=decode,prefill block_sizes=64,16 query_len=uniform reorder_threshold=4 "
                                            "dtypes=bf16 kv_dtypes=auto,fp8");
  EXPECT_EQ(caps.ops, (std::vector<Op>{Op::kDecode, Op::kPrefill}));
  EXPECT_EQ(caps.block_sizes, (std::vector<int>{64, 16}));
  EXPECT_EQ(caps.query_len_support, QueryLenSupport::kUniform);
  EXPECT_EQ(caps.reorder_threshold, 4);
  EXPECT_EQ(caps.dtypes, std::vector<DType>{DType::kBF16});
  EXPECT_EQ(caps.kv_dtypes, (std::vector<KvCacheDtype>{KvCacheDtype::kAuto, KvCacheDtype::kFp8}));
  const Capabilities layouts = parse_exec_caps("strided_views=1 max_pool_bytes=1099511627776");
  EXPECT_TRUE(layouts.strided_views);
  EXPECT_EQ(layouts.max_pool_bytes, std::int64_t{1} << 40);
  EXPECT_FALSE(parse_exec_caps("ops=decode").strided_views);
  EXPECT_EQ(parse_exec_caps("max_pool_bytes=0").max_pool_bytes, std::int64_t{1} << 31);
  EXPECT_THROW(parse_exec_caps("strided_views=2"), InputError);
  EXPECT_THROW(parse_exec_caps("max_pool_bytes=-1"), InputError);
  EXPECT_THROW(parse_exec_caps("opps=decode"), InputError);
  EXPECT_THROW(parse_exec_caps("ops=layer"), InputError);
  EXPECT_THROW(parse_exec_caps("block_sizes=x"), InputError);
}

TEST(ExecFailures, NonZeroExitIsCrashedWithStderr) {
  const Record r = run_exec("echo 'kernel exploded' >&2; exit 3 # {in} {out}");
  EXPECT_EQ(r.status, Status::kCrashed);
  EXPECT_TRUE(contains(r.message, "exited with status 3")) << r.message;
  EXPECT_TRUE(contains(r.message, "stderr: kernel exploded")) << r.message;
}

TEST(ExecFailures, SignalIsCrashed) {
  const Record r = run_exec("kill -SEGV $$ # {in} {out}");
  EXPECT_EQ(r.status, Status::kCrashed);
  EXPECT_TRUE(contains(r.message, "killed by signal 11")) << r.message;
}

TEST(ExecFailures, HangIsTimeoutAndKilled) {
  const auto t0 = std::chrono::steady_clock::now();
  const Record r = run_exec("echo waiting >&2; sleep 30 # {in} {out}", 0.5);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, Status::kTimeout);
  EXPECT_TRUE(contains(r.message, "ran past --exec-timeout 0.5 s")) << r.message;
  EXPECT_TRUE(contains(r.message, "stderr: waiting")) << r.message;
  EXPECT_LT(s, 20);  // the sleeping child was killed with its group
}

TEST(ExecFailures, NoOutputsOrGarbageIsCrashed) {
  Record r = run_exec("true {in} {out}");
  EXPECT_EQ(r.status, Status::kCrashed);
  EXPECT_TRUE(contains(r.message, "wrote no outputs file")) << r.message;
  r = run_exec("echo garbage > {out} # {in}");
  EXPECT_EQ(r.status, Status::kCrashed);
  EXPECT_TRUE(contains(r.message, "unusable outputs file")) << r.message;
  // The bundle itself as outputs: valid HDF5, but no o_lat.
  r = run_exec("cp {in} {out}");
  EXPECT_EQ(r.status, Status::kCrashed);
  EXPECT_TRUE(contains(r.message, "o_lat: missing dataset")) << r.message;
}

// Outputs written by h5py: each hostile mode of hostile_exec.py and what it must give.
TEST(ExecFailures, HostileOutputsFromPython) {
  if (kPython.empty()) GTEST_SKIP() << "no python3 with h5py and numpy (scripts/bootstrap.sh installs them)";
  struct Want {
    const char* mode;
    Status status;
    const char* message;
  };
  for (const Want& w : std::vector<Want>{
           {"shape", Status::kIncorrect, "o_lat has shape [2, 8, 511], expected [2, 8, 512]"},
           {"dtype", Status::kIncorrect, "o_lat is stored as int32, expected bfloat16"},
           {"bits_without_dtype", Status::kIncorrect, "dtype attribute '', expected 'bfloat16'"},
           {"nan", Status::kNonfinite, "NaN"},
           {"not_supported", Status::kNotSupported, "exec.test decode: hostile: not today"},
           {"error", Status::kCrashed, "reported an error: hostile: it broke"},
           {"zeros", Status::kIncorrect, ""},
       }) {
    const Record r = run_exec(kPython + " " + kHostile + " " + w.mode + " {in} {out}");
    EXPECT_EQ(r.status, w.status) << w.mode << ": " << r.message;
    EXPECT_TRUE(contains(r.message, w.message)) << w.mode << ": " << r.message;
  }
}

TEST(ExecBundle, PythonExampleReadsTheBundleAndPasses) {
  if (kPython.empty()) GTEST_SKIP() << "no python3 with h5py and numpy (scripts/bootstrap.sh installs them)";
  const std::string cmd = kPython + " " + MLAGATE_TEST_SOURCE_DIR + "/examples/exec_python/decode.py {in} {out}";
  const Record r = run_exec(cmd, 120, Op::kLayer, "ops=decode block_sizes=16,32 query_len=VARLEN reorder_threshold=1000000");
  EXPECT_EQ(r.status, Status::kPassed) << r.message;
}

}  // namespace
}  // namespace mlagate
