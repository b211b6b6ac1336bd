// Comparison against the fp64 reference, SPEC: Pass rules in order: shape and
// dtype, guard bands (checked by the caller, see guarded.h), non-finite
// positions, metrics, the tolerance policy, the sanity rule, and the smallest
// tolerance that would have passed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cases/tensor.h"
#include "reports/record.h"

namespace mlagate {

// The baseline policy's default fudge, chosen from the correct backends'
// err / err_baseline on the vllm and edges suites (reference/POLICIES.md, "The fudge, from data").
inline constexpr double kDefaultFudge = 2.0;

// Tolerance policies (SPEC: Pass rules, rule 5).
struct Policy {
  enum class Kind { kVllm, kFixed, kBaseline } kind = Kind::kVllm;
  double atol = 0.5, rtol = 1e-2;
  double fudge = kDefaultFudge;  // baseline only
  std::string describe() const;  // "vllm(atol=0.5, rtol=0.01)", "baseline(fudge=2)"
  // The flags that select this policy, numbers in round-trip form: {"--policy", "vllm"} /
  // {"--policy", "fixed", "--atol", X, "--rtol", Y} / {"--policy", "baseline", "--fudge", F}.
  std::vector<std::string> cli_argv() const;
  std::string cli_args() const;  // cli_argv() joined by spaces
  // Which outputs the policy gates; the others are measured for information.
  bool gates(const std::string& output) const;
};
// "vllm": the seed test's gate, isfinite + allclose(rtol 1e-2, atol 0.5) on the
// layer output only. "fixed": allclose(rtol, atol) on every output, except lse,
// judged on atol alone (it is a log: relative error there means nothing).
// "baseline": every output passes when max abs err <= fudge * err_baseline +
// floor, err_baseline being the max abs error of the seed test's SDPA reference
// in the model dtype on the same case, op and paths (reference/sdpa_emulation.h)
// and floor the output dtype's rounding noise at the output's scale
// (baseline_floor). Throws InputError.
Policy make_policy(const std::string& name, double atol, double rtol, double fudge = kDefaultFudge);

// The baseline policy's floor. Outputs: half an ulp of the output dtype at the
// largest reference magnitude, the error of a correctly rounded result. lse is
// fp32 made of D-term fp32 dot products (the logits), so its floor is their
// worst-case fp32 rounding at lse's scale: dqk * 0.5 ulp_f32(max(1, max|lse|))
// (1.4e-4 for dqk 576 and |lse| < 8): it absorbs summation order and fast
// exp/log on GPUs (correct kernels: 1e-6), and stays 40x below the lse shift
// of a 1% softmax-scale error (5e-3 to 8e-3 on the smoke cases).
double baseline_floor(double max_abs_ref, DType out_dtype, bool is_lse, int dqk);

// Maps a flat element index to (request, token, head, dim) for messages.
struct Layout {
  std::span<const std::int32_t> query_start_loc;  // [B+1] token offsets of requests
  std::int64_t heads = 1;
  std::int64_t dim = 1;  // elements per (token, head)
  Location locate(std::int64_t flat) const;
};

struct OutputCheck {
  std::string name;          // "out", "lse", "o_lat", "o"
  TensorView got;            // as produced (declared shape and dtype)
  Shape expected_shape;
  DType expected_dtype = DType::kBF16;
  const std::vector<double>* reference = nullptr;  // same element order as expected_shape
  Layout layout;
  bool is_lse = false;       // empty rows may be +inf or -inf (FlashMLA returns +inf)
  // Baseline policy: the max abs error of the model-dtype SDPA reference on the
  // same case, op and paths (NaN when not computed), and the length of the
  // dot products behind the logits (lse floor).
  double err_baseline = kNaN;
  int dqk = 0;
  // Some rows of a case (a decode step, a request alone) may all lack keys: a
  // zero reference matched by a zero output passes there; so does a whole case
  // of seq_len-0 requests. Other cases keep the rule that a reference of norm 0
  // proves nothing.
  bool zero_reference_ok = false;
};

// Checks one output and fills Metrics (passed, message, min tolerances), and,
// in the same pass over the elements, its error summary for the HTML report:
// the (token, head) error map binned to at most kErrMapMaxRows x kErrMapMaxCols
// cells, the request boundaries and the kWorstElements largest errors (record.h).
// Returns the status this output alone would give.
Status compare_output(const OutputCheck& c, const Policy& p, Metrics& m);

// ULP of a reference value in the given dtype (bf16: 8 bits of precision, ...).
double ulp_of(double y, DType d);

}  // namespace mlagate
