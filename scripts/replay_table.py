#!/usr/bin/env python3
"""BENCHMARKS.md's replay table: every shipped and recorded trace through gpumem-replay.

    cargo build --release --bin gpumem-replay
    python3 scripts/replay_table.py target/release/gpumem-replay OUTDIR

For each trace (tests/fixtures/traces/*.trace.tsv.gz and tests/fixtures/traces/recorded/*/),
four runs of gpumem-replay: the exact replay under PyTorch's default policy, the sequence
replay under expandable segments, and the sequence replay under compact:True (with its
snapshot, to count page maps and unmaps by thirds of the trace's allocations) and under
compact:True,compact_slack_bp:0. Writes
OUTDIR/replay.jsonl (the runs' headline fields) and OUTDIR/table.md (the table), and prints
the table. PyTorch's own figures come from the sidecars (<name>.json; <name>_expandable.json
where PyTorch was also run with expandable segments).
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

MIB = 1 << 20
KEEP = ["trace", "alloc_conf", "replay", "device", "events", "requested_peak", "allocated_peak",
        "reserved_peak", "pytorch_reserved_peak", "reserved_ratio", "num_device_alloc",
        "num_device_free", "divergences", "failed_allocs"]


def run(binary, trace, *args):
    out = subprocess.run([binary, trace, "--json", *args], check=True, capture_output=True, text=True)
    got = json.loads(out.stdout)
    return {k: got.get(k) for k in KEEP}


def by_thirds(binary, trace):
    """Map calls / unmapped ranges of compact:True in each third of the trace's allocations."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([binary, trace, "--alloc-conf", "compact:True", "--snapshot", tmp], check=True,
                       capture_output=True)
        with open(os.path.join(tmp, "snapshot.json")) as f:
            events = json.load(f)["device_traces"][0]
    allocs = [i for i, e in enumerate(events) if e["action"] == "alloc"]
    n = len(allocs)
    cuts = [0, allocs[n // 3], allocs[2 * n // 3], len(events)]
    out = []
    for a, b in zip(cuts, cuts[1:]):
        part = [e["action"] for e in events[a:b]]
        out.append(f"{part.count('segment_map')}/{part.count('segment_unmap')}")
    return ", ".join(out)


def sidecar(trace, suffix):
    path = trace.replace(".trace.tsv.gz", suffix)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)["stats"]


def main():
    binary, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    traces = sorted(glob.glob("tests/fixtures/traces/*.trace.tsv.gz"))
    traces += sorted(glob.glob("tests/fixtures/traces/recorded/*/*.trace.tsv.gz"))
    rows, runs = [], []
    for t in traces:
        exact = run(binary, t)
        expandable = run(binary, t, "--sequence", "--alloc-conf", "expandable_segments:True")
        compact = run(binary, t, "--alloc-conf", "compact:True")
        tight = run(binary, t, "--alloc-conf", "compact:True,compact_slack_bp:0")
        runs += [exact, expandable, compact, tight]
        torch = sidecar(t, ".json")
        torch_exp = sidecar(t, "_expandable.json")
        req = compact["requested_peak"]
        assert req == torch["requested_bytes.all.peak"] == exact["requested_peak"], t

        def cell(b, mark=""):
            return f"{b / MIB:,.1f} ({100 * (b / req - 1):+.1f} %){mark}"

        exp = (cell(torch_exp["reserved_bytes.all.peak"], " †") if torch_exp
               else cell(expandable["reserved_peak"], " ‡"))
        name = t.replace("tests/fixtures/traces/", "").replace(".trace.tsv.gz", "")
        rows.append(
            f"| {name} | {req / MIB:,.1f} | {cell(torch['reserved_bytes.all.peak'], ' †')} | {exp} "
            f"| {cell(exact['reserved_peak'])}{'' if exact['divergences'] == 0 else ' (diverged)'} "
            f"| **{cell(compact['reserved_peak'])}** | {compact['reserved_ratio']:.3f} "
            f"| {compact['num_device_alloc']} / {compact['num_device_free']} | {by_thirds(binary, t)} "
            f"| {cell(tight['reserved_peak'])} | {tight['num_device_alloc']} / {tight['num_device_free']} |")
    head = ("| trace | requested peak (MiB) | PyTorch default | PyTorch expandable | gpumem default "
            "| gpumem compact | compact ÷ PyTorch | compact maps / unmaps | by thirds "
            "| compact, slack 0 | slack 0: maps / unmaps |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    table = head + "\n" + "\n".join(rows) + "\n"
    with open(os.path.join(outdir, "table.md"), "w") as f:
        f.write(table)
    with open(os.path.join(outdir, "replay.jsonl"), "w") as f:
        for r in runs:
            f.write(json.dumps(r) + "\n")
    print(table, end="")


if __name__ == "__main__":
    main()
