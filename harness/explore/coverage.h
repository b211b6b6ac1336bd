// The search's coverage table (explore's report: which values of each
// dimension the cases that ran covered), apart from the search loop.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "cases/case_spec.h"
#include "cases/op.h"

namespace mlagate {

// Power-of-two bucket of a count: "0", "1", "2-3", "4-7", ...
std::string coverage_bucket(long long v);
// A number as the report shows it (the stream's shortest form).
std::string coverage_number(double v);
// Counts case `c`, run in `op` at `block_size` (0: the case's), under each
// dimension's value in `cov` ({dimension: {value: count}}).
void cover(nlohmann::json& cov, const CaseSpec& c, Op op, int block_size);

}  // namespace mlagate
