"""The gpumem-lab panel (lab/) in a real JupyterLab, in headless Chromium, checked on the DOM.

Usage: python kernel/tests/lab_panel.py OUT_DIR
(kernel/tests/lab_panel.sh sets everything up: JupyterLab and selenium pinned in a virtualenv, the
kernelspec and the prebuilt extension in a private prefix on JUPYTER_PATH, a simulated 8 GiB
device.)

What it checks, each against what the kernel itself wrote into the notebook (the record, the
`application/vnd.gpumem.cell+json` of a cell's output; the live line's figures): what a user sees,
the texts as rendered and the chart's rendered boxes, compared with the record's numbers written
as the panel writes them (lab/src/units.ts and chart.ts, written again here: `iec`, `statusText`,
`siteText`), never with another attribute of the page read at the same moment.

- The extension is loaded as a prebuilt extension, and the panel opens from its right-sidebar tab.
- After each of four cells run one at a time (a first buffer stamped as parameters and
  activations, a cell that frees the activations, one under `%gpumem budget 1GiB` that makes
  gradients, and a long one): the panel's figures as they read on screen (`320 MiB`, `128 MiB
  peak 320 MiB`, `7.69 GiB`, `n/a`: every row shown and no other) are the record in that cell's
  output, and so are their exact bytes (`data-bytes`); the status bar's item reads the text the
  record gives (`GPU 0.3 / 8 GiB`); the chart has one bar per record, each drawn (its rendered
  boxes) standing on the axis's 0 and as tall as the record's after, its peak's bar as its peak,
  each component's block as that component's bytes, read on the chart's own axis (its labels'
  text and its grid lines' rendered y), within a pixel; after the budget cell the budget line is
  drawn at the record's budget and labelled so.
- During a cell that runs about 5 s and grows memory in steps: the panel is live and its
  allocated figure changes at least twice, every figure it shows (its bytes, and its text) being
  one the live line's figures (in the cell's output) held; the chart has a bar for the running
  cell at the live reading's every-allocation figure, drawn that tall on the axis.
- Hovering a bar shows its cell and first line, what it measures, and its top sites, the
  record's (a record with no top site fails), in the panel's hover box and in the bar's tooltip;
  clicking the bar of a cell scrolled out of view selects that cell (the active cell changes)
  and brings it into view.
- A second notebook on a second kernel: the panel shows its own figures (its records', different
  from the first's) while it is active, and the first's again when the first is.
- A notebook on the venv's python3 kernel (ipykernel): the panel says, in one line, that the
  kernel is not gpumem-kernel and shows no figure; the status item hides.
- The page sends each kernel only JupyterLab's own requests (execute, kernel_info): the panel
  opens no comm and asks nothing; each cell's report line stays under it.
- Reopened, a notebook's panel shows its history from the records in its saved outputs (the
  live kernel's kernel_info says its notebook process is theirs).
- The "now" figures lead with who holds the memory (the record's `all_allocations.by_owner`);
  gpumem-nb's allocated and reserved show only where that allocator holds memory.
- An out-of-memory cell (200 GiB on the 8 GiB device): its bar outlined with a ✗, its tooltip,
  the panel's list of failed cells and its "now" line say `out of memory: asked for 200.00 GiB`.
- Kernel > Restart: the chart keeps the old process's bars apart, labelled "previous process",
  none in the new session; the panel and the status bar say the new process holds nothing;
  the new process's cells [1] and [2] are the only bars of the new session (not keyed into the
  old ones), and the panel's pid is the one their records name.
- A page reload after the restart, the notebook's saved outputs holding records of both
  processes: the panel's figures and the status bar are the live process's (the kernel_info
  reply's newest record), not the newest saved record of the old process; the old process's
  records are "previous process". Checked against the live kernel's own answer: the next cell's
  record's before-values (what the process held when it started) are the figures the panel
  showed, in bytes and in its text, and the status bar's text.
- `%gpumem restart`: the panel and the status bar say the fresh process holds nothing at once
  (its note, `application/vnd.gpumem.session+json`), the earlier processes' bars apart.
- With its kernel shut down, the notebook's panel shows the saved records labelled as saved
  outputs, no figure of now, and the status item hides.
- No error in the browser's console.
- Screenshots of the panel, light and dark, at 1400 px (and of the live panel and the python
  notebook) in OUT_DIR.
"""

import decimal
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_browser  # noqa: E402
from lab_browser import FAILURES, Failed, close, notebook, open_browser, report_failure, set_theme, start_lab, wait  # noqa: E402

CHECKS = [0]


def check(cond, what, detail=""):
    """lab_browser's check, counted."""
    CHECKS[0] += 1
    lab_browser.check(cond, what, detail)

CELL_MIME = "application/vnd.gpumem.cell+json"
LIVE_MIME = "application/vnd.gpumem.live+json"
GIB = 1 << 30

FILLER = "## Filler\n\n" + "\n\n".join(f"A paragraph that keeps the first cells out of view ({i})." for i in range(40))
CELLS = [
    ":dep gpumem-nb",
    # A first buffer: parameters and activations, stamped.
    "use gpumem_nb::{Component, DeviceBuffer, StreamId, component};\n"
    "let alloc = gpumem_nb::current()?;\n"
    "let params = component(Component::Parameter, || DeviceBuffer::<f32>::zeros(&alloc, 32 << 20, StreamId::DEFAULT))?;\n"
    "let acts = component(Component::Activation, || DeviceBuffer::<f32>::zeros(&alloc, 48 << 20, StreamId::DEFAULT))?;",
    # Frees the activations.
    "drop(acts);",
    # Under a budget: gradients.
    "%gpumem budget 1GiB\n"
    "let grads = component(Component::Gradient, || DeviceBuffer::<f32>::zeros(&alloc, 40 << 20, StreamId::DEFAULT))?;",
    # About 5 s, memory growing in steps.
    "let mut steps = Vec::new();\n"
    "for _ in 0..6 {\n"
    "    steps.push(DeviceBuffer::<u8>::zeros(&alloc, 96 << 20, StreamId::DEFAULT)?);\n"
    "    std::thread::sleep(std::time::Duration::from_millis(800));\n"
    "}\n"
    "steps.len()",
    FILLER,
    "grads.len()",
    # Out of memory on the 8 GiB simulated device: an error, expected (nothing after it runs).
    "let huge = gpumem_nb::DeviceBuffer::<u8>::zeros(&alloc, 200 << 30, gpumem_nb::StreamId::DEFAULT)?;",
    # Allocates nothing: what the process holds when it starts is its before-values.
    "params.len()",
    "%gpumem restart",
]
DEP, ALLOC, FREE, BUDGET, LONG, FILL, LAST, OOM, QUIET, RESTART = range(10)

CELLS2 = [
    ":dep gpumem-nb",
    "let alloc = gpumem_nb::current()?;\n"
    "let other = gpumem_nb::DeviceBuffer::<u8>::zeros(&alloc, 300 << 20, gpumem_nb::StreamId::DEFAULT)?;",
]


def with_markdown(nb, index):
    nb["cells"][index] = {"cell_type": "markdown", "id": f"c{index}", "metadata": {}, "source": nb["cells"][index]["source"]}
    return nb


def python_notebook():
    return {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
        "cells": [{"cell_type": "code", "id": "p0", "metadata": {}, "source": "1 + 1", "outputs": [], "execution_count": None}],
    }


