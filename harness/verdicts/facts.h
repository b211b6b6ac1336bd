// A record's facts (VERDICTS.md, "Facts"): the case's parameters and the
// run's settings as words, the one vocabulary that --expect entries select on,
// `mlagate expect --from` writes, the matrix groups by and triage reports.
// One list (fact_keys) names them all: a selector naming another key is an
// input error, never a condition that silently matches nothing.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "cases/case_spec.h"
#include "reports/record.h"

namespace mlagate {

enum class FactKind : std::uint8_t {
  kWord,    // compared as text
  kNumber,  // compared as numbers; {min, max} ranges allowed
  kBool,    // "true" or "false"
};
struct FactKey {
  std::string_view name;
  FactKind kind;
  std::string_view meaning;  // for the docs and `mlagate expect --keys`
};
// Every fact a record can carry, in the order reports list them.
std::span<const FactKey> fact_keys();
const FactKey* find_fact_key(std::string_view name);

// The run's settings that are facts of each of its records.
struct RunFacts {
  std::string poison = "nan";     // --poison
  std::string reference = "eigen";  // --reference (or "golden" for stored references)
  int splits = 0;                 // --splits (0: the backend's own choice)
  int repeat = 1;                 // --repeat (or the suite's)
};

// Whether k_scale is exact in the model dtype (a kernel that rounds the scale
// to it reads the same keys then): bf16 0.01 is not, 1 and 3 are.
bool k_scale_exact_in_model_dtype(const CaseSpec& c);
// "decode" (every request has at most one query token), "prefill" (no request
// has context), "spec_decode" (a uniform multi-token decode batch), "mixed",
// or "merge" for a merge_states case.
std::string query_kind(const CaseSpec& c);

// Which outputs of a failing record fail: "values" (o, o_lat, out; with or
// without the lse), "lse" (the lse alone) or "none". One cause rarely fails
// both ways: it groups failures (expect --from, explore's causes).
std::string failing_outputs_kind(const Record& r);
// The fp8 scale class of a record's facts: "k_scale inexact" (an fp8 or
// fp8_e4m3 cache whose per-tensor scale the model dtype cannot hold) or "k_scale
// exact or none": a kernel that rounds the scale reads the same keys then.
std::string scale_class(const std::map<std::string, std::string>& facts);

// The facts of `r`, which ran case `c` in a run with `run`'s settings.
std::map<std::string, std::string> record_facts(const CaseSpec& c, const Record& r, const RunFacts& run);

}  // namespace mlagate
