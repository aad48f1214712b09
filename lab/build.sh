#!/usr/bin/env bash
# Builds the JupyterLab extension gpumem-lab (this folder) with JupyterLab's own builder, against
# the core of the JupyterLab it is for (4.6.6), and copies the prebuilt extension (package.json
# and static/) to OUTDIR/gpumem-lab, ready for <prefix>/share/jupyter/labextensions/.
#   lab/build.sh OUTDIR
# Builds in ${CARGO_TARGET_DIR:-target}/lab-build (node_modules lives there, never in the clone);
# `npm ci` runs only when package-lock.json changed. JupyterLab comes from the virtualenv
# ${CARGO_TARGET_DIR:-target}/lab-venv (kernel/tests/lab_browser.sh's; made here when missing).
# Needs Node.js 20+ and npm, and the npm registry for the first `npm ci`.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: lab/build.sh OUTDIR" >&2
    exit 2
fi
mkdir -p "$1"
out="$(cd "$1" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
build="$target/lab-build"
venv="$target/lab-venv"

command -v node >/dev/null && command -v npm >/dev/null || { echo "lab/build.sh: needs Node.js and npm" >&2; exit 1; }

# The same virtualenv, with the same pins, as the browser tests.
. "$repo/scripts/lab_env.sh"
lab_venv "$venv"

# The sources, fresh (a file removed here is removed there); node_modules and the stamp stay.
mkdir -p "$build"
rm -rf "$build/src" "$build/style" "$build/lib" "$build/gpumem-lab" "$build/tsconfig.tsbuildinfo"
cp -r "$here/src" "$here/style" "$here/package.json" "$here/package-lock.json" "$here/tsconfig.json" "$build/"
stamp="$build/node_modules/.gpumem-lock.sha256"
lock_sum="$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$lock_sum" ]; then
    (cd "$build" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$lock_sum" > "$stamp"
fi

core="$("$venv/bin/python" -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')"
(
    cd "$build"
    export PATH="$venv/bin:$PATH"
    node_modules/.bin/tsc
    # The core's own package.json (its shared packages and their versions): no download of
    # core metadata, and the extension shares exactly what this JupyterLab provides.
    jupyter labextension build --core-path "$core" . > "$build/build.log" 2>&1 || { cat "$build/build.log" >&2; exit 1; }
)
test -f "$build/gpumem-lab/package.json" && ls "$build/gpumem-lab/static/"remoteEntry.*.js >/dev/null
rm -rf "$out/gpumem-lab"
cp -r "$build/gpumem-lab" "$out/gpumem-lab"
echo "gpumem-lab: built into $out/gpumem-lab"
