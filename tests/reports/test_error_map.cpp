// The error summary compare_output fills for the HTML report (Metrics::err_token_head,
// query_lens, worst_elements), on hand-made outputs with errors planted at known places, and
// its exact round trip through the record JSON that carries it from workers and journals.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cases/tensor.h"
#include "reference/compare.h"
#include "reports/record_json.h"

namespace mlagate {
namespace {

// An fp32 output [tokens, heads, dim] equal to its reference until errors are planted.
struct Planted {
  std::vector<std::int32_t> qsl;
  std::int64_t tokens, heads, dim;
  std::vector<double> reference;
  Tensor got;
  OutputCheck check;

  Planted(std::vector<std::int32_t> query_start_loc, std::int64_t t, std::int64_t h, std::int64_t d)
      : qsl(std::move(query_start_loc)), tokens(t), heads(h), dim(d), got(DType::kF32, {t, h, d}) {
    reference.resize(static_cast<std::size_t>(t * h * d));
    for (std::size_t i = 0; i < reference.size(); ++i) {
      reference[i] = 0.5 * static_cast<double>(static_cast<int>(i % 5) - 2);  // exact in fp32
      got.set(static_cast<std::int64_t>(i), reference[i]);
    }
    check.name = "out";
    check.got = got.view();
    check.expected_shape = {t, h, d};
    check.expected_dtype = DType::kF32;
    check.reference = &reference;
    check.layout = Layout{qsl, h, d};
  }
  std::int64_t flat(std::int64_t t, std::int64_t h, std::int64_t d) const { return (t * heads + h) * dim + d; }
  void plant(std::int64_t t, std::int64_t h, std::int64_t d, double err) {
    got.set(flat(t, h, d), reference[static_cast<std::size_t>(flat(t, h, d))] + err);
  }
  Metrics compare() {
    Metrics m;
    compare_output(check, make_policy("fixed", INFINITY, 0), m);
    return m;
  }
};

TEST(ErrorMap, PlantedErrorLandsInItsCellAndIsWorst) {
  Planted p({0, 3, 5}, 5, 4, 8);  // request 0: tokens 0-2, request 1: tokens 3-4
  p.plant(3, 2, 5, 0.25);         // request 1, token 0, head 2, dim 5
  p.plant(0, 1, 0, 0.125);
  p.plant(4, 3, 7, -0.0625);
  const Metrics m = p.compare();
  EXPECT_EQ(m.map_tokens, 5);
  EXPECT_EQ(m.map_heads, 4);
  EXPECT_EQ(m.token_bin, 1);
  EXPECT_EQ(m.head_bin, 1);
  ASSERT_EQ(m.err_token_head.size(), 20u);
  for (int t = 0; t < 5; ++t) {
    for (int h = 0; h < 4; ++h) {
      const float want = t == 3 && h == 2 ? 0.25f : t == 0 && h == 1 ? 0.125f : t == 4 && h == 3 ? 0.0625f : 0.0f;
      EXPECT_EQ(m.err_token_head[static_cast<std::size_t>(t * 4 + h)], want) << "token " << t << " head " << h;
    }
  }
  EXPECT_EQ(m.query_lens, (std::vector<std::int32_t>{3, 2}));

  ASSERT_EQ(m.worst_elements.size(), kWorstElements);
  const WorstElement& w = m.worst_elements[0];
  EXPECT_EQ(w.where.flat, p.flat(3, 2, 5));
  EXPECT_EQ(w.where.request, 1);
  EXPECT_EQ(w.where.token, 0);
  EXPECT_EQ(w.where.head, 2);
  EXPECT_EQ(w.where.dim, 5);
  EXPECT_EQ(w.err, 0.25);
  EXPECT_EQ(w.expected, p.reference[static_cast<std::size_t>(p.flat(3, 2, 5))]);
  EXPECT_EQ(w.got, w.expected + 0.25);
  EXPECT_EQ(w.where.flat, m.worst.flat);  // the same element as max_abs's
  EXPECT_EQ(m.worst_elements[1].where.flat, p.flat(0, 1, 0));
  EXPECT_EQ(m.worst_elements[2].where.flat, p.flat(4, 3, 7));
  EXPECT_EQ(m.worst_elements[2].err, 0.0625);
  // The rest are exact: among equal errors the lowest flat indices, in order.
  const std::int64_t zeros[] = {0, 1, 2, 3, 4};
  for (std::size_t k = 3; k < kWorstElements; ++k) {
    EXPECT_EQ(m.worst_elements[k].err, 0);
    EXPECT_EQ(m.worst_elements[k].where.flat, zeros[k - 3]);
  }
}

TEST(ErrorMap, TopEightAreSortedWithTiesByIndex) {
  Planted p({0, 4}, 4, 2, 4);
  // Ten errors, two pairs tied: the kept eight are the largest, earlier index first on a tie.
  const double errs[10] = {0.5, 1, 0.25, 1, 2, 0.75, 0.125, 0.75, 1.5, 0.0625};
  for (int k = 0; k < 10; ++k) p.got.set(3 * k, p.reference[static_cast<std::size_t>(3 * k)] + errs[k]);
  const Metrics m = p.compare();
  const std::int64_t want_flat[8] = {12, 24, 3, 9, 15, 21, 0, 6};  // 2, 1.5, 1, 1, 0.75, 0.75, 0.5, 0.25
  ASSERT_EQ(m.worst_elements.size(), 8u);
  for (int k = 0; k < 8; ++k) EXPECT_EQ(m.worst_elements[static_cast<std::size_t>(k)].where.flat, want_flat[k]) << k;
  EXPECT_EQ(m.worst_elements[0].err, 2);
  EXPECT_EQ(m.worst_elements[7].err, 0.25);
}

TEST(ErrorMap, ManyTokensAndHeadsAreBinned) {
  Planted p({0, 100, 200}, 200, 256, 2);
  p.plant(131, 77, 1, 0.5);
  p.plant(130, 76, 0, 0.25);  // the same cell (tokens 128-131, heads 76-77): the max stays
  p.plant(0, 255, 0, 0.125);  // the last column
  const Metrics m = p.compare();
  EXPECT_EQ(m.token_bin, 4);  // ceil(200 / 64)
  EXPECT_EQ(m.head_bin, 2);   // ceil(256 / 128)
  const int rows = 50, cols = 128;
  ASSERT_EQ(m.err_token_head.size(), static_cast<std::size_t>(rows * cols));
  EXPECT_EQ(m.err_token_head[32 * cols + 38], 0.5f);
  EXPECT_EQ(m.err_token_head[0 * cols + 127], 0.125f);
  int nonzero = 0;
  for (float v : m.err_token_head) nonzero += v != 0 ? 1 : 0;
  EXPECT_EQ(nonzero, 2);
  EXPECT_EQ(m.query_lens, (std::vector<std::int32_t>{100, 100}));
  EXPECT_EQ(m.worst_elements[0].where.request, 1);
  EXPECT_EQ(m.worst_elements[0].where.token, 31);
  EXPECT_EQ(m.worst_elements[0].where.head, 77);
}

TEST(ErrorMap, NonFiniteMismatchesMarkTheirCellAndAreCounted) {
  Planted p({0, 2}, 2, 3, 4);
  p.plant(1, 0, 0, 4.0);  // a large finite error in the same cell as the NaN
  p.got.set(p.flat(1, 0, 3), std::nan(""));
  p.got.set(p.flat(0, 2, 1), std::numeric_limits<double>::infinity());
  p.plant(0, 1, 2, 0.5);
  Metrics m;
  EXPECT_EQ(compare_output(p.check, make_policy("fixed", INFINITY, 0), m), Status::kNonfinite);
  EXPECT_EQ(m.nonfinite_mismatches, 2);
  ASSERT_EQ(m.err_token_head.size(), 6u);
  EXPECT_TRUE(std::isnan(m.err_token_head[1 * 3 + 0]));
  EXPECT_TRUE(std::isnan(m.err_token_head[0 * 3 + 2]));
  EXPECT_EQ(m.err_token_head[0 * 3 + 1], 0.5f);
  EXPECT_EQ(m.err_token_head[1 * 3 + 1], 0.0f);
  // The worst elements are finite pairs only: the planted 4 first, then 0.5.
  EXPECT_EQ(m.worst_elements[0].where.flat, p.flat(1, 0, 0));
  EXPECT_EQ(m.worst_elements[1].where.flat, p.flat(0, 1, 2));
  for (const WorstElement& w : m.worst_elements) EXPECT_TRUE(std::isfinite(w.got)) << w.where.str();
}

TEST(ErrorMap, LseEmptyRowsThatMatchAreNotMarked) {
  std::vector<std::int32_t> qsl{0, 1, 2};
  std::vector<double> reference{1.5, -std::numeric_limits<double>::infinity(), 2.0, 3.0};
  Tensor got(DType::kF32, {2, 2});
  got.set(0, 1.5);
  got.set(1, std::numeric_limits<double>::infinity());  // empty row: either infinity is accepted
  got.set(2, 2.0);
  got.set(3, 3.5);
  OutputCheck c{"lse", got.view(), {2, 2}, DType::kF32, &reference, Layout{qsl, 2, 1}, true};
  Metrics m;
  EXPECT_EQ(compare_output(c, make_policy("fixed", 1, 0), m), Status::kPassed);
  EXPECT_EQ(m.err_token_head, (std::vector<float>{0, 0, 0, 0.5f}));
  EXPECT_EQ(m.query_lens, (std::vector<std::int32_t>{1, 1}));
}

TEST(ErrorMap, PaddingTokensAndOddShapes) {
  // Tokens past the last request are padding: the boundaries still describe the requests.
  Planted padded({0, 2, 3}, 5, 2, 2);
  EXPECT_EQ(padded.compare().query_lens, (std::vector<std::int32_t>{2, 1}));
  // A wrong shape fails before any element is read: no map.
  Planted wrong({0, 2}, 2, 2, 2);
  wrong.check.got.shape = {2, 4};
  const Metrics m = wrong.compare();
  EXPECT_EQ(m.map_tokens, 0);
  EXPECT_TRUE(m.err_token_head.empty());
  EXPECT_TRUE(m.worst_elements.empty());
  // numel not a multiple of heads x dim: no map, but the worst elements are still kept.
  Planted odd({0, 3}, 3, 1, 4);
  odd.check.layout.heads = 5;
  odd.plant(1, 0, 2, 0.5);
  const Metrics o = odd.compare();
  EXPECT_EQ(o.map_tokens, 0);
  EXPECT_TRUE(o.err_token_head.empty());
  ASSERT_FALSE(o.worst_elements.empty());
  EXPECT_EQ(o.worst_elements[0].where.flat, odd.flat(1, 0, 2));
}

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(RecordJson, RoundTripsTheErrorSummaryExactly) {
  Planted p({0, 3, 5}, 5, 4, 8);
  p.plant(3, 2, 5, 0.1);  // not a short decimal: must come back to the bit
  p.got.set(p.flat(1, 1, 1), std::nan(""));
  Record r;
  r.case_id = "c";
  r.backend = "b";
  r.op = "decode";
  r.status = Status::kNonfinite;
  r.metrics = {p.compare()};
  r.metrics[0].err_token_head.push_back(-std::numeric_limits<float>::infinity());  // every value survives
  r.metrics[0].err_token_head.push_back(1e-45f);
  const std::string line = record_to_json_line(r);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const Record b = record_from_json_line(line);
  EXPECT_EQ(record_to_json_line(b), line);
  const Metrics &x = r.metrics[0], &y = b.metrics[0];
  EXPECT_EQ(y.map_tokens, x.map_tokens);
  EXPECT_EQ(y.map_heads, x.map_heads);
  EXPECT_EQ(y.token_bin, x.token_bin);
  EXPECT_EQ(y.head_bin, x.head_bin);
  ASSERT_EQ(y.err_token_head.size(), x.err_token_head.size());
  for (std::size_t i = 0; i < x.err_token_head.size(); ++i)
    EXPECT_EQ(bits(y.err_token_head[i]), bits(x.err_token_head[i])) << i;
  EXPECT_EQ(y.query_lens, x.query_lens);
  ASSERT_EQ(y.worst_elements.size(), x.worst_elements.size());
  for (std::size_t k = 0; k < x.worst_elements.size(); ++k) {
    EXPECT_EQ(y.worst_elements[k].where.str(), x.worst_elements[k].where.str());
    EXPECT_EQ(y.worst_elements[k].where.flat, x.worst_elements[k].where.flat);
    EXPECT_EQ(y.worst_elements[k].got, x.worst_elements[k].got);
    EXPECT_EQ(y.worst_elements[k].expected, x.worst_elements[k].expected);
    EXPECT_EQ(y.worst_elements[k].err, x.worst_elements[k].err);
  }
}

TEST(RecordJson, ReadsLinesWithoutTheErrorSummary) {
  // A journal written before the summary existed: its records read back without one.
  Record r;
  r.case_id = "c";
  r.metrics.emplace_back().output = "out";
  nlohmann::json j = nlohmann::json::parse(record_to_json_line(r));
  for (const char* key : {"map", "err_token_head", "query_lens", "worst_elements"}) j["metrics"][0].erase(key);
  const Record b = record_from_json_line(j.dump());
  EXPECT_EQ(b.metrics[0].map_tokens, 0);
  EXPECT_TRUE(b.metrics[0].err_token_head.empty());
  // A damaged map is an error, not a silently different record.
  nlohmann::json bad = nlohmann::json::parse(record_to_json_line(r));
  bad["metrics"][0]["err_token_head"] = "AAA*";
  EXPECT_THROW(record_from_json_line(bad.dump()), std::runtime_error);
}

}  // namespace
}  // namespace mlagate
