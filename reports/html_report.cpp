// The HTML report: one self-contained file (inline CSS and JS, no network) that a kernel
// developer opens in a browser: the verdict and run info, backend x status counts, every
// record (failures first, filterable) with its repro command, and per record its metrics,
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

// The output a record's row reports: the first that failed (the message is about it), else the first.
const Metrics* headline_metrics(const Record& r) {
  if (r.metrics.empty()) return nullptr;
  const auto it = std::find_if(r.metrics.begin(), r.metrics.end(), [](const Metrics& m) { return !m.passed; });
  return it != r.metrics.end() ? &*it : &r.metrics.front();
}

constexpr const char* kStyle = R"css(
:root { --fail: #b3261e; --pass: #1e7b34; --other: #6b6b6b; --line: #d8d8d8; --bg2: #f6f6f6; }
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em; color: #1b1b1b; }
h1 { font-size: 1.6em; margin: 0 0 .4em; }
h2 { font-size: 1.25em; margin: 1.4em 0 .5em; border-bottom: 1px solid var(--line); }
h4 { margin: .8em 0 .3em; }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12.5px; }
pre { background: var(--bg2); padding: .5em; overflow-x: auto; white-space: pre-wrap; }
table { border-collapse: collapse; margin: .3em 0; }
th, td { border: 1px solid var(--line); padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: var(--bg2); }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.verdict { padding: 0 .3em; border-radius: 3px; color: white; }
.verdict.pass { background: var(--pass); } .verdict.fail { background: var(--fail); }
.verdict.other { background: var(--other); }
.st.pass { color: var(--pass); } .st.fail { color: var(--fail); font-weight: bold; } .st.other { color: var(--other); }
.banner { background: #fff3cd; border: 1px solid #e0c060; padding: .4em .6em; }
table.info th { width: 9em; }
tr.total td { font-weight: bold; }
td.zero { color: #b0b0b0; }
#controls { margin: .4em 0; display: flex; gap: 1em; align-items: center; flex-wrap: wrap; }
#filter { width: 32em; max-width: 90vw; padding: 3px 5px; }
code.repro { user-select: all; word-break: break-all; }
button.copy { font-size: 11px; margin-left: .4em; cursor: pointer; }
td.msg { max-width: 40em; word-break: break-word; }
td.id { word-break: break-all; max-width: 28em; }
details.rec { border: 1px solid var(--line); border-radius: 4px; margin: .4em 0; padding: .2em .6em; }
details.rec > summary { cursor: pointer; padding: .2em 0; }
details.rec[open] > summary { border-bottom: 1px solid var(--line); margin-bottom: .4em; }
details.out { margin: .3em 0 .3em 1em; }
.maps { display: flex; gap: 2em; flex-wrap: wrap; align-items: flex-start; }
.map figcaption { font-size: 12px; color: #444; max-width: 52em; }
.map canvas { image-rendering: pixelated; border: 1px solid var(--line); display: block; }
.hover { font-family: ui-monospace, monospace; font-size: 12px; min-height: 1.4em; color: #333; }
.legend { display: flex; align-items: center; gap: .4em; font-size: 12px; margin: .3em 0; }
.swatch { display: inline-block; width: 12px; height: 12px; border: 1px solid #999; vertical-align: middle; }
.note { color: #555; font-size: 12px; }
)css";

// The maps: decoded from the embedded JSON and drawn on canvases when a record's section is
// first opened (and at load for the sections open by default). body[data-rendered="1"] is
// set last, so a headless browser's DOM shows the script ran to the end without an error.
constexpr const char* kScript = R"js(
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('mlagate-data').textContent);

  function decodeFloats(b64) {
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    var view = new DataView(bytes.buffer), out = new Float32Array(bytes.length >> 2);
    for (var j = 0; j < out.length; j++) out[j] = view.getFloat32(4 * j, true);
    return out;
  }

  // Log-scale colours from a perceptual ramp (dark blue, low, to yellow, high); exact zero
  // is light grey and a non-finite mismatch magenta, outside the ramp.
  var STOPS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  var ZERO = 'rgb(236,236,236)', NONFINITE = 'rgb(255,0,200)', BLANK = 'rgb(255,255,255)';
  function ramp(t) {
    t = Math.min(1, Math.max(0, t)) * (STOPS.length - 1);
    var k = Math.min(STOPS.length - 2, Math.floor(t)), f = t - k, a = STOPS[k], b = STOPS[k + 1];
    return 'rgb(' + [0, 1, 2].map(function (c) { return Math.round(a[c] + f * (b[c] - a[c])); }).join(',') + ')';
  }
  function makeScale(values) {
    var hi = 0, lo = Infinity;
    for (var i = 0; i < values.length; i++) {
      var v = values[i];
      if (v > 0 && v < Infinity) { hi = Math.max(hi, v); lo = Math.min(lo, v); }
    }
    var empty = !(hi > 0);
    if (empty) { hi = 1; lo = 1; }
    lo = Math.max(lo, hi * 1e-8);  // eight decades at most: below that it is noise
    var span = Math.log(hi) - Math.log(lo);
    return {
      lo: lo, hi: hi, empty: empty,
      color: function (v) {
        if (v === null || v === undefined) return BLANK;
        if (Number.isNaN(v)) return NONFINITE;
        if (v === 0) return ZERO;
        if (v === Infinity) return ramp(1);
        return ramp(span > 0 ? (Math.log(v) - Math.log(lo)) / span : 1);
      }
    };
  }
  function fmt(v) {
    if (v === null || v === undefined) return '';
    if (Number.isNaN(v)) return 'non-finite mismatch';
    return v === 0 ? '0' : Number(v).toPrecision(3);
  }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // A rows x cols grid, value(r, c) per cell (null: no cell), with axis ticks and a hover line.
  function drawGrid(parent, spec, scale) {
    var fig = el('figure', { 'class': 'map' });
    fig.appendChild(el('figcaption', {}, spec.caption));
    var cw = Math.max(1, Math.min(16, Math.floor(720 / spec.cols)));
    var ch = Math.max(1, Math.min(14, Math.floor(448 / spec.rows)));
    var left = 44, top = 18;
    var canvas = el('canvas', { width: left + spec.cols * cw + 4, height: top + spec.rows * ch + 4 });
    var g = canvas.getContext('2d');
    g.fillStyle = '#fff';
    g.fillRect(0, 0, canvas.width, canvas.height);
    for (var r = 0; r < spec.rows; r++) {
      for (var c = 0; c < spec.cols; c++) {
        g.fillStyle = scale.color(spec.value(r, c));
        g.fillRect(left + c * cw, top + r * ch, cw, ch);
      }
    }
    g.fillStyle = '#333';
    g.font = '10px sans-serif';
    g.textBaseline = 'middle';
    var rstep = Math.max(1, Math.ceil(12 / ch)), cstep = Math.max(1, Math.ceil(28 / cw));
    g.textAlign = 'right';
    for (var rr = 0; rr < spec.rows; rr += rstep) g.fillText(spec.rowTick(rr), left - 3, top + rr * ch + ch / 2);
    g.textAlign = 'center';
    for (var cc = 0; cc < spec.cols; cc += cstep) g.fillText(spec.colTick(cc), left + cc * cw + cw / 2, top / 2);
    canvas.setAttribute('data-drawn', '1');
    fig.appendChild(canvas);
    var hover = el('div', { 'class': 'hover' }, '\u00a0');
    canvas.addEventListener('mousemove', function (ev) {
      var box = canvas.getBoundingClientRect();
      var c = Math.floor((ev.clientX - box.left - left) / cw), r = Math.floor((ev.clientY - box.top - top) / ch);
      if (r < 0 || c < 0 || r >= spec.rows || c >= spec.cols || spec.value(r, c) === null) {
        hover.textContent = '\u00a0';
        return;
      }
      hover.textContent = spec.describe(r, c) + ': max abs err ' + fmt(spec.value(r, c));
    });
    canvas.addEventListener('mouseleave', function () { hover.textContent = '\u00a0'; });
    fig.appendChild(hover);
    parent.appendChild(fig);
  }

  function legend(parent, scale, hasNonfinite) {
    var box = el('div', { 'class': 'legend' });
    if (scale.empty) {
      box.appendChild(el('span', {}, 'no non-zero finite error'));
    } else {
      box.appendChild(el('span', {}, fmt(scale.lo)));
      var bar = el('canvas', { width: 160, height: 12 });
      var g = bar.getContext('2d');
      for (var x = 0; x < 160; x++) { g.fillStyle = ramp(x / 159); g.fillRect(x, 0, 1, 12); }
      box.appendChild(bar);
      box.appendChild(el('span', {}, fmt(scale.hi) + ' (log scale)'));
    }
    var z = el('span', { 'class': 'swatch' }); z.style.background = ZERO;
    box.appendChild(z); box.appendChild(el('span', {}, '0'));
    if (hasNonfinite) {
      var n = el('span', { 'class': 'swatch' }); n.style.background = NONFINITE;
      box.appendChild(n); box.appendChild(el('span', {}, 'non-finite mismatch'));
    }
    parent.appendChild(box);
  }

  function range(first, bin, total) {
    var a = first * bin, b = Math.min(total, a + bin) - 1;
    return a === b ? String(a) : a + '-' + b;
  }

  function drawOutput(box, o) {
    var map = decodeFloats(o.map), rows = o.rows, cols = o.cols;
    var at = function (r, c) { return map[r * cols + c]; };
    var scale = makeScale(map), hasNonfinite = false;
    for (var i = 0; i < map.length; i++) if (Number.isNaN(map[i])) hasNonfinite = true;
    // Request of each token, for hover text; tokens past the requests are padding.
    var starts = [], s = 0;
    for (var q = 0; q < o.query_lens.length; q++) { starts.push(s); s += o.query_lens[q]; }
    function requestOf(t) {
      for (var k = starts.length - 1; k >= 0; k--) if (t >= starts[k]) return t < starts[k] + o.query_lens[k] ? k : -1;
      return -1;
    }
    function tokenText(r) {
      var t = range(r, o.token_bin, o.tokens);
      if (o.token_bin !== 1 || !starts.length) return 'token ' + t;
      var k = requestOf(r * o.token_bin);
      return 'token ' + t + (k < 0 ? ' (padding)' : ' (request ' + k + ', position ' + (r - starts[k]) + ')');
    }
    legend(box, scale, hasNonfinite);
    var maps = el('div', { 'class': 'maps' });
    box.appendChild(maps);
    drawGrid(maps, {
      rows: rows, cols: cols,
      caption: 'max abs error by token (rows' + (o.token_bin > 1 ? ', ' + o.token_bin + ' tokens a row' : '') +
               ') and head (columns' + (o.head_bin > 1 ? ', ' + o.head_bin + ' heads a column' : '') + '), over ' +
               o.dim + ' dim' + (o.dim === 1 ? '' : 's'),
      value: at,
      rowTick: function (r) { return String(r * o.token_bin); },
      colTick: function (c) { return String(c * o.head_bin); },
      describe: function (r, c) { return tokenText(r) + ', head ' + range(c, o.head_bin, o.heads); }
    }, scale);
    if (!starts.length) return;
    // By request: the max over heads of each token row.
    var rowMax = new Float32Array(rows);
    for (var r = 0; r < rows; r++) {
      var m = 0;
      for (var c = 0; c < cols; c++) { var v = at(r, c); if (Number.isNaN(v) || Number.isNaN(m)) m = NaN; else m = Math.max(m, v); }
      rowMax[r] = m;
    }
    if (o.token_bin === 1) {
      var width = Math.max.apply(null, o.query_lens.concat([1]));
      drawGrid(maps, {
        rows: starts.length, cols: width,
        caption: 'max abs error over heads by request (rows) and position in its query tokens (columns)',
        value: function (k, p) { return p < o.query_lens[k] ? rowMax[starts[k] + p] : null; },
        rowTick: function (k) { return String(k); },
        colTick: function (p) { return String(p); },
        describe: function (k, p) { return 'request ' + k + ', position ' + p + ' (token ' + (starts[k] + p) + ')'; }
      }, scale);
    } else {
      // Binned tokens: one cell per request, the max over the rows its tokens touch (a row
      // shared with a neighbouring request counts for both).
      var perRequest = starts.map(function (a, k) {
        var n = o.query_lens[k];
        if (n === 0) return null;
        var m = 0;
        for (var r = Math.floor(a / o.token_bin); r <= Math.floor((a + n - 1) / o.token_bin); r++)
          m = Number.isNaN(rowMax[r]) || Number.isNaN(m) ? NaN : Math.max(m, rowMax[r]);
        return m;
      });
      drawGrid(maps, {
        rows: 1, cols: starts.length,
        caption: 'max abs error by request (columns; tokens are binned, so a row shared by two requests counts for both)',
        value: function (r, k) { return perRequest[k]; },
        rowTick: function () { return ''; },
        colTick: function (k) { return String(k); },
        describe: function (r, k) { return 'request ' + k + ' (' + o.query_lens[k] + ' tokens from token ' + starts[k] + ')'; }
      }, scale);
    }
  }

  function render(details) {
    var boxes = details.querySelectorAll(':scope > .outputs > details.out[open] > .mapbox');
    boxes.forEach(function (box) {
      if (box.getAttribute('data-done') === '1') return;
      var rec = data.records[box.getAttribute('data-rec')];
      var o = rec && rec[Number(box.getAttribute('data-out'))];
      if (o) drawOutput(box, o);
      box.setAttribute('data-done', '1');
    });
  }
  // Drawn on first open: 'toggle' does not bubble, hence the capturing listener. An output's
  // section fires it at load too (it is open in the markup): drawn only if its record is open.
  document.addEventListener('toggle', function (ev) {
    var t = ev.target, rec = t.closest && t.closest('details.rec');
    if (t.open && rec && rec.open) render(rec);
  }, true);
  document.querySelectorAll('details.rec[open]').forEach(render);

  // The filter: a case-insensitive substring of a row's text, and optionally failures only.
  var filter = document.getElementById('filter'), failuresOnly = document.getElementById('failures-only');
  var rows = Array.prototype.slice.call(document.querySelectorAll('#record-table tbody tr'));
  var shown = document.getElementById('shown');
  function applyFilter() {
    var q = filter.value.trim().toLowerCase(), n = 0;
    rows.forEach(function (tr) {
      var ok = (!failuresOnly.checked || tr.getAttribute('data-failure') === '1') &&
               (q === '' || tr.textContent.toLowerCase().indexOf(q) >= 0);
      tr.hidden = !ok;
      var sec = document.getElementById('rec-' + tr.getAttribute('data-index'));
      if (sec) sec.hidden = !ok;
      if (ok) n++;
    });
    shown.textContent = n + ' of ' + rows.length + ' records shown';
  }
  filter.addEventListener('input', applyFilter);
  failuresOnly.addEventListener('change', applyFilter);
  applyFilter();

  // Copy buttons: the clipboard API where the page may use it, else the text is selected.
  document.querySelectorAll('button.copy').forEach(function (b) {
    b.addEventListener('click', function () {
      var code = b.parentNode.querySelector('code.repro');
      var select = function () {
        var range = document.createRange();
        range.selectNodeContents(code);
        var sel = window.getSelection();
        sel.removeAllRanges();
        sel.addRange(range);
        b.textContent = 'selected';
      };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(code.textContent).then(function () { b.textContent = 'copied'; }, select);
      } else {
        select();
      }
    });
  });
  document.body.setAttribute('data-rendered', '1');
})();
)js";

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
  row("records", std::to_string(counts.total) + " records, " + std::to_string(counts.failures) + " failures", false);
  os << "</table>\n";
}

