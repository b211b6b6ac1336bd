// state.h: the checks of a search state read back by --resume.
//
// What a state holds (explore.cpp writes every key; the search and the
// reports read them back with get<>() and at(), which throw type errors on
// anything else, and trust the numbers):
//
//   schema          "mlagate-explore/1"
//   fingerprint     object (compared whole with this search's by load())
//   next_index      integer, the first case of the next round
//   elapsed_s, search_s, shrink_s, record_ms   finite numbers >= 0
//   cases           {drawn, ran, undrawable}: integers
//   records         {STATUS: integer}, STATUS a status_name()
//   coverage        {dimension: {value: integer}}
//   findings        [{name, signature, status, backend, op, count, case,
//                     case_file, shape, message, examples, shrunk?, ...}]
//   harness_errors  [{round_first_case, op (the round's ops, comma-separated), exit_code, output, ...}]
//   slowest         {ms, case}
//   profile_s       {phase: seconds}, finite numbers (optional; --profile's table)
//   done            bool
//   space_source    string (optional: main() sets it after load())
//
// What is consistent:
// - Counts are integers from 0 to 2^53 - 1 (every JSON reader keeps them
//   exactly, and adding a round's cases to one cannot overflow).
// - next_index <= cases.drawn. round() adds a round's cases to cases.drawn
//   before it runs them and main() advances next_index once the round is
//   done, so the two are equal in every state saved between rounds; but a
//   round cut short by SIGINT or SIGTERM is saved with its cases counted and
//   is drawn (and counted) again on --resume, so cases.drawn may exceed
//   next_index, by up to a round per such stop. next_index has no bound from
//   the options: --cases is not in the fingerprint (a resume may raise it).
// - cases.ran + cases.undrawable <= cases.drawn: a drawn index is undrawable
//   or a case that ran at most once (ran counts completed rounds only).
// - A finding's name is "f<i+1>" at index i (failure() names the next one
//   "f<size+1>" and writes its folder findings/f<size+1>/: a state with other
//   names would write over a finding's folder); (backend, signature) pairs
//   are distinct (failure() counts a known pair); count >= 1 and 1 to
//   min(count, 5) examples.
// - A harness error's round_first_case <= next_index (the round that failed
//   is done, or is the one cut short).
// - The times have nothing to bound them: an inflated elapsed_s spends a
//   --budget as the state says.
// Inside a finding (and its shrunk block) and a harness error, keys not
// named here are allowed: those are records that grow new keys; the known
// ones are checked. Elsewhere an unknown key is refused.
#include "harness/explore/state.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cases/errors.h"
#include "reports/record.h"

namespace mlagate {

namespace {

using Json = nlohmann::json;

constexpr long long kMaxCount = (1LL << 53) - 1;

// A hostile value, shown short: numbers and booleans as written (infinities
// as words), strings quoted and cut at 40 bytes, containers by their kind.
std::string shown(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::discarded: return "nothing";
    case Json::value_t::string: {
      const std::string& s = v.get_ref<const std::string&>();
      const bool cut = s.size() > 40;
      return Json(cut ? s.substr(0, 40) : s).dump(-1, ' ', false, Json::error_handler_t::replace) + (cut ? "..." : "");
    }
    case Json::value_t::number_float:  // not from a file (1e400 does not parse); dump() writes null
      if (!std::isfinite(v.get<double>())) return v.get<double>() > 0 ? "infinity" : "-infinity";
      return v.dump();
    default: return v.dump();
  }
}

// FIELD.key, or FIELD["key"] for a key that is no identifier.
std::string join(const std::string& field, const std::string& key) {
  bool ident = !key.empty() && key.size() <= 40 && !std::isdigit(static_cast<unsigned char>(key[0]));
  for (char c : key) ident = ident && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  if (ident) return field.empty() ? key : field + "." + key;
  return field + "[" + shown(Json(key)) + "]";
}

std::string at_index(const std::string& field, std::size_t i) { return field + "[" + std::to_string(i) + "]"; }

class Checker {
 public:
  explicit Checker(const std::string& path) : path_(path) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw InputError("explore: " + path_ + ": " + (field.empty() ? "" : field + ": ") + what);
  }
  [[noreturn]] void expected(const std::string& field, const std::string& want, const Json& got) const {
    fail(field, "expected " + want + ", got " + shown(got));
  }

  const Json& member(const Json& obj, const std::string& field, const char* key) const {
    const auto it = obj.find(key);
    if (it == obj.end()) fail(join(field, key), "missing");
    return *it;
  }

