#!/usr/bin/env bash
# The JupyterLab extension gpumem-lab (lab/) in a real JupyterLab in headless Chromium, with
# gpumem-kernel on a simulated device (kernel/tests/lab_panel.py says what is checked). Set up as
# kernel/tests/lab_browser.sh is (its virtualenv, Debian's chromium and chromium-driver); the
# kernelspec and the extension, built by lab/build.sh, go into a private prefix on JUPYTER_PATH,
# where JupyterLab finds the extension as a prebuilt one. Screenshots, JupyterLab's log and the
# browser's console: $CARGO_TARGET_DIR/lab-panel/.
#   kernel/tests/lab_panel.sh
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
out="$target/lab-panel"
(cd "$repo" && cargo build --quiet --release -p gpumem-kernel)

. "$repo/scripts/lab_env.sh"
lab_chromium
venv="$target/lab-venv"
lab_venv "$venv"
# A kernel that is not gpumem-kernel, for the panel to say so: the venv's python3 (ipykernel).
"$venv/bin/python" -c 'import ipykernel' 2>/dev/null || "$venv/bin/pip" install --quiet ipykernel==7.4.0

lab_prefix "$target/lab-panel-prefix" "$target" --extension
exec timeout 1800 "$venv/bin/python" "$repo/kernel/tests/lab_panel.py" "$out"
