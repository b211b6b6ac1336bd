// The JSON report: the full content of every Record, for tools and later analysis,
// and its reader (mlagate merge). Keys keep their insertion order (ordered_json)
// so the file reads in the order documented here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <exception>
#include <vector>

#include <nlohmann/json.hpp>

#include "cases/errors.h"
#include "reports/float_base64.h"
#include "reports/report.h"

namespace mlagate {
namespace {

using Json = nlohmann::ordered_json;

// JSON has no NaN or infinities: NaN (a metric that was not computed) is written as null,
// and +-inf as the strings "inf" and "-inf" so that an overflow stays distinguishable from null.
Json number(double v) {
  if (std::isnan(v)) return nullptr;
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

// Location fields are -1 where they do not apply (an lse output has no dim): null in JSON.
Json location_field(std::int64_t i) { return i < 0 ? Json(nullptr) : Json(i); }

Json location(const Location& l) {
  return {{"flat", location_field(l.flat)},
          {"request", location_field(l.request)},
          {"token", location_field(l.token)},
          {"head", location_field(l.head)},
          {"dim", location_field(l.dim)}};
}

Json metrics(const Metrics& m) {
  return {
      {"output", m.output},
      {"numel", m.numel},
      {"max_abs", number(m.max_abs)},
      {"max_rel", number(m.max_rel)},
      {"rel_floor", number(m.rel_floor)},
      {"mean_abs", number(m.mean_abs)},
      {"nmse", number(m.nmse)},
      {"cos_diff", number(m.cos_diff)},
      {"max_ulp", number(m.max_ulp)},
      {"ref_norm", number(m.ref_norm)},
      {"out_norm", number(m.out_norm)},
      {"worst", location(m.worst)},
      {"nonfinite_mismatches", m.nonfinite_mismatches},
      {"first_nonfinite", location(m.first_nonfinite)},
      {"min_atol", number(m.min_atol)},
      {"min_fudge", number(m.min_fudge)},
      {"err_baseline", number(m.err_baseline)},
      {"baseline_floor", number(m.baseline_floor)},
      {"passed", m.passed},
      {"message", m.message},
  };
}

// The error summary of one output (Metrics: worst_elements always, error_map
// when the output has a map), so that a report read back (mlagate merge
// --html) draws the same maps as the run's own HTML report.
void add_error_summary(Json& j, const Metrics& m) {
  Json worst = Json::array();
  for (const WorstElement& w : m.worst_elements)
    worst.push_back({{"where", location(w.where)}, {"got", number(w.got)}, {"expected", number(w.expected)},
                     {"err", number(w.err)}});
  j["worst_elements"] = std::move(worst);
  if (m.map_tokens <= 0) return;
  j["error_map"] = {{"tokens", m.map_tokens},
                    {"heads", m.map_heads},
                    {"token_bin", m.token_bin},
                    {"head_bin", m.head_bin},
                    {"err_token_head", floats_to_base64(m.err_token_head)},
                    {"query_lens", m.query_lens}};
}

Json record(const Record& r) {
  Json all_metrics = Json::array();
  for (const Metrics& m : r.metrics) {
    Json mj = metrics(m);
    add_error_summary(mj, m);
    all_metrics.push_back(std::move(mj));
  }
  const Timings& t = r.timings;
  return {
      {"id", r.case_id},
      {"backend", r.backend},
      {"op", r.op},
      {"status", status_name(r.status)},
      {"message", r.message},
      {"policy", r.policy},
      {"block_size", r.block_size},
      {"paths", r.paths},
      {"metrics", std::move(all_metrics)},
      {"timings_ms",
       {{"generate", number(t.generate_ms)},
        {"reference", number(t.reference_ms)},
        {"cache", number(t.cache_ms)},
        {"run", number(t.run_ms)},
        {"compare", number(t.compare_ms)},
        {"baseline", number(t.baseline_ms)},
        {"glue", number(t.glue_ms)},
        {"total", number(t.total_ms)}}},
      {"repro", r.repro},
  };
}

// details (a crashed worker's stderr tail, sanitizer findings) only where there are any.
Json record_with_details(const Record& r) {
  Json j = record(r);
  if (!r.details.empty()) j["details"] = r.details;
  // Serving modes (harness/run/SERVING.md) only.
  if (!r.mode.empty()) j["mode"] = r.mode;
  // The case's facts (harness/verdicts/facts.h) and an --expect outcome, where there are any.
  if (!r.facts.empty()) j["facts"] = r.facts;
  if (r.expected.outcome != Expected::kNone)
    j["expected"] = {{"outcome", expected_name(r.expected.outcome)},
                     {"entry", r.expected.entry},
                     {"reason", r.expected.reason},
                     {"link", r.expected.link},
                     {"strict", r.expected.strict}};
  if (!r.steps.empty()) {
    Json steps = Json::array();
    for (const StepResult& s : r.steps)
      steps.push_back({{"step", s.step},
                       {"requests", s.requests},
                       {"status", status_name(s.status)},
                       {"o_max_abs", number(s.max_abs_o)},
                       {"lse_max_abs", number(s.max_abs_lse)}});
    j["steps"] = std::move(steps);
  }
  return j;
}

Json summary(const StatusCounts& counts) {
  Json j = Json::object();
  for (Status s : kAllStatuses) j[std::string(status_name(s))] = counts[s];
  // --expect: the records an entry turned into XFAIL / XPASS (not in their status's count).
  j["XFAIL"] = counts.xfail;
  j["XPASS"] = counts.xpass;
  j["total"] = counts.total;
  j["failures"] = counts.failures;
  j["verdict"] = overall_verdict(counts);
  return j;
}

// The records array as doc.dump(2) writes it at the document's top level
// ("records": [...], elements four spaces in), each record built and dumped
// on one of a few threads: a GPU suite's report is tens of megabytes, which one
// thread took a quarter of a second to write. The same bytes as one dump.
std::string records_array_text(std::span<const Record> records) {
  if (records.empty()) return "[]";
  const std::size_t n = records.size();
  const std::size_t threads = std::clamp<std::size_t>(n / 64, 1, std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  std::vector<std::string> parts(threads);
  std::vector<std::exception_ptr> errors(threads);
  auto dump_part = [&](std::size_t t) {
    try {
      std::string& out = parts[t];
      for (std::size_t i = n * t / threads; i < n * (t + 1) / threads; ++i) {
        const std::string one = record_with_details(records[i]).dump(2, ' ', false, Json::error_handler_t::replace);
        out += i == 0 ? "    " : ",\n    ";
        // Strings are escaped, so every newline of the dump is a line break of its layout.
        for (const char ch : one) {
          out += ch;
          if (ch == '\n') out += "    ";
        }
      }
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  try {
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(dump_part, t);
  } catch (const std::system_error&) {
    // Fewer threads to be had: this one dumps what was not started.
  }
  dump_part(0);
  for (std::size_t t = pool.size() + 1; t < threads; ++t) dump_part(t);
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  std::string text = "[\n";
  for (const std::string& p : parts) text += p;
  return text + "\n  ]";
}

}  // namespace

void write_json(std::ostream& os, const RunInfo& run, std::span<const Record> records) {
  Json doc = {
      {"schema", "mlagate.report"},
      {"schema_version", 1},
      {"run",
       {{"tool_version", run.tool_version},
        {"git_commit", run.git_commit},
        {"command_line", run.command_line},
        {"suite", run.suite},
        {"policy", run.policy},
        {"started_at", run.started_at},
        {"wall_seconds", number(run.wall_seconds)},
        {"generator_version", run.generator_version}}},
      {"summary", summary(count_statuses(records, run))},
      {"records", Json::array()},  // replaced by records_array_text below
  };
  if (!run.profile.empty()) {
    // After the documented keys: {"wall_ms", "phases_ms": {phase: ms, ..., "unaccounted": ms},
    // "backend_in_flight_ms", "workers_side_by_side"[, "cases_made_ahead"]}.
    Json phases = Json::object();
    for (const auto& [name, ms] : run.profile) phases[name] = number(ms);
    doc["profile"] = {{"wall_ms", number(run.profile_wall_ms)},
                      {"phases_ms", std::move(phases)},
                      {"backend_in_flight_ms", number(run.profile_backend_in_flight_ms)},
                      {"workers_side_by_side", run.profile_streams}};
    // Only where workers made cases ahead (CaseAhead): begun, and used by their jobs.
    if (run.profile_cases_ahead_begun > 0)
      doc["profile"]["cases_made_ahead"] = {{"begun", run.profile_cases_ahead_begun},
                                            {"used", run.profile_cases_ahead_used}};
  }
  // Only when set: whole runs keep the documented keys.
  if (!run.interrupted.empty()) doc["run"]["interrupted"] = run.interrupted;
  if (!run.shard.empty()) doc["run"]["shard"] = run.shard;
  if (run.require_batch_invariance) doc["run"]["require"] = Json::array({"batch-invariance"});
  // Messages from backends may hold arbitrary bytes; strict mode would throw on them.
  const std::string text = doc.dump(2, ' ', false, Json::error_handler_t::replace);
  const std::string empty = "\n  \"records\": []";  // the top level's key: nested ones are indented deeper
  const std::size_t at = text.find(empty);
  if (at == std::string::npos) throw std::logic_error("write_json: no records array in the document");
  os.write(text.data(), static_cast<std::streamsize>(at + empty.size() - 2));
  os << records_array_text(records);
  os.write(text.data() + at + empty.size(), static_cast<std::streamsize>(text.size() - at - empty.size()));
  os << '\n';
}

namespace {

// Typed access to a report's keys: a wrong or missing one is an InputError
// naming the file and the key's path.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void bad(const std::string& where, const std::string& what) const {
    throw InputError(path_ + ": " + where + ": " + what + " (not a JSON report written by mlagate run)");
  }
  const Json& at(const Json& j, const std::string& key, const std::string& where) const {
    if (!j.is_object()) bad(where, "expected an object");
    const auto it = j.find(key);
    if (it == j.end()) bad(where, "no key '" + key + "'");
    return *it;
  }
  std::string str(const Json& j, const std::string& key, const std::string& where) const {
    const Json& v = at(j, key, where);
    if (!v.is_string()) bad(where + "." + key, "expected a string");
    return v.get<std::string>();
  }
  std::int64_t integer(const Json& j, const std::string& key, const std::string& where) const {
    const Json& v = at(j, key, where);
    if (!v.is_number_integer()) bad(where + "." + key, "expected an integer");
    return v.get<std::int64_t>();
  }
  // The inverse of number(): null is NaN, "inf"/"-inf" the infinities.
  double num(const Json& j, const std::string& key, const std::string& where) const {
    const Json& v = at(j, key, where);
    if (v.is_null()) return kNaN;
    if (v.is_number()) return v.get<double>();
    if (v == "inf") return std::numeric_limits<double>::infinity();
    if (v == "-inf") return -std::numeric_limits<double>::infinity();
    bad(where + "." + key, "expected a number, null, \"inf\" or \"-inf\"");
  }
  bool boolean(const Json& j, const std::string& key, const std::string& where) const {
    const Json& v = at(j, key, where);
    if (!v.is_boolean()) bad(where + "." + key, "expected true or false");
    return v.get<bool>();
  }
  Location location(const Json& j, const std::string& where) const {
    auto field = [&](const char* k) -> std::int64_t {
      const Json& v = at(j, k, where);
      if (v.is_null()) return -1;
      if (!v.is_number_integer()) bad(where + "." + k, "expected an integer or null");
      return v.get<std::int64_t>();
    };
    Location l;
    l.flat = field("flat");
    l.request = static_cast<int>(field("request"));
    l.token = static_cast<int>(field("token"));
    l.head = static_cast<int>(field("head"));
    l.dim = static_cast<int>(field("dim"));
    return l;
  }

  Metrics metrics(const Json& j, const std::string& w) const {
    Metrics m;
    m.output = str(j, "output", w);
    m.numel = integer(j, "numel", w);
    m.max_abs = num(j, "max_abs", w);
    m.max_rel = num(j, "max_rel", w);
    m.rel_floor = num(j, "rel_floor", w);
    m.mean_abs = num(j, "mean_abs", w);
    m.nmse = num(j, "nmse", w);
    m.cos_diff = num(j, "cos_diff", w);
    m.max_ulp = num(j, "max_ulp", w);
    m.ref_norm = num(j, "ref_norm", w);
    m.out_norm = num(j, "out_norm", w);
    m.worst = location(at(j, "worst", w), w + ".worst");
    m.nonfinite_mismatches = integer(j, "nonfinite_mismatches", w);
    m.first_nonfinite = location(at(j, "first_nonfinite", w), w + ".first_nonfinite");
    m.min_atol = num(j, "min_atol", w);
    m.min_fudge = num(j, "min_fudge", w);
    m.err_baseline = num(j, "err_baseline", w);
    m.baseline_floor = num(j, "baseline_floor", w);
    m.passed = boolean(j, "passed", w);
    m.message = str(j, "message", w);
    // The error summary: optional keys (a report may predate them).
    if (j.contains("worst_elements")) {
      const Json& ws = j["worst_elements"];
      const std::string ww = w + ".worst_elements";
      if (!ws.is_array() || ws.size() > kWorstElements) bad(ww, "expected an array of at most " + std::to_string(kWorstElements) + " elements");
      for (const Json& e : ws) {
        WorstElement we;
        we.where = location(at(e, "where", ww), ww + ".where");
        we.got = num(e, "got", ww);
        we.expected = num(e, "expected", ww);
        we.err = num(e, "err", ww);
        m.worst_elements.push_back(we);
      }
    }
    if (j.contains("error_map")) error_map(j["error_map"], w + ".error_map", m);
    return m;
  }

  // Checks the map's geometry against its data, as the HTML writer trusts it.
  void error_map(const Json& e, const std::string& w, Metrics& m) const {
    auto dim = [&](const char* k, std::int64_t lo) {
      const std::int64_t v = integer(e, k, w);
      if (v < lo || v > INT32_MAX) bad(w + "." + k, "out of range");
      return static_cast<int>(v);
    };
    m.map_tokens = dim("tokens", 1);
    m.map_heads = dim("heads", 1);
    m.token_bin = dim("token_bin", 1);
    m.head_bin = dim("head_bin", 1);
    const std::int64_t rows = (std::int64_t{m.map_tokens} + m.token_bin - 1) / m.token_bin;
    const std::int64_t cols = (std::int64_t{m.map_heads} + m.head_bin - 1) / m.head_bin;
    if (rows > kErrMapMaxRows || cols > kErrMapMaxCols) bad(w, "more cells than a map has");
    try {
      m.err_token_head = floats_from_base64(str(e, "err_token_head", w));
    } catch (const std::runtime_error& ex) {
      bad(w + ".err_token_head", ex.what());
    }
    if (static_cast<std::int64_t>(m.err_token_head.size()) != rows * cols)
      bad(w + ".err_token_head", "expected " + std::to_string(rows * cols) + " cells");
    const Json& q = at(e, "query_lens", w);
    if (!q.is_array() || q.size() > kErrMapMaxRequests) bad(w + ".query_lens", "expected an array of request lengths");
    std::int64_t sum = 0;
    for (const Json& n : q) {
      if (!n.is_number_integer() || n.get<std::int64_t>() < 0 || n.get<std::int64_t>() > INT32_MAX) bad(w + ".query_lens", "expected non-negative integers");
      sum += n.get<std::int64_t>();
      m.query_lens.push_back(static_cast<std::int32_t>(n.get<std::int64_t>()));
    }
    if (sum > m.map_tokens) bad(w + ".query_lens", "more query tokens than the map has");
  }

  Record record(const Json& j, const std::string& w) const {
    Record r;
    r.case_id = str(j, "id", w);
    r.backend = str(j, "backend", w);
    r.op = str(j, "op", w);
    const std::string status = str(j, "status", w);
    const std::optional<Status> st = status_from_name(status);
    if (!st) bad(w + ".status", "unknown status '" + status + "'");
    r.status = *st;
    r.message = str(j, "message", w);
    r.policy = str(j, "policy", w);
    r.block_size = static_cast<int>(integer(j, "block_size", w));
    const Json& paths = at(j, "paths", w);
    if (!paths.is_array()) bad(w + ".paths", "expected an array");
    for (const Json& p : paths) {
      if (!p.is_string()) bad(w + ".paths", "expected strings");
      r.paths.push_back(p.get<std::string>());
    }
    const Json& ms = at(j, "metrics", w);
    if (!ms.is_array()) bad(w + ".metrics", "expected an array");
    for (std::size_t i = 0; i < ms.size(); ++i) r.metrics.push_back(metrics(ms[i], w + ".metrics[" + std::to_string(i) + "]"));
    const std::string wt = w + ".timings_ms";
    const Json& t = at(j, "timings_ms", w);
    r.timings.generate_ms = num(t, "generate", wt);
    r.timings.reference_ms = num(t, "reference", wt);
    r.timings.cache_ms = num(t, "cache", wt);
    r.timings.run_ms = num(t, "run", wt);
    r.timings.compare_ms = num(t, "compare", wt);
    r.timings.baseline_ms = num(t, "baseline", wt);
    r.timings.glue_ms = num(t, "glue", wt);
    r.timings.total_ms = num(t, "total", wt);
    r.repro = str(j, "repro", w);
    if (j.contains("details")) r.details = str(j, "details", w);
    if (j.contains("mode")) r.mode = str(j, "mode", w);
    if (j.contains("facts")) {
      const Json& f = j["facts"];
      if (!f.is_object()) bad(w + ".facts", "expected an object of strings");
      for (const auto& [k, v] : f.items()) {
        if (!v.is_string()) bad(w + ".facts." + k, "expected a string");
        r.facts[k] = v.get<std::string>();
      }
    }
    if (j.contains("expected")) {
      const Json& e = j["expected"];
      const std::string we = w + ".expected";
      const std::string outcome = str(e, "outcome", we);
      if (outcome == "XFAIL") r.expected.outcome = Expected::kXfail;
      else if (outcome == "XPASS") r.expected.outcome = Expected::kXpass;
      else bad(we + ".outcome", "expected \"XFAIL\" or \"XPASS\"");
      r.expected.entry = str(e, "entry", we);
      r.expected.reason = str(e, "reason", we);
      r.expected.link = str(e, "link", we);
      r.expected.strict = boolean(e, "strict", we);
    }
    if (j.contains("steps")) {
      const Json& steps = at(j, "steps", w);
      if (!steps.is_array()) bad(w + ".steps", "expected an array");
      for (std::size_t i = 0; i < steps.size(); ++i) {
        const std::string ws = w + ".steps[" + std::to_string(i) + "]";
        StepResult s;
        s.step = static_cast<int>(integer(steps[i], "step", ws));
        s.requests = static_cast<int>(integer(steps[i], "requests", ws));
        const std::string name = str(steps[i], "status", ws);
        const std::optional<Status> st = status_from_name(name);
        if (!st) bad(ws + ".status", "unknown status '" + name + "'");
        s.status = *st;
        s.max_abs_o = num(steps[i], "o_max_abs", ws);
        s.max_abs_lse = num(steps[i], "lse_max_abs", ws);
        r.steps.push_back(s);
      }
    }
    return r;
  }

 private:
  std::string path_;
};

}  // namespace

JsonReport read_json_report(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  const Json doc = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  const Reader rd(path);
  if (doc.is_discarded()) rd.bad("/", "not JSON");
  if (!doc.is_object() || doc.value("schema", "") != "mlagate.report") rd.bad("schema", "expected \"mlagate.report\"");
  if (rd.integer(doc, "schema_version", "/") != 1) rd.bad("schema_version", "expected 1");
  JsonReport rep;
  const Json& run = rd.at(doc, "run", "/");
  rep.run.tool_version = rd.str(run, "tool_version", "run");
  rep.run.git_commit = rd.str(run, "git_commit", "run");
  rep.run.command_line = rd.str(run, "command_line", "run");
  rep.run.suite = rd.str(run, "suite", "run");
  rep.run.policy = rd.str(run, "policy", "run");
  rep.run.started_at = rd.str(run, "started_at", "run");
  rep.run.wall_seconds = rd.num(run, "wall_seconds", "run");
  rep.run.generator_version = static_cast<int>(rd.integer(run, "generator_version", "run"));
  if (run.contains("interrupted")) rep.run.interrupted = rd.str(run, "interrupted", "run");
  if (run.contains("shard")) rep.run.shard = rd.str(run, "shard", "run");
  if (run.contains("require")) {
    const Json& req = run.at("require");
    if (!req.is_array()) rd.bad("run.require", "expected an array");
    for (const Json& x : req) {
      if (!x.is_string() || x.get<std::string>() != "batch-invariance")
        rd.bad("run.require", "expected [\"batch-invariance\"]");
      rep.run.require_batch_invariance = true;
    }
  }
  // The run's profile, where it has one (explore adds up its rounds'): the
  // phases in the file's order, each a finite number of milliseconds.
  if (doc.contains("profile")) {
    const Json& p = rd.at(doc, "profile", "/");
    rep.run.profile_wall_ms = rd.num(p, "wall_ms", "profile");
    const Json& phases = rd.at(p, "phases_ms", "profile");
    if (!phases.is_object()) rd.bad("profile.phases_ms", "expected an object");
    for (const auto& [name, ms] : phases.items()) {
      const double v = rd.num(phases, name, "profile.phases_ms");
      if (!std::isfinite(v)) rd.bad("profile.phases_ms." + name, "expected a finite number");
      rep.run.profile.emplace_back(name, v);
    }
    if (p.contains("backend_in_flight_ms")) rep.run.profile_backend_in_flight_ms = rd.num(p, "backend_in_flight_ms", "profile");
    if (p.contains("workers_side_by_side"))
      rep.run.profile_streams = static_cast<int>(rd.integer(p, "workers_side_by_side", "profile"));
  }
  const Json& records = rd.at(doc, "records", "/");
  if (!records.is_array()) rd.bad("records", "expected an array");
  for (std::size_t i = 0; i < records.size(); ++i)
    rep.records.push_back(rd.record(records[i], "records[" + std::to_string(i) + "]"));
  return rep;
}

}  // namespace mlagate
