#!/usr/bin/env bash
# backends/plugin/README.md's "Test your kernel in ten minutes", as a test: the example plugin
# copied out of mlagate's tree, configured and built on its own against
# include/ alone, then run through mlagate on the smoke suite (every op the
# harness composes) and on the vllm suite at TP 16 (every spec and kv cache
# dtype; the whole suite takes minutes on 2 cores and was run by hand).
# usage: example_out_of_tree.sh MLAGATE SOURCE_DIR CMAKE WORK_DIR
set -euo pipefail
mlagate=$1 src=$2 cmake=$3 work=$4

rm -rf "$work"
mkdir -p "$work"
cp -r "$src/examples/plugin_cpu" "$work/plugin"     # sources outside the tree too
"$cmake" -S "$work/plugin" -B "$work/build" -DMLAGATE_INCLUDE_DIR="$src/include"
"$cmake" --build "$work/build"
so="$work/build/libmla_decode_example.so"

"$mlagate" list backends --plugin "$so" --backend 'example.*'
"$mlagate" run --plugin "$so" --backend example.cpu_decode --suite smoke --op layer,decode --no-progress \
  --json "$work/smoke.json"
"$mlagate" run --plugin "$so" --backend example.cpu_decode --suite vllm --tp 16 --no-progress -q \
  --json "$work/vllm.json"
# Something ran: every record PASSED (nothing NOT_SUPPORTED or skipped counts as proof).
for report in "$work/smoke.json" "$work/vllm.json"; do
  if grep -q '"status": *"\(NOT_SUPPORTED\|SKIPPED\)"' "$report"; then
    echo "example_out_of_tree: $report holds NOT_SUPPORTED or SKIPPED records" >&2
    exit 1
  fi
done
