#!/usr/bin/env bash
# TorchModule.*: the real mlagate with `--baseline torch`, which loads the
# libtorch reference module on first use (reference/torch/torch_module.h), and
# the loader's refusals, each an exit 2 that names the module and the reason.
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
    ;;
  missing) refused "$dir/none.so" "$dir/none.so" "not there" ;;
  other_build) refused "$other" "$other" "from another build \(0\.0\.0\+another-build" ;;
  not_a_library)
    echo "not an ELF file" > "$dir/text.so"
    refused "$dir/text.so" "$dir/text.so" "(invalid ELF header|file too short)" ;;
  *) echo "usage: $0 run|missing|other_build|not_a_library MLAGATE OTHER_BUILD_MODULE" >&2; exit 2 ;;
esac
