// Metrics and verdicts for one output against the fp64 reference.
#include "reference/compare.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "cases/encoding.h"
#include "cases/errors.h"

namespace mlagate {

namespace {

// Elements per block of the metrics pass (whole runs; see compare_output).
constexpr std::int64_t kCompareBlock = std::int64_t{1} << 16;

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

const char* nonfinite_kind(double v) {
  if (std::isnan(v)) return "NaN";
  return v > 0 ? "+inf" : "-inf";
}

}  // namespace

std::string Policy::describe() const {
  switch (kind) {
    case Kind::kVllm: return "vllm(atol=" + fmt(atol) + ", rtol=" + fmt(rtol) + ", output only)";
    case Kind::kFixed: return "fixed(atol=" + fmt(atol) + ", rtol=" + fmt(rtol) + ")";
    case Kind::kBaseline: return "baseline(fudge=" + fmt(fudge) + ")";
  }
  return "?";
}

std::vector<std::string> Policy::cli_argv() const {
  if (kind == Kind::kVllm) return {"--policy", "vllm"};
  if (kind == Kind::kBaseline) return {"--policy", "baseline", "--fudge", exact_number(fudge)};
  return {"--policy", "fixed", "--atol", exact_number(atol), "--rtol", exact_number(rtol)};
}

std::string Policy::cli_args() const {
  std::string s;
  for (const std::string& w : cli_argv()) s += (s.empty() ? "" : " ") + w;
  return s;
}

bool Policy::gates(const std::string& output) const {
  // The seed test only compares the layer output; lse and o_lat are extra.
  if (kind == Kind::kVllm) return output == "out" || output == "o" || output == "o_lat";
  return true;
}

Policy make_policy(const std::string& name, double atol, double rtol, double fudge) {
  Policy p;
  if (name == "vllm") {
    p.kind = Policy::Kind::kVllm;
    p.atol = 0.5;
    p.rtol = 1e-2;
  } else if (name == "fixed") {
    if (!(atol >= 0) || !(rtol >= 0)) throw InputError("--atol and --rtol must be >= 0");
    p.kind = Policy::Kind::kFixed;
    p.atol = atol;
    p.rtol = rtol;
  } else if (name == "baseline") {
    if (!(fudge >= 0) || !std::isfinite(fudge)) throw InputError("--fudge must be finite and >= 0");
    p.kind = Policy::Kind::kBaseline;
    p.atol = 0;
    p.rtol = 0;
    p.fudge = fudge;
  } else {
    throw InputError("unknown policy '" + name + "' (expected baseline, vllm or fixed)");
  }
  return p;
}

double baseline_floor(double max_abs_ref, DType out_dtype, bool is_lse, int dqk) {
  if (is_lse) return std::max(dqk, 1) * 0.5 * ulp_of(std::max(1.0, max_abs_ref), DType::kF32);
  return 0.5 * ulp_of(max_abs_ref, out_dtype);
}

Location Layout::locate(std::int64_t flat) const {
  Location l;
  l.flat = flat;
  if (flat < 0) return l;
  const std::int64_t per_token = heads * dim;
  const std::int64_t t = flat / per_token;
  l.head = static_cast<int>((flat / dim) % heads);
  l.dim = static_cast<int>(flat % dim);
  l.token = static_cast<int>(t);
  for (std::size_t r = 0; r + 1 < query_start_loc.size(); ++r)
    if (t >= query_start_loc[r] && t < query_start_loc[r + 1]) {
      l.request = static_cast<int>(r);
      l.token = static_cast<int>(t - query_start_loc[r]);
      break;
    }
  return l;
}

namespace {

struct UlpFormat {
  int mant_bits;  // precision, implicit bit included
  int min_exp;    // smallest normal exponent
};

UlpFormat ulp_format(DType d) {
  switch (d) {
    case DType::kBF16: return {8, -126};
    case DType::kF16: return {11, -14};
    case DType::kF32: return {24, -126};
    default: return {53, -1022};
  }
}

// The spacing of format f at |y| (y finite). Normal doubles read their
// exponent from the bits (the compare loop calls this per element); zero and
// subnormals go through frexp. Both give the same power of two.
double ulp_in(double y, UlpFormat f) {
  const auto bits = std::bit_cast<std::uint64_t>(y);
  const int biased = static_cast<int>((bits >> 52) & 0x7ff);
  int exp;
  if (biased != 0) {
    exp = std::max(biased - 1023, f.min_exp);
  } else {
    int e = 0;
    std::frexp(std::fabs(y), &e);  // |y| in [2^(e-1), 2^e); 0 gives e = 0
    exp = y == 0 ? f.min_exp : std::max(e - 1, f.min_exp);
  }
  const int p = exp - (f.mant_bits - 1);
  if (p >= -1022) return std::bit_cast<double>(static_cast<std::uint64_t>(p + 1023) << 52);
  return std::ldexp(1.0, p);
}

// Every element as double, one switch per tensor instead of per element.
std::vector<double> as_f64(const TensorView& v) {
  const std::int64_t n = v.numel();
  std::vector<double> out(static_cast<std::size_t>(n));
  switch (v.dtype) {
    case DType::kF64: std::memcpy(out.data(), v.data, static_cast<std::size_t>(n) * 8); break;
    case DType::kF32: {
      const float* p = static_cast<const float*>(v.data);
      for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = p[i];
      break;
    }
    case DType::kBF16: {
      const auto* p = static_cast<const std::uint16_t*>(v.data);
#pragma omp parallel for schedule(static) if (n > (1 << 18))
      for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = bf16_to_f32(p[i]);
      break;
    }
    case DType::kF16: {
      const auto* p = static_cast<const std::uint16_t*>(v.data);
#pragma omp parallel for schedule(static) if (n > (1 << 18))
      for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = f16_to_f32(p[i]);
      break;
    }
    default:
      for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = v.get(i);
  }
  return out;
}

// The kWorstElements largest errors seen, earlier elements first among equals.
struct WorstKept {
  void offer(double d, std::int64_t i) {
    if (!(d > floor)) return;
    std::size_t k = n < kWorstElements ? n++ : kWorstElements - 1;
    for (; k > 0 && err[k - 1] < d; --k) {
      err[k] = err[k - 1];
      flat[k] = flat[k - 1];
    }
    err[k] = d;
    flat[k] = i;
    if (n == kWorstElements) floor = err[kWorstElements - 1];
  }
  // The smallest kept error once kWorstElements are kept; -1 before, so
  // that any error (>= 0) is taken.
  double floor = -1;
  std::size_t n = 0;
  std::array<double, kWorstElements> err{};
  std::array<std::int64_t, kWorstElements> flat{};
};

// The error summary of Metrics (err_token_head, query_lens, worst_elements),
// kept while compare_output walks the elements: the map's geometry is fixed
// up front so the metrics pass finds an element's cell once per (token, head)
// run of `dim` elements, and the largest errors live in a fixed array, so the
// pass allocates nothing and divides nothing per element.
class ErrorSummary {
 public:
  ErrorSummary(const Layout& layout, std::int64_t numel, Metrics& m) : m_(m) {
    const std::int64_t per_token = layout.heads * layout.dim;
    if (numel <= 0 || layout.heads <= 0 || layout.dim <= 0 || numel % per_token != 0) return;
    const std::int64_t tokens = numel / per_token;
    if (tokens > INT32_MAX || layout.heads > INT32_MAX) return;
    heads_ = layout.heads;
    dim_ = layout.dim;
    m.map_tokens = static_cast<int>(tokens);
    m.map_heads = static_cast<int>(layout.heads);
    m.token_bin = static_cast<int>((tokens + kErrMapMaxRows - 1) / kErrMapMaxRows);
    m.head_bin = static_cast<int>((layout.heads + kErrMapMaxCols - 1) / kErrMapMaxCols);
    cols_ = (m.map_heads + m.head_bin - 1) / m.head_bin;
    const int rows = (m.map_tokens + m.token_bin - 1) / m.token_bin;
    m.err_token_head.assign(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols_), 0.0f);
    // Request boundaries, when they are few and describe these tokens (rows
    // past the last request are padding, in no request).
    const auto& qsl = layout.query_start_loc;
    bool ok = qsl.size() >= 2 && qsl.size() - 1 <= kErrMapMaxRequests && qsl.front() == 0 && qsl.back() <= tokens;
    for (std::size_t r = 0; ok && r + 1 < qsl.size(); ++r) ok = qsl[r + 1] >= qsl[r];
    if (ok)
      for (std::size_t r = 0; r + 1 < qsl.size(); ++r) m.query_lens.push_back(qsl[r + 1] - qsl[r]);
  }

