// The cache_write op module (SPEC: Ops): a conformance check, bit-exact. The
// backend's cache_write and the reference writer each put a case's new tokens
// into the same cache (the backend into a copy); every byte must agree.
#pragma once

#include <string>

#include "backends/backend.h"
#include "cases/case.h"
#include "cases/paged_cache.h"

namespace mlagate {

struct CacheWriteCheck {
  bool identical = false;
  // Passed: what was checked; failed: the first differing byte as token,
  // field and element (paged_cache.h's first_cache_difference).
  std::string message;
  double run_ms = 0;  // time inside the backend's cache_write
};

// base: the case's cache without the new tokens (write_new_tokens = false).
// The backend writes into a copy; the reference writer's entries go into
// `base` itself for the comparison and are put back before the check returns
// (or throws): `base` is unchanged, bit for bit, and no second copy is made.
// Exceptions from the backend propagate (the runner records CRASHED).
CacheWriteCheck check_cache_write(Backend& b, const Case& c, PagedCache& base);

}  // namespace mlagate
