#!/usr/bin/env bash
# Python.PipInstall: `pip install .` as a user does it (python/README.md, "Install with pip"), in a
# fresh virtualenv of Debian's python3 (--system-site-packages: numpy, pytest), offline
# (--no-index), through the repository's own PEP 517 backend (pyproject.toml); then, from a folder
# outside the repository and with nothing on PYTHONPATH:
#   - `import mlagate` comes from the venv, and a real run goes through it: the numpy example
#     decode as a Python backend in worker processes (the installed _worker.py), smoke suite;
#   - the `mlagate` on PATH is the venv's: --version, and `run --suite smoke --backend cpu.paged`;
#   - with libtorch, `--baseline torch` loads the wheel's libtorch reference module (the CLI's copy
#     under <venv>/lib/mlagate, the Python module's beside it), not the build tree's;
#   - neither the modules nor the CLI has a run path into the source or build tree;
#   - `python -m pytest --mlagate-suite smoke` with no -p and no conftest.py: the pytest11 entry
#     point loads the plugin, one test per smoke case, each checked against the reference
#     (and once more with -p mlagate.pytest_plugin, the documented line: loaded once, not twice).
# Usage: pip_install.sh <source dir> <configured build dir to reuse> <python3>
# The build dir is reused (--config-settings=build-dir=...): pip builds the two targets
# incrementally (nothing to do after the CI's build) instead of a fresh configure and build.
# Exit 77 (ctest: skipped) only where the interpreter cannot make a venv with pip (no ensurepip:
# Debian's python3-venv missing).
set -euo pipefail
src=$(cd "$1" && pwd) build=$(cd "$2" && pwd) py=$3

if ! "$py" -c "import ensurepip, venv" 2>/dev/null; then
  echo "SKIPPED: $py cannot make a virtualenv with pip (no ensurepip; Debian: apt-get install python3-venv)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/mlagate-pip.XXXXXX")
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH PYTHONHOME MLAGATE_BIN
export PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_NO_CACHE_DIR=1
step() { printf '== %s\n' "$*"; }
fail() { printf 'FAILED: %s\n' "$*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

t=$(now)
"$py" -m venv --system-site-packages "$work/venv"
venv=$work/venv
step "venv: $(since "$t") s ($("$venv/bin/python" -m pip --version))"

t=$(now)
if ! "$venv/bin/python" -m pip install --no-index --config-settings=build-dir="$build" "$src" > "$work/pip.log" 2>&1; then
  cat "$work/pip.log"
  fail "pip install --no-index $src"
fi
step "pip install: $(since "$t") s: $(grep -E '^Successfully installed' "$work/pip.log")"

mkdir "$work/elsewhere"
cd "$work/elsewhere"
cp "$src/python/examples/numpy_mla.py" .   # the example backend, a module of this folder

step "import mlagate from $PWD, the numpy example in worker processes"
"$venv/bin/python" - "$venv" <<'EOF'
import os, sys
import mlagate, numpy_mla
venv = sys.argv[1]
assert mlagate.__file__.startswith(venv + "/"), f"mlagate from {mlagate.__file__}, not the venv"
print("mlagate", mlagate.__version__, "from", os.path.dirname(mlagate.__file__))
print(len(mlagate.cases(suite="vllm")), "vllm cases")
r = mlagate.run({"numpy.mla": numpy_mla.BACKEND}, suite="smoke", op="decode", isolate="process", quiet=True)
passed = sum(rec["status"] == "PASSED" for rec in r.records)
print("exit", r.exit_code, "records", len(r.records), "passed", passed)
assert r.exit_code == 0 and passed >= 6, r.records
EOF

step "the mlagate CLI on PATH"
export PATH="$venv/bin:$PATH"
[ "$(command -v mlagate)" = "$venv/bin/mlagate" ] || fail "mlagate on PATH is $(command -v mlagate), not the venv's"
mlagate --version
mlagate --version | grep -q "^$("$venv/bin/python" -c 'import mlagate; print(mlagate.__version__.split()[0])')" ||
  fail "mlagate --version does not match the module's version"
rc=0
mlagate run --suite smoke --backend cpu.paged > cli.log 2>&1 || rc=$?
tail -2 cli.log
[ "$rc" = 0 ] && grep -q "^PASS: " cli.log || fail "mlagate run --suite smoke --backend cpu.paged: exit $rc"
rc=0
mlagate run --suite no-such-suite > /dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "mlagate run --suite no-such-suite: exit $rc, the CLI's input error is 2"

if [ -f "$build/harness/libmlagate_torch_reference.so" ]; then
  step "--baseline torch loads the wheel's libtorch reference module, the CLI's and the module's"
  # The dynamic loader's own log names the file each process opened: the venv's copies, never the
  # build tree's (which the loader would find last).
  rc=0
  LD_DEBUG=files mlagate run --suite smoke --filter tp16/bf16 --backend cpu.paged --baseline torch > torch.log 2>&1 ||
    rc=$?
  [ "$rc" = 0 ] || { tail -5 torch.log; fail "mlagate run --baseline torch: exit $rc"; }
  got=$(grep -o 'file=[^ ]*libmlagate_torch_reference.so' torch.log | sort -u)
  echo "CLI: $got"
  [ "$got" = "file=$venv/lib/mlagate/libmlagate_torch_reference.so" ] || fail "the CLI loaded '$got'"
  LD_DEBUG=files "$venv/bin/python" -c "import mlagate, sys; r = mlagate.run(backend='cpu.paged', suite='smoke', \
filter='tp16/bf16', baseline='torch', quiet=True); sys.exit(r.exit_code)" > torch_py.log 2>&1 || rc=$?
  [ "$rc" = 0 ] || { tail -5 torch_py.log; fail "mlagate.run(baseline='torch'): exit $rc"; }
  got=$(grep -o 'file=[^ ]*libmlagate_torch_reference.so' torch_py.log | sort -u)
  echo "module: $got"
  case "$got" in "file=$venv"/lib/python3*/site-packages/mlagate/libmlagate_torch_reference.so) ;;
    *) fail "the Python module loaded '$got'" ;; esac
