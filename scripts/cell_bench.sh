#!/usr/bin/env bash
# The cell benchmark: the same small cells through gpumem-kernel and through the stock evcxr
# kernel (evcxr_jupyter 0.22.0, the version gpumem-kernel embeds), interleaved in one run on
# this machine, after `:dep gpumem-nb` and after `:dep gpumem-nb` + candle-core; median and p90
# per cell, and where gpumem-kernel's time goes. Figures go to BENCHMARKS.md by hand.
#   scripts/cell_bench.sh [--rounds N] [--no-candle]
# Builds the release kernel and installs evcxr_jupyter into the target directory (once, as
# tests/stock_kernel.sh does); the stock kernel builds in a directory
# kept in $TMPDIR (evcxr's EVCXR_TMPDIR), so a rerun does not rebuild its dependencies.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
cargo build --release -p gpumem-kernel
version=0.22.0
root="$target/evcxr_jupyter"
if ! grep -qs "^\"evcxr_jupyter $version " "$root/.crates.toml"; then
    cargo install --locked --quiet evcxr_jupyter --version "$version" --root "$root"
fi
venv="$target/tour-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import nbclient, nbformat, jupyter_client' 2>/dev/null; then
    python3 -m venv --clear "$venv"
    "$venv/bin/pip" install --quiet jupyter_client nbclient nbformat
fi
out="$target/cell-bench"
mkdir -p "$out"
# The stock kernel's build directory is kept outside the home directory: evcxr loads the cell
# library cargo copies up from `deps/`, whose RUNPATH rustc wrote relative to `deps/`; when the
# directory and the toolchain share a prefix (both under ~) that relative path misses libstd by
# one level and the stock kernel dies at its first cell ("dlopen failed").
stock_dir="${TMPDIR:-/tmp}/gpumem-nb-cell-bench-stock-evcxr"
mkdir -p "$stock_dir"
spec=$(mktemp -d)
trap 'rm -rf "$spec"' EXIT
"$target/release/gpumem-kernel" install --prefix "$spec" --no-prebuild > /dev/null
JUPYTER_DATA_DIR="$spec/share/jupyter" "$root/bin/evcxr_jupyter" --install > /dev/null
export JUPYTER_PATH="$spec/share/jupyter"
unset GPUMEM_NB_CONTROL GPUMEM_NB_REPORTS GPUMEM_NB_METRICS
# Only the stock kernel reads EVCXR_TMPDIR here (gpumem-kernel keeps its own build directory
# when it is set outside a workspace too, so it is passed to the stock kernel alone).
EVCXR_BENCH_STOCK_TMPDIR="$stock_dir" exec "$venv/bin/python" "$repo/scripts/cell_bench.py" "$repo" "$out/cells.json" "$@"
