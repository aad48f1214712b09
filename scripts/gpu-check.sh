#!/usr/bin/env bash
# Builds, here, everything the GPU machine runs (it has no Rust toolchain), into .gpu-bundle/
# (ignored by git via .git/info/exclude). Then run on the GPU machine, from the repo root:
#     bash scripts/gpu/run.sh          (results under $OUT)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gpumem-nb/target}"
mkdir -p .gpu-bundle
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qx '.gpu-bundle/' "$exclude" 2>/dev/null || echo '.gpu-bundle/' >> "$exclude"
# The test or bench executable that `cargo ARGS... --no-run` builds for target NAME.
executable() {
  local name=$1
  shift
  cargo "$@" --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$name"
}
cp "$(executable alloc bench --bench alloc)" .gpu-bundle/alloc-bench
cp "$(executable history bench --bench history)" .gpu-bundle/history-bench
cargo build --release --example snapshot_demo --example gpu_probe --example gpu_check --example alloc_pairs \
    --bin gpumem-replay
cp "$CARGO_TARGET_DIR/release/examples/snapshot_demo" "$CARGO_TARGET_DIR/release/examples/gpu_probe" \
   "$CARGO_TARGET_DIR/release/examples/gpu_check" "$CARGO_TARGET_DIR/release/examples/alloc_pairs" \
   "$CARGO_TARGET_DIR/release/gpumem-replay" .gpu-bundle/
# Every allocation of the process tracked on the GPU (issue 11): cudarc, cuMemAlloc, cuBLAS, VMM,
# pinned host; and tracking's cost per allocation at several stack depths.
cargo build --release --example track_check --features cublas
cp "$CARGO_TARGET_DIR/release/examples/track_check" .gpu-bundle/
# PyTorch's own probe, for the side-by-side conformance run (scripts/gpu/probe_compare.sh).
cp scripts/gpu/probe.py .gpu-bundle/
# Snapshots written here (simulated device; a replayed PyTorch trace) for PyTorch's tools there.
rm -rf .gpu-bundle/snapshots && mkdir -p .gpu-bundle/snapshots
GPUMEM_NB_DEVICE=sim "$CARGO_TARGET_DIR/release/examples/snapshot_demo" .gpu-bundle/snapshots/sim >/dev/null
"$CARGO_TARGET_DIR/release/gpumem-replay" tests/fixtures/traces/gpt2_train.trace.tsv.gz --snapshot .gpu-bundle/snapshots/gpt2 >/dev/null
cp "$(executable gpumem_nb test -p gpumem-nb --lib --release --features cublas,nvrtc)" .gpu-bundle/gpumem-nb-lib-tests
# The integration tests with GPU-only tests (`#[ignore]`d by a plain `cargo test`, so that a CPU
# host reports them ignored; run.sh runs them with --include-ignored).
for t in mem pinned; do
  cp "$(executable "$t" test -p gpumem-nb --release --features cublas,nvrtc --test "$t")" ".gpu-bundle/gpumem-nb-test-$t"
done
# The per-cell hook path (kernel side + notebook child in one binary) and the hook overhead.
cp "$(executable hook_path test --release -p gpumem-kernel --test hook_path)" .gpu-bundle/hook_path
cp "$(executable overhead test --release -p gpumem-kernel --test overhead)" .gpu-bundle/kernel-overhead
# A flame-graph renderer for `_memory_viz segments|memory` (PyTorch downloads Brendan Gregg's
# flamegraph.pl at run time; the GPU machine has no network): inferno, its Rust port.
cargo install --quiet inferno --version 0.12.8 --no-default-features --features cli --root "$CARGO_TARGET_DIR/inferno"
cp "$CARGO_TARGET_DIR/inferno/bin/inferno-flamegraph" .gpu-bundle/
rm -f .gpu-bundle/gpumem-nb-lib-tests-probe
strip .gpu-bundle/hook_path .gpu-bundle/kernel-overhead .gpu-bundle/inferno-flamegraph 2>/dev/null || true
strip .gpu-bundle/alloc-bench .gpu-bundle/history-bench .gpu-bundle/alloc_pairs .gpu-bundle/gpumem-replay 2>/dev/null || true  # the tests and snapshot_demo keep their symbols (frame names)
# Those keep their line tables too (stacks show file:line), compressed: 30 MB binaries become 8.
for f in gpu_check gpu_probe gpumem-nb-lib-tests gpumem-nb-test-mem gpumem-nb-test-pinned snapshot_demo track_check; do
  objcopy --compress-debug-sections=zlib ".gpu-bundle/$f"
done
du -sh .gpu-bundle
