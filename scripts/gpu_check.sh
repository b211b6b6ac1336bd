#!/usr/bin/env bash
# The GPU machine's check: configure with what is preinstalled there (cmake and
# ninja from the torch venv, system libraries; no network, nothing installed),
# build mlagate and the GPU tests, run the GPU tests (ctest label `device`),
# run every suite on the CUDA backends in every op, and time the vllm suite.
# Logs, reports and a summary go to $OUT (the device tool's folder) or out/gpu.
#
# Usage: scripts/gpu_check.sh [stage...]     stages: configure build perf bench test suites (python)
#        (default: all of them, in that order; `test` and `suites` run side by side;
#        `bench` is `mlagate bench`, alone on the machine: MLAGATE_GPU_BENCH_SET
#        (default full) and MLAGATE_GPU_BENCH_BACKENDS (default every backend))
# `plugins` builds the example plugins out of tree and runs them (the CUDA one
# on the vllm suite) and the plugin completeness test on the whole vllm suite
# (MLAGATE_GPU_PLUGIN_EXAMPLES="cuda cpu" picks the examples,
# MLAGATE_GPU_PLUGIN_COMPLETENESS=0 leaves the CPU-only completeness test out).
# `python` builds the Python module against the torch venv's interpreter (with
# MLAGATE_GPU_TORCH=1 at configure: its pybind11 headers are torch's), runs
# python/tests there (torch and CUDA tests included) and, with
# MLAGATE_GPU_VLLM=<vLLM checkout or its triton_decode_attention.py>, vLLM's
# Triton MLA decode through the module on the vllm, edges and fp8 suites;
# MLAGATE_GPU_VLLM_SPARSE=<vLLM checkout or its triton_sparse_mla_kernel.py>
# (else MLAGATE_GPU_VLLM where that is a checkout) adds vLLM's Triton sparse MLA
# kernel (TRITON_MLA_SPARSE) on the sparse and nope suites' sparse_decode op.
# The module needs a compiler that links the shared libstdc++: the image's
# default CXX (/opt/gcc/bin/g++, a wrapper) links it statically, and a second
# C++ runtime inside a Python extension crashes beside torch's. With the
# `python` stage the build uses the system compilers (MLAGATE_GPU_BUILD
# defaults to build/gpu-py then, so the usual build/gpu is left as it is).
# Environment: MLAGATE_GPU_TORCH=1 also builds the libtorch code (PyTorch's
# cmake prefix); MLAGATE_GPU_FLASHMLA=<FlashMLA checkout>,
# MLAGATE_GPU_FLASHINFER=<flashinfer/include> and MLAGATE_GPU_FLASH_ATTN=<flash-attention
# checkout> build the kernel-library adapters (checkouts the user already has;
# nothing is fetched; MLAGATE_GPU_FLASH_ATTN_KERNELS=<libmlagate_flash_attn_kernels.a>
# reuses FA3's kernels from an earlier build of the same checkout); MLAGATE_GPU_JOBS sets the build parallelism (default nproc);
# MLAGATE_GPU_BUILD the build folder (default build/gpu); MLAGATE_GPU_CMAKE_ARGS more
# configure arguments, e.g. -DMLAGATE_FLASHINFER_VERSION=fb28d72 for checkouts without .git
# (the bug reports of mlagate triage name the libraries' commits); MLAGATE_GPU_CTEST_ARGS
# extra ctest arguments (e.g. -E CudaSuites to leave the long suite tests out).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
out="${OUT:-$root/out/gpu}"
mkdir -p "$out"
stages_seen=" $* "
if [[ "$stages_seen" == *" python "* ]]; then
  export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
  build="${MLAGATE_GPU_BUILD:-$root/build/gpu-py}"
else
  build="${MLAGATE_GPU_BUILD:-$root/build/gpu}"
