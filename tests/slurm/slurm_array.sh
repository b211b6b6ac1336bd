#!/usr/bin/env bash
# The Slurm job array of harness/cli/SCALE.md, run on a real Slurm: a single-node cluster started
# here (munged, slurmctld, slurmd; no cgroups: proctrack/linuxproc, task/none), everything of it
# in one temporary directory. examples/slurm/submit.sh submits examples/slurm/gate.sbatch as an
# array of 4 tasks (one shard each) and examples/slurm/merge.sbatch after them, and waits; the
# merged JSON report and results file must then equal a one-process run of the same selection:
# the same records (case, backend, op), each with the same status, message and metrics, and
# bit-identical outputs (mlagate compare). The node declares 4 GRES gpus (links to /dev/null), so
# the script's `--gpus=1` is scheduled unchanged; the CPU backends do not use them.
# The command is SCALE.md's (its code block), and SCALE.md shows the three files verbatim.
#
# Exits 77 (ctest: skipped), saying why, where Slurm cannot run here: a command missing (apt-get
# install slurmctld slurmd slurm-client munge; scripts/bootstrap.sh test installs them), not
# root (its slurmd runs jobs as root), or a daemon that does not come up. Bounded in time
# (MLAGATE_SLURM_TIMEOUT, default 240 s); on any exit it cancels the jobs, stops the daemons and
# removes the directory (MLAGATE_SLURM_KEEP=1 keeps it).
# Usage: slurm_array.sh MLAGATE_BINARY SOURCE_DIR
set -u
export PATH="$PATH:/usr/sbin:/sbin"

mlagate=$(realpath "${1:?usage: slurm_array.sh MLAGATE_BINARY SOURCE_DIR}")
src=$(realpath "${2:?usage: slurm_array.sh MLAGATE_BINARY SOURCE_DIR}")
examples="$src/examples/slurm"
shards=4

start=$SECONDS
deadline=$((SECONDS + ${MLAGATE_SLURM_TIMEOUT:-240}))
left() { local l=$((deadline - SECONDS)); ((l > 1)) && echo "$l" || echo 1; }

