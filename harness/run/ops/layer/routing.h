// The layer op's routing: each request's path (decode or prefill) on a
// backend, from its declared capabilities, as vLLM's batch reordering does.
#pragma once

#include <string>
#include <vector>

#include "backends/backend.h"
#include "cases/case_spec.h"

namespace mlagate {

// Which requests take the decode path: q_len <= reorder threshold, with
// UNIFORM decodes sharing the first decode's q_len and SINGLE_ONLY decodes
// having q_len 1; spec-decode batches raise the threshold to the longest
// query for backends that are not SINGLE_ONLY (as the seed test does).
struct Routing {
  Support support;
  std::vector<bool> is_decode;  // [B]
  // Each request's path as the layer op's records name it (OpRun::paths).
  std::vector<std::string> paths() const {
    std::vector<std::string> p;
    for (const bool dec : is_decode) p.emplace_back(dec ? "decode" : "prefill");
    return p;
  }
};
Routing route_requests(const Capabilities& caps, const CaseSpec& spec);

}  // namespace mlagate
