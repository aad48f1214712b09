#!/usr/bin/env bash
# Issue 54's GPU benchmark: what tracking from the first cell costs candle code that allocates
# thousands of tensors, stacks on. notebooks/gpu_bench_candle_alloc.ipynb (plain candle, no
# gpumem-nb) runs through gpumem-kernel as it is and with GPUMEM_NB_TRACK=off, alternating (the
# order flips each round), on this GPU; scripts/gpu/alloc_bench.py reads what the cells printed
# and each cell's record, and writes the table.
#
# On the GPU machine, after `notebook.sh stash N …`, `setup` and candle's build (`corpus54 warm`
# builds the same `:dep` lines), from the repository root:
#     bash scripts/gpu/notebook.sh allocbench [ROUNDS]      (default 3 rounds: 6 runs)
# Results in $OUT/allocbench/: each run's executed notebook and log, runs.jsonl, summary.md.
# Exit status 1 when a run failed or a run's tracking was not what it was run with.
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo" || exit 2
root="${GPUMEM_CORPUS54_ROOT:-/opt/gpumem}"
out="${OUT:-$repo/target/gpu-nb-out}/allocbench"
rounds="${1:-3}"
nb=notebooks/gpu_bench_candle_alloc.ipynb
if [ ! -f "$root/env.sh" ]; then
    echo "allocbench: $root/env.sh is missing: run \`bash scripts/gpu/notebook.sh setup\` first" >&2
    exit 2
fi
# shellcheck disable=SC1091
. "$root/env.sh"
mkdir -p "$out"
status=0
for r in $(seq 1 "$rounds"); do
    order="on off"
    [ $((r % 2)) = 0 ] && order="off on"
    for mode in $order; do
        name="round$r-$mode"
        t0=$SECONDS
        if [ "$mode" = off ]; then
            GPUMEM_NB_TRACK=off timeout 300 gpumem-kernel run "$nb" --output "$out/$name.ipynb" > "$out/$name.log" 2>&1
        else
            (unset GPUMEM_NB_TRACK; timeout 300 gpumem-kernel run "$nb" --output "$out/$name.ipynb") > "$out/$name.log" 2>&1
        fi
        code=$?
        echo "$name: exit $code, $((SECONDS - t0)) s"
        [ "$code" = 0 ] || { status=1; tail -20 "$out/$name.log"; }
    done
done
python3 scripts/gpu/alloc_bench.py "$out" || status=1
exit $status
