// The HTML report: one self-contained file (inline CSS and JS, no network) that a kernel
// developer opens in a browser: the verdict and run info, backend x status counts, every
// record (failures first, filterable) with its repro command and, with --expect, its XFAIL /
// XPASS badge with the entry's reason and link, and per record its metrics,
// error maps (token x head, request x position) drawn by the inline script from embedded
// JSON, and its worst elements. Everything else is rendered here, so the page reads without
// JavaScript; only the maps need it.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "reports/float_base64.h"
#include "reports/html_assets.h"
#include "reports/report.h"
#include "reports/text.h"

namespace mlagate {
namespace {

using Json = nlohmann::ordered_json;

// Byte caps before escaping: the table stays readable; the record's own section has more.
constexpr std::size_t kMaxCellMessage = 300;
constexpr std::size_t kMaxDetailsText = 64 * 1024;
constexpr std::size_t kMaxField = 4096;
// Error maps are embedded for records in page order (failures first) until their base64
// reaches this many bytes, so a run of thousands of records still opens quickly.
constexpr std::size_t kMaxMapBytes = 24u << 20;

// Text for element content and attribute values alike (detail::html_text).
std::string esc(std::string_view s, std::size_t max_bytes = kMaxField) { return detail::html_text(s, max_bytes); }

std::string num(double v) { return detail::format_g(v); }

std::string loc_text(const Location& l) {
  if (l.flat < 0) return "";
  return l.str();
}

// JSON for a <script type="application/json"> element: the only way out of script data is
// "</script" (and "<!--" changes how the parser looks for it), so every '<' is written as
// the JSON escape \u003c, which JSON.parse reads back as '<'. '<' only occurs inside JSON
// strings, where the escape is valid.
std::string script_json(const Json& j) {
  const std::string text = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '<') {
      out += "\\u003c";
    } else {
      out += c;
    }
  }
  return out;
}

std::string status_class(Status s) {
  if (s == Status::kPassed) return "pass";
  if (status_is_failure(s)) return "fail";
  return "other";
}

// A record's badge class: "fail" for whatever fails the run (a strict XPASS included), "xfail"
// and "xpass" for what an --expect entry excused or noticed, else by status.
std::string record_class(const Record& r, bool require_bi) {
  if (record_fails_run(r, require_bi)) return "fail";
  if (r.expected.outcome == Expected::kXfail) return "xfail";
  if (r.expected.outcome == Expected::kXpass) return "xpass";
  return status_class(r.status);
}

// A record's badge text: its status, "XFAIL (NONFINITE)", "XPASS(strict)" or "XPASS".
std::string record_badge(const Record& r) {
  switch (r.expected.outcome) {
    case Expected::kXfail: return "XFAIL (" + std::string(status_name(r.status)) + ")";
    case Expected::kXpass: return r.expected.strict ? "XPASS(strict)" : "XPASS";
    case Expected::kNone: break;
  }
  return std::string(status_name(r.status));
}

// Failures first (strict XPASS among them), then XFAIL, then non-strict XPASS, then the rest.
int page_rank(const Record& r, bool require_bi) {
  if (record_fails_run(r, require_bi)) return 0;
  if (r.expected.outcome == Expected::kXfail) return 1;
  if (r.expected.outcome == Expected::kXpass) return 2;
  return 3;
}

// An entry's link: a link to follow when it is an http(s) URL (never another scheme, such
// as javascript:), else text.
std::string link_html(const std::string& link) {
  if (link.empty()) return "";
  if (link.rfind("https://", 0) == 0 || link.rfind("http://", 0) == 0)
    return "<a class=\"xlink\" href=\"" + esc(link) + "\" rel=\"noopener noreferrer\">" + esc(link) + "</a>";
  return "<code>" + esc(link) + "</code>";
}

// "entry: reason (link)", the words an --expect outcome is shown with.
std::string expectation_html(const Expectation& e, std::size_t max_reason) {
  std::string out = "<code>" + esc(e.entry) + "</code>: " + esc(e.reason, max_reason);
  if (!e.link.empty()) out += " (" + link_html(e.link) + ")";
  return out;
}

// The output a record's row reports: the first that failed (the message is about it), else the first.
const Metrics* headline_metrics(const Record& r) {
  if (r.metrics.empty()) return nullptr;
  const auto it = std::find_if(r.metrics.begin(), r.metrics.end(), [](const Metrics& m) { return !m.passed; });
  return it != r.metrics.end() ? &*it : &r.metrics.front();
}


