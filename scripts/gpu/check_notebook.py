#!/usr/bin/env python3
"""Checks an executed notebook's per-cell reports against the crate's own numbers and NVML.

    check_notebook.py EXECUTED.ipynb [--require-tracking cupti] [--json OUT.json] [--no-lines] [--stock]
                      [--corpus] [--oom] [--variant dep] [--summary FILE --label NAME]
                      [--kernel-exit N] [--seconds S]
    check_notebook.py --self-test

For every code cell it prints the report line and, where the record has them, the allocator's
reserved delta, the CUDA pool's reserved delta, the tracked ("all allocations") delta, NVML's
per-process delta, and what of NVML's delta the tracked allocations do not explain.

Assertions (exit 1 when one fails). A figure a tag's check reads that the record lacks is a
failure that says MISSING, never a pass; so is a tag naming nothing (`top-names=`, `site=`,
`line-has=` with an empty value), and a notebook with no report at all:
- every code cell that ran code has exactly one report, and no cell errored (unless tagged
  `raises-exception`);
- with --require-tracking, every report after the crate loaded says that tracking mode, and at
  least one report says the crate loaded (else no report's tracking was checked);
- cells tagged `returns-allocated` / `returns-reserved` / `returns-pool-used` / `returns-ooms`:
  the value the cell returned (the crate asked directly) equals the report's number;
- cells tagged `site=FUNCTION[@LINE]` (issue 19): the record's `top` has an entry whose
  function is FUNCTION (or starts with it when it ends in `::`), in this cell at LINE when given;
  with --no-lines (the stock kernel, which cannot know cell lines) only the function is checked;
- cells tagged `top-names=A,B`: the cell's value (`gpumem_nb::tracking::top(n)`) names each of A, B;
- cells tagged `returns=VALUE`: the cell's value is VALUE (as a number when both are numbers);
  `cubecl-in-use-falls=MIB`: cubecl's in-use bytes fell by at least MIB in the cell (issue 35:
  the server `watch` reads in that cell holds what an earlier cell made);
- cells tagged `nvml-matches`: NVML's per-process delta equals what the process reserved
  according to the crate (allocator reserved delta + CUDA pool reserved delta + tracked driver,
  VMM and managed allocations) within the driver's 2 MiB granularity.
- cells tagged `cubecl-pools` (issue 22): the record carries cubecl's own books (`frameworks`)
  with numbers after the cell, and in use + padding + cached = reserved;
- cells tagged `cubecl-matches-tracked`: the tracked allocations' delta from the driver and the
  CUDA pool (cubecl 0.10 takes its pages with `cuMemAllocAsync`, falling back to `cuMemAlloc`)
  equals cubecl's reserved delta within 2 MiB: cubecl's pages are what tracking saw;
- cells tagged `growth=live` / `growth=reserve`: the record warns of a re-run leak that cubecl's
  books put in live tensors / in cubecl's cached reserve; `no-growth`: no re-run leak warning.

- cells tagged `child-process=NAME` (issue 23): the cell printed `worker PID …`; its record's
  `children` lists that PID, named NAME, from NVML, holding at least 256 MiB, and the notebook's
  own allocated bytes did not move in that cell; `no-children`: the record lists no child.

- several GPUs (issue 46): `devices-nvml=N`: the record has NVML's figures for N devices, each
  matched to its CUDA device; `line-has=TEXT`: the line says TEXT (`cuda:1`);
  `nvml-explained-each=PCT`: on every device, NVML's change minus the tracked change there is
  within PCT % of NVML's change (or 2 MiB); `nvml-named-each`: the details explain NVML's change on
  each other device (the driver's kernel stacks there counted: `stacks-named`); `nccl-named`: on both devices a top site is owned by `libnccl…`, component
  `workspace`, and the report says NCCL.

- kernel stacks (issue 46): `stacks-named`: the record's `local_memory` says the driver's stacks
  for kernels grew on the notebook's device in the cell (each thread's stack before and after,
  times the threads the device holds); `nvml-explained=PCT`: NVML's change on the notebook's
  device minus the tracked change, the CUDA pool's cache and the kernel stacks is within PCT % of
  NVML's change (or 2 MiB).

- cells tagged `context-lost=CODE` (issue 34): the cell ended in an error named CODE whose value
  says the CUDA context is lost, its record's status is `lost` and its line says
  `✗ CUDA context lost`; `after-loss=CODE`: a later cell's device call failed with an error naming
  CODE whose traceback says where the context was lost and names `%gpumem restart`;
  `host-after-loss`: a later cell's host code ran (status ok, its line says host code runs);
  `restarted`: the record says the child was restarted before it; `history-lost`: the history
  table's row of the lost cell flags it.
- cells tagged `queued-lands` (issue 32): the tracked delta from the driver and the CUDA pool
  covers what cubecl holds after the cell (in use + cached), within 2 MiB a page, and the
  record says nothing failed to settle; `parts-add-up`: NVML's per-process delta is tracked +
  the CUDA pool's cache + the named rest (context and modules), and the rest is within
  [-2 MiB, 2 MiB] unless the cell launched a kernel for the first time (tag `first-launches`:
  rest ≥ -2 MiB only); `top-cells-cubecl`: in the cell's `%gpumem top` table, every row whose
  site is cubecl's names the cell that queued it (`← cell N`).

- cells tagged `components-add-up` (issue 33): the record's `all_allocations.by_component`
  adds up to every tracked byte after the cell and before it; `component-delta=NAME:SPEC` /
  `component-after=NAME:SPEC` / `component-peak=NAME:SPEC` / `component-rise=NAME:SPEC`:
  component NAME's change over the cell / bytes after it / highest bytes during it / how far
  that highest rose above its bytes before the cell meets SPEC: a number, `result` (the cell's
  value) or `N*result`, any of them after `>=` or `>`; `cubecl-phase=NAME:SPEC`:
  cubecl's in-use bytes changed by SPEC across the cell's `NAME` stamps (its books read at each
  stamp's ends: burn's tensors live inside cubecl's pools, where no stack says what they are).

Issue 54 (`corpus_checks`, `oom_checks` below say each check exactly; each prints a `PASS [check]`
or `FAIL [check]` line, and a record or field a check needs that is missing is a FAIL):
- --corpus: a notebook that never calls gpumem-nb (scripts/gpu/corpus54.sh): no cell names it;
  every cell's `FRAMEWORK_BYTES OWNER ±N` (what the framework says it made, printed by the cell)
  equals OWNER's tracked change in `all_allocations.by_owner`; the owners add up; no line says
  `allocated 0 B`; the line leads with the owner that changed most (the framework, where it
  printed a change); NVML's change of the process = tracked + the CUDA pool's cache + the
  driver's kernel stacks within 2 MiB, the first cell that touched the GPU naming the rest as the
  CUDA context; `--variant dep`: the first code cell is exactly `:dep gpumem-nb`;
- cells tagged `oom=SIZE` (with `oom-line=N`, `oom-owner=WORD`, `oom-api=NAME`, `oom-panics`),
  `oom-holder`, `after-oom`, `device-fails`, `history-oom`: an out-of-memory cell's error,
  record and history row; `--oom`: the notebook must have an `oom=` cell;
- --kernel-exit N: gpumem-kernel's exit status, a FAIL when not 0; --summary FILE --label NAME
  [--seconds S]: appends one line (code cells, reports, checks passed and failed) to FILE.
--self-test: synthetic executed notebooks on which every issue-54 check, and the earlier checks
on figures (`nvml-matches` among them), passes when right and fails when a figure is wrong or
missing; exits 1 when one does not.

--stock (the stock evcxr kernel): a record comes only beside a cell's value, so cells without one
are listed but not failed, unless a tag of theirs needs the record (`RECORD_TAGS`: tagged cells
end in a value, and must have one; without it their checks would not run), and the warnings
(re-run leaks) are gpumem-kernel's: growth tags are skipped. Cells tagged `not-stock` are listed
as skipped, with the reason: their computation is wrong in the stock kernel (candle's tensor ids
come from a static counter, one per cell there, so a `backward` over tensors from several cells
mixes their gradients up).
"""
import json
from html import unescape
import re
import sys

MIB = 1 << 20
CELL_MIME = "application/vnd.gpumem.cell+json"


def delta(span):
    if not span or span.get("before") is None or span.get("after") is None:
        return None
    return span["after"] - span["before"]


def source_delta(all_allocs, key):
    for s in (all_allocs or {}).get("by_source", []):
        if s["source"] == key:
            return s["delta"]
    return 0


def main():
    args = sys.argv[1:]
    if "--self-test" in args:
        return self_test()
    opts = Options(args)
    try:
        nb = json.load(open(opts.path))
    except (OSError, ValueError) as e:
        # No executed notebook (the kernel died, or the run was cut short): never a pass.
        print(f"FAIL [notebook] {opts.path}: MISSING executed notebook ({e})")
        write_summary(opts, None, 0, 0, 1)
        return 1
    return check(nb, opts)


