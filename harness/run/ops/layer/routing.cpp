// Which requests of a batch take the decode path on a backend (vLLM's reorder
// by threshold), and why a backend cannot run the layer op at all.
#include "harness/run/ops/layer/routing.h"

#include <algorithm>
#include <string>

namespace mlagate {

Routing route_requests(const Capabilities& caps, const CaseSpec& spec) {
  Routing r;
  const auto& q = spec.batch.query_lens;
  const bool has_decode = std::find(caps.ops.begin(), caps.ops.end(), Op::kDecode) != caps.ops.end();
  const bool has_prefill = std::find(caps.ops.begin(), caps.ops.end(), Op::kPrefill) != caps.ops.end();
  int threshold = caps.reorder_threshold;
  if (spec.batch.spec_decode) {
    if (caps.query_len_support == QueryLenSupport::kSingleOnly) {
      r.support = Support::no("spec decode needs QueryLenSupport UNIFORM or VARLEN (decode kernel is SINGLE_ONLY)");
      return r;
    }
    threshold = std::max(threshold, *std::max_element(q.begin(), q.end()));
  }
  if (!has_decode) threshold = 0;
  int uniform_len = -1;
  for (std::size_t i = 0; i < q.size(); ++i) {
    bool dec = q[i] <= threshold;
    if (dec && caps.query_len_support == QueryLenSupport::kSingleOnly) dec = q[i] == 1;
    if (dec && caps.query_len_support == QueryLenSupport::kUniform) {
      if (uniform_len < 0) uniform_len = q[i];
      dec = q[i] == uniform_len;
    }
    r.is_decode.push_back(dec);
  }
  for (std::size_t i = 0; i < q.size(); ++i)
    if (!r.is_decode[i] && !has_prefill) {
      r.support = Support::no("request " + std::to_string(i) + " (query_len " + std::to_string(q[i]) +
                              ") takes the prefill path and the backend has no prefill kernel");
      return r;
    }
  return r;
}

}  // namespace mlagate
