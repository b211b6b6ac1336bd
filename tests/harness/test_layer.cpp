// Layer routing (decode vs prefill, as vLLM's QueryLenSupport rules) and the
// runner's handling of misbehaving backends: out-of-bounds writes, exceptions,
// missing kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "backends/cpu/cpu_backends.h"
#include "cases/errors.h"
#include "cases/suite.h"
#include "harness/run/ops/layer/layer.h"
#include "reference/kv_projection.h"
#include "harness/run/runner.h"

namespace mlagate {
namespace {

CaseSpec spec_of(const std::string& batch, int tp = 16) {
  CaseSpec s;
  s.batch = find_batch_spec(batch);
  s.tp = tp;
  return s;
}

Capabilities caps(QueryLenSupport q, int threshold, bool prefill = true) {
  Capabilities c;
  c.ops = {Op::kDecode};
  if (prefill) c.ops.push_back(Op::kPrefill);
  c.block_sizes = {16};
  c.query_len_support = q;
  c.reorder_threshold = threshold;
  c.dtypes = {DType::kBF16};
  c.kv_dtypes = {KvCacheDtype::kAuto};
  return c;
}

TEST(Routing, MixedBatchSplitsByThreshold) {
  const Routing r = route_requests(caps(QueryLenSupport::kSingleOnly, 1), spec_of("mixed_small"));
  ASSERT_TRUE(r.support.ok);
  EXPECT_EQ(r.is_decode, (std::vector<bool>{true, true, false, false}));
}

TEST(Routing, UniformDecodesShareTheFirstQueryLength) {
  // q = 3, 1, 4, 2 with threshold 4: UNIFORM keeps only q == 3 as decodes.
  CaseSpec s = spec_of("edge_spec_nonuniform");
  s.batch.spec_decode = false;
  const Routing r = route_requests(caps(QueryLenSupport::kUniform, 4), s);
  EXPECT_EQ(r.is_decode, (std::vector<bool>{true, false, false, false}));
  const Routing v = route_requests(caps(QueryLenSupport::kVarlen, 4), s);
  EXPECT_EQ(v.is_decode, (std::vector<bool>{true, true, true, true}));
}

TEST(Routing, SpecDecodeRaisesThresholdAndRejectsSingleOnly) {
  const Routing r = route_requests(caps(QueryLenSupport::kUniform, 1), spec_of("spec_decode_small"));
  EXPECT_EQ(r.is_decode, (std::vector<bool>{true, true, true, true}));
  const Routing s = route_requests(caps(QueryLenSupport::kSingleOnly, 1), spec_of("spec_decode_small"));
  EXPECT_FALSE(s.support.ok);
  EXPECT_NE(s.support.reason.find("SINGLE_ONLY"), std::string::npos);
}

TEST(Routing, PrefillWithoutPrefillKernelIsNotSupported) {
  const Routing r = route_requests(caps(QueryLenSupport::kVarlen, 1, false), spec_of("small_prefill"));
  EXPECT_FALSE(r.support.ok);
  EXPECT_NE(r.support.reason.find("no prefill kernel"), std::string::npos);
}

// Wraps cpu.paged and breaks it in one controlled way.
class Misbehaving : public Backend {
 public:
  enum class Mode { kOutOfBounds, kThrow, kStaleRow, kScribbleInputs, kScribbleThenThrow };
  explicit Misbehaving(Mode m) : mode_(m), inner_(make_cpu_paged()) {}
  std::string_view name() const override { return "test.misbehaving"; }
  std::string_view description() const override { return "test backend"; }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  void decode(const DecodeArgs& a) override {
    if (mode_ == Mode::kThrow) throw std::runtime_error("kernel launch failed: invalid argument");
    inner_->decode(a);
    if (mode_ == Mode::kOutOfBounds) static_cast<std::uint16_t*>(a.o_lat.data)[a.o_lat.numel()] = 0x3F80;
    // Forget the last token's output: it keeps the poison a fresh buffer holds.
    if (mode_ == Mode::kStaleRow) {
      const std::int64_t row = a.o_lat.numel() / a.o_lat.shape[0];
      poison_row(a.o_lat, a.o_lat.shape[0] - 1, row);
    }
  }
  void prefill(const PrefillArgs& a) override {
    inner_->prefill(a);
    // Its own output is right; the K and V it was given are not left as they were.
    if (mode_ == Mode::kScribbleInputs || mode_ == Mode::kScribbleThenThrow) {
      poison_row(a.k, 0, a.k.numel());
      poison_row(a.v, 0, a.v.numel());
    }
    if (mode_ == Mode::kScribbleThenThrow) throw std::runtime_error("kernel failed after writing its inputs");
  }

