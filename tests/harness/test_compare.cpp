// compare_output: each rule of SPEC: Pass rules in isolation, on hand-made
// outputs, so a regression in one rule cannot hide behind another.
#include <gtest/gtest.h>

#include <omp.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "cases/errors.h"
#include "reference/compare.h"
#include "harness/run/guarded.h"

namespace mlagate {
namespace {

struct Fixture {
  std::vector<std::int32_t> qsl{0, 1, 3};  // request 0: 1 token, request 1: 2 tokens
  std::vector<double> reference;
  Tensor got;
  OutputCheck check;
  Fixture() : got(DType::kBF16, {3, 2, 4}) {
    reference.resize(24);
    for (int i = 0; i < 24; ++i) {
      reference[i] = 0.25 * (i % 7) - 0.5;
      got.set(i, reference[i]);  // exactly representable in bf16
    }
    check.name = "out";
    check.got = got.view();
    check.expected_shape = {3, 2, 4};
    check.expected_dtype = DType::kBF16;
    check.reference = &reference;
    check.layout = Layout{qsl, 2, 4};
  }
};

TEST(Compare, ExactOutputPassesWithZeroError) {
  Fixture f;
  Metrics m;
  EXPECT_EQ(compare_output(f.check, make_policy("fixed", 0, 0), m), Status::kPassed);
  EXPECT_EQ(m.max_abs, 0);
  EXPECT_EQ(m.min_atol, 0);
  EXPECT_EQ(m.nmse, 0);
  EXPECT_NEAR(m.cos_diff, 0, 1e-15);
}

TEST(Compare, ShapeIsCheckedBeforeValues) {
  Fixture f;
  f.check.got.shape = {2, 3, 4};  // same element count, wrong axes
  Metrics m;
  EXPECT_EQ(compare_output(f.check, make_policy("vllm", 0, 0), m), Status::kIncorrect);
  EXPECT_NE(m.message.find("produced [2, 3, 4]"), std::string::npos) << m.message;
}

TEST(Compare, NanIsLocatedByRequestTokenHeadDim) {
  Fixture f;
  f.got.set(1 * 8 + 1 * 4 + 2, std::nan(""));  // token 1 = request 1 token 0, head 1, dim 2
  Metrics m;
  EXPECT_EQ(compare_output(f.check, make_policy("vllm", 0, 0), m), Status::kNonfinite);
  EXPECT_EQ(m.nonfinite_mismatches, 1);
  EXPECT_EQ(m.first_nonfinite.request, 1);
  EXPECT_EQ(m.first_nonfinite.token, 0);
  EXPECT_EQ(m.first_nonfinite.head, 1);
  EXPECT_EQ(m.first_nonfinite.dim, 2);
  EXPECT_NE(m.message.find("NaN"), std::string::npos);
}

TEST(Compare, EmptyRowLseMayBeEitherInfinity) {
  std::vector<std::int32_t> qsl{0, 2};
  std::vector<double> reference{1.5, -std::numeric_limits<double>::infinity()};
  Tensor got(DType::kF32, {2, 1});
  got.set(0, 1.5);
  got.set(1, std::numeric_limits<double>::infinity());  // FlashMLA's convention
  OutputCheck c{"lse", got.view(), {2, 1}, DType::kF32, &reference, Layout{qsl, 1, 1}, true};
  Metrics m;
  EXPECT_EQ(compare_output(c, make_policy("fixed", 1e-6, 0), m), Status::kPassed);
  EXPECT_NE(m.message.find("+inf"), std::string::npos);
  got.set(1, std::nan(""));
  EXPECT_EQ(compare_output(c, make_policy("fixed", 1e-6, 0), m), Status::kNonfinite);
  // A finite value where the reference row is empty is a mismatch too.
  got.set(1, 0.0);
  EXPECT_EQ(compare_output(c, make_policy("fixed", 1e-6, 0), m), Status::kNonfinite);
}

TEST(Compare, ToleranceAndSmallestPassingAtol) {
  Fixture f;
  f.got.set(5, f.reference[5] + 0.125);  // |ref| = 0.75 at index 5
  Metrics m;
  const Policy p = make_policy("fixed", 0.1, 0.01);
  EXPECT_EQ(compare_output(f.check, p, m), Status::kIncorrect);
  EXPECT_DOUBLE_EQ(m.max_abs, 0.125);
  EXPECT_DOUBLE_EQ(m.min_atol, 0.125 - 0.01 * std::fabs(f.reference[5]));
  EXPECT_EQ(m.worst.flat, 5);
  // The smallest passing atol does pass.
  EXPECT_EQ(compare_output(f.check, make_policy("fixed", m.min_atol, 0.01), m), Status::kPassed);
}

TEST(Compare, VllmPolicyGatesOnlyTheOutput) {
  Fixture f;
  f.check.name = "lse";
  f.got.set(0, 100.0);
  Metrics m;
  EXPECT_EQ(compare_output(f.check, make_policy("vllm", 0, 0), m), Status::kPassed);
  EXPECT_GT(m.max_abs, 50);  // measured, not gated
  EXPECT_EQ(compare_output(f.check, make_policy("fixed", 0.5, 0.01), m), Status::kIncorrect);
}

TEST(Compare, AllZeroOutputCannotPass) {
  Fixture f;
  for (int i = 0; i < 24; ++i) {
    f.reference[i] = 1e-3;
    f.got.set(i, 0.0);
  }
  Metrics m;
  EXPECT_EQ(compare_output(f.check, make_policy("vllm", 0, 0), m), Status::kIncorrect);
  EXPECT_NE(m.message.find("zero norm"), std::string::npos);
}

// Rows of a case that all lack keys (a decode step, a request alone): zeros
// matched by zeros pass where asked; a zero output against a non-zero
// reference still fails, and whole cases keep the rule.
TEST(Compare, ZeroReferenceRowsPassOnlyWhereAsked) {
  Fixture f;
  for (int i = 0; i < 24; ++i) {
    f.reference[i] = 0;
    f.got.set(i, 0.0);
  }
  Metrics m;
  EXPECT_EQ(compare_output(f.check, make_policy("vllm", 0, 0), m), Status::kIncorrect);
  f.check.zero_reference_ok = true;
  EXPECT_EQ(compare_output(f.check, make_policy("vllm", 0, 0), m), Status::kPassed) << m.message;
  for (int i = 0; i < 24; ++i) f.reference[i] = 1e-3;
  EXPECT_EQ(compare_output(f.check, make_policy("vllm", 0, 0), m), Status::kIncorrect);
  EXPECT_NE(m.message.find("zero norm"), std::string::npos);
}

TEST(Compare, UlpOfBf16) {
  EXPECT_DOUBLE_EQ(ulp_of(1.0, DType::kBF16), 1.0 / 128);
  EXPECT_DOUBLE_EQ(ulp_of(3.0, DType::kBF16), 2.0 / 128);
  EXPECT_DOUBLE_EQ(ulp_of(1.0, DType::kF16), 1.0 / 1024);
  EXPECT_DOUBLE_EQ(ulp_of(0.0, DType::kF16), std::ldexp(1.0, -24));
}

// ulp_of reads normal doubles' exponents from the bits: the same powers of two
// as frexp's definition, for normals, subnormals, zero and both signs, in every
// output dtype.
TEST(Compare, UlpOfEqualsTheFrexpDefinition) {
  const auto by_frexp = [](double y, int mant_bits, int min_exp) {
    int e = 0;
    std::frexp(std::fabs(y), &e);
    const int exp = y == 0 ? min_exp : std::max(e - 1, min_exp);
    return std::ldexp(1.0, exp - (mant_bits - 1));
  };
  const struct { DType d; int mant, min_exp; } fmts[] = {
      {DType::kBF16, 8, -126}, {DType::kF16, 11, -14}, {DType::kF32, 24, -126}, {DType::kF64, 53, -1022}};
  std::vector<double> ys = {0.0, -0.0, 1.0, -1.0, 0.75, 3.0, 65504.0, 1e-300, 5e-324, -4e-320, 1e300,
                            std::numeric_limits<double>::min(), std::numeric_limits<double>::max()};
  for (int k = -1074; k <= 1023; k += 7) ys.push_back(std::ldexp(1.37, k));
  for (const auto& f : fmts)
    for (double y : ys) EXPECT_EQ(ulp_of(y, f.d), by_frexp(y, f.mant, f.min_exp)) << y << " " << dtype_name(f.d);
}

TEST(Guarded, DetectsWritesPastEitherEnd) {
  GuardedBuffer b(DType::kF32, {4}, Poison::kNaN);
  EXPECT_TRUE(std::isnan(b.view().get(3)));
  EXPECT_EQ(b.check_guards("x"), "");
  static_cast<float*>(b.view().data)[4] = 1.f;  // one element past the end
  EXPECT_NE(b.check_guards("x").find("past the end of x"), std::string::npos);
  GuardedBuffer c(DType::kBF16, {4}, Poison::kZero);
  static_cast<std::uint16_t*>(c.view().data)[-1] = 0;
  EXPECT_NE(c.check_guards("y").find("before y"), std::string::npos);
}

// The baseline policy: err <= fudge * err_baseline + floor, the floor half a
// bf16 ulp at max |ref| (1.0 here: 2^-8), min_fudge the fudge that just passes.
TEST(Compare, BaselinePolicyAndSmallestPassingFudge) {
  Fixture f;
  f.check.err_baseline = 0.01;
  f.got.set(5, f.reference[5] + 0.03125);  // exactly representable: err 2^-5
  const double floor = std::ldexp(1.0, -8);
  Metrics m;
  EXPECT_EQ(compare_output(f.check, make_policy("baseline", 0, 0, 2.0), m), Status::kIncorrect);
  EXPECT_DOUBLE_EQ(m.baseline_floor, floor);
  EXPECT_DOUBLE_EQ(m.err_baseline, 0.01);
  EXPECT_DOUBLE_EQ(m.min_fudge, (0.03125 - floor) / 0.01);
  EXPECT_NE(m.message.find("baseline(fudge=2)"), std::string::npos) << m.message;
  EXPECT_NE(m.message.find("needs fudge 2.734"), std::string::npos) << m.message;
  EXPECT_EQ(compare_output(f.check, make_policy("baseline", 0, 0, m.min_fudge), m), Status::kPassed);
  EXPECT_EQ(compare_output(f.check, make_policy("baseline", 0, 0, 3.0), m), Status::kPassed);
  // Every policy reports min_fudge when err_baseline is known.
  EXPECT_EQ(compare_output(f.check, make_policy("fixed", 1, 0), m), Status::kPassed);
  EXPECT_DOUBLE_EQ(m.min_fudge, (0.03125 - floor) / 0.01);
  // Within the floor: min_fudge 0, whatever err_baseline (even 0).
  f.got.set(5, f.reference[5]);
  f.check.err_baseline = 0;
  EXPECT_EQ(compare_output(f.check, make_policy("baseline", 0, 0, 2.0), m), Status::kPassed);
  EXPECT_EQ(m.min_fudge, 0);
}

TEST(Compare, BaselinePolicyJudgesLseWithItsOwnFloor) {
  std::vector<std::int32_t> qsl{0, 2};
  std::vector<double> reference{4.5, -std::numeric_limits<double>::infinity()};
  Tensor got(DType::kF32, {2, 1});
  got.set(0, 4.5 + 1e-4);
  got.set(1, -std::numeric_limits<double>::infinity());
  OutputCheck c{"lse", got.view(), {2, 1}, DType::kF32, &reference, Layout{qsl, 1, 1}, true};
  c.err_baseline = 1e-7;
  c.dqk = 576;
  Metrics m;
  // floor = 576 * 0.5 ulp_f32(4.5) = 576 * 2^-22 = 1.37e-4: a 1e-4 error passes.
  EXPECT_EQ(compare_output(c, make_policy("baseline", 0, 0, 2.0), m), Status::kPassed);
  EXPECT_DOUBLE_EQ(m.baseline_floor, 576 * std::ldexp(1.0, -22));
  got.set(0, 4.5 + 1e-3);  // the size of a 1% softmax-scale error's shift
  EXPECT_EQ(compare_output(c, make_policy("baseline", 0, 0, 2.0), m), Status::kIncorrect);
}

TEST(Compare, BaselinePolicyNeedsErrBaselineAndAValidFudge) {
  Fixture f;
  Metrics m;
  EXPECT_THROW(compare_output(f.check, make_policy("baseline", 0, 0), m), std::logic_error);
  EXPECT_THROW(make_policy("baseline", 0, 0, -1), InputError);
  EXPECT_THROW(make_policy("baseline", 0, 0, INFINITY), InputError);
  const Policy p = make_policy("baseline", 0, 0, 2.5);
  EXPECT_EQ(p.describe(), "baseline(fudge=2.5)");
  EXPECT_EQ(p.cli_args(), "--policy baseline --fudge 2.5");
  EXPECT_TRUE(p.gates("lse"));
  EXPECT_EQ(make_policy("baseline", 0, 0).fudge, kDefaultFudge);
}

// The metrics pass runs over blocks of whole (token, head) runs in parallel:
// its figures must not depend on the threads (the same bits on any machine),
// and its maxima, worst elements and error map must be those of the elements.
TEST(Compare, ManyBlocksGiveTheSameBitsWhateverTheThreads) {
  const std::int64_t T = 300, N = 16, D = 128;  // 614,400 elements: ten blocks
  std::vector<std::int32_t> qsl{0, 100, 300};
  std::vector<double> ref(static_cast<std::size_t>(T * N * D));
  Tensor got(DType::kBF16, {T, N, D});
  std::uint64_t s = 12345;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    ref[i] = static_cast<double>(static_cast<std::int64_t>(s >> 11) % 20001 - 10000) * 1e-4;
    got.set(static_cast<std::int64_t>(i), ref[i]);  // rounded to bf16: errors everywhere
  }
  got.set(T * N * D - 5, 7.0);  // the worst element, in the last block
  got.set(T * N * D / 2 + 3, std::nan(""));  // a non-finite mismatch, mid-way
  OutputCheck c;
  c.name = "out";
  c.got = got.view();
  c.expected_shape = {T, N, D};
  c.expected_dtype = DType::kBF16;
  c.reference = &ref;
  c.layout = Layout{qsl, N, D};
  auto run_with = [&](int threads) {
    omp_set_num_threads(threads);
    Metrics m;
    compare_output(c, make_policy("vllm", 0, 0), m);
    return m;
  };
  const int before = omp_get_max_threads();
  const Metrics one = run_with(1), three = run_with(3);
  omp_set_num_threads(before);
  auto bits = [](double x) { return std::bit_cast<std::uint64_t>(x); };
  for (auto f : {&Metrics::max_abs, &Metrics::max_rel, &Metrics::mean_abs, &Metrics::nmse, &Metrics::cos_diff,
                 &Metrics::max_ulp, &Metrics::ref_norm, &Metrics::out_norm, &Metrics::min_atol})
    EXPECT_EQ(bits(one.*f), bits(three.*f));
  EXPECT_EQ(one.err_token_head.size(), three.err_token_head.size());
  EXPECT_EQ(std::memcmp(one.err_token_head.data(), three.err_token_head.data(), one.err_token_head.size() * sizeof(float)),
            0);
  // Against the elements themselves.
  double max_abs = 0;
  std::int64_t worst = -1;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double x = got.get(static_cast<std::int64_t>(i));
    if (!std::isfinite(x)) continue;
    const double d = std::fabs(x - ref[i]);
    if (d > max_abs || worst < 0) max_abs = d, worst = static_cast<std::int64_t>(i);
  }
  EXPECT_EQ(one.max_abs, max_abs);
  EXPECT_EQ(worst, T * N * D - 5);
  ASSERT_FALSE(one.worst_elements.empty());
  EXPECT_EQ(one.worst_elements[0].err, max_abs);
  for (std::size_t k = 1; k < one.worst_elements.size(); ++k) {
    EXPECT_GE(one.worst_elements[k - 1].err, one.worst_elements[k].err);
    EXPECT_EQ(one.worst_elements[k].err, three.worst_elements[k].err);
  }
  EXPECT_EQ(one.nonfinite_mismatches, 1);
  // The cell of the NaN shows NaN; the worst element's cell holds its error.
  std::size_t nan_cells = 0;
  float largest = 0;
  for (float v : one.err_token_head) {
    if (std::isnan(v)) ++nan_cells;
    else largest = std::max(largest, v);
  }
  EXPECT_EQ(nan_cells, 1u);
  EXPECT_EQ(largest, static_cast<float>(max_abs));
}

}  // namespace
}  // namespace mlagate