  const Json& object(const Json& v, const std::string& field) const {
    if (!v.is_object()) expected(field, "an object", v);
    return v;
  }
  const Json& array(const Json& v, const std::string& field) const {
    if (!v.is_array()) expected(field, "an array", v);
    return v;
  }
  const std::string& string(const Json& v, const std::string& field, bool nonempty = false) const {
    if (!v.is_string() || (nonempty && v.get_ref<const std::string&>().empty()))
      expected(field, nonempty ? "a non-empty string" : "a string", v);
    return v.get_ref<const std::string&>();
  }
  bool boolean(const Json& v, const std::string& field) const {
    if (!v.is_boolean()) expected(field, "true or false", v);
    return v.get<bool>();
  }
  // An integer in [lo, hi]; `hi_name` says where hi comes from.
  long long integer(const Json& v, const std::string& field, long long lo, long long hi,
                    const std::string& hi_name = "") const {
    const std::string want =
        "an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + (hi_name.empty() ? "" : " (" + hi_name + ")");
    if (v.is_number_unsigned()) {
      const std::uint64_t u = v.get<std::uint64_t>();
      if (hi < 0 || u > static_cast<std::uint64_t>(hi) || static_cast<long long>(u) < lo) expected(field, want, v);
      return static_cast<long long>(u);
    }
    if (v.is_number_integer()) {
      const long long i = v.get<long long>();
      if (i < lo || i > hi) expected(field, want, v);
      return i;
    }
    expected(field, want, v);
  }
  long long count(const Json& v, const std::string& field) const { return integer(v, field, 0, kMaxCount); }
  double finite(const Json& v, const std::string& field) const {
    if (!v.is_number() || !std::isfinite(v.get<double>())) expected(field, "a finite number", v);
    return v.get<double>();
  }
  double nonnegative(const Json& v, const std::string& field) const {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      expected(field, "a finite number >= 0", v);
    return v.get<double>();
  }

  // An array of strings (each non-empty when `nonempty`).
  const Json& strings(const Json& v, const std::string& field, bool nonempty) const {
    array(v, field);
    for (std::size_t i = 0; i < v.size(); ++i) string(v[i], at_index(field, i), nonempty);
    return v;
  }

  // Refuses the keys of `obj` not in `keys`, naming them.
  void only(const Json& obj, const std::string& field, const std::vector<const char*>& keys) const {
    std::vector<std::string> unknown;
    for (const auto& [k, v] : obj.items()) {
      bool known = false;
      for (const char* key : keys) known = known || k == key;
      if (!known) unknown.push_back(join(field, k));
    }
    if (unknown.size() == 1) fail(unknown[0], "unknown key");
    if (!unknown.empty()) {
      std::string list;
      for (std::size_t i = 0; i < unknown.size() && i < 5; ++i) list += (i ? ", " : "") + unknown[i];
      if (unknown.size() > 5) list += " and " + std::to_string(unknown.size() - 5) + " more";
      fail("", "unknown keys " + list);
    }
  }

 private:
  const std::string& path_;
};

void check_finding(const Checker& c, const Json& f, std::size_t i, std::set<std::pair<std::string, std::string>>& seen) {
  const std::string at = at_index("findings", i);
  c.object(f, at);
  const Json& name = c.member(f, at, "name");
  const std::string want_name = "f" + std::to_string(i + 1);
  if (!name.is_string() || name.get_ref<const std::string&>() != want_name)
    c.expected(join(at, "name"), "\"" + want_name + "\" (the findings in order)", name);
  const std::string& sig = c.string(c.member(f, at, "signature"), join(at, "signature"), true);
  const std::string& status = c.string(c.member(f, at, "status"), join(at, "status"));
  if (!status_from_name(status)) c.expected(join(at, "status"), "a status name such as INCORRECT", Json(status));
  const std::string& backend = c.string(c.member(f, at, "backend"), join(at, "backend"), true);
  c.string(c.member(f, at, "op"), join(at, "op"), true);
  const long long count = c.integer(c.member(f, at, "count"), join(at, "count"), 1, kMaxCount);
  for (const char* k : {"case", "case_file", "shape", "message"}) c.string(c.member(f, at, k), join(at, k));
  const std::string ex = join(at, "examples");
  const Json& examples = c.array(c.member(f, at, "examples"), ex);
  const long long max_examples = count < 5 ? count : 5;
  if (examples.empty() || static_cast<long long>(examples.size()) > max_examples)
    c.fail(ex, "expected 1 to " + std::to_string(max_examples) + " examples (count " + std::to_string(count) + ", at most 5), got " +
                   std::to_string(examples.size()));
  for (std::size_t e = 0; e < examples.size(); ++e) c.string(examples[e], at_index(ex, e));
  // failure() always writes shrunk, as {error} or as the shrink's result;
  // absent, the reports show the first case.
  if (f.contains("shrunk")) {
    const std::string sh = join(at, "shrunk");
    const Json& s = c.object(f["shrunk"], sh);
    if (s.contains("error")) {
      c.string(s["error"], join(sh, "error"));
    } else {
      for (const char* k : {"case", "shape", "status", "message", "suite_file", "bundle", "repro", "replay"})
        c.string(c.member(s, sh, k), join(sh, k));
      c.boolean(c.member(s, sh, "same"), join(sh, "same"));
      c.integer(c.member(s, sh, "runs"), join(sh, "runs"), 0, std::numeric_limits<int>::max());
    }
  }
  if (!seen.emplace(backend, sig).second)
    c.fail(at, "a second finding of backend " + shown(Json(backend)) + " and signature " + shown(Json(sig)) +
                   " (a signature is one finding per backend)");
}