  // Elements [start, start + run_length()) share one cell; run_length() is
  // the whole output when there is no map.
  std::int64_t run_length(std::int64_t numel) const { return dim_ > 0 ? dim_ : numel; }
  // The cell of element i (a scratch cell without a map).
  float& cell(std::int64_t i) {
    if (dim_ == 0) return scratch_;
    const std::int64_t th = i / dim_;
    const std::int64_t row = th / heads_ / m_.token_bin, col = th % heads_ / m_.head_bin;
    return m_.err_token_head[static_cast<std::size_t>(row * cols_ + col)];
  }
  // A non-finite mismatch: its cell shows NaN whatever finite errors it holds
  // (the metrics pass's `d > cell` never replaces a NaN).
  void mark_nonfinite(std::int64_t i) { cell(i) = std::numeric_limits<float>::quiet_NaN(); }

  void offer(double d, std::int64_t i) { worst_.offer(d, i); }
  // A block's kept errors, offered in their order (blocks in element order:
  // the same list as offering every element in order).
  void offer_all(const WorstKept& w) {
    for (std::size_t k = 0; k < w.n; ++k) worst_.offer(w.err[k], w.flat[k]);
  }

  // Fills worst_elements from the kept indices.
  void finish(const Layout& layout, const std::vector<double>& got, const std::vector<double>& ref) {
    for (std::size_t k = 0; k < worst_.n; ++k) {
      WorstElement w;
      w.where = layout.locate(worst_.flat[k]);
      w.got = got[static_cast<std::size_t>(worst_.flat[k])];
      w.expected = ref[static_cast<std::size_t>(worst_.flat[k])];
      w.err = worst_.err[k];
      m_.worst_elements.push_back(w);
    }
  }