void write_counts(std::ostream& os, std::span<const Record> records) {
  const std::vector<BackendSummary> rows = summarize_by_backend(records);
  os << "<table class=\"counts\">\n<thead><tr><th>backend</th>";
  for (Status s : kAllStatuses) os << "<th>" << status_name(s) << "</th>";
  os << "<th>time</th></tr></thead>\n<tbody>\n";
  const auto row = [&](const std::string& name, const StatusCounts& c, double ms, bool total) {
    os << (total ? "<tr class=\"total\">" : "<tr>") << "<td>" << esc(name) << "</td>";
    for (Status s : kAllStatuses) {
      const std::int64_t n = c[s];
      os << "<td class=\"n" << (n == 0 ? " zero" : "") << "\">";
      if (n > 0) os << "<span class=\"st " << status_class(s) << "\">" << n << "</span>";
      else os << 0;
      os << "</td>";
    }
    os << "<td class=\"n\">" << detail::format_fixed(ms / 1000.0, 3) << " s</td></tr>\n";
  };
  double total_ms = 0;
  for (const BackendSummary& b : rows) {
    row(b.backend, b.counts, b.total_ms, false);
    total_ms += b.total_ms;
  }
  row("TOTAL", count_statuses(records), total_ms, true);
  os << "</tbody>\n</table>\n";
}

