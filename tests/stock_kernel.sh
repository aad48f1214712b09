#!/usr/bin/env bash
# gpumem-nb in the stock evcxr Jupyter kernel: installs evcxr_jupyter at a pinned version (once:
# cached under the target directory), its kernelspec into a private JUPYTER_PATH there (the
# user's own kernelspecs are not touched), then runs tests/stock_nbclient.py with kernel `rust`
# on the simulated device. Needs network access once (crates.io, PyPI).
#   tests/stock_kernel.sh
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
version=0.22.0
root="$target/evcxr_jupyter"
if ! grep -qs "^\"evcxr_jupyter $version " "$root/.crates.toml"; then
    start=$(date +%s)
    echo "installing evcxr_jupyter $version into $root (once; its build is cached in $target)"
    cargo install --locked --quiet evcxr_jupyter --version "$version" --root "$root"
    echo "evcxr_jupyter $version installed in $(( $(date +%s) - start )) s"
fi
export JUPYTER_PATH="$target/stock-jupyter" JUPYTER_DATA_DIR="$target/stock-jupyter"
"$root/bin/evcxr_jupyter" --install > /dev/null
venv="$target/tour-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet jupyter_client nbclient nbformat
fi
# Its own build directory (gpumem-kernel builds its cells in $target/evcxr), kept between runs.
export EVCXR_TMPDIR="$target/evcxr-stock" GPUMEM_NB_DEVICE=sim:8GiB
# evcxr links cells against the toolchain's libstd-*.so. The relative rpath rustc writes is
# computed from target/…/debug/deps/, but evcxr loads the copy one directory up, so it climbs
# one level too far: harmless when that lands on `/` (evcxr's default /tmp/.tmpXXXX with
# ~/.rustup under /root), "dlopen failed" when the build directory and the toolchain share a
# deeper ancestor, as here. The child finds libstd on its library path instead (what
# gpumem-kernel does for its own child).
std_dir="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/lib"
export LD_LIBRARY_PATH="$std_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$EVCXR_TMPDIR"
unset GPUMEM_NB_CONTROL GPUMEM_NB_REPORTS
exec "$venv/bin/python" "$repo/tests/stock_nbclient.py" "$repo" "$target/stock-out"