def check(nb, opts):
    """Every check on one executed notebook; prints what it found; 0 when nothing failed."""
    path, require, out_json, no_lines, stock = opts.path, opts.require, opts.out_json, opts.no_lines, opts.stock
    failures, rows = [], []
    tracked_records = 0  # records after the crate loaded: where --require-tracking is checked
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        tags = cell.get("metadata", {}).get("tags", [])
        outs = cell.get("outputs", [])
        recs = [o["data"][CELL_MIME] for o in outs if CELL_MIME in o.get("data", {})]
        errors = [o for o in outs if o.get("output_type") == "error"]
        result = next((o["data"].get("text/plain") for o in outs if o.get("output_type") == "execute_result"), None)
        if isinstance(result, list):  # nbformat on disk may keep a multi-line string as lines
            result = "".join(result)
        first = src.splitlines()[0] if src else ""
        magic_only = all(l.strip().startswith("%gpumem") or not l.strip() for l in src.splitlines())
        if stock and "not-stock" in tags:
            why = "candle's tensor ids are per cell in the stock kernel: a backward across cells is wrong there"
            print(json.dumps({"cell": i, "code": first[:60], "skipped": why}))
            continue
        if errors and "raises-exception" not in tags:
            failures.append(f"cell {i} ({first}): error {errors[0].get('ename')}: {errors[0].get('evalue', '')[:200]}")
        for tag in (t for t in tags if t.startswith("top-names=")):
            for name in tag[len("top-names="):].split(","):
                # An empty name is in every text: a tag that names nothing checks nothing.
                if not name.strip():
                    failures.append(f"cell {i} ({first}): {tag!r} names an empty site: nothing to check")
                elif name not in (result or ""):
                    failures.append(f"cell {i} ({first}): {name!r} not in the top table: {(result or '')[:300]}")
        if "top-cells-cubecl" in tags:
            text = "".join(
                "".join(o.get("data", {}).get("text/plain", "")) for o in outs if o.get("output_type") == "display_data"
            )
            cub = [l for l in text.splitlines() if "cubecl" in l.lower()]
            if not cub or any("← cell " not in l for l in cub):
                failures.append(f"cell {i} ({first}): cubecl rows of %gpumem top without their cell: {cub or text[:400]}")
        if magic_only:
            continue
        if stock and not recs and not record_tags(tags):
            print(json.dumps({"cell": i, "code": first[:60], "record": None}))
            continue
        if len(recs) != 1:
            failures.append(f"cell {i} ({first}): {len(recs)} reports")
            continue
        r = recs[0]
        a = r.get("allocator") or {}
        pool = r.get("pool") or {}
        alla = r.get("all_allocations") or {}
        nv = delta((r.get("nvml") or {}).get("process"))
        row = {
            "cell": r["cell"],
            "code": first[:60],
            # nbformat on disk may keep a multi-line string as a list of lines.
            "line": "".join(next((o["data"]["text/plain"] for o in outs if CELL_MIME in o.get("data", {})), "")),
            "tracking": alla.get("tracking"),
            "allocator_reserved_delta": delta(a.get("reserved")),
            "pool_reserved_delta": delta(pool.get("reserved")),
            "all_delta": None if alla.get("after") is None or alla.get("before") is None else alla["after"] - alla["before"],
            "all_peak": alla.get("peak"),
            "nvml_delta": nv,
            "top": alla.get("top"),
        }
        cubecl = next((f for f in r.get("frameworks") or [] if f.get("framework") == "cubecl"), None)
        if cubecl:
            row["cubecl_in_use_delta"] = delta(cubecl.get("in_use"))
            row["cubecl_cached_after"] = (cubecl.get("cached") or {}).get("after")
            row["cubecl_reserved_delta"] = delta(cubecl.get("reserved"))
            row["cubecl_error"] = cubecl.get("error")
        warnings = r.get("warnings") or []
        row["warnings"] = warnings
        # What the process reserved, by the crate's accounts.
        parts = [row["allocator_reserved_delta"], row["pool_reserved_delta"]]
        reserved = None if any(p is None for p in parts) else sum(parts)
        if reserved is not None and alla:
            reserved += sum(source_delta(alla, k) for k in ("driver", "vmm", "managed"))
        row["crate_reserved_delta"] = reserved
        row["unexplained_by_tracking"] = None if nv is None or reserved is None else nv - reserved
        rows.append(row)
        if require and (r.get("crate_loaded") or {}).get("after"):
            tracked_records += 1
        if require and (r.get("crate_loaded") or {}).get("after") and alla.get("tracking") != require:
            failures.append(f"cell {i} ({first}): tracking {alla.get('tracking')!r}, expected {require!r}")
        checks = {
            "returns-allocated": (a.get("allocated") or {}).get("after"),
            "returns-reserved": (a.get("reserved") or {}).get("after"),
            "returns-pool-used": (pool.get("used") or {}).get("after"),
            "returns-ooms": None,
        }
        for tag, value in checks.items():
            if tag not in tags:
                continue
            if tag == "returns-ooms":
                # The cell returns the total; the report counts this cell's.
                if a.get("ooms", 0) < 1:
                    failures.append(f"cell {i}: the report counts no OOM")
                continue
            if value is None:
                # A cell returning `None` would otherwise equal the missing figure ("None").
                failures.append(f"cell {i} ({first}): MISSING the report's figure for {tag}: {a or pool}")
                continue
            got = (result or "").strip().removeprefix("Some(").removesuffix(")")
            if str(value) != got:
                failures.append(f"cell {i} ({first}): the cell returned {got}, the report says {value}")
        for tag in (t for t in tags if t.startswith("returns=")):
            want = tag[len("returns="):]
            got = (result or "").strip()
            if got != want and not (got.replace(".", "", 1).isdigit() and float(got) == float(want)):
                failures.append(f"cell {i} ({first}): the cell returned {got!r}, expected {want}")
        component_checks(i, first, tags, alla, result, failures)
        phase_checks(i, first, tags, cubecl, result, failures)
        for tag in (t for t in tags if t.startswith("cubecl-in-use-falls=")):
            mib = float(tag[len("cubecl-in-use-falls="):])
            fell = delta((cubecl or {}).get("in_use"))
            if fell is None or -fell < mib * MIB:
                failures.append(f"cell {i} ({first}): cubecl's in-use bytes fell by {fell and -fell}, expected >= {mib} MiB")
        for tag in (t for t in tags if t.startswith("site=")):
            spec = tag[len("site="):]
            func, _, line = spec.partition("@")
            if not func.strip():
                # `f == ""` would match an entry with no function.
                failures.append(f"cell {i} ({first}): {tag!r} names no function: nothing to check")
                continue
            def matches(e):
                # A trait method is named `<candle_core::…::CudaStorage as …>::matmul`.
                f = (e.get("function") or "").lstrip("<")
                if not (f.startswith(func) if func.endswith("::") else f == func):
                    return False
                if line and not no_lines:
                    return e.get("cell") == r["cell"] and e.get("line") == int(line)
                return True
            top = alla.get("top") or []
            if not any(matches(e) for e in top):
                failures.append(f"cell {i} ({first}): no site {spec!r} in the record's top: {top}")
        if "cubecl-pools" in tags:
            parts = ("in_use", "padding", "cached", "reserved")
            after = lambda k: ((cubecl or {}).get(k) or {}).get("after")
            if not cubecl or cubecl.get("error") or any(after(k) is None for k in parts):
                failures.append(f"cell {i} ({first}): MISSING cubecl numbers in the record: {cubecl}")
            else:
                if after("in_use") + after("padding") + after("cached") != after("reserved"):
                    failures.append(f"cell {i} ({first}): cubecl's in use + padding + cached != reserved: {cubecl}")
        if "cubecl-matches-tracked" in tags:
            got, want = source_delta(alla, "driver") + source_delta(alla, "pool"), row.get("cubecl_reserved_delta")
            if alla.get("by_source") is None:
                failures.append(f"cell {i} ({first}): MISSING all_allocations.by_source (tracked by source)")
            elif want is None or abs(got - want) > 2 * MIB:
                failures.append(f"cell {i} ({first}): tracked driver + pool Δ {got} vs cubecl's reserved Δ {want}")
        for tag in (t for t in tags if t.startswith("child-process=")):
            name = tag[len("child-process="):]
            printed = "".join("".join(o.get("text", "")) for o in outs if o.get("output_type") == "stream").split()
            pid = int(printed[printed.index("worker") + 1]) if "worker" in printed else None
            kids = r.get("children") or []
            row["children"] = kids
            mine = [k for k in kids if k.get("pid") == pid]
            if not mine or mine[0].get("name") != name or mine[0].get("source") != "nvml" or mine[0].get("used", 0) < 256 * MIB:
                failures.append(f"cell {i} ({first}): worker pid {pid} ({name}, NVML, >= 256 MiB) not in children: {kids}")
            if delta(a.get("allocated")) not in (0, None):
                failures.append(f"cell {i} ({first}): the notebook's own allocated bytes moved: {delta(a.get('allocated'))}")
        if "no-children" in tags and r.get("children"):
            failures.append(f"cell {i} ({first}): children listed after the worker stopped: {r['children']}")
        leak = [w for w in warnings if w.startswith("re-run leak")]
        if not stock:
            for tag in (t for t in tags if t.startswith("growth=")):
                word = {"live": "live tensors +", "reserve": "pool reserve +"}[tag[len("growth="):]]
                if not any("cubecl: " in w and word in w for w in leak):
                    failures.append(f"cell {i} ({first}): no re-run leak with cubecl's {word!r}: {warnings}")
            if "no-growth" in tags and leak:
                failures.append(f"cell {i} ({first}): a re-run leak was flagged: {leak}")
        if "nvml-matches" in tags:
            if row["unexplained_by_tracking"] is None:
                # No NVML figure, or no reserved delta of the crate's to hold it to: never a pass.
                failures.append(
                    f"cell {i} ({first}): MISSING figures for nvml-matches: NVML Δ {nv}, allocator reserved Δ "
                    f"{row['allocator_reserved_delta']}, CUDA pool reserved Δ {row['pool_reserved_delta']}"
                )
            elif abs(row["unexplained_by_tracking"]) > 2 * MIB:
                failures.append(
                    f"cell {i} ({first}): NVML Δ {nv} vs the crate's reserved Δ {reserved} "
                    f"({row['unexplained_by_tracking'] / MIB:+.2f} MiB unexplained)"
                )
        fault_checks(i, first, tags, errors, r, row["line"], failures)
        queued_checks(i, first, tags, r, alla, cubecl, row, failures)
        html = "".join(next((o["data"].get("text/html", "") for o in outs if CELL_MIME in o.get("data", {})), ""))
        device_checks(i, first, tags, r, alla, row, html, failures)
    history_checks(nb, failures)
    # Checks that ran on nothing are not passes: a notebook with no report, or --require-tracking
    # with no record after the crate loaded (each record's tracking unread).
    if not rows:
        failures.append("no cell has a report: no record was checked")
    elif require and not tracked_records:
        failures.append(f"--require-tracking {require}: no record says the crate loaded (crate_loaded.after), "
                        "so no record's tracking was checked")
    for row in rows:
        print(json.dumps(row))
    # Issue 54: notebooks with no gpumem-nb call (--corpus) and out-of-memory notebooks (tags).
    checks = Checks()
    if opts.corpus:
        corpus_checks(nb, opts, checks)
    oom_checks(nb, opts, checks)
    if opts.kernel_exit not in (None, 0):
        checks.fail("notebook", "kernel-exit", f"gpumem-kernel run exited {opts.kernel_exit}")
    if out_json:
        json.dump({"cells": rows, "failures": failures, "checks": checks.lines}, open(out_json, "w"), indent=1)
    for f in failures:
        print("FAIL:", f)
    failed = len(failures) + checks.failed
    print(f"{path}: {len(rows)} reports, {failed} failures")
    code_cells = sum(1 for c in nb["cells"] if c["cell_type"] == "code")
    # The checks before issue 54 count as one check, failed once per failure they found.
    write_summary(opts, code_cells, len(rows), checks.passed + (0 if failures else 1), failed)
    return 1 if failed else 0


# The checks that read a cell's record (every tag name `check` reads after it found the record).
# In the stock kernel a cell without a record is listed, not failed, unless it carries one of these:
# its checks would otherwise be skipped unseen. The growth tags are skipped there anyway.
RECORD_TAGS = {
    "nvml-matches", "cubecl-pools", "cubecl-matches-tracked", "returns-allocated", "returns-reserved",
    "returns-pool-used", "returns-ooms", "returns", "components-add-up", "component-delta", "component-after",
    "component-peak", "component-rise", "cubecl-phase", "cubecl-in-use-falls", "site", "child-process",
    "no-children", "context-lost", "after-loss", "host-after-loss", "restarted", "queued-lands", "parts-add-up",
    "first-launches", "line-has", "devices-nvml", "nvml-explained-each", "nvml-explained", "stacks-named",
    "nvml-named-each", "nccl-named",
}


def record_tags(tags):
    """The cell's tags whose checks need its record."""
    return [t for t in tags if t.partition("=")[0] in RECORD_TAGS]


def component_checks(i, first, tags, alla, result, failures):
    """Issue 33: what the memory is, against the model's own counts (the cell's value)."""
    parts = {c["component"]: c for c in alla.get("by_component") or []}
    kinds = ("component-delta=", "component-after=", "component-peak=", "component-rise=")
    if alla.get("by_component") is None and ("components-add-up" in tags or any(t.startswith(kinds) for t in tags)):
        # A component absent from the list held nothing; no list at all is no figure.
        failures.append(f"cell {i} ({first}): MISSING all_allocations.by_component")
        return
    if "components-add-up" in tags:
        after = sum(c["after"] for c in parts.values())
        if not parts or after != alla.get("after"):
            failures.append(f"cell {i} ({first}): components add up to {after}, tracked {alla.get('after')}: {parts}")
        befores = [c.get("before") for c in parts.values()]
        if None not in befores and alla.get("before") is not None and sum(befores) != alla["before"]:
            failures.append(f"cell {i} ({first}): components before add up to {sum(befores)}, tracked {alla['before']}")
    for tag in (t for t in tags if t.startswith(kinds)):
        kind, _, spec = tag.partition("=")
        name, _, want = spec.partition(":")
        c = parts.get(name, {"before": 0, "after": 0, "peak": 0})
        if kind in ("component-peak", "component-rise") and c.get("peak") is None:
            failures.append(f"cell {i} ({first}): {name} has no peak (the cell's changes were not known): {parts}")
            continue
        before = c.get("before") or 0
        got = {
            "component-delta": c["after"] - before,
            "component-after": c["after"],
            "component-peak": c.get("peak"),
            "component-rise": (c.get("peak") or 0) - before,
        }[kind]
        why = unmet(got, want, result)
        if why:
            failures.append(f"cell {i} ({first}): {name} {kind.split('-')[1]} {why}: {parts}")


def unmet(got, want, result):
    """Why `got` does not meet the spec `want` (a number, `result` or `N*result`, any of them
    after `>=` or `>`); None when it does."""
    op = ">=" if want.startswith(">=") else ">" if want.startswith(">") else "=="
    value = want[len(op) if op != "==" else 0:]
    times, _, of = value.rpartition("*")
    try:
        if of == "result":
            value = int(times or 1) * int((result or "").strip())
        else:
            value = int(value)
    except ValueError:
        return f"cannot be checked: the cell's value {result!r} is not a byte count"
    ok = got >= value if op == ">=" else got > value if op == ">" else got == value
    return None if ok else f"{got}, expected {op} {value}"


