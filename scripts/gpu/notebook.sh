#!/usr/bin/env bash
# Runs notebooks through gpumem-kernel on a GPU machine that has no Rust toolchain and no
# network (GPU_VALIDATION.md, "Notebooks on a GPU").
#
# Here (a machine with Rust and crates.io), from the repo root:
#     scripts/gpu/notebook.sh pack
# builds the kernel, vendors every crate the notebooks load, downloads the Jupyter client's
# wheels, packs them with a minimal Rust toolchain (rustc, cargo, std, rust-lld, rust-src and
# the standard library's own crates, which evcxr's type inference reads) into one
# xz stream and splits it into .gpu-nb1/ .gpu-nb2/ … of 40 MiB each (ignored by git; each fits the
# device tool's 64 MiB per call).
#
# There, one call per part back to back while the machine stays warm (it keeps /opt between
# calls; `pack` says how many parts, four for 159 MiB), the last one going on with `setup`:
#     carry .gpu-nb1:  bash scripts/gpu/notebook.sh stash 1
#     …
#     carry .gpu-nb4:  bash scripts/gpu/notebook.sh stash 4 && bash scripts/gpu/notebook.sh setup \
#                      && bash scripts/gpu/notebook.sh run notebooks/tour.ipynb notebooks/gpu_cublas.ipynb
# then, still warm:   bash scripts/gpu/notebook.sh run notebooks/gpu_candle.ipynb
#                     bash scripts/gpu/notebook.sh jupyter notebooks/gpu_cublas.ipynb
#                     bash scripts/gpu/notebook.sh run notebooks/gpu_sites.ipynb      (issue 19: sites)
#                     bash scripts/gpu/notebook.sh jupyter notebooks/gpu_sites.ipynb
#                     bash scripts/gpu/notebook.sh stock notebooks/gpu_sites.ipynb    (the stock kernel)
#                     GPUMEM_STOCK_LINES=1 bash scripts/gpu/notebook.sh stock notebooks/gpu_sites.ipynb
#                                         (the same with the README's `:build_env` recipe: line tables)
# Results (executed notebooks, HTML pages, check reports, timings) go to $OUT.
# burn (issue 22), still warm, after the three above (warm: until it says done):
#                     bash scripts/gpu/notebook.sh warm notebooks/gpu_burn.ipynb
#                     bash scripts/gpu/notebook.sh run notebooks/gpu_burn.ipynb
#                     bash scripts/gpu/notebook.sh jupyter notebooks/gpu_burn.ipynb
#                     bash scripts/gpu/notebook.sh warm notebooks/gpu_burn.ipynb stock
#                     bash scripts/gpu/notebook.sh stock notebooks/gpu_burn.ipynb && python3 \
#                       scripts/gpu/check_notebook.py "$OUT/gpu_burn-stock.ipynb" --stock --require-tracking cupti
# A GPU fault (issue 34), still warm:
#                     bash scripts/gpu/notebook.sh run notebooks/gpu_fault.ipynb
# burn's memory in the cell that queued it (issue 32), after `warm notebooks/gpu_burn.ipynb`
# (the same :dep lines, so the same build):
#                     bash scripts/gpu/notebook.sh run notebooks/gpu_burn_async.ipynb
# What the memory is (issue 33), still warm: candle's parameters, gradients, optimizer state,
# activations and workspace against the model's own counts, and a PyTorch snapshot by component:
#                     bash scripts/gpu/notebook.sh run notebooks/gpu_components.ipynb
#                     python3 scripts/gpu/record_components.py "$OUT/components"
#                     python3 scripts/gpu/memviz_components.py notebooks/components-snap/snapshot.pickle "$OUT/memviz"
#                     bash scripts/gpu/notebook.sh warm notebooks/gpu_components.ipynb stock
#                     bash scripts/gpu/notebook.sh stock notebooks/gpu_components.ipynb && python3 \
#                       scripts/gpu/check_notebook.py "$OUT/gpu_components-stock.ipynb" --stock --require-tracking cupti
# candle under a cap where `%gpumem fit` says (issue 33, item 4), still warm (four runs of
# notebooks/gpu_pool_cap.ipynb; the same :dep lines as gpu_components, so the same build):
#                     python3 scripts/gpu/pool_cap_check.py "$OUT/cap"
#                     python3 scripts/gpu/pool_probe.py "$OUT/pool_probe.jsonl"   (how the CUDA pool reserves)
# Two GPUs (issue 46), on nvidia-h200-x2, still warm: NCCL's all-reduce and candle on both devices:
#                     bash scripts/gpu/notebook.sh jupyter notebooks/gpu_multi.ipynb
# Small cells against the stock kernel on this host (issue 35):
#                     bash scripts/gpu/notebook.sh cellbench --rounds 3 --no-candle
# Notebooks that never call gpumem-nb, as written and with a `:dep gpumem-nb` cell prepended,
# and out-of-memory notebooks (issue 54; scripts/gpu/corpus54.sh says more), still warm:
#                     bash scripts/gpu/notebook.sh corpus54 warm    (until it says done)
#                     bash scripts/gpu/notebook.sh corpus54
# What tracking costs candle code allocating thousands of tensors (issue 54; after corpus54's warm
# has built candle), tracked against GPUMEM_NB_TRACK=off, alternating:
#                     bash scripts/gpu/notebook.sh allocbench 3
# `%gpumem trim` after candle and after burn with no call of gpumem-nb (issue 57; the builds of
# corpus54's warm):
#                     bash scripts/gpu/notebook.sh trim candle burn
# `%gpumem fit` in a candle notebook that never called gpumem-nb nor asked to record (issue 57;
# the same build):
#                     bash scripts/gpu/notebook.sh fit
# The largest batch a candle training step fits, measured by `%%gpumem sweep` and then proved (it
# runs at the answer and fails at 5 % more; issue 57), on this card and under a 24 GiB pool cap,
# and a burn training step on this card (after `warm notebooks/gpu_sweep_burn.ipynb`):
#                     bash scripts/gpu/notebook.sh sweep candle candle24 burn
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
stage=/opt/gpumem-stage
root=/opt/gpumem
out="${OUT:-$repo/target/gpu-nb-out}"