// The file's kind and version, then its top-level keys: a state of another
// kind is named as such before its fields are judged.
void check_header(const Checker& c, const Json& state, const std::string& path) {
  if (!state.is_object()) c.expected("", "a JSON object (a search state)", state);
  // load()'s message for a file of another kind or another version.
  const auto schema = state.find("schema");
  if (schema == state.end() || *schema != "mlagate-explore/1" || !state.contains("fingerprint"))
    throw InputError("explore: " + path + " is not a search state of this mlagate");
  c.object(state["fingerprint"], "fingerprint");
  c.only(state, "",
         {"schema", "fingerprint", "next_index", "elapsed_s", "search_s", "shrink_s", "cases", "records", "record_ms",
          "coverage", "findings", "harness_errors", "slowest", "done", "space_source",
          // One finding per cause, and --expect (harness/verdicts/VERDICTS.md); absent in older states.
          "causes", "known", "xpass", "triage_s",
          // Where the search's time went (--profile); absent in older states.
          "profile_s"});
}

// The times, the case counts (each bounded by the one it is part of), the
// record counts and the coverage. Returns next_index, which bounds the
// harness errors' rounds.
long long check_tallies(const Checker& c, const Json& state) {
  for (const char* k : {"elapsed_s", "search_s", "shrink_s", "record_ms"}) c.nonnegative(c.member(state, "", k), k);

  const Json& cases = c.object(c.member(state, "", "cases"), "cases");
  c.only(cases, "cases", {"drawn", "ran", "undrawable"});
  const long long drawn = c.count(c.member(cases, "cases", "drawn"), "cases.drawn");
  const long long ran = c.integer(c.member(cases, "cases", "ran"), "cases.ran", 0, drawn, "cases.drawn");
  c.integer(c.member(cases, "cases", "undrawable"), "cases.undrawable", 0, drawn - ran, "cases.drawn - cases.ran");
  const long long next = c.integer(c.member(state, "", "next_index"), "next_index", 0, drawn, "cases.drawn");

  const Json& records = c.object(c.member(state, "", "records"), "records");
  for (const auto& [k, v] : records.items()) {
    if (!status_from_name(k)) c.expected("records", "status names such as PASSED as keys", Json(k));
    c.count(v, join("records", k));
  }

  const Json& coverage = c.object(c.member(state, "", "coverage"), "coverage");
  for (const auto& [dim, values] : coverage.items()) {
    const std::string at = join("coverage", dim);
    c.object(values, at);
    for (const auto& [k, v] : values.items()) c.count(v, join(at, k));
  }
  return next;
}

void check_harness_errors(const Checker& c, const Json& state, long long next) {
  const Json& errors = c.array(c.member(state, "", "harness_errors"), "harness_errors");
  for (std::size_t i = 0; i < errors.size(); ++i) {
    const std::string at = at_index("harness_errors", i);
    const Json& e = c.object(errors[i], at);
    c.integer(c.member(e, at, "round_first_case"), join(at, "round_first_case"), 0, next, "next_index");
    c.string(c.member(e, at, "op"), join(at, "op"));
    c.integer(c.member(e, at, "exit_code"), join(at, "exit_code"), std::numeric_limits<int>::min(),
              std::numeric_limits<int>::max());
    c.string(c.member(e, at, "output"), join(at, "output"));
  }
}

// slowest, done and the optional scalars.
void check_rest(const Checker& c, const Json& state) {
  const Json& slowest = c.object(c.member(state, "", "slowest"), "slowest");
  c.only(slowest, "slowest", {"ms", "case"});
  c.nonnegative(c.member(slowest, "slowest", "ms"), "slowest.ms");
  c.string(c.member(slowest, "slowest", "case"), "slowest.case");

  c.boolean(c.member(state, "", "done"), "done");
  if (state.contains("space_source")) c.string(state["space_source"], "space_source");
  if (state.contains("triage_s")) c.nonnegative(state["triage_s"], "triage_s");
  if (state.contains("profile_s")) {
    // Phase -> seconds; a run's profile has negative rows (side_by_side, ahead).
    const Json& p = c.object(state["profile_s"], "profile_s");
    for (const auto& [k, v] : p.items()) c.finite(v, join("profile_s", k));
  }
}