# Page-side helpers: the notebook, its records, the panel's figures.
JS = r"""
window.gpumemPanelTest = {
  app() { return window.jupyterapp; },
  nb() { return this.app().shell.currentWidget; },
  notebooks() { return this.app().shell.widgets ? [...this.app().shell.widgets('main')] : []; },
  byPath(path) { return this.notebooks().find(w => w.context && w.context.path === path); },
  kernelStatus() {
    const p = this.nb();
    const k = p && p.sessionContext && p.sessionContext.session && p.sessionContext.session.kernel;
    return k ? k.status : null;
  },
  // The record in cell i's outputs (the model: what the kernel sent), or null.
  record(i) {
    const outs = this.nb().content.widgets[i].model.outputs.toJSON();
    for (const o of outs) { if (o.data && o.data['application/vnd.gpumem.cell+json']) return o.data['application/vnd.gpumem.cell+json']; }
    return null;
  },
  liveInOutput(i) {
    const outs = this.nb().content.widgets[i].model.outputs.toJSON();
    for (const o of outs) { if (o.data && o.data['application/vnd.gpumem.live+json']) return o.data['application/vnd.gpumem.live+json']; }
    return null;
  },
  panelNode() { return document.getElementById('gpumem-lab-panel'); },
  // What the panel shows: its state, mode, cell, figures (exact bytes), bars, budget lines.
  panel() {
    const p = this.panelNode();
    if (!p) return null;
    const now = p.querySelector('.gpumem-panel-now');
    const figs = {};
    const order = [];
    for (const tr of p.querySelectorAll('.gpumem-fig')) {
      order.push(tr.dataset.key);
      const value = tr.querySelector('.gpumem-fig-value');
      // `text`: the value as rendered (innerText, its peak included), `shown`: it has a box.
      figs[tr.dataset.key] = {bytes: tr.dataset.bytes === '' ? null : Number(tr.dataset.bytes),
                               peak: tr.dataset.peak === '' ? null : Number(tr.dataset.peak),
                               label: (tr.querySelector('.gpumem-fig-label') || {}).innerText,
                               text: value.innerText,
                               shown: value.getClientRects().length > 0 && value.getBoundingClientRect().height > 0,
                               source: tr.querySelector('.gpumem-fig-source').textContent};
    }
    // The chart as rendered (client pixels): each grid line's y and its axis label's text, the
    // budget lines' y. Read with the bars' boxes below, so that a height reads in bytes through
    // the axis a user reads.
    const mid = e => { const r = e.getBoundingClientRect(); return (r.top + r.bottom) / 2; };
    const rectOf = e => { if (!e) return null; const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, height: r.height, width: r.width}; };
    const gridLines = [...p.querySelectorAll('svg.gpumem-history line.gpumem-grid')];
    const gridLabels = [...p.querySelectorAll('svg.gpumem-history text.gpumem-axis:not(.gpumem-cell-label)')];
    const axis = gridLines.map((l, i) => ({y: mid(l), text: gridLabels[i] ? gridLabels[i].textContent : null}));
    const budgetLines = [...p.querySelectorAll('svg.gpumem-history line.gpumem-budget')].map(l => ({y: mid(l)}));
    const budgetLabels = [...p.querySelectorAll('svg.gpumem-history text.gpumem-budget-label')].map(t => t.textContent);
    // Each bar as drawn: its group, its status, its tooltip, the failed mark's outline and ✗.
    const allBars = [...p.querySelectorAll('g.gpumem-bar')].map(g => {
      const outline = g.querySelector('.gpumem-fail-outline');
      const box = outline ? outline.getBBox() : null;
      const mark = g.querySelector('.gpumem-fail-mark');
      return {cell: Number(g.dataset.cell), key: g.dataset.key || null, group: g.dataset.group || 'current',
        status: g.dataset.status || null, after: Number(g.dataset.after), peak: Number(g.dataset.peak),
        selected: g.classList.contains('gpumem-bar-selected'),
        title: (g.querySelector('title') || {}).textContent || '',
        outline: box && box.width > 0 && box.height > 0 && getComputedStyle(outline).stroke !== 'none'
          ? {w: box.width, h: box.height, stroke: getComputedStyle(outline).stroke} : null,
        mark: mark ? mark.textContent : null,
        parts: [...g.querySelectorAll('.gpumem-part')].map(r => [r.dataset.part, Number(r.dataset.bytes)]),
        // As drawn: each component's rectangle (its part's name, its box), the stack's extent, the peak's box.
        drawn: (() => {
          const rects = [...g.querySelectorAll('.gpumem-part')].map(r => ({part: r.dataset.part, box: rectOf(r)}));
          const stack = rects.length ? {top: Math.min(...rects.map(r => r.box.top)), bottom: Math.max(...rects.map(r => r.box.bottom))} : null;
          return {parts: rects, stack, peak: rectOf(g.querySelector('.gpumem-peak'))};
        })()};
    });
    const bars = allBars.filter(b => b.group === 'current');
    const msg = p.querySelector('.gpumem-panel-message');
    const text = sel => [...p.querySelectorAll(sel)].filter(e => e.getClientRects().length > 0).map(e => e.textContent);
    return {
      visible: p.offsetWidth > 0 && p.offsetHeight > 0,
      state: p.dataset.state, notebook: p.dataset.notebook || null, kernelId: p.dataset.kernelId || null,
      mode: now ? now.dataset.mode : null, cell: now && now.dataset.cell ? Number(now.dataset.cell) : null,
      pid: now && now.dataset.pid ? Number(now.dataset.pid) : null,
      source: now ? now.dataset.source || null : null,
      figs, order, bars, previous: allBars.filter(b => b.group !== 'current'),
      process: text('.gpumem-now-process').join(' '),
      statusLine: text('.gpumem-now-status').join(' '),
      notes: text('.gpumem-now-note'),
      groups: text('.gpumem-group-label'),
      failed: text('.gpumem-failed-item'),
      budgets: [...p.querySelectorAll('.gpumem-budget')].map(l => Number(l.dataset.bytes)),
      axis, budgetLines, budgetLabels,
      message: msg && msg.style.display !== 'none' ? msg.textContent : null,
      nowShown: !!now && now.style.display !== 'none' && now.offsetHeight > 0,
      historyShown: !!p.querySelector('.gpumem-panel-history') && p.querySelector('.gpumem-panel-history').offsetHeight > 0,
      hover: (() => {
        const h = p.querySelector('.gpumem-hover');
        const lines = sel => [...h.querySelectorAll(sel)].filter(e => e.getClientRects().length > 0).map(e => e.innerText);
        return h ? {cell: h.dataset.cell, text: h.innerText, shown: h.getClientRects().length > 0 && h.offsetHeight > 0,
                    head: lines('.gpumem-hover-head'), lines: lines('.gpumem-hover-line'), sites: lines('.gpumem-hover-site')} : null;
      })(),
    };
  },
  status() {
    const s = document.querySelector('.gpumem-status');
    if (!s) return null;
    // The status bar hides an inactive item (its wrapper is not displayed).
    // `text`: as rendered (innerText; an item not rendered reads its textContent).
    return {text: s.innerText, bytes: s.dataset.bytes === '' ? null : Number(s.dataset.bytes),
            total: s.dataset.total === '' ? null : Number(s.dataset.total), shown: s.offsetWidth > 0 && s.getClientRects().length > 0};
  },
  // Whether cell i lies inside the notebook's scrolled view.
  inView(i) {
    const nb = this.nb().content;
    const cell = nb.widgets[i].node;
    const view = nb.node.getBoundingClientRect();
    const r = cell.getBoundingClientRect();
    return r.height > 0 && r.top >= view.top - 1 && r.top < view.bottom - 20;
  },
  // Every message the page sends each kernel, by type (the panel must send none of its own).
  sent: {},
  watch() {
    const p = this.nb();
    const k = p.sessionContext.session.kernel;
    const path = p.context.path;
    this.sent[path] = this.sent[path] || [];
    k.anyMessage.connect((_, a) => { if (a.direction === 'send') this.sent[path].push(a.msg.header.msg_type); });
  },
  reports(i) { return this.nb().content.widgets[i].node.querySelectorAll('.jp-OutputArea .gpumem-report').length; },
  liveBar() {
    const g = document.querySelector('#gpumem-lab-panel g.gpumem-livebar');
    if (!g) return null;
    // Its "now" rectangle's rendered height, and the axis it is read against (as panel() reads it).
    const r = g.querySelector('.gpumem-livebar-now');
    const mid = e => { const b = e.getBoundingClientRect(); return (b.top + b.bottom) / 2; };
    const p = document.getElementById('gpumem-lab-panel');
    const gridLabels = [...p.querySelectorAll('svg.gpumem-history text.gpumem-axis:not(.gpumem-cell-label)')];
    const axis = [...p.querySelectorAll('svg.gpumem-history line.gpumem-grid')].map((l, i) => ({y: mid(l), text: gridLabels[i] ? gridLabels[i].textContent : null}));
    const b = r ? r.getBoundingClientRect() : null;
    return {cell: Number(g.dataset.cell), now: Number(g.dataset.now), peak: Number(g.dataset.peak),
            drawn: b ? {top: b.top, bottom: b.bottom, height: b.height} : null, axis};
  },
  run(i) {
    const p = this.nb();
    p.content.activeCellIndex = i;
    return this.app().commands.execute('notebook:run-cell');
  },
};
true;
"""


