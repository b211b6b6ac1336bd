// Hand-built Records covering every kind of result a report must render, shared by the
// report tests: a pass, an INCORRECT with metrics, a NONFINITE, a CRASHED with hostile
// characters in its message, and a NOT_SUPPORTED.
#pragma once

#include <string>
#include <vector>

#include "reports/report.h"

namespace mlagate::test {

// The CRASHED record's message: markup characters, a control character (\x01), a tab, a
// newline, an invalid UTF-8 byte (\xFF) and a valid two-byte character (U+00E9).
inline const std::string kHostileMessage =
    "kernel threw: bad <&\"'> value\x01 at\tpos\nnext line \xFF caf\xC3\xA9";

RunInfo sample_run();
std::vector<Record> sample_records();

}  // namespace mlagate::test
