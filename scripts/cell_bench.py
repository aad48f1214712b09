"""How long a small cell takes: gpumem-kernel against the stock evcxr kernel, in one run.

Usage (scripts/cell_bench.sh sets it up): python3 scripts/cell_bench.py REPO OUT_JSON [--rounds N] [--no-candle]
    [--tracking-off]

Both kernels are started through jupyter_client as Jupyter starts them (with --tracking-off a
third: gpumem-kernel with GPUMEM_NB_TRACK=off). First plain Rust cells in a notebook with no
`:dep` (gpumem-kernel tracks it from its first cell all the same); then, after the same setup
cell in each (`:dep gpumem-nb`; then `:dep candle-core` for the second part), the same small
cells run interleaved cell by cell (which kernel goes first alternates), each timed from the
execute request to the kernel's idle status (what a notebook user waits). gpumem-kernel also
writes where each cell's time went (GPUMEM_KERNEL_CELL_TIMES): evcxr's phases, the cell crate's
rustc and its link, the session-dependency load, the kernel's hooks.

Prints a markdown table (median and p90 per kernel, per cell and overall, and the breakdown)
and writes every sample to OUT_JSON. Not a test: nothing is asserted.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

from jupyter_client.manager import KernelManager

SMALL = [
    ("let", "let x = 40 + 2;"),
    ("vec", "let v: Vec<u64> = (0..1000).collect();"),
    ("loop", "let mut s = 0u64;\nfor i in &v { s += i; }\ns"),
    ("fn", "fn double(n: u64) -> u64 { n * 2 }"),
    ("call", "double(s)"),
    ("print", 'println!("x = {x}, s = {s}");'),
    ("struct", "struct P { x: f64, y: f64 }\nlet p = P { x: 1.0, y: 2.0 };\np.x + p.y"),
    ("current", "let alloc = gpumem_nb::current()?;"),
    ("buffer", "let buf = gpumem_nb::DeviceBuffer::<f32>::zeros(&alloc, 1 << 20, gpumem_nb::StreamId::DEFAULT)?;"),
    ("allocated", "alloc.memory_allocated()"),
    ("drop", "drop(buf);"),
]
CELL_MIME = "application/vnd.gpumem.cell+json"
CANDLE = [
    ("tensor", "let t = candle_core::Tensor::arange(0f32, 6., &candle_core::Device::Cpu)?;"),
    ("tensor op", "let t2 = (&t * 2.0)?;"),
    ("tensor sum", "t2.sum_all()?.to_scalar::<f32>()?"),
]


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Kernel:
    def __init__(self, label, spec, env):
        self.label = label
        self.km = KernelManager(kernel_name=spec)
        full = {k: v for k, v in os.environ.items() if k not in ("EVCXR_TMPDIR", "EVCXR_BENCH_STOCK_TMPDIR")}
        full.update(env)
        self.km.start_kernel(env=full)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=600)

    def run(self, code, timeout=3600):
        outs = []
        t0 = time.perf_counter()
        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=outs.append)
        dt = (time.perf_counter() - t0) * 1e3
        status = reply["content"]["status"]
        if status != "ok":
            text = reply["content"].get("evalue", "")
            for m in outs:
                if m["msg_type"] in ("stream", "error"):
                    text += m["content"].get("text", "") + m["content"].get("evalue", "")
            raise SystemExit(f"{self.label}: {code!r} failed: {text[:2000]}")
        self.last_cell = next(
            (m["content"]["data"][CELL_MIME]["cell"] for m in outs if m["msg_type"] == "display_data" and CELL_MIME in m["content"]["data"]),
            None,
        )
        return dt

    def stop(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def read_times(path):
    """The kernel's timing lines, grouped per cell: the rustc and link lines before a cell line
    belong to it."""
    cells, pending = {}, {"rustc": 0.0, "link": 0.0, "rustc_runs": 0}
    if not os.path.exists(path):
        return cells
    for line in open(path):
        r = json.loads(line)
        if r["step"] == "rustc":
            pending["rustc"] += r["ms"]
            pending["rustc_runs"] += 1
        elif r["step"] == "link":
            pending["link"] += r["ms"]
        elif r["step"] == "cell":
            phases = dict()
            for name, ms in r["phases"]:
                phases[name] = phases.get(name, 0.0) + ms
            cells[r["cell"]] = dict(r, phases=phases, **pending)
            pending = {"rustc": 0.0, "link": 0.0, "rustc_runs": 0}
    return cells


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-candle", action="store_true")
    ap.add_argument(
        "--tracking-off",
        action="store_true",
        help="a third kernel: gpumem-kernel with GPUMEM_NB_TRACK=off (what tracking from the first cell costs)",
    )
    a = ap.parse_args()
    times_file = os.path.abspath(a.out) + ".gpumem-times.jsonl"
    if os.path.exists(times_file):
        os.remove(times_file)
    sim = {"GPUMEM_NB_DEVICE": "sim:8GiB"}
    ours_env = dict(sim, GPUMEM_KERNEL_CELL_TIMES=times_file)
    if os.environ.get("CELL_OPT"):
        ours_env["GPUMEM_KERNEL_CELL_OPT"] = os.environ["CELL_OPT"]
    ours = Kernel("gpumem-kernel", "gpumem", ours_env)
    stock_env = dict(sim)
    if os.environ.get("EVCXR_BENCH_STOCK_TMPDIR"):
        stock_env["EVCXR_TMPDIR"] = os.environ["EVCXR_BENCH_STOCK_TMPDIR"]
    stock = Kernel("stock evcxr", "rust", stock_env)
    kernels = [ours, stock]
    # The same kernel with every allocation's tracking off: what tracking from the first cell
    # costs a small cell (its times are not written to the breakdown).
    off = Kernel("gpumem-kernel, tracking off", "gpumem", dict(sim, GPUMEM_NB_TRACK="off")) if a.tracking_off else None
    if off:
        kernels.insert(1, off)
    samples = []  # (part, name, kernel label, ms, gpumem cell number or None)

    def timed(part, name, code_for, rnd):
        # Which kernel goes first turns with each round.
        order = kernels[rnd % len(kernels):] + kernels[: rnd % len(kernels)]
        for k in order:
            ms = k.run(code_for(k))
            cell = k.last_cell if k is ours else None
            samples.append({"part": part, "cell": name, "kernel": k.label, "ms": ms, "n": cell, "round": rnd})

    setups = {}
    parts = []
    try:
        # First a notebook with no `:dep` at all (plain Rust): what every notebook pays, tracked
        # from its first cell in gpumem-kernel.
        plain = [c for c in SMALL if "gpumem_nb" not in c[1] and not c[1].startswith(("alloc", "drop(buf"))]
        parts.append(("(none)", plain))
        for rnd in range(a.rounds):
            for name, code in plain:
                timed("(none)", name, lambda k, c=code: c, rnd)
        # Setup: the same crate in each (the kernel's own `:dep gpumem-nb`; the same source
        # tree by path in the stock kernel).
        for k in kernels:
            code = f':dep gpumem-nb = {{ path = "{a.repo}" }}' if k is stock else ":dep gpumem-nb"
            setups[(k.label, "gpumem-nb")] = k.run(code)
        parts.append(("gpumem-nb", SMALL))
        for rnd in range(a.rounds):
            for name, code in SMALL:
                timed("gpumem-nb", name, lambda k, c=code: c, rnd)
        if not a.no_candle:
            for k in kernels:
                setups[(k.label, "candle-core")] = k.run(':dep candle-core = "0.11"')
            parts.append(("gpumem-nb + candle-core", SMALL + CANDLE))
            for rnd in range(a.rounds):
                for name, code in SMALL + CANDLE:
                    timed("gpumem-nb + candle-core", name, lambda k, c=code: c, rnd)
    finally:
        for k in kernels:
            k.stop()

    times = read_times(times_file)
    for s in samples:
        if s["n"] is not None and s["n"] in times:
            s["breakdown"] = times[s["n"]]
    machine = f"{platform.node()}, {os.cpu_count()} cores, {platform.machine()}"
    json.dump({"machine": machine, "date": time.strftime("%Y-%m-%d"), "setups": {f"{k} / {p}": v for (k, p), v in setups.items()}, "samples": samples}, open(a.out, "w"), indent=1)

    print(f"## Small cells, {machine}, {time.strftime('%Y-%m-%d')} ({a.rounds} rounds, interleaved)\n")
    for (k, p), v in setups.items():
        print(f"- setup `{p}` in {k}: {v / 1e3:.1f} s")
    print()
    for part, cells in parts:
        print(f"### after `:dep {part}`\n" if part != "(none)" else "### a notebook with no `:dep`\n")
        off_head = " tracking off median | p90 | on ÷ off |" if off else ""
        print(f"| cell | gpumem-kernel median | p90 |{off_head} stock evcxr median | p90 | ratio |")
        print("|---|---:|---:|" + ("---:|---:|---:|" if off else "") + "---:|---:|---:|")

        def row(label, name):
            of = lambda k: [s["ms"] for s in samples if s["part"] == part and (name is None or s["cell"] == name) and s["kernel"] == k.label]
            o, t = of(ours), of(stock)
            b = lambda x: f"**{x}**" if name is None else x
            cols = [label, b(f"{pct(o, .5):.0f} ms"), b(f"{pct(o, .9):.0f}")]
            if off:
                f = of(off)
                cols += [b(f"{pct(f, .5):.0f} ms"), b(f"{pct(f, .9):.0f}"), b(f"{pct(o, .5) / pct(f, .5):.2f}")]
            cols += [b(f"{pct(t, .5):.0f} ms"), b(f"{pct(t, .9):.0f}"), b(f"{pct(o, .5) / pct(t, .5):.2f}")]
            print("| " + " | ".join(cols) + " |")

        for name, _ in cells:
            row(name, name)
        row("**all**", None)
        print()
        rows = [s for s in samples if s["part"] == part and s["kernel"] == ours.label and "breakdown" in s]
        if rows:
            def med(f):
                return pct([f(s) for s in rows], .5)

            b = lambda s: s["breakdown"]
            fc = lambda s: sum(ms for name, ms in b(s)["phases"].items() if name != "Execution")
            ex = lambda s: b(s)["phases"].get("Execution", 0.0)
            hooks = lambda s: sum(b(s)["hooks_us"]) / 1e3
            print("gpumem-kernel, where a small cell's time goes (medians over its cells, ms):\n")
            print("| client wall | kernel wall | type inference, cargo, evcxr's retries (compile phases − rustc) | rustc of the cell (every attempt) | its link | load + run (evcxr's Execution) | hooks (readings before/after) | rest (report, magics, messages) |")
            print("|---:|---:|---:|---:|---:|---:|---:|---:|")
            print(
                f"| {med(lambda s: s['ms']):.0f} | {med(lambda s: b(s)['wall_ms']):.0f} | {med(lambda s: fc(s) - b(s)['rustc']):.0f} | "
                f"{med(lambda s: b(s)['rustc'] - b(s)['link']):.0f} | {med(lambda s: b(s)['link']):.0f} | {med(ex):.0f} | {med(hooks):.0f} | "
                f"{med(lambda s: b(s)['wall_ms'] - fc(s) - ex(s) - hooks(s)):.0f} |\n"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
