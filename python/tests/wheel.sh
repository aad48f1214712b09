#!/usr/bin/env bash
# The gpumem-kernel wheel as a user gets it: installed into a fresh virtualenv with JupyterLab,
# used from an empty environment (HOME and PATH only: no activated virtualenv, no CARGO_TARGET_DIR,
# PATH without the virtualenv's bin), and timed from `pip install` to the first cell's report.
#   python/tests/wheel.sh [WHEEL]      (default: the newest ${CARGO_TARGET_DIR:-target}/wheels/gpumem_kernel-*.whl;
#                                       scripts/wheel.sh builds it)
# Checks: the kernelspec gpumem in the virtualenv's share/jupyter (what `jupyter kernelspec list`
# says), the JupyterLab extension gpumem-lab enabled (`jupyter labextension list`), both served by
# a running JupyterLab (its /api/kernelspecs, what the launcher shows, and its page's federated
# extensions), `gpumem-kernel` on the virtualenv's PATH and `python -m gpumem_kernel`, and a
# two-cell notebook (`:dep gpumem-nb`, then a buffer on the simulated device) through nbclient on
# kernel "gpumem" with a per-cell report, gpumem-nb compiled from the wheel's own copy.
# Notebook cells are compiled in a new empty directory (XDG_CACHE_HOME): the first report's time
# includes gpumem-nb's compile with its dependencies (crates.io's downloads are cargo's own cache,
# ~/.cargo/registry, as on any machine that has built Rust before); GPUMEM_WHEEL_CELL_CACHE=DIR keeps
# them in DIR instead (CI). PYTHON picks the interpreter of the virtualenv (default python3).
# Needs Python 3 with venv, PyPI (jupyterlab 4.6.6, nbclient), a Rust toolchain (cargo) and curl.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
wheel="${1:-$(ls -t "$target"/wheels/gpumem_kernel-*.whl 2>/dev/null | head -1)}"
[ -f "$wheel" ] || { echo "no wheel (build one with scripts/wheel.sh)"; exit 1; }
wheel="$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"
cargo_bin="$(dirname "$(command -v cargo)")"
python="${PYTHON:-python3}"
tmp="$(mktemp -d /tmp/gpumem-wheel-XXXXXX)"
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT
venv="$tmp/venv"
home="$HOME"
# What the user's shell has: HOME and a PATH with the system's Python and cargo, nothing else.
user_env=(env -i HOME="$home" PATH="/usr/bin:/bin:$cargo_bin")
fail() { echo "FAIL: $*"; exit 1; }
step() { printf '\n==> %s\n' "$*"; }

echo "wheel: $wheel"
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

step "a fresh virtualenv; pip install the wheel, jupyterlab==4.6.6, nbclient"
"$python" -m venv "$venv"
t0=$(date +%s.%N)
"${user_env[@]}" "$venv/bin/pip" install --quiet --disable-pip-version-check "$wheel" jupyterlab==4.6.6 nbclient
t_pip=$(date +%s.%N)
awk -v a="$t0" -v b="$t_pip" 'BEGIN { printf "pip install: %.1f s\n", b - a }'

step "gpumem-kernel on the virtualenv's PATH, and python -m gpumem_kernel"
"${user_env[@]}" "$venv/bin/gpumem-kernel" --version
[ "$("${user_env[@]}" "$venv/bin/python" -m gpumem_kernel --version)" = "$("${user_env[@]}" "$venv/bin/gpumem-kernel" --version)" ] \
    || fail "python -m gpumem_kernel --version differs from gpumem-kernel --version"
"${user_env[@]}" "$venv/bin/gpumem-kernel" --help | head -3

