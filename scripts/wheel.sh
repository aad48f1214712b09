#!/usr/bin/env bash
# Builds the gpumem-kernel wheel: `pip install` it and Jupyter has the "Rust (gpumem)" kernel.
#   scripts/wheel.sh [OUTDIR]        (default: ${CARGO_TARGET_DIR:-target}/wheels)
# The wheel (python/pyproject.toml, maturin's `bin` bindings) holds the kernel's release binary
# (installed on PATH as `gpumem-kernel`), the `gpumem_kernel` Python package (`python -m
# gpumem_kernel`, what the kernelspec starts), and under the environment's prefix:
#   share/jupyter/kernels/gpumem/                      the kernelspec (kernel.json, two logos)
#   share/jupyter/labextensions/gpumem-lab/            the prebuilt JupyterLab extension (lab/build.sh)
#   share/gpumem-kernel/crates/gpumem-nb-<version>/    gpumem-nb's source, what `:dep gpumem-nb` loads
# Generated data is staged under the target directory ($target/wheel-build), linked into the
# project as python/build-data (ignored by git). maturin runs from a pinned virtualenv there too.
# Needs Python 3 with venv, a Rust toolchain, Node.js 20+ with npm (lab/build.sh), PyPI once
# (maturin) and the npm registry once (the extension's packages); the kernel's release build
# is shared with `cargo build --release -p gpumem-kernel` (only the binary is linked again, its
# line tables dropped).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"
mkdir -p "$CARGO_TARGET_DIR"
target="$(cd "$CARGO_TARGET_DIR" && pwd)"
out="${1:-$target/wheels}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
export CARGO_TERM_COLOR=never

# maturin's pin. 1.16.0: `bin` bindings with a python-source package and a `data` directory
# (checked by python/tests/wheel.sh on the built wheel's layout).
MATURIN_VERSION=1.16.0
# The oldest glibc the wheel runs on. A binary linked on this host's glibc (2.36, Debian 12) needs
# GLIBC_2.34 symbols (Rust's std after glibc merged libpthread into libc), so manylinux_2_34:
# Ubuntu 22.04+, Debian 12+, RHEL/Rocky 9+. maturin checks the binary against it and fails if
# the binary needs more.
COMPATIBILITY="${GPUMEM_WHEEL_COMPATIBILITY:-manylinux_2_34}"
# Another architecture: GPUMEM_WHEEL_TARGET=aarch64-unknown-linux-gnu (Grace hosts) cross-builds the
# kernel with zig as the linker and C compiler (ziglang from PyPI, in maturin's virtualenv; rustup's
# std for that target), a second full release build of the kernel (its own target directory
# under $CARGO_TARGET_DIR). zig links against the glibc the tag names, so the tag is the one
# asked for: manylinux_2_28 (RHEL 8+, Ubuntu 20.04+) unless GPUMEM_WHEEL_COMPATIBILITY says
# otherwise.
TARGET="${GPUMEM_WHEEL_TARGET:-}"
ZIGLANG_VERSION=0.13.0
if [ -n "$TARGET" ]; then
    COMPATIBILITY="${GPUMEM_WHEEL_COMPATIBILITY:-manylinux_2_28}"
fi

stage="$target/wheel-build"
venv="$stage/venv"
step() { printf '\n==> %s\n' "$*"; }

step "maturin $MATURIN_VERSION in $venv"
if [ ! -x "$venv/bin/maturin" ] || [ "$("$venv/bin/maturin" --version 2>/dev/null)" != "maturin $MATURIN_VERSION" ]; then
    python3 -m venv --clear "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "maturin==$MATURIN_VERSION"
fi
"$venv/bin/maturin" --version
cross=()
if [ -n "$TARGET" ]; then
    step "cross-building for $TARGET: rustup's std for it, zig $ZIGLANG_VERSION as linker"
    rustup target list --installed | grep -qx "$TARGET" || rustup target add "$TARGET"
    "$venv/bin/python" -c "import ziglang" 2>/dev/null \
        || "$venv/bin/pip" install --quiet --disable-pip-version-check "ziglang==$ZIGLANG_VERSION"
    cross=(--target "$TARGET" --zig)
fi