 private:
  Metrics& m_;
  std::int64_t heads_ = 0, dim_ = 0;  // dim_ 0: no map
  std::int64_t cols_ = 0;
  float scratch_ = 0;
  WorstKept worst_;
};

// One block's share of the metrics pass: sums from zero, maxima, its largest
// errors and each of its (token, head) runs' largest error. The same fields
// hold the whole output's totals once the blocks are added.
struct BlockMetrics {
  // Adds block k's figures; callers add the blocks in element order, which
  // keeps the sums' bits independent of the threads.
  void add(const BlockMetrics& k) {
    n += k.n;
    sum_abs += k.sum_abs;
    sum_d2 += k.sum_d2;
    sum_y2 += k.sum_y2;
    sum_x2 += k.sum_x2;
    sum_xy += k.sum_xy;
    max_abs_y = std::max(max_abs_y, k.max_abs_y);
    // The first block wins ties, as a serial pass's first element would.
    if (k.worst >= 0 && (worst < 0 || k.max_abs > max_abs)) {
      max_abs = k.max_abs;
      worst = k.worst;
    }
    max_ulp = std::max(max_ulp, k.max_ulp);
    min_atol = std::max(min_atol, k.min_atol);
  }

  double sum_abs = 0, sum_d2 = 0, sum_y2 = 0, sum_x2 = 0, sum_xy = 0, max_abs_y = 0;
  double max_abs = 0, max_ulp = 0, min_atol = 0;
  std::int64_t n = 0, worst = -1;
  WorstKept kept;
};

// Step 3 of compare_output: non-finite positions must match the reference's
// (an empty row's lse may be either infinity; anything else non-finite is a
// mismatch). Returns how many empty lse rows came back +inf, which passes but
// is worth a message.
int match_nonfinite(const OutputCheck& c, const std::vector<double>& got, const std::vector<double>& y,
                    ErrorSummary& summary, Metrics& m) {
  int plus_inf_rows = 0;
  for (std::int64_t i = 0; i < m.numel; ++i) {
    const double x = got[static_cast<std::size_t>(i)], r = y[static_cast<std::size_t>(i)];
    const bool xf = std::isfinite(x), rf = std::isfinite(r);
    if (xf && rf) continue;
    bool ok = false;
    if (!xf && !rf) ok = c.is_lse ? std::isinf(x) && std::isinf(r) : (std::isnan(x) == std::isnan(r) && x == r);
    if (ok && c.is_lse && x > 0) ++plus_inf_rows;
    if (!ok) {
      summary.mark_nonfinite(i);
      if (m.nonfinite_mismatches == 0) {
        m.first_nonfinite = c.layout.locate(i);
        m.message = c.name + ": " + (xf ? fmt(x) : nonfinite_kind(x)) + " where the reference has " +
                    (rf ? fmt(r) : nonfinite_kind(r)) + " at " + m.first_nonfinite.str();
      }
      ++m.nonfinite_mismatches;
    }
  }
  return plus_inf_rows;
}

// What one element pair where both are finite adds to its block.
struct ElementTerms {
  const std::vector<double>& got;
  const std::vector<double>& y;
  double rtol;
  UlpFormat ulp_fmt;
};

// Runs [q_begin, q_end) of `run` elements into k; each run's largest error
// goes to run_max[q].
void measure_runs(const ElementTerms& e, std::int64_t numel, std::int64_t run, std::int64_t q_begin,
                  std::int64_t q_end, BlockMetrics& k, std::vector<float>& run_max) {
  for (std::int64_t q = q_begin; q < q_end; ++q) {
    float cell = 0;
    for (std::int64_t i = q * run, end = std::min(numel, (q + 1) * run); i < end; ++i) {
      const double x = e.got[static_cast<std::size_t>(i)], r = e.y[static_cast<std::size_t>(i)];
      if (!std::isfinite(x) || !std::isfinite(r)) continue;
      const double d = std::fabs(x - r);
      if (const float df = static_cast<float>(d); df > cell) cell = df;
      k.kept.offer(d, i);
      ++k.n;
      k.sum_abs += d;
      k.sum_d2 += d * d;
      k.sum_y2 += r * r;
      k.sum_x2 += x * x;
      k.sum_xy += x * r;
      k.max_abs_y = std::max(k.max_abs_y, std::fabs(r));
      if (d > k.max_abs || k.worst < 0) {
        k.max_abs = d;
        k.worst = i;
      }
      k.max_ulp = std::max(k.max_ulp, d / ulp_in(r, e.ulp_fmt));
      k.min_atol = std::max(k.min_atol, d - e.rtol * std::fabs(r));
    }
    run_max[static_cast<std::size_t>(q)] = cell;
  }
}

// Step 4's pass over positions where both are finite; fills the error map
// and the kept worst elements, and returns the totals.
BlockMetrics metrics_pass(const ElementTerms& e, std::int64_t numel, ErrorSummary& summary) {
  // Runs of elements sharing an error-map cell: (token, head) rows of `dim`.
  // The pass runs over blocks of whole runs in parallel; each block sums from
  // zero and the blocks are added in element order, so the figures depend on
  // the block size alone, never on the threads (the same bits on any machine).
  const std::int64_t run = summary.run_length(numel);
  const std::int64_t runs = numel > 0 ? (numel + run - 1) / run : 0;
  const std::int64_t runs_per_block = std::max<std::int64_t>(1, kCompareBlock / run);
  const std::int64_t blocks = (runs + runs_per_block - 1) / runs_per_block;
  std::vector<BlockMetrics> bm(static_cast<std::size_t>(blocks));
  std::vector<float> run_max(static_cast<std::size_t>(runs), 0.0f);  // each run's largest error
#pragma omp parallel for schedule(dynamic, 1) if (blocks > 1)
  for (std::int64_t b = 0; b < blocks; ++b)
    measure_runs(e, numel, run, b * runs_per_block, std::min(runs, (b + 1) * runs_per_block),
                 bm[static_cast<std::size_t>(b)], run_max);
  for (std::int64_t q = 0; q < runs; ++q) {
    // A cell marked NaN (a non-finite mismatch) keeps its NaN: `>` is false.
    float& cell = summary.cell(q * run);
    if (run_max[static_cast<std::size_t>(q)] > cell) cell = run_max[static_cast<std::size_t>(q)];
  }
  BlockMetrics total;
  for (const BlockMetrics& k : bm) {
    total.add(k);
    summary.offer_all(k.kept);
  }
  return total;
}

// The figures derived from the totals; max_abs and max_ulp are NaN when no
// position had both values finite (nothing was measured).
void derive_metrics(const OutputCheck& c, const ElementTerms& e, const BlockMetrics& t, Metrics& m) {
  m.max_abs = t.max_abs;
  m.max_ulp = t.max_ulp;
  m.min_atol = t.min_atol;
  m.ref_norm = std::sqrt(t.sum_y2);
  m.out_norm = std::sqrt(t.sum_x2);
  if (t.n > 0) {
    m.mean_abs = t.sum_abs / static_cast<double>(t.n);
    m.nmse = t.sum_y2 > 0 ? t.sum_d2 / t.sum_y2 : (t.sum_d2 > 0 ? INFINITY : 0.0);
    const double denom = t.sum_x2 + t.sum_y2;
    m.cos_diff = denom > 0 ? 1.0 - 2.0 * t.sum_xy / denom : 0.0;
    // Relative error with a floor at 1% of the reference's RMS, so near-zero
    // reference elements do not dominate.
    m.rel_floor = std::max(1e-2 * std::sqrt(t.sum_y2 / static_cast<double>(t.n)), 1e-30);
    double max_rel = 0;  // a maximum: the same whatever the threads
    const double rel_floor = m.rel_floor;
    const std::vector<double>& got = e.got;
    const std::vector<double>& y = e.y;
#pragma omp parallel for schedule(static) reduction(max : max_rel) if (m.numel > (1 << 18))
    for (std::int64_t i = 0; i < m.numel; ++i) {
      const double x = got[static_cast<std::size_t>(i)], r = y[static_cast<std::size_t>(i)];
      if (std::isfinite(x) && std::isfinite(r)) max_rel = std::max(max_rel, std::fabs(x - r) / std::max(std::fabs(r), rel_floor));
    }
    m.max_rel = max_rel;
    m.worst = c.layout.locate(t.worst);
  } else {
    m.max_abs = kNaN;
    m.max_ulp = kNaN;
  }
}

// Steps 5 and 6 of compare_output, on a result with no non-finite mismatch.
Status judge(const OutputCheck& c, const Policy& p, Metrics& m) {
  // 5. The policy, on the outputs it gates.
  if (p.gates(c.name) && p.kind == Policy::Kind::kBaseline) {
    if (!std::isfinite(c.err_baseline)) throw std::logic_error("compare_output: baseline policy without err_baseline for " + c.name);
    const double limit = p.fudge * c.err_baseline + m.baseline_floor;
    if (m.max_abs > limit) {
      m.passed = false;
      m.message = c.name + ": max abs err " + fmt(m.max_abs) + " at " + m.worst.str() + " exceeds " + p.describe() +
                  ": " + fmt(p.fudge) + " x err_baseline " + fmt(c.err_baseline) + " + floor " + fmt(m.baseline_floor) +
                  " = " + fmt(limit) + " (needs fudge " + fmt(m.min_fudge) + ")";
      return Status::kIncorrect;
    }
  } else if (p.gates(c.name) && m.min_atol > p.atol) {
    m.passed = false;
    m.message = c.name + ": max abs err " + fmt(m.max_abs) + " at " + m.worst.str() + " exceeds " + p.describe() +
                " (needs atol " + fmt(m.min_atol) + ")";
    return Status::kIncorrect;
  }
  // 6. Sanity: an all-zero output cannot pass against a non-zero reference,
  // and a reference of norm 0 proves nothing.
  const bool zeros_agree = c.zero_reference_ok && m.ref_norm == 0 && m.out_norm == 0;
  if (p.gates(c.name) && !c.is_lse && (m.ref_norm == 0 || m.out_norm == 0) && !zeros_agree) {
    m.passed = false;
    m.message = c.name + ": zero norm (reference " + fmt(m.ref_norm) + ", output " + fmt(m.out_norm) + ")";
    return Status::kIncorrect;
  }
  m.passed = true;
  return Status::kPassed;
}

}  // namespace

