// Comparison against the fp64 golden, MLA_SPEC section 8 in order: shape and
// dtype, guard bands (checked by the caller, see guarded.h), non-finite
// positions, metrics, the tolerance policy, the sanity rule, and the smallest
// tolerance that would have passed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cases/tensor.h"
#include "harness/record.h"

namespace mlagate {

// Tolerance policies. "baseline" arrives with the libtorch reference.
struct Policy {
  enum class Kind { kVllm, kFixed } kind = Kind::kVllm;
  double atol = 0.5, rtol = 1e-2;
  std::string describe() const;  // "vllm(atol=0.5, rtol=0.01)"
  std::string cli_args() const;  // "--policy vllm" / "--policy fixed --atol X --rtol Y"
  // Which outputs the policy gates; the others are measured for information.
  bool gates(const std::string& output) const;
};
// "vllm": the seed test's gate, isfinite + allclose(rtol 1e-2, atol 0.5) on the
// layer output only. "fixed": allclose(rtol, atol) on every output, except lse,
// judged on atol alone (it is a log: relative error there means nothing).
Policy make_policy(const std::string& name, double atol, double rtol);  // throws InputError

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
  const std::vector<double>* golden = nullptr;  // same element order as expected_shape
  Layout layout;
  bool is_lse = false;       // empty rows may be +inf or -inf (FlashMLA returns +inf)
};

// Checks one output and fills Metrics (passed, message, min tolerances).
// Returns the status this output alone would give.
Status compare_output(const OutputCheck& c, const Policy& p, Metrics& m);

// ULP of a reference value in the given dtype (bf16: 8 bits of precision, ...).
double ulp_of(double y, DType d);

}  // namespace mlagate
