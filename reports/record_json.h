// Records as single-line JSON, losslessly (NaN as null, +-inf as "inf"/"-inf"):
// the wire format between the runner and its worker processes, and the
// journal's line format (harness/reliability/journal.h). The JSON report (reports/) is a
// separate, documented document; this one only has to round-trip.
#pragma once

#include <string>

#include "reports/record.h"

namespace mlagate {

std::string record_to_json_line(const Record& r);  // one line, no trailing newline
Record record_from_json_line(const std::string& line);  // throws std::runtime_error on malformed input

}  // namespace mlagate
