#!/usr/bin/env python3
"""Holds an executed notebooks/gpu_trim_candle.ipynb (or gpu_trim_burn.ipynb) to what the
cache's owner and NVML say (issue 57's trim criterion): in the cell tagged `trim`, OWNER's row for
cuda:0 (the CUDA pool, where candle allocates; `cubecl` for burn: cubecl's own books, which the
kernel read with no call of the notebook's) held the dropped 1 GiB cached and gave back at least
95 % of what it reserved beyond what is in use, and NVML's figure of the process fell by what it
gave back within 2 MiB (NVML's granularity; for cubecl, what the CUDA pool under it gave back,
which holds cubecl's pages); the trim cell has a record (it is measured) whose
line shows a change; the cell after it runs. Prints PASS/FAIL lines; exits 1 on any FAIL.

    trim_check.py EXECUTED.ipynb [--owner OWNER]      (OWNER: `CUDA pool`, the default, or `cubecl`)
"""
import json
import sys

from check_notebook import text_of

TRIM = "application/vnd.gpumem.trim+json"
CELL = "application/vnd.gpumem.cell+json"
MIB = 1 << 20


def main():
    args = sys.argv[1:]
    owner = "CUDA pool"
    if "--owner" in args:
        i = args.index("--owner")
        owner = args[i + 1]
        del args[i:i + 2]
    path = args[0]
    nb = json.load(open(path))
    fails = 0

    def check(ok, what):
        nonlocal fails
        print(("PASS " if ok else "FAIL ") + what)
        fails += not ok

    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    i = next((n for n, c in enumerate(code) if "trim" in c.get("metadata", {}).get("tags", [])), None)
    if i is None:
        check(False, "a cell tagged `trim`")
        return 1
    cell = code[i]
    figures = next((o["data"][TRIM] for o in cell.get("outputs", []) if TRIM in o.get("data", {})), None)
    record = next((o["data"][CELL] for o in cell.get("outputs", []) if CELL in o.get("data", {})), None)
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    check(not errors, f"the trim cell ran without an error {[e.get('evalue') for e in errors]}")
    check(figures is not None, "the trim cell shows its figures")
    check(record is not None, "the trim cell has a record (it is measured)")
    if figures is None:
        return 1
    # cubecl names its device in its words (`cuda:0 stream 0`).
    pool = [r for r in figures["trimmed"] if r["owner"] == owner and r["device"].split(" ")[0] == "cuda:0"]
    check(len(pool) == 1 and not pool[0].get("error"), f"cuda:0's {owner} was trimmed: {pool}")
    if not pool:
        return 1
    p = pool[0]
    given = p["reserved_before"] - p["reserved_after"]
    cached = p["reserved_before"] - p["in_use"]
    check(cached >= 1 << 30, f"the pool held the dropped 1 GiB cached: reserved {p['reserved_before']:,} B, "
          f"in use {p['in_use']:,} B")
    check(given >= 0.95 * cached, f"given back {given:,} B >= 95 % of the {cached:,} B reserved beyond use")
    nvml = figures.get("process") or []
    check(len(nvml) >= 1, f"NVML's figure of the process before and after: {nvml}")
    # What reaches the driver: cubecl frees its pages into the CUDA pool (cuMemFreeAsync), and the
    # trim then gives the pool's back; NVML falls by that, which holds cubecl's.
    driver, whose = given, owner
    if owner == "cubecl":
        under = [r for r in figures["trimmed"] if r["owner"] == "CUDA pool" and r["device"] == "cuda:0"]
        check(len(under) == 1, f"the CUDA pool under cubecl was trimmed after it: {under}")
        if under:
            driver, whose = under[0]["reserved_before"] - under[0]["reserved_after"], "CUDA pool under cubecl"
            check(driver >= given, f"the CUDA pool gave the driver {driver:,} B, cubecl's {given:,} B among them")
    if nvml:
        fell = nvml[0]["before"] - nvml[0]["after"]
        check(abs(fell - driver) <= 2 * MIB, f"NVML fell {fell:,} B, the {whose} gave back {driver:,} B (within 2 MiB)")
    if record:
        line = next((text_of(o["data"].get("text/plain")) for o in cell["outputs"] if CELL in o.get("data", {})), "")
        check("(-" in line, f"the line shows the change: {line}")
    after = code[i + 1] if i + 1 < len(code) else None
    check(after is not None and not any(o.get("output_type") == "error" for o in after.get("outputs", [])),
          "the cell after the trim runs")
    print(f"{path}: {fails} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