fi
M="$build/harness/mlagate"
jobs="${MLAGATE_GPU_JOBS:-$(nproc)}"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(configure build perf bench test suites)
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
    torch_args=(-DMLAGATE_WITH_TORCH=ON "-DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
                "-DPython3_EXECUTABLE=$(command -v python3)"
                "-DMLAGATE_PYBIND11_INCLUDE_DIR=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "include"))')")
  fi
  # No Google Benchmark package there: a google/benchmark checkout the user put
  # in the git-ignored third_party_local/benchmark (and carried) is built for `mlagate bench`.
  lib_args=()
  [ -n "${MLAGATE_GPU_FLASHMLA:-}" ] && lib_args+=("-DMLAGATE_FLASHMLA_SOURCE_DIR=$MLAGATE_GPU_FLASHMLA")
  [ -n "${MLAGATE_GPU_FLASHINFER:-}" ] && lib_args+=("-DMLAGATE_FLASHINFER_INCLUDE_DIR=$MLAGATE_GPU_FLASHINFER")
  [ -n "${MLAGATE_GPU_FLASH_ATTN:-}" ] && lib_args+=("-DMLAGATE_FLASH_ATTN_SOURCE_DIR=$MLAGATE_GPU_FLASH_ATTN")
  # Always given with the checkout, so that unsetting it compiles the kernels again.
  [ -n "${MLAGATE_GPU_FLASH_ATTN:-}" ] && lib_args+=("-DMLAGATE_FLASH_ATTN_KERNELS_LIB=${MLAGATE_GPU_FLASH_ATTN_KERNELS:-}")
  bench_args=()
  [ -f "$root/third_party_local/benchmark/CMakeLists.txt" ] &&
    bench_args=("-DMLAGATE_BENCHMARK_SOURCE_DIR=$root/third_party_local/benchmark")
  t0=$SECONDS
  if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAGATE_BUILD_TESTS=ON -DMLAGATE_BUILD_BENCH=OFF \
      -DCMAKE_CUDA_ARCHITECTURES=90a "${torch_args[@]}" "${lib_args[@]}" "${bench_args[@]}" ${MLAGATE_GPU_CMAKE_ARGS:-} >>"$log" 2>&1; then
    say "configure FAILED (tail of the log:)"; tail -30 "$log" | tee -a "$summary"; exit 2
  fi
  say "configure: $((SECONDS - t0)) s; $(grep -E '^-- mlagate ' "$log" | tail -1)"
fi

if want build; then
  t0=$SECONDS
  targets=(mlagate test_device)
  [ "${MLAGATE_GPU_TORCH:-0}" = 1 ] && targets+=(test_torch)  # the torch reference on the CPU and CUDA
  [ -n "${MLAGATE_GPU_FLASHMLA:-}${MLAGATE_GPU_FLASHINFER:-}${MLAGATE_GPU_FLASH_ATTN:-}" ] && targets+=(test_kernel_libs)
  targets+=(test_plugin)  # the plugins stage: PluginCompleteness on the whole vllm suite
  if ! cmake --build "$build" -j"$jobs" --target "${targets[@]}" >>"$log" 2>&1; then
    say "build FAILED (errors:)"; grep -E "error|FAILED" "$log" | head -30 | tee -a "$summary"; exit 2
  fi
  say "build (${targets[*]}, -j$jobs): $((SECONDS - t0)) s"
  "$M" list backends 2>&1 | tee -a "$log" "$summary"
fi

