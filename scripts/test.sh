#!/usr/bin/env bash
# Every check and test of the project, in the order a reviewer would run them.
# Usage: scripts/test.sh            (from anywhere; needs only a Rust toolchain and network
#                                    access to crates.io, and to rustup for the Miri step)
# Build outputs go to $CARGO_TARGET_DIR (default: ~/.cache/gpumem-nb/target), outside the
# clone, so repeated runs are incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gpumem-nb/target}"
export CARGO_TERM_COLOR=never

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "clippy: the whole workspace, all features (cuBLAS/NVRTC interop, the kernel)"
cargo clippy --workspace --all-targets --all-features -- -D warnings
step "clippy: the library, default features (simulated + CUDA backends)"
cargo clippy -p gpumem-nb --all-targets -- -D warnings
step "clippy: the library, no default features (simulated backend only)"
cargo clippy -p gpumem-nb --all-targets --no-default-features -- -D warnings

# --- Chromium for tests/html.rs (renders trace_plot.html headless; the test fails without it) ---
if [ ! -x /usr/bin/chromium ] && [ -z "${CHROMIUM:-}" ]; then
    step "installing Debian's chromium (needed by tests/html.rs)"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "cannot install chromium here (not root or no apt-get): install it, or set CHROMIUM=/path/to/chrome"
    fi
fi
# --- end chromium ---

step "tests: the library (unit, conformance with PyTorch 2.11 goldens, trace replay, round trips)"
cargo test -p gpumem-nb --all-features

# The kernel's tests run real evcxr, which compiles notebook cells: in release, evcxr's own
# rust-analyzer is fast enough; evcxr's build cache for the notebooks lives in the target dir.
export EVCXR_TMPDIR="$CARGO_TARGET_DIR/evcxr-tests"
mkdir -p "$EVCXR_TMPDIR"
step "tests: the kernel (real evcxr, the Jupyter protocol over ZMQ, headless runs, restarts)"
cargo test --release -p gpumem-kernel -- --test-threads=1

step "the tour notebook through jupyter_client/nbclient against the installed kernel"
kernel/tests/run_tour.sh release

step "the README's main command, and its HTML in headless Chromium (offline)"
kernel/tests/tour_html_check.sh

step "benchmarks build"
cargo bench --workspace --no-run

step "gpumem-replay on the shipped PyTorch traces"
for t in tests/fixtures/traces/*.trace.tsv.gz; do
    cargo run --quiet --release --bin gpumem-replay -- "$t"
done

step "Miri: the policy, stats and simulated device under the interpreter"
if rustup component add --toolchain nightly miri rust-src >/dev/null 2>&1; then
    MIRIFLAGS="-Zmiri-disable-isolation" cargo +nightly miri test -p gpumem-nb --lib --no-default-features \
        -- policy:: stats:: units:: config:: backend::sim
else
    echo "SKIPPED: could not install Miri for the nightly toolchain (rustup unreachable?)"
fi

echo
echo "All checks passed."
