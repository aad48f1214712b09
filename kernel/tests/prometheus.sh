#!/usr/bin/env bash
# A real Prometheus scrapes the gpumem kernel's metrics endpoint while a small notebook runs
# through jupyter_client/nbclient on the simulated device; the values read back through
# Prometheus's HTTP API must equal the cells' own records (kernel/tests/prometheus_check.py says
# what is checked). Installs Debian's prometheus when missing (as root, through apt-get).
#   kernel/tests/prometheus.sh [release|debug]
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
profile="${1:-release}"
target="${CARGO_TARGET_DIR:-$repo/target}"
if [ "$profile" = release ]; then cargo build --quiet --release -p gpumem-kernel; else cargo build --quiet -p gpumem-kernel; fi

# shellcheck source=scripts/prometheus_env.sh
. "$repo/scripts/prometheus_env.sh"
need_prometheus

venv="$target/tour-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import nbclient, nbformat, jupyter_client' 2>/dev/null; then
    python3 -m venv --clear "$venv"
    "$venv/bin/pip" install --quiet jupyter_client nbclient nbformat
fi
unset EVCXR_TMPDIR
exec timeout 900 "$venv/bin/python" "$repo/kernel/tests/prometheus_check.py" "$target/$profile/gpumem-kernel" "$target/prometheus-test"
