// Failure signatures (EXPLORE.md): what kind of failure a record is, in
// words that do not depend on the case's size, so that one bug found at many
// shapes is one finding (per backend). A signature is the status, the op, the
// failing output and where its bad elements sit: "INCORRECT layer out: some
// heads", "NONFINITE decode o_lat: padding rows", "CRASHED decode:
// SIGSEGV".
#pragma once

#include <string>

#include "cases/case_spec.h"
#include "reports/record.h"

namespace mlagate {

// The signature of a failing record of `spec` (the case it ran).
std::string failure_signature(const Record& r, const CaseSpec& spec);

// Where an output's large errors sit, from its error map (Metrics::err_token_head
// and query_lens), the most specific of: "padding rows" (tokens of no
// request), "padding requests (seq_len 0)", "some heads", "the tail of a
// request" (its first tokens are right), "some requests", "every request".
// Empty when the map cannot say (no map).
std::string error_pattern(const Metrics& m, const CaseSpec& spec);

}  // namespace mlagate
