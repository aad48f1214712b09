#!/usr/bin/env python3
"""Reads scripts/gpu/alloc_bench.sh's runs of notebooks/gpu_bench_candle_alloc.ipynb and writes
the table: per tensor made and dropped (the medians of each run's five rounds, as the cell
printed them), and the kept-tensors cell's wall time and hook time from its record, tracked
(CUPTI, stacks on) against GPUMEM_NB_TRACK=off, with the overhead per allocation.

    alloc_bench.py DIR     (DIR holds roundN-on.ipynb and roundN-off.ipynb)

Writes DIR/runs.jsonl and DIR/summary.md; exits 1 when a run is missing its figures or a run's
tracking is not what it was run with (a tracked run whose records do not say `cupti`, an
untracked one whose records do)."""

import glob
import json
import os
import re
import statistics
import sys

from check_notebook import text_of

RECORD = "application/vnd.gpumem.cell+json"


def read_run(path):
    nb = json.load(open(path))
    run = {"file": os.path.basename(path), "mode": "off" if path.endswith("-off.ipynb") else "on"}
    tracking = set()
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = text_of(cell["source"])
        record = None
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                for line in text_of(o.get("text")).splitlines():
                    m = re.match(r"ALLOC_BENCH (make|drop) ([\d ]+)$", line.strip())
                    if m:
                        run[m.group(1) + "_ns"] = [int(x) for x in m.group(2).split()]
            record = o.get("data", {}).get(RECORD, record)
        if record:
            a = record.get("all_allocations") or {}
            tracking.add(a.get("tracking") or "none")
            if src.startswith("let kept"):
                run["kept_cell_wall_ms"] = record.get("wall_ms")
                run["kept_cell_hook_us"] = record.get("hook_us")
                run["kept_cell_tracked_change"] = (a.get("after") or 0) - (a.get("before") or 0)
    run["tracking"] = sorted(tracking)
    return run


def main():
    d = sys.argv[1]
    runs = [read_run(p) for p in sorted(glob.glob(os.path.join(d, "round*-o*.ipynb")))]
    problems = []
    for r in runs:
        for k in ("make_ns", "drop_ns", "kept_cell_wall_ms"):
            if r.get(k) is None:
                problems.append(f"{r['file']}: no {k}")
        tracked = "cupti" in r["tracking"]
        if tracked != (r["mode"] == "on"):
            problems.append(f"{r['file']}: run with tracking {r['mode']}, its records say {r['tracking']}")
    with open(os.path.join(d, "runs.jsonl"), "w") as f:
        for r in runs:
            f.write(json.dumps(r) + "\n")

    def med(mode, key):
        vals = [statistics.median(r[key]) if isinstance(r.get(key), list) else r.get(key)
                for r in runs if r["mode"] == mode and r.get(key) is not None]
        return (statistics.median(vals), vals) if vals else (None, [])

    lines = ["| figure | tracked (CUPTI, 32 frames) | GPUMEM_NB_TRACK=off | tracked − off |", "|---|---:|---:|---:|"]
    for key, label, unit in (("make_ns", "a tensor made (`Tensor::zeros(256)`)", "ns"),
                             ("drop_ns", "a tensor dropped", "ns"),
                             ("kept_cell_wall_ms", "the cell that keeps 10,000 tensors, wall", "ms"),
                             ("kept_cell_hook_us", "its report's hooks", "µs")):
        on, on_all = med("on", key)
        off, off_all = med("off", key)
        if on is None or off is None:
            continue
        lines.append(f"| {label} | {on:,.0f} {unit} ({', '.join(f'{v:,.0f}' for v in on_all)}) "
                     f"| {off:,.0f} {unit} ({', '.join(f'{v:,.0f}' for v in off_all)}) | **{on - off:+,.0f} {unit}** |")
    lines.append("")
    lines.append(f"{len(runs)} runs, medians of runs (each run's figure: the median of its five rounds "
                 "of 10,000); per run in parentheses.")
    for p in problems:
        lines.append(f"PROBLEM: {p}")
    out = "\n".join(lines) + "\n"
    open(os.path.join(d, "summary.md"), "w").write(out)
    print(out)
    return 1 if problems or not runs else 0


if __name__ == "__main__":
    sys.exit(main())
