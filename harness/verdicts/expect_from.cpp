// entries_from_failures (expect_from.h).
#include "harness/verdicts/expect_from.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

#include "harness/verdicts/facts.h"

namespace mlagate {

namespace {

// Facts tried for an entry's `where`, the words a reader understands first;
// greedy removal drops from the end of this list first.
constexpr const char* kPreferred[] = {"kv",          "kscale_exact", "query_kind", "padding",    "partial_block", "query_rows_max",
                                      "mode",        "block_size",
                                      "dtype",       "dims",         "index_pattern", "sink",    "lse_pattern",   "q_magnitude",
                                      "k_scale",     "kv_format",    "heads",      "tp",         "total_heads",   "query_len_max",
                                      "query_len_min", "seq_len_max", "seq_len_min", "requests", "topk",          "window",
                                      "poison",      "reference",    "splits",     "repeat",     "suite",         "spec",
                                      "tokens",      "keys",         "seed"};

std::string job(const Record& r) { return r.case_id + "\n" + r.op; }

struct Group {
  std::vector<std::string> backends;
  Status status;
  std::vector<const Record*> failing;
  std::set<std::string> jobs;  // case + op of the failing records
};

std::string regex_quote(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (std::string("\\^$.|?*+()[]{}/").find(ch) != std::string::npos) out += '\\';
    out += ch;
  }
  return out;
}

// Groups the failing records by (backend, status, outputs, scale class), in
// the records' order; then backends that fail exactly the same records the
// same way share a kernel, so their groups become one (one entry).
std::vector<Group> failure_groups(std::span<const Record> records) {
  std::vector<Group> groups;
  std::map<std::string, std::size_t> at;
  for (const Record& r : records) {
    if (r.facts.empty() || !status_is_failure(r.status)) continue;
    const std::string key = r.backend + "|" + std::string(status_name(r.status)) + "|" + failing_outputs_kind(r) + "|" + scale_class(r.facts);
    auto [it, fresh] = at.emplace(key, groups.size());
    if (fresh) groups.push_back(Group{{r.backend}, r.status, {}, {}});
    Group& g = groups[it->second];
    g.failing.push_back(&r);
    g.jobs.insert(job(r));
  }
  std::vector<Group> merged;
  for (Group& g : groups) {
    bool joined = false;
    for (Group& m : merged)
      if (m.status == g.status && m.jobs == g.jobs) {
        m.backends.push_back(g.backends.front());
        m.failing.insert(m.failing.end(), g.failing.begin(), g.failing.end());
        joined = true;
        break;
      }
    if (!joined) merged.push_back(std::move(g));
  }
  return merged;
}

// Every fact the failing records share a set of values on, in kPreferred
// order. Numbers become the range the failures span (narrowed later to one
// bound where that suffices).
std::vector<FactCondition> shared_conditions(const Group& g) {
  std::vector<FactCondition> conds;
  for (const char* key : kPreferred) {
    std::set<std::string> vals;
    bool all_have = true;
    for (const Record* r : g.failing) {
      const auto it = r->facts.find(key);
      if (it == r->facts.end()) all_have = false;
      else vals.insert(it->second);
    }
    if (!all_have || vals.empty()) continue;
    FactCondition c;
    c.key = key;
    const FactKey* fk = find_fact_key(key);
    if (fk && fk->kind == FactKind::kNumber && vals.size() > 1) {
      double lo = 0, hi = 0;
      bool first = true;
      for (const std::string& v : vals) {
        const double x = std::strtod(v.c_str(), nullptr);
        lo = first ? x : std::min(lo, x);
        hi = first ? x : std::max(hi, x);
        first = false;
      }
      c.min = lo;
      c.max = hi;
    } else {
      c.any_of.assign(vals.begin(), vals.end());
    }
    conds.push_back(std::move(c));
  }
  return conds;
}

// Whether no pass meets all of cs: the entry would then expect no record
// that passes today.
bool separates(const std::vector<FactCondition>& cs, const std::vector<const Record*>& passes) {
  for (const Record* p : passes) {
    bool all = true;
    for (const FactCondition& c : cs) all = all && c.holds(p->facts);
    if (all) return false;
  }
  return true;
}

// Greedy: drop from the least readable end while the passes stay out; a
// range that must stay keeps one bound where one suffices. conds must
// separate to begin with.
std::vector<FactCondition> fewest_conditions(std::vector<FactCondition> conds, const std::vector<const Record*>& passes) {
  for (std::size_t i = conds.size(); i-- > 0;) {
    std::vector<FactCondition> fewer = conds;
    fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(i));
    if (separates(fewer, passes)) {
      conds = std::move(fewer);
      continue;
    }
    for (const bool keep_min : {true, false}) {
      if (!conds[i].min || !conds[i].max) break;
      std::vector<FactCondition> one = conds;
      (keep_min ? one[i].max : one[i].min).reset();
      if (separates(one, passes)) {
        conds = std::move(one);
        break;
      }
    }
  }
  return conds;
}

// When no facts tell today's failures from today's passes: the failing cases
// by name.
void name_the_cases(const Group& g, ExpectEntry& e) {
  std::set<std::string> ids;
  for (const Record* r : g.failing) ids.insert(r->case_id);
  std::string re = "^(";
  bool first = true;
  for (const std::string& id : ids) {
    re += (first ? "" : "|") + regex_quote(id);
    first = false;
  }
  e.case_regex = re + ")$";
  e.case_re = std::regex(e.case_regex, std::regex::ECMAScript);
}

// The entry's id (backend.status, numbered from the second of a kind on),
// reason and evidence.
void name_entry(const Group& g, const std::string& source_name, std::map<std::string, int>& id_count, ExpectEntry& e) {
  std::string base = g.backends.front();
  base += "." + std::string(status_name(g.status));
  for (char& ch : base) ch = std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' ? static_cast<char>(std::tolower(ch)) : '-';
  const int n = ++id_count[base];
  e.id = base + (n > 1 ? "-" + std::to_string(n) : "");
  const Record& first_rec = *g.failing.front();
  e.reason = "seen in " + source_name + ": " + std::to_string(g.failing.size()) + " " + std::string(status_name(g.status)) +
             " record(s) (" + failing_outputs_kind(first_rec) + " fail; " + scale_class(first_rec.facts) + "), e.g. " + first_rec.message +
             " -- say why here";
  e.evidence = first_rec.repro;
}

}  // namespace

std::vector<ExpectEntry> entries_from_failures(std::span<const Record> records, const std::string& source_name) {
  std::vector<ExpectEntry> out;
  std::map<std::string, int> id_count;
  for (const Group& g : failure_groups(records)) {
    ExpectEntry e;
    e.backends = g.backends;
    e.statuses = {g.status};
    std::set<std::string> ops;
    for (const Record* r : g.failing) ops.insert(r->op);
    e.ops.assign(ops.begin(), ops.end());
    // A cause seen in the lse alone: the entry says so (values failing too would be another cause).
    if (failing_outputs_kind(*g.failing.front()) == "lse") e.outputs = {"lse"};
    // The records the entry could turn into XPASS: passes of its backends and ops.
    std::vector<const Record*> passes;
    for (const Record& r : records)
      if (r.status == Status::kPassed && !r.facts.empty() && ops.count(r.op) &&
          std::find(e.backends.begin(), e.backends.end(), r.backend) != e.backends.end())
        passes.push_back(&r);
    std::vector<FactCondition> conds = shared_conditions(g);
    if (separates(conds, passes)) e.where = fewest_conditions(std::move(conds), passes);
    else name_the_cases(g, e);
    name_entry(g, source_name, id_count, e);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace mlagate