double ulp_of(double y, DType d) { return ulp_in(y, ulp_format(d)); }

Status compare_output(const OutputCheck& c, const Policy& p, Metrics& m) {
  m = Metrics{};
  m.output = c.name;
  m.numel = shape_numel(c.expected_shape);
  // 1. Shape and dtype first: a wrong axis must not be hidden by broadcasting.
  if (c.got.shape != c.expected_shape || c.got.dtype != c.expected_dtype) {
    m.message = c.name + ": produced " + shape_str(c.got.shape) + " " + std::string(dtype_name(c.got.dtype)) +
                ", expected " + shape_str(c.expected_shape) + " " + std::string(dtype_name(c.expected_dtype));
    return Status::kIncorrect;
  }
  const std::vector<double>& y = *c.reference;
  if (static_cast<std::int64_t>(y.size()) != m.numel)
    throw std::logic_error("compare_output: golden size mismatch for " + c.name);
  const std::vector<double> got = as_f64(c.got);
  ErrorSummary summary(c.layout, m.numel, m);

  const int plus_inf_rows = match_nonfinite(c, got, y, summary, m);

  // 4. Metrics over positions where both are finite.
  // lse is a logarithm: an absolute error e scales every probability by e^e,
  // whatever lse's size, so it is judged on atol alone.
  const ElementTerms terms{got, y, c.is_lse ? 0.0 : p.rtol, ulp_format(c.expected_dtype)};
  const BlockMetrics totals = metrics_pass(terms, m.numel, summary);
  summary.finish(c.layout, got, y);
  derive_metrics(c, terms, totals, m);
  // The baseline policy's terms, and the smallest fudge that would have passed.
  m.err_baseline = c.err_baseline;
  if (std::isfinite(c.err_baseline) || p.kind == Policy::Kind::kBaseline)
    m.baseline_floor = baseline_floor(totals.max_abs_y, c.expected_dtype, c.is_lse, c.dqk);
  if (totals.n > 0 && std::isfinite(c.err_baseline)) {
    const double excess = std::max(0.0, m.max_abs - m.baseline_floor);
    m.min_fudge = excess == 0 ? 0.0 : (c.err_baseline > 0 ? excess / c.err_baseline : INFINITY);
  }

  if (m.nonfinite_mismatches > 0) {
    m.min_atol = INFINITY;
    if (std::isfinite(c.err_baseline)) m.min_fudge = INFINITY;
    m.passed = false;
    return Status::kNonfinite;
  }
  if (c.is_lse && plus_inf_rows > 0) m.message = c.name + ": " + std::to_string(plus_inf_rows) + " empty row(s) returned +inf";
  return judge(c, p, m);
}

}  // namespace mlagate
