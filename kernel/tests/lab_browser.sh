#!/usr/bin/env bash
# The gpumem kernel in a real JupyterLab in headless Chromium (kernel/tests/lab_browser.py says
# what is checked). Installs what it needs: JupyterLab and selenium, pinned, in a virtualenv under
# the target directory; Debian's chromium and chromium-driver when missing (as root, through
# apt-get). The kernelspec goes into a private prefix on JUPYTER_PATH; the device is simulated.
# Screenshots and JupyterLab's log: $CARGO_TARGET_DIR/lab-browser/.
#   kernel/tests/lab_browser.sh
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
out="$target/lab-browser"
cargo build --quiet --release -p gpumem-kernel

. "$repo/scripts/lab_env.sh"
lab_chromium
venv="$target/lab-venv"
lab_venv "$venv"
lab_prefix "$target/lab-prefix" "$target"
exec timeout 1500 "$venv/bin/python" "$repo/kernel/tests/lab_browser.py" "$out"