def phase_checks(i, first, tags, cubecl, result, failures):
    """Issue 33: cubecl's in-use change across the cell's component stamps (its own books at each
    stamp's ends), against the model's own counts."""
    phases = {p["component"]: p for p in (cubecl or {}).get("phases") or []}
    for tag in (t for t in tags if t.startswith("cubecl-phase=")):
        name, _, want = tag[len("cubecl-phase="):].partition(":")
        p = phases.get(name)
        if p is None:
            failures.append(f"cell {i} ({first}): no `{name}` stamp in cubecl's books: {phases}")
            continue
        print(f"    cubecl in use across `{name}` stamps: {p['change']:+,} B ({p['phases']} stamps)")
        why = unmet(p["change"], want, result)
        if why:
            failures.append(f"cell {i} ({first}): cubecl in use across `{name}` stamps {why}")


def fault_checks(i, first, tags, errors, r, line, failures):
    where = f"cell {i} ({first})"
    for tag in (t for t in tags if t.startswith("context-lost=")):
        code = tag[len("context-lost="):]
        e = errors[0] if errors else {}
        if e.get("ename") != code or "is lost" not in e.get("evalue", ""):
            failures.append(f"{where}: expected error {code} saying the context is lost, got {e.get('ename')}: {e.get('evalue')}")
        if r.get("status") != "lost" or "✗ CUDA context lost" not in line:
            failures.append(f"{where}: record status {r.get('status')!r}, line {line!r}")
    for tag in (t for t in tags if t.startswith("after-loss=")):
        code = tag[len("after-loss="):]
        e = errors[0] if errors else {}
        tb = "\n".join(e.get("traceback", []))
        if code not in e.get("evalue", "") or "lost in cell" not in tb or "%gpumem restart" not in tb:
            failures.append(f"{where}: the device call's error does not name {code} and where the context was lost: {e}")
        if r.get("status") != "error":
            failures.append(f"{where}: record status {r.get('status')!r}")
    if "host-after-loss" in tags:
        if errors:
            failures.append(f"{where}: host code after the loss failed: {errors[0].get('evalue')}")
        if r.get("status") != "ok" or "host code runs" not in line:
            failures.append(f"{where}: record status {r.get('status')!r}, line {line!r}")
    if "restarted" in tags and not r.get("restarted"):
        failures.append(f"{where}: the record does not say the child was restarted: {r.get('restart_reason')}")


def device_checks(i, first, tags, r, alla, row, html, failures):
    """Several GPUs (issue 46): NVML read on each device and matched to its CUDA device, each
    device's NVML change explained by what was tracked there, NCCL's memory named NCCL."""
    where = f"cell {i} ({first})"
    parts = r.get("nvml_devices") or []
    row["nvml_devices"] = [
        {"device": p.get("device"), "uuid": p.get("uuid"), "process_delta": delta(p.get("process"))} for p in parts
    ]
    for tag in (t for t in tags if t.startswith("line-has=")):
        if not tag[len("line-has="):].strip():
            failures.append(f"{where}: {tag!r} names no text: nothing to check")
        elif tag[len("line-has="):] not in row["line"]:
            failures.append(f"{where}: the line lacks {tag[len('line-has='):]!r}: {row['line']}")
    for tag in (t for t in tags if t.startswith("devices-nvml=")):
        want = int(tag.split("=")[1])
        got = sorted(p.get("device") for p in parts if p.get("device") is not None and (p.get("process") or {}).get("after"))
        if len(got) != want:
            failures.append(f"{where}: NVML read on {len(got)} devices {got} with CUDA ordinals, expected {want}")
    places = {p.get("device"): p for p in alla.get("devices") or []}
    stacks = local_memory(r)
    row["kernel_stacks"] = stacks
    explained = {}
    for p in parts:
        d, nv = p.get("device"), delta(p.get("process"))
        place = places.get(d)
        if d is None or nv is None:
            continue
        tracked = 0 if place is None else place["after"] - (place.get("before") or 0)
        local = stacks.get(d, 0) or 0
        explained[d] = {"nvml": nv, "tracked": tracked, "kernel_stacks": local, "rest": nv - tracked - local}
    row["explained"] = explained
    for tag in (t for t in tags if t.startswith("nvml-explained-each=")):
        pct = float(tag.split("=")[1])
        if len(explained) < 2:
            failures.append(f"{where}: NVML's change is explained on {len(explained)} devices, expected every one")
        for d, e in explained.items():
            # Within PCT % of NVML's change, or the driver's 2 MiB granularity where it is small.
            if abs(e["rest"]) > max(2 * MIB, abs(e["nvml"]) * pct / 100):
                failures.append(
                    f"{where}: device {d}: NVML {e['nvml'] / MIB:+.2f} MiB, tracked {e['tracked'] / MIB:+.2f} MiB, "
                    f"{e['rest'] / MIB:+.2f} MiB unexplained (more than {pct} %)"
                )
    # One device: NVML's change against every tracked byte, the CUDA pool's cache and the kernel
    # stacks the driver reserved (each thread's stack, as the driver reports it, times the threads
    # the device holds).
    main_uuid = (r.get("nvml") or {}).get("uuid")
    if "stacks-named" in tags and not local_memory_of(r, main_uuid) > 0:
        failures.append(f"{where}: no growth of the kernel stacks on NVML's device {main_uuid} in the record: "
                        f"{r.get('local_memory')}")
    for tag in (t for t in tags if t.startswith("nvml-explained=")):
        pct = float(tag.split("=")[1])
        nv, tracked = delta((r.get("nvml") or {}).get("process")), delta(alla)
        pool = r.get("pool") or {}
        cache = [None if (pool.get("reserved") or {}).get(k) is None or (pool.get("used") or {}).get(k) is None
                 else pool["reserved"][k] - pool["used"][k] for k in ("before", "after")]
        if nv is None or tracked is None or None in cache:
            failures.append(f"{where}: NVML {nv}, tracked {tracked}, CUDA pool cache {cache}: not all read")
            continue
        local = local_memory_of(r, main_uuid)
        rest = nv - tracked - (cache[1] - cache[0]) - local
        row["explained_one"] = {"nvml": nv, "tracked": tracked, "pool_cache": cache[1] - cache[0],
                                "kernel_stacks": local, "rest": rest}
        if abs(rest) > max(2 * MIB, abs(nv) * pct / 100):
            failures.append(f"{where}: NVML {nv / MIB:+.2f} MiB = tracked {tracked / MIB:+.2f} + pool cache "
                            f"{(cache[1] - cache[0]) / MIB:+.2f} + kernel stacks {local / MIB:+.2f} + "
                            f"{rest / MIB:+.2f} MiB unexplained (more than {pct} %)")
    if "nvml-named-each" in tags:
        others = [d for d in explained if d != alla.get("device")]
        if not others:
            failures.append(f"{where}: MISSING NVML's change on another device: nothing for the details to explain "
                            f"({len(explained)} devices read)")
        for d, e in explained.items():
            if d != alla.get("device") and f"NVML's change on device {d}, explained" not in unescape(html):
                failures.append(f"{where}: device {d}'s NVML change ({e['nvml'] / MIB:+.2f} MiB) not explained in the details")
    if "nccl-named" in tags:
        nccl = [
            (p.get("device"), t)
            for p in alla.get("devices") or []
            for t in p.get("top") or []
            if (t.get("owner") or "").startswith("libnccl")
        ]
        row["nccl"] = [{"device": d, "bytes": t["bytes"], "component": t.get("component")} for d, t in nccl]
        if len({d for d, _ in nccl}) < 2:
            failures.append(f"{where}: NCCL's memory is in the top of {len({d for d, _ in nccl})} devices, expected 2: "
                            f"{[(p.get('device'), [t.get('owner') for t in p.get('top') or []]) for p in alla.get('devices') or []]}")
        if any(t.get("component") != "workspace" for _, t in nccl):
            failures.append(f"{where}: NCCL's memory is not workspace: {row['nccl']}")
        if "NCCL" not in html:
            failures.append(f"{where}: the report does not say NCCL")


def local_memory(r):
    """Each device's growth of the driver's kernel stacks over the cell, from the record's stack
    sizes (bytes a thread, before and after, as the driver reported them) and threads; None where
    the stack was not read before."""
    out = {}
    for l in r.get("local_memory") or []:
        b, a = (l.get("stack_bytes") or {}).get("before"), (l.get("stack_bytes") or {}).get("after")
        out[l["device"]] = None if b is None or a is None else (a - b) * l["resident_threads"]
    return out


def local_memory_of(r, uuid):
    """The kernel stacks' growth on the device NVML names by `uuid` (0 where not read)."""
    for l in r.get("local_memory") or []:
        if uuid and l.get("uuid", "").lower() == uuid.lower():
            return local_memory({"local_memory": [l]}).get(l["device"]) or 0
    return 0


def history_checks(nb, failures):
    lost = []
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            rec = o.get("data", {}).get(CELL_MIME)
            if rec and rec.get("status") == "lost":
                lost.append(rec["cell"])
    for i, cell in enumerate(nb["cells"]):
        if "history-lost" not in cell.get("metadata", {}).get("tags", []):
            continue
        text = "".join(
            "".join(o.get("data", {}).get("text/plain", "")) for o in cell.get("outputs", []) if o.get("output_type") == "display_data"
        )
        if not lost:
            failures.append(f"cell {i}: no cell lost the context, nothing for the history to flag")
        for n in lost:
            row = next((l for l in text.splitlines() if f"[{n}]" in l), None)
            if row is None or "CUDA context lost" not in row:
                failures.append(f"cell {i}: the history's row [{n}] does not flag the lost context: {row!r}")


def queued_checks(i, first, tags, r, alla, cubecl, row, failures):
    where = f"cell {i} ({first})"
    if "queued-lands" in tags:
        got = source_delta(alla, "driver") + source_delta(alla, "pool")
        after = lambda k: ((cubecl or {}).get(k) or {}).get("after")
        if not cubecl or after("in_use") is None or after("cached") is None:
            failures.append(f"{where}: MISSING cubecl's in use and cached after the cell: {cubecl}")
        elif alla.get("by_source") is None:
            failures.append(f"{where}: MISSING all_allocations.by_source (tracked by source)")
        elif got + 2 * MIB < after("in_use") + after("cached"):
            failures.append(f"{where}: tracked driver + pool Δ {got} < cubecl's in use + cached after "
                            f"{after('in_use') + after('cached')}")
        if r.get("unsettled"):
            failures.append(f"{where}: not settled: {r['unsettled']}")
    if "parts-add-up" in tags or "first-launches" in tags:
        nv = row["nvml_delta"]
        tracked = row["all_delta"]
        pool = r.get("pool") or {}
        def cache(end):
            res, used = (pool.get("reserved") or {}).get(end), (pool.get("used") or {}).get(end)
            return 0 if not pool else (None if res is None or used is None else res - used)
        c0, c1 = cache("before"), cache("after")
        if nv is None or tracked is None or c0 is None or c1 is None:
            failures.append(f"{where}: no NVML, tracked or pool figures to add up: {nv}, {tracked}, {pool}")
            return
        rest = nv - tracked - (c1 - c0)
        row["nvml_rest"] = rest
        low, high = -2 * MIB, (None if "first-launches" in tags else 2 * MIB)
        if rest < low or (high is not None and rest > high):
            failures.append(f"{where}: NVML Δ {nv} = tracked {tracked} + pool cache {c1 - c0} + rest {rest}: rest out of bounds")
        shown = "CUDA context and modules (NVML)" in row["line"]
        if shown != (abs(rest) >= MIB):
            failures.append(f"{where}: the line {'names' if shown else 'omits'} a rest of {rest / MIB:+.2f} MiB")


# ---------------------------------------------------------------------------------------------
# Issue 54: notebooks that never call gpumem-nb (`--corpus`), and out-of-memory notebooks (tags).
# Every check here prints one `PASS [check] where: …` or `FAIL [check] where: …` line; a record
# or field a check needs that is not there is a FAIL that says MISSING, never a pass.

GIB = 1 << 30
FRAMEWORK_BYTES = re.compile(r"^FRAMEWORK_BYTES (\S+) ([+-]?\d+)\s*$")
FRAMEWORK_SHAPES = re.compile(r"^FRAMEWORK_SHAPES (\S+) ([+-]?\d+) page=(\d+)\s*$")
FRAMEWORK_IN_USE = re.compile(r"^FRAMEWORK_IN_USE (\S+) ([+-]?\d+)\s*$")
# The owner word whose framework keeps books the kernel reads (`frameworks[].framework`).
BOOKS_OF = {"burn/cubecl": "cubecl"}
FRAMEWORK_COMPONENT = re.compile(r"^FRAMEWORK_COMPONENT (\S+) ([+-]?\d+)\s*$")
# The most a CUDA context (with its default kernel stacks, modules and libraries' images) is
# taken to cost in the first cell that touches the GPU; more is not "the context".
CONTEXT_MAX = 4 * GIB