def expected(rec):
    """The figures a record holds, read here independently of the extension's code: each one
    the record's own field (record.rs), `None` where it has none."""
    a = rec.get("allocator") or {}
    all_ = rec.get("all_allocations") or {}
    nvml = rec.get("nvml") or {}
    if nvml.get("device_free") is not None and nvml.get("device_total") is not None:
        free, total = nvml["device_free"], nvml["device_total"]
    else:
        free, total = rec.get("crate_device_free"), rec.get("crate_device_total")
    # gpumem-nb's allocator shows only where it holds memory.
    holds = bool((a.get("reserved") or {}).get("after"))
    return {
        "allocated": (a.get("allocated") or {}).get("after") if holds else None,
        "reserved": (a.get("reserved") or {}).get("after") if holds else None,
        "all_allocations": all_.get("after"),
        "process": (nvml.get("process") or {}).get("after"),
        "device_free": free,
        "device_total": total,
    }


def held(rec):
    e = expected(rec)
    if e["process"]:
        return e["process"]
    if e["all_allocations"] is not None:
        return e["all_allocations"]
    return e["reserved"]


def owners(rec, at="after"):
    """Who holds the memory, largest first: the record's `all_allocations.by_owner` with bytes."""
    got = [(o["owner"], o.get(at)) for o in (rec.get("all_allocations") or {}).get("by_owner") or [] if o.get(at)]
    return sorted(got, key=lambda o: -o[1])


UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def text_bytes(text):
    """A figure's text as the user reads it (`352 MiB`, `0 B`) in bytes."""
    num, unit = text.replace("\u00a0", " ").split()[:2]
    return float(num) * UNITS[unit]


# ---- What a user reads, from a record: the panel's formatting (lab/src/units.ts, chart.ts), written
# again here so that the texts on the page are compared with the record's numbers, not with the
# page's own attributes.

IEC_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]


def to_fixed(v, digits):
    """JavaScript's Number.prototype.toFixed: the exact binary value, a tie rounded away from 0."""
    return str(decimal.Decimal(v).quantize(decimal.Decimal(1).scaleb(-digits), rounding=decimal.ROUND_HALF_UP))


def unit_of(b):
    i = 0
    while i < len(IEC_UNITS) - 1 and abs(b) >= 1024 ** (i + 1):
        i += 1
    return IEC_UNITS[i], i


def iec(b):
    """units.ts `iec`: `160 MiB`, `64.0 MiB`, `8.00 GiB`, `512 B`, `n/a`."""
    if b is None:
        return "n/a"
    unit, p = unit_of(b)
    if p == 0:
        return f"{b} B"
    v = b / 1024 ** p
    a = abs(v)
    return f"{to_fixed(v, 0 if a >= 99.95 else 1 if a >= 9.995 else 2)}\u00a0{unit}"


def short(b, p):
    """units.ts `short`: one decimal below 10, none from 10, a whole number without `.0`."""
    v = b / 1024 ** p
    s = to_fixed(v, 1) if v < 10 else to_fixed(v, 0)
    return s[:-2] if s.endswith(".0") else s


def status_text(held_bytes, total):
    """units.ts `statusText`: the status bar's `GPU 3.2 / 8 GiB`."""
    if held_bytes is None and total is None:
        return "GPU n/a"
    if total is None:
        return f"GPU {iec(held_bytes)}"
    unit, p = unit_of(total)
    if held_bytes is None:
        return f"GPU n/a / {short(total, p)} {unit}"
    if 0 < held_bytes < 0.05 * 1024 ** p and p > 0:
        hu, hp = unit_of(held_bytes)
        return f"GPU {short(held_bytes, hp)} {hu} / {short(total, p)} {unit}"
    return f"GPU {short(held_bytes, p)} / {short(total, p)} {unit}"


def seen(text):
    """Text as a person reads it: a no-break space is a space, runs of white space one."""
    return " ".join((text or "").replace("\u00a0", " ").split()) if text is not None else None


def value_text(b, peak=None):
    """A figure's value as the panel writes it: its bytes, and its peak where above them."""
    t = iec(b)
    if peak is not None and b is not None and peak > b:
        t += f" peak {iec(peak)}"
    return seen(t)


def num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def record_texts(rec):
    """The panel's "now" rows for a record, as a user reads them: {row: value text}, every row
    the panel shows and no other (owners with bytes, every allocation, gpumem-nb's allocator
    where it holds memory, the CUDA pool where the record has one, NVML's process, the device)."""
    a = rec.get("allocator") or {}
    all_ = rec.get("all_allocations") or {}
    nvml = rec.get("nvml") or {}
    if num(nvml.get("device_free")) is not None and num(nvml.get("device_total")) is not None:
        free, total = nvml["device_free"], nvml["device_total"]
    else:
        free, total = num(rec.get("crate_device_free")), num(rec.get("crate_device_total"))
    out = {}
    for o in all_.get("by_owner") or []:
        if num(o.get("after")) and o["after"] > 0:
            out[f"owner:{o['owner']}"] = value_text(o["after"], num(o.get("peak")))
    out["all_allocations"] = value_text(num(all_.get("after")), num(all_.get("peak")))
    reserved = num((a.get("reserved") or {}).get("after"))
    if reserved:
        out["allocated"] = value_text(num((a.get("allocated") or {}).get("after")), num(a.get("peak_allocated")))
        out["reserved"] = value_text(reserved, num(a.get("peak_reserved")))
    if rec.get("pool"):
        pool = rec["pool"]
        out["pool"] = value_text(num((pool.get("used") or {}).get("after")), num(pool.get("used_high")))
    out["process"] = value_text(num((nvml.get("process") or {}).get("after")))
    out["device_free"] = value_text(free)
    out["device_total"] = value_text(total)
    return out


def record_status(rec):
    """The status bar's text for a record: what the process holds (NVML's bytes of it where more
    than 0, else every allocation, else gpumem-nb's reserved) over the device's total."""
    nvml = rec.get("nvml") or {}
    process = num((nvml.get("process") or {}).get("after"))
    all_after = num((rec.get("all_allocations") or {}).get("after"))
    reserved = num((((rec.get("allocator") or {}).get("reserved")) or {}).get("after"))
    if num(nvml.get("device_free")) is not None and num(nvml.get("device_total")) is not None:
        total = nvml["device_total"]
    else:
        total = num(rec.get("crate_device_total"))
    h = process if process else all_after if all_after is not None else reserved
    return status_text(h, total)


def site_text(site):
    """chart.ts `siteText`: `64.0 MiB  function (cell 3, line 4)`."""
    where = ""
    if site.get("cell") is not None:
        line = f", line {site['line']}" if site.get("line") else ""
        where = f" (cell {site['cell']}{line})"
    return seen(f"{iec(num(site.get('bytes')))}  {site.get('function') or site.get('owner') or 'unknown'}{where}")


def bar_of(rec):
    """A record's bar as a user reads it: (what it measures, after, peak, {component: bytes})."""
    all_ = rec.get("all_allocations") or {}
    after = num(all_.get("after"))
    if after is not None:
        parts = {c["component"]: c["after"] for c in all_.get("by_component") or [] if num(c.get("after")) and c["after"] > 0}
        return "all allocations", after, max(num(all_.get("peak")) or after, after), parts
    r = (rec.get("allocator") or {}).get("reserved") or {}
    if num(r.get("after")) is not None:
        return "reserved", r["after"], max(num((rec.get("allocator") or {}).get("peak_reserved")) or r["after"], r["after"]), {}
    return "no reading", 0, 0, {}


def axis_scale(axis):
    """The chart's scale as a user reads it off its axis: (the 0 line's y, pixels per byte), from
    the grid lines' rendered y and their labels' text (`512 MiB`, `1 GiB`); None when unreadable."""
    ticks = []
    for t in axis:
        label = seen(t.get("text"))
        if label is None:
            return None
        try:
            ticks.append((0 if label == "0" else text_bytes(label), t["y"]))
        except (ValueError, KeyError):
            return None
    zero = [y for v, y in ticks if v == 0]
    top = max(ticks, default=(0, 0))
    if not zero or top[0] <= 0:
        return None
    return zero[0], (zero[0] - top[1]) / top[0]


