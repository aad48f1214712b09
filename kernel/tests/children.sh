#!/usr/bin/env bash
# A cell starts a worker process on the simulated device (`gpumem-demo hold`): its report lists
# the worker by pid and name with its bytes, apart from the notebook's own numbers
# (kernel/tests/children_check.py says what is checked).
#   kernel/tests/children.sh [release|debug]
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
profile="${1:-release}"
target="${CARGO_TARGET_DIR:-$repo/target}"
flag=(); [ "$profile" = release ] && flag=(--release)
cargo build --quiet "${flag[@]}" -p gpumem-kernel
cargo build --quiet "${flag[@]}" -p gpumem-nb --bin gpumem-demo
venv="$target/tour-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import nbclient, nbformat, jupyter_client' 2>/dev/null; then
    python3 -m venv --clear "$venv"
    "$venv/bin/pip" install --quiet jupyter_client nbclient nbformat
fi
unset EVCXR_TMPDIR
exec timeout 900 "$venv/bin/python" "$repo/kernel/tests/children_check.py" "$target/$profile/gpumem-kernel" "$target/$profile/gpumem-demo"
