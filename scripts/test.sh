#!/usr/bin/env bash
# Every check and test of the project, in the order a reviewer would run them.
# Usage: scripts/test.sh            (from anywhere; needs only a Rust toolchain and network
#                                    access to crates.io and PyPI, and the nightly toolchain for
#                                    the Miri and fuzzing steps: without it they are skipped and
#                                    named on the last line, or fail the run when
#                                    GPUMEM_REQUIRE_ALL_CHECKS=1, as in CI)
# Build outputs go to $CARGO_TARGET_DIR, by default the clone's own `target/`: the README's main
# command builds there too, so running it first leaves this script little to compile. Notebook
# cells are compiled where the kernel compiles them for a user, outside any cargo workspace
# (`~/.cache/gpumem-kernel/evcxr`; the stock kernel: evcxr's own temporary directory): only the
# kernel tests' framework lane sets EVCXR_TMPDIR (below, with why). CI (`.ci/run`) keeps the
# target directory outside the clone so repeated runs are incremental, and also runs the README's
# main command in a fresh clone.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"
export CARGO_TERM_COLOR=never
unset EVCXR_TMPDIR

# Each step's name, and the seconds the one before it took (`times` at the end lists them all:
# where a cold run spends its time).
step_name="" step_start=$(date +%s) run_start=$step_start times=""
step_done() {
    local now
    now=$(date +%s)
    [ -n "$step_name" ] && times+="$(printf '%6d s  %s' $((now - step_start)) "$step_name")"$'\n'
    step_start=$now
}
step() {
    step_done
    step_name="$*"
    printf '\n==> %s  [%s]\n' "$*" "$(date +%T)"
}
# The times, also when a step fails (where a failing cold run spent its time).
finished=""
times_at_exit() {
    local status=$?
    { [ "$status" = 0 ] || [ -n "$finished" ]; } && return
    step_done
    echo
    echo "Seconds per step:"
    printf '%s' "$times"
    echo "Stopped after $(( $(date +%s) - run_start )) s (exit $status) in: $step_name"
}
background_pid=""
# A failing run stops its background builds too.
kill_tree() {
    local child
    for child in $(pgrep -P "$1"); do kill_tree "$child"; done
    kill "$1" 2>/dev/null || true
}
stop_background() {
    [ -n "$background_pid" ] && { kill_tree "$background_pid"; wait "$background_pid" 2>/dev/null || true; }
    return 0
}
trap 'times_at_exit; stop_background' EXIT

# A step whose check could not run says `SKIPPED: reason` and exits 0 (no nightly toolchain for
# Miri or cargo-fuzz, GPUMEM_SLURM_TEST=off, not a git checkout): each is noted here and named on
# the last line, which says "All checks passed" only when every check ran. With
# GPUMEM_REQUIRE_ALL_CHECKS=1 (CI: .ci/run sets it) a skipped check fails the run instead.
skipped=()
# note_skips STEP FILE: FILE's `SKIPPED: reason` lines, noted as STEP's.
note_skips() {
    local reason
    while IFS= read -r reason; do
        skipped+=("$1: $reason")
    done < <(sed -n 's/^SKIPPED: //p' "$2")
}
# noting_skips STEP COMMAND...: runs COMMAND (its output shown as it goes, kept), noting its skips.
noting_skips() {
    local what="$1" log="$CARGO_TARGET_DIR/step-output.log"
    shift
    mkdir -p "$CARGO_TARGET_DIR"
    "$@" 2>&1 | tee "$log"
    note_skips "$what" "$log"
}

step "commit subjects, at most 72 characters since a4b97d8"
noting_skips "commit subjects" scripts/check_commits.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "vendor/evcxr is evcxr 0.22.0 with vendor/evcxr/patches applied"
bash scripts/evcxr_patches.sh check

