// Draws the merge_states op's inputs (cases/merge.h) from the counter-based
// generator: IEEE arithmetic only, no libm, so the bits are the same anywhere.
#include "cases/merge.h"

#include <limits>
#include <tuple>
#include <vector>

#include "cases/encoding.h"
#include "cases/generator.h"

namespace mlagate {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The kinds a mixed case draws from: ordinary rows half the time (finite on
// both sides, where the arithmetic is), each infinite form in the rest.
constexpr LsePattern kMixedKinds[] = {LsePattern::kOrdinary,     LsePattern::kOrdinary,     LsePattern::kOrdinary,
                                      LsePattern::kOrdinary,     LsePattern::kOrdinary,     LsePattern::kOrdinary,
                                      LsePattern::kPrefixEmpty,  LsePattern::kSuffixEmpty,  LsePattern::kPrefixPosInf,
                                      LsePattern::kSuffixPosInf, LsePattern::kBothEmpty,    LsePattern::kBothPosInf};

// One side's lse: -inf for empty, +inf for FA2's empty, else the drawn value.
enum class Side : std::uint8_t { kFinite, kNegInf, kPosInf };

void sides(LsePattern k, std::uint64_t row_bits, Side& p, Side& s) {
  p = s = Side::kFinite;
  switch (k) {
    case LsePattern::kOrdinary:
    case LsePattern::kMixed: break;
    case LsePattern::kPrefixEmpty: p = Side::kNegInf; break;
    case LsePattern::kSuffixEmpty: s = Side::kNegInf; break;
    case LsePattern::kPrefixPosInf: p = Side::kPosInf; break;
    case LsePattern::kSuffixPosInf: s = Side::kPosInf; break;
    case LsePattern::kBothEmpty: p = s = Side::kNegInf; break;
    case LsePattern::kBothPosInf:
      // both infinite: +inf on both sides, or one of each (an FA2 side beside an FA3 one)
      p = Side::kPosInf;
      s = (row_bits & 1) ? Side::kNegInf : Side::kPosInf;
      break;
  }
}

}  // namespace

LsePattern merge_row_kind(const CaseSpec& spec, std::int64_t row) {
  if (spec.merge.lse != LsePattern::kMixed) return spec.merge.lse;
  const std::uint64_t n = sizeof kMixedKinds / sizeof kMixedKinds[0];
  return kMixedKinds[gen::below(n, spec.seed, gen::tensor_key("merge_kind"), static_cast<std::uint64_t>(row))];
}

std::shared_ptr<const MergeInputs> generate_merge(const CaseSpec& spec) {
  const std::int64_t T = spec.num_tokens(), N = spec.num_heads(), D = spec.merge.head_dim;
  auto m = std::make_shared<MergeInputs>();
  m->prefix_output = Tensor(spec.dtype, {T, N, D});
  m->suffix_output = Tensor(spec.dtype, {T, N, D});
  m->prefix_lse = Tensor(DType::kF32, {T, N});
  m->suffix_lse = Tensor(DType::kF32, {T, N});
  const std::uint64_t k_lse_p = gen::stream(spec.seed, gen::tensor_key("merge_prefix_lse"));
  const std::uint64_t k_lse_s = gen::stream(spec.seed, gen::tensor_key("merge_suffix_lse"));
  const std::uint64_t k_out_p = gen::stream(spec.seed, gen::tensor_key("merge_prefix_output"));
  const std::uint64_t k_out_s = gen::stream(spec.seed, gen::tensor_key("merge_suffix_output"));
  const std::uint64_t k_sign = gen::tensor_key("merge_gap_sign");
  // A value in the case's dtype: fp32 as is, 16-bit through our own RNE rounding.
  auto store = [&spec](Tensor& t, std::int64_t i, double v) {
    const float f = static_cast<float>(v);
    if (spec.dtype == DType::kF32)
      t.data<float>()[i] = f;
    else
      t.data<std::uint16_t>()[i] = spec.dtype == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
  };
  std::vector<double> row(static_cast<std::size_t>(D));
  // The rows' lse normals, drawn together (normals_at: normal_at's values).
  std::vector<double> lse_p(static_cast<std::size_t>(T * N)), lse_s(lse_p.size());
  gen::normals_at(k_lse_p, 0, T * N, lse_p.data());
  gen::normals_at(k_lse_s, 0, T * N, lse_s.data());
  for (std::int64_t r = 0; r < T * N; ++r) {
    const std::uint64_t u = static_cast<std::uint64_t>(r);
    Side ps, ss;
    sides(merge_row_kind(spec, r), gen::bits(spec.seed, k_sign, u, 1), ps, ss);
    const double lp = 4.0 + 2.0 * lse_p[static_cast<std::size_t>(r)];
    double ls = 4.0 + 2.0 * lse_s[static_cast<std::size_t>(r)];
    if (spec.merge.gap > 0) ls = lp + ((gen::bits(spec.seed, k_sign, u) & 1) ? spec.merge.gap : -spec.merge.gap);
    auto lse_of = [](Side s, double v) { return s == Side::kFinite ? static_cast<float>(v) : s == Side::kNegInf ? -kInf : kInf; };
    m->prefix_lse.data<float>()[r] = lse_of(ps, lp);
    m->suffix_lse.data<float>()[r] = lse_of(ss, ls);
    // The row's D outputs of a finite side: normals r*D .. r*D + D - 1 (normals_at:
    // normal_at's values, several at a time); an empty side's row holds 0.
    for (auto [t, side, st] : {std::tuple{&m->prefix_output, ps, k_out_p}, std::tuple{&m->suffix_output, ss, k_out_s}}) {
      if (side == Side::kFinite) gen::normals_at(st, static_cast<std::uint64_t>(r * D), D, row.data());
      for (std::int64_t x = 0; x < D; ++x) store(*t, r * D + x, side == Side::kFinite ? row[static_cast<std::size_t>(x)] : 0.0);
    }
  }
  return m;
}

}  // namespace mlagate
