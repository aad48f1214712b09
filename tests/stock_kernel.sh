#!/usr/bin/env bash
# gpumem-nb in the stock evcxr Jupyter kernel, loaded the way crates.io users load it:
# `:dep gpumem-nb = "0.1"`. What crates.io would ship is what is tested: the crate is packaged
# with `cargo package`, its .crate file unpacked into a local directory registry (with every
# dependency, vendored by `cargo vendor` from the packaged crate's own lock file) that stands in
# for crates.io through a private CARGO_HOME. Then the pinned evcxr_jupyter (installed once,
# cached under the target directory) runs tests/stock_nbclient.py through nbclient, as a user
# runs it: evcxr builds in its own temporary directory, no EVCXR_TMPDIR, no library path set.
#   tests/stock_kernel.sh [--install-only]
# Needs network access once (crates.io, PyPI); the registry is rebuilt when the package changes.
# --install-only installs evcxr_jupyter and stops (scripts/test.sh runs that in the background).
# GPUMEM_STOCK_OPT_LEVEL=N installs it built at opt-level N without line tables, into a root of
# its own, for a test that checks reports, not speed. scripts/test.sh sets 0: fewest core-seconds
# in all (2026-11-29, this machine, alone: build 314 core-s at 0 against 935 at 1 and 14 min of
# wall time for release; this test then 459 core-s against 301). Unset: release as `cargo
# install` builds it, for the benchmarks that time the stock
# kernel against ours (scripts/cell_bench.sh, scripts/dep_start.sh, scripts/gpu/notebook.sh).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
version=0.22.0
root="$target/evcxr_jupyter" build_env=()
if [ -n "${GPUMEM_STOCK_OPT_LEVEL:-}" ]; then
    root="$target/evcxr_jupyter-o$GPUMEM_STOCK_OPT_LEVEL"
    build_env=(CARGO_PROFILE_RELEASE_OPT_LEVEL="$GPUMEM_STOCK_OPT_LEVEL" CARGO_PROFILE_RELEASE_DEBUG=false)
fi
if ! grep -qs "^\"evcxr_jupyter $version " "$root/.crates.toml"; then
    start=$(date +%s)
    # A build directory of its own: it shares no unit with the workspace's (its own lock file and
    # features), and cargo's lock on a shared one would hold the workspace's builds back while it
    # builds in the background.
    echo "installing evcxr_jupyter $version into $root (once; its build is cached in $root-build)"
    env "${build_env[@]}" CARGO_TARGET_DIR="$root-build" cargo install --locked --quiet evcxr_jupyter --version "$version" --root "$root"
    echo "evcxr_jupyter $version installed in $(( $(date +%s) - start )) s"
fi
[ "${1:-}" = --install-only ] && exit 0

# --- the packaged crate in a local registry -----------------------------------------------
# Outside the clone: cargo must not find the clone's workspace above the unpacked crate.
crate_version=$(cargo metadata --no-deps --format-version 1 --manifest-path "$repo/Cargo.toml" \
    | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "gpumem-nb"))')
cargo package -p gpumem-nb --allow-dirty --no-verify --quiet
crate="$target/package/gpumem-nb-$crate_version.crate"
reg="${XDG_CACHE_HOME:-$HOME/.cache}/gpumem-nb/stock-registry"
sum=$(sha256sum "$crate" | cut -d' ' -f1)
sysroot="$(rustc --print sysroot)"
library="$sysroot/lib/rustlib/src/rust/library"
key="$sum $(rustc --version)"
if [ "$(cat "$reg/.key" 2>/dev/null)" != "$key" ]; then
    echo "local registry: gpumem-nb $crate_version (.crate sha256 ${sum:0:12}) and its dependencies into $reg"
    rm -rf "$reg"
    mkdir -p "$reg/vendor" "$reg/cargo-home"
    unpacked=$(mktemp -d)
    tar -xzf "$crate" -C "$unpacked"
    # Every dependency the packaged crate resolves to, at the versions of its own Cargo.lock.
    (cd "$unpacked/gpumem-nb-$crate_version" && cargo vendor --quiet --locked --versioned-dirs --no-delete "$reg/vendor" > /dev/null)
    cp -r "$unpacked/gpumem-nb-$crate_version" "$reg/vendor/"
    rm -rf "$unpacked"
    # evcxr infers the types of a cell's variables with rust-analyzer, which reads the standard
    # library's own workspace with `cargo metadata --offline`: under this CARGO_HOME its
    # dependencies must come from the same registry (as they would from crates.io's cache).
    [ -f "$library/Cargo.toml" ] || { echo "rust-src is missing: rustup component add rust-src" >&2; exit 1; }
    __CARGO_TEST_CHANNEL_OVERRIDE_DO_NOT_USE_THIS=nightly cargo vendor --quiet --locked --versioned-dirs --no-delete \
        --manifest-path "$library/Cargo.toml" "$reg/vendor" > /dev/null
    # A directory source checks each file against .cargo-checksum.json, as cargo checks a
    # download against the registry's checksum.
    python3 - "$reg/vendor/gpumem-nb-$crate_version" "$sum" <<'PY'
import hashlib, json, os, sys
dir, package = sys.argv[1], sys.argv[2]
files = {}
for base, _, names in os.walk(dir):
    for n in names:
        path = os.path.join(base, n)
        rel = os.path.relpath(path, dir)
        if rel != ".cargo-checksum.json":
            files[rel] = hashlib.sha256(open(path, "rb").read()).hexdigest()
json.dump({"files": files, "package": package}, open(os.path.join(dir, ".cargo-checksum.json"), "w"))
PY
    cat > "$reg/cargo-home/config.toml" <<EOF
# crates.io, as far as this test's cargo knows: the packaged gpumem-nb and its dependencies.
[source.crates-io]
replace-with = "gpumem-local"

[source.gpumem-local]
directory = "$reg/vendor"
EOF
    echo "$key" > "$reg/.key"
fi

# --- the stock kernel and a notebook through nbclient -------------------------------------
export JUPYTER_PATH="$target/stock-jupyter" JUPYTER_DATA_DIR="$target/stock-jupyter"
"$root/bin/evcxr_jupyter" --install > /dev/null
venv="$target/tour-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet jupyter_client nbclient nbformat
fi
export CARGO_HOME="$reg/cargo-home" GPUMEM_NB_DEVICE=sim:8GiB
export STOCK_DEP=":dep gpumem-nb = \"${crate_version%.*}\""
unset GPUMEM_NB_CONTROL GPUMEM_NB_REPORTS EVCXR_TMPDIR
exec "$venv/bin/python" "$repo/tests/stock_nbclient.py" "$repo" "$target/stock-out"