void write_info(std::ostream& os, const RunInfo& run, const StatusCounts& counts) {
  const auto row = [&](const char* name, const std::string& value, bool code) {
    if (value.empty()) return;
    os << "<tr><th>" << name << "</th><td>" << (code ? "<code>" : "") << esc(value) << (code ? "</code>" : "")
       << "</td></tr>\n";
  };
  os << "<table class=\"info\">\n";
  row("tool version", run.tool_version, false);
  row("git commit", run.git_commit, true);
  row("command line", run.command_line, true);
  row("suite", run.suite, false);
  row("shard", run.shard, false);
  row("policy", run.policy, false);
  row("started at", run.started_at, false);
  row("wall time", detail::format_fixed(run.wall_seconds, 1) + " s", false);
  // (std::string("v") + ..., not "v" + ...: GCC 12 warns falsely (-Wrestrict) on the latter.)
  row("generator", std::string("v").append(std::to_string(run.generator_version)), false);
  std::string records = std::to_string(counts.total) + " records, " + std::to_string(counts.failures) + " failures";
  if (counts.xfail + counts.xpass > 0)
    records += ", " + std::to_string(counts.xfail) + " expected failures (XFAIL), " + std::to_string(counts.xpass) +
               " unexpected passes (XPASS, " + std::to_string(counts.xpass_strict) + " strict)";
  row("records", records, false);
  os << "</table>\n";
}

void write_counts(std::ostream& os, std::span<const Record> records) {
  const std::vector<BackendSummary> rows = summarize_by_backend(records);
  const StatusCounts all = count_statuses(records);
  // XFAIL and XPASS columns only when an --expect entry made something of a record.
  const bool expectations = all.xfail + all.xpass > 0;
  os << "<table class=\"counts\">\n<thead><tr><th>backend</th>";
  for (Status s : kAllStatuses) os << "<th>" << status_name(s) << "</th>";
  if (expectations) os << "<th>XFAIL</th><th>XPASS</th>";
  os << "<th>time</th></tr></thead>\n<tbody>\n";
  const auto cell = [&](std::int64_t n, const std::string& cls) {
    os << "<td class=\"n" << (n == 0 ? " zero" : "") << "\">";
    if (n > 0) os << "<span class=\"st " << cls << "\">" << n << "</span>";
    else os << 0;
    os << "</td>";
  };
  const auto row = [&](const std::string& name, const StatusCounts& c, double ms, bool total) {
    os << (total ? "<tr class=\"total\">" : "<tr>") << "<td>" << esc(name) << "</td>";
    for (Status s : kAllStatuses) cell(c[s], status_class(s));
    if (expectations) {
      cell(c.xfail, "xfail");
      cell(c.xpass, c.xpass_strict > 0 ? "fail" : "xpass");  // a strict XPASS fails the run
    }
    os << "<td class=\"n\">" << detail::format_fixed(ms / 1000.0, 3) << " s</td></tr>\n";
  };
  double total_ms = 0;
  for (const BackendSummary& b : rows) {
    row(b.backend, b.counts, b.total_ms, false);
    total_ms += b.total_ms;
  }
  row("TOTAL", all, total_ms, true);
  os << "</tbody>\n</table>\n";
}

void write_repro(std::ostream& os, const Record& r) {
  if (r.repro.empty()) return;
  os << "<code class=\"repro\">" << esc(r.repro) << "</code><button class=\"copy\" type=\"button\">copy</button>";
}

// Index i's row of the records table. data-failure: it fails the run (record_fails_run);
// data-expected: XFAIL / XPASS, for the filter.
void write_row(std::ostream& os, const Record& r, std::size_t i, bool require_bi) {
  const Metrics* m = headline_metrics(r);
  const bool expected = r.expected.outcome != Expected::kNone;
  os << "<tr data-index=\"" << i << "\" data-failure=\"" << (record_fails_run(r, require_bi) ? 1 : 0) << "\"";
  if (expected) os << " data-expected=\"" << expected_name(r.expected.outcome) << "\"";
  os << "><td class=\"n\">" << i << "</td><td class=\"id\"><a href=\"#rec-" << i << "\">" << esc(r.case_id) << "</a></td>"
     << "<td>" << esc(r.backend) << "</td><td>" << esc(r.op) << "</td>"
     << "<td class=\"st " << record_class(r, require_bi) << "\">" << record_badge(r) << "</td>"
     << "<td class=\"n\">" << (m ? num(m->max_abs) + " (" + esc(m->output) + ")" : "") << "</td><td class=\"msg\">";
  if (expected)
    os << "<div class=\"expect\">" << expectation_html(r.expected, kMaxCellMessage) << "</div>";
  os << esc(r.message, kMaxCellMessage) << "</td><td>";
  write_repro(os, r);
  os << "</td></tr>\n";
}

