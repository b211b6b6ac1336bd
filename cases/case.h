// A materialized case: the inputs of one CaseSpec, drawn from the generator in
// fp64 and rounded to the model dtype. The rounded values ARE the inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "cases/case_spec.h"
#include "cases/tensor.h"

namespace mlagate {

struct Case {
  CaseSpec spec;
  int num_requests = 0;  // B
  int num_tokens = 0;    // T = sum q_i
  int num_kv_tokens = 0; // S = sum s_i
  std::vector<std::int32_t> seq_lens;         // [B]
  std::vector<std::int32_t> query_lens;       // [B]
  std::vector<std::int32_t> context_lens;     // [B] c_i = s_i - q_i
  std::vector<std::int32_t> query_start_loc;  // [B+1] token offsets into q
  std::vector<std::int32_t> kv_start_loc;     // [B+1] token offsets into kv_c / k_pe

  Tensor q;     // [T, N, P+R]  model dtype (q_nope then q_pe)
  Tensor kv_c;  // [S, L]       every request's tokens, context then new, request-major
  Tensor k_pe;  // [S, R]
  Tensor w_uk;  // [L, N, P]    N(0,1)/sqrt(L)
  Tensor w_uv;  // [L, N, V]    N(0,1)/sqrt(L)
};

// Validates the spec (InvalidCase) and draws the inputs.
Case generate_case(const CaseSpec& spec);

}  // namespace mlagate
