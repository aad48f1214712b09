#!/usr/bin/env bash
# A long session through a real Jupyter client on the simulated device (scripts/soak.py says what
# runs and what is measured): N cells, the kernel's and the notebook process's resident memory,
# the hooks' time per cell, one report per cell. Figures in $CARGO_TARGET_DIR/soak-N/.
#   scripts/soak.sh N [--assert]        (scripts/test.sh runs a short one with --assert)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
n="${1:?usage: scripts/soak.sh N [--assert]}"
shift
target="${CARGO_TARGET_DIR:-$repo/target}"
profile="${GPUMEM_SOAK_PROFILE:-release}"
flag=(); [ "$profile" = release ] && flag=(--release)
cargo build --quiet "${flag[@]}" -p gpumem-kernel
venv="$target/tour-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import nbclient, nbformat, jupyter_client' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet jupyter_client nbclient nbformat
fi
prefix="$(mktemp -d)"
trap 'rm -rf "$prefix"' EXIT
"$target/$profile/gpumem-kernel" install --prefix "$prefix" --no-prebuild >/dev/null
export JUPYTER_PATH="$prefix/share/jupyter" GPUMEM_NB_DEVICE=sim:8GiB
unset EVCXR_TMPDIR GPUMEM_NB_METRICS RANK LOCAL_RANK
# GPUMEM_NB_HISTORY_CELLS, when set, is the kernel's (scripts/test.sh sets it low to see the bound act).
"$venv/bin/python" "$repo/scripts/soak.py" "$target/$profile/gpumem-kernel" "$n" "$target/soak-$n" "$@"