void write_metrics_table(std::ostream& os, const Record& r) {
  os << "<table class=\"metrics\"><thead><tr><th>output</th><th>numel</th><th>max abs</th><th>max rel</th>"
        "<th>mean abs</th><th>nmse</th><th>cos diff</th><th>max ulp</th><th>min atol</th><th>min fudge</th>"
        "<th>err_baseline</th><th>non-finite</th><th>worst at</th><th>passed</th></tr></thead><tbody>\n";
  for (const Metrics& m : r.metrics) {
    os << "<tr><td>" << esc(m.output) << "</td><td class=\"n\">" << m.numel << "</td>";
    for (double v : {m.max_abs, m.max_rel, m.mean_abs, m.nmse, m.cos_diff, m.max_ulp, m.min_atol, m.min_fudge,
                     m.err_baseline})
      os << "<td class=\"n\">" << num(v) << "</td>";
    os << "<td class=\"n\">" << m.nonfinite_mismatches << "</td><td>"
       << esc(m.nonfinite_mismatches > 0 ? "first non-finite: " + loc_text(m.first_nonfinite) : loc_text(m.worst))
       << "</td><td class=\"st " << (m.passed ? "pass\">yes" : "fail\">no") << "</td></tr>\n";
    if (!m.message.empty())
      os << "<tr><td></td><td colspan=\"13\" class=\"msg\">" << esc(m.message, kMaxDetailsText) << "</td></tr>\n";
  }
  os << "</tbody></table>\n";
}

void write_worst(std::ostream& os, const Metrics& m) {
  if (m.worst_elements.empty()) return;
  os << "<table class=\"worst\"><thead><tr><th>#</th><th>request</th><th>token</th><th>head</th><th>dim</th>"
        "<th>flat</th><th>got</th><th>expected</th><th>abs err</th></tr></thead><tbody>\n";
  const auto field = [](int v) { return v < 0 ? std::string() : std::to_string(v); };
  for (std::size_t k = 0; k < m.worst_elements.size(); ++k) {
    const WorstElement& w = m.worst_elements[k];
    os << "<tr><td class=\"n\">" << k + 1 << "</td><td class=\"n\">" << field(w.where.request)
       << "</td><td class=\"n\">" << field(w.where.token) << "</td><td class=\"n\">" << field(w.where.head)
       << "</td><td class=\"n\">" << field(w.where.dim) << "</td><td class=\"n\">" << w.where.flat
       << "</td><td class=\"n\">" << num(w.got) << "</td><td class=\"n\">" << num(w.expected)
       << "</td><td class=\"n\">" << num(w.err) << "</td></tr>\n";
  }
  os << "</tbody></table>\n";
}

// --steps: the error of every decode step as an inline SVG curve (o_lat's max
// abs error, log scale), failing steps marked red, and the first one named.
void write_step_curve(std::ostream& os, const Record& r) {
  if (r.steps.empty()) return;
  constexpr double kW = 640, kH = 140, kPad = 24;
  double lo = INFINITY, hi = 0;
  for (const StepResult& s : r.steps)
    if (std::isfinite(s.max_abs_o) && s.max_abs_o > 0) lo = std::min(lo, s.max_abs_o), hi = std::max(hi, s.max_abs_o);
  if (!(hi > 0)) lo = hi = 1;
  const double l0 = std::log10(lo), l1 = std::max(std::log10(hi), l0 + 1e-9);
  const std::size_t n = r.steps.size();
  auto x = [&](std::size_t k) { return kPad + (n > 1 ? (kW - 2 * kPad) * static_cast<double>(k) / (n - 1) : 0); };
  auto y = [&](double v) {
    if (!std::isfinite(v)) return kPad / 2;  // a non-finite mismatch: the top edge
    if (v <= 0) return kH - kPad;
    return kH - kPad - (kH - 2 * kPad) * (std::log10(v) - l0) / (l1 - l0);
  };
  const StepResult* first_bad = nullptr;
  for (const StepResult& s : r.steps)
    if (s.status != Status::kPassed && !first_bad) first_bad = &s;
  os << "<p>decode loop: " << n << " steps, o_lat max abs error per step (log scale, " << num(lo) << " to "
     << num(hi) << ")";
  if (first_bad) os << "; first failing step " << first_bad->step << " (" << status_name(first_bad->status) << ")";
  os << "</p>\n<svg class=\"steps\" width=\"" << kW << "\" height=\"" << kH << "\" role=\"img\"><polyline fill=\"none\" "
        "stroke=\"#36c\" points=\"";
  for (std::size_t k = 0; k < n; ++k) os << (k ? " " : "") << num(x(k)) << "," << num(y(r.steps[k].max_abs_o));
  os << "\"/>";
  for (std::size_t k = 0; k < n; ++k)
    if (r.steps[k].status != Status::kPassed)
      os << "<circle cx=\"" << num(x(k)) << "\" cy=\"" << num(y(r.steps[k].max_abs_o)) << "\" r=\"3\" fill=\"#c33\"/>";
  os << "</svg>\n";
}

