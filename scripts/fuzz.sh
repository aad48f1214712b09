#!/usr/bin/env bash
# Bounded fuzzing of every input parser (fuzz/README.md), as scripts/test.sh runs it.
#   scripts/fuzz.sh build          cargo-fuzz (installed when missing) builds every target
#   scripts/fuzz.sh run [SECONDS]  each target for SECONDS (default 30), building what is missing
# Build outputs go to $CARGO_TARGET_DIR/fuzz (a build directory of its own: the sanitizer's flags
# share no unit with the workspace's, and `build` runs beside other builds in scripts/test.sh).
# The corpus grows in the target directory between runs; the committed seeds and dictionaries
# start it. A crash stops the script with the failing input written under fuzz/artifacts/.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
targets=(alloc_conf trace control magic pickle)
# The flags of every build and run: the same, so a run finds the build done.
flags=(-O --debug-assertions)

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "SKIPPED: no nightly toolchain (cargo-fuzz needs it)"
    exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    # Its own build directory too: installed beside the workspace's builds.
    CARGO_TARGET_DIR="$target/cargo-fuzz-build" cargo install --locked --quiet cargo-fuzz --version 0.13.2
fi
cd "$repo/fuzz"
export CARGO_TARGET_DIR="$target/fuzz"
case "${1:-}" in
build)
    cargo +nightly fuzz build "${flags[@]}"
    ;;
run)
    seconds="${2:-30}"
    for t in "${targets[@]}"; do
        corpus="$target/fuzz-corpus/$t"
        log="$target/fuzz-$t.log"
        mkdir -p "$corpus"
        if ! cargo +nightly fuzz run "${flags[@]}" "$t" "$corpus" "seeds/$t" -- -max_total_time="$seconds" \
                -rss_limit_mb=2048 -dict="dict/$t.dict" > "$log" 2>&1; then
            tail -40 "$log"
            if grep -q 'failed to build fuzz script' "$log"; then
                echo "fuzz target $t did not build (see the compiler's error above)"
            else
                echo "fuzz target $t failed: the input is under fuzz/artifacts/$t/ (turn it into a regression test)"
            fi
            exit 1
        fi
        echo "$t: $(grep -E '^Done' "$log" | tail -1)"
    done
    ;;
*)
    echo "usage: scripts/fuzz.sh build | run [SECONDS]" >&2
    exit 2
    ;;
esac
