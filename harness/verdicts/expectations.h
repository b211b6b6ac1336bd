// Expected failures (VERDICTS.md): `--expect FILE` entries that name known
// failures of a backend, so that a gate fails only on what is new. A failing
// record an entry selects, with a status the entry names, is XFAIL (reported
// with the entry's reason, not a failure); a passing record an entry selects
// is XPASS (a failure when the entry is strict: the fix landed, drop the
// entry); any other failure fails as before. An entry that selected no record
// of a run that had records of its backends and ops is stale.
#pragma once

#include <cstdint>
#include <optional>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include "reports/record.h"

namespace mlagate {

// One condition of an entry's `where`: the record's fact `key` is one of
// `any_of`, lies in [min, max] (numeric facts), or matches `match`.
struct FactCondition {
  std::string key;
  std::vector<std::string> any_of;
  std::optional<double> min, max;
  std::string match;  // a regex (ECMAScript, searched), empty: none
  std::optional<std::regex> match_re;
  bool holds(const std::map<std::string, std::string>& facts) const;
  bool operator==(const FactCondition& o) const {
    return key == o.key && any_of == o.any_of && min == o.min && max == o.max && match == o.match;
  }
};

struct ExpectEntry {
  std::string id;
  std::string source;                 // "file:line" of the entry, for messages
  std::vector<std::string> backends;  // globs (backends/registry.h glob_match)
  std::vector<std::string> ops;       // empty: every op
  std::string case_regex;             // searched in the case id; empty: every case
  std::optional<std::regex> case_re;
  std::vector<FactCondition> where;   // every one must hold
  std::vector<Status> statuses;       // empty: any failure (a failing status or BATCH_VARIANT)
  // The outputs whose failure the entry expects ("lse", "o_lat", "out", "o"):
  // a record whose other outputs fail too is not this cause. Empty: any.
  std::vector<std::string> outputs;
  std::string reason, link, evidence;
  bool strict = true;

  // Backend, op, case id and every `where` condition.
  bool selects(const Record& r) const;
  // The records the entry is about, whatever their shape: its backends, ops
  // and case regex, and where `where` names any, its suites, run settings (mode, poison,
  // reference, splits, repeat) and configuration (kv, kv_format, kscale_exact,
  // k_scale, dtype, dims). Stale entries are judged against these.
  bool in_scope(const Record& r) const;
  bool expects(Status s) const;
  // expects(r.status), and r's failing outputs are among `outputs`.
  bool expects(const Record& r) const;
  bool operator==(const ExpectEntry& o) const;
};

// The entries of one or more expectations files, in the order given.
class ExpectationSet {
 public:
  ExpectationSet() = default;
  // Reads and checks the files; throws InputError naming the file, the line and
  // the field for anything malformed (wrong types, unknown keys, unknown facts,
  // statuses or ops, bad regexes, out-of-range numbers, duplicate ids).
  static ExpectationSet load(std::span<const std::string> paths);
  static ExpectationSet parse(const std::string& text, const std::string& source);

  bool empty() const { return entries_.empty(); }
  const std::vector<ExpectEntry>& entries() const { return entries_; }
  std::vector<std::string> paths() const { return paths_; }

  // Sets r.expected (XFAIL, XPASS or none) from the first entry that selects
  // r and expects its status (XFAIL), else the first that selects a passing r
  // (XPASS). Records that did not run are left alone. Uses r.facts.
  void apply(Record& r) const;

  // Per entry: the records it turned into XFAIL / XPASS, and whether it is stale.
  struct Use {
    const ExpectEntry* entry = nullptr;
    std::int64_t xfail = 0, xpass = 0;
    std::int64_t in_scope = 0;  // records of its backends and ops that ran
    bool stale() const { return xfail + xpass == 0 && in_scope > 0; }
  };
  std::vector<Use> uses(std::span<const Record> records) const;

 private:
  std::vector<ExpectEntry> entries_;
  std::vector<std::string> paths_;
};

// Whether a record ran (its status is neither SKIPPED, NOT_SUPPORTED nor INVALID_CASE).
bool record_ran(const Record& r);

// The console's lines about expectations after a run: one per entry that met
// records (its XFAIL / XPASS counts and reason), every stale entry, and what
// an XPASS means. Empty when `set` is empty.
std::string expectations_summary(const ExpectationSet& set, std::span<const Record> records);

// Entries as an expectations file (`mlagate expect --from`): parse() reads it
// back as the same entries.
std::string expectations_yaml(const std::vector<ExpectEntry>& entries, const std::string& header_comment);

}  // namespace mlagate
