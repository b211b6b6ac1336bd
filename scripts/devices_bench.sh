#!/usr/bin/env bash
# What several GPUs buy: the same `mlagate run` on one device and on several,
# alternately, each under /usr/bin/time with nvidia-smi sampling every 250 ms
# (where there is one), then the medians and their ratio, and whether every
# run's records (status and every metric) equal the first run's. A benchmark
# for PERFORMANCE.md's figures, not a test: nothing here fails on a slow
# machine; it exits 1 only when records differ between runs.
#
# usage: scripts/devices_bench.sh [-n RUNS] [-m MLAGATE] [-d DEVICES] [-e VAR=VALUE]... [-- <run flags>]
#   -n RUNS     pairs of runs (default 2): one device, then several, alternately
#   -m MLAGATE  the binary (default build/gpu/harness/mlagate, else build/cpu/harness/mlagate)
#   -d DEVICES  the several-device flag's value (default all; e.g. 0,1)
#   -e VAR=VAL  environment of every run (repeatable), e.g. -e MLAGATE_CUDA_SYNC=block
#   run flags   default: the 4-seed vllm run of issue 33,
#               --suite vllm --seed 0,1,2,3 --backend 'cuda.ref,cuda.splitkv,cuda.sparse,torch.*' --reference cuda
# The one-device runs see only the first device (CUDA_VISIBLE_DEVICES: the first
# entry of the current value, else 0). BENCH_KEEP=DIR keeps the JSON reports.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
runs=2 M="" devices=all envs=()
while getopts "n:m:d:e:" o; do
  case $o in
    n) runs=$OPTARG ;;
    m) M=$OPTARG ;;
    d) devices=$OPTARG ;;
    e) envs+=("$OPTARG") ;;
    *) sed -n 2,17p "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ ${1:-} == -- ]] && shift
flags=("$@")
((${#flags[@]})) || flags=(--suite vllm --seed 0,1,2,3 --backend 'cuda.ref,cuda.splitkv,cuda.sparse,torch.*' --reference cuda)
if [[ -z $M ]]; then
  M=build/gpu/harness/mlagate
  [[ -x $M ]] || M=build/cpu/harness/mlagate
fi
[[ -x $M ]] || { echo "devices_bench: no mlagate binary at $M (-m)" >&2; exit 2; }
first=${CUDA_VISIBLE_DEVICES:-0}
first=${first%%,*}
out=${BENCH_KEEP:-$(mktemp -d)}
mkdir -p "$out"
[[ -n ${BENCH_KEEP:-} ]] || trap 'rm -rf "$out"' EXIT

echo "devices_bench: $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); $M run ${flags[*]}"
command -v nvidia-smi >/dev/null && nvidia-smi -L
one=() several=() reports=() rc_all=0
run_one() {  # label, CUDA_VISIBLE_DEVICES for the run (empty: as it is), extra run flags...
  local label=$1 visible=$2; shift 2
  local json="$out/$label.json" smi="$out/$label.smi" pid=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits -lms 250 >"$smi" 2>/dev/null &
    pid=$!
  fi
  /usr/bin/time -f '%e %U %S' -o "$out/$label.time" env "${envs[@]}" ${visible:+CUDA_VISIBLE_DEVICES=$visible} \
    "$M" run "${flags[@]}" "$@" --no-progress -q --json "$json" >"$out/$label.log" 2>&1
  local rc=$?
  [[ -n $pid ]] && { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }
  read -r wall user sys <"$out/$label.time"
  local busy=""
  [[ -s $smi ]] && busy=$(awk -F', ' '{s[$1]+=$2; n[$1]++} END {for (g in s) printf " gpu%s %.0f%%", g, s[g]/n[g]}' "$smi")
  printf '%-10s exit %d  %7.2f s wall  %7.1f s user  %6.1f s sys %s\n' "$label" "$rc" "$wall" "$user" "$sys" "$busy"
  reports+=("$json")
  REPLY=$wall
}
for ((i = 1; i <= runs; i++)); do
  # One device first in odd pairs, several first in even ones: a drift of the
  # host (its neighbours, its caches) falls on both.
  if ((i % 2)); then
    run_one "one_$i" "$first"; one+=("$REPLY")
    run_one "several_$i" "" --devices "$devices"; several+=("$REPLY")
  else
    run_one "several_$i" "" --devices "$devices"; several+=("$REPLY")
    run_one "one_$i" "$first"; one+=("$REPLY")
  fi
done
python3 - "${reports[@]}" <<'EOF' || rc_all=1
import json, sys
def records(path):
    doc = json.load(open(path))
    return {(r["id"], r["backend"], r["op"], r.get("block_size"), r.get("policy")):
            (r["status"], json.dumps(r["metrics"], sort_keys=True)) for r in doc["records"]}
base = records(sys.argv[1])
bad = 0
for p in sys.argv[2:]:
    other = records(p)
    diff = sorted(k for k in base.keys() | other.keys() if base.get(k) != other.get(k))
    if diff:
        bad += 1
        print(f"records differ: {p.rsplit('/', 1)[-1]} against {sys.argv[1].rsplit('/', 1)[-1]}: {len(diff)}, first {diff[0]}")
print(f"records: {len(base)} a run, {'identical in every run' if not bad else f'{bad} run(s) differ'}")
sys.exit(1 if bad else 0)
EOF
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
m1=$(median "${one[@]}") ms=$(median "${several[@]}")
awk -v a="$m1" -v b="$ms" -v d="$devices" \
  'BEGIN {printf "median wall: one device %.2f s, --devices %s %.2f s: %.2fx of one device\n", a, d, b, b / a}'
exit $rc_all
