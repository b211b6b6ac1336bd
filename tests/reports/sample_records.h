// Hand-built Records covering every kind of result a report must render, shared by the
// report tests: [0] a pass (cpu), [1] an INCORRECT with metrics (cpu), [2] a NONFINITE,
// [3] a CRASHED with hostile characters in its message, [4] a NOT_SUPPORTED, and with --expect
// outcomes and facts: [5] an XFAIL (NONFINITE) and [6] an XFAIL (INCORRECT) of one entry with
// a link, [7] a strict XPASS and [8] a non-strict XPASS ([2] to [8] on cuda_flashmla).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "reports/report.h"

namespace mlagate::test {

// The CRASHED record's message: markup characters, a control character (\x01), a tab, a
// newline, an invalid UTF-8 byte (\xFF) and a valid two-byte character (U+00E9).
inline const std::string kHostileMessage =
    "kernel threw: bad <&\"'> value\x01 at\tpos\nnext line \xFF caf\xC3\xA9";

// The XFAIL entry's reason (markup and a pipe, which every format must escape) and link.
inline const std::string kXfailReason = "fp8 dequant overflows when |k| > 448: <Inf> becomes NaN & spreads";
inline const std::string kXfailLink = "https://github.com/example/FlashMLA/issues/42";
// Indices of the records above.
inline constexpr std::size_t kXfailNan = 5, kXfailIncorrect = 6, kXpassStrict = 7, kXpassNotice = 8;

RunInfo sample_run();
std::vector<Record> sample_records();

}  // namespace mlagate::test