skip() {
  echo "SKIPPED: $*"
  exit 77
}
tmp=""
fail() {
  echo "FAIL: $*"
  if [ -n "$tmp" ]; then
    for f in "$tmp"/slurmctld.log "$tmp"/slurmd.log "$tmp"/munged.log "$tmp"/jobs/*.log; do
      [ -f "$f" ] && { echo "--- tail of $f"; tail -n 15 "$f"; }
    done
  fi
  exit 1
}

[ "$(id -u)" -eq 0 ] || skip "not root: this test's slurmd runs the jobs as root (SlurmUser=root), as on CI"
for c in munged mungekey munge slurmctld slurmd sbatch squeue scontrol scancel sinfo python3 timeout; do
  command -v "$c" >/dev/null 2>&1 ||
    skip "no $c on PATH (apt-get install slurmctld slurmd slurm-client munge; scripts/bootstrap.sh test installs them)"
done
for f in gate.sbatch merge.sbatch submit.sh; do
  [ -f "$examples/$f" ] || fail "no $examples/$f"
done

# The documented example is the one run here: SCALE.md shows each file whole, in a code block,
# and the command this test runs (MLAGATE_RESULTS=1 examples/slurm/submit.sh ARGS), whose ARGS
# (the selection) every shard and the one-process run take.
args=$(python3 - "$src/harness/cli/SCALE.md" "$examples" <<'EOF'
import re, sys, pathlib
doc = pathlib.Path(sys.argv[1]).read_text()
blocks = [b.strip() for b in re.findall(r"^```[a-z]*\n(.*?)^```", doc, re.S | re.M)]
missing = [f for f in ("gate.sbatch", "merge.sbatch", "submit.sh")
           if (pathlib.Path(sys.argv[2]) / f).read_text().strip() not in blocks]
if missing:
    sys.exit("not in a code block of SCALE.md as they are: " + ", ".join(missing))
runs = [b[len(p):] for b in blocks for p in ["MLAGATE_RESULTS=1 examples/slurm/submit.sh "] if b.startswith(p) and "\n" not in b]
if len(runs) != 1:
    sys.exit("%d code blocks of SCALE.md are one line 'MLAGATE_RESULTS=1 examples/slurm/submit.sh ARGS'" % len(runs))
print(runs[0])
EOF
) || fail "SCALE.md does not show examples/slurm as they are, or the command this test runs"
eval "selection=($args)" || fail "SCALE.md's test command: cannot read its arguments: $args"
echo "SCALE.md's example: MLAGATE_RESULTS=1 examples/slurm/submit.sh $args"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mlagate-slurm.XXXXXX") || fail "mktemp"
chmod 711 "$tmp"  # munged wants its socket's directories executable by all
export SLURM_CONF="$tmp/slurm.conf"
pids=()  # the daemons, in start order
stop() {  # TERM, then KILL after 5 s
  kill -TERM "$1" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
cleanup() {
  trap - EXIT INT TERM HUP
  if [ ${#pids[@]} -gt 1 ]; then  # slurmctld started: cancel every job, wait up to 10 s for their ends
    timeout 10 scancel --quiet --full --user=root >/dev/null 2>&1
    for _ in $(seq 20); do
      [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  for ((k = ${#pids[@]} - 1; k > 0; k--)); do stop "${pids[k]}"; done  # slurmd, slurmctld
  # A job's processes, should any outlive slurmd: those with this cluster's SLURM_CONF.
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}; p=${p%/environ}
    [[ " $$ ${pids[*]} " == *" $p "* ]] && continue
    tr '\0' '\n' 2>/dev/null <"$e" | grep -qxF "SLURM_CONF=$SLURM_CONF" && kill -KILL "$p" 2>/dev/null
  done
  [ ${#pids[@]} -gt 0 ] && stop "${pids[0]}"  # munged
  if [ -n "${MLAGATE_SLURM_KEEP:-}" ]; then
    echo "kept $tmp"
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT
trap 'echo "FAIL: interrupted"; exit 1' INT TERM HUP

# munge: its own key, socket, pid, log and seed files.
mungekey --create --keyfile="$tmp/munge.key" >/dev/null 2>&1 ||
  dd if=/dev/urandom of="$tmp/munge.key" bs=1024 count=1 status=none || fail "no munge key"
chmod 400 "$tmp/munge.key"
munged --foreground --socket="$tmp/munge.sock" --key-file="$tmp/munge.key" --pid-file="$tmp/munged.pid" \
  --log-file="$tmp/munged.log" --seed-file="$tmp/munged.seed" >"$tmp/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do
  munge --socket="$tmp/munge.sock" -n 2>/dev/null | unmunge --socket="$tmp/munge.sock" >/dev/null 2>&1 && break
  sleep 0.1
done
munge --socket="$tmp/munge.sock" -n 2>/dev/null | unmunge --socket="$tmp/munge.sock" >/dev/null 2>&1 ||
  { cat "$tmp/munged.out"; skip "munged did not start (above)"; }

# Two free TCP ports for slurmctld and slurmd.
read -r ctld_port slurmd_port < <(python3 -c '
import random, socket
free = []
for p in random.sample(range(20000, 40000), 400):
    s = socket.socket()
    try:
        s.bind(("", p)); free.append(p)
    except OSError:
        pass
    finally:
        s.close()
    if len(free) == 2:
        break
print(*free)')
[ -n "${slurmd_port:-}" ] || skip "no free TCP ports in 20000-39999"

# The node as slurmd sees it (its name is `hostname -s`), with 4 gpus.
node=$(slurmd -C 2>/dev/null | head -n 1)
host=$(printf '%s\n' "$node" | sed -n 's/^NodeName=\([^ ]*\).*/\1/p')
[ -n "$host" ] || skip "slurmd -C does not describe this node"
mkdir -p "$tmp/state" "$tmp/spool" "$tmp/jobs"
cat >"$SLURM_CONF" <<EOF
ClusterName=mlagate
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge.sock
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=0
GresTypes=gpu
$node NodeAddr=127.0.0.1 Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
# GRES gpus need device files: four links to /dev/null (nothing opens them).
for i in 0 1 2 3; do ln -s /dev/null "$tmp/gpu$i"; done
echo "Name=gpu File=$tmp/gpu[0-3]" >"$tmp/gres.conf"
# No cgroup plugin is configured, but slurmd loads one to read the node; under cgroup v2 it asks
# systemd (dbus) for a scope, which a container without systemd lacks: then it makes its own.
# (Not tried: this machine has cgroup v1. Should slurmd still not start, the test skips.)
echo "IgnoreSystemdOnFailure=yes" >"$tmp/cgroup.conf"

slurmctld -D -c -f "$SLURM_CONF" >"$tmp/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$tmp/slurmd.out" 2>&1 &
pids+=($!)
state=""
for _ in $(seq 60); do  # the node idle, for up to 30 s
  state=$(timeout 5 sinfo -h -N -o %T 2>/dev/null)
  [ "$state" = idle ] && break
  sleep 0.5
done
if [ "$state" != idle ]; then
  tail -n 5 "$tmp/slurmctld.log" "$tmp/slurmd.log" "$tmp"/*.out 2>/dev/null
  skip "the single-node Slurm did not come up (node state '${state:-none}'; logs above)"
fi
up=$((SECONDS - start))
echo "slurm up in ${up} s: node $host ($(sinfo -h -N -o '%c CPUs, gres %G'))"

# The documented submission: the 4 shards as an array, then the merge; waits for the merge.
export PATH="$(dirname "$mlagate"):$PATH" MLAGATE_RESULTS=1
cd "$tmp/jobs" || fail "cd $tmp/jobs"
t0=$SECONDS
timeout "$(left)" "$examples/submit.sh" "${selection[@]}" >submit.out 2>&1
rc=$?
cat submit.out
[ "$rc" -ne 124 ] || fail "the jobs did not end within the time limit"
[ "$rc" -eq 0 ] || fail "submit.sh (the merge job) exited $rc"
t_slurm=$((SECONDS - t0))

# Slurm ran them (slurmctld's log: array task records are purged as they end): tasks 0..3 of the
# array and the merge each allocated once and exiting 0, the merge only after every task ended.
array_id=$(sed -n 's/^shards: job \([0-9]*\)$/\1/p' submit.out)
merge_id=$(sed -n 's/^Submitted batch job \([0-9]*\)$/\1/p' submit.out)
[ -n "$array_id" ] && [ -n "$merge_id" ] || fail "no job ids in submit.sh's output"
python3 - "$tmp/slurmctld.log" "$array_id" "$merge_id" "$shards" <<'EOF' || fail "the jobs as slurmctld logged them (above)"
import re, sys
log, array_id, merge_id, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
events = []  # (line number, start or end, job, node or exit status)
for i, line in enumerate(open(log)):
    m = re.search(r"sched: Allocate JobId=(\S+?)(?:\(\d+\))? NodeList=(\S+)", line)
    if m:
        events.append((i, "start", m.group(1), m.group(2)))
    m = re.search(r"_job_complete: JobId=(\S+?)(?:\(\d+\))? WEXITSTATUS (\d+)", line)
    if m:
        events.append((i, "end", m.group(1), m.group(2)))
errors = []
for j in ["%s_%d" % (array_id, t) for t in range(n)] + [merge_id]:
    starts = [e for e in events if e[1] == "start" and e[2] == j]
    ends = [e for e in events if e[1] == "end" and e[2] == j]
    if len(starts) != 1 or [e[3] for e in ends] != ["0"]:
        errors.append("job %s: %d starts, exit %s" % (j, len(starts), [e[3] for e in ends]))
    else:
        print("  job %s (%s) on %s: exit 0" % (j, "merge" if j == merge_id else "shard " + j.split("_")[1], starts[0][3]))
if not errors:
    merge_start = [e[0] for e in events if e[1] == "start" and e[2] == merge_id][0]
    if merge_start < max(e[0] for e in events if e[1] == "end" and e[2] != merge_id):
        errors.append("the merge started before every shard had ended")
sys.exit("; ".join(errors) or None)
EOF
for ((i = 0; i < shards; i++)); do
  for f in shard-$i.json shard-$i.xml shard-$i.h5; do [ -s "$f" ] || fail "task $i wrote no $f"; done
done
for f in all.json all.xml all.md all.h5; do [ -s "$f" ] || fail "the merge wrote no $f"; done

# The same selection in one process.
mkdir whole && cd whole || fail "mkdir whole"
t1=$SECONDS
timeout "$(left)" mlagate run "${selection[@]}" --no-progress --json whole.json --save-results whole.h5 \
  --isolate none >whole.out 2>&1
rc=$?
[ "$rc" -eq 0 ] || { cat whole.out; fail "the one-process run exited $rc"; }
t_whole=$((SECONDS - t1))
cd .. || fail "cd .."

# Reports: the same records, each with the same status, message and metrics (timings aside).
python3 - all.json whole/whole.json shard-*.json <<'EOF' || fail "the merged report is not the one-process run's"
import json, sys
merged, whole = (json.load(open(f)) for f in sys.argv[1:3])
def records(report, name):
    out = {}
    for r in report["records"]:
        key = (r["id"], r["backend"], r["op"])
        if key in out:
            sys.exit("%s: record %s twice" % (name, key))
        out[key] = {k: v for k, v in r.items() if k != "timings_ms"}
    return out
m, w = records(merged, "all.json"), records(whole, "whole.json")
if m.keys() != w.keys():
    sys.exit("records only merged: %s; only in one process: %s" % (sorted(m.keys() - w.keys())[:5], sorted(w.keys() - m.keys())[:5]))
differ = [k for k in w if m[k] != w[k]]
if differ:
    k = differ[0]
    fields = {f: (m[k].get(f), w[k].get(f)) for f in set(m[k]) | set(w[k]) if m[k].get(f) != w[k].get(f)}
    sys.exit(("%d records differ, first %s (merged, one process): %s" % (len(differ), k, fields))[:1500])
if merged["summary"] != whole["summary"]:
    sys.exit("summaries differ: %s vs %s" % (merged["summary"], whole["summary"]))
per_shard = [len(json.load(open(f))["records"]) for f in sys.argv[3:]]
statuses = {}
for r in w.values():
    statuses[r["status"]] = statuses.get(r["status"], 0) + 1
metrics = sum(len(r.get("metrics") or []) for r in w.values())
print("reports: %d records (shards %s), %d outputs' metrics, statuses %s, all equal to the one-process run's"
      % (len(w), "+".join(map(str, per_shard)), metrics, statuses))
EOF

# Results files: every output bit-identical.
timeout "$(left)" mlagate compare all.h5 whole/whole.h5 >compare.out 2>&1
rc=$?
tail -n 1 compare.out
[ "$rc" -eq 0 ] || { cat compare.out; fail "mlagate compare all.h5 whole.h5 exited $rc"; }
grep -q ' 0 within tolerance.* 0 different, 0 only in A, 0 only in B' compare.out ||
  fail "the results files are not identical"

echo "ok: slurm up ${up} s, 4-task array + merge ${t_slurm} s, one process ${t_whole} s, total $((SECONDS - start)) s"