class Options:
    """The command line (see the module's docstring)."""

    def __init__(self, args):
        def value(flag, default=None):
            return args[args.index(flag) + 1] if flag in args else default

        self.path = args[0]
        self.require = value("--require-tracking")
        self.out_json = value("--json")
        self.no_lines = "--no-lines" in args
        self.stock = "--stock" in args
        self.corpus = "--corpus" in args
        self.oom = "--oom" in args
        self.variant = value("--variant")
        self.summary = value("--summary")
        self.label = value("--label")
        exit_code = value("--kernel-exit")
        self.kernel_exit = None if exit_code is None else int(exit_code)
        self.seconds = value("--seconds")


class Checks:
    """PASS/FAIL lines, counted."""

    def __init__(self, quiet=False):
        self.passed = self.failed = 0
        self.lines = []
        self.quiet = quiet

    def _say(self, ok, where, check, msg):
        self.lines.append({"ok": ok, "where": where, "check": check, "message": msg})
        if not self.quiet:
            print(f"{'PASS' if ok else 'FAIL'} [{check}] {where}: {msg}")

    def ok(self, where, check, msg):
        self.passed += 1
        self._say(True, where, check, msg)

    def fail(self, where, check, msg):
        self.failed += 1
        self._say(False, where, check, msg)

    def missing(self, where, check, what):
        self.fail(where, check, f"MISSING {what}")

    def expect(self, cond, where, check, msg):
        (self.ok if cond else self.fail)(where, check, msg)

    def failed_checks(self):
        return {l["check"] for l in self.lines if not l["ok"]}


def write_summary(opts, code_cells, reports, passed, failed):
    """One line per notebook and variant, appended to --summary FILE."""
    if not opts.summary:
        return
    label = opts.label or opts.path
    if code_cells is None:
        line = f"{label}: no executed notebook; checks 0 passed, {failed} failed"
    else:
        line = f"{label}: {code_cells} code cells, {reports} reports; checks {passed} passed, {failed} failed"
    if opts.kernel_exit is not None:
        line += f"; gpumem-kernel exit {opts.kernel_exit}"
    if opts.seconds is not None:
        line += f"; {opts.seconds} s"
    with open(opts.summary, "a") as f:
        f.write(line + "\n")


def text_of(v):
    """nbformat keeps a multi-line string as a string or a list of lines."""
    return "".join(v) if isinstance(v, list) else (v or "")


def cell_parts(cell):
    """(source, tags, stdout text, the record or None, the report line, error outputs)."""
    outs = cell.get("outputs", [])
    stdout = "".join(text_of(o.get("text")) for o in outs if o.get("output_type") == "stream" and o.get("name") == "stdout")
    recs = [o["data"][CELL_MIME] for o in outs if CELL_MIME in o.get("data", {})]
    line = next((text_of(o["data"].get("text/plain")) for o in outs if CELL_MIME in o.get("data", {})), "")
    errors = [o for o in outs if o.get("output_type") == "error"]
    return (
        text_of(cell.get("source")),
        cell.get("metadata", {}).get("tags", []),
        stdout,
        recs[0] if len(recs) == 1 else None,
        line,
        errors,
    )


def where_of(i, src, rec):
    first = next((l for l in src.splitlines() if l.strip()), "")
    n = f"[{rec['cell']}]" if rec and "cell" in rec else "[?]"
    return f"cell {i} {n} ({first[:50]})"


def printed(stdout, pattern):
    """{owner: summed bytes} of the cell's lines of one form."""
    out = {}
    for l in stdout.splitlines():
        m = pattern.match(l.strip())
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + int(m.group(2))
    return out


def mib(b):
    return "n/a" if b is None else f"{b / MIB:+,.2f} MiB"


def owner_change(alla, owner):
    """(change, why not) of one owner over the cell, from `all_allocations.by_owner`. An owner
    absent from a complete list (its `after`s add up to the tracked total) held nothing at either
    end; otherwise its absence is a missing figure."""
    owners = alla.get("by_owner")
    if owners is None and alla.get("before") == 0 and alla.get("after") == 0:
        return 0, None  # nothing tracked at either end: the list is empty, and left out
    if owners is None:
        return None, "all_allocations.by_owner"
    entry = next((o for o in owners if o.get("owner") == owner), None)
    if entry is None:
        complete = alla.get("after") is not None and sum(o.get("after") or 0 for o in owners) == alla["after"]
        return (0, None) if complete else (None, f"by_owner entry {owner!r} (the list does not add up to the total)")
    if entry.get("before") is None or entry.get("after") is None:
        return None, f"by_owner[{owner!r}].before/after"
    return entry["after"] - entry["before"], None


def lead_of(alla, allocator_holds):
    """The owner gpumem-nb's line leads with (`report/line.rs`, `lead_owners`): of the owners that
    hold memory or changed, the largest change, then the most held, then the name."""
    rows = []
    for o in alla.get("by_owner") or []:
        after, before, peak = o.get("after") or 0, o.get("before"), o.get("peak")
        d = None if before is None else after - before
        if not (after > 0 or (d or 0) != 0 or (peak or 0) > after):
            continue
        if allocator_holds and o.get("owner") == "gpumem-nb" and after == 0:
            continue
        rows.append((-(abs(d) if d is not None else after), -after, o.get("owner")))
    return sorted(rows)[0][2] if rows else None


def allocator_holds(rec):
    a = rec.get("allocator")
    if not a:
        return False
    end = lambda k: (a.get(k) or {}).get("after") or 0
    moved = delta(a.get("reserved")) or 0
    return bool(end("allocated") or end("reserved") or a.get("peak_allocated") or a.get("peak_reserved") or moved)


