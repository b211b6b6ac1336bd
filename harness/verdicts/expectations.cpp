// Expectations files (expectations.h): parsing with every field checked,
// matching records, and writing entries back as YAML.
#include "harness/verdicts/expectations.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "backends/registry.h"
#include "cases/errors.h"
#include "cases/op.h"
#include "harness/verdicts/facts.h"

namespace mlagate {

namespace {

constexpr const char* kSchema = "mlagate.expect/1";
constexpr std::size_t kMaxFileBytes = 4u << 20;  // an expectations file is text a team writes

std::optional<double> to_number(const std::string& s) {
  double v = 0;
  const char* end = s.data() + s.size();
  const auto r = std::from_chars(s.data(), end, v);
  if (r.ec != std::errc() || r.ptr != end || !std::isfinite(v)) return std::nullopt;
  return v;
}

// Messages name the file, the entry's line and the field.
class EntryReader {
 public:
  explicit EntryReader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void bad(const YAML::Node& n, const std::string& field, const std::string& why) const {
    const YAML::Mark m = n.Mark();
    throw InputError(source_ + (m.line >= 0 ? ":" + std::to_string(m.line + 1) : std::string()) + ": " + field + ": " +
                     why);
  }
  std::string line_of(const YAML::Node& n) const {
    const YAML::Mark m = n.Mark();
    return source_ + (m.line >= 0 ? ":" + std::to_string(m.line + 1) : std::string());
  }

