// vLLM's index conversions for its Hopper sparse backends (backends/
// sparse_convert.h), checked on rows worked out by hand from vLLM's code
// (sparse_utils.py's valid counts, flashinfer_mla_sparse_sm90.py's
// _kv_lens_host, plan() and _pack_topk_indices), and the claim the adapters
// rest on: the rows the harness draws hold, per token, exactly the valid
// slots vLLM's SM90 plan counts from positions (min(position + 1, top-k)),
// except the invalid_rows pattern's empty rows, which no position formula
// predicts (reference/SPARSE.md, "Row order").
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "backends/sparse_convert.h"
#include "cases/case.h"
#include "cases/sparse.h"
#include "cases/suite.h"

namespace mlagate {
namespace {

using V = std::vector<std::int32_t>;

TEST(SparseConvert, ValidCountsCountTheSlotsAtOrAboveZeroWhereverTheyAre) {
  const V rows = {5, -1, 7, -1,  //
                  -1, -1, -1, -1,  //
                  1, 2, 3, 4,  //
                  -1, 0, -1, 9};
  EXPECT_EQ(vllm_valid_counts(rows, 4, 4), (V{2, 0, 4, 2}));
  EXPECT_THROW(vllm_valid_counts(rows, 3, 4), std::invalid_argument);
}

TEST(SparseConvert, PositionsFollowTheBottomRightRule) {
  // Request 0: 5 keys, 2 query tokens (positions 3, 4); request 1: 3 keys, 3 tokens (0, 1, 2).
  EXPECT_EQ(token_positions(V{5, 3}, V{0, 2, 5}), (V{3, 4, 0, 1, 2}));
  EXPECT_THROW(token_positions(V{5, 3}, V{0, 2}), std::invalid_argument);
}

TEST(SparseConvert, Sm90LengthsComeFromPositionsNotFromTheRows) {
  // ctx = p + 1; ctx <= topk: ctx; else topk + ctx % kpool.
  EXPECT_EQ(vllm_sm90_kv_lens(V{0, 4, 2046, 2047, 2048, 5000}, 2048), (V{1, 5, 2047, 2048, 2048, 2048}));
  EXPECT_EQ(vllm_sm90_kv_lens(V{2047, 2048, 2050}, 2048, 4), (V{2048, 2049, 2051 % 4 + 2048}));
  EXPECT_EQ(vllm_sm90_kv_lens(V{3}, 2048, 0), (V{4}));  // kpool = max(tokens_per_state, 1)
  // Padding tokens of a graph's padded batch: a seq_len 0 request of 3 query tokens sits at -3..-1.
  EXPECT_EQ(vllm_sm90_kv_lens(token_positions(V{0}, V{0, 3}), 128), (V{0, 0, 0}));
}

TEST(SparseConvert, Sm90PacksAPackedCsrWithNegativesClampedToSlotZero) {
  const V rows = {3, -1, 9,  //
                  -1, 4, 8,  //
                  7, 7, -1};
  const PackedRows p = vllm_sm90_pack(rows, 3, 3, V{2, 3, 0});
  EXPECT_EQ(p.indptr, (V{0, 2, 5, 5}));
  EXPECT_EQ(p.indices, (V{3, 0, 0, 4, 8}));
  EXPECT_THROW(vllm_sm90_pack(rows, 3, 3, V{4, 0, 0}), std::invalid_argument);  // past the row: the next row's slots
  EXPECT_THROW(vllm_sm90_pack(rows, 3, 3, V{1, 1}), std::invalid_argument);
}

TEST(SparseConvert, ValidFirstRowsIsAStablePartition) {
  V rows = {-1, 5, -1, 7,  //
            2, -1, 2, -1,  //
            -1, -1, -1, -1};
  valid_first_rows(rows, 3, 4);
  EXPECT_EQ(rows, (V{5, 7, -1, -1, 2, 2, -1, -1, -1, -1, -1, -1}));
  // After it, vLLM's valid count is a prefix length: every slot before it is valid.
  const V n = vllm_valid_counts(rows, 3, 4);
  for (int t = 0; t < 3; ++t)
    for (int k = 0; k < 4; ++k) EXPECT_EQ(rows[static_cast<std::size_t>(t * 4 + k)] >= 0, k < n[static_cast<std::size_t>(t)]);
}

// Every top-k case of the sparse and nope suites without topk_length: each
// token's row holds min(position + 1, topk) valid slots, what the SM90 plan
// gives the kernel as its length, except the empty rows of invalid_rows.
TEST(SparseConvert, TheSuitesRowsHoldWhatTheSm90PlanCounts) {
  int rows = 0, empty = 0;
  for (const char* suite : {"sparse", "nope"}) {
    for (const CaseSpec& spec : load_suite(suite).cases) {
      if (spec.sparse.topk == 0 || has_topk_length(spec.sparse.pattern)) continue;
      const Case c = generate_case(spec);
      const IndexSet& m = c.sparse->main;
      const V counts = vllm_valid_counts(m.pos, c.num_tokens, m.width);
      const V lens = vllm_sm90_kv_lens(token_positions(c.seq_lens, c.query_start_loc), m.width);
      for (int t = 0; t < c.num_tokens; ++t, ++rows) {
        const auto i = static_cast<std::size_t>(t);
        if (spec.sparse.pattern == IndexPattern::kInvalidRows && counts[i] == 0) {
          ++empty;
          continue;
        }
        ASSERT_EQ(counts[i], lens[i]) << spec.batch.name << " token " << t;
      }
    }
  }
  EXPECT_GT(rows, 500);
  EXPECT_GT(empty, 0);
}

}  // namespace
}  // namespace mlagate