def corpus_checks(nb, opts, C):
    """A notebook written as the framework's docs write it, with no gpumem-nb call (or, for
    `--variant dep`, a first cell `:dep gpumem-nb` and still no call):

    - `no-call`: no code cell names gpumem-nb (`gpumem_nb`, `:dep gpumem-nb`), but the variant's
      first cell, which is exactly `:dep gpumem-nb`;
    - `framework-bytes`: every cell that printed `FRAMEWORK_BYTES OWNER ±N` has a record whose
      `all_allocations.by_owner` entry for OWNER changed by exactly N (before and after read);
      `FRAMEWORK_SHAPES OWNER ±N page=P` (what a framework without its own books can say: its
      tensors' shapes × element size, kept in pages of P bytes): the change is at least N and at
      most N rounded up to whole pages (a negative N: the same on the magnitudes); and the
      notebook printed at least one of them;
    - `framework-books`: every cell that printed `FRAMEWORK_IN_USE burn/cubecl ±N` (cubecl's own
      in-use change, from its `memory_usage`) has a record whose `frameworks` entry `cubecl`
      (read by the kernel with no call of the notebook's) changed its in use by exactly N, and a
      line that shows `cubecl in use`;
    - `framework-component`: every cell that printed `FRAMEWORK_COMPONENT NAME ±N` (what the
      model says a component is: its parameters' bytes, its optimizer's two moments) has a record
      whose `all_allocations.by_component` entry NAME changed by exactly N, or, where the record
      has `variables` (burn's types, read by the session library's probe), whose
      `variables.components` entry NAME did, and a line that names NAME;
    - `tracking`: every record says tracking `--require-tracking` (`cupti` on a GPU);
    - `owners-add-up`: the owners' `after`s add up to `all_allocations.after`;
    - `no-allocated-0`: no report line says `allocated 0 B` (no allocator the notebook never used);
    - `line-lead`: the line's first part after the time names the owner the record says changed
      most (largest change, then most held); in a cell that printed a non-zero FRAMEWORK_BYTES,
      that owner is the framework (or the cell's tag `lead=OWNER`);
    - `nvml-explained`: NVML's change of the process = the tracked change + the CUDA pool's
      cache change (reserved − used) + the driver's kernel stacks' change (`local_memory`),
      within 2 MiB; in the first cell that touched the GPU (NVML had no memory of the process
      before it) the rest is the CUDA context, a named cost: reported, and required to be
      positive and under 4 GiB.
    """
    where_nb = f"notebook {opts.label or opts.path}"
    # What the notebook says of itself.
    code = [(i, c) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]
    named = []
    for n, (i, c) in enumerate(code):
        src = text_of(c.get("source"))
        if opts.variant == "dep" and n == 0:
            C.expect(src.strip() == ":dep gpumem-nb", where_nb, "no-call",
                     f"the variant's first code cell is `:dep gpumem-nb`: {src.strip()[:60]!r}")
            continue
        if "gpumem_nb" in src or re.search(r"(?m)^\s*:dep\s+gpumem-nb\b", src):
            named.append(i)
    C.expect(not named, where_nb, "no-call",
             "no cell names gpumem-nb" if not named else f"cells {named} name gpumem-nb")
    total_printed = records = untracked = 0
    lines_zero = []
    gpu_seen = False
    for i, cell in code:
        src, tags, stdout, rec, line, errors = cell_parts(cell)
        magic_only = all(l.strip().startswith("%gpumem") or not l.strip() for l in src.splitlines())
        if magic_only:
            continue
        w = where_of(i, src, rec)
        fb, shapes = printed(stdout, FRAMEWORK_BYTES), printed(stdout, FRAMEWORK_SHAPES)
        pages = {m.group(1): int(m.group(3)) for m in map(FRAMEWORK_SHAPES.match, stdout.splitlines()) if m}
        in_use = printed(stdout, FRAMEWORK_IN_USE)
        total_printed += len(fb) + len(shapes)
        if rec is None:
            if fb or shapes:
                C.missing(w, "framework-bytes", "the cell's record (exactly one report)")
            continue
        alla = rec.get("all_allocations")
        if "allocated 0 B" in line:
            lines_zero.append(w)
        # Tracking.
        records += 1
        if alla is None:
            C.missing(w, "tracking", "all_allocations")
            untracked += 1
        elif (opts.require and alla.get("tracking") != opts.require) or str(alla.get("tracking")).startswith("unavailable"):
            C.fail(w, "tracking", f"tracking {alla.get('tracking')!r}, expected {opts.require!r}")
            untracked += 1
        alla = alla or {}
        # The owners add up.
        if alla.get("after") is not None and (alla.get("by_owner") or alla["after"] > 0):
            owners = alla.get("by_owner")
            if owners is None:
                C.missing(w, "owners-add-up", f"all_allocations.by_owner ({alla['after']:,} B tracked)")
            else:
                got = sum(o.get("after") or 0 for o in owners)
                C.expect(got == alla["after"], w, "owners-add-up",
                         f"owners' after {got:,} B, tracked {alla['after']:,} B")
        # What the framework says, against the tracked change of its owner.
        for owner, want in fb.items():
            got, why = owner_change(alla, owner)
            if why:
                C.missing(w, "framework-bytes", why)
                continue
            extra = f" (tensors in use {in_use[owner]:+,} B)" if owner in in_use else ""
            C.expect(got == want, w, "framework-bytes",
                     f"{owner}: tracked {got:+,} B, the framework printed {want:+,} B{extra}")
        for owner, want in shapes.items():
            got, why = owner_change(alla, owner)
            if why:
                C.missing(w, "framework-bytes", why)
                continue
            page = pages.get(owner) or 1
            high = -(-abs(want) // page) * page
            ok = abs(want) <= abs(got) <= high and (got >= 0) == (want >= 0)
            C.expect(ok, w, "framework-bytes",
                     f"{owner}: tracked {got:+,} B, the tensors' shapes {want:+,} B (pages of {page:,} B: "
                     f"|change| within [{abs(want):,}, {high:,}])")
        # What the framework's own books say (cubecl's in-use bytes, printed by the notebook from
        # `memory_usage`), against the record's reading of those books, which the kernel takes
        # with no call of the notebook's (the session library's reader), and the line showing it.
        for owner, want in in_use.items():
            fw = BOOKS_OF.get(owner)
            if fw is None:
                continue
            part = next((f for f in rec.get("frameworks") or [] if f.get("framework") == fw), None)
            if part is None:
                C.missing(w, "framework-books", f"the record's `frameworks` entry {fw!r} ({owner}'s own books)")
                continue
            iu = part.get("in_use") or {}
            if part.get("error") or iu.get("before") is None or iu.get("after") is None:
                C.missing(w, "framework-books", f"{fw}'s in use before and after ({iu}, error {part.get('error')!r})")
                continue
            got = iu["after"] - iu["before"]
            C.expect(got == want, w, "framework-books",
                     f"{fw}: in use {got:+,} B by the record's reading of its books, {want:+,} B printed by the notebook")
            C.expect(f"{fw} in use " in line, w, "framework-books", f"the line shows {fw}'s books: {line!r}")
        # What the model says a component is, against the record's component: the tracked
        # bytes', or, where the record has what the variables hold by the framework's types
        # (burn: the session library's probe), those, and the line shows the component.
        variables = rec.get("variables")
        for name, want in printed(stdout, FRAMEWORK_COMPONENT).items():
            if variables is not None:
                parts_by, said = {c["component"]: c for c in variables.get("components") or []}, "the probe"
            else:
                parts_by, said = {c["component"]: c for c in alla.get("by_component") or []}, "tracked"
            if name not in parts_by:
                C.fail(w, "framework-component", f"{name}: the record has no such component "
                       f"({said}: {sorted(parts_by)}), the model printed {want:+,} B")
                continue
            c = parts_by[name]
            got = (c.get("after") or 0) - (c.get("before") or 0)
            C.expect(got == want, w, "framework-component",
                     f"{name}: {said} {got:+,} B, the model printed {want:+,} B")
            if variables is not None:
                C.expect(f" {name} " in line, w, "framework-component",
                         f"the line shows {variables.get('framework')}'s {name}: {line!r}")
        # The line leads with who holds the memory.
        parts = line.split(" · ")
        lead_part = parts[2] if len(parts) > 2 else None
        if not line:
            C.missing(w, "line-lead", "the report line (text/plain)")
        elif alla.get("by_owner") is None and alla.get("after"):
            C.missing(w, "line-lead", "all_allocations.by_owner")
        elif allocator_holds(rec):
            C.ok(w, "line-lead", f"gpumem-nb's allocator holds memory: its figures lead ({lead_part!r})")
        else:
            expect = lead_of(alla, False)
            want = f"{expect} " if expect else "no device memory"
            C.expect(lead_part is not None and (lead_part.startswith(want) or lead_part == want.strip()), w,
                     "line-lead", f"the line leads with {lead_part!r}, the record's owner that changed most is {expect!r}")
            framework = next((t.split("=", 1)[1] for t in tags if t.startswith("lead=")), None)
            nonzero = [o for o, b in {**fb, **shapes}.items() if b != 0]
            framework = framework or (nonzero[0] if len(nonzero) == 1 else None)
            if framework:
                C.expect(lead_part is not None and lead_part.startswith(framework + " "), w, "line-lead",
                         f"the framework that made the memory, {framework!r}, leads: {lead_part!r}")
        # NVML against what is named.
        gpu_seen = nvml_explained(w, rec, alla, gpu_seen, C)
    if records and not untracked:
        C.ok(where_nb, "tracking", f"every record ({records}) says tracking {opts.require or 'on'}")
    elif not records:
        C.missing(where_nb, "tracking", "every record: no cell has one")
    C.expect(total_printed > 0, where_nb, "framework-bytes",
             f"{total_printed} FRAMEWORK_BYTES/SHAPES lines printed" if total_printed else
             "MISSING: no cell printed FRAMEWORK_BYTES (the notebook states no figure of its own)")
    C.expect(not lines_zero, where_nb, "no-allocated-0",
             "no report line says `allocated 0 B`" if not lines_zero else f"`allocated 0 B` in {lines_zero}")


def nvml_explained(w, rec, alla, gpu_seen, C):
    """NVML's change of the process in one cell, explained (see `corpus_checks`); returns whether
    the GPU has been touched by the end of this cell."""
    nv = (rec.get("nvml") or {}).get("process") or {}
    nb_, na = nv.get("before"), nv.get("after")
    if not gpu_seen and not na:
        if na is None and (rec.get("nvml") or {}).get("unavailable"):
            C.missing(w, "nvml-explained", f"NVML ({rec['nvml']['unavailable']})")
        else:
            C.ok(w, "nvml-explained", f"no memory of the process on the GPU yet (NVML {na})")
        return False
    first = not gpu_seen
    if nb_ is None or na is None:
        C.missing(w, "nvml-explained", f"nvml.process before/after ({nb_}, {na})")
        return True
    if first and nb_ != 0:
        # The process held memory before: the context came before any cell (nothing to name).
        first = False
    nvml = na - nb_
    tracked = delta(alla) if alla else None
    if tracked is None:
        C.missing(w, "nvml-explained", "all_allocations.before/after")
        return True
    pool = rec.get("pool")
    if pool is None:
        C.missing(w, "nvml-explained", "pool (the CUDA pool's used and reserved)")
        return True
    def cache(end):
        res, used = (pool.get("reserved") or {}).get(end), (pool.get("used") or {}).get(end)
        return None if res is None or used is None else res - used
    c0, c1 = cache("before"), cache("after")
    if c0 is None and first:
        c0 = 0  # no context, no pool: nothing cached before the cell
    if c0 is None or c1 is None:
        C.missing(w, "nvml-explained", f"pool reserved/used before and after ({c0}, {c1})")
        return True
    uuid = (rec.get("nvml") or {}).get("uuid")
    lm = next((l for l in rec.get("local_memory") or [] if uuid and (l.get("uuid") or "").lower() == uuid.lower()), None)
    if lm is None:
        C.missing(w, "nvml-explained", f"local_memory of NVML's device {uuid} (the driver's kernel stacks)")
        return True
    sb, sa = (lm.get("stack_bytes") or {}).get("before"), (lm.get("stack_bytes") or {}).get("after")
    threads = lm.get("resident_threads")
    if sa is None or threads is None or (sb is None and not first):
        C.missing(w, "nvml-explained", f"local_memory stack_bytes before/after, resident_threads ({sb}, {sa}, {threads})")
        return True
    stacks = 0 if sb is None else (sa - sb) * threads
    rest = nvml - tracked - (c1 - c0) - stacks
    said = (f"NVML {mib(nvml)} = tracked {mib(tracked)} + CUDA pool cache {mib(c1 - c0)} + kernel stacks "
            f"{mib(stacks)} + rest {mib(rest)}")
    if first:
        default_stacks = sa * threads
        C.expect(0 < rest <= CONTEXT_MAX, w, "nvml-explained",
                 f"{said}: the CUDA context (first use), named: {rest / MIB:,.2f} MiB, of which the default "
                 f"kernel stacks {default_stacks / MIB:,.2f} MiB ({sa} B × {threads:,} threads)")
    else:
        C.expect(abs(rest) <= 2 * MIB, w, "nvml-explained",
                 said + (": within 2 MiB" if abs(rest) <= 2 * MIB else ": more than 2 MiB no named cost explains "
                         "(kernels' modules loaded for the first time?)"))
    return True


def size_of(spec):
    """`96GiB` → bytes."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB)", spec.strip())
    if not m:
        raise ValueError(f"not a size: {spec!r}")
    unit = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}[m.group(2)]
    return int(float(m.group(1)) * unit)


def format_size(size):
    """PyTorch's `format_size` (gpumem-nb's `units::format_size`)."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= MIB:
        return f"{size / 1024:.2f} KiB"
    if size <= GIB:
        return f"{size / MIB:.2f} MiB"
    return f"{size / GIB:.2f} GiB"


def history_row(text, n):
    """The row of cell [n] in `%gpumem history`'s text table."""
    pat = re.compile(r"(^|[\s|│┆])\[" + str(n) + r"\]([\s|│┆]|$)")
    return next((l for l in text.splitlines() if pat.search(l)), None)


def oom_checks(nb, opts, C):
    """Out-of-memory notebooks, by cell tags (`--oom`: the notebook must have one):

    - `oom=SIZE` (`96GiB`), the cell that asks for too much: an error output; its record's
      status is `oom`; unless `oom-panics`, the error is `OutOfMemoryError` whose value is
      `CUDA out of memory. Tried to allocate SIZE. GPU N has a total capacity of … of which … is
      free.` and whose traceback says `Asked by OWNER through `API``, the cell and line, what the
      process holds (`its allocations:`), `Holding the most:` and the framework's own
      `CUDA_ERROR_OUT_OF_MEMORY`; with `oom-panics` (burn: cubecl's device thread panics) any
      error naming the size (as PyTorch writes it, or in bytes), status `oom` or `panicked`. The
      record's `oom`: `requested` = SIZE, `device_total` > 0, `device_free` present, `site` in
      this cell (at line N with `oom-line=N`), `top` non-empty with an entry made in the cell
      tagged `oom-holder`, `owner` = `oom-owner=WORD`, `api` = `oom-api=NAME` (any, without it);
    - `after-oom`: the cell ran without an error (status `ok`);
    - `device-fails`: the cell has an error (the device is gone after the panic);
    - `history-oom`: the `%gpumem history` table's row of each `oom=` cell marks its status.
    """
    cells = [(i, c) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]
    holders = []
    ooms = []
    for i, c in cells:
        src, tags, stdout, rec, line, errors = cell_parts(c)
        if "oom-holder" in tags and rec:
            holders.append(rec.get("cell"))
    if opts.oom and not any(t.startswith("oom=") for _, c in cells for t in c.get("metadata", {}).get("tags", [])):
        C.missing(f"notebook {opts.label or opts.path}", "oom", "no cell tagged `oom=SIZE`")
    for i, c in cells:
        src, tags, stdout, rec, line, errors = cell_parts(c)
        w = where_of(i, src, rec)
        tag = lambda name: next((t.split("=", 1)[1] for t in tags if t.startswith(name + "=")), None)
        if "after-oom" in tags:
            C.expect(not errors and rec is not None and rec.get("status") == "ok", w, "after-oom",
                     "ran after the out-of-memory cell" if not errors else
                     f"failed: {errors[0].get('ename')}: {errors[0].get('evalue', '')[:160]}")
        if "device-fails" in tags:
            C.expect(bool(errors), w, "device-fails",
                     f"the device call failed: {errors[0].get('ename')}: {errors[0].get('evalue', '')[:160]}"
                     if errors else "MISSING: no error, though the device thread is gone")
        size = tag("oom")
        if size is None:
            continue
        want = size_of(size)
        text = format_size(want)
        panics = "oom-panics" in tags
        owner, api, at_line = tag("oom-owner"), tag("oom-api"), tag("oom-line")
        if rec is None:
            C.missing(w, "oom-record", "the cell's record (exactly one report)")
            continue
        ooms.append((w, rec))
        e = errors[0] if errors else None
        tb = "\n".join(e.get("traceback", [])) if e else ""
        if e is None:
            C.fail(w, "oom-error", "MISSING: no error output")
        elif panics:
            named = text in e.get("evalue", "") + tb or str(want) in e.get("evalue", "") + tb
            C.expect(named, w, "oom-error",
                     f"{e.get('ename')}: {e.get('evalue', '')[:200]} (names {text} or {want} B: {named})")
        else:
            pat = (r"^CUDA out of memory\. Tried to allocate " + re.escape(text) +
                   r"\. GPU \d+ has a total capacity of [\d.]+ \w+ of which [\d.]+ \w+ is free\.")
            C.expect(e.get("ename") == "OutOfMemoryError" and re.match(pat, e.get("evalue", "")), w, "oom-error",
                     f"{e.get('ename')}: {e.get('evalue', '')[:200]}")
        status = rec.get("status")
        C.expect(status == "oom" or (panics and status == "panicked"), w, "oom-status",
                 f"record status {status!r}" + (" (oom or panicked)" if panics else " (oom)"))
        o = rec.get("oom")
        if not isinstance(o, dict):
            C.missing(w, "oom-record", "record.oom")
            continue
        C.expect(o.get("requested") == want, w, "oom-record", f"oom.requested {o.get('requested')!r}, asked {want:,} B")
        C.expect((o.get("device_total") or 0) > 0 and o.get("device_free") is not None, w, "oom-device",
                 f"oom.device_total {o.get('device_total')!r}, oom.device_free {o.get('device_free')!r}")
        site = o.get("site")
        if not isinstance(site, dict):
            C.missing(w, "oom-site", "oom.site")
        else:
            ok = site.get("cell") == rec.get("cell") and (at_line is None or site.get("line") == int(at_line))
            C.expect(ok, w, "oom-site",
                     f"oom.site cell {site.get('cell')!r} line {site.get('line')!r} ({site.get('function')}), "
                     f"asked at cell {rec.get('cell')!r}" + (f" line {at_line}" if at_line else " (line not known: queued)"))
        top = o.get("top") or []
        if not holders:
            C.missing(w, "oom-top", "a cell tagged `oom-holder` with a record")
        else:
            named = [t for t in top if t.get("cell") in holders]
            C.expect(bool(named), w, "oom-top",
                     f"oom.top names the kept tensor's cell {holders}: "
                     f"{[(t.get('owner'), t.get('bytes'), t.get('cell')) for t in top[:3]] or 'MISSING (empty)'}")
        if owner:
            held = {r.get("owner"): r.get("live") for r in o.get("by_owner") or []}
            C.expect(o.get("owner") == owner and owner in held, w, "oom-owner",
                     f"oom.owner {o.get('owner')!r} (expected {owner!r}); oom.by_owner {held}")
        C.expect(o.get("api") is not None and (api is None or o.get("api") == api), w, "oom-api",
                 f"oom.api {o.get('api')!r}" + (f" (expected {api!r})" if api else ""))
        if e is not None and not panics:
            site_at = f"cell {rec.get('cell')}:{at_line}" if at_line else f"cell {rec.get('cell')}"
            wants = [f"Asked by {owner or o.get('owner')} through `{o.get('api')}`", site_at, "its allocations: ",
                     "Holding the most: ", "CUDA_ERROR_OUT_OF_MEMORY"]
            lacking = [x for x in wants if x not in tb]
            C.expect(not lacking, w, "oom-traceback",
                     "who asked, where, what is held and the framework's error are said" if not lacking else
                     f"the traceback lacks {lacking}")
    for i, c in cells:
        src, tags, stdout, rec, line, errors = cell_parts(c)
        if "history-oom" not in tags:
            continue
        w = where_of(i, src, rec)
        text = "\n".join(
            text_of(o.get("data", {}).get("text/plain")) for o in c.get("outputs", []) if o.get("output_type") in ("display_data", "execute_result")
        )
        if not ooms:
            C.missing(w, "history-oom", "an out-of-memory cell (tag `oom=`) with a record")
        for ow, r in ooms:
            row = history_row(text, r.get("cell"))
            word = {"oom": "oom", "panicked": "panicked"}.get(r.get("status"), "oom")
            C.expect(row is not None and word in row.lower(), w, "history-oom",
                     f"the history's row [{r.get('cell')}] marks {word}: {row!r}" if row else
                     f"MISSING: no row [{r.get('cell')}] in the history: {text[:200]!r}")


