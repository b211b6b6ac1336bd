#!/usr/bin/env bash
# Configures and builds the mlagate binary (with --all the Python module too,
# where it is on) for each documented configure option's sensible combinations, each in
# build/m-<name>, and says which failed. Cheap after the main build when
# ccache is there: the main build (scripts/bootstrap.sh) compiles through it,
# and these builds, at the same depth under build/, share its objects
# (CCACHE_BASEDIR makes the paths relative), so only what a combination
# changes compiles again: the files that read its config.h and the links.
# Usage: scripts/config_matrix.sh [--after BUILD_DIR] [--all] [NAME...]   (default: every combination)
#   --after BUILD_DIR: as a test (ctest's ConfigMatrix.EveryCombinationBuilds):
#   prints "SKIPPED: ..." and exits 0 unless BUILD_DIR was built through
#   ccache, where the matrix costs a fraction of a build instead of five.
# Exit: 0 every one built, 1 one did not (its log: build/m-NAME/matrix.log).
set -uo pipefail
cd "$(dirname "$0")/.."
after="" all=0
if [ "${1:-}" = --after ]; then after=$2; shift 2; fi
if [ "${1:-}" = --all ]; then all=1; shift; fi
if [ -n "$after" ]; then
  if ! command -v ccache > /dev/null; then echo "SKIPPED: no ccache (scripts/bootstrap.sh installs it)"; exit 0; fi
  if ! grep -q "^CMAKE_CXX_COMPILER_LAUNCHER:.*ccache" "$after/CMakeCache.txt" 2> /dev/null; then
    echo "SKIPPED: $after was not built through ccache (scripts/bootstrap.sh builds it so): each combination would compile in full"
    exit 0
  fi
fi

# One line per combination: name, then the options it sets (the rest are the
# defaults: ON where found). The options and what they do: README.md#build-options.
combos=(
  "no-cuda -DMLAGATE_WITH_CUDA=OFF"
  "no-torch -DMLAGATE_WITH_TORCH=OFF"
  "no-python -DMLAGATE_PYTHON=OFF"
  "no-tests-bench -DMLAGATE_BUILD_TESTS=OFF -DMLAGATE_BUILD_BENCH=OFF"
  "minimal -DMLAGATE_WITH_CUDA=OFF -DMLAGATE_WITH_TORCH=OFF -DMLAGATE_PYTHON=OFF -DMLAGATE_BUILD_TESTS=OFF -DMLAGATE_BUILD_BENCH=OFF"
)

source scripts/ccache_env.sh  # launcher and CCACHE_*, as the main build has them
((${#launcher[@]})) || echo "config_matrix: no ccache: every combination compiles in full" >&2

failed=()
for combo in "${combos[@]}"; do
  read -r name flags <<< "$combo"
  if (($#)) && [[ " $* " != *" $name "* ]]; then continue; fi
  dir="build/m-$name"
  mkdir -p "$dir"
  t0=$SECONDS
  targets=(mlagate)
  # shellcheck disable=SC2086  # flags: several -D words
  if cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" $flags > "$dir/matrix.log" 2>&1 &&
     # --all: the Python module too where the combination has it (its own link of every library)
     { [ "$all" = 0 ] || ! grep -q "mlagate_python" "$dir/build.ninja" || targets+=(mlagate_python); } &&
     cmake --build "$dir" -j"$(nproc)" --target "${targets[@]}" >> "$dir/matrix.log" 2>&1 &&
     "$dir/harness/mlagate" list backends > /dev/null 2>> "$dir/matrix.log"; then
    echo "config_matrix: $name: built ${targets[*]} in $((SECONDS - t0)) s ($flags)"
  else
    echo "config_matrix: $name: FAILED after $((SECONDS - t0)) s ($flags); the last lines of $dir/matrix.log:"
    tail -15 "$dir/matrix.log" | sed 's/^/  /'
    failed+=("$name")
  fi
done
if command -v ccache > /dev/null; then ccache --show-stats 2>/dev/null | grep -iE "hits|misses" | head -4 | sed 's/^/config_matrix: ccache /'; fi
if ((${#failed[@]})); then
  echo "config_matrix: failed: ${failed[*]}"
  exit 1
fi