step() { printf '\n== %s\n' "$*"; }

pack() {
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"
    local work="$CARGO_TARGET_DIR/gpu-nb-pack"
    rm -rf "$work" && mkdir -p "$work/payload/bin" "$work/payload/wheels"
    step "the kernel (release)"
    # A bare `:dep gpumem-nb` loads the checkout the kernel was compiled in (its path is in the
    # binary): a target directory shared with another clone may hold a kernel compiled there,
    # which cargo would not rebuild for this one. Touching the file that reads the path makes
    # it this checkout's.
    touch kernel/src/build/dep.rs
    cargo build --release -p gpumem-kernel
    cp "$CARGO_TARGET_DIR/release/gpumem-kernel" "$work/payload/bin/"
    strip "$work/payload/bin/gpumem-kernel"
    # GPUMEM_PACK_STOCK=0 leaves it out (runs of gpumem-kernel only: a fresh machine saves its
    # 6-15 minute build).
    if [ "${GPUMEM_PACK_STOCK:-1}" != 0 ]; then
        step "the stock evcxr kernel, evcxr_jupyter 0.22.0 (tests/stock_kernel.sh installs it once)"
        local stock="$CARGO_TARGET_DIR/evcxr_jupyter/bin/evcxr_jupyter"
        if [ ! -x "$stock" ]; then
            cargo install --locked --quiet evcxr_jupyter --version 0.22.0 --root "$CARGO_TARGET_DIR/evcxr_jupyter"
        fi
        cp "$stock" "$work/payload/bin/" && strip "$work/payload/bin/evcxr_jupyter"
    fi
    step "vendored crates for the notebooks' :dep lines"
    local deps="$work/nbdeps"
    mkdir -p "$deps/src" && echo 'fn main() {}' > "$deps/src/main.rs"
    cat > "$deps/Cargo.toml" <<EOF
[package]
name = "nbdeps"
version = "0.0.0"
edition = "2024"
publish = false
[dependencies]
gpumem-nb = { path = "$repo", features = ["cublas", "nvrtc", "cubecl010"] }
cudarc = { version = "0.19", default-features = false, features = ["std", "driver", "cublas", "nvrtc", "nccl", "fallback-dynamic-loading", "cuda-13000"] }
candle-core = { version = "0.11", features = ["cuda"] }
candle-nn = { version = "0.11", features = ["cuda"] }
burn = { version = "0.21", default-features = false, features = ["std", "cuda", "autodiff", "cubecl"] }
[workspace]
EOF
    (cd "$deps" && cargo vendor --versioned-dirs "$work/payload/vendor" >/dev/null)
    # evcxr infers a `let`'s type with rust-analyzer, which reads the standard library's
    # sources through `cargo metadata --locked --offline` on the library's own workspace:
    # without its crates vendored too, that call fails, the library loads without its
    # dependency edges and `let v = vec![1u8];` fails with "Couldn't automatically
    # determine type of variable".
    local sysroot
    sysroot="$(rustc --print sysroot)"
    local library="$sysroot/lib/rustlib/src/rust/library"
    [ -f "$library/Cargo.toml" ] || { echo "rust-src is missing: rustup component add rust-src" >&2; exit 1; }
    __CARGO_TEST_CHANNEL_OVERRIDE_DO_NOT_USE_THIS=nightly cargo vendor --versioned-dirs --locked \
        --manifest-path "$library/Cargo.toml" "$work/stdvendor" >/dev/null
    ls "$work/stdvendor" > "$work/std-crates.txt"
    for d in "$work/stdvendor"/*; do
        [ -e "$work/payload/vendor/$(basename "$d")" ] || mv "$d" "$work/payload/vendor/"
    done
    # What the notebooks' crates build on this platform (every notebook's :dep lines are a subset
    # of nbdeps', so of what it builds).
    (cd "$deps" && cargo tree --target x86_64-unknown-linux-gnu -e normal,build --prefix none --format '{p}') \
        | awk '{ print $1 "-" substr($2, 2) }' | sort -u > "$work/built.txt"
    # Crates the resolver needs but nothing compiles here keep their manifests only: Windows-only
    # ones, and (issue 22) those only a weak feature names (`dep?/feature` still puts an optional
    # dependency in Cargo.lock): with burn 0.21, 337 of the 622 crates vendored for nbdeps,
    # 617 MB of its 756 MB of sources (burn's libtorch, wgpu and image stacks); so stubbed, the
    # vendored crates compress to 13.6 MB (10.1 MB before burn, Windows crates stubbed; measured
    # 2026-11-25). The standard library's own crates stay whole (rust-analyzer reads them).
    python3 - "$work/payload/vendor" "$work/built.txt" "$work/std-crates.txt" <<'PY'
import json, os, shutil, sys
v = sys.argv[1]
built = set(open(sys.argv[2]).read().split())
std = set(open(sys.argv[3]).read().split())
for d in os.listdir(v):
    windows = d.startswith(("winapi", "windows", "web-sys", "winsafe", "js-sys", "wasm-bindgen"))
    if not windows and (d in built or d in std):
        continue
    for n in os.listdir(os.path.join(v, d)):
        if n not in ("Cargo.toml", ".cargo-checksum.json"):
            p = os.path.join(v, d, n)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    os.makedirs(os.path.join(v, d, "src"), exist_ok=True)
    open(os.path.join(v, d, "src", "lib.rs"), "w").close()
    ck = os.path.join(v, d, ".cargo-checksum.json")
    c = json.load(open(ck)); c["files"] = {}; json.dump(c, open(ck, "w"))
PY
    step "wheels for the Jupyter path (jupyter_client, nbclient, nbformat and their needs)"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$work/payload/wheels" jupyter_client==8.6.3 jupyter_core==5.8.1 nbclient==0.10.2 nbformat==5.10.4 \
        traitlets==5.14.3 pyzmq==27.0.0 tornado==6.5.1 platformdirs==4.3.8 fastjsonschema==2.21.1 \
        jsonschema==4.24.0 jsonschema-specifications==2025.4.1 referencing==0.36.2 rpds-py==0.25.1
    step "a minimal Rust toolchain (rustc, cargo, std, rust-lld, rust-src, the proc-macro server)"
    mkdir -p "$work/payload/rust"
    # libexec/rust-analyzer-proc-macro-srv: evcxr's type inference expands the dependencies' proc
    # macros with it (burn's derives; vendor/evcxr/PATCHES.md §5).
    (cd "$sysroot" && tar cf - bin/rustc bin/cargo lib/librustc_driver-*.so lib/libLLVM* libexec \
        --exclude='*san.a' --exclude='*profiler*' lib/rustlib/x86_64-unknown-linux-gnu/lib \
        lib/rustlib/x86_64-unknown-linux-gnu/bin lib/rustlib/src) | (cd "$work/payload/rust" && tar xf -)
    # A bare `:dep gpumem-nb` loads the checkout the kernel was built from (its path is compiled
    # into the kernel): `setup` points that path at the repo on the GPU machine.
    echo "$repo" > "$work/payload/kernel-source.txt"
    step "one xz stream, split in parts that travel beside the working tree"
    (cd "$work/payload" && tar cf - .) | xz -T0 -6 > "$work/payload.tar.xz"
    split_parts
}

split_parts() {
    # Each call carries the working tree too (64 MiB in all, the device tool's limit): a part
    # is at most 40 MiB and leaves the tree (its tracked and untracked files) and 4 MiB to spare.
    local work="$CARGO_TARGET_DIR/gpu-nb-pack" exclude n i tree part
    exclude="$(git rev-parse --git-path info/exclude)"
    mkdir -p "$(dirname "$exclude")"
    rm -rf .gpu-nb[0-9]* "$work"/part*
    tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
    part=$(( 60 - tree / 1048576 ))
    [ "$part" -gt 40 ] && part=40
    [ "$part" -lt 8 ] && { echo "the working tree ($((tree / 1048576)) MiB) leaves no room for a part"; return 1; }
    split -b "${part}M" -d -a 1 "$work/payload.tar.xz" "$work/part"
    # shellcheck disable=SC2012  # the parts are named part0, part1, …: nothing for ls to mangle
    n=$(ls "$work"/part* | wc -l)
    for i in $(seq 1 "$n"); do
        mkdir -p ".gpu-nb$i"
        grep -qx "/.gpu-nb$i/" "$exclude" 2>/dev/null || echo "/.gpu-nb$i/" >> "$exclude"
        mv "$work/part$((i - 1))" ".gpu-nb$i/part"
    done
    du -sh .gpu-nb[0-9]* "$work/payload.tar.xz"
    echo "$n parts: one device call each (carry .gpu-nbN: notebook.sh stash N), then setup"
}

stash() {
    mkdir -p "$stage"
    cp ".gpu-nb$1/part" "$stage/part$1"
    ls -la "$stage"
}

setup() {
    local t0=$SECONDS
    rm -rf "$root" && mkdir -p "$root"
    # The parts in order (part1, part2, …, part10 after part9).
    # shellcheck disable=SC2012  # part1, part2, …: nothing for ls to mangle
    ls "$stage"/part* | sort -V | xargs cat | xz -d -T0 | tar xf - -C "$root"
    mkdir -p "$root/cargo-home"
    cat > "$root/cargo-home/config.toml" <<EOF
[source.crates-io]
replace-with = "vendored"
[source.vendored]
directory = "$root/vendor"
[net]
offline = true
EOF
    env_file
    # The kernel's bare `:dep gpumem-nb` is the checkout it was built from: when that path does
    # not exist here, it becomes a link to this repo (the same sources, carried by the device tool).
    local built_from
    built_from="$(cat "$root/kernel-source.txt" 2>/dev/null || true)"
    if [ -n "$built_from" ] && [ ! -e "$built_from" ]; then
        mkdir -p "$(dirname "$built_from")" && ln -s "$repo" "$built_from"
        echo "bare :dep gpumem-nb: $built_from -> $repo"
    fi
    # shellcheck disable=SC1091
    . "$root/env.sh"
    rustc --version && cargo --version && nvcc --version | tail -1
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$root/site" "$root"/wheels/*.whl
    echo "setup took $((SECONDS - t0)) s"
}

env_file() {
    local cuda
    # shellcheck disable=SC2012  # cuda-X.Y: nothing for ls to mangle
    cuda="$(ls -d /usr/local/cuda-* 2>/dev/null | sort -V | tail -1)"
    cat > "$root/env.sh" <<EOF
export PATH="$root/rust/bin:$root/bin:$cuda/bin:\$PATH"
export CARGO_HOME="$root/cargo-home"
export CUDA_HOME="$cuda" CUDA_ROOT="$cuda" CUDA_PATH="$cuda"
export LD_LIBRARY_PATH="$cuda/lib64:$cuda/targets/x86_64-linux/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PYTHONPATH="$root/site\${PYTHONPATH:+:\$PYTHONPATH}"
export GPUMEM_NB_DEVICE=cuda
EOF
    # NCCL for cudarc's communicators (notebooks/gpu_multi.ipynb): pip's nvidia-nccl package,
    # beside PyTorch, where the toolkit has none.
    local nccl
    nccl="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
    if [ -n "$nccl" ] && [ -e "$nccl/libnccl.so.2" ]; then
        echo "export LD_LIBRARY_PATH=\"$nccl:\$LD_LIBRARY_PATH\"" >> "$root/env.sh"
    fi
}

run_nb() {
    # shellcheck disable=SC1091
    . "$root/env.sh"
    mkdir -p "$out"
    # Every notebook runs; the status says whether a run or a check failed.
    local status=0
    for nb in "$@"; do
        local name t0=$SECONDS
        name="$(basename "$nb" .ipynb)"
        step "gpumem-kernel run $nb"
        # A run that writes nothing leaves nothing of an earlier run to be checked in its place.
        rm -f "$out/$name.ipynb"
        set +e
        gpumem-kernel run "$nb" --output "$out/$name.ipynb" --html "$out/$name.html" 2>&1 | tee "$out/$name.log" | tail -40
        local code=${PIPESTATUS[0]}
        set -e
        echo "$name: exit $code, $((SECONDS - t0)) s" | tee -a "$out/timings.txt"
        [ "$code" = 0 ] || status=1
        set +e
        python3 scripts/gpu/check_notebook.py "$out/$name.ipynb" --require-tracking cupti --json "$out/$name.check.json" \
            | tee "$out/$name.check.txt" | tail -25
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
        set -e
    done
    return $status
}

jupyter_nb() {
    # shellcheck disable=SC1091
    . "$root/env.sh"
    mkdir -p "$out"
    export JUPYTER_PATH="$root/jupyter/share/jupyter" JUPYTER_DATA_DIR="$root/jupyter/data"
    gpumem-kernel install --prefix "$root/jupyter"
    local status=0
    for nb in "$@"; do
        local name t0=$SECONDS
        name="$(basename "$nb" .ipynb)-jupyter"
        step "jupyter_client/nbclient, kernel gpumem: $nb"
        rm -f "$out/$name.ipynb"
        set +e
        python3 - "$nb" "$out/$name.ipynb" <<'PY'
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
try:
    NotebookClient(nb, kernel_name="gpumem", timeout=900, resources={"metadata": {"path": "notebooks"}}).execute()
finally:
    # Written also when a cell failed: the checker names it, and the cells never reached.
    nbformat.write(nb, sys.argv[2])
print("executed", sys.argv[1])
PY
        local code=$?
        set -e
        echo "$name: exit $code, $((SECONDS - t0)) s" | tee -a "$out/timings.txt"
        [ "$code" = 0 ] || status=1
        set +e
        python3 scripts/gpu/check_notebook.py "$out/$name.ipynb" --require-tracking cupti --json "$out/$name.check.json" \
            | tee "$out/$name.check.txt" | tail -25
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
        set -e
    done
    return $status
}

warm_nb() {
    # A notebook's first `:dep` build alone (burn and cubecl take longer than one device call
    # may): its `:dep` cell is run by itself with a time limit, in the kernel that will run the
    # notebook (`gpumem`, or `stock` for the stock evcxr kernel). Call again until it says done:
    # cargo goes on from what it built. The seconds add up in $root/warm-NAME-KERNEL.s.
    # shellcheck disable=SC1091
    . "$root/env.sh"
    mkdir -p "$out"
    local nb="$1" kernel="${2:-gpumem}" name warm t0=$SECONDS code
    name="$(basename "$nb" .ipynb)"
    warm="$(dirname "$nb")/.warm-$name.ipynb"
    python3 - "$nb" "$warm" <<'PY'
import sys, nbformat
nb = nbformat.read(sys.argv[1], as_version=4)
nb.cells = [c for c in nb.cells if c.cell_type == "code" and c.source.lstrip().startswith(":dep")][:1]
nbformat.write(nb, sys.argv[2])
PY
    set +e
    if [ "$kernel" = stock ]; then
        export JUPYTER_PATH="$root/stock-jupyter" JUPYTER_DATA_DIR="$root/stock-jupyter" 
        evcxr_jupyter --install > /dev/null
        stock_build_dir
        local std_dir
        std_dir="$(rustc --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/lib"
        export LD_LIBRARY_PATH="$std_dir:$LD_LIBRARY_PATH"
        timeout 540 python3 - "$warm" <<'PY'
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, kernel_name="rust", timeout=600, resources={"metadata": {"path": "notebooks"}}).execute()
PY
        code=$?
    else
        timeout 540 gpumem-kernel run "$warm" --output "$out/$name-warm.ipynb" 2>&1 | tail -5
        code=${PIPESTATUS[0]}
    fi
    set -e
    local spent=$((SECONDS - t0)) total
    total=$(( $(cat "$root/warm-$name-$kernel.s" 2>/dev/null || echo 0) + spent ))
    echo "$total" > "$root/warm-$name-$kernel.s"
    # Not done is no success (exit 3, as `corpus54 warm`): `warm … && run …` runs only on a build
    # that finished, and a build that failed is told from one that ran out of time.
    local state="done"
    case "$code" in
        0) ;;
        124) state="not done (out of time): call warm again" ;;
        *) state="FAILED (exit $code): the build did not run out of time, it failed" ;;
    esac
    echo "$name ($kernel kernel): first :dep build $spent s this call, $total s in all, $state" | tee -a "$out/timings.txt"
    [ "$code" = 0 ] || return 3
}

stock_build_dir() {
    # The stock kernel builds its cells where gpumem-kernel builds them for a user
    # (~/.cache/gpumem-kernel/evcxr): both embed evcxr 0.22 and build dependencies alike (the
    # line-table flags go to the cell crate only), so burn and candle compile once per GPU
    # session instead of twice. A stock user's own first build takes what gpumem-kernel's first
    # build took (`warm` measures it).
    export EVCXR_TMPDIR="${XDG_CACHE_HOME:-$HOME/.cache}/gpumem-kernel/evcxr"
    mkdir -p "$EVCXR_TMPDIR"
}

stock_nb() {
    # The same notebooks in the stock evcxr kernel ("Rust"), gpumem-nb hooking itself into the
    # child: sites name functions and cells there, not lines (the child never sees a cell's
    # text), hence --no-lines. Each is checked by scripts/gpu/check_stock.py (the report lines
    # the stock kernel prints); check_notebook.py --stock reads the records beside cells' values.
    # shellcheck disable=SC1091
    . "$root/env.sh"
    mkdir -p "$out"
    export JUPYTER_PATH="$root/stock-jupyter" JUPYTER_DATA_DIR="$root/stock-jupyter"
    evcxr_jupyter --install > /dev/null
    stock_build_dir
    # The build directory and the toolchain share /opt/gpumem: evcxr's relative rpath to libstd
    # climbs one level too far (kernel/README.md, the stock kernel's known limits).
    local std_dir
    std_dir="$(rustc --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/lib"
    export LD_LIBRARY_PATH="$std_dir:$LD_LIBRARY_PATH"
    # Every notebook runs; the status says whether a run or a check failed.
    local status=0
    for nb in "$@"; do
        local name t0=$SECONDS code
        name="$(basename "$nb" .ipynb)-stock"
        [ "${GPUMEM_STOCK_LINES:-}" = 1 ] && name="$name-lines"
        step "jupyter_client/nbclient, stock kernel rust: $nb"
        rm -f "$out/$name.ipynb"
        set +e
        python3 - "$nb" "$out/$name.ipynb" <<'PY'
import sys, nbformat
from nbclient import NotebookClient
import os, re
nb = nbformat.read(sys.argv[1], as_version=4)
# gpumem-kernel's magics are not the stock kernel's: their lines go, and cells left empty. A bare
# `:dep gpumem-nb` (gpumem-kernel's: the crate it was built with) is this repo's path for the
# stock kernel.
for c in nb.cells:
    if c.cell_type == "code":
        c.source = "\n".join(l for l in c.source.splitlines() if not l.lstrip().startswith("%"))
nb.cells = [c for c in nb.cells if not (c.cell_type == "code" and not c.source.strip())]
# Cells whose computation the stock kernel gets wrong (`not-stock`: a candle backward across
# cells) may fail there without ending the run; the checker lists them as skipped.
for c in nb.cells:
    tags = c.get("metadata", {}).get("tags", [])
    if "not-stock" in tags and "raises-exception" not in tags:
        c.metadata["tags"] = tags + ["raises-exception"]
# GPUMEM_STOCK_LINES=1: the README's recipe for the notebook's own functions in the stock kernel,
# line tables for every crate evcxr builds (evcxr's `:build_env`, before the first `:dep`).
if os.environ.get("GPUMEM_STOCK_LINES") == "1":
    nb.cells.insert(0, nbformat.v4.new_code_cell(
        ":build_env CARGO_PROFILE_DEV_DEBUG=line-tables-only\n:build_env CARGO_PROFILE_DEV_STRIP=none"))
repo = os.path.abspath(os.path.join(os.path.dirname(sys.argv[1]), ".."))
for c in nb.cells:
    if c.cell_type == "code":
        c.source = re.sub(r"(?m)^(\s*):dep gpumem-nb\s*$", lambda m: f'{m.group(1)}:dep gpumem-nb = {{ path = "{repo}" }}', c.source)
try:
    NotebookClient(nb, kernel_name="rust", timeout=900, resources={"metadata": {"path": "notebooks"}}).execute()
finally:
    # Written also when a cell failed: the checker names it, and the cells never reached.
    nbformat.write(nb, sys.argv[2])
print("executed", sys.argv[1])
PY
        code=$?
        set -e
        echo "$name: exit $code, $((SECONDS - t0)) s" | tee -a "$out/timings.txt"
        [ "$code" = 0 ] || status=1
        set +e
        python3 scripts/gpu/check_stock.py "$out/$name.ipynb" | tee "$out/$name.check.txt"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
        set -e
    done
    return $status
}

trim_nb() {
    # `%gpumem trim` (issue 57) after candle, burn or both (`trim [candle] [burn]`, default
    # candle): each notebook run and checked as `run` does, then held to its cache owner's and
    # NVML's figures by scripts/gpu/trim_check.py (the CUDA pool for candle, cubecl for burn:
    # read with no call of the notebook's). burn's build is gpu_nocall_burn's (corpus54's warm).
    local status=0 which owner
    for which in "${@:-candle}"; do
        case "$which" in
            candle) owner="CUDA pool" ;;
            burn) owner="cubecl" ;;
            *) echo "trim: candle or burn, not $which" >&2; return 2 ;;
        esac
        run_nb "notebooks/gpu_trim_$which.ipynb" || status=1
        python3 scripts/gpu/trim_check.py "$out/gpu_trim_$which.ipynb" --owner "$owner" | tee "$out/gpu_trim_$which.trim.txt"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
    done
    return $status
}

fit_nb() {
    # `%gpumem fit` from what already ran (issue 57, item 4): candle with no call of gpumem-nb and
    # no `record on`, through jupyter_client/nbclient as `jupyter` runs it, then each verdict held
    # to the session's tracked peak by scripts/gpu/fit_session_check.py. candle's build is
    # gpu_trim_candle's (corpus54's warm).
    local status=0
    jupyter_nb notebooks/gpu_fit_nocall.ipynb || status=1
    python3 scripts/gpu/fit_session_check.py "$out/gpu_fit_nocall-jupyter.ipynb" | tee "$out/gpu_fit_nocall.fit.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    return $status
}

sweep_nb() {
    # `%%gpumem sweep` proved on the card (issue 57, item 3): each notebook run through
    # jupyter_client/nbclient by scripts/gpu/sweep_proof.py, which reads the largest batch the
    # sweep says fits, then runs the step at it (must fit) and at 5 % more (must fail with a
    # named out-of-memory) in the same kernel. `sweep [candle] [candle24] [burn]` (default the
    # three): candle on this card and under a CUDA pool capped at 24 GiB, burn on this card.
    # candle's build is gpu_trim_candle's (corpus54's warm); candle24 adds gpumem-nb's; burn's is
    # gpu_trim_burn's (`warm notebooks/gpu_sweep_burn.ipynb`).
    # shellcheck disable=SC1091
    . "$root/env.sh"
    mkdir -p "$out/sweep"
    export JUPYTER_PATH="$root/jupyter/share/jupyter" JUPYTER_DATA_DIR="$root/jupyter/data"
    gpumem-kernel install --prefix "$root/jupyter" > /dev/null
    local status=0 which nb target t0
    [ $# -gt 0 ] || set -- candle candle24 burn
    for which in "$@"; do
        t0=$SECONDS
        case "$which" in
            candle) nb=notebooks/gpu_sweep_candle.ipynb target="" ;;
            candle24) nb=notebooks/gpu_sweep_candle_24.ipynb target="--on 24.00 GiB" ;;
            burn) nb=notebooks/gpu_sweep_burn.ipynb target="" ;;
            *) echo "sweep: candle, candle24 or burn, not $which" >&2; return 2 ;;
        esac
        step "sweep proof: $nb"
        set +e
        python3 scripts/gpu/sweep_proof.py "$nb" "$out/sweep" ${target:+--target "$target"} \
            | tee "$out/sweep/$(basename "$nb" .ipynb).proof.txt"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
        set -e
        echo "sweep $which: $((SECONDS - t0)) s" | tee -a "$out/timings.txt"
    done
    return $status
}

cell_bench() {
    # The small-cell benchmark (scripts/cell_bench.py, issue 35) on this host: gpumem-kernel and
    # the stock evcxr kernel, interleaved, on the simulated device (the cells' compile time is
    # what it measures). Arguments go to cell_bench.py (--rounds N, --no-candle).
    # shellcheck disable=SC1091
    . "$root/env.sh"
    mkdir -p "$out"
    local spec="$root/bench-jupyter"
    gpumem-kernel install --prefix "$spec" --no-prebuild > /dev/null
    JUPYTER_DATA_DIR="$spec/share/jupyter" evcxr_jupyter --install > /dev/null
    export JUPYTER_PATH="$spec/share/jupyter"
    local std_dir
    std_dir="$(rustc --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/lib"
    export LD_LIBRARY_PATH="$std_dir:$LD_LIBRARY_PATH"
    EVCXR_BENCH_STOCK_TMPDIR="${TMPDIR:-/tmp}/gpumem-nb-cell-bench-stock-evcxr" \
        python3 scripts/cell_bench.py "$repo" "$out/cells.json" "$@" | tee "$out/cell_bench.md"
}

case "${1:-}" in
    pack) pack ;;
    stash) stash "$2" ;;
    split) split_parts ;;
    setup) setup ;;
    run) shift; run_nb "$@" ;;
    jupyter) shift; jupyter_nb "$@" ;;
    stock) shift; stock_nb "$@" ;;
    warm) shift; warm_nb "$@" ;;
    cellbench) shift; cell_bench "$@" ;;
    corpus54) shift; exec bash "$repo/scripts/gpu/corpus54.sh" "$@" ;;
    allocbench) shift; exec bash "$repo/scripts/gpu/alloc_bench.sh" "$@" ;;
    trim) shift; trim_nb "$@" ;;
    fit) fit_nb ;;
    sweep) shift; sweep_nb "$@" ;;
    *) echo "usage: $0 pack | stash N | setup | run NB... | jupyter NB... | stock NB... | warm NB [gpumem|stock]" >&2; exit 2 ;;
esac
