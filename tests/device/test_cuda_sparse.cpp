// GPU tests of cuda.sparse (DeepSeek V3.2 / V4 sparse attention): every case
// of the sparse and v4 suites passes both sparse ops against the reference (and
// the records really ran: PASSED with metrics, none skipped); results are
// bitwise identical across runs (no atomics); a bad index is refused on the
// host with std::out_of_range and the device stays usable afterwards. Without
// a GPU the records are SKIPPED.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backends.h"
#include "cases/case.h"
#include "cases/encoding.h"
#include "cases/paged_cache.h"
#include "cases/sparse.h"
#include "cases/suite.h"
#include "reference/compare.h"
#include "harness/run/runner.h"
#include "harness/run/serving.h"
#include "tests/require_gpu.h"

namespace mlagate {
namespace {

const std::vector<Op> kSparseOps = {Op::kSparseDecode, Op::kSparsePrefill};

// The CLI's default gate (mlagate run: --policy baseline, atol = rtol = 1e-2).
RunConfig sparse_config(const std::string& suite) {
  RunConfig cfg;
  cfg.cases = load_suite(suite).cases;
  cfg.ops = kSparseOps;
  cfg.policy = make_policy("baseline", 1e-2, 1e-2);
  return cfg;
}

std::vector<std::unique_ptr<Backend>> sparse_backend() {
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cuda_sparse());
  return bs;
}

class CudaSparseSuites : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaSparseSuites, EveryCasePassesBothOps) {
  MLAGATE_REQUIRE_GPU();
  auto backends = sparse_backend();
  const RunConfig cfg = sparse_config(GetParam());
  std::map<std::string, int> passed;
  const std::vector<Record> records = run_cases(cfg, backends);
  ASSERT_EQ(records.size(), cfg.cases.size() * kSparseOps.size());
  for (const Record& r : records) {
    EXPECT_EQ(r.status, Status::kPassed) << status_name(r.status) << " " << r.op << " " << r.case_id << ": " << r.message;
    if (r.status != Status::kPassed) continue;
    EXPECT_FALSE(r.metrics.empty()) << r.case_id;  // compared, not just run
    ++passed[r.op];
  }
  for (Op op : kSparseOps) {
    EXPECT_EQ(passed[std::string(op_name(op))], static_cast<int>(cfg.cases.size())) << op_name(op);
    std::printf("cuda.sparse %-6s %-16s %3d passed\n", GetParam(), std::string(op_name(op)).c_str(),
                passed[std::string(op_name(op))]);
  }
}

INSTANTIATE_TEST_SUITE_P(Suites, CudaSparseSuites, ::testing::Values("sparse", "v4"));

// --cuda-graph on the sparse decode op: cuda.sparse's kernel captured once
// per capture key over persistent device buffers, replayed for the sparse and
// v4 suites' uniform cases at seeds 0, 1 and 2 (the same shapes, other index
// rows and values: later seeds replay the graph an earlier one captured).
TEST(CudaSparse, CapturedSparseDecodeReplaysEveryCase) {
  MLAGATE_REQUIRE_GPU();
  RunConfig cfg;
  for (const char* suite : {"sparse", "v4"})
    for (const CaseSpec& c : load_suite(suite).cases)
      for (int seed : {0, 1, 2}) {
        CaseSpec x = c;
        x.seed = c.seed + static_cast<std::uint64_t>(seed);
        cfg.cases.push_back(x);
      }
  cfg.ops = {Op::kSparseDecode};
  const ServingMode mode = modes::CudaGraph{{8, 64, 512}, make_graph_store()};
  cfg.run_job = [&cfg, mode](CaseContext& ctx, Backend& b, Op op) { return run_serving(ctx, b, op, cfg, mode); };
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cuda_sparse());
  int passed = 0, replayed = 0;
  for (const Record& r : run_cases(cfg, bs)) {
    EXPECT_TRUE(r.status == Status::kPassed || r.status == Status::kNotSupported) << r.case_id << ": " << r.message;
    passed += r.status == Status::kPassed;
    replayed += r.message.find("replayed, captured at") != std::string::npos;
    if (r.status == Status::kPassed) {
      EXPECT_EQ(r.message.rfind("CUDA graph", 0), 0u) << r.message;
    }
  }
  std::printf("cuda.sparse graphs: %d records passed, %d replayed a graph captured earlier\n", passed, replayed);
  EXPECT_GT(passed, 30);
  EXPECT_GT(replayed, 10);
}

