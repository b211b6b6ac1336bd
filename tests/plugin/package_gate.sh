#!/usr/bin/env bash
# backends/plugin/README.md's "Gate in your own ctest: find_package(mlagate)",
# as a test: mlagate installed from the build to a temporary prefix (the
# installed binary must run from there), examples/gate_package configured
# against it with CMAKE_PREFIX_PATH alone, built, and its ctest run: the gate
# test (mlagate_add_gate, smoke suite) passes on the example plugin and fails
# on the same plugin with a planted 1% output error (MLAGATE_EXAMPLE_PLANT_BUG), and passes
# again when an expectations file names that failure (MLAGATE_EXAMPLE_EXPECT, EXPECT).
# usage: package_gate.sh BUILD_DIR SOURCE_DIR CMAKE CTEST GENERATOR WORK_DIR
set -euo pipefail
build=$1 src=$2 cmake=$3 ctest=$4 generator=$5 work=$6
prefix=$work/prefix
test_name=my_mla_plugin.gate

rm -rf "$work"
mkdir -p "$work"
"$cmake" --install "$build" --prefix "$prefix"
config=$(find "$prefix" -name mlagateConfig.cmake)   # lib/cmake/mlagate/ (CMAKE_INSTALL_LIBDIR)
config_dir=$(dirname "${config:-$prefix/lib/cmake/mlagate/none}")
for f in "$prefix/bin/mlagate" "$prefix/include/mlagate/plugin.h" "$config_dir/mlagateConfig.cmake" \
         "$config_dir/mlagateConfigVersion.cmake" "$config_dir/mlagate_gate.cmake"; do
  [[ -e "$f" ]] || { echo "package_gate: $f not installed" >&2; exit 1; }
done
"$prefix/bin/mlagate" --version
"$prefix/bin/mlagate" list backends --backend 'cpu.paged'

# configure, build and ctest examples/gate_package; ctest's output in $work/<dir>.ctest.log.
gate() {
  local dir=$1; shift
  "$cmake" -S "$src/examples/gate_package" -B "$work/$dir" -G "$generator" -DCMAKE_PREFIX_PATH="$prefix" \
    -DMLAGATE_EXAMPLE_SUITE=smoke "$@" > "$work/$dir.configure.log" 2>&1 ||
    { cat "$work/$dir.configure.log"; echo "package_gate: $dir: configure failed" >&2; exit 1; }
  grep -qx "mlagate_DIR:PATH=$config_dir" "$work/$dir/CMakeCache.txt" ||
    { grep mlagate_DIR "$work/$dir/CMakeCache.txt"; echo "package_gate: mlagate not found in $prefix" >&2; exit 1; }
  "$cmake" --build "$work/$dir"
  local rc=0
  "$ctest" --test-dir "$work/$dir" --output-on-failure > "$work/$dir.ctest.log" 2>&1 || rc=$?
  cat "$work/$dir.ctest.log"
  return $rc
}

echo "== the example plugin: the gate passes"
gate good
grep -q "Test *#1: $test_name \.* *Passed" "$work/good.ctest.log" ||
  { echo "package_gate: $test_name did not pass" >&2; exit 1; }
grep -q "100% tests passed, 0 tests failed out of 1" "$work/good.ctest.log" ||
  { echo "package_gate: not 100% passed" >&2; exit 1; }
[[ -s "$work/good/mlagate_gate.xml" ]] || { echo "package_gate: no JUnit report" >&2; exit 1; }

echo "== the same plugin with its outputs scaled by 1.01: the gate fails"
if gate bad -DMLAGATE_EXAMPLE_PLANT_BUG=ON; then
  echo "package_gate: ctest passed on the planted bug" >&2
  exit 1
fi
grep -q "Test *#1: $test_name \.*\*\*\*Failed" "$work/bad.ctest.log" ||
  { echo "package_gate: $test_name did not fail" >&2; exit 1; }
grep -q "mlagate exited 1 (failures)" "$work/bad.ctest.log" ||
  { echo "package_gate: the gate failed for another reason than failing records" >&2; exit 1; }

echo "== the planted bug made known by an expectations file (EXPECT): the gate passes, the records XFAIL"
cat > "$work/known.yaml" <<'EOT'
schema: mlagate.expect/1
expect:
  - id: planted-scale
    backend: "*"
    status: INCORRECT
    reason: outputs scaled by 1.01 (planted_scale.c)
    strict: false  # a 1% scale shows on some cases only
EOT
gate known -DMLAGATE_EXAMPLE_PLANT_BUG=ON -DMLAGATE_EXAMPLE_EXPECT="$work/known.yaml" ||
  { echo "package_gate: the gate failed on a failure its expectations file names" >&2; exit 1; }
grep -q 'message="XFAIL' "$work/known/mlagate_gate.xml" ||
  { echo "package_gate: no XFAIL in the JUnit report" >&2; exit 1; }
echo "package_gate: passed (the gate passes the example plugin, fails the planted bug, passes it when known)"