fi

step "no run path into the source or build tree"
if command -v readelf > /dev/null; then
  for f in "$venv/bin/mlagate" "$venv"/lib/python3*/site-packages/mlagate/*.so "$venv"/lib/mlagate/*.so; do
    [ -e "$f" ] || continue
    rp=$(readelf -d "$f" | grep -E 'R(UN)?PATH' || true)
    echo "$(basename "$f"): ${rp:-no run path}"
    case "$rp" in *"$src"*|*"$build"*) fail "$f has a run path into the source or build tree: $rp" ;; esac
  done
else
  echo "readelf not found (binutils): run paths not checked"
fi

step "pytest --mlagate-suite smoke, the plugin from its entry point"
cat > test_plugin_entry.py <<'EOF'
import numpy_mla


def test_decode(mlagate_case):
    a = mlagate_case.inputs("decode", framework="numpy")
    r = mlagate_case.check(numpy_mla.decode(a))
    assert r, r.message
EOF
rc=0
"$venv/bin/python" -m pytest -q -p no:cacheprovider --mlagate-suite smoke test_plugin_entry.py > pytest.log 2>&1 || rc=$?
tail -1 pytest.log
[ "$rc" = 0 ] && grep -qE "^7 passed" pytest.log || { cat pytest.log; fail "pytest --mlagate-suite smoke: exit $rc"; }
rc=0
"$venv/bin/python" -m pytest -q -p no:cacheprovider -p mlagate.pytest_plugin --mlagate-suite smoke \
  test_plugin_entry.py -k tp16 > pytest2.log 2>&1 || rc=$?
tail -1 pytest2.log
[ "$rc" = 0 ] && grep -qE "^[1-9][0-9]* passed" pytest2.log || { cat pytest2.log; fail "pytest -p mlagate.pytest_plugin: exit $rc"; }
echo "PIP INSTALL OK"
