#!/usr/bin/env bash
# The kernel as `cargo install` gives it (issue 45, item 2), two ways, each into an empty root and
# each running a notebook headlessly on the simulated device:
#   1. `cargo install --locked --path kernel`: a checkout's install;
#   2. the packages `cargo publish` would upload (gpumem-nb, gpumem-evcxr, gpumem-kernel, made by
#      `cargo package`), the kernel built from its package with the other two from theirs (as
#      crates.io would resolve them): what `cargo install gpumem-kernel` builds.
# Both build in release into $CARGO_TARGET_DIR (default: the clone's target/), so the
# dependencies the kernel's own build compiled are reused; the packaged crates compile again
# from their unpacked sources (a few minutes on two cores).
#   scripts/cargo_install_check.sh
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"
work=$(mktemp -d /tmp/gpumem-cargo-install-XXXXXX)
trap 'rm -rf "$work"' EXIT

# A notebook of two cells: the crate the kernel names, and one allocation on it.
cat > "$work/two.ipynb" <<'EOF'
{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
 {"cell_type": "code", "metadata": {}, "execution_count": null, "outputs": [], "source": ":dep gpumem-nb"},
 {"cell_type": "code", "metadata": {}, "execution_count": null, "outputs": [],
  "source": "let alloc = gpumem_nb::current()?;\nlet x = gpumem_nb::DeviceBuffer::<u8>::zeros(&alloc, 64 << 20, gpumem_nb::StreamId::DEFAULT)?;\nalloc.memory_allocated()"}
]}
EOF
cat > "$work/one.ipynb" <<'EOF'
{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
 {"cell_type": "code", "metadata": {}, "execution_count": null, "outputs": [], "source": "1 + 1"}
]}
EOF

# Runs notebook $2 with the kernel $1; fails unless every cell ran and printed its report line.
run_with() {
    local exe=$1 nb=$2 log="$work/run.log"
    GPUMEM_NB_DEVICE=sim:8GiB "$exe" run "$nb" --output "$work/out.ipynb" 2>&1 | tee "$log"
    grep -Eq '^gpumem-kernel run: [0-9]+ code cells in .*, 0 failed$' "$log" \
        || { echo "FAIL: $exe did not run $nb to the end"; exit 1; }
}

echo "--- 1. cargo install --locked --path kernel"
start=$(date +%s)
cargo install --locked --quiet --path kernel --root "$work/root1"
echo "installed in $(( $(date +%s) - start )) s: $("$work/root1/bin/gpumem-kernel" --version)"
run_with "$work/root1/bin/gpumem-kernel" "$work/two.ipynb"
python3 - "$work/out.ipynb" <<'PY'
import json, sys
nb = json.load(open(sys.argv[1]))
got = [o["data"]["text/plain"] for o in nb["cells"][1]["outputs"] if o.get("output_type") == "execute_result"]
assert got and "".join(got[0]) == "67108864", f"the cell's allocation: {got}"
print("the installed kernel's cell allocated 64 MiB through gpumem-nb (67108864 bytes)")
PY

echo "--- 2. the packaged kernel, built from its package"
version() {
    cargo metadata --no-deps --format-version 1 | python3 -c "import json,sys; print(next(p['version'] for p in json.load(sys.stdin)['packages'] if p['name'] == '$1'))"
}
crates=(gpumem-nb gpumem-evcxr gpumem-kernel)
cargo package --quiet --no-verify --allow-dirty "${crates[@]/#/--package=}"
mkdir -p "$work/packages"
for p in "${crates[@]}"; do
    tar -xzf "$CARGO_TARGET_DIR/package/$p-$(version $p).crate" -C "$work/packages"
done
kernel_dir="$work/packages/gpumem-kernel-$(version gpumem-kernel)"
# The kernel's package names its two siblings by version only, as on crates.io; they come from
# their packages here. `--locked`, as a user must install it (as evcxr_jupyter too): the package's
# Cargo.lock pins rust-analyzer's crates, whose newest semver-compatible releases do not build
# together (ra_ap_span 0.0.347 against a newer salsa).
start=$(date +%s)
# The workspace's release profile too (a package carries none), read from its Cargo.toml, so the
# dependencies the checkout's build compiled are reused and only the three crates build again;
# outside the workspace a `package."*"` override covers those three as well, so they get the
# profile's own settings as workspace members do.
mapfile -t profile < <(python3 - "$repo/Cargo.toml" "${crates[@]}" <<'PY'
import json, sys, tomllib
release = tomllib.load(open(sys.argv[1], "rb"))["profile"]["release"]
own = {k: v for k, v in release.items() if k != "package"}
packages = dict(release.get("package", {}))
for member in sys.argv[2:]:
    packages.setdefault(member, own)
for key, value in own.items():
    print(f"--config=profile.release.{key}={json.dumps(value)}")
for name, table in packages.items():
    for key, value in table.items():
        print(f"--config=profile.release.package.{json.dumps(name)}.{key}={json.dumps(value)}")
PY
)
# Its intermediate files in the shared directory, its final ones apart (build-dir): the checkout's
# target/release/gpumem-kernel is not replaced by this build's.
CARGO_BUILD_BUILD_DIR="$CARGO_TARGET_DIR" CARGO_TARGET_DIR="$work/target" \
    cargo install --locked --quiet --path "$kernel_dir" --root "$work/root2" "${profile[@]}" \
        --config "patch.crates-io.gpumem-nb.path=\"$work/packages/gpumem-nb-$(version gpumem-nb)\"" \
        --config "patch.crates-io.gpumem-evcxr.path=\"$work/packages/gpumem-evcxr-$(version gpumem-evcxr)\""
echo "built from the packages in $(( $(date +%s) - start )) s: $("$work/root2/bin/gpumem-kernel" --version)"
# Its `:dep gpumem-nb` would come from crates.io (no checkout beside it), where nothing is
# published from here: one cell without the crate.
run_with "$work/root2/bin/gpumem-kernel" "$work/one.ipynb"
echo "cargo install: both kernels ran their notebooks"
