#!/usr/bin/env python3
"""Holds an executed notebooks/gpu_fit_nocall.ipynb to the session it planned from (issue 57, fit
from any session): every `%gpumem fit SIZE` cell answers with a plan (no error), whose peak
(`requested_peak`, every source at its requested size) equals the largest peak the records of
the cells before it tracked on device 0 (what the framework's allocations reached, counted by
CUPTI), and whose live peak (the driver's 2 MiB granularity) is no smaller; a SIZE below that peak fits under no policy
and names the cell whose request fails first; a SIZE of four times the peak or more fits under
every policy; a `%gpumem snapshot` cell writes its files. Prints PASS/FAIL lines; exits 1 on any
FAIL.

    fit_session_check.py EXECUTED.ipynb
    fit_session_check.py --self-test          (each check fails when its figure is broken)
"""
import copy
import json
import re
import sys

from check_notebook import size_of, text_of

FIT = "application/vnd.gpumem.fit+json"
CELL = "application/vnd.gpumem.cell+json"


def source(cell):
    return text_of(cell.get("source"))


def device0_peak(record):
    alla = record.get("all_allocations") or {}
    return next((p.get("peak") for p in alla.get("devices", []) if p.get("device") == 0), None)


def check(nb):
    """The PASS/FAIL lines for an executed notebook."""
    lines = []

    def expect(ok, what):
        lines.append(("PASS " if ok else "FAIL ") + what)

    peak = None
    fits_seen = 0
    for n, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        outs = cell.get("outputs", [])
        for o in outs:
            rec = o.get("data", {}).get(CELL)
            if rec is not None:
                p = device0_peak(rec)
                if p is not None:
                    peak = p if peak is None else max(peak, p)
        m = re.match(r"\s*%gpumem fit (\S+)\s*$", source(cell))
        if not m:
            continue
        fits_seen += 1
        where = f"code cell {n} (`%gpumem fit {m.group(1)}`)"
        size = size_of(m.group(1))
        errors = [o.get("evalue", "") for o in outs if o.get("output_type") == "error"]
        plan = next((o["data"][FIT] for o in outs if FIT in o.get("data", {})), None)
        expect(not errors and plan is not None, f"{where} answers with a plan, no error {errors}")
        if plan is None:
            continue
        expect(peak is not None and peak > 0, f"{where}: the cells before it tracked device 0 (peak {peak})")
        if not peak:
            continue
        expect(plan["requested_peak"] == peak,
               f"{where}: the plan's peak {plan['requested_peak']:,} B is the session's tracked peak {peak:,} B")
        expect(plan["live_peak"] >= plan["requested_peak"],
               f"{where}: at the driver's granularity its live peak, {plan['live_peak']:,} B, is no smaller")
        expect(plan["before_recording"][0] == 0, f"{where}: every allocation was kept ({plan['before_recording']} before)")
        verdicts = {p["policy"]: p["fits"] for p in plan["policies"]}
        if size < peak:
            firsts = [p.get("first_failure") or {} for p in plan["policies"]]
            expect(not any(verdicts.values()) and all((f.get("label") or "").startswith("cell ") for f in firsts),
                   f"{where}: {size:,} B is below the peak: no policy fits {verdicts}, each names the cell that fails "
                   f"{[f.get('label') for f in firsts]}")
        elif size >= 4 * peak:
            expect(all(verdicts.values()), f"{where}: {size:,} B is four times the peak or more: every policy fits {verdicts}")
    for n, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        if source(cell).strip() != "%gpumem snapshot":
            continue
        outs = cell.get("outputs", [])
        errors = [o.get("evalue", "") for o in outs if o.get("output_type") == "error"]
        text = "".join(text_of(o.get("data", {}).get("text/plain")) for o in outs)
        expect(not errors and re.search(r"snapshot\.pickle \(\d", text) is not None,
               f"code cell {n} (`%gpumem snapshot`) wrote a snapshot with no allocator open {errors or text[:200]}")
    expect(fits_seen > 0, "the notebook has `%gpumem fit` cells")
    return lines


def report(lines):
    print("\n".join(lines))
    return 1 if any(l.startswith("FAIL") for l in lines) else 0


def _nb(peaks, plans):
    """A notebook: one cell per tracked peak, then one `%gpumem fit SIZE` cell per (size, plan)."""
    cells = [{"cell_type": "code", "source": "let x = 1;", "outputs": [
        {"output_type": "display_data", "data": {CELL: {"all_allocations": {"devices": [{"device": 0, "peak": p}]}}}}]}
        for p in peaks]
    for size, plan in plans:
        cells.append({"cell_type": "code", "source": f"%gpumem fit {size}",
                      "outputs": [{"output_type": "display_data", "data": {FIT: plan}}]})
    return {"cells": cells}


def _plan(live_peak, fits, label="cell 3"):
    return {"live_peak": live_peak, "requested_peak": live_peak, "before_recording": [0, 0], "policies": [
        {"policy": p, "fits": fits, "first_failure": None if fits else {"label": label}}
        for p in ("default", "expandable", "compact")]}


def self_test():
    gib = 1 << 30
    good = _nb([gib // 4, 9 * gib // 4, 9 * gib // 4], [("24GiB", _plan(9 * gib // 4, True)),
                                                        ("2GiB", _plan(9 * gib // 4, False))])
    assert not any(l.startswith("FAIL") for l in check(good)), check(good)

    def broken(f):
        nb = copy.deepcopy(good)
        f(nb)
        return [l for l in check(nb) if l.startswith("FAIL")]

    def data(nb, i):
        return nb["cells"][i]["outputs"][0]["data"]

    cases = {
        "the peak differs": lambda nb: data(nb, 3)[FIT].update(requested_peak=2 * gib),
        "rounding lost bytes": lambda nb: data(nb, 3)[FIT].update(live_peak=gib),
        "a small card fits": lambda nb: data(nb, 4)[FIT]["policies"][1].update(fits=True),
        "no cell named": lambda nb: data(nb, 4)[FIT]["policies"][0].update(first_failure=None),
        "a large card fails": lambda nb: data(nb, 3)[FIT]["policies"][2].update(fits=False),
        "events were dropped": lambda nb: data(nb, 3)[FIT].update(before_recording=[3, gib]),
        "an error instead": lambda nb: nb["cells"][3].update(outputs=[
            {"output_type": "error", "ename": "fit", "evalue": "fit: no device is open"}]),
        "nothing tracked": lambda nb: [c.update(outputs=[]) for c in nb["cells"][:3]],
        "no fit cell": lambda nb: nb.update(cells=nb["cells"][:3]),
        "the snapshot failed": lambda nb: nb["cells"].append({"cell_type": "code", "source": "%gpumem snapshot", "outputs": [
            {"output_type": "error", "ename": "snapshot", "evalue": "snapshot: no device is open"}]}),
    }
    for name, f in cases.items():
        fails = broken(f)
        assert fails, f"{name}: not caught"
        print(f"caught: {name}: {fails[0]}")
    print(f"self-test: {len(cases)} of {len(cases)} broken notebooks caught")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    return report(check(json.load(open(sys.argv[1]))))


if __name__ == "__main__":
    sys.exit(main())
