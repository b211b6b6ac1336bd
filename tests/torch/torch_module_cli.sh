#!/usr/bin/env bash
# TorchModule.*: the real mlagate with `--baseline torch`, which loads the
# libtorch reference module on first use (reference/torch/torch_module.h), and
# the loader's refusals, each an exit 2 that names the module and the reason.
# `run` also checks a case libtorch cannot compute here (fp16 on a CPU libtorch
# 1.x): SKIPPED with the reason, the run passing.
# Usage: torch_module_cli.sh run|missing|other_build|not_a_library MLAGATE OTHER_BUILD_MODULE
set -euo pipefail
mode=$1 bin=$2 other=$3
dir=$(mktemp -d "${TMPDIR:-/tmp}/mlagate_torch_module.XXXXXX")
trap 'rm -rf "$dir"' EXIT
args=(run --suite smoke --filter 'tp16/bf16' --backend cpu.paged --quiet --no-progress)

# Exit 2 and a message naming $2 and matching $3, with MLAGATE_TORCH_REFERENCE_MODULE=$1.
refused() {
  local rc=0
  MLAGATE_TORCH_REFERENCE_MODULE=$1 "$bin" "${args[@]}" --baseline torch > "$dir/out" 2> "$dir/err" || rc=$?
  cat "$dir/err"
  [ "$rc" -eq 2 ] || { echo "FAIL: exit $rc, expected 2"; exit 1; }
  grep -q -- "--baseline torch: no libtorch reference" "$dir/err" || { echo "FAIL: no clear message"; exit 1; }
  grep -q -- "$2" "$dir/err" && grep -Eq -- "$3" "$dir/err" || { echo "FAIL: expected '$2' and '$3'"; exit 1; }
}

case "$mode" in
  run)
    # The torch baseline loads the module (the dynamic loader's log names the
    # file) and a correct backend passes with it; a run without it loads
    # neither the module nor, where mlagate does not link it (no torch.sdpa.*
    # backends), libtorch.
    LD_DEBUG=files "$bin" "${args[@]}" --baseline torch --json "$dir/torch.json" 2> "$dir/torch.log"
    LD_DEBUG=files "$bin" "${args[@]}" --json "$dir/emulated.json" 2> "$dir/emulated.log"
    grep -q 'file=[^ ]*libmlagate_torch_reference\.so' "$dir/torch.log" ||
      { echo "FAIL: --baseline torch did not load the module"; exit 1; }
    if grep -q 'libmlagate_torch_reference\.so' "$dir/emulated.log"; then
      echo "FAIL: a run without --baseline torch loaded the module"; exit 1
    fi
    if ! readelf -d "$bin" 2>/dev/null | grep -q 'NEEDED.*libtorch'; then
      if grep -q 'file=[^ ]*libtorch' "$dir/emulated.log"; then echo "FAIL: a run without --baseline torch loaded libtorch"; exit 1; fi
      echo "a run without --baseline torch loads no libtorch"
    fi
    python3 - "$dir/torch.json" "$dir/emulated.json" <<'PY'
import json, sys
t, e = (json.load(open(p))["records"] for p in sys.argv[1:3])
assert len(t) == len(e) > 0, (len(t), len(e))
for a, b in zip(t, e):
    assert a["id"] == b["id"] and a["status"] == b["status"] == "PASSED", (a["id"], a["status"], b["status"])
print(f"{len(t)} records passed with the torch baseline and with the emulated one")
PY
    # The whole smoke suite, its fp16 case too: where libtorch cannot compute
    # it (libtorch 1.x on the CPU has no fp16 matmul) its record is SKIPPED
    # with the reason and the run passes; it is never the backend's failure
    # (it was CRASHED, exit 1).
    rc=0
    "$bin" run --suite smoke --backend cpu.paged --quiet --no-progress --baseline torch \
      --json "$dir/smoke.json" > "$dir/smoke.out" 2>&1 || rc=$?
    cat "$dir/smoke.out"
    [ "$rc" -eq 0 ] || { echo "FAIL: --baseline torch on the smoke suite: exit $rc"; exit 1; }
    python3 - "$dir/smoke.json" <<'PY'
import json, sys
recs = json.load(open(sys.argv[1]))["records"]
assert any("/fp16/" in r["id"] for r in recs), "no fp16 record"
for r in recs:
    ok = r["status"] == "PASSED" or ("/fp16/" in r["id"] and r["status"] == "SKIPPED"
                                     and r["message"].startswith("--baseline torch cannot compute this case")
                                     and "no fp16 matmul on the CPU" in r["message"])
    assert ok, (r["id"], r["status"], r["message"])
    print(r["id"], r["status"], r["message"])
PY
    ;;
  missing) refused "$dir/none.so" "$dir/none.so" "not there" ;;
  other_build) refused "$other" "$other" "from another build \(0\.0\.0\+another-build" ;;
  not_a_library)
    echo "not an ELF file" > "$dir/text.so"
    refused "$dir/text.so" "$dir/text.so" "(invalid ELF header|file too short)" ;;
  *) echo "usage: $0 run|missing|other_build|not_a_library MLAGATE OTHER_BUILD_MODULE" >&2; exit 2 ;;
esac