// causes[i]: named in order, and every finding it names exists.
void check_cause(const Checker& c, const Json& x, std::size_t i, const Json& findings) {
  const std::string at = at_index("causes", i);
  c.object(x, at);
  const Json& name = c.member(x, at, "name");
  const std::string want = "c" + std::to_string(i + 1);
  if (!name.is_string() || name.get_ref<const std::string&>() != want)
    c.expected(join(at, "name"), "\"" + want + "\" (the causes in order)", name);
  for (const char* k : {"class", "explanation"}) c.string(c.member(x, at, k), join(at, k));
  const std::string& st = c.string(c.member(x, at, "status"), join(at, "status"));
  if (!status_from_name(st)) c.expected(join(at, "status"), "a status name such as INCORRECT", Json(st));
  c.strings(c.member(x, at, "backends"), join(at, "backends"), true);
  const Json& fs = c.strings(c.member(x, at, "findings"), join(at, "findings"), true);
  for (std::size_t k = 0; k < fs.size(); ++k) {
    const std::string& fname = fs[k].get_ref<const std::string&>();
    bool exists = false;
    for (const Json& f : findings) exists = exists || f["name"] == fname;
    if (!exists) c.expected(at_index(join(at, "findings"), k), "the name of a finding", fs[k]);
  }
  c.strings(c.member(x, at, "signatures"), join(at, "signatures"), false);
  c.strings(c.member(x, at, "keys"), join(at, "keys"), false);
  c.integer(c.member(x, at, "count"), join(at, "count"), 1, kMaxCount);
  c.object(c.member(x, at, "triage"), join(at, "triage"));
  const Json& rep = c.object(c.member(x, at, "representative"), join(at, "representative"));
  for (const char* k : {"backend", "op", "case_file"}) c.string(c.member(rep, join(at, "representative"), k), join(join(at, "representative"), k), true);
}

// causes: each names findings that exist, and each finding's cause exists.
void check_causes(const Checker& c, const Json& state, const Json& findings) {
  std::set<std::string> cause_names;
  if (state.contains("causes")) {
    const Json& causes = c.array(state["causes"], "causes");
    for (std::size_t i = 0; i < causes.size(); ++i) {
      check_cause(c, causes[i], i, findings);
      cause_names.insert("c" + std::to_string(i + 1));
    }
  }
  for (std::size_t i = 0; i < findings.size(); ++i)
    if (findings[i].contains("cause")) {
      const std::string at = join(at_index("findings", i), "cause");
      const std::string& name = c.string(findings[i]["cause"], at);
      if (!cause_names.count(name)) c.expected(at, "the name of a cause in causes", findings[i]["cause"]);
    }
}

// --expect's tallies: the entries whose failures were known, and those that passed.
void check_known_and_xpass(const Checker& c, const Json& state) {
  if (state.contains("known")) {
    const Json& known = c.object(state["known"], "known");
    for (const auto& [entry, k] : known.items()) {
      const std::string at = join("known", entry);
      c.object(k, at);
      c.only(k, at, {"count", "reason", "link", "backends", "signatures"});
      c.integer(c.member(k, at, "count"), join(at, "count"), 1, kMaxCount);
      for (const char* s : {"reason", "link"}) c.string(c.member(k, at, s), join(at, s));
      c.strings(c.member(k, at, "backends"), join(at, "backends"), true);
      c.strings(c.member(k, at, "signatures"), join(at, "signatures"), false);
    }
  }
  if (state.contains("xpass")) {
    const Json& xp = c.object(state["xpass"], "xpass");
    for (const auto& [entry, x] : xp.items()) {
      const std::string at = join("xpass", entry);
      c.object(x, at);
      c.only(x, at, {"count"});
      c.integer(c.member(x, at, "count"), join(at, "count"), 1, kMaxCount);
    }
  }
}

}  // namespace

// The checks run in the file's order, so the first bad field is the one named.
void validate_explore_state(const Json& state, const std::string& path) {
  const Checker c(path);
  check_header(c, state, path);
  const long long next = check_tallies(c, state);
  const Json& findings = c.array(c.member(state, "", "findings"), "findings");
  std::set<std::pair<std::string, std::string>> seen;
  for (std::size_t i = 0; i < findings.size(); ++i) check_finding(c, findings[i], i, seen);
  check_harness_errors(c, state, next);
  check_rest(c, state);
  check_causes(c, state, findings);
  check_known_and_xpass(c, state);
}

}  // namespace mlagate