  std::string scalar(const YAML::Node& n, const std::string& field) const {
    if (!n.IsScalar()) bad(n, field, "expected a text value");
    return n.Scalar();
  }
  // A scalar or a list of scalars, as a list; an empty list is refused.
  std::vector<std::string> words(const YAML::Node& n, const std::string& field) const {
    std::vector<std::string> out;
    if (n.IsScalar()) out.push_back(n.Scalar());
    else if (n.IsSequence()) {
      for (std::size_t i = 0; i < n.size(); ++i) out.push_back(scalar(n[i], field + "[" + std::to_string(i) + "]"));
    } else {
      bad(n, field, "expected a value or a list of values");
    }
    if (out.empty()) bad(n, field, "expected at least one value");
    for (const std::string& w : out)
      if (w.empty()) bad(n, field, "an empty value");
    return out;
  }
  bool boolean(const YAML::Node& n, const std::string& field) const {
    const std::string s = scalar(n, field);
    if (s == "true") return true;
    if (s == "false") return false;
    bad(n, field, "expected true or false, got '" + s + "'");
  }
  double number(const YAML::Node& n, const std::string& field) const {
    const std::string s = scalar(n, field);
    const std::optional<double> v = to_number(s);
    if (!v) bad(n, field, "expected a finite number, got '" + s + "'");
    return *v;
  }
  std::regex regex(const YAML::Node& n, const std::string& field, const std::string& text) const {
    try {
      return std::regex(text, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      bad(n, field, "not a regex: " + std::string(e.what()));
    }
  }

  FactCondition condition(const std::string& at, const std::string& key, const YAML::Node& n) const {
    const std::string field = at + ".where." + key;
    const FactKey* fk = find_fact_key(key);
    if (!fk) {
      std::string known;
      for (const FactKey& k : fact_keys()) known += (known.empty() ? "" : ", ") + std::string(k.name);
      bad(n, field, "no such fact (known: " + known + ")");
    }
    FactCondition c;
    c.key = key;
    if (n.IsMap()) {
      for (const auto& kv : n) {
        const std::string k = scalar(kv.first, field);
        if (k == "min" || k == "max") {
          if (fk->kind != FactKind::kNumber) bad(kv.second, field + "." + k, "'" + key + "' is not a number: give its values");
          (k == "min" ? c.min : c.max) = number(kv.second, field + "." + k);
        } else if (k == "match") {
          c.match = scalar(kv.second, field + ".match");
          c.match_re = regex(kv.second, field + ".match", c.match);
        } else {
          bad(kv.first, field + "." + k, "unknown key (expected min, max or match)");
        }
      }
      if (!c.min && !c.max && c.match.empty()) bad(n, field, "expected min, max or match");
      if (c.min && c.max && *c.min > *c.max) bad(n, field, "min is above max");
      return c;
    }
    c.any_of = words(n, field);
    for (std::string& v : c.any_of) {
      if (fk->kind == FactKind::kNumber && !to_number(v)) bad(n, field, "'" + key + "' is a number, got '" + v + "'");
      if (fk->kind == FactKind::kBool && v != "true" && v != "false")
        bad(n, field, "'" + key + "' is true or false, got '" + v + "'");
    }
    return c;
  }

  ExpectEntry entry(const YAML::Node& n, std::size_t index) const {
    const std::string at = "expect[" + std::to_string(index) + "]";
    if (!n.IsMap()) bad(n, at, "expected a map (id, backend, reason, ...)");
    ExpectEntry e;
    e.source = line_of(n);
    bool has_backend = false;
    for (const auto& kv : n) {
      const std::string key = scalar(kv.first, at);
      const YAML::Node& v = kv.second;
      const std::string field = at + "." + key;
      if (key == "id") e.id = scalar(v, field);
      else if (key == "backend") {
        e.backends = words(v, field);
        has_backend = true;
      } else if (key == "op") {
        e.ops = words(v, field);
        for (const std::string& op : e.ops) {
          try {
            parse_op(op);
          } catch (const InputError& ex) {
            bad(v, field, ex.what());
          }
        }
      } else if (key == "case") {
        e.case_regex = scalar(v, field);
        e.case_re = regex(v, field, e.case_regex);
      } else if (key == "where") {
        if (!v.IsMap()) bad(v, field, "expected a map of facts to values");
        std::set<std::string> seen;
        for (const auto& c : v) {
          const std::string fact = scalar(c.first, field);
          if (!seen.insert(fact).second) bad(c.first, field + "." + fact, "given twice");
          e.where.push_back(condition(at, fact, c.second));
        }
      } else if (key == "status") {
        const std::vector<std::string> names = words(v, field);
        if (names.size() == 1 && names[0] == "any") continue;
        for (const std::string& s : names) {
          const std::optional<Status> st = status_from_name(s);
          if (!st) bad(v, field, "unknown status '" + s + "' (a failing status, BATCH_VARIANT, or any)");
          if (!status_is_failure(*st) && *st != Status::kBatchVariant)
            bad(v, field, s + " is not a failure: an entry expects INCORRECT, NONFINITE, CRASHED, TIMEOUT, "
                              "INVALID_CASE, NONDETERMINISTIC or BATCH_VARIANT");
          e.statuses.push_back(*st);
        }
      } else if (key == "outputs") {
        e.outputs = words(v, field);
        for (const std::string& o : e.outputs)
          if (o != "lse" && o != "o_lat" && o != "out" && o != "o")
            bad(v, field, "unknown output '" + o + "' (expected lse, o_lat, out or o)");
      } else if (key == "reason") e.reason = scalar(v, field);
      else if (key == "link") e.link = scalar(v, field);
      else if (key == "evidence") e.evidence = scalar(v, field);
      else if (key == "strict") e.strict = boolean(v, field);
      else bad(kv.first, field, "unknown key (expected id, backend, op, case, where, status, outputs, reason, link, evidence, strict)");
    }
    if (e.id.empty()) bad(n, at + ".id", "required (a name for the entry: letters, digits, '.', '_', '-')");
    for (char ch : e.id)
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_' && ch != '-')
        bad(n, at + ".id", "'" + e.id + "': use letters, digits, '.', '_' and '-'");
    if (!has_backend) bad(n, at + ".backend", "required (backend names or globs)");
    if (e.reason.empty()) bad(n, at + ".reason", "required (why it fails: what a reader of the report is told)");
    return e;
  }

 private:
  std::string source_;
};

bool matches_any_glob(const std::vector<std::string>& globs, const std::string& name) {
  for (const std::string& g : globs)
    if (glob_match(g, name)) return true;
  return false;
}

bool holds_all(const std::vector<FactCondition>& where, const std::map<std::string, std::string>& facts) {
  for (const FactCondition& c : where)
    if (!c.holds(facts)) return false;
  return true;
}

// YAML double-quoted text: every string an entry holds reads back as itself.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (ch < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", ch);
          out += buf;
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

std::string list(const std::vector<std::string>& v) {
  if (v.size() == 1) return quoted(v[0]);
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + quoted(v[i]);
  return out + "]";
}

}  // namespace

bool FactCondition::holds(const std::map<std::string, std::string>& facts) const {
  const auto it = facts.find(key);
  if (it == facts.end()) return false;
  const std::string& v = it->second;
  const FactKey* fk = find_fact_key(key);
  const bool numeric = fk && fk->kind == FactKind::kNumber;
  if (min || max) {
    const std::optional<double> x = to_number(v);
    if (!x || (min && *x < *min) || (max && *x > *max)) return false;
  }
  if (match_re && !std::regex_search(v, *match_re)) return false;
  if (!any_of.empty()) {
    bool found = false;
    for (const std::string& a : any_of) {
      if (numeric) {
        const std::optional<double> x = to_number(v), y = to_number(a);
        found = found || (x && y && *x == *y);
      } else {
        found = found || a == v;
      }
    }
    if (!found) return false;
  }
  return true;
}

bool ExpectEntry::selects(const Record& r) const {
  if (!matches_any_glob(backends, r.backend)) return false;
  if (!ops.empty() && std::find(ops.begin(), ops.end(), r.op) == ops.end()) return false;
  if (case_re && !std::regex_search(r.case_id, *case_re)) return false;
  return holds_all(where, r.facts);
}

bool ExpectEntry::in_scope(const Record& r) const {
  if (!matches_any_glob(backends, r.backend)) return false;
  if (!ops.empty() && std::find(ops.begin(), ops.end(), r.op) == ops.end()) return false;
  // The conditions on what the run was (its suite and settings) and on the
  // configuration the bug lives in (cache format, scale, dtypes, dims), not
  // those on the case's shape (its trigger): a run without the configuration
  // did not exercise the entry; one with it that never met the trigger did.
  // An entry pinned to case ids is about those cases alone.
  if (case_re && !std::regex_search(r.case_id, *case_re)) return false;
  static const std::set<std::string> kScope = {"suite", "mode",      "poison",       "reference", "splits", "repeat",
                                               "kv",    "kv_format", "kscale_exact", "k_scale",   "dtype",  "dims"};
  for (const FactCondition& c : where)
    if (kScope.count(c.key) && !c.holds(r.facts)) return false;
  return true;
}

bool ExpectEntry::expects(Status s) const {
  if (statuses.empty()) return status_is_failure(s) || s == Status::kBatchVariant;
  return std::find(statuses.begin(), statuses.end(), s) != statuses.end();
}

bool ExpectEntry::expects(const Record& r) const {
  if (!expects(r.status)) return false;
  if (outputs.empty()) return true;
  for (const Metrics& m : r.metrics)
    if (!m.passed && m.output != "quant_error" && std::find(outputs.begin(), outputs.end(), m.output) == outputs.end())
      return false;
  return true;
}

bool ExpectEntry::operator==(const ExpectEntry& o) const {
  return id == o.id && backends == o.backends && ops == o.ops && case_regex == o.case_regex && where == o.where &&
         statuses == o.statuses && outputs == o.outputs && reason == o.reason && link == o.link && evidence == o.evidence &&
         strict == o.strict;
}

bool record_ran(const Record& r) {
  return r.status != Status::kSkipped && r.status != Status::kNotSupported && r.status != Status::kInvalidCase;
}

ExpectationSet ExpectationSet::parse(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InputError(source + ":" + std::to_string(e.mark.line + 1) + ": YAML syntax error: " + e.msg);
  }
  const EntryReader rd(source);
  if (!root.IsMap())
    throw InputError(source + ": an expectations file is a YAML map: schema: " + std::string(kSchema) + " and expect: [...]");
  ExpectationSet set;
  bool has_schema = false;
  for (const auto& kv : root) {
    const std::string key = rd.scalar(kv.first, "top level");
    if (key == "schema") {
      const std::string s = rd.scalar(kv.second, "schema");
      if (s != kSchema) rd.bad(kv.second, "schema", "expected " + std::string(kSchema) + ", got '" + s + "'");
      has_schema = true;
    } else if (key == "description") {
      rd.scalar(kv.second, "description");
    } else if (key == "expect") {
      const YAML::Node& list = kv.second;
      if (list.IsNull()) continue;
      if (!list.IsSequence()) rd.bad(list, "expect", "expected a list of entries");
      for (std::size_t i = 0; i < list.size(); ++i) set.entries_.push_back(rd.entry(list[i], i));
    } else {
      rd.bad(kv.first, key, "unknown key (expected schema, description, expect)");
    }
  }
  if (!has_schema) throw InputError(source + ": schema: required (" + std::string(kSchema) + ")");
  std::set<std::string> ids;
  for (const ExpectEntry& e : set.entries_)
    if (!ids.insert(e.id).second) throw InputError(e.source + ": id: '" + e.id + "' is given twice");
  set.paths_.push_back(source);
  return set;
}

ExpectationSet ExpectationSet::load(std::span<const std::string> paths) {
  ExpectationSet all;
  std::map<std::string, std::string> where_id;  // id -> the entry that has it
  for (const std::string& p : paths) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw InputError("--expect " + p + ": cannot read the file");
    std::string text;
    char buf[65536];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) {
      text.append(buf, static_cast<std::size_t>(in.gcount()));
      if (text.size() > kMaxFileBytes) throw InputError("--expect " + p + ": larger than 4 MiB: not an expectations file");
    }
    ExpectationSet one = parse(text, p);
    for (ExpectEntry& e : one.entries_) {
      const auto [it, fresh] = where_id.emplace(e.id, e.source);
      if (!fresh) throw InputError(e.source + ": id: '" + e.id + "' is also the id of the entry at " + it->second);
      all.entries_.push_back(std::move(e));
    }
    all.paths_.push_back(p);
  }
  return all;
}