# ---------------------------------------------------------------------------------------------
# --self-test: synthetic executed notebooks, shaped as gpumem-kernel writes them, for which every
# issue-54 check is shown to pass when its figures are right and to fail when one is wrong or
# missing.

def _line(rec):
    alla = rec.get("all_allocations") or {}
    lead = lead_of(alla, False)
    head = f"[{rec['cell']}] cuda:0 · 1.00 s"
    if lead is None:
        return f"{head} · no device memory"
    o = next(o for o in alla["by_owner"] if o["owner"] == lead)
    return f"{head} · {lead} {o['after']} B ({o['after'] - (o['before'] or 0):+} B)"


def _rec(cell, owners, nvml, pool=None, stacks=None, status="ok", oom=None):
    """A record: `owners` [(owner, before, after)], `nvml` (before, after) of the process,
    `pool` ((used, reserved) before, (used, reserved) after), `stacks` (bytes a thread before,
    after)."""
    before = sum(b for _, b, _ in owners)
    after = sum(a for _, _, a in owners)
    r = {
        "cell": cell,
        "label": f"cell {cell}",
        "status": status,
        "device": "cuda:0 NVIDIA H100 80GB HBM3",
        "crate_loaded": {"before": True, "after": True},
        "allocator": None,
        "all_allocations": {
            "tracking": "cupti", "device": 0, "before": before, "after": after, "peak": max(before, after),
            "by_source": [], "by_component": [], "top": [], "devices": [],
            "by_owner": [{"owner": n, "before": b, "after": a} for n, b, a in owners],
        },
        "nvml": {"uuid": "GPU-0", "process": {"before": nvml[0], "after": nvml[1]}},
        "pool": None if pool is None else {
            "used": {"before": pool[0][0], "after": pool[1][0]},
            "reserved": {"before": pool[0][1], "after": pool[1][1]},
        },
        "local_memory": [] if stacks is None else [
            {"device": 0, "uuid": "GPU-0", "stack_bytes": {"before": stacks[0], "after": stacks[1]}, "resident_threads": 270_336}
        ],
        "warnings": [],
    }
    if oom is not None:
        r["oom"] = oom
    return r


def _cell(src, rec=None, stdout="", tags=(), error=None, display=None):
    outs = []
    if stdout:
        outs.append({"output_type": "stream", "name": "stdout", "text": stdout})
    if error:
        outs.append({"output_type": "error", **error})
    if display is not None:
        outs.append({"output_type": "display_data", "data": {"text/plain": display}, "metadata": {}})
    if rec is not None:
        outs.append({"output_type": "display_data", "data": {CELL_MIME: rec, "text/plain": _line(rec)}, "metadata": {}})
    return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": src, "outputs": outs}


