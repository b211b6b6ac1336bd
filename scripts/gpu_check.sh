#!/usr/bin/env bash
# The GPU machine's check: configure with what is preinstalled there (cmake and
# ninja from the torch venv, system libraries; no network, nothing installed),
# build mlagate and the GPU tests, run the GPU tests (ctest label `device`),
# run every suite on the CUDA backends in every op, and time the vllm suite.
# Logs, reports and a summary go to $OUT (the device tool's folder) or out/gpu.
#
# Usage: scripts/gpu_check.sh [stage...]     stages: configure build perf test suites
#        (default: all of them, in that order; `test` and `suites` run side by side)
# Environment: MLAGATE_GPU_TORCH=1 also builds the libtorch code (PyTorch's
# cmake prefix); MLAGATE_GPU_JOBS sets the build parallelism (default nproc);
# MLAGATE_GPU_BUILD the build folder (default build/gpu); MLAGATE_GPU_CTEST_ARGS
# extra ctest arguments (e.g. -E CudaSuites to leave the long suite tests out).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
out="${OUT:-$root/out/gpu}"
mkdir -p "$out"
build="${MLAGATE_GPU_BUILD:-$root/build/gpu}"
M="$build/harness/mlagate"
jobs="${MLAGATE_GPU_JOBS:-$(nproc)}"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(configure build perf test suites)
log="$out/gpu_check.log"   # everything, in order
summary="$out/summary.txt" # what the closing note quotes
: >"$summary"

say() { echo "$*" | tee -a "$log" "$summary"; }
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

# cmake and ninja: the torch venv's (cmake 4.x there), else whatever is on PATH.
venv_bin="$(python3 -c 'import sys, os; print(os.path.join(sys.prefix, "bin"))' 2>/dev/null || true)"
[ -n "$venv_bin" ] && [ -x "$venv_bin/cmake" ] && export PATH="$venv_bin:$PATH"

say "== gpu_check $(date -u +%FT%TZ) on $(hostname), $(nproc) cores, stages: ${stages[*]}"
{ nvidia-smi -L; nvcc --version | tail -2; cmake --version | head -1; echo "ninja $(ninja --version)"; } 2>&1 | tee -a "$log" "$summary"

if want configure; then
  torch_args=(-DMLAGATE_WITH_TORCH=OFF)
  if [ "${MLAGATE_GPU_TORCH:-0}" = 1 ]; then
    torch_args=(-DMLAGATE_WITH_TORCH=ON "-DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')")
  fi
  t0=$SECONDS
  if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAGATE_BUILD_TESTS=ON -DMLAGATE_BUILD_BENCH=OFF \
      -DCMAKE_CUDA_ARCHITECTURES=90a "${torch_args[@]}" >>"$log" 2>&1; then
    say "configure FAILED (tail of the log:)"; tail -30 "$log" | tee -a "$summary"; exit 2
  fi
  say "configure: $((SECONDS - t0)) s; $(grep -E '^-- mlagate ' "$log" | tail -1)"
fi

if want build; then
  t0=$SECONDS
  targets=(mlagate test_device)
  [ "${MLAGATE_GPU_TORCH:-0}" = 1 ] && targets+=(test_torch)  # the torch reference on the CPU and CUDA
  if ! cmake --build "$build" -j"$jobs" --target "${targets[@]}" >>"$log" 2>&1; then
    say "build FAILED (errors:)"; grep -E "error|FAILED" "$log" | head -30 | tee -a "$summary"; exit 2
  fi
  say "build (${targets[*]}, -j$jobs): $((SECONDS - t0)) s"
  "$M" list backends 2>&1 | tee -a "$log" "$summary"
fi

