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

if [ ! -x /usr/bin/chromedriver ] && [ -z "${CHROMEDRIVER:-}" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing Debian's chromium and chromium-driver"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    else
        echo "FAIL: no chromedriver (install Debian's chromium-driver, or set CHROMEDRIVER and CHROMIUM)"
        exit 1
    fi
fi

venv="$target/lab-venv"
pins=(jupyterlab==4.6.6 selenium==4.51.0)
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import jupyterlab, selenium; assert jupyterlab.__version__ == "4.6.6" and selenium.__version__ == "4.51.0"' 2>/dev/null; then
    python3 -m venv --clear "$venv"
    "$venv/bin/pip" install --quiet "${pins[@]}"
fi
# A kernel that is not gpumem-kernel, for the panel to say so: the venv's python3 (ipykernel).
"$venv/bin/python" -c 'import ipykernel' 2>/dev/null || "$venv/bin/pip" install --quiet ipykernel==7.4.0

prefix="$target/lab-panel-prefix"
rm -rf "$prefix"
"$target/release/gpumem-kernel" install --prefix "$prefix" --no-prebuild >/dev/null
CARGO_TARGET_DIR="$target" "$repo/lab/build.sh" "$prefix/share/jupyter/labextensions"
export JUPYTER_PATH="$prefix/share/jupyter"
export GPUMEM_NB_DEVICE=sim:8GiB
export SE_OFFLINE=true
unset EVCXR_TMPDIR
exec timeout 1800 "$venv/bin/python" "$repo/kernel/tests/lab_panel.py" "$out"