# --- Debian packages the later steps use, installed in the background at the start when missing
# (as root, through apt-get; downloads, no CPU to speak of), each as its step installs it:
# chromium and chromium-driver (tests/html.rs, the JupyterLab tests; scripts/lab_env.sh),
# prometheus (the metrics and Slurm steps; scripts/prometheus_env.sh), slurm-wlm and munge (the
# Slurm recipe; deploy/slurm/local_slurm.sh). Each step still installs what it needs when it runs
# alone, and finds it here when it runs in this script.
packages_pid="" packages_log="$CARGO_TARGET_DIR/background-packages.log"
mkdir -p "$CARGO_TARGET_DIR"
missing() {
    local p
    for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || return 0; done
    return 1
}
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
    && missing chromium chromium-driver prometheus slurm-wlm munge; then
    (
        set -e
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        if missing chromium chromium-driver; then apt-get install -y -qq chromium chromium-driver; fi
        if missing prometheus; then apt-get install -y -qq --no-install-recommends prometheus; fi
        if missing slurm-wlm munge; then apt-get install -y -qq --no-install-recommends slurm-wlm munge; fi
    ) > "$packages_log" 2>&1 &
    packages_pid=$!
fi
wait_packages() {
    [ -z "$packages_pid" ] && return
    wait "$packages_pid" || { tail -20 "$packages_log"; echo "installing Debian's packages in the background failed (each step tries again)"; }
    packages_pid=""
}

# --- Builds that share no unit with the workspace's, started now beside the steps below at the
# lowest CPU priority: the stock evcxr_jupyter (at opt-level 0: tests/stock_kernel.sh), cargo-fuzz
# and the sanitized fuzz targets, Miri's sysroot and test build, then Miri's run of the tests
# (interpreted, on one core; the last step prints it). Each has a build directory of its own, so
# none holds cargo's lock on the workspace's. They take only what the steps leave: from cold the
# two cores are busy 98 % of the run (scripts/ci_cold.sh's cpu.tsv, 2026-11-29), so they end
# before they are needed rather than making the run shorter; warm, each is done in seconds.
# `wait_stock` waits for evcxr_jupyter before the stock kernel's step, `wait_background` for the
# rest at the end.
background_log="$CARGO_TARGET_DIR/background-builds.log"
miri_log="$CARGO_TARGET_DIR/background-miri.log"
stock_ready="$CARGO_TARGET_DIR/background-stock-ready"
export GPUMEM_STOCK_OPT_LEVEL=0
miri_flags="-Zmiri-disable-isolation"
rm -f "$stock_ready" "$miri_log"
(
    set -e
    echo "[$(date +%T)] evcxr_jupyter"; nice -n 19 tests/stock_kernel.sh --install-only
    touch "$stock_ready"
    echo "[$(date +%T)] fuzz targets"; nice -n 19 scripts/fuzz.sh build
    echo "[$(date +%T)] Miri"
    if rustup component add --toolchain nightly miri rust-src >/dev/null 2>&1; then
        # The two long random walks (thousands of policy steps, invariants checked after each)
        # run natively in the library's tests; interpreted they take many minutes for nothing
        # more to check.
        MIRIFLAGS="$miri_flags" nice -n 19 cargo +nightly miri test -p gpumem-nb --lib --no-default-features \
            -- policy:: stats:: units:: device::sim notebook::anchor \
            --skip policy::state::tests::random_walk_keeps_invariants \
            --skip policy::freeset::tests::agrees_with_a_sorted_map > "$miri_log" 2>&1 \
            || { tail -60 "$miri_log"; exit 1; }
    else
        echo "SKIPPED: could not install Miri for the nightly toolchain (rustup unreachable?)" > "$miri_log"
    fi
    echo "[$(date +%T)] done"
) > "$background_log" 2>&1 &
background_pid=$!
background_start=$(date +%s)
background_failed() {
    tail -60 "$background_log"
    echo "FAIL: a background build failed (exit $1): the log's end is above ($background_log)"
    exit 1
}
wait_stock() {
    local waited
    waited=$(date +%s)
    while [ ! -e "$stock_ready" ]; do
        if ! kill -0 "$background_pid" 2>/dev/null; then
            local status=0
            wait "$background_pid" || status=$?
            background_pid=""
            background_failed "$status"
        fi
        sleep 5
    done
    echo "evcxr_jupyter (background): started $(( waited - background_start )) s before this step, waited $(( $(date +%s) - waited )) s more"
}
wait_background() {
    [ -z "$background_pid" ] && return
    local status=0 waited
    waited=$(date +%s)
    wait "$background_pid" || status=$?
    background_pid=""
    echo "background builds: started $(( waited - background_start )) s before this step, waited $(( $(date +%s) - waited )) s more (log: $background_log)"
    [ "$status" = 0 ] || background_failed "$status"
}

