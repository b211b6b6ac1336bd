#!/usr/bin/env bash
# Where a run's time goes: runs `mlagate run ... --profile --json` under
# /usr/bin/time and prints the phase table (its rows sum to the wall; the
# "unaccounted" row is what no phase names), the CPU time and peak memory of
# the parent (workers' CPU is in the children's figure /usr/bin/time adds), and
# the load average, since wall figures on a shared machine mean little without
# it. A benchmark, not a test: nothing here fails on a slow machine.
#
# usage: scripts/profile_run.sh [mlagate binary] -- <run flags>
#   scripts/profile_run.sh -- --suite vllm --backend 'cpu.*'
#   scripts/profile_run.sh build/cpu/harness/mlagate -- --suite smoke --backend 'cuda.*' --reference cuda
set -euo pipefail
M=build/cpu/harness/mlagate
if [[ $# -gt 0 && $1 != -- ]]; then M=$1; shift; fi
[[ ${1:-} == -- ]] && shift
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)  ($(nproc) cores)"
set +e
/usr/bin/time -f 'cpu: %U s user, %S s sys, %e s wall, peak RSS %M KiB (parent and waited-for workers)' \
  "$M" run "$@" --profile -q --json "$out/r.json" 2>"$out/time.txt" | sed -n '/^profile/,$p'
rc=${PIPESTATUS[0]}
set -e
tail -n 1 "$out/time.txt"
# MLAGATE_PROFILE_JSON=FILE keeps the run's JSON report (records to compare between runs).
[[ -n ${MLAGATE_PROFILE_JSON:-} && -f $out/r.json ]] && cp "$out/r.json" "$MLAGATE_PROFILE_JSON"
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"
if command -v python3 >/dev/null; then
  # The JSON report's copy of the profile (up to the reports' writing) and the
  # records' per-backend sums: which backend's jobs triggered the shared work.
  python3 - "$out/r.json" <<'EOF'
import json, sys, collections
doc = json.load(open(sys.argv[1]))
per = collections.defaultdict(lambda: collections.Counter())
for r in doc["records"]:
    for k, v in r["timings_ms"].items():
        per[r["backend"]][k] += v or 0
keys = ["generate", "reference", "baseline", "cache", "glue", "run", "compare", "total"]
print("\nper backend (s)      " + " ".join(f"{k:>9}" for k in keys))
for b, c in per.items():
    print(f"{b:<20} " + " ".join(f"{c[k] / 1e3:9.3f}" for k in keys))
EOF
fi
exit "$rc"