 private:
  static void poison_row(const TensorView& v, std::int64_t r, std::int64_t row) {
    for (std::int64_t i = 0; i < row; ++i) static_cast<std::uint16_t*>(v.data)[r * row + i] = 0x7FC0;
  }
  Mode mode_;
  std::unique_ptr<Backend> inner_;
};

std::vector<Record> run_with(std::unique_ptr<Backend> b, const std::string& batch) {
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(std::move(b));
  RunConfig cfg;
  cfg.cases = {spec_of(batch)};
  return run_cases(cfg, bs);
}

TEST(Runner, OutOfBoundsWriteIsIncorrect) {
  const auto recs = run_with(std::make_unique<Misbehaving>(Misbehaving::Mode::kOutOfBounds), "small_decode");
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].status, Status::kIncorrect);
  EXPECT_NE(recs[0].message.find("out-of-bounds write"), std::string::npos) << recs[0].message;
}

TEST(Runner, ThrowingBackendIsCrashedWithItsMessage) {
  const auto recs = run_with(std::make_unique<Misbehaving>(Misbehaving::Mode::kThrow), "small_decode");
  EXPECT_EQ(recs[0].status, Status::kCrashed);
  EXPECT_NE(recs[0].message.find("kernel launch failed"), std::string::npos);
}

TEST(Runner, UnwrittenOutputShowsAsNonfinite) {
  const auto recs = run_with(std::make_unique<Misbehaving>(Misbehaving::Mode::kStaleRow), "small_decode");
  EXPECT_EQ(recs[0].status, Status::kNonfinite);
  EXPECT_NE(recs[0].message.find("request 1"), std::string::npos) << recs[0].message;
}

TEST(Runner, RecordsThePathOfEachRequest) {
  const auto recs = run_with(make_cpu_paged(), "mixed_small");
  ASSERT_EQ(recs[0].status, Status::kPassed) << recs[0].message;
  EXPECT_EQ(recs[0].paths, (std::vector<std::string>{"decode", "decode", "prefill", "prefill"}));
  EXPECT_EQ(recs[0].block_size, 16);
}

TEST(Runner, ChunkedPrefillMatchesUnchunked) {
  // Chunks of 7 context tokens force several LSE merges; the result must stay
  // within bf16 noise of the reference.
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cpu_paged());
  RunConfig cfg;
  cfg.cases = {spec_of("small_prefill")};
  cfg.policy = make_policy("fixed", 2e-2, 2e-2);
  cfg.exec.prefill_chunk = 7;
  const auto recs = run_cases(cfg, bs);
  EXPECT_EQ(recs[0].status, Status::kPassed) << recs[0].message;
}

// The layer op and the kernel-level prefill op lend every backend of a case
// the same up-projected K and V (no copy), and the baseline emulation reads
// the same rows (KvProjection); a backend that writes into them must change
// neither the next backend's result nor any err_baseline: the runner notices
// (fingerprints) and projects them afresh.
// small_prefill through `op` on cpu.paged alone, and on cpu.paged after a
// Misbehaving backend in `mode`: the records of both runs.
std::pair<std::vector<Record>, std::vector<Record>> alone_and_after(Op op, Misbehaving::Mode mode) {
  RunConfig cfg;
  cfg.cases = {spec_of("small_prefill")};
  cfg.ops = {op};
  cfg.policy = make_policy("baseline", 0, 0);  // err_baseline in every record
  cfg.exec.prefill_chunk = 16;  // the context in several chunks: several lent K/V pairs
  std::vector<std::unique_ptr<Backend>> alone, after;
  alone.push_back(make_cpu_paged());
  after.push_back(std::make_unique<Misbehaving>(mode));
  after.push_back(make_cpu_paged());
  return {run_cases(cfg, alone), run_cases(cfg, after)};
}