// Index i's section; `maps` collects the embedded data of the maps it shows.
void write_section(std::ostream& os, const Record& r, std::size_t i, bool open, bool embed_maps, Json& maps,
                   bool require_bi) {
  const Metrics* hm = headline_metrics(r);
  os << "<details class=\"rec\" id=\"rec-" << i << "\"" << (open ? " open" : "") << "><summary><span class=\"st "
     << record_class(r, require_bi) << "\">" << record_badge(r) << "</span> <code>" << esc(r.case_id)
     << "</code> &middot; " << esc(r.backend) << " &middot; " << esc(r.op);
  if (hm) os << " &middot; max abs err " << num(hm->max_abs) << " (" << esc(hm->output) << ")";
  os << "</summary>\n";
  // --expect: what the entry made of the record, in its words.
  const Expectation& e = r.expected;
  if (e.outcome != Expected::kNone) {
    os << "<p class=\"expect\"><span class=\"st " << record_class(r, require_bi) << "\">" << record_badge(r)
       << "</span> expectations entry " << expectation_html(e, kMaxDetailsText) << ". ";
    if (e.outcome == Expected::kXfail)
      os << "It failed as the entry says it does: not a failure of the run.";
    else if (e.strict)
      os << "The entry says this record fails, and it did not (" << status_name(r.status)
         << "): a failure of the run, as the entry is strict. If the fix landed, remove the entry.";
    else
      os << "The entry says this record fails, and it did not (" << status_name(r.status)
         << "); the entry is not strict: a notice.";
    os << "</p>\n";
  }
  if (!r.message.empty()) os << "<p class=\"msg\">" << esc(r.message, kMaxDetailsText) << "</p>\n";
  if (!r.details.empty()) os << "<pre>" << esc(r.details, kMaxDetailsText) << "</pre>\n";
  os << "<p>";
  if (!r.mode.empty()) os << "mode " << esc(r.mode) << " &middot; ";
  os << "policy " << esc(r.policy);
  if (r.block_size > 0) os << " &middot; block size " << r.block_size;
  if (!r.paths.empty()) {
    std::string paths;
    for (const std::string& p : r.paths) paths += (paths.empty() ? "" : ",") + p;
    os << " &middot; paths " << esc(paths);
  }
  os << "</p>\n";
  if (!r.facts.empty()) {
    std::string facts;
    for (const auto& [k, v] : r.facts) facts += (facts.empty() ? "" : " ") + k + "=" + v;
    os << "<p class=\"facts\">facts: " << esc(facts) << "</p>\n";
  }
  if (!r.repro.empty()) {
    os << "<p>repro: ";
    write_repro(os, r);
    os << "</p>\n";
  }
  if (!r.metrics.empty()) write_metrics_table(os, r);
  write_step_curve(os, r);

  Json outs = Json::array();
  std::string body;
  // One output's section is open (drawn with the record's), the others on demand: the
  // first that failed (an lse can fail beside a passing out), else the first.
  auto shown = [&](const Metrics& m) {
    return (embed_maps && m.map_tokens > 0 && !m.err_token_head.empty()) || !m.worst_elements.empty();
  };
  std::size_t open_k = r.metrics.size();
  for (std::size_t k = 0; k < r.metrics.size() && open_k == r.metrics.size(); ++k)
    if (shown(r.metrics[k]) && !r.metrics[k].passed) open_k = k;
  for (std::size_t k = 0; k < r.metrics.size() && open_k == r.metrics.size(); ++k)
    if (shown(r.metrics[k])) open_k = k;
  for (std::size_t k = 0; k < r.metrics.size(); ++k) {
    const Metrics& m = r.metrics[k];
    const bool has_map = embed_maps && m.map_tokens > 0 && !m.err_token_head.empty();
    if (!shown(m)) continue;
    std::string sec = std::string("<details class=\"out\"") + (k == open_k ? " open" : "") + "><summary>" +
                      esc(m.output) + ": error map and worst elements</summary>\n";
    if (has_map) {
      const int rows = (m.map_tokens + m.token_bin - 1) / m.token_bin;
      const int cols = (m.map_heads + m.head_bin - 1) / m.head_bin;
      const std::int64_t per_cell = static_cast<std::int64_t>(m.map_tokens) * m.map_heads;
      sec += "<div class=\"mapbox\" data-rec=\"" + std::to_string(i) + "\" data-out=\"" + std::to_string(outs.size()) +
             "\"></div>\n";
      outs.push_back({{"output", m.output},
                      {"tokens", m.map_tokens},
                      {"heads", m.map_heads},
                      {"dim", per_cell > 0 ? m.numel / per_cell : 0},
                      {"token_bin", m.token_bin},
                      {"head_bin", m.head_bin},
                      {"rows", rows},
                      {"cols", cols},
                      {"query_lens", m.query_lens},
                      {"map", floats_to_base64(m.err_token_head)}});
    } else if (m.map_tokens > 0) {
      sec += "<p class=\"note\">error map left out: the report's map budget is spent</p>\n";
    }
    std::ostringstream worst;
    write_worst(worst, m);
    sec += worst.str() + "</details>\n";
    body += sec;
  }
  if (!body.empty()) os << "<div class=\"outputs\">\n" << body << "</div>\n";
  if (!outs.empty()) maps[std::to_string(i)] = std::move(outs);
  os << "</details>\n";
}

}  // namespace