void write_repro(std::ostream& os, const Record& r) {
  if (r.repro.empty()) return;
  os << "<code class=\"repro\">" << esc(r.repro) << "</code><button class=\"copy\" type=\"button\">copy</button>";
}

// Index i's row of the records table.
void write_row(std::ostream& os, const Record& r, std::size_t i) {
  const Metrics* m = headline_metrics(r);
  os << "<tr data-index=\"" << i << "\" data-failure=\"" << (status_is_failure(r.status) ? 1 : 0) << "\">"
     << "<td class=\"n\">" << i << "</td><td class=\"id\"><a href=\"#rec-" << i << "\">" << esc(r.case_id) << "</a></td>"
     << "<td>" << esc(r.backend) << "</td><td>" << esc(r.op) << "</td>"
     << "<td class=\"st " << status_class(r.status) << "\">" << status_name(r.status) << "</td>"
     << "<td class=\"n\">" << (m ? num(m->max_abs) + " (" + esc(m->output) + ")" : "") << "</td>"
     << "<td class=\"msg\">" << esc(r.message, kMaxCellMessage) << "</td><td>";
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
void write_section(std::ostream& os, const Record& r, std::size_t i, bool open, bool embed_maps, Json& maps) {
  const Metrics* hm = headline_metrics(r);
  os << "<details class=\"rec\" id=\"rec-" << i << "\"" << (open ? " open" : "") << "><summary><span class=\"st "
     << status_class(r.status) << "\">" << status_name(r.status) << "</span> <code>" << esc(r.case_id)
     << "</code> &middot; " << esc(r.backend) << " &middot; " << esc(r.op);
  if (hm) os << " &middot; max abs err " << num(hm->max_abs) << " (" << esc(hm->output) << ")";
  os << "</summary>\n";
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

  // Failures first, each group in run order; indices in the page are positions in `records`.
  std::vector<std::size_t> order(records.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_partition(order.begin(), order.end(), [&](std::size_t i) { return status_is_failure(records[i].status); });

  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
     << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
     << "<title>mlagate: " << verdict << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n";
  os << "<h1>mlagate: <span class=\"verdict " << verdict_class << "\">" << verdict << "</span></h1>\n";
  if (!run.interrupted.empty())
    os << "<p class=\"banner\">Interrupted (" << esc(run.interrupted) << "): partial results.</p>\n";
  write_info(os, run, counts);

  os << "<h2>Backends</h2>\n";
  write_counts(os, records);

  os << "<h2>Records</h2>\n<div id=\"controls\"><input id=\"filter\" type=\"search\" "
        "placeholder=\"filter: any part of id, backend, op, status or message\" aria-label=\"filter records\">"
        "<label><input id=\"failures-only\" type=\"checkbox\"> failures only</label><span id=\"shown\"></span></div>\n"
     << "<table id=\"record-table\"><thead><tr><th>#</th><th>case</th><th>backend</th><th>op</th><th>status</th>"
        "<th>max abs err</th><th>message</th><th>repro</th></tr></thead>\n<tbody>\n";
  for (std::size_t i : order) write_row(os, records[i], i);
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
    const bool open = status_is_failure(r.status) && opened < 3;
    opened += open ? 1 : 0;
    write_section(os, r, i, open, embed, maps);
  }

  os << "<script type=\"application/json\" id=\"mlagate-data\">" << script_json(Json{{"records", std::move(maps)}})
     << "</script>\n<script>" << kScript << "</script>\n</body>\n</html>\n";
}

}  // namespace mlagate
