#!/usr/bin/env bash
# How long a new session's first `:dep` takes, gpumem-kernel against the stock evcxr kernel in one
# run (scripts/dep_start.py; BENCHMARKS.md, "A new dependency's start").
#   scripts/dep_start.sh OUT_JSON [--rounds N] [LINE...]
# Both kernels are installed into a private JUPYTER_PATH (gpumem-kernel from this checkout's
# release build, evcxr_jupyter 0.22.0 as tests/stock_kernel.sh installs it); the stock kernel's
# build directory is ~/.cache/gpumem-dep-start-stock (kept between runs, as gpumem-kernel's own is;
# outside the checkout, whose workspace the stock kernel's cargo metadata would otherwise join).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
target="${CARGO_TARGET_DIR:-$repo/target}"
cargo build --release -p gpumem-kernel
root="$target/evcxr_jupyter"
if ! grep -qs '^"evcxr_jupyter 0.22.0 ' "$root/.crates.toml"; then
    cargo install --locked --quiet evcxr_jupyter --version 0.22.0 --root "$root"
fi
venv="$target/tour-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet jupyter_client nbclient nbformat
fi
export JUPYTER_PATH="$target/dep-start-jupyter" JUPYTER_DATA_DIR="$target/dep-start-jupyter"
"$root/bin/evcxr_jupyter" --install > /dev/null
"$target/release/gpumem-kernel" install --prefix "$target/dep-start-jupyter-prefix" --no-prebuild > /dev/null
mkdir -p "$JUPYTER_PATH/kernels"
cp -r "$target/dep-start-jupyter-prefix/share/jupyter/kernels/gpumem" "$JUPYTER_PATH/kernels/"
export DEP_START_STOCK_DIR="${DEP_START_STOCK_DIR:-$HOME/.cache/gpumem-dep-start-stock}"
mkdir -p "$DEP_START_STOCK_DIR"
# The stock kernel's cells carry a relative rpath to the toolchain's libstd that cargo gets wrong
# for a build directory at this depth (`dlopen failed` at its start): the library path finds it,
# as gpumem-kernel gives its own child (scripts/gpu/notebook.sh does the same for the stock kernel).
export LD_LIBRARY_PATH="$(rustc --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset EVCXR_TMPDIR GPUMEM_NB_CONTROL
exec "$venv/bin/python" scripts/dep_start.py "$@"
