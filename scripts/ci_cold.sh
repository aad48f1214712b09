#!/usr/bin/env bash
# CI from cold, as a new machine meets it: `.ci/run` in a fresh clone of HEAD with a HOME of its
# own (no crates downloaded, no ~/.cache: no target directory, no notebook-cell builds, no pip or
# npm caches, no venvs) and a CARGO_HOME of its own (nothing installed with cargo); rustup's
# toolchains are kept (a new machine has its toolchain), linked as that HOME's ~/.rustup.
# Debian's packages the tests install when missing (chromium, chromium-driver, prometheus,
# slurm-wlm, munge) are left as they are: remove them first for a run that installs them too.
# Prints the test command's seconds per step, and how busy the machine's cores were: every 10 s
# a line of DIR/cpu.tsv (time, busy share of all cores since the line before), averaged at the end.
#   scripts/ci_cold.sh DIR       (DIR: an empty directory; the log is DIR/ci.log)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="$(mkdir -p "${1:?DIR}" && cd "$1" && pwd)"
[ -z "$(ls -A "$dir")" ] || { echo "FAIL: $dir is not empty" >&2; exit 1; }
rustup_home="${RUSTUP_HOME:-$HOME/.rustup}"
mkdir -p "$dir/home/.cargo/bin"
# As rustup's installer leaves a new machine: ~/.rustup with the toolchains (here a link to this
# machine's) and its proxies alone in ~/.cargo/bin (cargo, rustc, rustup, ...: they pick the tool
# by the name they run as). No RUSTUP_HOME: a test that runs a tool with an emptied environment
# (HOME and PATH) must find the toolchain as it would on the user's machine.
ln -s "$rustup_home" "$dir/home/.rustup"
for tool in cargo cargo-clippy cargo-fmt cargo-miri clippy-driver rustc rustdoc rustfmt rustup rust-analyzer; do
    ln -s "$(command -v rustup)" "$dir/home/.cargo/bin/$tool"
done
git clone --quiet "$repo" "$dir/gpumem-nb"
path="$dir/home/.cargo/bin"
# Python as the machine has it (pyenv's shims, if that is where python3 comes from), no packages
# beyond its own: the tests make their own virtualenvs.
py_dir="$(dirname "$(command -v python3)")"
path="$path:$py_dir:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The machine's busy share (user, nice, system, irq, softirq over all), from /proc/stat.
(
    read -r _ u n s i w q sq st _ < /proc/stat
    prev_busy=$((u + n + s + q + sq + st)) prev_all=$((u + n + s + i + w + q + sq + st))
    while sleep 10; do
        read -r _ u n s i w q sq st _ < /proc/stat
        busy=$((u + n + s + q + sq + st)) all=$((u + n + s + i + w + q + sq + st))
        printf '%s\t%d\n' "$(date +%T)" $(( 100 * (busy - prev_busy) / (all - prev_all + 1) ))
        prev_busy=$busy prev_all=$all
    done
) > "$dir/cpu.tsv" &
sampler=$!
start=$(date +%s)
set +e
(cd "$dir/gpumem-nb" && env -i HOME="$dir/home" PATH="$path" \
    ${PYENV_ROOT:+PYENV_ROOT="$PYENV_ROOT"} bash .ci/run) > "$dir/ci.log" 2>&1
status=$?
set -e
kill "$sampler" 2>/dev/null || true
echo "cold CI: exit $status after $(( $(date +%s) - start )) s (log: $dir/ci.log)"
sed -n '/^Seconds per step:/,/^\(All checks passed\|Checks passed\|FAIL: not every check ran\|Stopped after\)/p' "$dir/ci.log"
awk '{ sum += $2; n++ } END { if (n) printf "cores busy: %.0f%% on average over %d samples (%s)\n", sum / n, n, FILENAME }' "$dir/cpu.tsv"
exit "$status"