# Every GPU backend this build has (the CPU ones are CI's).
gpu_backends='cuda.*'
[ "${MLAGATE_GPU_TORCH:-0}" = 1 ] && gpu_backends+=',torch.*'
[ -n "${MLAGATE_GPU_FLASHMLA:-}" ] && gpu_backends+=',flashmla'
[ -n "${MLAGATE_GPU_FLASHINFER:-}" ] && gpu_backends+=',flashinfer*'
[ -n "${MLAGATE_GPU_FLASH_ATTN:-}" ] && gpu_backends+=',flash_attn*'
# The sparse ops' backends (the sparse and v4 suites), with cpu.sparse beside them.
sparse_backends='cpu.sparse,cuda.sparse'
[ -n "${MLAGATE_GPU_FLASHMLA:-}" ] && sparse_backends+=',flashmla.sparse'

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
  # backend with the GPU reference; then with the Eigen reference, and with the
  # seed test's policy (no baseline emulation), to show where the time goes.
  say "== perf: vllm suite, layer op, cuda.* (wall time of the whole command, golden and baseline included)"
  set -f  # the variants' backend globs reach mlagate unexpanded
  for variant in "reference cuda:--backend cuda.* --reference cuda" \
                 "reference cuda, policy vllm:--backend cuda.* --reference cuda --policy vllm" \
                 "every GPU backend, reference cuda:--backend $gpu_backends --reference cuda"; do
    label=${variant%%:*}; args=${variant#*:}
    t0=$(date +%s%N)
    # shellcheck disable=SC2086
    run_suite "perf_$(echo "$label" | tr -c '[:lower:]' '_')" --suite vllm $args
    ms=$((($(date +%s%N) - t0) / 1000000))
    say "vllm ($label; $args): $((ms / 1000)).$(printf '%03d' $((ms % 1000))) s wall"
  done
  set +f
fi

if want bench; then
  # Alone on the machine too: decode speed of every benchmarkable backend.
  set_name=${MLAGATE_GPU_BENCH_SET:-full}
  say "== bench: mlagate bench --case-set $set_name --backend '${MLAGATE_GPU_BENCH_BACKENDS:-*}'"
  t0=$SECONDS
  "$M" bench --case-set "$set_name" --backend "${MLAGATE_GPU_BENCH_BACKENDS:-*}" --json "$out/bench.json" \
    >"$out/bench.txt" 2>"$out/bench.err"
  rc=$?
  tee -a "$log" "$summary" <"$out/bench.txt"
  tail -5 "$out/bench.err" | tee -a "$log" "$summary"
  say "bench exit $rc, $((SECONDS - t0)) s wall"
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
  say "== suites on $gpu_backends (GPU golden): smoke, edges, fp8 in every op, vllm decode; forced splits; vllm layer with the Eigen golden; sparse and v4 on $sparse_backends; merge on cpu.merge,cuda.merge"
  ( for s in smoke edges; do
      run_suite "suite_$s" --suite "$s" --backend "$gpu_backends" --op layer,decode,prefill,cache_write --reference cuda
    done
    # vllm's layer op on every GPU backend is the perf stage's third run
    run_suite "suite_vllm" --suite vllm --backend "$gpu_backends" --op decode --reference cuda
    run_suite "suite_fp8" --suite fp8 --backend "$gpu_backends" --op layer,decode,cache_write --reference cuda
    run_suite "suite_gate" --suite gate --backend "$gpu_backends" --reference cuda   # the CI gate (repeat 2)
    run_suite "suite_edges_splits1" --suite edges --backend cuda.splitkv --splits 1 --op layer,decode
    run_suite "suite_edges_splits1000" --suite edges --backend cuda.splitkv --splits 1000 --op layer,decode
    run_suite "suite_vllm_eigen" --suite vllm --backend 'cuda.*' --op layer
    for s in sparse v4; do run_suite "suite_$s" --suite "$s" --backend "$sparse_backends" --repeat 2; done
    run_suite "suite_merge" --suite merge --backend 'cpu.merge,cuda.merge' --repeat 2 ) &
  pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p"; done

if want test; then
  { grep -E "Test +#|tests passed|tests failed|Total Test time|ctest exit" "$out/ctest.log"
    # What the tests print (ctest -V prefixes each line with the test's number).
    grep -E "^[0-9]+: (cuda golden|cache_write:|determinism:|planted|device [0-9]|cuda\.(ref|splitkv): |cuda\.sparse |flashmla\.sparse |flash_attn|stale |tma tail|kernel ms|raw scales|smoke|edges|vllm)" \
      "$out/ctest.log" | sed -E 's/^[0-9]+: //' | sort -u | head -60
    grep -E "^[0-9]+: .*(Failure|FAILED|Expected|Which is|exception)" "$out/ctest.log" | head -40
  } | tee -a "$summary"
fi
if want plugins; then
  # "Test your kernel in ten minutes" (backends/plugin/README.md) on the GPU machine: both
  # example plugins copied out of the tree, built against include/ alone, run
  # on the whole vllm suite; then the in-tree-twin completeness test on it.
  say "== plugins: example plugins built out of tree, vllm suite; PluginCompleteness on the whole vllm suite"
  pw="$build/plugin_work"
  rm -rf "$pw" && mkdir -p "$pw"
  for ex in ${MLAGATE_GPU_PLUGIN_EXAMPLES:-cuda cpu}; do
    cp -r "$root/examples/plugin_$ex" "$pw/$ex"
    if cmake -S "$pw/$ex" -B "$pw/$ex/build" -DMLAGATE_INCLUDE_DIR="$root/include" -DCMAKE_CUDA_ARCHITECTURES=90a \
         >>"$log" 2>&1 && cmake --build "$pw/$ex/build" >>"$log" 2>&1; then
      so=$(ls "$pw/$ex/build"/lib*.so | head -1)
      run_suite "plugin_${ex}_vllm" --plugin "$so" --backend "example.${ex}_decode" --suite vllm --reference cuda
      if [ "$ex" = cuda ]; then  # its sparse decode (plugin ABI 1.2) on both sparse suites
        run_suite plugin_cuda_sparse --plugin "$so" --backend example.cuda_sparse --suite sparse --reference cuda
        run_suite plugin_cuda_v4 --plugin "$so" --backend example.cuda_sparse --suite v4 --reference cuda
      fi
    else
      say "example plugin_$ex: build FAILED"
    fi
  done
  [ "${MLAGATE_GPU_PLUGIN_COMPLETENESS:-1}" = 1 ] || say "PluginCompleteness: not run (MLAGATE_GPU_PLUGIN_COMPLETENESS=0)"
  [ "${MLAGATE_GPU_PLUGIN_COMPLETENESS:-1}" = 1 ] && {
  t0=$SECONDS
  MLAGATE_LONG_TESTS=1 "$build/tests/plugin/test_plugin" --gtest_filter='PluginCompleteness.*' >"$out/plugin_completeness.log" 2>&1
  rc=$?
  { grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) +\]" "$out/plugin_completeness.log"; echo "PluginCompleteness exit $rc, $((SECONDS - t0)) s"; } |
    tee -a "$log" "$summary"
  }
