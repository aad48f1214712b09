#!/usr/bin/env bash
# The notebooks written as the frameworks' own docs write them (issue 43), through gpumem-kernel
# and the stock evcxr kernel side by side (scripts/corpus.py): the table of cells that run as
# written, the executed notebooks, the failing cells' errors.
#   scripts/corpus.sh [OUT_DIR] [NOTEBOOK...]        (default: the CPU corpus into target/corpus)
#   CORPUS_STOCK=0 scripts/corpus.sh ...             gpumem-kernel only
# The stock kernel is evcxr_jupyter 0.22.0, installed once into the target directory as
# tests/stock_kernel.sh installs it; its kernelspec goes into a private JUPYTER_PATH.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
target="${CARGO_TARGET_DIR:-$repo/target}"
out="${1:-$target/corpus}"
shift || true
notebooks=("$@")
[ ${#notebooks[@]} -gt 0 ] || notebooks=(notebooks/candle_book.ipynb notebooks/burn_book.ipynb)
cargo build --release -p gpumem-kernel
venv="$target/tour-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet jupyter_client nbclient nbformat
fi
stock=()
if [ "${CORPUS_STOCK:-1}" != 0 ]; then
    root="$target/evcxr_jupyter"
    if ! grep -qs '^"evcxr_jupyter 0.22.0 ' "$root/.crates.toml"; then
        cargo install --locked --quiet evcxr_jupyter --version 0.22.0 --root "$root"
    fi
    export JUPYTER_PATH="$target/corpus-jupyter" JUPYTER_DATA_DIR="$target/corpus-jupyter"
    "$root/bin/evcxr_jupyter" --install > /dev/null
    stock=(--stock)
fi
unset EVCXR_TMPDIR GPUMEM_NB_CONTROL
exec "$venv/bin/python" scripts/corpus.py "$out" "${notebooks[@]}" --kernel "$target/release/gpumem-kernel" "${stock[@]}"