void ExpectationSet::apply(Record& r) const {
  r.expected = {};
  if (!record_ran(r)) return;
  const bool passed = r.status == Status::kPassed;
  const ExpectEntry* xpass = nullptr;
  for (const ExpectEntry& e : entries_) {
    if (!e.selects(r)) continue;
    if (!passed && e.expects(r)) {
      r.expected = {Expected::kXfail, e.id, e.reason, e.link, e.strict};
      return;
    }
    if (passed && !xpass) xpass = &e;
  }
  if (xpass) r.expected = {Expected::kXpass, xpass->id, xpass->reason, xpass->link, xpass->strict};
}

std::vector<ExpectationSet::Use> ExpectationSet::uses(std::span<const Record> records) const {
  std::vector<Use> out;
  std::map<std::string, std::size_t> at;
  for (const ExpectEntry& e : entries_) {
    at[e.id] = out.size();
    out.push_back(Use{&e});
  }
  for (const Record& r : records) {
    if (!record_ran(r)) continue;
    for (Use& u : out) u.in_scope += u.entry->in_scope(r) ? 1 : 0;
    if (r.expected.outcome == Expected::kNone) continue;
    const auto it = at.find(r.expected.entry);
    if (it == at.end()) continue;  // a record annotated by another run's entries (merge without --expect)
    (r.expected.outcome == Expected::kXfail ? out[it->second].xfail : out[it->second].xpass) += 1;
  }
  return out;
}

