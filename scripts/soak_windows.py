#!/usr/bin/env python3
"""BENCHMARKS.md's soak table from a soak's samples: per window of cells, the kernel's resident
memory at the window's end, the notebook process's highest, and the hooks' p50 / p99.

    python3 scripts/soak_windows.py TARGET/soak-N/soak.json [WINDOW]      (WINDOW: 500 cells)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak import MIB, pct  # noqa: E402  (the soak's own percentile, so the figures agree)


def main():
    data = json.load(open(sys.argv[1]))
    window = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    # As soak.py: the `:dep` cell and the first cell using the crate are not the steady state;
    # the last sample is the closing `%gpumem history`.
    body = data["samples"][2:-1]
    print("| cells | kernel RSS at the end (MiB) | notebook process, highest (MiB) | hooks p50 (µs) | hooks p99 (µs) | reports | panicked |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for i in range(0, len(body), window):
        w = body[i:i + window]
        hooks = [s["hook_us"] for s in w if s["hook_us"] is not None]
        child = [s["child_rss"] for s in w if s["child_rss"]]
        print(
            f"| {w[0]['index']}–{w[-1]['index']} | {w[-1]['kernel_rss'] / MIB:,.1f} | "
            f"{max(child) / MIB:,.1f} | {pct(hooks, 50)} | {pct(hooks, 99)} | "
            f"{sum(s['reports'] for s in w)} | {sum(1 for s in w if s['status'] == 'panicked')} |"
        )


if __name__ == "__main__":
    main()
