#!/usr/bin/env bash
# Runs notebooks/tour.ipynb through jupyter_client/nbclient against the gpumem kernel.
#   kernel/tests/run_tour.sh [release|debug]
# Needs network access once (pip). The virtualenv lives under the target directory; evcxr builds
# cells in the kernel's own directory (~/.cache/gpumem-kernel/evcxr), so reruns are fast.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
profile="${1:-release}"
target="${CARGO_TARGET_DIR:-$repo/target}"
if [ "$profile" = release ]; then cargo build --release -p gpumem-kernel; else cargo build -p gpumem-kernel; fi
venv="$target/tour-venv"
# A virtualenv left half-made (an interrupted install, a Python since removed) is made again.
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import nbclient, nbformat, jupyter_client' 2>/dev/null; then
  python3 -m venv --clear "$venv"
  "$venv/bin/pip" install --quiet jupyter_client nbclient nbformat
fi
exec timeout 1800 "$venv/bin/python" "$repo/kernel/tests/tour_nbclient.py" "$target/$profile/gpumem-kernel" "$target/tour-out"
