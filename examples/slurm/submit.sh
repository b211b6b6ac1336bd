#!/bin/sh
# submit.sh [mlagate run arguments]: the shards as a job array (gate.sbatch), then their merge
# (merge.sbatch) once every shard has ended; waits for the merge and exits with its code.
# Run it in an empty directory: the reports land there.
here=$(dirname "$0")
jid=$(sbatch --parsable "$here/gate.sbatch" "$@") || exit 2
echo "shards: job $jid"
exec sbatch --wait --dependency=afterany:"$jid" "$here/merge.sbatch"