step "the kernelspec gpumem, no post-install step"
"${user_env[@]}" "$venv/bin/jupyter" kernelspec list
spec_dir=$("${user_env[@]}" "$venv/bin/jupyter" kernelspec list --json \
    | "$venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["kernelspecs"]["gpumem"]["resource_dir"])') \
    || fail "jupyter kernelspec list has no gpumem"
[ "$(realpath "$spec_dir")" = "$(realpath "$venv/share/jupyter/kernels/gpumem")" ] \
    || fail "the kernelspec gpumem is $spec_dir, not the virtualenv's $venv/share/jupyter/kernels/gpumem"
for f in kernel.json logo-32x32.png logo-64x64.png; do [ -f "$spec_dir/$f" ] || fail "no $f in $spec_dir"; done
cat "$spec_dir/kernel.json"

step "gpumem-nb's source beside the kernel"
crate_dir=$(ls -d "$venv"/share/gpumem-kernel/crates/gpumem-nb-*)
[ -f "$crate_dir/Cargo.toml" ] && [ -f "$crate_dir/src/lib.rs" ] || fail "no gpumem-nb source at $crate_dir"
echo "$crate_dir"

step "the JupyterLab extension gpumem-lab"
"$venv/bin/python" -c 'import sys, zipfile; sys.exit(not any(n.endswith(".data/data/share/jupyter/labextensions/gpumem-lab/package.json") for n in zipfile.ZipFile(sys.argv[1]).namelist()))' "$wheel" \
    || fail "the wheel has no share/jupyter/labextensions/gpumem-lab"
"${user_env[@]}" "$venv/bin/jupyter" labextension list 2>&1 | tee "$tmp/labext.txt"
grep -E "gpumem-lab .*enabled.*OK.*\(python, gpumem-kernel\)" "$tmp/labext.txt" >/dev/null \
    || fail "jupyter labextension list does not show gpumem-lab enabled, OK, from the Python package gpumem-kernel"

step "a JupyterLab server: the launcher's kernelspecs and the page's extensions"
port=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$tmp/lab-root"
"${user_env[@]}" JUPYTER_RUNTIME_DIR="$tmp/runtime" "$venv/bin/jupyter" lab --no-browser --ip=127.0.0.1 --port="$port" \
    --IdentityProvider.token=wheeltest --ServerApp.root_dir="$tmp/lab-root" --allow-root > "$tmp/lab.log" 2>&1 &
server_pid=$!
for _ in $(seq 60); do
    curl -sf "http://127.0.0.1:$port/api/status?token=wheeltest" >/dev/null && break
    kill -0 "$server_pid" 2>/dev/null || { tail -20 "$tmp/lab.log"; fail "JupyterLab exited"; }
    sleep 1
done
curl -sf "http://127.0.0.1:$port/api/kernelspecs?token=wheeltest" > "$tmp/specs.json" || { tail -20 "$tmp/lab.log"; fail "JupyterLab did not answer"; }
curl -sf "http://127.0.0.1:$port/lab?token=wheeltest" > "$tmp/lab.html"
"$venv/bin/python" - "$tmp/specs.json" "$tmp/lab.html" <<'PY'
import html, json, re, sys
specs = json.load(open(sys.argv[1]))["kernelspecs"]
assert "gpumem" in specs, sorted(specs)
s = specs["gpumem"]
assert s["spec"]["display_name"] == "Rust (gpumem)", s
assert "logo-64x64" in s["resources"], s["resources"]
print(f"launcher: {s['spec']['display_name']!r} (kernelspecs: {', '.join(sorted(specs))})")
page = open(sys.argv[2]).read()
m = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page, re.S)
config = json.loads(html.unescape(m.group(1)) if "&quot;" in m.group(1) else m.group(1))
exts = [e["name"] for e in config.get("federated_extensions", [])]
print(f"page's prebuilt extensions: {', '.join(exts)}")
assert "gpumem-lab" in exts, exts
PY
kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""

# The claim's measure starts notebook cells from nothing (a new XDG_CACHE_HOME): gpumem-nb and its
# dependencies compiled, as on a machine that never ran the kernel. GPUMEM_WHEEL_CELL_CACHE=DIR
# uses DIR as XDG_CACHE_HOME instead, kept between runs (CI: the dependencies built once; DIR
# outside any cargo workspace, or the kernel falls back to a private directory). Not the user's
# own ~/.cache: its build would switch between the checkout's gpumem-nb and the wheel's.
if [ -n "${GPUMEM_WHEEL_CELL_CACHE:-}" ]; then
    cache="$GPUMEM_WHEEL_CELL_CACHE"
    what="cells compiled in $cache/gpumem-kernel/evcxr, kept between runs"
else
    cache="$tmp/cache"
    what="cells compiled in a new empty directory"
fi
step "a two-cell notebook through nbclient on kernel gpumem (sim:8GiB; $what)"
mkdir -p "$cache"
# The kernel's stderr (cargo's progress while it compiles gpumem-nb) goes to a log, shown on failure.
"${user_env[@]}" XDG_CACHE_HOME="$cache" GPUMEM_NB_DEVICE=sim:8GiB GPUMEM_WHEEL_T0="$t0" GPUMEM_WHEEL_T_PIP="$t_pip" \
    "$venv/bin/python" "$repo/python/tests/first_report.py" "$crate_dir" "$cache/gpumem-kernel/evcxr" 2> "$tmp/kernel.log" \
    || { echo "--- the kernel's stderr (last 40 lines):"; tail -40 "$tmp/kernel.log"; fail "the notebook through nbclient"; }
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
echo "OK: the wheel installs and runs (pip install to first report: see above)"
