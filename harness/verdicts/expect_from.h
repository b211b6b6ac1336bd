// `mlagate expect --from REPORT.json` (VERDICTS.md, "Adopting the gate"): the
// expectations entries that make a run's failures known, one per cause
// rather than one per record, for a team that adopts the gate on today's
// kernels and wants it to fail only on what is new.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "harness/verdicts/expectations.h"
#include "reports/record.h"

namespace mlagate {

// Failures are grouped by backend, status, which outputs fail (values or the
// lse alone) and the fp8 scale class (no per-tensor scale, exact, inexact in
// the model dtype); groups of backends that fail exactly the same records the
// same way (an adapter and its cudagraph variant) are one entry. Each entry's
// `where` is the smallest set of facts, among those the group's records
// share, that selects no passing record of its backends and ops: so the entry
// is XFAIL on today's failures and XPASS on none of today's passes. Where no
// set of facts tells them apart, the entry names the failing cases' ids.
// Records without facts (reports that predate them) are skipped.
std::vector<ExpectEntry> entries_from_failures(std::span<const Record> records, const std::string& source_name);

}  // namespace mlagate