# The data directory maturin puts into the wheel as <name>.data/data/ (installed under the prefix).
data_root="$stage/wheel-data"
data="$data_root/data"
rm -rf "$data_root"
mkdir -p "$data/share/jupyter/kernels/gpumem" "$data/share/gpumem-kernel/crates"

version=$(cargo metadata --no-deps --format-version 1 --manifest-path kernel/Cargo.toml \
    | python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "gpumem-kernel"))')

step "the kernelspec gpumem (gpumem-kernel $version): python -m gpumem_kernel"
# kernel/kernelspec/kernel.json is the template `gpumem-kernel install` fills with its own path;
# the wheel's starts the kernel through the Python of the environment Jupyter runs in (a leading
# "python" in argv is Jupyter's own sys.executable), so it works without activating it.
python3 - kernel/kernelspec/kernel.json "$data/share/jupyter/kernels/gpumem/kernel.json" "$version" <<'PY'
import json, sys
template, dest, version = sys.argv[1:]
spec = json.loads(open(template).read().replace("@VERSION@", version))
assert spec["argv"][1:] == ["--connection-file", "{connection_file}"], spec["argv"]
spec["argv"] = ["python", "-m", "gpumem_kernel", "--connection-file", "{connection_file}"]
assert spec["display_name"] == "Rust (gpumem)" and spec["language"] == "rust", spec
assert spec["interrupt_mode"] == "message" and spec["metadata"]["gpumem_kernel_version"] == version, spec
with open(dest, "w") as f:
    json.dump(spec, f, indent=2)
    f.write("\n")
PY
cp kernel/kernelspec/logo-32x32.png kernel/kernelspec/logo-64x64.png "$data/share/jupyter/kernels/gpumem/"
cat "$data/share/jupyter/kernels/gpumem/kernel.json"

step "gpumem-nb's source for notebook cells (cargo package, unpacked)"
# Packaged into the stage's own target directory: the shared one's package/ is cargo publish's.
rm -rf "$stage/package"
cargo package -p gpumem-nb --no-verify --allow-dirty --quiet --target-dir "$stage/package"
crate=$(ls "$stage"/package/package/gpumem-nb-*.crate)
[ "$(echo "$crate" | wc -l)" = 1 ] || { echo "expected one packaged gpumem-nb, found: $crate"; exit 1; }
tar -xzf "$crate" -C "$data/share/gpumem-kernel/crates"
ls "$data/share/gpumem-kernel/crates"

step "the JupyterLab extension gpumem-lab (prebuilt)"
rm -rf "$stage/lab"
bash lab/build.sh "$stage/lab"
[ -f "$stage/lab/gpumem-lab/package.json" ] || { echo "lab/build.sh wrote no $stage/lab/gpumem-lab/package.json"; exit 1; }
mkdir -p "$data/share/jupyter/labextensions"
cp -a "$stage/lab/gpumem-lab" "$data/share/jupyter/labextensions/gpumem-lab"
# Who installed it, for JupyterLab's extension list and manager (as a prebuilt extension in a
# Python package says).
cat > "$data/share/jupyter/labextensions/gpumem-lab/install.json" <<'JSON'
{
  "packageManager": "python",
  "packageName": "gpumem-kernel",
  "uninstallInstructions": "Use your Python package manager (pip, conda, etc.) to uninstall the package gpumem-kernel"
}
JSON
ls "$data/share/jupyter/labextensions/gpumem-lab"

# maturin reads the data directory from the project (python/pyproject.toml: data = "build-data").
link="$repo/python/build-data"
if [ -e "$link" ] && [ ! -L "$link" ]; then
    echo "python/build-data exists and is not the link this script makes: move it away"
    exit 1
fi
ln -sfn "$data_root" "$link"

step "maturin build --release --compatibility $COMPATIBILITY into $out"
(cd python && PATH="$venv/bin:$PATH" "$venv/bin/maturin" build --release ${cross[@]+"${cross[@]}"} --compatibility "$COMPATIBILITY" \
    --auditwheel check --out "$out")
wheel=$(ls -t "$out"/gpumem_kernel-"$version"-*.whl | head -1)
echo
echo "wheel: $wheel ($(du -h "$wheel" | cut -f1))"
