#!/usr/bin/env bash
# Builds the tests/fuzz targets with clang (libFuzzer, ASan, UBSan) and runs
# one for a bounded time. Prints "SKIPPED: ..." (ctest reports the test
# skipped, never passed) when clang or libFuzzer is missing.
#   run_fuzz.sh SOURCE_DIR BUILD_DIR build
#       configures BUILD_DIR and builds both targets (ctest's Fuzz.Build, the
#       fixture of the two runs: one build, so that the sources both targets
#       share compile once and two runs never build one folder side by side)
#   run_fuzz.sh SOURCE_DIR BUILD_DIR SECONDS fuzz_suite
#       seeded with the built-in suite files
#   run_fuzz.sh SOURCE_DIR BUILD_DIR SECONDS fuzz_golden MLAGATE
#       seeded with a small golden file that MLAGATE exports
set -uo pipefail
src=$1 build=$2 seconds=$3 target=${4:-} mlagate=${5:-}
cxx=$(command -v clang++ || true)
if [ -z "$cxx" ]; then echo "SKIPPED: no clang++ (scripts/bootstrap.sh installs clang)"; exit 0; fi
# libFuzzer ships with clang's runtime; probe it before building anything.
probe=$(mktemp -d)
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe/p.cpp"
if ! "$cxx" -fsanitize=fuzzer "$probe/p.cpp" -o "$probe/p" >/dev/null 2>&1; then
  rm -rf "$probe"; echo "SKIPPED: $cxx has no libFuzzer runtime"; exit 0
fi
rm -rf "$probe"
if [ "$seconds" = build ]; then
  mkdir -p "$build"
  cmake -S "$src/tests/fuzz" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMLAGATE_SOURCE_DIR="$src" >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
  cmake --build "$build" -j"$(nproc)" >"$build/build.log" 2>&1 || { tail -40 "$build/build.log"; exit 1; }
  echo "built fuzz_suite and fuzz_golden in $build"
  exit 0
fi
[ -x "$build/$target" ] || { echo "no $build/$target: run_fuzz.sh $src $build build first (ctest: Fuzz.Build)"; exit 1; }
corpus="$build/corpus-$target"
rm -rf "$corpus"
mkdir -p "$corpus"
case "$target" in
  fuzz_suite) cp "$src"/cases/specs.yaml "$src"/cases/suites/*.yaml "$corpus"/ ;;
  fuzz_golden)
    # N = 1 head keeps the seed small (0.4 MiB); libHDF5's own leaks on
    # malformed files are not findings here (tests/golden suppresses them too).
    "$mlagate" export --spec small_decode --tp 128 --out "$corpus/small.h5" >/dev/null || exit 1
    # and a merge case (the merge_states group; 1 token, 16 heads, D 576: 0.1 MiB)
    "$mlagate" export --suite merge --filter '/t1/tp8/bf16/' --out "$corpus/merge.h5" >/dev/null || exit 1
    export ASAN_OPTIONS=detect_leaks=0 ;;
esac
cd "$build" || exit 1
# -rss_limit_mb: input asking for a huge allocation must be refused, not allocated.
"./$target" "$corpus" -max_len=1048576 -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 2>&1 | grep -v -E "^#[0-9]+ +(NEW|REDUCE|pulse)" | tail -25
rc=${PIPESTATUS[0]}
[ $rc -eq 0 ] && echo "$target: no finding in ${seconds} s"
exit $rc