step "clippy: the whole workspace, all features (cuBLAS/NVRTC interop, the kernel)"
cargo clippy --workspace --all-targets --all-features -- -D warnings
step "clippy: the library, default features (simulated + CUDA backends)"
cargo clippy -p gpumem-nb --all-targets -- -D warnings
step "clippy: the library, no default features (simulated backend only)"
cargo clippy -p gpumem-nb --all-targets --no-default-features -- -D warnings

wait_packages
# --- Chromium for tests/html.rs (renders trace_plot.html headless; the test fails without it) and
# chromium-driver for the JupyterLab browser test ---
if { [ ! -x /usr/bin/chromium ] && [ -z "${CHROMIUM:-}" ]; } || { [ ! -x /usr/bin/chromedriver ] && [ -z "${CHROMEDRIVER:-}" ]; }; then
    step "installing Debian's chromium and chromium-driver (tests/html.rs, the JupyterLab browser test)"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    else
        echo "cannot install chromium here (not root or no apt-get): install chromium and chromium-driver, or set CHROMIUM and CHROMEDRIVER"
    fi
fi
# --- end chromium ---

step "tests: the library (unit, layers, conformance with PyTorch 2.11 goldens, trace replay, round trips)"
# Built first, then run as two lanes (scripts/test_lanes.py): the test that documents every
# `gpumem_nb::` path users read (a `cargo doc` of its own, two minutes cold, mostly one core)
# beside all the others; then the doctests.
cargo test -p gpumem-nb --all-features --no-run --message-format=json-render-diagnostics \
    > "$CARGO_TARGET_DIR/library-tests.json"
python3 scripts/test_lanes.py "$CARGO_TARGET_DIR/library-tests.json" --lane "" paths --lane "" '*'
cargo test -p gpumem-nb --all-features --doc

