#!/usr/bin/env bash
# The kernel's own memory (issue 55, item 5): a gpumem-kernel process's resident memory after
# `:dep gpumem-nb` and one cell, with its notebook process (evcxr's child) beside it.
# `gpumem-kernel run` executes a three-cell notebook (`:dep gpumem-nb`; a small cell; a cell
# that sleeps 25 s) in one process, as the Jupyter kernel would, with the idle work between
# cells; 12 s into the third cell it reads VmRSS and VmHWM (the highest so far) of the kernel's
# process and of its child from /proc.
#   scripts/kernel_rss.sh [KERNEL]     (default: target/release/gpumem-kernel, built first)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
kernel="${1:-}"
if [ -z "$kernel" ]; then
    cargo build --release -p gpumem-kernel --manifest-path "$repo/Cargo.toml" >&2
    kernel="${CARGO_TARGET_DIR:-$repo/target}/release/gpumem-kernel"
fi
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
python3 - "$dir/rss.ipynb" <<'PY'
import json, sys
cells = [":dep gpumem-nb", "let x = 40 + 2;\nlet v: Vec<u64> = (0..1000).collect();\nv.len() + x",
         "std::thread::sleep(std::time::Duration::from_secs(25));"]
nb = {"cells": [{"cell_type": "code", "metadata": {}, "source": c, "outputs": [], "execution_count": None}
                for c in cells],
      "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
json.dump(nb, open(sys.argv[1], "w"))
PY
"$kernel" run "$dir/rss.ipynb" --output "$dir/out.ipynb" > "$dir/log" 2>&1 &
pid=$!
until grep -q '^\[2/' "$dir/log" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { cat "$dir/log" >&2; echo "FAIL: the kernel ended before cell 2" >&2; exit 1; }
    sleep 0.5
done
sleep 12
mib() { awk -v k="$2" '$1 == k":" { printf "%.0f MiB", $2 / 1024 }' "/proc/$1/status"; }
echo "kernel process (gpumem-kernel): VmRSS $(mib "$pid" VmRSS), VmHWM $(mib "$pid" VmHWM)"
for c in $(pgrep -P "$pid"); do
    echo "  its child $(cat "/proc/$c/comm"): VmRSS $(mib "$c" VmRSS), VmHWM $(mib "$c" VmHWM)"
done
wait "$pid"
grep '^\[' "$dir/log"
