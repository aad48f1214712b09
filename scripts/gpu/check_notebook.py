#!/usr/bin/env python3
"""Checks an executed notebook's per-cell reports against the crate's own numbers and NVML.

    check_notebook.py EXECUTED.ipynb [--require-tracking cupti] [--json OUT.json] [--no-lines] [--stock]

For every code cell it prints the report line and, where the record has them, the allocator's
reserved delta, the CUDA pool's reserved delta, the tracked ("all allocations") delta, NVML's
per-process delta, and what of NVML's delta the tracked allocations do not explain.

Assertions (exit 1 when one fails):
- every code cell that ran code has exactly one report, and no cell errored (unless tagged
  `raises-exception`);
- with --require-tracking, every report after the crate loaded says that tracking mode;
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

--stock (the stock evcxr kernel): a record comes only beside a cell's value, so cells without one
are listed but not failed (tagged cells end in a value, and must have one), and the warnings
(re-run leaks) are gpumem-kernel's: growth tags are skipped. Cells tagged `not-stock` are listed
as skipped, with the reason: their computation is wrong in the stock kernel (candle's tensor ids
come from a static counter, one per cell there, so a `backward` over tensors from several cells
mixes their gradients up).
"""
import json
from html import unescape
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
    path = args[0]
    require = args[args.index("--require-tracking") + 1] if "--require-tracking" in args else None
    out_json = args[args.index("--json") + 1] if "--json" in args else None
    no_lines = "--no-lines" in args
    stock = "--stock" in args
    nb = json.load(open(path))
    failures, rows = [], []
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
                if name not in (result or ""):
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
        checked = {"nvml-matches", "cubecl-pools", "cubecl-matches-tracked", "returns-allocated", "returns-reserved"}
        if stock and not recs and not checked & set(tags):
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
        if require and r.get("crate_loaded", {}).get("after") and alla.get("tracking") != require:
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
            if not cubecl or cubecl.get("error") or (cubecl.get("reserved") or {}).get("after") is None:
                failures.append(f"cell {i} ({first}): no cubecl numbers in the record: {cubecl}")
            else:
                after = lambda k: (cubecl.get(k) or {}).get("after") or 0
                if after("in_use") + after("padding") + after("cached") != after("reserved"):
                    failures.append(f"cell {i} ({first}): cubecl's in use + padding + cached != reserved: {cubecl}")
        if "cubecl-matches-tracked" in tags:
            got, want = source_delta(alla, "driver") + source_delta(alla, "pool"), row.get("cubecl_reserved_delta")
            if want is None or abs(got - want) > 2 * MIB:
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
        if "nvml-matches" in tags and row["unexplained_by_tracking"] is not None:
            if abs(row["unexplained_by_tracking"]) > 2 * MIB:
                failures.append(
                    f"cell {i} ({first}): NVML Δ {nv} vs the crate's reserved Δ {reserved} "
                    f"({row['unexplained_by_tracking'] / MIB:+.2f} MiB unexplained)"
                )
        fault_checks(i, first, tags, errors, r, row["line"], failures)
        queued_checks(i, first, tags, r, alla, cubecl, row, failures)
        html = "".join(next((o["data"].get("text/html", "") for o in outs if CELL_MIME in o.get("data", {})), ""))
        device_checks(i, first, tags, r, alla, row, html, failures)
    history_checks(nb, failures)
    for row in rows:
        print(json.dumps(row))
    if out_json:
        json.dump({"cells": rows, "failures": failures}, open(out_json, "w"), indent=1)
    for f in failures:
        print("FAIL:", f)
    print(f"{path}: {len(rows)} reports, {len(failures)} failures")
    return 1 if failures else 0


def component_checks(i, first, tags, alla, result, failures):
    """Issue 33: what the memory is, against the model's own counts (the cell's value)."""
    parts = {c["component"]: c for c in alla.get("by_component") or []}
    if "components-add-up" in tags:
        after = sum(c["after"] for c in parts.values())
        if not parts or after != alla.get("after"):
            failures.append(f"cell {i} ({first}): components add up to {after}, tracked {alla.get('after')}: {parts}")
        befores = [c.get("before") for c in parts.values()]
        if None not in befores and alla.get("before") is not None and sum(befores) != alla["before"]:
            failures.append(f"cell {i} ({first}): components before add up to {sum(befores)}, tracked {alla['before']}")
    kinds = ("component-delta=", "component-after=", "component-peak=", "component-rise=")
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
        if tag[len("line-has="):] not in row["line"]:
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
        after = lambda k: ((cubecl or {}).get(k) or {}).get("after") or 0
        held = after("in_use") + after("cached")
        if not cubecl or got + 2 * MIB < held:
            failures.append(f"{where}: tracked driver + pool Δ {got} < cubecl's in use + cached after {held}")
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


if __name__ == "__main__":
    sys.exit(main())
