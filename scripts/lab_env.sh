# Sourced (not run) by the scripts that need JupyterLab: the browser tests (kernel/tests/lab_*.sh)
# and the extension's build (lab/build.sh). One place for what they share.
#   . scripts/lab_env.sh

# The virtualenv $1 with the pinned JupyterLab and selenium, made (or remade) when it lacks them.
lab_venv() {
    local venv=$1
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import jupyterlab, selenium; assert jupyterlab.__version__ == "4.6.6" and selenium.__version__ == "4.51.0"' 2>/dev/null; then
        python3 -m venv --clear "$venv"
        "$venv/bin/pip" install --quiet jupyterlab==4.6.6 selenium==4.51.0
    fi
}

# Debian's chromium and chromium-driver, installed when missing (as root, through apt-get);
# fails when they are missing and cannot be installed (CHROMEDRIVER/CHROMIUM point elsewhere).
lab_chromium() {
    if [ ! -x /usr/bin/chromedriver ] && [ -z "${CHROMEDRIVER:-}" ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            echo "installing Debian's chromium and chromium-driver"
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
        else
            echo "FAIL: no chromedriver (install Debian's chromium-driver, or set CHROMEDRIVER and CHROMIUM)"
            return 1
        fi
    fi
}

# A private Jupyter prefix $1 (emptied first) with the kernelspec of $2/release/gpumem-kernel
# (no prebuild: notebook cells build gpumem-nb where every kernel builds them) and, with
# `--extension`, gpumem-lab built by lab/build.sh; then the environment a browser test runs in:
# JUPYTER_PATH on the prefix, the simulated device, selenium's driver manager offline (the driver
# is Debian's), no EVCXR_TMPDIR.
lab_prefix() {
    local prefix=$1 target=$2 extension=${3:-}
    local repo
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    rm -rf "$prefix"
    "$target/release/gpumem-kernel" install --prefix "$prefix" --no-prebuild >/dev/null
    if [ "$extension" = --extension ]; then
        CARGO_TARGET_DIR="$target" "$repo/lab/build.sh" "$prefix/share/jupyter/labextensions"
    fi
    export JUPYTER_PATH="$prefix/share/jupyter"
    export GPUMEM_NB_DEVICE=sim:8GiB
    export SE_OFFLINE=true
    unset EVCXR_TMPDIR
}