PX = 1.0  # how far (client pixels) a drawn edge may lie from where the record puts it


def check_bars(p, recs, where):
    """Each of this process's bars as drawn: its stack stands on the axis's 0 and is as tall as
    the record's bytes after the cell read on the axis, each component's block as tall as the
    record's bytes of that component, the peak's bar as tall as the record's peak; the budget
    line where the axis puts the record's budget. Bytes from the records, heights from the
    rendered boxes."""
    sc = axis_scale(p["axis"])
    check(sc is not None and sc[1] > 0, f"{where}: the chart's axis reads (its labels and grid lines)", p["axis"])
    if sc is None or sc[1] <= 0:
        return
    y0, k = sc
    # The axis itself: every labelled grid line where its label puts it.
    check(all(abs((y0 - t["y"]) - (0 if seen(t["text"]) == "0" else text_bytes(t["text"])) * k) <= PX for t in p["axis"]),
          f"{where}: the axis's grid lines are evenly spaced as labelled", p["axis"])
    by_cell = {r["cell"]: r for r in recs}
    bad = []
    for b in p["bars"]:
        rec = by_cell.get(b["cell"])
        if rec is None:
            bad.append((b["cell"], "no record"))
            continue
        _, after, peak, comps = bar_of(rec)
        d = b["drawn"]
        stack = d["stack"] or {"top": y0, "bottom": y0}
        got = {"stack": y0 - stack["top"], "base": stack["bottom"] - y0,
               "peak": (y0 - d["peak"]["top"]) if d["peak"] else 0.0}
        want = {"stack": after * k, "base": 0.0, "peak": peak * k}
        for part in d["parts"]:
            if part["part"] in comps:
                got[part["part"]] = part["box"]["height"]
                want[part["part"]] = comps[part["part"]] * k
        for c, v in comps.items():
            if c not in got:
                got[c], want[c] = None, v * k
        off = {x: (round(got[x], 2) if got[x] is not None else None, round(want[x], 2)) for x in want
               if got[x] is None or abs(got[x] - want[x]) > PX}
        if off:
            bad.append((b["cell"], off))
    check(not bad and sorted(by_cell) == sorted(b["cell"] for b in p["bars"]),
          f"{where}: each bar is drawn as tall as its record's bytes (after, peak, each component) on the chart's axis "
          f"({k * (1 << 20):.4f} px per MiB)", {"off (px drawn, px from the record)": bad,
                                                 "bars": [b["cell"] for b in p["bars"]], "records": sorted(by_cell)})
    budgets = [r.get("budget") for r in recs if num(r.get("budget"))]
    if budgets:
        b = budgets[-1]
        ys = [l["y"] for l in p["budgetLines"]]
        check(ys and abs((y0 - ys[-1]) - b * k) <= PX and seen(f"budget {iec(b)}") in [seen(t) for t in p["budgetLabels"]],
              f"{where}: the budget line is drawn at the record's budget ({seen(iec(b))}) on the axis, labelled so",
              {"line px above 0": [round(y0 - y, 2) for y in ys], "record px": round(b * k, 2), "labels": p["budgetLabels"]})


def bar_after(rec):
    all_ = rec.get("all_allocations") or {}
    if all_.get("after") is not None:
        return all_["after"]
    return ((rec.get("allocator") or {}).get("reserved") or {}).get("after") or 0


def check_figures(js, rec, where):
    """The panel shows the record's figures (exact bytes), and the status bar the same."""
    def shows_it():
        p = js("return gpumemPanelTest.panel()")
        return p if p and p["mode"] == "record" and p["cell"] == rec["cell"] else None
    p = wait(f"{where}: the panel to show cell {rec['cell']}'s record", shows_it, 15)
    want = expected(rec)
    got = {k: (p["figs"].get(k) or {}).get("bytes") for k in want}
    check(got == want, f"{where}: the panel's figures are cell [{rec['cell']}]'s record's", {"panel": got, "record": want})
    a = rec.get("allocator") or {}
    if want["allocated"] is not None:
        check((p["figs"].get("allocated") or {}).get("peak") == a.get("peak_allocated"),
              f"{where}: the allocated peak is the record's", (p["figs"].get("allocated"), a.get("peak_allocated")))
    own = owners(rec)
    shown = [(k[len("owner:"):], p["figs"][k]["bytes"]) for k in p["order"] if k.startswith("owner:")]
    check(shown == own and (not own or p["order"][0].startswith("owner:")),
          f"{where}: the figures lead with who holds the memory, the record's owners {own}", (p["order"], shown))
    texts = record_texts(rec)
    shown_texts = {k: seen(f["text"]) for k, f in p["figs"].items()}
    check(shown_texts == texts and all(f["shown"] for f in p["figs"].values()),
          f"{where}: the figures as the panel shows them read the record's, formatted as the panel formats them "
          f"({', '.join(f'{k} {v}' for k, v in texts.items())})",
          {"panel": shown_texts, "record": texts, "hidden": [k for k, f in p["figs"].items() if not f["shown"]]})
    st = js("return gpumemPanelTest.status()")
    check(st and st["bytes"] == held(rec) and st["total"] == want["device_total"],
          f"{where}: the status bar's bytes are the record's", (st, held(rec)))
    check(st and st["shown"] and seen(st["text"]) == seen(record_status(rec)),
          f"{where}: the status bar shows the record as `{record_status(rec)}`", (st and st["text"], record_status(rec)))
    return p


def settle(fn, cond, timeout, every=0.2):
    """Polls fn() until cond(value) holds or `timeout` seconds pass; returns the last value (the
    checks after it say what is wrong, rather than a time-out)."""
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if (v and cond(v)) or time.monotonic() > end:
            return v
        time.sleep(every)