# The kernel's tests run real evcxr, which compiles notebook cells: in release, evcxr's own
# rust-analyzer is fast enough. Our patches of evcxr (vendor/evcxr/PATCHES.md: variables kept,
# types named, cell-only) are tested by evcxr's unit tests in the same cargo command: alone,
# `-p gpumem-evcxr` unifies other features (libc's, rustix's, …) and builds the whole
# rust-analyzer stack a second time (8 to 21 min cold on two cores). evcxr's own integration
# tests are upstream's and not run: the kernel's targets are named instead of `--tests`.
kernel_tests=()
for t in kernel/tests/*.rs; do kernel_tests+=(--test "$(basename "$t" .rs)"); done
step "tests: the kernel (real evcxr, the Jupyter protocol over ZMQ, headless runs, restarts) and our patches of evcxr"
cargo test --release -p gpumem-kernel -p gpumem-evcxr --lib --bins "${kernel_tests[@]}" --no-run \
    --message-format=json-render-diagnostics > "$CARGO_TARGET_DIR/kernel-tests.json"
# Run as two lanes side by side: the framework notebooks (candle and burn built for cells,
# minutes cold) and the two-device one in one, everything else in the other. Warm, a kernel
# compiles one small cell at a time and leaves the other core idle (961 s in lanes); from cold
# both cores are busy anyway (808 s, 2026-11-29, after the prebuild below; 1,314 s without it).
# Each binary runs as cargo runs it (from its package's directory, one test at a time). The
# framework lane's kernels compile cells in a directory of their own (EVCXR_TMPDIR, as a user may
# set it): in the shared default one, a second kernel is seeded with a copy of what the first
# built (gigabytes, once candle is there).
cells_root="${XDG_CACHE_HOME:-$HOME/.cache}/gpumem-kernel"
framework_cells="$cells_root/tests-frameworks"
# From cold, the lanes would both build gpumem-nb and its dependencies for cells, each in its own
# directory, at once. Instead the framework lane's directory starts as a user's does after
# `gpumem-kernel install`: its prebuild builds them once where the kernel compiles cells
# (~/.cache/gpumem-kernel/evcxr), and the framework directory gets a copy of that build (its
# `target/`, less rustc's incremental state and old cells' libraries: what the kernel itself
# copies for a second notebook, kernel/src/build/build_dir.rs). candle and burn are still built
# by the corpus's cells as a user's are. Warm, the directory is there and this is skipped.
if [ ! -d "$framework_cells/target" ]; then
    step "gpumem-nb built for notebook cells once (gpumem-kernel install's prebuild); the framework lane's directory starts from it"
    "$CARGO_TARGET_DIR/release/gpumem-kernel" install --prefix "$CARGO_TARGET_DIR/prebuild-kernelspec"
    default_cells="$cells_root/evcxr"
    if [ -d "$default_cells/target" ]; then
        mkdir -p "$framework_cells/target"
        tar -C "$default_cells/target" --exclude=incremental --exclude='libcode_[0-9]*.so' -cf - . \
            | tar -C "$framework_cells/target" -xf -
        echo "copied $(du -sh "$framework_cells/target" | cut -f1) of builds to $framework_cells"
    else
        # The prebuild went elsewhere (the kernel said where and why, above): the framework lane
        # builds for itself.
        echo "no build in $default_cells to copy: the framework lane's kernels build gpumem-nb themselves"
    fi
    step "tests: the kernel, run (two lanes)"
fi
python3 scripts/test_lanes.py "$CARGO_TARGET_DIR/kernel-tests.json" \
    --lane "EVCXR_TMPDIR=$framework_cells" corpus devices \
    --lane "" '*' -- --test-threads=1

step "the tour notebook through jupyter_client/nbclient against the installed kernel"
kernel/tests/run_tour.sh release

# About a minute: Debian's prometheus (installed when missing) scrapes the kernel while a notebook
# runs; the values it stored equal the cells' records.
step "the kernel's metrics endpoint scraped by a real Prometheus, values read back through its HTTP API"
kernel/tests/prometheus.sh release

# About a minute: the Slurm recipe (deploy/slurm/): two ranks of examples/train_rank scraped by Debian's
# prometheus with the recipe's prometheus.yml, started as srun would, then through train.sbatch on a
# throwaway one-node Slurm (Debian's slurm-wlm and munge); what Prometheus stored equals the ranks' records.
# The example as the library's tests built it (debug, all features): in release it would build
# gpumem-nb and its dev-dependencies once more (65 units) for a job whose steps are timed anyway.
step "the Slurm recipe: two ranks scraped by a real Prometheus, bounded labels, values equal the records, every Grafana query answered"
noting_skips "the Slurm recipe" deploy/slurm/test.sh debug --all-features

# Under a minute: a cell starts a worker on the simulated device (`gpumem-demo hold`); its report
# lists the worker by pid and name, apart from the notebook's own numbers.
step "child processes: a cell's worker on the simulated device in its report"
kernel/tests/children.sh release

# A short soak (scripts/soak.sh; the 5,000-cell figures are in BENCHMARKS.md): 100 cells with
# allocations, drops, temporaries, magics, two panics and a restart; exactly one report per cell, the
# kernel's RSS bounded, and the history keeping 40 cells with the rest summarised (hook times shown).
step "soak: 100 cells through nbclient on the simulated device"
GPUMEM_NB_HISTORY_CELLS=40 scripts/soak.sh 100 --assert

# A few minutes with gpumem-nb already built in ~/.cache/gpumem-kernel/evcxr (the kernel's tests
# above leave it so); screenshots in $CARGO_TARGET_DIR/lab-browser/.
step "the kernel in a real JupyterLab 4.6.6 in headless Chromium: run all, live line, panic, bad magic, layout, themes"
kernel/tests/lab_browser.sh

# evcxr_jupyter is installed once into the target directory, in the background above (at
# opt-level 0; seconds once it is there).
step "gpumem-nb in the stock evcxr kernel: the packaged crate from a local registry, evcxr_jupyter 0.22.0, a notebook through nbclient"
wait_stock
tests/stock_kernel.sh

step "the README's main command, and its HTML in headless Chromium (offline)"
kernel/tests/tour_html_check.sh

step "the crate as crates.io would get it: cargo publish --dry-run (packaged, then built from the package)"
cargo publish --dry-run -p gpumem-nb --allow-dirty
# The kernel's packages too (gpumem-evcxr: evcxr with our patches). Packaged here; built from the
# packages in release by the next step, which shares this target directory (a verifying dry run
# builds all three again in debug, rust-analyzer's crates twice: 22 min on two cores).
step "the kernel as crates.io would get it: gpumem-nb, gpumem-evcxr and gpumem-kernel packaged (cargo publish --dry-run --no-verify)"
cargo publish --dry-run --no-verify -p gpumem-nb -p gpumem-evcxr -p gpumem-kernel --allow-dirty

step "cargo install: a checkout's kernel, and the kernel built from its package, each into an empty root and running a notebook"
scripts/cargo_install_check.sh

# The extension in the wheel, on its own: built by lab/build.sh into a private prefix.
step "the GPU memory panel (gpumem-lab) in the real JupyterLab in headless Chromium: figures equal the records, live, click, two notebooks"
kernel/tests/lab_panel.sh

# After every step that runs target/release/gpumem-kernel: maturin builds the kernel's last crate
# again, with its line tables stripped for the wheel.
step "the wheel: built (scripts/wheel.sh), installed into a fresh virtualenv with JupyterLab, used from an empty environment"
scripts/wheel.sh
# Cells compiled in a directory of their own, kept between runs (the wheel's gpumem-nb is another
# source than the checkout's: in ~/.cache they would rebuild each other); unset, the test times a
# cold first report instead.
GPUMEM_WHEEL_CELL_CACHE="$HOME/.cache/gpumem-wheel-cells" python/tests/wheel.sh

# The benchmarks (benches/: criterion, gpumem-nb's only) are compiled by the first clippy step
# (--all-targets); building them in the bench profile too took 141 s from cold (2026-11-29) and
# checked only that they link.

step "gpumem-replay on the shipped PyTorch traces"
for t in tests/fixtures/traces/*.trace.tsv.gz; do
    cargo run --quiet --release --bin gpumem-replay -- "$t"
done

# Bounded fuzzing of every input parser (scripts/fuzz.sh, fuzz/README.md): built in the
# background above (`fuzz.sh run` waits for cargo's lock on it if that is still going).
fuzz_seconds="${GPUMEM_FUZZ_SECONDS:-30}"
step "fuzzing: allocator config, trace reader, control protocol, %gpumem magics, snapshot pickles (${fuzz_seconds} s each)"
noting_skips "fuzzing" scripts/fuzz.sh run "$fuzz_seconds"

step "Miri: the policy, stats, simulated device and the process-wide anchor under the interpreter (run in the background)"
wait_background
cat "$miri_log"
note_skips "Miri" "$miri_log"

step_done
finished=1
echo
echo "Seconds per step:"
printf '%s' "$times"
took=$(( $(date +%s) - run_start ))
if [ "${#skipped[@]}" = 0 ]; then
    echo "All checks passed in $took s."
    exit 0
fi
printf 'SKIPPED: %s\n' "${skipped[@]}"
names="$(printf '%s; ' "${skipped[@]}")"
names="${names%; }"
if [ "${GPUMEM_REQUIRE_ALL_CHECKS:-}" = 1 ]; then
    echo "FAIL: not every check ran (GPUMEM_REQUIRE_ALL_CHECKS=1), skipped: $names"
    exit 1
fi
echo "Checks passed in $took s, but not every check ran, skipped: $names"
