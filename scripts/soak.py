"""A long session through a real Jupyter client: N cells on the simulated device, the kernel's and
the notebook process's memory over time, the hooks' time per cell, one report per cell.

Usage: python3 scripts/soak.py PATH/TO/gpumem-kernel N OUT_DIR [--assert]

The cells cycle through ten kinds: an allocation kept (rebinding `a`), a temporary, a second
buffer, a magic beside code (`%gpumem budget`), a drop, a reading, `%gpumem top` beside code,
another drop, driver memory taken and returned (every 50th: a panic instead), and a plain value
(every 100th: `:restart`, so the next cycle starts in a fresh child). Every 100th cycle position
6 also shows `%gpumem history`. After each cell it samples the resident memory (VmRSS) of the
kernel and of its evcxr child, and takes the record's `hook_us` (the hooks' own time).

Writes OUT_DIR/soak.json (every cell's sample) and prints a summary: RSS at the first 10 %, the
middle and the end; growth; hook time p50/p99 of the first and the last 10 % of cells (at most
500 each); reports per cell. With --assert it fails (exit 1) unless every cell that ran code has
exactly one report, the history (when more cells ran than `GPUMEM_NB_HISTORY_CELLS` keeps) says
how many earlier cells it no longer keeps, and the kernel's RSS grew by less than 64 MiB from the end of the first 10 % of
cells to the end. The hook times are shown, not checked: they are wall time, and what else runs
on the machine moves them (the test command from cold, with Miri and the fuzz targets building
beside it: median 1,229 µs in the first window, 3,006 µs in the last, 2026-11-29; the p99 of a
100-cell run's nine-cell windows is one cell, one scheduling hiccup). Whether they grow with the
session is measured by long runs on a quiet machine (BENCHMARKS.md, the 5,000-cell soak).
"""

import json
import os
import statistics
import sys
import time

CELL_MIME = "application/vnd.gpumem.cell+json"
MIB = 1 << 20