void write_html(std::ostream& os, const RunInfo& run, const std::vector<Record>& records) {
  const StatusCounts counts = count_statuses(records, run);
  const std::string verdict = run.interrupted.empty() ? std::string(overall_verdict(counts)) : "INTERRUPTED";
  const std::string verdict_class = verdict == "PASS" ? "pass" : (verdict == "FAIL" ? "fail" : "other");

  // Failures first (strict XPASS among them), then XFAIL, then non-strict XPASS, then the
  // rest, each group in run order; indices in the page are positions in `records`.
  const bool require_bi = run.require_batch_invariance;
  std::vector<std::size_t> order(records.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return page_rank(records[a], require_bi) < page_rank(records[b], require_bi);
  });

  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
     << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
     << "<title>mlagate: " << verdict << "</title>\n<style>" << detail::kHtmlStyle << "</style>\n</head>\n<body>\n";
  os << "<h1>mlagate: <span class=\"verdict " << verdict_class << "\">" << verdict << "</span></h1>\n";
  if (!run.interrupted.empty())
    os << "<p class=\"banner\">Interrupted (" << esc(run.interrupted) << "): partial results.</p>\n";
  write_info(os, run, counts);

  os << "<h2>Backends</h2>\n";
  write_counts(os, records);

  os << "<h2>Records</h2>\n<div id=\"controls\"><input id=\"filter\" type=\"search\" "
        "placeholder=\"filter: any part of id, backend, op, status or message\" aria-label=\"filter records\">"
        "<label><input id=\"failures-only\" type=\"checkbox\"> failures only</label>";
  if (counts.xfail + counts.xpass > 0)
    os << "<label>expectations <select id=\"expected-filter\"><option value=\"\">any</option>"
          "<option value=\"XFAIL\">XFAIL only</option><option value=\"XPASS\">XPASS only</option></select></label>";
  os << "<span id=\"shown\"></span></div>\n"
     << "<table id=\"record-table\"><thead><tr><th>#</th><th>case</th><th>backend</th><th>op</th><th>status</th>"
        "<th>max abs err</th><th>message</th><th>repro</th></tr></thead>\n<tbody>\n";
  for (std::size_t i : order) write_row(os, records[i], i, require_bi);
  os << "</tbody></table>\n";

  os << "<h2>Per record</h2>\n<p class=\"note\">Error maps: max abs error per cell over the output's head dim, "
        "log colour scale; exact zero grey, non-finite mismatches magenta. Hover a cell for its tokens and heads.</p>\n";
  Json maps = Json::object();
  std::size_t map_bytes = 0, opened = 0;
  for (std::size_t i : order) {
    const Record& r = records[i];
    std::size_t bytes = 0;
    for (const Metrics& m : r.metrics) bytes += (m.err_token_head.size() * 4 + 2) / 3 * 4;
    const bool embed = map_bytes + bytes <= kMaxMapBytes;
    if (embed) map_bytes += bytes;
    // The first few failures open at load, so their maps are on screen without a click.
    const bool open = record_fails_run(r, require_bi) && opened < 3;
    opened += open ? 1 : 0;
    write_section(os, r, i, open, embed, maps, require_bi);
  }

  os << "<script type=\"application/json\" id=\"mlagate-data\">" << script_json(Json{{"records", std::move(maps)}})
     << "</script>\n<script>" << detail::kHtmlScript << "</script>\n</body>\n</html>\n";
}

}  // namespace mlagate
