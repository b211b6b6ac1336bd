// Tests for cases/case_spec: the id string (the key of filters, reports and
// repro commands) is exact and covers every parameter, and validate() rejects
// every impossible problem with InvalidCase while accepting padding requests.
#include "cases/case_spec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "cases/errors.h"

namespace mlagate {
namespace {

CaseSpec with_batch(std::vector<int> seq_lens, std::vector<int> query_lens) {
  CaseSpec s;
  s.batch = BatchSpec{.name = "b", .seq_lens = std::move(seq_lens), .query_lens = std::move(query_lens), .note = {}};
  return s;
}

TEST(CaseSpec, DefaultId) {
  CaseSpec s = with_batch({32, 40}, {1, 1});
  s.batch.name = "small_decode";
  EXPECT_EQ(s.id(), "adhoc/small_decode/tp1/bf16/kv=auto/bs=auto/seed=0");
}

TEST(CaseSpec, IdWithOptionalParts) {
  CaseSpec s = with_batch({32, 40}, {1, 1});
  s.suite = "edges";
  s.batch.name = "mixed_small";
  s.tp = 16;
  s.dtype = DType::kF16;
  s.block_size = 64;
  s.seed = 3;
  s.dims = dims_preset("glm");
  s.q_magnitude = 8;
  s.scale = 0.1;
  EXPECT_EQ(s.id(), "edges/mixed_small/tp16/fp16/kv=auto/bs=64/seed=3/dims=glm/qmag=8/scale=0.1");
  s.dims = Dims{256, 32, 64, 96};
  s.total_heads = 64;
  s.q_magnitude = 1.0;
  s.scale.reset();
  s.k_scale = 2.5f;
  EXPECT_EQ(s.id(), "edges/mixed_small/tp16/fp16/kv=auto/bs=64/seed=3/dims=256.32.64.96/heads=64/kscale=2.5");
}

// Two cases that differ in any one parameter must not share an id, or reports
// and filters would merge them.
TEST(CaseSpec, IdDistinguishesEveryParameter) {
  const CaseSpec base = with_batch({32, 40}, {1, 1});
  const std::vector<std::function<void(CaseSpec&)>> changes = {
      [](CaseSpec& s) { s.suite = "other"; },
      [](CaseSpec& s) { s.batch.name = "other"; },
      [](CaseSpec& s) { s.tp = 2; },
      [](CaseSpec& s) { s.dtype = DType::kF16; },
      [](CaseSpec& s) { s.block_size = 16; },
      [](CaseSpec& s) { s.seed = 1; },
      [](CaseSpec& s) { s.dims = dims_preset("glm"); },
      [](CaseSpec& s) { s.dims.rope_dim = 32; },
      [](CaseSpec& s) { s.total_heads = 64; },
      [](CaseSpec& s) { s.q_magnitude = 1.5; },
      [](CaseSpec& s) { s.scale = 0.125; },
      [](CaseSpec& s) { s.k_scale = 0.5f; },
      [](CaseSpec& s) { s.kv_cache_dtype = KvCacheDtype::kFp8; },
      [](CaseSpec& s) { s.kv_cache_dtype = KvCacheDtype::kFp8E4m3; },
      [](CaseSpec& s) { s.kv_cache_dtype = KvCacheDtype::kFp8DsMla; },
      [](CaseSpec& s) { s.kv_cache_dtype = KvCacheDtype::kFp8DsMla, s.scale_rule = ScaleRule::kRaw; },
  };
  std::set<std::string> ids = {base.id()};
  for (const auto& change : changes) {
    CaseSpec s = base;
    change(s);
    EXPECT_TRUE(ids.insert(s.id()).second) << "id collision: " << s.id();
  }
  // Doubles print with 10 significant digits: close but different scales stay apart.
  CaseSpec a = base, b = base;
  a.scale = 0.1;
  b.scale = 0.1000000001;
  EXPECT_NE(a.id(), b.id());
}

TEST(CaseSpec, DerivedSizes) {
  CaseSpec s = with_batch({32, 0, 40}, {1, 1, 5});
  s.tp = 8;
  EXPECT_EQ(s.num_requests(), 3);
  EXPECT_EQ(s.num_tokens(), 7);
  EXPECT_EQ(s.num_kv_tokens(), 72);
  EXPECT_EQ(s.num_heads(), 16);
  EXPECT_EQ(s.softmax_scale(), 1.0 / 24);  // 1/sqrt(576), exact
  s.scale = 0.3;
  EXPECT_EQ(s.softmax_scale(), 0.3);
  EXPECT_EQ(dims_preset("deepseek"), (Dims{512, 64, 128, 128}));
  EXPECT_EQ(dims_preset("glm"), (Dims{512, 64, 192, 256}));
  EXPECT_EQ(dims_preset("glm").head_size(), 576);
  EXPECT_THROW(dims_preset("llama"), InputError);
}

TEST(CaseSpec, AcceptsValidAndPaddingRequests) {
  EXPECT_NO_THROW(with_batch({32, 40}, {1, 1}).validate());
  EXPECT_NO_THROW(with_batch({0}, {1}).validate());             // CUDA-graph padding alone
  EXPECT_NO_THROW(with_batch({32, 0, 40, 0}, {1, 1, 1, 1}).validate());
  EXPECT_NO_THROW(with_batch({16}, {16}).validate());           // no context
  EXPECT_NO_THROW(with_batch({1}, {1}).validate());
  CaseSpec s = with_batch({32}, {1});
  s.block_size = 1;
  EXPECT_NO_THROW(s.validate());
  s.block_size = 1024;
  EXPECT_NO_THROW(s.validate());
  s.tp = 128;
  EXPECT_NO_THROW(s.validate());
  s.dtype = DType::kF16;
  EXPECT_NO_THROW(s.validate());
}

struct Rejected {
  const char* what;
  std::function<void(CaseSpec&)> change;
  const char* reason;  // a substring the message must contain
};

TEST(CaseSpec, RejectsImpossibleProblems) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<Rejected> rejected = {
      {"query_len > seq_len", [](CaseSpec& s) { s.batch.query_lens = {1, 41}; }, "> seq_len"},
      {"negative seq_len", [](CaseSpec& s) { s.batch.seq_lens = {32, -1}; }, "negative seq_len"},
      {"query_len 0", [](CaseSpec& s) { s.batch.query_lens = {1, 0}; }, "query_len 0"},
      {"query_len 0 on padding", [](CaseSpec& s) { s.batch.seq_lens = {32, 0}, s.batch.query_lens = {1, 0}; }, "< 1"},
      {"list lengths", [](CaseSpec& s) { s.batch.query_lens = {1}; }, "entries"},
      {"no requests", [](CaseSpec& s) { s.batch.seq_lens = {}, s.batch.query_lens = {}; }, "no requests"},
      {"no name", [](CaseSpec& s) { s.batch.name = ""; }, "no name"},
      {"tp 3", [](CaseSpec& s) { s.tp = 3; }, "not divisible"},
      {"tp 0", [](CaseSpec& s) { s.tp = 0; }, "positive"},
      {"tp 256 > heads", [](CaseSpec& s) { s.tp = 256; }, "not divisible"},
      {"heads 0", [](CaseSpec& s) { s.total_heads = 0; }, "positive"},
      {"block size 24", [](CaseSpec& s) { s.block_size = 24; }, "power of two"},
      {"block size -16", [](CaseSpec& s) { s.block_size = -16; }, "power of two"},
      {"block size 2048", [](CaseSpec& s) { s.block_size = 2048; }, "power of two"},
      {"scale inf", [inf](CaseSpec& s) { s.scale = inf; }, "scale"},
      {"scale nan", [nan](CaseSpec& s) { s.scale = nan; }, "scale"},
      {"scale 0", [](CaseSpec& s) { s.scale = 0.0; }, "scale"},
      {"scale < 0", [](CaseSpec& s) { s.scale = -0.1; }, "scale"},
      {"q magnitude nan", [nan](CaseSpec& s) { s.q_magnitude = nan; }, "magnitude"},
      {"q magnitude inf", [inf](CaseSpec& s) { s.q_magnitude = inf; }, "magnitude"},
      {"k_scale 0", [](CaseSpec& s) { s.k_scale = 0.0f; }, "k_scale"},
      {"dtype f32", [](CaseSpec& s) { s.dtype = DType::kF32; }, "bf16 or fp16"},
      {"L 0", [](CaseSpec& s) { s.dims.kv_lora_rank = 0; }, "dims"},
      {"L huge", [](CaseSpec& s) { s.dims.kv_lora_rank = 1 << 20; }, "dims"},
      {"R negative", [](CaseSpec& s) { s.dims.rope_dim = -1; }, "dims"},
      {"V huge", [](CaseSpec& s) { s.dims.v_head_dim = 100000; }, "dims"},
      {"too many kv tokens", [](CaseSpec& s) { s.batch.seq_lens = {100'000'000, 40}; }, "too large"},
  };
  for (const Rejected& r : rejected) {
    CaseSpec s = with_batch({32, 40}, {1, 1});
    ASSERT_NO_THROW(s.validate());
    r.change(s);
    try {
      s.validate();
      ADD_FAILURE() << r.what << ": accepted";
    } catch (const InvalidCase& e) {
      EXPECT_NE(std::string(e.what()).find(r.reason), std::string::npos) << r.what << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace mlagate
