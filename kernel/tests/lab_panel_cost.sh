#!/usr/bin/env bash
# What the gpumem-lab panel costs a cell (issue 45, item 4): kernel/tests/lab_panel_cost.py in
# JupyterLab 4.6.6 and Debian's headless chromium, set up as kernel/tests/lab_panel.sh does (its
# virtualenv, the kernelspec and the extension from lab/build.sh in a private prefix on
# JUPYTER_PATH), the simulated device. Cells build in $XDG_CACHE_HOME (default
# /tmp/gpumem-panel-cache). Not a test: it measures.
#   kernel/tests/lab_panel_cost.sh OUT_JSON [--rounds N] [--cells N] [--conditions open,other,closed,off]
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
out="$(realpath -m "${1:?usage: kernel/tests/lab_panel_cost.sh OUT_JSON [--rounds N] [--cells N]}")"
shift
mkdir -p "$(dirname "$out")"
(cd "$repo" && cargo build --quiet --release -p gpumem-kernel)
venv="$target/lab-venv"
[ -x "${CHROMEDRIVER:-/usr/bin/chromedriver}" ] || { echo "no chromedriver: run kernel/tests/lab_panel.sh once (it installs Debian's)"; exit 1; }
"$venv/bin/python" -c 'import jupyterlab, selenium; assert jupyterlab.__version__ == "4.6.6"' 2>/dev/null \
    || { echo "no $venv with JupyterLab 4.6.6: run kernel/tests/lab_panel.sh once (it makes it)"; exit 1; }

prefix="$target/lab-panel-cost-prefix"
. "$repo/scripts/lab_env.sh"
lab_prefix "$prefix" "$target" --extension
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-/tmp/gpumem-panel-cache}"
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); commit $(git -C "$repo" rev-parse --short HEAD)"
rc=0
timeout 3600 "$venv/bin/python" "$repo/kernel/tests/lab_panel_cost.py" "$out" "$@" || rc=$?
rm -rf "$prefix"
exit $rc
