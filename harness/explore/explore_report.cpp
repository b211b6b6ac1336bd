// explore_report.h: derived figures, the HTML page and the console summary.
#include "harness/explore/explore_report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "reports/text.h"

namespace mlagate {

namespace {

using Json = nlohmann::json;

// Backend messages may hold any bytes: escaped as the HTML report escapes them.
std::string esc(const std::string& s) { return detail::html_text(s, 64 * 1024); }

std::string str(const Json& j, const char* key) {
  if (!j.contains(key)) return "";
  const Json& v = j[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

}  // namespace

Json explore_report(const Json& state) {
  Json r = state;
  const double search_s = state.value("search_s", 0.0);
  const long long ran = state["cases"].value("ran", 0LL);
  long long records = 0, failed = 0;
  for (const auto& [k, v] : state["records"].items()) {
    records += v.get<long long>();
    if (k != "PASSED" && k != "NOT_SUPPORTED" && k != "SKIPPED" && k != "BATCH_VARIANT") failed += v.get<long long>();
  }
  r["figures"] = {{"cases_per_s", search_s > 0 ? ran / search_s : 0.0},
                  {"wall_ms_per_case", ran > 0 ? 1000.0 * search_s / ran : 0.0},
                  {"record_ms_per_record", records > 0 ? state.value("record_ms", 0.0) / records : 0.0},
                  {"records", records},
                  {"failed_records", failed},
                  {"causes", state.contains("causes") ? state["causes"].size() : 0},
                  {"signatures", state["findings"].size()},
                  {"known_entries", state.contains("known") ? state["known"].size() : 0}};
  const bool any_failure = !state["findings"].empty() || !state["harness_errors"].empty();
  r["verdict"] = any_failure ? "FAIL" : ran > 0 ? "PASS" : "NOTHING_RAN";
  return r;
}

std::string explore_profile_text(const Json& r) {
  const double search_s = r.value("search_s", 0.0);
  const double ran = static_cast<double>(r["cases"].value("ran", 0LL));
  std::vector<std::pair<std::string, double>> rows;
  double sum = 0;
  if (r.contains("profile_s"))
    for (const auto& [phase, s] : r["profile_s"].items()) {
      rows.emplace_back(phase, s.get<double>());
      sum += s.get<double>();
    }
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::ostringstream o;
  char line[160];
  o << "profile of the search (seconds over its rounds; the runs' phases as `mlagate run --profile` names them):\n";
  std::snprintf(line, sizeof line, "%-22s %10s %9s %12s\n", "phase", "seconds", "% search", "ms per case");
  o << line;
  auto row = [&](const std::string& name, double s) {
    std::snprintf(line, sizeof line, "%-22s %10.3f %8.1f%% %12.1f\n", name.c_str(), s,
                  search_s > 0 ? 100.0 * s / search_s : 0.0, ran > 0 ? 1000.0 * s / ran : 0.0);
    o << line;
  };
  for (const auto& [phase, s] : rows) row(phase, s);
  row("rest of the wall", search_s - sum);  // 0 but for rounding: the rows above add up to it
  row("search (wall)", search_s);
  row("shrinking, beside it", r.value("shrink_s", 0.0));
  row("triage, beside it", r.value("triage_s", 0.0));
  return o.str();
}

std::string explore_summary_text(const Json& r) {
  std::ostringstream o;
  const Json& f = r["figures"];
  const Json causes = r.contains("causes") ? r["causes"] : Json::array();
  const Json known = r.contains("known") ? r["known"] : Json::object();
  char line[320];
  std::snprintf(line, sizeof line,
                "%s: %lld cases ran (%lld drawn), %lld records, %.2f cases/s, %zu cause(s) of %zu failure signature(s), "
                "%zu known (--expect), %.1f s\n",
                r["verdict"].get<std::string>().c_str(), r["cases"].value("ran", 0LL), r["cases"].value("drawn", 0LL),
                f.value("records", 0LL), f.value("cases_per_s", 0.0), causes.size(), r["findings"].size(), known.size(),
                r.value("elapsed_s", 0.0));
  o << line;
  auto finding_lines = [&](const Json& x, const char* indent) {
    o << indent << str(x, "name") << " x" << str(x, "count") << "  " << str(x, "signature") << "  (" << str(x, "backend") << ")\n";
    const Json& s = x.contains("shrunk") ? x["shrunk"] : Json::object();
    if (s.contains("shape")) o << indent << "   shrunk: " << str(s, "shape") << "\n" << indent << "   repro:  " << str(s, "repro") << "\n";
    else o << indent << "   first: " << str(x, "case") << " (" << str(x, "shape") << ")\n";
  };
  for (const Json& c : causes) {
    std::string backends;
    for (const Json& b : c["backends"]) backends += (backends.empty() ? "" : ", ") + b.get<std::string>();
    o << "  cause " << str(c, "name") << ": " << str(c, "status") << ", " << str(c, "class") << " [" << backends << "], "
      << str(c, "count") << " record(s), " << c["findings"].size() << " signature(s)\n";
    if (!str(c, "explanation").empty()) o << "     " << str(c, "explanation") << "\n";
    if (c.contains("triage") && c["triage"].contains("report") && !str(c["triage"], "report").empty())
      o << "     triage report: " << str(c["triage"], "report") << "\n";
    for (const Json& x : r["findings"])
      if (x.contains("cause") && x["cause"] == c["name"]) finding_lines(x, "     ");
  }
  for (const Json& x : r["findings"])
    if (!x.contains("cause")) finding_lines(x, "  ");
  for (const auto& [entry, k] : known.items())
    o << "  known: " << entry << " x" << str(k, "count") << " (" << str(k, "reason") << ")\n";
  if (r.contains("xpass"))
    for (const auto& [entry, x] : r["xpass"].items())
      o << "  passed although expected to fail: " << entry << " x" << str(x, "count") << " (drawn cases its entry selects)\n";
  for (const Json& e : r["harness_errors"])
    o << "  harness error: the run of a round (ops " << str(e, "op") << ") exited " << str(e, "exit_code") << "\n";
  return o.str();
}

void write_explore_html(std::ostream& os, const Json& r) {
  const Json& f = r["figures"];
  os << "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>mlagate explore</title><style>"
        "body{font:14px system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f3f3f3}"
        "code{font:12px ui-monospace,monospace;white-space:pre-wrap;word-break:break-all}.FAIL{color:#b00}.PASS{color:#070}"
        ".dims{display:flex;flex-wrap:wrap;gap:1em}.dims table{margin:0}</style></head><body>";
  const std::string verdict = r.value("verdict", "");
  os << "<h1>mlagate explore: <span class=\"" << esc(verdict) << "\">" << esc(verdict) << "</span></h1>";
  os << "<table><tr><th>backends</th><td>" << esc(str(r["fingerprint"], "backends")) << "</td></tr>"
     << "<tr><th>seed</th><td>" << esc(str(r["fingerprint"], "seed")) << "</td></tr>"
     << "<tr><th>space</th><td><code>" << esc(str(r["fingerprint"], "space")) << "</code> (" << esc(str(r, "space_source"))
     << ")</td></tr>"
     << "<tr><th>cases</th><td>" << r["cases"].value("ran", 0LL) << " ran of " << r["cases"].value("drawn", 0LL)
     << " drawn (" << r["cases"].value("undrawable", 0LL) << " undrawable)</td></tr>"
     << "<tr><th>records</th><td>" << esc(r["records"].dump()) << "</td></tr>"
     << "<tr><th>time</th><td>" << r.value("elapsed_s", 0.0) << " s (search " << r.value("search_s", 0.0) << " s, shrinking "
     << r.value("shrink_s", 0.0) << " s); " << f.value("cases_per_s", 0.0) << " cases/s, " << f.value("wall_ms_per_case", 0.0)
     << " ms per case; slowest case " << esc(str(r["slowest"], "case")) << " (" << r["slowest"].value("ms", 0.0)
     << " ms)</td></tr></table>";
  const Json causes = r.contains("causes") ? r["causes"] : Json::array();
  os << "<h2>Causes (" << causes.size() << ")</h2>";
  if (!causes.empty()) {
    os << "<table><tr><th>#</th><th>status</th><th>class</th><th>backends</th><th>records</th><th>signatures</th>"
          "<th>triage</th></tr>";
    for (const Json& c : causes) {
      std::string backends, sigs;
      for (const Json& b : c["backends"]) backends += (backends.empty() ? "" : ", ") + b.get<std::string>();
      for (std::size_t i = 0; i < c["findings"].size(); ++i)
        sigs += (i ? "<br>" : "") + esc(c["findings"][i].get<std::string>() + ": " + c["signatures"][i].get<std::string>());
      os << "<tr><td>" << esc(str(c, "name")) << "</td><td>" << esc(str(c, "status")) << "</td><td><b>" << esc(str(c, "class"))
         << "</b><br>" << esc(str(c, "explanation")) << "</td><td>" << esc(backends) << "</td><td>" << esc(str(c, "count"))
         << "</td><td>" << sigs << "</td><td>";
      if (c.contains("triage") && c["triage"].contains("variants")) {
        for (const Json& v : c["triage"]["variants"]) os << esc(str(v, "name")) << ": " << esc(str(v, "verdict")) << "<br>";
        os << "report: <code>" << esc(str(c["triage"], "report")) << "</code>";
      }
      os << "</td></tr>";
    }
    os << "</table>";
  }
  if (r.contains("known") && !r["known"].empty()) {
    os << "<h2>Known failures (--expect)</h2><table><tr><th>entry</th><th>records</th><th>reason</th><th>backends</th>"
          "<th>signatures</th></tr>";
    for (const auto& [entry, k] : r["known"].items()) {
      std::string backends, sigs;
      for (const Json& b : k["backends"]) backends += (backends.empty() ? "" : ", ") + b.get<std::string>();
      for (const Json& g : k["signatures"]) sigs += (sigs.empty() ? "" : "<br>") + esc(g.get<std::string>());
      os << "<tr><td>" << esc(entry) << "</td><td>" << esc(str(k, "count")) << "</td><td>" << esc(str(k, "reason"))
         << (str(k, "link").empty() ? "" : "<br>" + esc(str(k, "link"))) << "</td><td>" << esc(backends) << "</td><td>" << sigs
         << "</td></tr>";
    }
    os << "</table>";
  }
  os << "<h2>Failure signatures (" << r["findings"].size() << ")</h2>";
  if (!r["findings"].empty()) {
    os << "<table><tr><th>#</th><th>cause</th><th>signature</th><th>backend</th><th>count</th><th>first case</th><th>shrunk to</th></tr>";
    for (const Json& x : r["findings"]) {
      const Json& s = x.contains("shrunk") ? x["shrunk"] : Json::object();
      os << "<tr><td>" << esc(str(x, "name")) << "</td><td>" << esc(str(x, "cause")) << "</td><td>" << esc(str(x, "signature")) << "<br><code>"
         << esc(str(x, "message")) << "</code></td><td>" << esc(str(x, "backend")) << " " << esc(str(x, "op")) << "</td><td>"
         << esc(str(x, "count")) << "</td><td><code>" << esc(str(x, "case")) << "</code><br>" << esc(str(x, "shape"))
         << "</td><td>";
      if (s.contains("shape"))
        os << esc(str(s, "shape")) << "<br>" << esc(str(s, "status")) << ": <code>" << esc(str(s, "message"))
           << "</code><br>repro: <code>" << esc(str(s, "repro")) << "</code>"
           << (str(s, "replay").empty() ? "" : "<br>replay: <code>" + esc(str(s, "replay")) + "</code>");
      else
        os << esc(str(s, "error"));
      os << "</td></tr>";
    }
    os << "</table>";
  }
  if (!r["harness_errors"].empty()) {
    os << "<h2>Harness errors</h2><table><tr><th>ops</th><th>exit</th><th>output</th></tr>";
    for (const Json& e : r["harness_errors"])
      os << "<tr><td>" << esc(str(e, "op")) << "</td><td>" << esc(str(e, "exit_code")) << "</td><td><code>"
         << esc(str(e, "output")) << "</code></td></tr>";
    os << "</table>";
  }
  os << "<h2>Coverage: cases tried per dimension value</h2><div class=\"dims\">";
  for (const auto& [dim, values] : r["coverage"].items()) {
    os << "<table><tr><th colspan=2>" << esc(dim) << "</th></tr>";
    for (const auto& [v, n] : values.items()) os << "<tr><td>" << esc(v) << "</td><td>" << n.dump() << "</td></tr>";
    os << "</table>";
  }
  os << "</div></body></html>\n";
}

}  // namespace mlagate
