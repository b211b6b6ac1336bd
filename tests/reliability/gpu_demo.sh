#!/usr/bin/env bash
# Isolation and the sanitizer on the GPU machine (harness/reliability/RELIABILITY.md, "Chasing a NaN"):
# builds mlagate and the planted-fault plugins like scripts/gpu_check.sh, then
# shows a segfault, an abort, a hang and a CUDA illegal address recorded as
# CRASHED / TIMEOUT while the run goes on, the guard band catching a device
# out-of-bounds write, compute-sanitizer memcheck naming the faulting kernel,
# and runs test_reliability (its CudaFaults tests need the GPU).
# Usage: tests/reliability/gpu_demo.sh   (logs to $OUT or out/gpu-rel)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
out="${OUT:-$PWD/out/gpu-rel}"
mkdir -p "$out"
build="${MLAGATE_GPU_BUILD:-$PWD/build/gpu-rel}"
venv_bin="$(python3 -c 'import sys, os; print(os.path.join(sys.prefix, "bin"))' 2>/dev/null || true)"
[ -n "$venv_bin" ] && [ -x "$venv_bin/cmake" ] && export PATH="$venv_bin:$PATH"
log="$out/gpu_demo.log"
{
  nvidia-smi -L
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAGATE_BUILD_TESTS=ON -DMLAGATE_BUILD_BENCH=OFF \
    -DMLAGATE_WITH_TORCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90a >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 2; }
  t0=$SECONDS
  cmake --build "$build" -j"$(nproc)" --target mlagate mlagate_reliability_plugin mlagate_cuda_fault_plugin test_reliability \
    >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -30; exit 2; }
  echo "build: $((SECONDS - t0)) s"
  M="$build/harness/mlagate"
  P="--plugin $build/tests/reliability/libmlagate_reliability_plugin.so --plugin $build/tests/reliability/libmlagate_cuda_fault_plugin.so"
  echo; echo "\$ MLAGATE_TEST_FAULT_ON=mixed_small mlagate run --suite smoke --backend 'rel.segv,rel.abort,rel.hang,rel.cuda_illegal_address,cuda.ref' --timeout 5 --json crash.json"
  t0=$SECONDS
  MLAGATE_TEST_FAULT_ON=mixed_small "$M" run $P --suite smoke --backend 'rel.segv,rel.abort,rel.hang,rel.cuda_illegal_address,cuda.ref' \
    --timeout 5 --no-progress --json "$out/crash.json"
  echo "(exit $?, $((SECONDS - t0)) s)"
  echo; echo "\$ mlagate run --spec small_decode --tp 16 --backend rel.cuda_oob_write,rel.cuda_illegal_address --sanitize memcheck"
  "$M" run $P --spec small_decode --tp 16 --backend rel.cuda_oob_write,rel.cuda_illegal_address --sanitize memcheck \
    --no-progress --json "$out/sanitize.json"
  echo "(exit $?)"
  python3 - "$out/sanitize.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["records"]:
    print("--", r["backend"], r["status"], "\n", r["message"], "\n", r.get("details", "")[:1500])
PY
  echo; echo "\$ test_reliability"
  # Bounded, and logged whole as it goes (a stall shows which test it is in).
  (cd "$build" && timeout 300 ./tests/reliability/test_reliability >"$out/test_reliability.log" 2>&1; echo "(exit $?)")
  grep -E "^\[ +(RUN|OK|FAILED|SKIPPED|PASSED) +\]|Failure|Skipped" "$out/test_reliability.log" | head -80
} 2>&1 | tee "$log"
