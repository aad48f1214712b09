#!/usr/bin/env python3
"""The allocator benchmarks of the GPU bundle, median of its runs, side by side.

    python3 scripts/gpu/bench_median.py OUT

Reads what `bash scripts/gpu/run.sh bench` wrote in OUT for each run N:
  torch_driver_bench_runN.jsonl  PyTorch's C++ caching allocator and the CUDA driver
                                 (scripts/gpu/alloc_bench.cpp: 200,000 pairs x 7 repeats, median)
  gpumem_pairs_runN.jsonl        gpumem-nb timed the same way in the same run
                                 (examples/alloc_pairs.rs: same sizes, seed, pairs and repeats)
  gpumem_bench_runN.txt          gpumem-nb's criterion benchmark (benches/alloc.rs)
and prints, per workload, the median over the runs of each figure (ns per alloc+free pair), and
PyTorch's median divided by gpumem-nb's (like-for-like, and criterion). Every run's figures are
listed too, so the spread is visible. Writes the table as JSON to OUT/bench_median.json.
"""
import glob
import json
import os
import re
import statistics
import sys


def jsonl(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            d = json.loads(line)
            out[(d["impl"], d["workload"])] = d["ns_per_pair"]
    return out


def criterion(path):
    """criterion's `name time: [lo mid hi]` lines (the name may stand on the line before)."""
    out, name = {}, None
    unit = {"ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6}
    for line in open(path):
        m = re.match(r"^(\S+)\s*(time:\s*\[(.*)\])?", line)
        if m and not line.startswith(" "):
            name = m.group(1)
        t = re.search(r"time:\s*\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", line)
        if t and name:
            out[name] = float(t.group(1)) * unit[t.group(2)]
    return out


def main():
    out_dir = sys.argv[1]
    runs = sorted(int(re.search(r"run(\d+)", p).group(1)) for p in glob.glob(os.path.join(out_dir, "torch_driver_bench_run*.jsonl")))
    if not runs:
        sys.exit(f"no torch_driver_bench_runN.jsonl in {out_dir}")
    torch = [jsonl(os.path.join(out_dir, f"torch_driver_bench_run{r}.jsonl")) for r in runs]
    pairs = [jsonl(p) if os.path.exists(p) else {} for p in (os.path.join(out_dir, f"gpumem_pairs_run{r}.jsonl") for r in runs)]
    crit = [criterion(p) if os.path.exists(p) else {} for p in (os.path.join(out_dir, f"gpumem_bench_run{r}.txt") for r in runs)]
    workloads = ["hot/512", "hot/1048576", "hot/67108864", "mixed_1000_live"]
    crit_name = {"hot/512": "hot/allocator/512", "hot/1048576": "hot/allocator/1048576",
                 "hot/67108864": "hot/allocator/67108864", "mixed_1000_live": "mixed_1000_live/allocator"}
    med = lambda xs: statistics.median(xs) if xs else None
    rows = []
    print(f"{len(runs)} runs; ns per alloc+free pair, median of the runs (each run: median of its repeats)")
    print(f"{'workload':18s} {'PyTorch C++':>12s} {'gpumem-nb':>10s} {'ratio':>6s} {'criterion':>10s} {'ratio':>6s}   per run (PyTorch / gpumem-nb / criterion)")
    for w in workloads:
        t = [x[("pytorch_c10", w)] for x in torch if ("pytorch_c10", w) in x]
        g = [x[("gpumem_nb", w)] for x in pairs if ("gpumem_nb", w) in x]
        c = [x[crit_name[w]] for x in crit if crit_name[w] in x]
        mt, mg, mc = med(t), med(g), med(c)
        ratio = lambda a, b: round(a / b, 2) if a and b else None
        row = {"workload": w, "pytorch_ns": mt, "gpumem_ns": mg, "ratio": ratio(mt, mg), "criterion_ns": mc,
               "criterion_ratio": ratio(mt, mc), "runs": {"pytorch": t, "gpumem": g, "criterion": c}}
        rows.append(row)
        fmt = lambda v: f"{v:,.0f}" if v else "-"
        per = "; ".join(f"{fmt(a)}/{fmt(b)}/{fmt(d)}" for a, b, d in zip(t, g + [None] * 9, c + [None] * 9))
        print(f"{w:18s} {fmt(mt):>12s} {fmt(mg):>10s} {str(row['ratio'] or '-'):>6s} {fmt(mc):>10s} "
              f"{str(row['criterion_ratio'] or '-'):>6s}   {per}")
    # The interleaved mixed pair: per alternation PyTorch's repeat ÷ gpumem-nb's, the median of each
    # run's ratios, and the median of the three runs (the issue's "in the same run, median of
    # three runs"); each side's own figures too.
    inter = {}
    for r in runs:
        tp = os.path.join(out_dir, f"mixed_interleaved_torch_run{r}.jsonl")
        gp = os.path.join(out_dir, f"mixed_interleaved_gpumem_run{r}.jsonl")
        if not (os.path.exists(tp) and os.path.exists(gp)):
            continue
        lines = lambda p: [json.loads(l)["ns_per_pair"] for l in open(p) if l.startswith("{")]
        t, g = lines(tp), lines(gp)
        inter[r] = {"pytorch": t, "gpumem": g, "ratios": [round(a / b, 3) for a, b in zip(t, g)]}
    if inter:
        run_ratios = [statistics.median(v["ratios"]) for v in inter.values()]
        print()
        print("mixed_1000_live interleaved (each alternation: one PyTorch repeat, then one gpumem-nb repeat, "
              "200,000 pairs each, separate processes)")
        for r, v in inter.items():
            print(f"  run {r}: PyTorch {', '.join(f'{x:,.0f}' for x in v['pytorch'])} ns; gpumem-nb "
                  f"{', '.join(f'{x:,.0f}' for x in v['gpumem'])} ns; ratios {', '.join(f'{x:.2f}' for x in v['ratios'])}; "
                  f"median {statistics.median(v['ratios']):.2f}")
        print(f"  median of the runs' ratios: {statistics.median(run_ratios):.2f}")
        rows.append({"workload": "mixed_1000_live interleaved", "runs": inter,
                     "run_ratios": run_ratios, "ratio": statistics.median(run_ratios)})
    json.dump(rows, open(os.path.join(out_dir, "bench_median.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
