"""What the gpumem-lab panel costs a cell: the same small cells with the panel open, with the
sidebar on another panel, with the panel closed and with the extension off, in one JupyterLab in
headless Chromium, on one kernel (issue 45, item 4).

Usage: python kernel/tests/lab_panel_cost.py OUT_JSON [--rounds N] [--cells N] [--conditions open,other,closed,off]
       python kernel/tests/lab_panel_cost.py OUT_JSON --report   (the tables of a run's OUT_JSON; python: target/lab-venv's)
(kernel/tests/lab_panel_cost.sh sets it up as kernel/tests/lab_panel.sh does.) Not a test:
nothing is asserted but that each condition is what it says (the panel shown, hidden, absent).

One notebook: `:dep gpumem-nb`, a cell that makes a 64 MiB buffer (the reports carry allocator
figures), then N small cells (scripts/cell_bench.py's small cells, cycled: a `let`, a `Vec`, a
loop, a `fn`, a call, a print, a struct, a buffer, `memory_allocated()`, a `drop`). After one
warm-up block (discarded), each round runs the N small cells once per condition, the order of
the conditions rotating from round to round:

- open: the panel shown in the right sidebar (it renders every record and live reading);
- closed: the right sidebar collapsed (the extension loaded, the panel hidden, its model still
  reading the iopub messages);
- off: the extension disabled (`disabledExtensions` in the server's page_config.json), the right
  sidebar collapsed;
- other: the extension loaded, the right sidebar open on another panel (JupyterLab's property
  inspector): the main area as narrow as with the panel open, the panel hidden. What open costs
  over this is the panel's drawing; what this costs over closed, the narrower notebook's.

Before every block the notebook is saved and the page reloaded (the same kernel session: its
id is checked), so each block starts from the same page. In a block the page runs the cells one
after another, each sent as soon as the one before went idle, the page timing itself (Python
only polls once a second). Per cell: the record's `wall_ms` and `hook_us` (the cell's
`application/vnd.gpumem.cell+json` output) and the page's time from the run command (a click on
Run) to the kernel's idle status for that request. Per block: the CPU time of the browser's
processes (by kind: the page's renderer, the GPU process that composites in software, the rest)
and of the server's (JupyterLab, the kernel, evcxr, rustc), the machine's CPU busy share and load
average, the page's main-thread time by kind (Chrome's Performance metrics: script, style,
layout), its long tasks, and the time the panel spent in its render.
Prints a markdown table and writes every sample to OUT_JSON.
"""

import argparse
import json
import os
import platform
import random
import re
import shutil
import statistics
import sys
import tempfile
import time


here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "..", "scripts"))
from lab_browser import Failed, close, notebook, open_browser, start_lab, wait  # noqa: E402
import cell_bench  # noqa: E402  (its SMALL cells: the project's notion of a small cell)

PANEL_ID = "gpumem-lab-panel"
SETUP = [
    ":dep gpumem-nb",
    "use gpumem_nb::{DeviceBuffer, StreamId};\n"
    "let alloc = gpumem_nb::current()?;\n"
    "let keep = DeviceBuffer::<u8>::zeros(&alloc, 64 << 20, StreamId::DEFAULT)?;",
]
SMALL = [(name, code) for name, code in cell_bench.SMALL if name != "current"]  # `alloc` is SETUP's
CONDITIONS = ["open", "other", "closed", "off"]