def _nb(cells):
    return {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# synthetic"}] + cells, "nbformat": 4, "nbformat_minor": 5}


CUBLAS, CURAND, CONTEXT = 67_239_936, 196_608, 530 * MIB


def _candle_corpus():
    """gpu_nocall_candle's shape: no GPU in two cells, the device and 512 MiB (the first GPU cell:
    the context), a 256 MiB product (+1 MiB NVML noise), training steps keeping nothing."""
    no_gpu = lambda n: _rec(n, [], (0, 0))
    base = [("cuBLAS", 0, CUBLAS), ("cuRAND", 0, CURAND)]
    held = [("cuBLAS", CUBLAS, CUBLAS), ("cuRAND", CURAND, CURAND)]
    first_tracked = 512 * MIB + CUBLAS + CURAND
    r3 = _rec(3, [("candle", 0, 512 * MIB)] + base, (0, first_tracked + 32 * MIB + CONTEXT),
              pool=((None, None), (512 * MIB, 544 * MIB)), stacks=(None, 1024))
    n3 = r3["nvml"]["process"]["after"]
    r4 = _rec(4, [("candle", 512 * MIB, 768 * MIB)] + held, (n3, n3 + 257 * MIB),
              pool=((512 * MIB, 544 * MIB), (768 * MIB, 800 * MIB)), stacks=(1024, 1024))
    n4 = r4["nvml"]["process"]["after"]
    r5 = _rec(5, [("candle", 768 * MIB, 768 * MIB)] + held, (n4, n4),
              pool=((768 * MIB, 800 * MIB), (768 * MIB, 800 * MIB)), stacks=(1024, 1024))
    return _nb([
        _cell(':dep candle-core = { version = "0.11", features = ["cuda"] }', no_gpu(1)),
        _cell("use candle_core::Tensor;\nfn bytes(t: &[&Tensor]) -> usize { 0 }", no_gpu(2)),
        _cell("let device = Device::new_cuda(0)?;", r3, "FRAMEWORK_BYTES candle +536870912\n"),
        _cell("let c = a.matmul(&b)?;", r4, "FRAMEWORK_BYTES candle +268435456\n"),
        _cell("for _ in 0..5 { opt.backward_step(&loss)?; }", r5, "FRAMEWORK_BYTES candle +0\n"),
        _cell("%gpumem history", display="cell table"),
    ])


OOM_VALUE = ("CUDA out of memory. Tried to allocate 96.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
             "46.59 GiB is free.")


def _oom_nb(burn=False):
    """gpu_oom_candle's shape (or gpu_oom_burn's, `burn`): the device, 32 GiB kept (cell 3), 96 GiB
    asked (cell 4), then a cell that runs and the history."""
    who = "burn/cubecl" if burn else "candle"
    no_gpu = _rec(1, [], (0, 0))
    base = [] if burn else [("cuBLAS", 0, CUBLAS)]
    held = [] if burn else [("cuBLAS", CUBLAS, CUBLAS)]
    r2 = _rec(2, base, (0, sum(a for _, _, a in base) + CONTEXT), pool=((None, None), (0, 0)), stacks=(None, 1024))
    n2 = r2["nvml"]["process"]["after"]
    r3 = _rec(3, [(who, 0, 32 * GIB)] + held, (n2, n2 + 32 * GIB), pool=((0, 0), (32 * GIB, 32 * GIB)), stacks=(1024, 1024))
    n3 = n2 + 32 * GIB
    held3 = [(who, 32 * GIB, 32 * GIB)] + held
    oom = {
        "device": 0, "count": 1, "requested": 96 * GIB, "device_free": 46 * GIB, "device_total": 79 * GIB,
        "cached_free": 0, "largest_free_block": 0, "why": "the device has 46.59 GiB free",
        "top": [{"owner": "candle_core::…", "bytes": 32 * GIB, "function": "candle_core::tensor::Tensor::zeros",
                 "cell": 3, "line": 1}],
        "api": "cuMemAllocAsync", "owner": who,
        "site": {"owner": "candle_core::…", "bytes": 96 * GIB, "function": "candle_core::tensor::Tensor::zeros",
                 "cell": 4, "line": None if burn else 1, **({"queued": True} if burn else {})},
        "by_owner": [{"owner": who, "live": 32 * GIB}],
    }
    r4 = _rec(4, held3, (n3, n3), pool=((32 * GIB, 32 * GIB), (32 * GIB, 32 * GIB)), stacks=(1024, 1024),
              status="panicked" if burn else "oom", oom=oom)
    if burn:
        err4 = {"ename": "panic", "evalue": "thread 'DSD-0-0' panicked: called `Result::unwrap()` on an `Err` value: "
                "can't allocate buffer of size: 103079215104", "traceback": ["panicked on thread 'DSD-0-0'"]}
    else:
        err4 = {"ename": "OutOfMemoryError", "evalue": OOM_VALUE, "traceback": [
            f"\x1b[1;31mOutOfMemoryError\x1b[0m: {OOM_VALUE}",
            "Asked by candle through `cuMemAllocAsync` at candle_core::tensor::Tensor::zeros ← cell 4:1.",
            "This process has 32.59 GiB in use on GPU 0 (NVML); its allocations: candle 32.00 GiB, cuBLAS 64.1 MiB; "
            "other processes 0 B.",
            "Holding the most: candle_core::tensor::Tensor::zeros ← cell 3:1 (32.00 GiB).",
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")",
        ]}
    oom_tags = ["raises-exception", "oom=96GiB", f"oom-owner={who}"] + (
        ["oom-panics"] if burn else ["oom-line=1", "oom-api=cuMemAllocAsync"])
    cells = [
        _cell(":dep candle-core", no_gpu),
        _cell("let device = Device::new_cuda(0)?;", r2),
        _cell("let kept = Tensor::zeros((8192, 1 << 20), DType::F32, &device)?;", r3,
              f"FRAMEWORK_BYTES {who} +34359738368\n", tags=["oom-holder"]),
        _cell("let big = Tensor::zeros((3 * 8192, 1 << 20), DType::F32, &device)?;", r4, tags=oom_tags, error=err4),
    ]
    n = 5
    if burn:
        r5 = _rec(5, held3, (n3, n3), pool=((32 * GIB, 32 * GIB), (32 * GIB, 32 * GIB)), stacks=(1024, 1024),
                  status="panicked")
        cells.append(_cell("let small = Tensor::<B, 2>::ones([1024, 1024], &device);", r5,
                           tags=["raises-exception", "device-fails"],
                           error={"ename": "panic", "evalue": "the device thread is gone", "traceback": []}))
        n = 6
        rn = _rec(n, held3, (n3, n3), pool=((32 * GIB, 32 * GIB), (32 * GIB, 32 * GIB)), stacks=(1024, 1024))
        cells.append(_cell("let host: Vec<f32> = vec![1.0; 1 << 20];", rn, tags=["after-oom"]))
    else:
        rn = _rec(n, [(who, 32 * GIB, 32 * GIB + 4 * MIB)] + held, (n3, n3 + 32 * MIB),
                  pool=((32 * GIB, 32 * GIB), (32 * GIB + 4 * MIB, 32 * GIB + 32 * MIB)), stacks=(1024, 1024))
        cells.append(_cell("let small = Tensor::ones((1024, 1024), DType::F32, &device)?;", rn,
                           "FRAMEWORK_BYTES candle +4194304\n", tags=["after-oom"]))
    mark = "panicked" if burn else "OOM"
    table = "\n".join([
        "┌──────┬───────┬──────┐",
        "│ cell ┆ Δ all ┆ notes │",
        "╞══════╪═══════╪══════╡",
        "│ [3]  ┆ 32.0 GiB ┆      │",
        f"│ [4]  ┆ 0 B   ┆ {mark} │",
        f"│ [{n}]  ┆ 0 B   ┆      │",
        "└──────┴───────┴──────┘",
    ])
    cells.append(_cell("%gpumem history", tags=["history-oom"], display=table))
    return _nb(cells)


def _checks_nb():
    """The checks before issue 54 (`failures`), each on a cell of its own with the figures it reads:
    cuBLAS's 256 MiB workspace from the CUDA pool, matched by NVML (`nvml-matches`), the cell's value
    naming its sites (`top-names`, `site`), the allocator's count returned (`returns-allocated`), the
    line's text (`line-has`), cubecl's books (`cubecl-pools`, `cubecl-matches-tracked`,
    `queued-lands`) and the components (`components-add-up`, `component-delta`)."""
    def rec(cell):
        r = _rec(cell, [("cuBLAS", 0, 256 * MIB)], (0, 256 * MIB), pool=((0, 0), (256 * MIB, 256 * MIB)))
        r["allocator"] = {"allocated": {"before": 0, "after": 0}, "reserved": {"before": 0, "after": 0}}
        r["all_allocations"].update(
            by_source=[{"source": "pool", "delta": 256 * MIB}],
            by_component=[{"component": "workspace", "before": 0, "after": 256 * MIB, "peak": 256 * MIB}],
            top=[{"owner": "cuBLAS", "bytes": 256 * MIB, "function": "cublasCreate_v2", "cell": cell, "line": 1}],
        )
        span = lambda b, a: {"before": b, "after": a}
        r["frameworks"] = [{"framework": "cubecl", "in_use": span(0, 200 * MIB), "padding": span(0, 0),
                            "cached": span(0, 56 * MIB), "reserved": span(0, 256 * MIB)}]
        return r

    def cell(n, tags, result=None):
        c = _cell(f"let x{n} = workspace();", rec(n), tags=tags)
        if result is not None:
            c["outputs"].append({"output_type": "execute_result", "data": {"text/plain": result}, "metadata": {},
                                 "execution_count": n})
        return c

    return _nb([
        cell(1, ["nvml-matches"]),
        cell(2, ["top-names=cuBLAS"], result="cuBLAS 256 MiB cublasCreate_v2 ← cell 2"),
        cell(3, ["site=cublasCreate_v2@1"]),
        cell(4, ["returns-allocated"], result="0"),
        cell(5, ["line-has=cuda:0"]),
        cell(6, ["cubecl-pools", "cubecl-matches-tracked", "queued-lands"]),
        cell(7, ["components-add-up", "component-delta=workspace:268435456"]),
    ])


def _code(nb, n):
    """The notebook's code cell `n` (0-based)."""
    return [c for c in nb["cells"] if c["cell_type"] == "code"][n]


def _record(nb, n):
    return next(o["data"][CELL_MIME] for o in _code(nb, n)["outputs"] if CELL_MIME in o.get("data", {}))


def _set_record(nb, n, f):
    """Changes cell n's record with f, and its line to match (as the kernel would write it)."""
    for o in _code(nb, n)["outputs"]:
        if CELL_MIME in o.get("data", {}):
            f(o["data"][CELL_MIME])
            o["data"]["text/plain"] = _line(o["data"][CELL_MIME])


def _owner(rec, name):
    return next(o for o in rec["all_allocations"]["by_owner"] if o["owner"] == name)


def _grow(rec, name, by):
    _owner(rec, name)["after"] += by
    rec["all_allocations"]["after"] += by


def _error(nb, n):
    return next(o for o in _code(nb, n)["outputs"] if o.get("output_type") == "error")


def _drop_outputs(nb, n, kind):
    c = _code(nb, n)
    c["outputs"] = [o for o in c["outputs"] if not kind(o)]


def self_test():
    import contextlib
    import copy
    import io

    def run(nb, args):
        opts = Options(["synthetic.ipynb"] + args)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            global_checks = _Capture()
            code = _check_capturing(nb, opts, global_checks)
        return code, global_checks, buf.getvalue()

    corpus = ["--corpus", "--require-tracking", "cupti"]
    oomargs = corpus + ["--oom"]
    def mutate(base, f):
        nb = copy.deepcopy(base)
        f(nb)
        return nb

    cand, oomc, oomb, legacy = _candle_corpus(), _oom_nb(), _oom_nb(burn=True), _checks_nb()

    def books(before, after, on_line=True, part=True):
        """A burn cell that printed cubecl's books (+3 MiB in use) and the record's reading."""
        r = _rec(1, [("burn/cubecl", 0, 4 * MIB)], (0, 4 * MIB + CONTEXT), pool=((None, None), (4 * MIB, 4 * MIB)),
                 stacks=(None, 1024))
        if part:
            r["frameworks"] = [{"framework": "cubecl", "device": "cuda:0 stream 0", "in_use": {"before": before, "after": after},
                                "padding": {"before": 0, "after": 0}, "reserved": {"before": 0, "after": 4 * MIB}}]
        c = _cell("let t = x;", r, f"FRAMEWORK_BYTES burn/cubecl +{4 * MIB}\nFRAMEWORK_IN_USE burn/cubecl +{3 * MIB}\n")
        if on_line:
            for o in c["outputs"]:
                if "text/plain" in o.get("data", {}):
                    o["data"]["text/plain"] += " · cubecl in use 3.00 MiB (+3.00 MiB, cached 1.00 MiB)"
        return _nb([c])

    def probed(after, on_line=True, part=True):
        """A burn cell that printed Adam's moments (+8 MiB) and the record's probe of its variables."""
        nb = books(0, 3 * MIB, on_line=False)
        if part:
            _set_record(nb, 0, lambda r: r.update(variables={"framework": "burn", "components": [
                {"component": "parameter", "before": 4 * MIB, "after": 4 * MIB},
                {"component": "optimizer_state", "before": 0, "after": after}]}))
        for o in _code(nb, 0)["outputs"]:
            if o.get("output_type") == "stream":
                o["text"] += f"FRAMEWORK_COMPONENT optimizer_state +{8 * MIB}\n"
            if "text/plain" in o.get("data", {}):
                o["data"]["text/plain"] += " · cubecl in use 3.00 MiB (+3.00 MiB, cached 1.00 MiB)"
                if on_line:
                    o["data"]["text/plain"] += " · burn: parameter 4.00 MiB, optimizer_state 8.00 MiB (+8.00 MiB)"
        return nb

    cupti = ["--require-tracking", "cupti"]
    tag = lambda n, *tags: (lambda nb: _code(nb, n)["metadata"].update(tags=list(tags)))
    cases = [
        # The checks before issue 54: a figure a tag needs that is missing fails ("legacy:" and
        # the failure's words), never a pass.
        ("the checks before issue 54 as recorded", legacy, cupti, None),
        ("nvml-matches: NVML's process figures missing", mutate(legacy, lambda nb: _set_record(
            nb, 0, lambda r: r["nvml"].update(process={}))), cupti, "legacy:MISSING figures for nvml-matches"),
        ("nvml-matches: no NVML in the record", mutate(legacy, lambda nb: _set_record(nb, 0, lambda r: r.pop("nvml"))),
         cupti, "legacy:MISSING figures for nvml-matches"),
        ("nvml-matches: the CUDA pool's reserved missing", mutate(legacy, lambda nb: _set_record(
            nb, 0, lambda r: r["pool"].pop("reserved"))), cupti, "legacy:MISSING figures for nvml-matches"),
        ("nvml-matches: NVML 3 MiB past the crate's reserved", mutate(legacy, lambda nb: _set_record(
            nb, 0, lambda r: r["nvml"]["process"].update(after=259 * MIB))), cupti, "legacy:unexplained"),
        ("top-names: an empty name", mutate(legacy, tag(1, "top-names=")), cupti, "legacy:names an empty site"),
        ("top-names: a name the value lacks", mutate(legacy, tag(1, "top-names=cuBLAS,candle")), cupti,
         "legacy:'candle' not in the top table"),
        ("site: no function", mutate(legacy, tag(2, "site=@1")), cupti, "legacy:names no function"),
        ("site: not in the top", mutate(legacy, tag(2, "site=cublasCreate_v2@2")), cupti, "legacy:no site"),
        ("returns-allocated: the report's figure missing, the cell returned None", mutate(legacy, lambda nb: (
            _set_record(nb, 3, lambda r: r["allocator"].pop("allocated")),
            _code(nb, 3)["outputs"][-1]["data"].update({"text/plain": "None"}))), cupti,
         "legacy:MISSING the report's figure for returns-allocated"),
        ("line-has: no text", mutate(legacy, tag(4, "line-has=")), cupti, "legacy:names no text"),
        ("nvml-named-each: one device", mutate(legacy, tag(4, "nvml-named-each")), cupti,
         "legacy:MISSING NVML's change on another device"),
        ("cubecl-pools: padding missing", mutate(legacy, lambda nb: _set_record(
            nb, 5, lambda r: r["frameworks"][0].pop("padding"))), cupti, "legacy:MISSING cubecl numbers"),
        ("queued-lands: cubecl's in use missing", mutate(legacy, lambda nb: _set_record(
            nb, 5, lambda r: r["frameworks"][0].pop("in_use"))), cupti, "legacy:MISSING cubecl's in use"),
        ("cubecl-matches-tracked: by_source missing", mutate(legacy, lambda nb: _set_record(
            nb, 5, lambda r: r["all_allocations"].pop("by_source"))), cupti, "legacy:MISSING all_allocations.by_source"),
        ("components: by_component missing", mutate(legacy, lambda nb: _set_record(
            nb, 6, lambda r: r["all_allocations"].pop("by_component"))), cupti,
         "legacy:MISSING all_allocations.by_component"),
        ("--require-tracking, the crate never loaded", mutate(legacy, lambda nb: [_set_record(
            nb, n, lambda r: r.update(crate_loaded={"before": False, "after": False})) for n in range(7)]), cupti,
         "legacy:no record says the crate loaded"),
        ("no report in any cell", mutate(legacy, lambda nb: [_drop_outputs(
            nb, n, lambda o: CELL_MIME in o.get("data", {})) for n in range(7)]), cupti + ["--stock"],
         "legacy:no cell has a report"),
        ("--stock: a tagged cell without its record", mutate(legacy, lambda nb: _drop_outputs(
            nb, 2, lambda o: CELL_MIME in o.get("data", {}))), cupti + ["--stock", "--no-lines"], "legacy:0 reports"),
        ("--stock: an untagged cell without its record", mutate(legacy, lambda nb: (tag(2)(nb), _drop_outputs(
            nb, 2, lambda o: CELL_MIME in o.get("data", {})))), cupti + ["--stock", "--no-lines"], None),
        # Issue 54.
        # (what, notebook, args, the check that must fail; None: nothing may fail)
        ("candle corpus as recorded", cand, corpus, None),
        ("kernel stacks raised and counted", mutate(cand, lambda nb: _set_record(nb, 3, lambda r: (
            r["local_memory"][0]["stack_bytes"].update(after=2048),
            r["nvml"]["process"].update(after=r["nvml"]["process"]["after"] + 264 * MIB)))), corpus, None),
        ("kernel stacks raised, NVML unchanged", mutate(cand, lambda nb: _set_record(nb, 3, lambda r: (
            r["local_memory"][0]["stack_bytes"].update(after=2048)))), corpus, "nvml-explained"),
        ("tracked change one byte off the printed bytes", mutate(cand, lambda nb: _set_record(nb, 2, lambda r: _grow(r, "candle", 1))),
         corpus, "framework-bytes"),
        ("by_owner missing", mutate(cand, lambda nb: _set_record(nb, 2, lambda r: r["all_allocations"].pop("by_owner"))),
         corpus, "framework-bytes"),
        ("the owner's before not read", mutate(cand, lambda nb: _set_record(nb, 3, lambda r: _owner(r, "candle").update(before=None))),
         corpus, "framework-bytes"),
        ("the framework's owner absent, the list incomplete", mutate(cand, lambda nb: _set_record(nb, 3, lambda r: (
            r["all_allocations"].update(by_owner=[o for o in r["all_allocations"]["by_owner"] if o["owner"] != "candle"])))),
         corpus, "framework-bytes"),
        ("the record missing in a cell that printed", mutate(cand, lambda nb: _drop_outputs(nb, 3, lambda o: CELL_MIME in o.get("data", {}))),
         corpus, "framework-bytes"),
        ("no FRAMEWORK_BYTES anywhere", mutate(cand, lambda nb: [_drop_outputs(nb, n, lambda o: o.get("output_type") == "stream") for n in range(5)]),
         corpus, "framework-bytes"),
        ("`allocated 0 B` in a line", mutate(cand, lambda nb: _code(nb, 3)["outputs"][-1]["data"].update(
            {"text/plain": _line(_record(nb, 3)) + " · allocated 0 B (±0 B)"})), corpus, "no-allocated-0"),
        ("the line leads with another owner", mutate(cand, lambda nb: _code(nb, 2)["outputs"][-1]["data"].update(
            {"text/plain": "[3] cuda:0 · 1.00 s · cuBLAS 64.1 MiB (+64.1 MiB) · candle 512 MiB (+512 MiB)"})),
         corpus, "line-lead"),
        ("another owner changed most in a cell that printed", mutate(cand, lambda nb: _set_record(nb, 3, lambda r: (
            _grow(r, "cuBLAS", 300 * MIB), r["nvml"]["process"].update(after=r["nvml"]["process"]["after"] + 300 * MIB)))),
         corpus, "line-lead"),
        ("the owners' after do not add up", mutate(cand, lambda nb: _set_record(nb, 3, lambda r: r["all_allocations"].update(
            after=r["all_allocations"]["after"] + 4096))), corpus, "owners-add-up"),
        ("a record without all_allocations", mutate(cand, lambda nb: _set_record(nb, 1, lambda r: r.pop("all_allocations"))),
         corpus, "tracking"),
        ("nothing tracked, +0 printed, no owner list", mutate(cand, lambda nb: (
            _set_record(nb, 1, lambda r: r["all_allocations"].pop("by_owner")),
            _code(nb, 1)["outputs"].insert(0, {"output_type": "stream", "name": "stdout", "text": "FRAMEWORK_BYTES candle +0\n"}))),
         corpus, None),
        ("tracking not CUPTI", mutate(cand, lambda nb: _set_record(nb, 2, lambda r: r["all_allocations"].update(tracking="simulated"))),
         corpus, "tracking"),
        ("NVML 3 MiB past what is named", mutate(cand, lambda nb: _set_record(nb, 3, lambda r: r["nvml"]["process"].update(
            after=r["nvml"]["process"]["after"] + 2 * MIB))), corpus, "nvml-explained"),
        ("NVML's process figures missing", mutate(cand, lambda nb: _set_record(nb, 3, lambda r: r["nvml"].update(process={}))),
         corpus, "nvml-explained"),
        ("the CUDA pool missing", mutate(cand, lambda nb: _set_record(nb, 3, lambda r: r.update(pool=None))), corpus, "nvml-explained"),
        ("the pool's used missing", mutate(cand, lambda nb: _set_record(nb, 3, lambda r: r["pool"].pop("used"))), corpus, "nvml-explained"),
        ("the kernel stacks missing", mutate(cand, lambda nb: _set_record(nb, 3, lambda r: r.update(local_memory=[]))),
         corpus, "nvml-explained"),
        ("the context's cost negative", mutate(cand, lambda nb: _set_record(nb, 2, lambda r: r["nvml"]["process"].update(
            after=r["all_allocations"]["after"]))), corpus, "nvml-explained"),
        ("a cell calls gpumem-nb", mutate(cand, lambda nb: _code(nb, 1).update(source="gpumem_nb::mem::preload()?;")),
         corpus, "no-call"),
        ("the dep variant without its first cell", cand, corpus + ["--variant", "dep"], "no-call"),
        ("the dep variant", mutate(cand, lambda nb: nb["cells"].insert(1, _cell(":dep gpumem-nb", _rec(0, [], (0, 0))))),
         corpus + ["--variant", "dep"], None),
        ("shapes within a page", _nb([
            _cell("let t = x;", _rec(1, [("burn/cubecl", 0, 2 * MIB)], (0, 2 * MIB + CONTEXT), pool=((None, None), (2 * MIB, 2 * MIB)),
                                     stacks=(None, 1024)), "FRAMEWORK_SHAPES burn/cubecl +1000000 page=2097152\n")]), corpus, None),
        ("shapes past a page", _nb([
            _cell("let t = x;", _rec(1, [("burn/cubecl", 0, 4 * MIB)], (0, 4 * MIB + CONTEXT), pool=((None, None), (4 * MIB, 4 * MIB)),
                                     stacks=(None, 1024)), "FRAMEWORK_SHAPES burn/cubecl +1000000 page=2097152\n")]), corpus, "framework-bytes"),
        ("cubecl's books as printed", books(0, 3 * MIB), corpus, None),
        ("cubecl's books differ from what it printed", books(0, 3 * MIB - 4096), corpus, "framework-books"),
        ("cubecl's books without a before", books(None, 3 * MIB), corpus, "framework-books"),
        ("cubecl's books not on the line", books(0, 3 * MIB, on_line=False), corpus, "framework-books"),
        ("cubecl's books missing", books(0, 3 * MIB, part=False), corpus, "framework-books"),
        ("burn's variables by the probe as printed", probed(8 * MIB), corpus, None),
        ("burn's optimizer state by the probe off by 4 bytes", probed(8 * MIB - 4), corpus, "framework-component"),
        ("burn's components not on the line", probed(8 * MIB, on_line=False), corpus, "framework-component"),
        ("no probe: tracked has no optimizer_state", probed(8 * MIB, part=False), corpus, "framework-component"),
        ("the kernel's exit status", cand, corpus + ["--kernel-exit", "1"], "kernel-exit"),
        # Out of memory.
        ("candle out of memory as recorded", oomc, oomargs, None),
        ("burn out of memory as recorded", oomb, oomargs, None),
        ("--oom without an oom cell", cand, corpus + ["--oom"], "oom"),
        ("the error names another size", mutate(oomc, lambda nb: _error(nb, 3).update(evalue=OOM_VALUE.replace("96.00", "64.00"))),
         oomargs, "oom-error"),
        ("the error is not OutOfMemoryError", mutate(oomc, lambda nb: _error(nb, 3).update(ename="Error")), oomargs, "oom-error"),
        ("the error's capacity clause missing", mutate(oomc, lambda nb: _error(nb, 3).update(
            evalue="CUDA out of memory. Tried to allocate 96.00 GiB.")), oomargs, "oom-error"),
        ("no error output", mutate(oomc, lambda nb: _drop_outputs(nb, 3, lambda o: o.get("output_type") == "error")),
         oomargs, "oom-error"),
        ("status not oom", mutate(oomc, lambda nb: _set_record(nb, 3, lambda r: r.update(status="error"))), oomargs, "oom-status"),
        ("record.oom missing", mutate(oomc, lambda nb: _set_record(nb, 3, lambda r: r.pop("oom"))), oomargs, "oom-record"),
        ("requested another size", mutate(oomc, lambda nb: _set_record(nb, 3, lambda r: r["oom"].update(requested=GIB))),
         oomargs, "oom-record"),
        ("the site's line another", mutate(oomc, lambda nb: _set_record(nb, 3, lambda r: r["oom"]["site"].update(line=2))),
         oomargs, "oom-site"),
        ("the site's cell another", mutate(oomc, lambda nb: _set_record(nb, 3, lambda r: r["oom"]["site"].update(cell=3))),
         oomargs, "oom-site"),
        ("the site missing", mutate(oomc, lambda nb: _set_record(nb, 3, lambda r: r["oom"].pop("site"))), oomargs, "oom-site"),
        ("device_total 0", mutate(oomc, lambda nb: _set_record(nb, 3, lambda r: r["oom"].update(device_total=0))),
         oomargs, "oom-device"),
        ("device_free missing", mutate(oomc, lambda nb: _set_record(nb, 3, lambda r: r["oom"].pop("device_free"))),
         oomargs, "oom-device"),
        ("top empty", mutate(oomc, lambda nb: _set_record(nb, 3, lambda r: r["oom"].update(top=[]))), oomargs, "oom-top"),
        ("top names another cell", mutate(oomc, lambda nb: _set_record(nb, 3, lambda r: r["oom"]["top"][0].update(cell=2))),
         oomargs, "oom-top"),
        ("no holder tagged", mutate(oomc, lambda nb: _code(nb, 2)["metadata"].update(tags=[])), oomargs, "oom-top"),
        ("owner another", mutate(oomc, lambda nb: _set_record(nb, 3, lambda r: r["oom"].update(owner="cudarc"))),
         oomargs, "oom-owner"),
        ("api missing", mutate(oomc, lambda nb: _set_record(nb, 3, lambda r: r["oom"].pop("api"))), oomargs, "oom-api"),
        ("api another", mutate(oomc, lambda nb: _set_record(nb, 3, lambda r: r["oom"].update(api="cuMemAlloc"))),
         oomargs, "oom-api"),
        ("the traceback says not who asked", mutate(oomc, lambda nb: _error(nb, 3).update(
            traceback=[l for l in _error(nb, 3)["traceback"] if not l.startswith("Asked by")])), oomargs, "oom-traceback"),
        ("the traceback lacks the framework's error", mutate(oomc, lambda nb: _error(nb, 3).update(
            traceback=_error(nb, 3)["traceback"][:-1])), oomargs, "oom-traceback"),
        ("the history does not mark the cell", mutate(oomc, lambda nb: _code(nb, 5)["outputs"][0]["data"].update(
            {"text/plain": _code(nb, 5)["outputs"][0]["data"]["text/plain"].replace("OOM", "   ")})), oomargs, "history-oom"),
        ("the history has no row for the cell", mutate(oomc, lambda nb: _code(nb, 5)["outputs"][0]["data"].update(
            {"text/plain": "no table"})), oomargs, "history-oom"),
        ("the cell after it failed", mutate(oomc, lambda nb: _code(nb, 4)["outputs"].append(
            {"output_type": "error", "ename": "Error", "evalue": "DriverError", "traceback": []})), oomargs, "after-oom"),
        ("burn: the panic names no size", mutate(oomb, lambda nb: _error(nb, 3).update(evalue="thread 'DSD-0-0' panicked")),
         oomargs, "oom-error"),
        ("burn: the device cell did not fail", mutate(oomb, lambda nb: _drop_outputs(nb, 4, lambda o: o.get("output_type") == "error")),
         oomargs, "device-fails"),
        ("burn: status ok", mutate(oomb, lambda nb: _set_record(nb, 3, lambda r: r.update(status="ok"))), oomargs, "oom-status"),
    ]
    bad = 0
    for what, nb, args, want in cases:
        code, checks, out = run(nb, args)
        failed = checks.failed_checks() | ({"legacy"} if checks.legacy else set())
        if want is None:
            ok = code == 0 and not failed
            detail = "every check passed" if ok else f"failed: {sorted(failed)} {checks.legacy[:2]} " + "; ".join(
                f"{l['check']}: {l['message']}" for l in checks.lines if not l["ok"])[:600]
        elif want.startswith("legacy:"):
            words = want[len("legacy:"):]
            hit = next((f for f in checks.legacy if words in f), None)
            ok = code != 0 and hit is not None
            detail = (f"FAIL as it should: {hit}" if ok
                      else f"expected a failure saying {words!r}, got {checks.legacy or 'no failure'} (exit {code})")
        else:
            ok = code != 0 and want in failed
            detail = (f"FAIL [{want}] as it should: " + next(l["message"] for l in checks.lines if not l["ok"] and l["check"] == want)
                      if ok else f"expected FAIL [{want}], got {sorted(failed) or 'no failure'} (exit {code})")
        bad += not ok
        print(f"{'PASS' if ok else 'FAIL'} self-test: {what}: {detail[:300]}")
    print(f"self-test: {len(cases) - bad} of {len(cases)} cases as expected")
    return 1 if bad else 0


class _Capture:
    """What one check() call found: the issue-54 checks and the earlier ones' failures."""

    def __init__(self):
        self.lines, self.legacy = [], []

    def failed_checks(self):
        return {l["check"] for l in self.lines if not l["ok"]}

    @property
    def failed(self):
        return sum(not l["ok"] for l in self.lines)


def _check_capturing(nb, opts, capture):
    """check(), keeping its findings in `capture` (read from its JSON output)."""
    import os
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        opts.out_json = path
        code = check(nb, opts)
        found = json.load(open(path))
        capture.lines = found.get("checks", [])
        capture.legacy = found.get("failures", [])
        return code
    finally:
        os.remove(path)


if __name__ == "__main__":
    sys.exit(main())
