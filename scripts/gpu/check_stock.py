#!/usr/bin/env python3
"""Checks a notebook the stock evcxr kernel ran (`scripts/gpu/notebook.sh stock`), where gpumem-nb
prints its report line on stdout (`[N] cuda:0 · … · OWNER SIZE (±CHANGE) · …`) and a record comes
only beside a cell's value (scripts/gpu/check_notebook.py --stock reads those).

    check_stock.py EXECUTED.ipynb

Per code cell:
- it ran (an execution count or an output): a cell the kernel never reached is a failure;
- no error, unless tagged `not-stock` (listed as skipped: candle's tensor ids are per cell in the
  stock kernel, so a `backward` across cells is wrong there);
- `stock-line=OWNER`: the cell's last report line names OWNER with the change the cell printed
  (`FRAMEWORK_BYTES OWNER ±N`, the framework's own count) within 1 % or 1 MiB; a cell that printed
  no such line has nothing to hold the report to, and fails;
- `top-names=A,B`: the cell's output names each of A, B.
A tag naming nothing (`stock-line=`, an empty name in `top-names=`) fails: `"" in text` is always
true. Prints `ok` or `FAIL` per check, then `PATH: N checks, M failures`; exits 1 when a check
failed, the notebook is missing or unreadable, or it has no code cell to check.
"""
import json
import re
import sys

from check_notebook import size_of, text_of


def cell_text(outs):
    """The cell's stdout and values, in order."""
    return "".join(
        text_of(o.get("text")) if o.get("output_type") == "stream" else text_of(o.get("data", {}).get("text/plain"))
        for o in outs
    )


def stock_line(owner, text):
    """(ok, what was found) for a `stock-line=OWNER` tag."""
    lines = [l for l in text.splitlines() if l.startswith("[")]
    said = [l.split()[-1] for l in text.splitlines() if l.startswith("FRAMEWORK_BYTES ")]
    if not owner.strip():
        return False, "the tag names no owner"
    if not lines:
        return False, "MISSING the cell's report line"
    if not said:
        return False, f"MISSING the cell's FRAMEWORK_BYTES line: nothing to hold the report to ({lines[-1]})"
    m = re.search(re.escape(owner) + r" [0-9.]+ [KMGT]?i?B \(([+-][0-9.]+ [KMGT]?i?B|±0 B)", lines[-1])
    if not m:
        return False, f"the report line does not name {owner} with a change: {lines[-1]}"
    change = m.group(1)
    shown = 0 if change == "±0 B" else (-1 if change[0] == "-" else 1) * size_of(change[1:])
    want = int(said[-1])
    ok = abs(shown - want) <= max(abs(want) * 0.01, 1 << 20)
    return ok, f"{lines[-1]} {said}"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_stock.py EXECUTED.ipynb")
    path = sys.argv[1]
    try:
        nb = json.load(open(path))
    except (OSError, ValueError) as e:
        # No executed notebook (the kernel or nbclient died before writing it): never a pass.
        print(f"FAIL {path}: MISSING executed notebook ({e})")
        return 1
    checks = fails = 0

    def say(ok, msg):
        nonlocal checks, fails
        checks += 1
        fails += not ok
        print("ok  " if ok else "FAIL", msg)

    code_cells = 0
    for i, c in enumerate(nb["cells"]):
        if c["cell_type"] != "code":
            continue
        code_cells += 1
        outs = c.get("outputs", [])
        tags = c.get("metadata", {}).get("tags", [])
        if c.get("execution_count") is None and not outs:
            say(False, f"cell {i} was not executed (the run stopped before it)")
            continue
        text = cell_text(outs)
        for tag in tags:
            if tag.startswith("stock-line="):
                owner = tag[len("stock-line="):]
                ok, found = stock_line(owner, text)
                say(ok, f"report line names {owner!r} with its change: {found}")
            if tag.startswith("top-names="):
                for name in tag[len("top-names="):].split(","):
                    if not name.strip():
                        say(False, f"cell {i}: {tag!r} names an empty site: nothing to check")
                    else:
                        say(name in text, f"{name!r} in the cell's top table")
        errs = [o for o in outs if o.get("output_type") == "error"]
        if errs and "not-stock" in tags:
            print("skipped (not-stock):", errs[0].get("ename"), errs[0].get("evalue", "")[:200])
        elif errs:
            say(False, f"cell {i}: {errs[0].get('ename')} {errs[0].get('evalue', '')[:200]}")
        else:
            checks += 1  # the cell ran without an error
    if not code_cells:
        fails += 1
        print(f"FAIL {path}: no code cell: nothing was checked")
    print(f"{path}: {checks} checks, {fails} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