# One mlagate run; its summary table and failures go to the summary, its
# JSON report next to the logs.
run_suite() {
  local name=$1; shift
  local t0=$SECONDS rc
  "$M" run "$@" --no-progress --json "$out/reports/$name.json" >"$out/reports/$name.txt" 2>&1
  rc=$?
  { echo "-- mlagate run $* (exit $rc, $((SECONDS - t0)) s wall)"; grep -E -A2 "^(INCORRECT|NONFINITE|CRASHED|TIMEOUT|INVALID)" "$out/reports/$name.txt" | head -40
    sed -n '/^backend /,$p' "$out/reports/$name.txt"; } | tee -a "$summary" "$log"
  return $rc
}

mkdir -p "$out/reports"
if want perf; then
  # Alone on the machine, first: the vllm suite (layer op) on every GPU
  # backend with the GPU golden; then with the Eigen golden, and with the
  # seed test's policy (no baseline emulation), to show where the time goes.
  say "== perf: vllm suite, layer op, cuda.* (wall time of the whole command, golden and baseline included)"
  for variant in "reference cuda:--reference cuda" "reference cuda, policy vllm:--reference cuda --policy vllm"; do
    label=${variant%%:*}; args=${variant#*:}
    t0=$(date +%s%N)
    # shellcheck disable=SC2086
    run_suite "perf_$(echo "$label" | tr -c '[:lower:]' '_')" --suite vllm --backend 'cuda.*' $args
    ms=$((($(date +%s%N) - t0) / 1000000))
    say "vllm on cuda.* ($label): $((ms / 1000)).$(printf '%03d' $((ms % 1000))) s wall"
  done
fi

pids=()
if want test; then
  say "== GPU tests: ctest -L device"
  # shellcheck disable=SC2086  # MLAGATE_GPU_CTEST_ARGS: extra ctest arguments, e.g. -E 'CudaSuites'
  ( ctest --test-dir "$build" -L device -V -j4 --timeout 900 ${MLAGATE_GPU_CTEST_ARGS:-} >"$out/ctest.log" 2>&1
    echo "ctest exit $?" >>"$out/ctest.log" ) &
  pids+=($!)
  if [ "${MLAGATE_GPU_TORCH:-0}" = 1 ]; then
    ( "$build/tests/torch/test_torch" >"$out/test_torch.log" 2>&1; echo "test_torch exit $?" >>"$out/test_torch.log" ) &
    pids+=($!)
  fi
fi
if want suites; then
  say "== suites: every suite on cuda.* in every op; fp8 formats; forced splits; the GPU golden"
  ( for s in smoke edges vllm; do
      run_suite "suite_$s" --suite "$s" --backend 'cuda.*' --op layer,decode,prefill,cache_write
    done
    run_suite "suite_smoke_fp8" --suite smoke --kv-cache-dtype fp8,fp8_e4m3,fp8_ds_mla,fp8_ds_mla:raw --dtype bf16 \
      --backend 'cuda.*' --op layer,decode,cache_write
    run_suite "suite_edges_splits1" --suite edges --backend cuda.splitkv --splits 1 --op layer,decode
    run_suite "suite_edges_splits1000" --suite edges --backend cuda.splitkv --splits 1000 --op layer,decode
    run_suite "suite_vllm_reference_cuda" --suite vllm --backend 'cuda.*' --reference cuda --op layer,decode ) &
  pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p"; done

if want test; then
  { grep -E "Test +#|tests passed|tests failed|Total Test time|ctest exit" "$out/ctest.log"
    # What the tests print (ctest -V prefixes each line with the test's number).
    grep -E "^[0-9]+: (cuda golden|cache_write:|determinism:|planted|device [0-9]|cuda\.(ref|splitkv): |smoke|edges|vllm)" \
      "$out/ctest.log" | sed -E 's/^[0-9]+: //' | sort -u | head -60
    grep -E "^[0-9]+: .*(Failure|FAILED|Expected|Which is|exception)" "$out/ctest.log" | head -40
  } | tee -a "$summary"
fi
( cd "$out" && tar -czf reports.tgz reports && rm -rf reports )
say "== gpu_check done in ${SECONDS} s"