std::string expectations_summary(const ExpectationSet& set, std::span<const Record> records) {
  if (set.empty()) return "";
  std::ostringstream os;
  std::int64_t xfail = 0, xpass = 0, stale = 0;
  for (const ExpectationSet::Use& u : set.uses(records)) {
    xfail += u.xfail;
    xpass += u.xpass;
    if (u.xfail + u.xpass > 0) {
      os << "expected: " << u.entry->id << ": " << u.xfail << " XFAIL";
      if (u.xpass) os << ", " << u.xpass << " XPASS" << (u.entry->strict ? " (strict: fails the run)" : " (not strict)");
      os << "\n  " << u.entry->reason << "\n";
      if (!u.entry->link.empty()) os << "  " << u.entry->link << "\n";
      if (u.xpass && u.entry->strict)
        os << "  XPASS: records this entry expects to fail passed; if the fix landed, drop or narrow the entry ("
           << u.entry->source << ")\n";
    } else if (u.stale()) {
      ++stale;
      os << "stale expectation: " << u.entry->id << " (" << u.entry->source << ") selected none of the " << u.in_scope
         << " records of its backends and ops\n";
    }
  }
  os << "expectations: " << set.entries().size() << " entries from " << set.paths().size() << " file(s): " << xfail
     << " XFAIL, " << xpass << " XPASS, " << stale << " stale\n";
  return os.str();
}

std::string expectations_yaml(const std::vector<ExpectEntry>& entries, const std::string& header_comment) {
  std::ostringstream os;
  std::istringstream lines(header_comment);
  for (std::string l; std::getline(lines, l);) os << "# " << l << "\n";
  os << "schema: " << kSchema << "\nexpect:\n";
  if (entries.empty()) os << "  []\n";
  for (const ExpectEntry& e : entries) {
    os << "  - id: " << quoted(e.id) << "\n";
    os << "    backend: " << list(e.backends) << "\n";
    if (!e.ops.empty()) os << "    op: " << list(e.ops) << "\n";
    if (!e.case_regex.empty()) os << "    case: " << quoted(e.case_regex) << "\n";
    if (!e.where.empty()) {
      os << "    where:\n";
      for (const FactCondition& c : e.where) {
        os << "      " << c.key << ": ";
        if (!c.any_of.empty()) {
          os << list(c.any_of) << "\n";
          continue;
        }
        std::string parts;
        if (c.min) parts += "min: " + exact_number(*c.min);
        if (c.max) parts += (parts.empty() ? "" : ", ") + std::string("max: ") + exact_number(*c.max);
        if (!c.match.empty()) parts += (parts.empty() ? "" : ", ") + std::string("match: ") + quoted(c.match);
        os << "{" << parts << "}\n";
      }
    }
    std::vector<std::string> st;
    for (Status s : e.statuses) st.emplace_back(status_name(s));
    os << "    status: " << (st.empty() ? std::string("any") : list(st)) << "\n";
    if (!e.outputs.empty()) os << "    outputs: " << list(e.outputs) << "\n";
    os << "    reason: " << quoted(e.reason) << "\n";
    if (!e.link.empty()) os << "    link: " << quoted(e.link) << "\n";
    if (!e.evidence.empty()) os << "    evidence: " << quoted(e.evidence) << "\n";
    if (!e.strict) os << "    strict: false\n";
  }
  return os.str();
}

}  // namespace mlagate