def rss(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def children(pid):
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                out += [int(c) for c in open(f"/proc/{pid}/task/{task}/children").read().split()]
            except OSError:
                pass
    except OSError:
        pass
    if out:
        return out
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def cell_code(i):
    k = i % 10
    m = 1 + (i * 7) % 13
    if k == 0:
        return (
            "use gpumem_nb::{DeviceBuffer, StreamId};\nlet alloc = gpumem_nb::current()?;\n"
            f"let a = DeviceBuffer::<u8>::zeros(&alloc, {m} << 20, StreamId::DEFAULT)?;\na.num_bytes()"
        )
    if k == 1:
        return f"{{ let t = DeviceBuffer::<u8>::zeros(&alloc, {2 * m} << 20, StreamId::DEFAULT)?; t.num_bytes() }}"
    if k == 2:
        return f"let b = DeviceBuffer::<f32>::zeros(&alloc, {m} << 18, StreamId::DEFAULT)?;"
    if k == 3:
        return "%gpumem budget 4GiB\nlet c = vec![0u8; 4096];\nc.len()"
    if k == 4:
        return "drop(a);"
    if k == 5:
        return "alloc.memory_allocated()"
    if k == 6:
        extra = "%gpumem history\n" if i % 100 == 6 else ""
        return extra + "%gpumem top 3\nalloc.memory_reserved()"
    if k == 7:
        return "drop(b);"
    if k == 8:
        if i % 50 == 8:
            return f'panic!("soak cell {i}: on purpose");'
        return "let d = gpumem_nb::mem::driver_alloc_mib(2)?;\ndrop(d);"
    if i % 100 == 99:
        return ":restart\n42u32"
    return f"{i}u64 * 2"


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else None


def main():
    # Here, not at the top: scripts/soak_windows.py imports this module's helpers without them.
    import nbformat
    from nbclient import NotebookClient

    kernel_bin, n, out = os.path.abspath(sys.argv[1]), int(sys.argv[2]), os.path.abspath(sys.argv[3])
    check = "--assert" in sys.argv
    os.makedirs(out, exist_ok=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(":dep gpumem-nb")] + [nbformat.v4.new_code_cell(cell_code(i)) for i in range(n)]
    # Last, the history: what is kept, and the summary of what is not.
    nb.cells.append(nbformat.v4.new_code_cell("%gpumem history"))
    client = NotebookClient(nb, kernel_name="gpumem", timeout=600, startup_timeout=300, allow_errors=True)
    samples = []
    t0 = time.time()
    with client.setup_kernel():
        kpid = client.km.provisioner.process.pid
        for i, cell in enumerate(nb.cells):
            t = time.time()
            client.execute_cell(cell, i)
            recs = [o.data[CELL_MIME] for o in cell.outputs if o.output_type == "display_data" and CELL_MIME in o.data]
            errors = [o.ename for o in cell.outputs if o.output_type == "error"]
            kids = children(kpid)
            samples.append(
                {
                    "index": i,
                    "t": round(time.time() - t0, 3),
                    "cell_s": round(time.time() - t, 3),
                    "reports": len(recs),
                    "runs_code": any(
                        l.strip() and not l.strip().startswith(("%gpumem", "//")) for l in cell.source.splitlines()
                    ),
                    "status": recs[0]["status"] if recs else None,
                    "hook_us": recs[0]["hook_us"] if recs else None,
                    "errors": errors,
                    "kernel_rss": rss(kpid),
                    "child_rss": sum(rss(c) or 0 for c in kids) or None,
                }
            )
            if i % 50 == 0:
                s = samples[-1]
                print(
                    f"cell {i}/{n}: {s['t']:.0f} s, kernel {(s['kernel_rss'] or 0) / MIB:.1f} MiB, "
                    f"child {(s['child_rss'] or 0) / MIB:.1f} MiB, hooks {s['hook_us']} us",
                    flush=True,
                )
    total = time.time() - t0
    json.dump({"cells": n, "seconds": total, "samples": samples}, open(os.path.join(out, "soak.json"), "w"), indent=0)

    history = "".join(o.data.get("text/plain", "") for o in nb.cells[-1].outputs if o.output_type == "display_data")
    keep = int(os.environ.get("GPUMEM_NB_HISTORY_CELLS") or 2_000)  # the kernel's retention::DEFAULT_KEEP
    samples.pop()
    # Not the steady state: the `:dep` cell (it builds the crate) and the first cell using the
    # crate (it loads in the child and connects to the kernel).
    body = samples[2:]
    tenth = max(1, len(body) // 10)
    window = min(500, tenth)
    first, last = body[:window], body[-window:]
    hooks = lambda xs: [s["hook_us"] for s in xs if s["hook_us"] is not None]
    p = lambda xs, q: pct(hooks(xs), q)
    mib = lambda v: None if v is None else round(v / MIB, 1)
    base_k, end_k = body[tenth - 1]["kernel_rss"], body[-1]["kernel_rss"]
    child = [s["child_rss"] for s in body if s["child_rss"]]
    bad_reports = [s["index"] for s in body if s["runs_code"] and s["reports"] != 1]
    statuses = {}
    for s in body:
        statuses[s["status"]] = statuses.get(s["status"], 0) + 1
    summary = {
        "cells": n,
        "seconds": round(total, 1),
        "cells_per_s": round(n / total, 2),
        "statuses": statuses,
        "cells_without_exactly_one_report": bad_reports,
        "history_kept": keep,
        "history_caption_dropped": next((l.strip() for l in history.splitlines() if "not kept" in l), None),
        "kernel_rss_mib": {"after_first_10pct": mib(base_k), "middle": mib(body[len(body) // 2]["kernel_rss"]), "end": mib(end_k), "max": mib(max(s["kernel_rss"] for s in body))},
        "kernel_rss_growth_mib": mib(end_k - base_k),
        "child_rss_mib": {"first": mib(child[0]) if child else None, "max": mib(max(child)) if child else None, "end": mib(child[-1]) if child else None},
        "hook_us": {
            "first_window": window,
            "first_p50": p(first, 50),
            "first_p99": p(first, 99),
            "last_p50": p(last, 50),
            "last_p99": p(last, 99),
        },
    }
    json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
    print(json.dumps(summary, indent=1))
    if check:
        fails = []
        if bad_reports:
            fails.append(f"cells without exactly one report: {bad_reports[:20]}")
        if end_k - base_k >= 64 * MIB:
            fails.append(f"kernel RSS grew {mib(end_k - base_k)} MiB")
        if n + 1 > keep and "earlier cells not kept" not in history:
            fails.append(f"the history does not summarise the cells it dropped: {history[-500:]!r}")
        if statuses.get("panicked", 0) < n // 50:
            fails.append(f"fewer panics than cells asked for: {statuses}")
        for f in fails:
            print("FAIL:", f)
        if fails:
            sys.exit(1)
        print("OK: one report per cell, the history summarised, kernel RSS bounded")


if __name__ == "__main__":
    main()
