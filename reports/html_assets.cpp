// The HTML report's page assets (html_assets.h): its style sheet and the script
// that draws the error maps, kept apart from the writer that fills the page.
#include "reports/html_assets.h"

namespace mlagate::detail {

const char* const kHtmlStyle = R"css(
:root { --fail: #b3261e; --pass: #1e7b34; --other: #6b6b6b; --xfail: #8a6100; --xpass: #a14f00; --line: #d8d8d8; --bg2: #f6f6f6; }
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
.st.xfail { color: var(--xfail); } .st.xpass { color: var(--xpass); font-weight: bold; }
.expect { color: #444; font-size: 12.5px; } p.expect { border-left: 3px solid var(--xfail); padding-left: .5em; }
.facts { color: #555; font-size: 12px; }
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
const char* const kHtmlScript = R"js(
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
  var expected = document.getElementById('expected-filter');  // only in a run with --expect outcomes
  var rows = Array.prototype.slice.call(document.querySelectorAll('#record-table tbody tr'));
  var shown = document.getElementById('shown');
  function applyFilter() {
    var q = filter.value.trim().toLowerCase(), n = 0;
    rows.forEach(function (tr) {
      var ok = (!failuresOnly.checked || tr.getAttribute('data-failure') === '1') &&
               (!expected || expected.value === '' || tr.getAttribute('data-expected') === expected.value) &&
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
  if (expected) expected.addEventListener('change', applyFilter);
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

}  // namespace mlagate::detail
