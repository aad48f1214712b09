#!/usr/bin/env bash
# Bounded fuzzing of every input parser (fuzz/README.md), as scripts/test.sh runs it.
#   scripts/fuzz.sh build          cargo-fuzz (installed when missing) builds every target
#   scripts/fuzz.sh run [SECONDS]  each target for SECONDS (default 30; two at a time), building
#                                  what is missing
# Build outputs go to $CARGO_TARGET_DIR/fuzz (a build directory of its own: the sanitizer's flags
# share no unit with the workspace's, and `build` runs beside other builds in scripts/test.sh).
# The corpus grows in the target directory between runs; the committed seeds and dictionaries
# start it. A crash stops the script with the failing input written under fuzz/artifacts/; a
# target that fuzzed no input fails too. Without a nightly toolchain it prints `SKIPPED: reason`
# and exits 0: scripts/test.sh names the skip on its last line (and fails under
# GPUMEM_REQUIRE_ALL_CHECKS=1, as CI runs it).
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
    # Two targets at a time (GPUMEM_FUZZ_JOBS): libFuzzer runs on one core.
    jobs_at_once="${GPUMEM_FUZZ_JOBS:-2}"
    # Each target's run builds what is missing first; built here once, one cargo at a time.
    cargo +nightly fuzz build "${flags[@]}" >/dev/null
    fuzz_one() {
        local t=$1 corpus="$target/fuzz-corpus/$1" log="$target/fuzz-$1.log"
        mkdir -p "$corpus"
        if ! cargo +nightly fuzz run "${flags[@]}" "$t" "$corpus" "seeds/$t" -- -max_total_time="$seconds" \
                -rss_limit_mb=2048 -dict="dict/$t.dict" > "$log" 2>&1; then
            tail -40 "$log"
            if grep -q 'failed to build fuzz script' "$log"; then
                echo "fuzz target $t did not build (see the compiler's error above)"
            else
                echo "fuzz target $t failed: the input is under fuzz/artifacts/$t/ (turn it into a regression test)"
            fi
            return 1
        fi
        # libFuzzer ends a timed run with `Done N runs in S second(s)`: without it, or with no run,
        # nothing was fuzzed, and that is no pass.
        local done_line
        done_line="$(awk '/^Done [0-9]+ runs/ { d = $0 } END { print d }' "$log")"
        case "$done_line" in
            "" | "Done 0 runs"*)
                tail -20 "$log"
                echo "fuzz target $t ran no input (libFuzzer's last line: ${done_line:-no \"Done N runs\" line})"
                return 1
                ;;
        esac
        echo "$t: $done_line"
    }
    running=0 failed=0
    for t in "${targets[@]}"; do
        if [ "$running" -ge "$jobs_at_once" ]; then
            wait -n || failed=1
            running=$((running - 1))
        fi
        fuzz_one "$t" &
        running=$((running + 1))
    done
    while [ "$running" -gt 0 ]; do
        wait -n || failed=1
        running=$((running - 1))
    done
    exit "$failed"
    ;;
*)
    echo "usage: scripts/fuzz.sh build | run [SECONDS]" >&2
    exit 2
    ;;
esac
