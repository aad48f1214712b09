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

prefix="$target/lab-prefix"
rm -rf "$prefix"
# No prebuild: the notebook's `:dep gpumem-nb` builds the crate where every kernel builds cells
# (~/.cache/gpumem-kernel/evcxr; warm after the kernel's tests).
"$target/release/gpumem-kernel" install --prefix "$prefix" --no-prebuild >/dev/null
export JUPYTER_PATH="$prefix/share/jupyter"
export GPUMEM_NB_DEVICE=sim:8GiB
# Selenium's own driver manager stays offline: the driver is Debian's.
export SE_OFFLINE=true
unset EVCXR_TMPDIR
exec timeout 1500 "$venv/bin/python" "$repo/kernel/tests/lab_browser.py" "$out"