TEST(CudaSparse, WithoutADeviceRecordsAreSkipped) {
  if (cuda_device_info().available) GTEST_SKIP() << "a CUDA device is present";
  auto backends = sparse_backend();
  RunConfig cfg = sparse_config("v4");
  cfg.cases.resize(1);
  for (const Record& r : run_cases(cfg, backends)) EXPECT_EQ(r.status, Status::kSkipped) << r.message;
}

// One V3.2 decode case's arguments, built the way harness/run/sparse_op.cpp builds them.
struct DecodeFixture {
  Case c;
  PagedCache cache;
  Tensor q, slots, o, lse;
  std::vector<std::int32_t> rows;
  SparseDecodeArgs args() {
    SparseDecodeArgs a;
    a.q = q.view();
    a.cache = &cache;
    a.indices = slots.view();
    a.topk_length = c.sparse->main.length;
    a.seq_lens = c.seq_lens;
    a.query_start_loc = c.query_start_loc;
    a.block_table_rows = rows;
    a.sink = c.sparse->sink;
    a.scale = c.spec.softmax_scale();
    a.o = o.view();
    a.lse = lse.view();
    return a;
  }
};

DecodeFixture decode_fixture() {
  const std::vector<CaseSpec> cases = load_suite("sparse").cases;
  DecodeFixture f{generate_case(cases.front()), {}, {}, {}, {}, {}, {}};
  f.cache = build_paged_cache(f.c, 64);
  f.slots = global_slots(f.c, f.c.sparse->main, f.cache);
  const std::int64_t T = f.c.num_tokens, N = f.c.spec.num_heads();
  f.o = Tensor(f.c.spec.dtype, {T, N, f.c.spec.sparse_dv()});
  f.lse = Tensor(DType::kF32, {T, N});
  // Any query will do: a fixed pseudo-random one in [-1, 1).
  f.q = Tensor(f.c.spec.dtype, {T, N, f.c.spec.dims.head_size()});
  std::uint32_t x = 12345;
  for (std::int64_t i = 0; i < f.q.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    f.q.data<std::uint16_t>()[i] = f32_to_bf16(static_cast<float>(x >> 8) / 8388608.f - 1.f);
  }
  for (int i = 0; i < f.c.num_requests; ++i) f.rows.push_back(i);
  return f;
}

TEST(CudaSparse, ResultsAreBitwiseDeterministic) {
  MLAGATE_REQUIRE_GPU();
  DecodeFixture f = decode_fixture();
  auto b = make_cuda_sparse();
  b->sparse_decode(f.args());
  const Tensor o1 = f.o, lse1 = f.lse;
  for (int i = 0; i < 3; ++i) {
    std::memset(f.o.bytes(), 0xFF, f.o.nbytes());
    b->sparse_decode(f.args());
    ASSERT_EQ(std::memcmp(o1.bytes(), f.o.bytes(), f.o.nbytes()), 0) << "run " << i;
    ASSERT_EQ(std::memcmp(lse1.bytes(), f.lse.bytes(), f.lse.nbytes()), 0) << "run " << i;
  }
}

TEST(CudaSparse, ABadIndexFailsOnTheHostAndTheDeviceStaysUsable) {
  MLAGATE_REQUIRE_GPU();
  DecodeFixture f = decode_fixture();
  auto b = make_cuda_sparse();
  b->sparse_decode(f.args());
  const Tensor good = f.o;
  f.slots.data<std::int32_t>()[0] = f.cache.num_blocks * f.cache.block_size + 5;  // past the cache
  EXPECT_THROW(b->sparse_decode(f.args()), std::out_of_range);
  f.slots.data<std::int32_t>()[0] = -7;  // negative but not -1
  EXPECT_THROW(b->sparse_decode(f.args()), std::out_of_range);
  f.slots = global_slots(f.c, f.c.sparse->main, f.cache);
  b->sparse_decode(f.args());
  EXPECT_EQ(std::memcmp(good.bytes(), f.o.bytes(), f.o.nbytes()), 0);
}

}  // namespace
}  // namespace mlagate
