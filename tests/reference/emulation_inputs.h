// What the emulation tests share (tests/reference and tests/device): the cases
// whose every form and op they emulate, and one case's inputs to the
// kernel-level ops (absorbed queries, the up-projection of every request).
#pragma once

#include <numeric>
#include <vector>

#include "cases/case.h"
#include "cases/suite.h"
#include "reference/glue.h"
#include "reference/kv_projection.h"

namespace mlagate::test {

inline std::vector<int> all_requests(const Case& c) {
  std::vector<int> r(static_cast<std::size_t>(c.num_requests));
  std::iota(r.begin(), r.end(), 0);
  return r;
}

// Every smoke case, and mixed_small with fp8 caches whose rounded keys are
// inexact (k_scale 0.01: the decode path's second implementation runs too).
inline std::vector<CaseSpec> emulation_specs() {
  std::vector<CaseSpec> specs = load_suite("smoke").cases;
  for (const char* format : {"fp8_ds_mla:raw", "fp8"}) {
    CaseSpec spec;
    spec.batch = find_batch_spec("mixed_small");
    spec.tp = 16;
    spec.kv_cache_dtype = parse_kv_cache_format(format).dtype;
    spec.scale_rule = parse_kv_cache_format(format).scale_rule;
    spec.k_scale = 0.01f;
    specs.push_back(spec);
  }
  return specs;
}

// The decode op's queries (every token absorbed) and the prefill op's K and V
// (every request projected) of one case.
struct OpInputs {
  Tensor q_lat, q_pe;
  KvProjection projection;
  explicit OpInputs(const Case& c) : projection(c) {
    std::vector<int> tokens(static_cast<std::size_t>(c.num_tokens));
    std::iota(tokens.begin(), tokens.end(), 0);
    absorb_queries(c, tokens, q_lat, q_pe);
    projection.ensure(all_requests(c));
  }
};

}  // namespace mlagate::test