JS = r"""
window.gpumemCost = {
  app() { return window.jupyterapp; },
  nb() {
    const w = this.app().shell.currentWidget;
    return w && w.content && w.sessionContext ? w : null;
  },
  kernel() { const p = this.nb(); return p && p.sessionContext.session ? p.sessionContext.session.kernel : null; },
  kernelStatus() { const k = this.kernel(); return k ? k.status : null; },
  panel() {
    const p = document.getElementById('gpumem-lab-panel');
    return p ? {visible: p.offsetWidth > 0 && p.offsetHeight > 0, state: p.dataset.state,
                bars: p.querySelectorAll('g.gpumem-bar').length} : null;
  },
  // The right sidebar: collapsed or not, its panels, the main area's width.
  right() {
    const sh = this.app().shell;
    return {collapsed: sh.rightCollapsed, ids: [...sh.widgets('right')].map(w => w.id),
            main: this.nb() ? this.nb().node.offsetWidth : null};
  },
  loaded() { return !!this.app().gpumemLab; },
  record(i) {
    const outs = this.nb().content.widgets[i].model.outputs.toJSON();
    for (const o of outs) { if (o.data && o.data['application/vnd.gpumem.cell+json']) return o.data['application/vnd.gpumem.cell+json']; }
    return null;
  },
  // The page's own clock on the kernel's messages: when each execute_request left, when its
  // reply and its idle status came.
  sentAt: {}, replyAt: {}, idleAt: {}, waiters: {}, lastSent: null,
  hook() {
    const k = this.kernel();
    k.anyMessage.connect((_, a) => {
      const m = a.msg, t = performance.now();
      if (a.direction === 'send' && m.header.msg_type === 'execute_request') { this.sentAt[m.header.msg_id] = t; this.lastSent = m.header.msg_id; return; }
      if (a.direction !== 'recv') return;
      const parent = m.parent_header && m.parent_header.msg_id;
      if (m.header.msg_type === 'execute_reply') this.replyAt[parent] = t;
      if (m.header.msg_type === 'status' && m.content.execution_state === 'idle' && parent && this.sentAt[parent] !== undefined) {
        this.idleAt[parent] = t;
        const w = this.waiters[parent]; if (w) { delete this.waiters[parent]; w(); }
      }
    });
    // The main thread's long tasks (over 50 ms), whatever ran them.
    this.longMs = 0; this.longN = 0;
    try {
      new PerformanceObserver(l => { for (const e of l.getEntries()) { this.longMs += e.duration; this.longN++; } })
        .observe({type: 'longtask', buffered: false});
    } catch (e) { this.longMs = null; }
    // The time the panel spends in its render (the extension loaded only).
    this.renderMs = 0; this.renders = 0;
    const lab = this.app().gpumemLab;
    if (lab && lab.panel && lab.panel._render) {
      const p = lab.panel, orig = p._render;
      p._render = function () { const t = performance.now(); try { return orig.apply(this, arguments); } finally { window.gpumemCost.renderMs += performance.now() - t; window.gpumemCost.renders++; } };
    }
    return k.id;
  },
  idle(id) {
    if (this.idleAt[id] !== undefined) return Promise.resolve();
    return new Promise(r => { this.waiters[id] = r; });
  },
  // Runs cells `indices` one after another: each is sent as soon as the one before went idle.
  async runBlock(indices) {
    this.done = false; this.error = null; this.samples = [];
    const long0 = this.longMs, longN0 = this.longN, render0 = this.renderMs, renders0 = this.renders;
    try {
      for (const i of indices) {
        const p = this.nb();
        p.content.activeCellIndex = i;
        const before = this.lastSent;
        const t0 = performance.now();
        await this.app().commands.execute('notebook:run-cell');
        for (let n = 0; this.lastSent === before; n++) {
          if (n > 2000) throw new Error(`cell ${i}: no execute_request went out`);
          await new Promise(r => setTimeout(r, 5));
        }
        const id = this.lastSent;
        await this.idle(id);
        const rec = this.record(i);
        if (!rec) throw new Error(`cell ${i}: no record in its outputs`);
        this.samples.push({index: i, cell: rec.cell, wall_ms: rec.wall_ms, hook_us: rec.hook_us,
                           click_to_idle_ms: this.idleAt[id] - t0, click_to_reply_ms: this.replyAt[id] - t0,
                           click_to_sent_ms: this.sentAt[id] - t0});
      }
    } catch (e) { this.error = String(e && e.stack || e); }
    this.block = {long_ms: this.longMs === null ? null : this.longMs - long0, long_tasks: this.longN - longN0,
                  render_ms: this.renderMs - render0, renders: this.renders - renders0};
    this.done = true;
  },
};
true;
"""


