#!/usr/bin/env bash
# The README's main command, checked: `gpumem-kernel run notebooks/tour.ipynb --html …`, then the
# page in headless Chromium with networking off: every cell's report and the charts are there
# offline, and a screenshot is saved (target/tour-html/tour.png) for a person to look at.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
out="$target/tour-html"
mkdir -p "$out"
cargo run --quiet --release -p gpumem-kernel -- run "$repo/notebooks/tour.ipynb" --output "$out/tour.ipynb" --html "$out/tour.html"
chrome="${CHROMIUM:-/usr/bin/chromium}"
flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
       --disable-component-update --disable-sync --host-resolver-rules="MAP * ~NOTFOUND" --proxy-server=127.0.0.1:9)
profile=$(mktemp -d)
"$chrome" "${flags[@]}" --user-data-dir="$profile" --dump-dom "file://$out/tour.html" > "$out/dom.html" 2>/dev/null
"$chrome" "${flags[@]}" --user-data-dir="$profile" --window-size=1200,3000 --screenshot="$out/tour.png" "file://$out/tour.html" >/dev/null 2>&1
rm -rf "$profile"
python3 - "$out/tour.ipynb" "$out/dom.html" <<'PY'
import json, sys
nb = json.load(open(sys.argv[1]))
dom = open(sys.argv[2]).read()
code = [c for c in nb["cells"] if c["cell_type"] == "code"]
reports = sum(1 for c in code for o in c.get("outputs", []) if "application/vnd.gpumem.cell+json" in o.get("data", {}))
errors = [c for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
assert not errors, f"{len(errors)} cells failed"
assert reports >= 10, f"only {reports} per-cell reports"
assert dom.count('class="gpumem-report"') == reports, (dom.count('class="gpumem-report"'), reports)
assert dom.count("<svg") >= 2, "charts missing from the rendered page"
assert "Peak memory per cell" in dom, "the %gpumem plot chart is missing"
print(f"OK: {len(code)} code cells, {reports} reports rendered, {dom.count('<svg')} SVG charts, screenshot {sys.argv[1].rsplit('/', 1)[0]}/tour.png")
PY
