#!/usr/bin/env bash
# The HTML report of real runs, opened in headless Chromium: the smoke suite on the CPU
# backends (every record passes), the same run under a policy nothing meets (every record
# INCORRECT, so error maps are drawn at load), and both again with --expect: every failure
# XFAIL (an entry with markup in its reason and a link), and every pass XPASS (a strict entry
# and a non-strict one), so the badges, their reasons and the XFAIL/XPASS filter are rendered
# too. Fails when the browser logs a console message
# (the report's script logs nothing, so any message, an uncaught exception included, is an
# error) or when the dumped DOM lacks what the script sets when it has run to its end
# (body[data-rendered="1"]) or, for the failing run, the canvases it draws (data-drawn="1").
# Exits 77 (ctest: skipped) when no Chromium is installed.
# Usage: html_render_check.sh MLAGATE_BINARY WORK_DIR
set -u

mlagate=${1:?usage: html_render_check.sh MLAGATE_BINARY WORK_DIR}
work=${2:?usage: html_render_check.sh MLAGATE_BINARY WORK_DIR}

browser=""
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then
    browser=$(command -v "$b")
    break
  fi
done
if [ -z "$browser" ]; then
  echo "SKIPPED: no chromium on PATH (apt-get install chromium; scripts/bootstrap.sh installs it)"
  exit 77
fi

fail() {
  echo "FAIL: $*"
  exit 1
}

rm -rf "$work"
mkdir -p "$work"
cd "$work" || fail "cannot enter $work"

common=(run --suite smoke --backend cpu.paged,cpu.splitkv --isolate none --no-progress -q)
"$mlagate" "${common[@]}" --html pass.html >pass.log 2>&1
rc=$?
[ "$rc" -eq 0 ] || { cat pass.log; fail "smoke run exited $rc, expected 0"; }
# atol 1e-9 with rtol 0: every bf16 output misses it, so every record is INCORRECT (exit 1).
"$mlagate" "${common[@]}" --policy fixed --atol 1e-9 --rtol 0 --html fail.html >fail.log 2>&1
rc=$?
[ "$rc" -eq 1 ] || { cat fail.log; fail "planted-failure run exited $rc, expected 1"; }
# --expect: the failing run with every failure expected (XFAIL: exit 0), and the passing run
# with entries that expect failures (XPASS: a strict entry's fails the run, exit 1).
cat >xfail.yaml <<'YAML'
schema: mlagate.expect/1
expect:
  - id: cpu-tight-atol
    backend: "cpu.*"
    status: INCORRECT
    reason: "atol 1e-9 is below bf16's resolution: <every> record & 'each' output misses it"
    link: "https://example.invalid/mlagate/issues/1?a=1&b=<2>"
YAML
cat >xpass.yaml <<'YAML'
schema: mlagate.expect/1
expect:
  - id: splitkv-strict
    backend: cpu.splitkv
    reason: "split-KV merge was wrong before the fix"
  - id: paged-notice
    backend: cpu.paged
    reason: "flaky under load </script><script>alert(1)</script>"
    link: "javascript:alert(2)"
    strict: false
YAML
"$mlagate" "${common[@]}" --policy fixed --atol 1e-9 --rtol 0 --expect xfail.yaml --html xfail.html >xfail.log 2>&1
rc=$?
[ "$rc" -eq 0 ] || { cat xfail.log; fail "run with every failure expected exited $rc, expected 0"; }
"$mlagate" "${common[@]}" --expect xpass.yaml --html xpass.html >xpass.log 2>&1
rc=$?
[ "$rc" -eq 1 ] || { cat xpass.log; fail "run with strict XPASS records exited $rc, expected 1"; }

# Debian's chromium 156 wants --headless=new; older ones took plain --headless.
headless=--headless=new
if "$browser" --version 2>/dev/null | grep -Eq ' (8[0-9]|9[0-9]|10[0-9])\.'; then headless=--headless; fi

render() {  # page -> page.dom (the DOM after the script ran) and page.err (the browser's log)
  timeout 90 "$browser" "$headless" --no-sandbox --disable-gpu --no-first-run --no-default-browser-check \
    --disable-extensions --disable-dev-shm-usage --user-data-dir="$work/profile" --enable-logging=stderr --v=0 \
    --dump-dom "file://$work/$1.html" >"$1.dom" 2>"$1.err"
  local status=$?
  [ "$status" -eq 0 ] || { tail -20 "$1.err"; fail "$1.html: chromium exited $status"; }
  if grep -E 'CONSOLE|Uncaught' "$1.err"; then
    fail "$1.html: console messages from the page (above)"
  fi
  grep -q '<body data-rendered="1"' "$1.dom" || fail "$1.html: the script did not run to its end (no data-rendered)"
}

render pass
render fail
drawn=$(grep -o '<canvas[^>]*data-drawn="1"' fail.dom | wc -l)
[ "$drawn" -ge 1 ] || fail "fail.html: no error map drawn at load"
grep -q 'INCORRECT' fail.dom || fail "fail.html: no INCORRECT record"

render xfail
render xpass
grep -q '<title>mlagate: PASS</title>' xfail.dom || fail "xfail.html: only XFAIL records, and the verdict is not PASS"
grep -q 'class="st xfail">XFAIL (INCORRECT)<' xfail.dom || fail "xfail.html: no XFAIL (INCORRECT) badge"
grep -q 'href="https://example.invalid/mlagate/issues/1?a=1&amp;b=&lt;2&gt;"' xfail.dom || fail "xfail.html: no link to the entry's issue"
grep -q 'id="expected-filter"' xfail.dom || fail "xfail.html: no XFAIL/XPASS filter"
grep -q '<title>mlagate: FAIL</title>' xpass.dom || fail "xpass.html: a strict XPASS, and the verdict is not FAIL"
grep -q 'class="st fail">XPASS(strict)<' xpass.dom || fail "xpass.html: no XPASS(strict) badge"
grep -q 'class="st xpass">XPASS<' xpass.dom || fail "xpass.html: no (non-strict) XPASS badge"
grep -q 'href="javascript' xpass.dom && fail "xpass.html: a javascript: link became a link"
grep -q '<script>alert' xpass.dom && fail "xpass.html: an entry's reason opened a script"

echo "ok: pass.html $(wc -c <pass.html) bytes, fail.html $(wc -c <fail.html) bytes, $drawn maps drawn at load;" \
  "xfail.html $(grep -c 'data-expected="XFAIL"' xfail.dom) XFAIL rows, xpass.html $(grep -c 'data-expected="XPASS"' xpass.dom) XPASS rows"
