#!/usr/bin/env bash
# How long a new session's first cell takes to report in gpumem-kernel (BENCHMARKS.md, "First
# cell"), through `gpumem-kernel run` on a notebook whose first cell loads the crate:
#   cold: a build directory of its own with nothing built (a first session on a new machine);
#   warm: the same directory in a new kernel process (every later session);
#   after install: for `:dep gpumem-nb`, a fresh directory built by `gpumem-kernel install`'s
#         prebuild, then a new session (a user's first session after installing).
# For each: the first cell's time as its report gives it (evcxr's compile and run) and the whole
# command (evcxr's start included).
#   scripts/first_cell.sh [KERNEL] [FIRST CELL'S SOURCE]
#   FIRST_CELL_DEFAULT_DIR=1 scripts/first_cell.sh ...   one new session in the kernel's own
#         build directory (what a user's next session meets after any earlier build there)
# KERNEL defaults to the release build of this checkout; the cell to `:dep gpumem-nb`. Each run
# uses a fresh temporary build directory outside any workspace, removed at the end.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
kernel="${1:-${CARGO_TARGET_DIR:-$repo/target}/release/gpumem-kernel}"
cell="${2:-:dep gpumem-nb}"
[ -x "$kernel" ] || { echo "no kernel at $kernel (cargo build --release -p gpumem-kernel)" >&2; exit 2; }
work=$(mktemp -d /tmp/gpumem-first-cell-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/evcxr" "$work/jupyter"
python3 - "$work/nb.ipynb" "$cell" <<'PY'
import json, sys
cells = [sys.argv[2], "let alloc = gpumem_nb::current()?;\nalloc.backend_kind()"]
nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
    {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": c} for c in cells]}
json.dump(nb, open(sys.argv[1], "w"))
PY
first_cell() {
    python3 - "$1" <<'PY'
import json, sys
nb = json.load(open(sys.argv[1]))
for o in nb["cells"][0]["outputs"]:
    rec = o.get("data", {}).get("application/vnd.gpumem.cell+json")
    if rec:
        print(f"{rec['wall_ms'] / 1000:.1f} s")
        break
else:
    print("no report")
PY
}
echo "machine: $(nproc) cores, $(uname -m), load $(cut -d' ' -f1-3 /proc/loadavg); kernel: $kernel"
echo "first cell: $cell"
if [ -n "${FIRST_CELL_DEFAULT_DIR:-}" ]; then
    unset EVCXR_TMPDIR
    t0=$(date +%s.%N)
    "$kernel" run "$work/nb.ipynb" --output "$work/default.ipynb" > "$work/default.log" 2>&1 || { cat "$work/default.log"; exit 1; }
    t1=$(date +%s.%N)
    echo "a new session in the kernel's build directory: first cell $(first_cell "$work/default.ipynb"), whole run $(python3 -c "print(f'{$t1 - $t0:.1f} s')")"
    exit 0
fi
export EVCXR_TMPDIR="$work/evcxr"
t0=$(date +%s.%N)
"$kernel" run "$work/nb.ipynb" --output "$work/cold.ipynb" > "$work/cold.log" 2>&1 || { cat "$work/cold.log"; exit 1; }
t1=$(date +%s.%N)
echo "cold: first cell $(first_cell "$work/cold.ipynb"), whole run $(python3 -c "print(f'{$t1 - $t0:.1f} s')")"
t0=$(date +%s.%N)
"$kernel" run "$work/nb.ipynb" --output "$work/warm.ipynb" > "$work/warm.log" 2>&1 || { cat "$work/warm.log"; exit 1; }
t1=$(date +%s.%N)
echo "warm (a new session after one that built it): first cell $(first_cell "$work/warm.ipynb"), whole run $(python3 -c "print(f'{$t1 - $t0:.1f} s')")"
[ "$cell" = ":dep gpumem-nb" ] || exit 0
# A new build directory again, built by install's prebuild, then a new session.
rm -rf "$work/evcxr" && mkdir -p "$work/evcxr"
t0=$(date +%s.%N)
"$kernel" install --prefix "$work/jupyter" > "$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
t1=$(date +%s.%N)
echo "install (its prebuild): $(python3 -c "print(f'{$t1 - $t0:.1f} s')")"
t0=$(date +%s.%N)
"$kernel" run "$work/nb.ipynb" --output "$work/installed.ipynb" > "$work/installed.log" 2>&1 || { cat "$work/installed.log"; exit 1; }
t1=$(date +%s.%N)
echo "after install: first cell $(first_cell "$work/installed.ipynb"), whole run $(python3 -c "print(f'{$t1 - $t0:.1f} s')")"