TEST(Runner, ABackendWritingIntoItsInputsDoesNotReachTheNextBackend) {
  for (Op op : {Op::kLayer, Op::kPrefill}) {
    SCOPED_TRACE(std::string(op_name(op)));
    const auto [a, b] = alone_and_after(op, Misbehaving::Mode::kScribbleInputs);
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(b.size(), 2u);
    EXPECT_EQ(b[0].status, Status::kPassed) << b[0].message;  // wrote its inputs after using them
    ASSERT_EQ(b[1].backend, "cpu.paged");
    EXPECT_EQ(b[1].status, Status::kPassed) << b[1].message;
    ASSERT_EQ(a[0].metrics.size(), b[1].metrics.size());
    for (std::size_t k = 0; k < a[0].metrics.size(); ++k) {
      EXPECT_EQ(a[0].metrics[k].max_abs, b[1].metrics[k].max_abs) << a[0].metrics[k].output;
      EXPECT_EQ(a[0].metrics[k].nmse, b[1].metrics[k].nmse) << a[0].metrics[k].output;
      EXPECT_EQ(a[0].metrics[k].err_token_head, b[1].metrics[k].err_token_head) << a[0].metrics[k].output;
      // The scribbler's own err_baseline too: computed after its call, from
      // rows it may have written into unless they were withdrawn.
      EXPECT_TRUE(std::isfinite(a[0].metrics[k].err_baseline)) << a[0].metrics[k].output;
      EXPECT_EQ(a[0].metrics[k].err_baseline, b[0].metrics[k].err_baseline) << a[0].metrics[k].output;
      EXPECT_EQ(a[0].metrics[k].err_baseline, b[1].metrics[k].err_baseline) << a[0].metrics[k].output;
    }
  }
}

// The same when the backend throws after writing into what it was lent: its
// record is CRASHED and the check still runs, so the next backend is untouched.
TEST(Runner, ABackendThatWritesIntoItsInputsAndThrowsDoesNotReachTheNextBackend) {
  for (Op op : {Op::kLayer, Op::kPrefill}) {
    SCOPED_TRACE(std::string(op_name(op)));
    const auto [a, b] = alone_and_after(op, Misbehaving::Mode::kScribbleThenThrow);
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(b.size(), 2u);
    EXPECT_EQ(b[0].status, Status::kCrashed) << b[0].message;
    EXPECT_EQ(b[1].status, Status::kPassed) << b[1].message;
    ASSERT_EQ(a[0].metrics.size(), b[1].metrics.size());
    for (std::size_t k = 0; k < a[0].metrics.size(); ++k) {
      EXPECT_EQ(a[0].metrics[k].max_abs, b[1].metrics[k].max_abs) << a[0].metrics[k].output;
      EXPECT_EQ(a[0].metrics[k].err_baseline, b[1].metrics[k].err_baseline) << a[0].metrics[k].output;
    }
  }
}

// A cache writer that damages the block table: the context gather (spread
// over the threads for long contexts) meets slots outside the cache. The
// record says so; the process is not ended by an exception leaving the
// parallel region.
class TableWrecker : public Backend {
 public:
  TableWrecker() : inner_(make_cpu_paged()) {}
  std::string_view name() const override { return "test.table_wrecker"; }
  std::string_view description() const override { return "test backend"; }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  void decode(const DecodeArgs& a) override { inner_->decode(a); }
  void prefill(const PrefillArgs& a) override { inner_->prefill(a); }
  void cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                   std::span<const std::int64_t> slots) override {
    inner_->cache_write(cache, kv_c, k_pe, slots);
    std::fill_n(cache.block_table.data<std::int32_t>(), cache.block_table.numel(), 0x7FFFFFF);
  }

 private:
  std::unique_ptr<Backend> inner_;
};

TEST(Runner, ADamagedBlockTableInTheContextGatherIsARecordNotAnExit) {
  for (KvCacheDtype kv : {KvCacheDtype::kAuto, KvCacheDtype::kFp8}) {
    SCOPED_TRACE(std::string(kv_cache_dtype_name(kv)));
    RunConfig cfg;
    CaseSpec s = spec_of("medium_prefill");  // contexts of 240 to 2032 tokens: the parallel gather
    s.kv_cache_dtype = kv;
    cfg.cases = {s};
    std::vector<std::unique_ptr<Backend>> bs;
    bs.push_back(std::make_unique<TableWrecker>());
    const auto recs = run_cases(cfg, bs);
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].status, Status::kCrashed) << recs[0].message;
    EXPECT_NE(recs[0].message.find("slot"), std::string::npos) << recs[0].message;
  }
}

TEST(Runner, KernelLevelOpsPass) {
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cpu_paged());
  bs.push_back(make_cpu_splitkv());
  RunConfig cfg;
  cfg.cases = {spec_of("spec_decode_small"), spec_of("edge_padding")};
  cfg.ops = {Op::kDecode, Op::kPrefill};
  cfg.policy = make_policy("fixed", 2e-2, 2e-2);
  for (const Record& r : run_cases(cfg, bs)) {
    SCOPED_TRACE(r.case_id + " " + r.backend + " " + r.op);
    if (r.backend == "cpu.splitkv" && r.op == "prefill") {
      EXPECT_EQ(r.status, Status::kNotSupported);
    } else {
      EXPECT_EQ(r.status, Status::kPassed) << r.message;
    }
  }
}

}  // namespace
}  // namespace mlagate