fi
( cd "$out" && tar -czf reports.tgz reports && rm -rf reports )
if want python; then
  say "== python: the module on $(python3 --version 2>&1), torch $(python3 -c 'import torch; print(torch.__version__)' 2>&1)"
  t0=$SECONDS
  if ! cmake --build "$build" -j"$jobs" --target mlagate mlagate_python >>"$log" 2>&1; then
    say "python module: build FAILED (errors:)"; grep -E "error|FAILED|Python module" "$log" | head -20 | tee -a "$summary"
  else
    say "python module build: $((SECONDS - t0)) s"
    export PYTHONPATH="$build/python" MLAGATE_BIN="$M"
    python3 -m pytest -q -rs -p no:cacheprovider python/tests --junitxml="$out/python_tests.xml" >"$out/python_tests.log" 2>&1
    say "python/tests exit $?: $(tail -1 "$out/python_tests.log")"
    grep -E "^SKIPPED|FAILED" "$out/python_tests.log" | head -10 | tee -a "$summary"
    if [ -n "${MLAGATE_GPU_VLLM:-}" ]; then
      for suite in vllm edges fp8; do
        t0=$SECONDS
        python3 python/examples/vllm_triton_mla.py --vllm "$MLAGATE_GPU_VLLM" --suite "$suite" --op decode,layer \
          --json "$out/triton_$suite.json" --markdown "$out/triton_$suite.md" >"$out/triton_$suite.log" 2>&1
        say "vllm.triton_mla on $suite (decode, layer): exit $?, $((SECONDS - t0)) s wall"
        grep -E "^(numpy|vllm|TOTAL|PASS|FAIL)" "$out/triton_$suite.log" | tail -3 | tee -a "$summary"
      done
    fi
    # vLLM's Triton merge_attn_states on the merge suite (from MLAGATE_GPU_VLLM, else an installed vLLM; skips without either).
    t0=$SECONDS
    python3 python/examples/vllm_triton_merge.py ${MLAGATE_GPU_VLLM:+--vllm "$MLAGATE_GPU_VLLM"} --suite merge \
      --json "$out/triton_merge.json" >"$out/triton_merge.log" 2>&1
    say "vllm.triton_merge on merge: exit $?, $((SECONDS - t0)) s wall"
    grep -E "^(skipped|vllm|TOTAL|PASS|FAIL)|skipped:" "$out/triton_merge.log" | tail -3 | tee -a "$summary"
    # vLLM's Triton sparse MLA kernel on the sparse suite's decode op, and on nope, whose head size
    # 512 it refuses (every record NOT_SUPPORTED: exit 4); skips ("skipped: ...") without a kernel file.
    vllm_sparse="${MLAGATE_GPU_VLLM_SPARSE:-}"
    [ -z "$vllm_sparse" ] && [ -d "${MLAGATE_GPU_VLLM:-}" ] && vllm_sparse=$MLAGATE_GPU_VLLM
    for suite in sparse nope; do
      t0=$SECONDS
      python3 python/examples/vllm_triton_mla_sparse.py ${vllm_sparse:+--vllm "$vllm_sparse"} --suite "$suite" \
        --op sparse_decode --json "$out/triton_sparse_$suite.json" >"$out/triton_sparse_$suite.log" 2>&1
      say "vllm.triton_mla_sparse on $suite (sparse_decode): exit $?, $((SECONDS - t0)) s wall"
      grep -E "^(vllm|TOTAL|PASS|FAIL)|skipped:|error:" "$out/triton_sparse_$suite.log" | tail -3 | tee -a "$summary"
    done
  fi
fi

say "== gpu_check done in ${SECONDS} s"