def cpu_ticks(pids):
    """utime + stime + cutime + cstime of these processes (the children they reaped count)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])
        except (OSError, IndexError):
            pass
    return total


def kind(pid):
    """renderer, gpu, utility or zygote (from `--type=`; Chromium's children rewrite their
    command line into one string), browser (Chromium itself), other (chromedriver)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ")
    except OSError:
        return "gone"
    m = re.search(rb"--type=(\S+)", cmd)
    if m:
        return {b"renderer": "renderer", b"gpu-process": "gpu"}.get(m.group(1), m.group(1).decode())
    return "browser" if b"/chromium" in cmd.split(b" ")[0] else "other"


def cpu_by_kind(pids):
    out = {}
    for pid in pids:
        k = kind(pid)
        out[k] = out.get(k, 0) + cpu_ticks([pid])
    return out


def tree(root):
    """root and every process below it."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def machine_busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v), idle


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def boot_ratio(a, b, n=4000, seed=45):
    """A 95 % bootstrap interval of median(a) / median(b)."""
    rnd = random.Random(seed)
    rs = sorted(median(rnd.choices(a, k=len(a))) / median(rnd.choices(b, k=len(b))) for _ in range(n))
    return rs[int(0.025 * n)], rs[int(0.975 * n) - 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--cells", type=int, default=40)
    ap.add_argument("--conditions", default=",".join(CONDITIONS), help="of open, other, closed, off")
    ap.add_argument("--report", action="store_true", help="only print the tables of OUT_JSON, as written by a run")
    a = ap.parse_args()
    if a.report:
        report(json.load(open(a.out)))
        return 0
    conds = a.conditions.split(",")
    assert "open" in conds and "closed" in conds and set(conds) <= set(CONDITIONS), conds
    small = [SMALL[i % len(SMALL)] for i in range(a.cells)]
    cells = SETUP + [code for _, code in small]
    first_small = len(SETUP)
    indices = list(range(first_small, len(cells)))

    work = tempfile.mkdtemp(prefix="gpumem-panel-cost-")
    for d in ("config/labconfig", "data", "runtime", "notebooks", "chrome"):
        os.makedirs(os.path.join(work, d))
    page_config = os.path.join(work, "config", "labconfig", "page_config.json")

    def extension(on):
        disabled = {"@jupyterlab/apputils-extension:announcements": True}
        if not on:
            disabled["gpumem-lab"] = True
        json.dump({"disabledExtensions": disabled}, open(page_config, "w"))

    extension(True)
    nbdir = os.path.join(work, "notebooks")
    json.dump(notebook(cells), open(os.path.join(nbdir, "cost.ipynb"), "w"), indent=1)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=os.path.join(work, "config"), JUPYTER_DATA_DIR=os.path.join(work, "data"),
               JUPYTER_RUNTIME_DIR=os.path.join(work, "runtime"))
    env.setdefault("GPUMEM_NB_DEVICE", "sim:8GiB")
    env.pop("EVCXR_TMPDIR", None)
    lab, port, lab_log = start_lab(nbdir, env, os.path.join(work, "jupyterlab.log"))
    driver = None
    t_start = time.monotonic()
    result = {"machine": f"{platform.node()}, {os.cpu_count()} cores, {platform.machine()}", "date": time.strftime("%Y-%m-%d %H:%M"),
              "device": env["GPUMEM_NB_DEVICE"], "cells": [c for c, _ in small], "rounds": a.rounds, "blocks": []}
    try:
        driver = open_browser(lab, port, lab_log, work, width=1400)
        driver.set_window_size(1400, 1000)
        js = lambda code, *args: driver.execute_script(code, *args)  # noqa: E731
        url = f"http://127.0.0.1:{port}/lab/tree/cost.ipynb"
        kernel_id = [None]

        def load(condition):
            """Save, set the extension on or off, reload; the same kernel; the panel as asked."""
            if driver.current_url.startswith("http") and js("return !!(window.gpumemCost && gpumemCost.nb())"):
                js("window.jupyterapp.commands.execute('docmanager:save')")
                wait("the notebook saved", lambda: not js("return gpumemCost.nb().context.model.dirty"), 60)
            extension(condition != "off")
            driver.get(url)
            wait("the notebook", lambda: js(
                "const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                "return !!(w && w.content && w.sessionContext && w.content.widgets.length >= arguments[0])", len(cells)), 180)
            js(JS)
            wait("the kernel to be idle", lambda: js("return gpumemCost.kernelStatus()") == "idle", 180)
            kid = js("return gpumemCost.hook()")
            if kernel_id[0] is None:
                kernel_id[0] = kid
            if kid != kernel_id[0]:
                raise Failed(f"the reloaded page is on another kernel ({kid}, not {kernel_id[0]})")
            if condition == "off":
                time.sleep(1.0)
                if js("return gpumemCost.loaded() || !!gpumemCost.panel()"):
                    raise Failed("off: the extension is still loaded")
                js("window.jupyterapp.shell.collapseRight()")
                wait("the right sidebar collapsed", lambda: js("return gpumemCost.right()")["collapsed"], 20)
            else:
                wait("the extension", lambda: js("return gpumemCost.loaded()"), 30)
                if condition == "open":
                    js("window.jupyterapp.shell.activateById(arguments[0])", PANEL_ID)
                    wait("the panel shown", lambda: (js("return gpumemCost.panel()") or {}).get("visible"), 20)
                    wait("the panel on gpumem-kernel", lambda: js("return gpumemCost.panel()")["state"] == "gpumem", 60)
                elif condition == "other":
                    other = next(i for i in js("return gpumemCost.right()")["ids"] if i != PANEL_ID)
                    js("window.jupyterapp.shell.activateById(arguments[0])", other)
                    wait(f"{other} shown in the right sidebar, the panel hidden", lambda: not js("return gpumemCost.right()")["collapsed"]
                         and not js("return gpumemCost.panel()")["visible"], 20)
                else:
                    js("window.jupyterapp.shell.collapseRight()")
                    wait("the panel hidden", lambda: js("return gpumemCost.panel()") and not js("return gpumemCost.panel()")["visible"], 20)
            driver.execute_cdp_cmd("Performance.enable", {})
            time.sleep(3.0)  # the page settles
            return js("return gpumemCost.right()")

        def page_metrics():
            m = {x["name"]: x["value"] for x in driver.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]}
            return {k: m.get(k, 0.0) for k in ("TaskDuration", "ScriptDuration", "LayoutDuration", "RecalcStyleDuration", "LayoutCount", "RecalcStyleCount")}

        def run_block(condition, rnd):
            right = load(condition)
            tree_lab, tree_br = tree(lab.pid), tree(driver.service.process.pid)
            k_br, pm0 = cpu_by_kind(tree_br), page_metrics()
            c_lab, c_br, m0, l0, t0 = cpu_ticks(tree_lab), cpu_ticks(tree_br), machine_busy(), loadavg(), time.monotonic()
            js("gpumemCost.runBlock(arguments[0])", indices)
            wait(f"{condition}: the block's cells", lambda: js("return gpumemCost.done"), 1800, every=1.0)
            err = js("return gpumemCost.error")
            if err:
                raise Failed(f"{condition}: {err}")
            tree_lab, tree_br = tree(lab.pid), tree(driver.service.process.pid)
            hz = os.sysconf("SC_CLK_TCK")
            m1 = machine_busy()
            k_br1, pm1 = cpu_by_kind(tree_br), page_metrics()
            block = {
                "round": rnd, "condition": condition, "seconds": time.monotonic() - t0,
                "cpu_server_kernel_s": (cpu_ticks(tree_lab) - c_lab) / hz, "cpu_browser_s": (cpu_ticks(tree_br) - c_br) / hz,
                "machine_busy": 1 - (m1[1] - m0[1]) / max(1, m1[0] - m0[0]), "load_before": l0, "load_after": loadavg(),
                "panel_bars_after": (js("return gpumemCost.panel()") or {}).get("bars"),
                "right_sidebar": right,
                "cpu_browser_by_kind_s": {k: (k_br1.get(k, 0) - k_br.get(k, 0)) / hz for k in sorted(set(k_br) | set(k_br1))},
                "page_main_thread_s": {k: pm1[k] - pm0[k] for k in pm0},
                **js("return gpumemCost.block"), "samples": js("return gpumemCost.samples"),
            }
            result["blocks"].append(block)
            s = block["samples"]
            print(f"  round {rnd} {condition:6}: {len(s)} cells in {block['seconds']:.0f} s; median wall {median([x['wall_ms'] for x in s]):.0f} ms, "
                  f"hooks {median([x['hook_us'] for x in s]):.0f} µs, click to idle {median([x['click_to_idle_ms'] for x in s]):.0f} ms; "
                  f"CPU browser {block['cpu_browser_s']:.1f} s ({', '.join(f'{k} {v:.1f}' for k, v in block['cpu_browser_by_kind_s'].items())}), "
                  f"page task {block['page_main_thread_s']['TaskDuration']:.1f} s, server+kernel {block['cpu_server_kernel_s']:.1f} s; "
                  f"machine {100 * block['machine_busy']:.0f} % busy, load {block['load_before'][0]:.1f}; panel render {block['render_ms']:.0f} ms "
                  f"({block['renders']}), long tasks {block['long_ms'] or 0:.0f} ms", flush=True)

        # Setup: the :dep cell and the buffer, then one discarded block.
        load("open")
        print(f"JupyterLab up, kernel idle after {time.monotonic() - t_start:.1f} s", flush=True)
        js("gpumemCost.runBlock(arguments[0])", list(range(first_small)))
        wait("the setup cells", lambda: js("return gpumemCost.done"), 1200, every=1.0)
        if js("return gpumemCost.error"):
            raise Failed(js("return gpumemCost.error"))
        setup = js("return gpumemCost.samples")
        result["setup"] = setup
        print(f"  setup: :dep gpumem-nb {setup[0]['wall_ms'] / 1e3:.1f} s, buffer {setup[1]['wall_ms']:.0f} ms", flush=True)
        run_block("open", "warm-up")
        for rnd in range(a.rounds):
            for k in range(len(conds)):
                run_block(conds[(rnd + k) % len(conds)], rnd)
    except Failed as e:
        print(f"FAIL: {e} (JupyterLab's log: {lab_log.name})")
        shutil.copy(lab_log.name, os.path.abspath(a.out) + ".jupyterlab.log")
        return 1
    finally:
        close(driver, lab)
        if not os.environ.get("GPUMEM_COST_KEEP"):
            shutil.rmtree(work, ignore_errors=True)

    result["total_s"] = time.monotonic() - t_start
    result["conditions"] = conds
    report(result)
    json.dump(result, open(a.out, "w"), indent=1)
    print(f"every sample: {a.out}")
    return 0


LABELS = {"open": "panel open", "closed": "panel closed", "other": "sidebar on another panel", "off": "extension off"}
RATIOS = [("open", "closed"), ("open", "other"), ("other", "closed"), ("open", "off")]


def report(result):
    """The markdown tables: per cell, per block, per round."""
    conds = result.get("conditions", ["open", "closed", "off"])
    ratios = [(x, y) for x, y in RATIOS if x in conds and y in conds]
    measured = [b for b in result["blocks"] if b["round"] != "warm-up"]
    rounds = sorted({b["round"] for b in measured})
    cells = len(result["cells"])
    per = {c: [s for b in measured if b["condition"] == c for s in b["samples"]] for c in conds}
    summary = {}
    print(f"\n## The panel's per-cell cost, {result['machine']}, {result['date']}: {len(rounds)} rounds × {cells} cells per condition\n")
    print("| per cell, median | " + " | ".join(LABELS[c] for c in conds) + " | " + " | ".join(f"{x} / {y} (95 % CI)" for x, y in ratios) + " |")
    print("|---|" + "---:|" * (len(conds) + len(ratios)))
    for label, key, unit in [("record `wall_ms`", "wall_ms", "ms"), ("record `hook_us`", "hook_us", "µs"),
                             ("page: run to idle", "click_to_idle_ms", "ms")]:
        v = {c: [s[key] for s in per[c]] for c in conds}
        summary[key] = {c: median(v[c]) for c in conds}
        cols = []
        for x, y in ratios:
            r, ci = median(v[x]) / median(v[y]), boot_ratio(v[x], v[y])
            summary[key][f"{x}/{y}"], summary[key][f"{x}/{y}_ci95"] = r, ci
            cols.append(f"{r:.3f} ({ci[0]:.2f}–{ci[1]:.2f})")
        print(f"| {label} | " + " | ".join(f"{median(v[c]):.0f} {unit}" for c in conds) + " | " + " | ".join(cols) + " |")
    print(f"\n| per block ({cells} cells), median over rounds | " + " | ".join(LABELS[c] for c in conds) + " |")
    print("|---|" + "---:|" * len(conds))
    rows = [("browser CPU", lambda b: b["cpu_browser_s"], "{:.1f} s"),
            ("… its renderer (the page)", lambda b: b.get("cpu_browser_by_kind_s", {}).get("renderer"), "{:.1f} s"),
            ("… its GPU process (software compositing)", lambda b: b.get("cpu_browser_by_kind_s", {}).get("gpu"), "{:.1f} s"),
            ("page main thread: all tasks", lambda b: b.get("page_main_thread_s", {}).get("TaskDuration"), "{:.1f} s"),
            ("… script", lambda b: b.get("page_main_thread_s", {}).get("ScriptDuration"), "{:.1f} s"),
            ("… style + layout", lambda b: (b["page_main_thread_s"]["RecalcStyleDuration"] + b["page_main_thread_s"]["LayoutDuration"])
             if "page_main_thread_s" in b else None, "{:.2f} s"),
            ("… the panel's render (script)", lambda b: b["render_ms"] / 1e3, "{:.2f} s"),
            ("server + kernel CPU", lambda b: b["cpu_server_kernel_s"], "{:.1f} s"),
            ("block's wall time", lambda b: b["seconds"], "{:.1f} s"),
            ("machine CPU busy", lambda b: b["machine_busy"], "{:.0%}"),
            ("load average (1 min) before", lambda b: b["load_before"][0], "{:.1f}")]
    for label, f, fmt in rows:
        row = []
        for c in conds:
            xs = [f(b) for b in measured if b["condition"] == c and f(b) is not None]
            row.append(fmt.format(median(xs)) if xs else "–")
            summary.setdefault("blocks", {}).setdefault(label, {})[c] = median(xs) if xs else None
        print(f"| {label} | " + " | ".join(row) + " |")
    print("\n| round (order) | " + " | ".join(f"{c}: wall / run to idle" for c in conds) + " | open / closed, wall | load (1 min) |")
    print("|---|" + "---:|" * (len(conds) + 2))
    for rnd in rounds:
        bs = [b for b in measured if b["round"] == rnd]
        by = {b["condition"]: b for b in bs}
        cols = [f"{median([s['wall_ms'] for s in by[c]['samples']]):.0f} / {median([s['click_to_idle_ms'] for s in by[c]['samples']]):.0f} ms" for c in conds]
        oc = median([s["wall_ms"] for s in by["open"]["samples"]]) / median([s["wall_ms"] for s in by["closed"]["samples"]])
        loads = [b["load_before"][0] for b in bs]
        print(f"| {rnd} ({', '.join(b['condition'] for b in bs)}) | " + " | ".join(cols) + f" | {oc:.2f} | {min(loads):.1f}–{max(loads):.1f} |")
    result["summary"] = summary
    print(f"\n{sum(len(v) for v in per.values())} cells measured, the whole run {result.get('total_s', 0):.0f} s")
    return summary


if __name__ == "__main__":
    sys.exit(main())