def main():
    out = os.path.abspath(sys.argv[1])
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    work = tempfile.mkdtemp(prefix="gpumem-panel-")
    for d in ("config", "data", "runtime", "notebooks", "chrome"):
        os.makedirs(os.path.join(work, d))
    os.makedirs(os.path.join(work, "config", "labconfig"))
    json.dump({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}},
              open(os.path.join(work, "config", "labconfig", "page_config.json"), "w"))
    nbdir = os.path.join(work, "notebooks")
    json.dump(with_markdown(notebook(CELLS), FILL), open(os.path.join(nbdir, "panel.ipynb"), "w"), indent=1)
    json.dump(notebook(CELLS2), open(os.path.join(nbdir, "second.ipynb"), "w"), indent=1)
    json.dump(python_notebook(), open(os.path.join(nbdir, "python.ipynb"), "w"), indent=1)

    env = dict(os.environ)
    env.update({
        "JUPYTER_CONFIG_DIR": os.path.join(work, "config"),
        "JUPYTER_DATA_DIR": os.path.join(work, "data"),
        "JUPYTER_RUNTIME_DIR": os.path.join(work, "runtime"),
        "GPUMEM_NB_DEVICE": env.get("GPUMEM_NB_DEVICE", "sim:8GiB"),
    })
    env.pop("EVCXR_TMPDIR", None)
    listed = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"], env=env,
                            capture_output=True, text=True)
    lines = [ln for ln in (listed.stdout + listed.stderr).splitlines() if "gpumem-lab" in ln]
    check(any("enabled" in ln and "OK" in ln for ln in lines),
          "`jupyter labextension list` lists gpumem-lab, enabled and OK (a prebuilt extension)", lines)
    lab, port, lab_log = start_lab(nbdir, env, os.path.join(out, "jupyterlab.log"))
    driver = None
    t0 = time.monotonic()
    try:
        driver = open_browser(lab, port, lab_log, work, width=1400)
        driver.set_window_size(1400, 1000)
        driver.get(f"http://127.0.0.1:{port}/lab/tree/panel.ipynb")
        js = lambda code, *a: driver.execute_script(code, *a)  # noqa: E731
        shot = lambda name: driver.save_screenshot(os.path.join(out, name))  # noqa: E731
        wait("the notebook", lambda: js(
            "const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
            "return !!(w && w.content && w.content.widgets.length >= arguments[0])", len(CELLS)), 180)
        js(JS)
        wait("the kernel to be idle", lambda: js("return gpumemPanelTest.kernelStatus()") == "idle", 180)
        print(f"JupyterLab up, kernel idle after {time.monotonic() - t0:.1f} s")
        js("gpumemPanelTest.watch()")

        # ---- The panel opens from its tab in the right sidebar.
        tab = wait("the panel's tab in the right sidebar", lambda: driver.find_elements(
            By.CSS_SELECTOR, ".jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id='gpumem-lab-panel']"), 60)
        check(not js("const p = gpumemPanelTest.panel(); return p && p.visible"), "the panel is closed before its tab is clicked")
        tab[0].click()
        p = wait("the panel to open", lambda: (lambda p: p if p and p["visible"] else None)(js("return gpumemPanelTest.panel()")), 20)
        check(p["visible"], "the panel opens from its tab in the right sidebar")
        p = wait("the panel to know the kernel", lambda: (lambda p: p if p["state"] == "gpumem" else None)(
            js("return gpumemPanelTest.panel()")), 60)
        check(p["notebook"] == "panel.ipynb" and p["mode"] == "none",
              "on gpumem-kernel, before any cell: the panel follows panel.ipynb and waits for a first record", p)

        # ---- Cell by cell: the panel's figures are the cell's record.
        records = {}
        for i, what in ((DEP, "the :dep cell"), (ALLOC, "the allocating cell"), (FREE, "the freeing cell"),
                        (BUDGET, "the budget cell")):
            js("gpumemPanelTest.run(arguments[0])", i)
            rec = wait(f"{what}'s record", lambda: js("return gpumemPanelTest.record(arguments[0])", i),
                       900 if i == DEP else 120, every=0.3)
            wait("the kernel to be idle", lambda: js("return gpumemPanelTest.kernelStatus()") == "idle", 60)
            records[i] = rec
            if i == DEP:
                print(f"  :dep gpumem-nb took {rec['wall_ms'] / 1000:.1f} s")
                continue
            p = check_figures(js, rec, what)
            check(len(p["bars"]) == len(records) and [b["cell"] for b in p["bars"]] == sorted(r["cell"] for r in records.values()),
                  f"{what}: one bar per record", p["bars"])
            bar = next((b for b in p["bars"] if b["cell"] == rec["cell"]), None)
            check(bar is not None and bar["after"] == bar_after(rec) and sum(x[1] for x in bar["parts"]) == bar_after(rec),
                  f"{what}: its bar's parts add up to the record's bytes after it", (bar, bar_after(rec)))
            check_bars(p, list(records.values()), what)
        alloc_rec, free_rec, budget_rec = records[ALLOC], records[FREE], records[BUDGET]
        comps = {c["component"]: c for c in (alloc_rec.get("all_allocations") or {}).get("by_component", [])}
        bar = next(b for b in js("return gpumemPanelTest.panel()")["bars"] if b["cell"] == alloc_rec["cell"])
        parts = dict(bar["parts"])
        check(parts.get("parameter") == comps.get("parameter", {}).get("after") and parts.get("activation") == comps.get("activation", {}).get("after")
              and parts.get("parameter"), "the allocating cell's bar is stacked by component (parameter, activation) as its record says",
              (parts, comps))
        check(expected(free_rec)["allocated"] < expected(alloc_rec)["allocated"],
              "the freeing cell's figure fell below the allocating cell's", (expected(free_rec), expected(alloc_rec)))
        p = js("return gpumemPanelTest.panel()")
        check(budget_rec.get("budget") == GIB and p["budgets"] and p["budgets"][-1] == budget_rec.get("budget"),
              "after `%gpumem budget 1GiB`: the record's budget is 1 GiB and the chart's budget line is at it",
              (budget_rec.get("budget"), p["budgets"]))
        shot("01_after_budget.png")

        # ---- The long cell: the live figure moves.
        js("gpumemPanelTest.run(arguments[0])", LONG)
        panel_live, output_live, live_bars = [], set(), []
        panel_live_text, output_live_text, live_drawn = [], set(), []

        def poll():
            s = js("return {p: gpumemPanelTest.panel(), o: gpumemPanelTest.liveInOutput(arguments[0]), "
                   "r: gpumemPanelTest.record(arguments[0])}", LONG)
            if s["o"]:
                o = s["o"]
                output_live.add(json.dumps({k: o.get(k) for k in ("allocated", "reserved", "all_allocations")}))
                # The live line's figures as the panel would write them (gpumem-nb's rows only
                # where it holds memory).
                output_live_text.add(json.dumps({
                    "all_allocations": value_text(num(o.get("all_allocations")), num(o.get("all_allocations_peak"))),
                    "allocated": value_text(num(o.get("allocated")), num(o.get("peak_allocated"))) if o.get("reserved") else None,
                    "reserved": value_text(num(o.get("reserved")), num(o.get("peak_reserved"))) if o.get("reserved") else None}))
            p = s["p"]
            if p["mode"] == "live":
                v = {k: (p["figs"].get(k) or {}).get("bytes") for k in ("allocated", "reserved", "all_allocations")}
                vt = {k: seen((p["figs"].get(k) or {}).get("text")) for k in ("all_allocations", "allocated", "reserved")}
                if not panel_live_text or panel_live_text[-1] != vt:
                    panel_live_text.append(vt)
                bar = js("return gpumemPanelTest.liveBar()")
                if bar and s["o"] and bar["cell"] == s["o"].get("cell"):
                    live_bars.append((bar["now"], s["o"].get("all_allocations")))
                    sc = axis_scale(bar["axis"])
                    if sc and bar["drawn"]:
                        # The running bar's height read on the axis, in bytes; and how far it is
                        # (pixels) from the live line's figure.
                        live_drawn.append((round(bar["drawn"]["height"] / sc[1]), s["o"].get("all_allocations"),
                                           abs(bar["drawn"]["height"] - s["o"]["all_allocations"] * sc[1])
                                           + abs(bar["drawn"]["bottom"] - sc[0])))
                if not panel_live or panel_live[-1] != v:
                    panel_live.append(v)
                    if len(panel_live) == 3:
                        shot("02_live.png")
            return s["r"]
        long_rec = wait("the long cell's record", poll, 120, every=0.12)
        wait("the kernel to be idle", lambda: js("return gpumemPanelTest.kernelStatus()") == "idle", 60)
        records[LONG] = long_rec
        allocated_seen = [v["allocated"] for v in panel_live]
        changes = sum(1 for a, b in zip(allocated_seen, allocated_seen[1:]) if a != b)
        print(f"  live: the panel showed allocated {allocated_seen}")
        check(changes >= 2, f"during the long cell the panel's live allocated figure changed at least twice ({changes})", panel_live)
        check(panel_live and all(json.dumps(v) in output_live for v in panel_live),
              "every live figure the panel showed is one the live line's figures held", (panel_live, output_live))
        check(live_bars and any(now == held for now, held in live_bars) and len({now for now, _ in live_bars}) >= 2,
              "while it runs, the chart has a bar for the cell that grows, at the live reading's every allocation",
              live_bars[-5:])
        print(f"  live: the panel read {[t['all_allocations'] for t in panel_live_text]}")
        check(len(panel_live_text) >= 3 and all(json.dumps(t) in output_live_text for t in panel_live_text),
              "every live figure the panel showed reads as one the live line held, formatted as the panel formats it",
              (panel_live_text, output_live_text))
        check(live_drawn and any(off <= PX for _, _, off in live_drawn) and len({b for b, _, _ in live_drawn}) >= 2,
              "the running bar is drawn, on the chart's axis, as tall as the live reading's every allocation, and grows",
              live_drawn[-6:])
        check(js("return gpumemPanelTest.liveBar()") is None, "the running bar is gone once the cell's record came")
        p = check_figures(js, long_rec, "the long cell")
        check_bars(p, list(records.values()), "the long cell")
        check(all(js("return gpumemPanelTest.reports(arguments[0])", i) == 1 for i in (ALLOC, FREE, BUDGET, LONG)),
              "each cell's own report line is still under it (the panel adds, it does not replace)")

        # ---- Hover and click: the bar of the allocating cell, scrolled out of view.
        n = js("return gpumemPanelTest.nb().content.widgets.length")
        js("const nb = gpumemPanelTest.nb().content; nb.activeCellIndex = arguments[0]; nb.scrollToItem(arguments[0], 'start');", n - 1)
        time.sleep(1.0)
        check(not js("return gpumemPanelTest.inView(arguments[0])", ALLOC), "before the click, the allocating cell is out of view")
        check(js("return gpumemPanelTest.nb().content.activeCellIndex") == n - 1, "before the click, the last cell is active")
        bar_el = driver.find_element(By.CSS_SELECTOR, f"#gpumem-lab-panel g.gpumem-bar[data-cell='{alloc_rec['cell']}'] .gpumem-bar-hit")
        ActionChains(driver).move_to_element(bar_el).perform()
        time.sleep(0.5)
        hp = js("return gpumemPanelTest.panel()")
        hover = hp["hover"]
        # What the record says the hover shows: its cell and first line, what the bar measures,
        # its top sites (bytes, function or owner, cell and line), written as the panel writes them.
        top_sites = (alloc_rec.get("all_allocations") or {}).get("top") or []
        top_name = (top_sites[0].get("function") or top_sites[0].get("owner") or "") if top_sites else ""
        want_sites = [site_text(t) for t in top_sites[:3]]
        quantity, after, peak, _ = bar_of(alloc_rec)
        budget = num(alloc_rec.get("budget"))
        want_head = seen(f"[{alloc_rec['cell']}] {alloc_rec.get('first_line') or ''}")
        want_q = seen(f"{quantity}: peak {iec(peak)}, after {iec(after)}" + (f", budget {iec(budget)}" if budget is not None else ""))
        check(top_sites and top_name, "the allocating cell's record names a top site (a function or an owner)", top_sites)
        check(hover and hover["shown"] and hover["cell"] == str(alloc_rec["cell"]) and [seen(h) for h in hover["head"]] == [want_head]
              and want_q in [seen(x) for x in hover["lines"]],
              f"hovering the allocating cell's bar shows its cell `{want_head}` and `{want_q}`", (hover, want_head, want_q))
        check(hover and want_sites and [seen(x) for x in hover["sites"]] == want_sites and top_name and top_name in hover["sites"][0],
              f"and its top sites, the record's, the first `{want_sites[0] if want_sites else None}`",
              {"hover": hover and hover["sites"], "record": want_sites})
        title = next((b["title"] for b in hp["bars"] if b["cell"] == alloc_rec["cell"]), "")
        title_lines = [seen(x) for x in title.split("\n")]
        title_sites = title_lines[title_lines.index("top sites:") + 1:][:len(want_sites)] if "top sites:" in title_lines else []
        check(title_lines[0] == want_head and want_q in title_lines and want_sites and title_sites == want_sites,
              "its tooltip (the bar's title) says the same: cell, measure, the record's top sites", (title_lines, want_sites))
        shot("03_hover.png")
        bar_el.click()
        wait("the allocating cell to be active", lambda: js("return gpumemPanelTest.nb().content.activeCellIndex") == ALLOC, 10)
        time.sleep(1.0)
        check(js("return gpumemPanelTest.nb().content.activeCellIndex") == ALLOC, "clicking its bar selects the allocating cell")
        check(js("return gpumemPanelTest.inView(arguments[0])", ALLOC), "and brings it into view")
        p = js("return gpumemPanelTest.panel()")
        check([b["cell"] for b in p["bars"] if b["selected"]] == [alloc_rec["cell"]], "its bar is drawn selected", p["bars"])

        # ---- Screenshots: light and dark at 1400 px, the allocating cell's bar hovered.
        last_rec = long_rec
        ActionChains(driver).move_to_element(driver.find_element(
            By.CSS_SELECTOR, f"#gpumem-lab-panel g.gpumem-bar[data-cell='{alloc_rec['cell']}'] .gpumem-bar-hit")).perform()
        for theme, name in (("JupyterLab Light", "light"), ("JupyterLab Dark", "dark")):
            set_theme(js, theme)
            driver.set_window_size(1400, 1000)
            time.sleep(1.2)
            shot(f"panel_{name}_1400.png")
            driver.find_element(By.ID, "gpumem-lab-panel").screenshot(os.path.join(out, f"panel_only_{name}.png"))
            p = js("return gpumemPanelTest.panel()")
            bg = js("return getComputedStyle(document.getElementById('gpumem-lab-panel')).backgroundColor")
            lum = js("const c = arguments[0].match(/\\d+/g).map(Number); return (0.2126*c[0] + 0.7152*c[1] + 0.0722*c[2]) / 255", bg)
            check((lum > 0.7) if name == "light" else (lum < 0.3), f"{name}: the panel's background follows the theme ({bg})")
            check(expected(last_rec) == {k: (p["figs"].get(k) or {}).get("bytes") for k in expected(last_rec)},
                  f"{name}: the figures unchanged by the theme")
            check({k: seen(f["text"]) for k, f in p["figs"].items()} == record_texts(last_rec) and all(f["shown"] for f in p["figs"].values()),
                  f"{name}: the figures as shown still read the last record's",
                  ({k: f["text"] for k, f in p["figs"].items()}, record_texts(last_rec)))
        set_theme(js, "JupyterLab Light")
        first_figs = {k: (p["figs"].get(k) or {}).get("bytes") for k in expected(last_rec)}

        # ---- A second notebook on its own kernel.
        js("window.jupyterapp.commands.execute('docmanager:open', {path: 'second.ipynb'})")
        wait("the second notebook", lambda: js(
            "const w = window.jupyterapp.shell.currentWidget; return !!(w && w.context && w.context.path === 'second.ipynb' "
            "&& w.content.widgets.length >= 2)"), 120)
        wait("the second notebook's kernel to be idle", lambda: js("return gpumemPanelTest.kernelStatus()") == "idle", 180)
        js("gpumemPanelTest.watch()")
        js("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        rec2 = wait("the second notebook's last record", lambda: js("return gpumemPanelTest.record(1)"), 900, every=0.5)
        wait("the second kernel to be idle", lambda: js("return gpumemPanelTest.kernelStatus()") == "idle", 60)
        p2 = check_figures(js, rec2, "the second notebook")
        check_bars(p2, [js("return gpumemPanelTest.record(0)"), rec2], "the second notebook")
        p1k = p["kernelId"]
        check(p2["notebook"] == "second.ipynb" and p2["kernelId"] and p2["kernelId"] != p1k,
              "the panel follows the second notebook and its own kernel", (p2["notebook"], p2["kernelId"], p1k))
        second_figs = {k: (p2["figs"].get(k) or {}).get("bytes") for k in expected(rec2)}
        check(second_figs["allocated"] != first_figs["allocated"] and len(p2["bars"]) == 2,
              "the second notebook's figures and history are its own, not the first's", (second_figs, first_figs, p2["bars"]))
        ActionChains(driver).move_to_element(driver.find_element(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")).perform()
        time.sleep(0.3)
        shot("04_second_notebook.png")
        js("const w = gpumemPanelTest.byPath('panel.ipynb'); window.jupyterapp.shell.activateById(w.id);")
        wait("the first notebook to be active", lambda: js("return window.jupyterapp.shell.currentWidget.context.path") == "panel.ipynb", 10)
        check_figures(js, last_rec, "back on the first notebook")
        p = js("return gpumemPanelTest.panel()")
        check(p["notebook"] == "panel.ipynb" and p["kernelId"] == p1k and len(p["bars"]) == len(records),
              "back on the first notebook: its kernel and its history again", (p["notebook"], len(p["bars"])))

        # ---- The page sent the kernels nothing of the panel's: no comm, no request of its own.
        sent = js("return gpumemPanelTest.sent")
        print(f"  messages the page sent: { {k: sorted(set(v)) for k, v in sent.items()} }")
        check(sent.get("panel.ipynb") and sent.get("second.ipynb") and all(set(v) <= {"execute_request", "kernel_info_request"} for v in sent.values()),
              "the page sent the kernel only JupyterLab's own requests (execute, kernel_info): the panel sends nothing", sent)

        # ---- Reopened: the history from the saved outputs.
        js("return window.jupyterapp.commands.execute('docmanager:save')")
        wait("panel.ipynb saved", lambda: not js("return gpumemPanelTest.nb().context.model.dirty"), 20)
        js("gpumemPanelTest.nb().dispose()")
        time.sleep(1.0)
        js("window.jupyterapp.commands.execute('docmanager:open', {path: 'panel.ipynb'})")
        wait("panel.ipynb again", lambda: js(
            "const w = window.jupyterapp.shell.currentWidget; return !!(w && w.context && w.context.path === 'panel.ipynb' "
            "&& w.content.widgets.length >= arguments[0])", len(CELLS)), 60)
        p = wait("the reopened notebook's history", lambda: (lambda p: p if p["state"] == "gpumem" and p["bars"] else None)(
            js("return gpumemPanelTest.panel()")), 60)
        saved = sorted(r["cell"] for r in records.values())
        check([b["cell"] for b in p["bars"]] == saved and p["mode"] == "record" and p["cell"] == max(saved),
              "reopened, the panel shows the history from the notebook's saved outputs", (p["bars"], saved))
        check({k: (p["figs"].get(k) or {}).get("bytes") for k in expected(last_rec)} == expected(last_rec),
              "reopened, its figures are the last saved record's")
        check({k: seen(f["text"]) for k, f in p["figs"].items()} == record_texts(last_rec),
              "reopened, its figures as shown read the last saved record's",
              ({k: f["text"] for k, f in p["figs"].items()}, record_texts(last_rec)))
        check_bars(p, list(records.values()), "reopened")

        # ---- An out-of-memory cell: marked in the chart, in the list of failed cells, on its line.
        t_sessions = time.monotonic()
        js("gpumemPanelTest.run(arguments[0])", OOM)
        oom_rec = wait("the out-of-memory cell's record", lambda: js("return gpumemPanelTest.record(arguments[0])", OOM),
                       120, every=0.3)
        wait("the kernel to be idle", lambda: js("return gpumemPanelTest.kernelStatus()") == "idle", 60)
        asked = "out of memory: asked for 200.00 GiB"
        check(oom_rec.get("status") == "oom" and (oom_rec.get("oom") or {}).get("requested") == 200 << 30,
              "the out-of-memory cell's record: status oom, 200 GiB asked for",
              {k: oom_rec.get(k) for k in ("status", "oom")})
        p = settle(lambda: js("return gpumemPanelTest.panel()"), lambda p: p["cell"] == oom_rec["cell"], 15)
        bar = next((b for b in p["bars"] if b["cell"] == oom_rec["cell"]), None)
        check(bar is not None and bar["status"] == "oom" and bar["outline"] and bar["mark"] == "✗"
              and asked in bar["title"].replace("\u00a0", " "),
              f"its bar [{oom_rec['cell']}]: outlined in the error colour, a ✗ above it, its tooltip says `{asked}`", bar)
        check(all(not b["outline"] and not b["mark"] for b in p["bars"] if b["cell"] != oom_rec["cell"]),
              "no other bar is marked failed", [(b["cell"], b["status"]) for b in p["bars"]])
        check(any(f"[{oom_rec['cell']}]" in t and asked in t.replace("\u00a0", " ") for t in p["failed"]),
              "the panel's list of failed cells names it and what it asked for", p["failed"])
        check(asked in p["statusLine"].replace("\u00a0", " "), "the panel's line of the last cell says it", p["statusLine"])
        shot("06_oom.png")

        # ---- Kernel > Restart: a new notebook process; the old one's bars apart, labelled.
        old_recs = list(records.values()) + [oom_rec]
        old_cells = sorted(r["cell"] for r in old_recs)
        old_pid = oom_rec.get("child_pid")
        check(old_pid and all(r.get("child_pid") == old_pid for r in old_recs) and p["pid"] == old_pid,
              "before the restart: every record and the panel name one notebook process", (p["pid"], old_pid))
        t_restart = time.monotonic()
        js("const k = gpumemPanelTest.nb().sessionContext.session.kernel; gpumemPanelTest.statuses = [];"
           "k.statusChanged.connect((_, s) => gpumemPanelTest.statuses.push(s));")
        js("window.jupyterapp.commands.execute('kernelmenu:restart')")
        accept = wait("Kernel > Restart's dialog", lambda: driver.find_elements(
            By.CSS_SELECTOR, ".jp-Dialog .jp-Dialog-button.jp-mod-accept"), 20)
        accept[0].click()
        wait("the kernel to restart and be idle", lambda: js(
            "const s = gpumemPanelTest.statuses; return s.includes('restarting') && s[s.length - 1] === 'idle'"), 120)
        p = settle(lambda: js("return gpumemPanelTest.panel()"), lambda p: p["mode"] == "none", 15)
        print(f"  restarted in {time.monotonic() - t_restart:.1f} s: {p['process']!r} / {p['statusLine']!r}")
        check(not p["bars"] and sorted(b["cell"] for b in p["previous"]) == old_cells and "previous process" in p["groups"],
              "after Kernel > Restart: no bar of the new process yet; the old process's bars apart, labelled previous process",
              (p["bars"], [b["cell"] for b in p["previous"]], p["groups"]))
        check(p["mode"] == "none" and "Nothing held" in p["statusLine"] and not p["figs"],
              "the panel says the new process holds nothing (no figure of the old one)", (p["mode"], p["statusLine"], p["figs"]))
        st = js("return gpumemPanelTest.status()")
        check(st and st["shown"] and st["text"] == "GPU: nothing held", "the status bar says the new process holds nothing", st)
        shot("07_restarted.png")
        new = {}
        for i, what in ((DEP, "the :dep cell"), (ALLOC, "the allocating cell")):
            js("gpumemPanelTest.run(arguments[0])", i)
            new[i] = wait(f"{what}'s record from the new process", lambda: (lambda r: r if r and r.get("child_pid") != old_pid else None)(
                js("return gpumemPanelTest.record(arguments[0])", i)), 600, every=0.3)
            wait("the kernel to be idle", lambda: js("return gpumemPanelTest.kernelStatus()") == "idle", 60)
        new_pid = new[ALLOC].get("child_pid")
        check(new[DEP]["cell"] == 1 and new[ALLOC]["cell"] == 2 and new_pid and new[DEP].get("child_pid") == new_pid,
              "the new process numbers its cells from [1] again", {i: (r["cell"], r.get("child_pid")) for i, r in new.items()})
        p = check_figures(js, new[ALLOC], "after the restart, the allocating cell")
        check_bars(p, list(new.values()), "after the restart")
        check({b["cell"]: b["after"] for b in p["bars"]} == {r["cell"]: bar_after(r) for r in new.values()},
              "the new session's bars are its own two cells [1] and [2], at their records' bytes",
              (p["bars"], {r["cell"]: bar_after(r) for r in new.values()}))
        check(sorted(b["cell"] for b in p["previous"]) == old_cells and {b["key"] for b in p["previous"]}.isdisjoint(b["key"] for b in p["bars"]),
              "the old process's [1] and [2] stay apart, not replaced by the new ones", p["previous"])
        check(p["pid"] == new_pid, "the panel names the process the new records name", (p["pid"], new_pid))
        shot("08_new_process.png")

        # ---- A page reload: the live kernel's figures, not the saved outputs' newest record.
        js("return window.jupyterapp.commands.execute('docmanager:save-all')")
        wait("every notebook saved", lambda: js(
            "return gpumemPanelTest.notebooks().every(w => !w.context || !w.context.model || !w.context.model.dirty)"), 30)
        t_reload = time.monotonic()
        driver.refresh()
        wait("the notebook after the reload", lambda: js(
            "const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
            "return !!(w && w.content && w.context.path === 'panel.ipynb' && w.content.widgets.length >= arguments[0])", len(CELLS)), 180)
        js(JS)
        wait("the kernel to be idle", lambda: js("return gpumemPanelTest.kernelStatus()") == "idle", 60)
        if not js("const p = gpumemPanelTest.panel(); return p && p.visible"):
            wait("the panel's tab", lambda: driver.find_elements(
                By.CSS_SELECTOR, ".jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id='gpumem-lab-panel']"), 60)[0].click()
        p = settle(lambda: js("return gpumemPanelTest.panel()"),
                   lambda p: p["state"] == "gpumem" and p["cell"] == new[ALLOC]["cell"] and p["previous"], 30)
        print(f"  reloaded in {time.monotonic() - t_reload:.1f} s: the panel shows {p['mode']} [{p['cell']}], "
              f"{len(p['bars'])} bars of this process, {len(p['previous'])} of the previous one")
        want = expected(new[ALLOC])
        got = {k: (p["figs"].get(k) or {}).get("bytes") for k in want}
        check(p["mode"] == "record" and p["cell"] == new[ALLOC]["cell"] and got == want,
              f"after the reload the panel shows the live process's newest record [{new[ALLOC]['cell']}], "
              f"not the saved outputs' newest ([{oom_rec['cell']}], the old process's)", {"panel": got, "live": want, "cell": p["cell"]})
        check(sorted(b["cell"] for b in p["bars"]) == [1, 2]
              and sorted(b["cell"] for b in p["previous"]) == sorted(r["cell"] for r in old_recs if r["cell"] > 2)
              and "previous process" in p["groups"] and p["pid"] == new_pid,
              "after the reload: this process's bars [1] and [2]; the old process's saved records apart, labelled previous process",
              (p["bars"], p["previous"], p["groups"], p["pid"]))
        check({k: seen(f["text"]) for k, f in p["figs"].items()} == record_texts(new[ALLOC]),
              "after the reload the figures as shown read the live process's newest record",
              ({k: f["text"] for k, f in p["figs"].items()}, record_texts(new[ALLOC])))
        st = js("return gpumemPanelTest.status()")
        check(st and st["shown"] and st["bytes"] == held(new[ALLOC]), "after the reload the status bar reads the live process",
              (st, held(new[ALLOC])))
        check(st and seen(st["text"]) == seen(record_status(new[ALLOC])),
              f"after the reload the status bar shows `{record_status(new[ALLOC])}`", (st and st["text"], record_status(new[ALLOC])))
        shot("09_reloaded.png")
        shown_figs, shown_status = p["figs"], st
        # The live kernel's own answer: what the process held when the next cell started.
        js("gpumemPanelTest.run(arguments[0])", QUIET)
        q = wait("the next cell's record", lambda: js("return gpumemPanelTest.record(arguments[0])", QUIET), 120, every=0.3)
        wait("the kernel to be idle", lambda: js("return gpumemPanelTest.kernelStatus()") == "idle", 60)
        qa, qall, qnv = q.get("allocator") or {}, q.get("all_allocations") or {}, q.get("nvml") or {}
        before = {"all_allocations": qall.get("before"), "process": (qnv.get("process") or {}).get("before")}
        if "allocated" in shown_figs:
            before["allocated"] = (qa.get("allocated") or {}).get("before")
            before["reserved"] = (qa.get("reserved") or {}).get("before")
        for k, v in owners(q, "before"):
            before[f"owner:{k}"] = v
        shown = {k: (shown_figs.get(k) or {}).get("bytes") for k in before}
        print(f"  after the reload the panel showed {shown}; the next cell started with {before}")
        check(q.get("child_pid") == new_pid and shown == before and before["all_allocations"] is not None,
              "the figures the panel showed after the reload are what the live process held when the next cell started "
              "(its record's before-values)", {"panel": shown, "kernel": before})
        shown_text = {k: seen((shown_figs.get(k) or {}).get("text") or "").split(" peak ")[0] for k in before}
        want_text = {k: seen(iec(v)) for k, v in before.items()}
        check(shown_text == want_text, f"and so is their text ({want_text})", {"panel": shown_text, "kernel": want_text})
        held_before = before["process"] if before["process"] else before["all_allocations"]
        want_status = status_text(held_before, expected(q)["device_total"])
        st = js("return gpumemPanelTest.status()")
        check(shown_status["bytes"] == held_before and seen(shown_status["text"]) == seen(want_status),
              f"the status bar after the reload read what the process held then, `{want_status}` "
              f"(after the next cell: {st['text']})", (shown_status, held_before, want_status))

        # ---- `%gpumem restart`: a fresh notebook process in the same kernel, no record of its own.
        js("gpumemPanelTest.run(arguments[0])", RESTART)
        p = settle(lambda: js("return gpumemPanelTest.panel()"), lambda p: p["mode"] == "none" and p["pid"] not in (None, new_pid), 60)
        wait("the kernel to be idle", lambda: js("return gpumemPanelTest.kernelStatus()") == "idle", 60)
        st = js("return gpumemPanelTest.status()")
        check(p["mode"] == "none" and p["pid"] and p["pid"] != new_pid and "Nothing held" in p["statusLine"] and not p["bars"]
              and st["text"] == "GPU: nothing held",
              "after `%gpumem restart` the panel and the status bar say the fresh process holds nothing, before any record",
              (p["mode"], p["pid"], p["statusLine"], st["text"]))
        check(sorted(b["cell"] for b in p["previous"]) == sorted([r["cell"] for r in old_recs if r["cell"] > 2] + [1, 2, q["cell"]])
              and "previous processes" in p["groups"],
              "the two earlier processes' bars are apart, labelled previous processes", (p["previous"], p["groups"]))
        shot("10_gpumem_restart.png")

        # ---- No live kernel: the saved records, labelled as saved.
        js("return window.jupyterapp.commands.execute('docmanager:save')")
        wait("panel.ipynb saved", lambda: not js("return gpumemPanelTest.nb().context.model.dirty"), 20)
        js("return gpumemPanelTest.nb().sessionContext.shutdown()")
        p = settle(lambda: js("return gpumemPanelTest.panel()"), lambda p: p["state"] == "none" and p["mode"] == "saved", 30)
        saved_cells = sorted(r["cell"] for r in js("return gpumemPanelTest.nb().content.widgets.map((w, i) => w.model.type === 'code' ? gpumemPanelTest.record(i) : null)"
                                                   ".filter(r => r)"))
        check(p["state"] == "none" and p["mode"] == "saved" and "Saved outputs" in p["process"] and not p["bars"]
              and "saved outputs" in p["groups"] and set(saved_cells) <= {b["cell"] for b in p["previous"]},
              "with its kernel shut down, the panel shows the saved records labelled as saved outputs, not as figures of now",
              (p["state"], p["mode"], p["process"], p["groups"], saved_cells, [b["cell"] for b in p["previous"]]))
        st = js("return gpumemPanelTest.status()")
        check(st is None or not st["shown"], "and the status item hides", st)
        shot("11_no_kernel.png")
        print(f"  out of memory, restarts, reload, no kernel: {time.monotonic() - t_sessions:.0f} s")

        # ---- A notebook on another kernel: the panel says so, the status item hides.
        js("window.jupyterapp.commands.execute('docmanager:open', {path: 'python.ipynb'})")
        wait("the python notebook", lambda: js(
            "const w = window.jupyterapp.shell.currentWidget; return !!(w && w.context && w.context.path === 'python.ipynb')"), 60)
        p = wait("the panel to say the kernel is not gpumem-kernel", lambda: (lambda p: p if p["state"] == "other" else None)(
            js("return gpumemPanelTest.panel()")), 120)
        print(f"  python notebook: {p['message']}")
        check(p["message"] and "not gpumem-kernel" in p["message"] and "Python" in p["message"] and "\n" not in p["message"]
              and not p["nowShown"] and not p["historyShown"],
              "on a python kernel the panel says, in one line, that the kernel (named) is not gpumem-kernel, and nothing else", p)
        st = js("return gpumemPanelTest.status()")
        check(st is None or not st["shown"], "on a python kernel the status item is hidden", st)
        js("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        time.sleep(3.0)
        shot("05_python_kernel.png")
        driver.find_element(By.ID, "gpumem-lab-panel").screenshot(os.path.join(out, "panel_only_python.png"))

        # ---- The console: nothing from the extension.
        logs = driver.get_log("browser")
        bad = [entry for entry in logs if entry.get("level") == "SEVERE"]
        check(not bad, f"no error in the browser's console ({len(logs)} console entries)", bad)
        with open(os.path.join(out, "console.log"), "w") as f:
            for entry in logs:
                f.write(f"{entry.get('level')} {entry.get('message')}\n")

        if FAILURES:
            raise Failed(f"{len(FAILURES)} checks failed:\n  " + "\n  ".join(f[:300] for f in FAILURES))
        print(f"PASS: the gpumem-lab panel in JupyterLab, {CHECKS[0]} checks in {time.monotonic() - t0:.0f} s; screenshots in {out}")
    except Failed as e:
        report_failure(driver, out, e)
        return 1
    finally:
        close(driver, lab)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
