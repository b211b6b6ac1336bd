#!/usr/bin/env bash
# One-step set-up for a fresh Debian 12 machine: installs the missing packages
# (apt), configures and builds the `cpu` preset, then either runs the default
# suite on every available backend (`run`) or runs every test (`test`).
# Usage: scripts/bootstrap.sh run|test [extra mlagate run arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
case "$mode" in
  run|test) shift ;;
  *) echo "usage: scripts/bootstrap.sh run|test [mlagate run arguments]" >&2; exit 2 ;;
esac

# Debian 12 packages; the lists live here and in the README. `run` needs
# what builds and runs the binary and its default suite. `test` (what .ci/run
# calls) adds the tests' own packages (Python's, clang for the fuzzer,
# chromium for the HTML render, a single-node Slurm) and libtorch: Debian's
# 1.13 gives the torch reference (`--reference torch`, a module loaded on
# first use) and no backend (torch.sdpa.* needs libtorch >= 2), and its
# dependencies (OpenCV, Qt, LLVM, ...) were most of a fresh machine's apt time.
packages=(build-essential cmake ninja-build git libeigen3-dev libcli11-dev nlohmann-json3-dev
          libyaml-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev libpugixml-dev libhdf5-dev ccache)
if [ "$mode" = test ]; then
  packages+=(libtorch-dev libopenblas0-pthread python3-h5py python3-numpy python3-dev python3-pytest python3-venv
             pybind11-dev clang chromium slurmctld slurmd slurm-client munge)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "bootstrap: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Through ccache where it is installed: a rebuild, and the configure matrix
# (scripts/config_matrix.sh, a test) after the build, reuse these objects.
source scripts/ccache_env.sh
# `run` on a machine without an NVIDIA GPU leaves the CUDA backends out: none
# of them could run here, and their compiles are a sixth of the build (2-core
# VM, 2026-12-03, ccache off: 244 s without, 288 s with). `test` builds them whenever nvcc
# is there (CI: CUDA code must compile), and the objects both builds share
# come back from ccache.
cuda=ON
if [ "$mode" = run ] && ! { compgen -G '/dev/nvidia[0-9]*' > /dev/null || [ -e /dev/dxg ] || nvidia-smi -L > /dev/null 2>&1; }; then
  cuda=OFF
  echo "bootstrap: no NVIDIA GPU here: building without the CUDA backends (bootstrap.sh test builds them;"
  echo "  build/cpu stays configured so until it runs, or until cmake --preset cpu -DMLAGATE_WITH_CUDA=ON)"
fi
cmake --preset cpu "${launcher[@]}" -DMLAGATE_WITH_CUDA=$cuda
if [ "$mode" = run ]; then
  # What `run` needs alone (mlagate and the modules it loads); the tests build with `test`.
  cmake --build --preset cpu -j"$(nproc)" --target mlagate
else
  cmake --build --preset cpu -j"$(nproc)"
fi

if [ "$mode" = run ]; then
  exec build/cpu/harness/mlagate run "$@"
else
  exec ctest --preset cpu "$@"
fi
