"""Notebooks written as the frameworks' own docs write them (issue 43): how many cells run as
written in gpumem-kernel and in the stock evcxr kernel, side by side.

Usage: python3 scripts/corpus.py OUT_DIR NOTEBOOK... [--kernel PATH] [--stock] [--gpumem-only]
  (scripts/corpus.sh sets it up: the kernel's release build, and with --stock the pinned
  evcxr_jupyter's kernelspec in a private JUPYTER_PATH, as tests/stock_kernel.sh installs it)

Each notebook runs through `gpumem-kernel run --allow-errors` and, with --stock, through
nbclient against the stock kernel (`rust`, evcxr_jupyter 0.22.0), every cell as written: a
failing cell does not stop the run, so a cell's failure is its own or one carried from an
earlier cell (a variable that could not be kept). A cell runs as written when it ends without an
error. Writes the executed notebooks (NAME.gpumem.ipynb, NAME.stock.ipynb), corpus.json and
corpus.md (the table and, per failing cell, its first error line) into OUT_DIR, prints the table,
and exits 1 when a cell fails in gpumem-kernel.
"""

import json
import os
import subprocess
import sys
import time


def code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def first_line(cell):
    src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
    return next((l.strip() for l in src.splitlines() if l.strip() and not l.strip().startswith("//")), "")


def failures(nb):
    """(index among code cells, first code line, ename: evalue) of each cell that failed."""
    out = []
    for i, c in enumerate(code_cells(nb)):
        errs = [o for o in c.get("outputs", []) if o.get("output_type") == "error"]
        if errs:
            e = errs[0]
            value = (e.get("evalue") or "").strip().splitlines()
            out.append((i + 1, first_line(c), f"{e.get('ename')}: {value[0] if value else ''}"))
    return out


def run_gpumem(kernel, path, out_path):
    started = time.time()
    p = subprocess.run([kernel, "run", path, "--allow-errors", "--output", out_path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    took = time.time() - started
    if not os.path.exists(out_path):
        sys.exit(f"gpumem-kernel run {path} wrote no notebook (exit {p.returncode}):\n{p.stdout[-3000:]}")
    return json.load(open(out_path)), took


def run_stock(path, out_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = {"name": "rust", "display_name": "Rust", "language": "rust"}
    started = time.time()
    # A first `:dep` builds its crates (minutes on two cores): a cell may take long.
    client = NotebookClient(nb, kernel_name="rust", timeout=3600, allow_errors=True,
                            resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}})
    client.execute()
    took = time.time() - started
    nbformat.write(nb, out_path)
    return json.load(open(out_path)), took


def main():
    args = sys.argv[1:]
    kernel = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "gpumem-kernel")
    stock = "--stock" in args
    if "--kernel" in args:
        kernel = args[args.index("--kernel") + 1]
        del args[args.index("--kernel"):args.index("--kernel") + 2]
    args = [a for a in args if a != "--stock"]
    if len(args) < 2:
        sys.exit(__doc__)
    out_dir, notebooks = args[0], args[1:]
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for path in notebooks:
        name = os.path.splitext(os.path.basename(path))[0]
        total = len(code_cells(json.load(open(path))))
        row = {"notebook": os.path.relpath(path), "cells": total}
        nb, took = run_gpumem(kernel, path, os.path.join(out_dir, f"{name}.gpumem.ipynb"))
        fails = failures(nb)
        row["gpumem"] = {"ran": total - len(fails), "failed": fails, "seconds": round(took, 1)}
        print(f"{name}: gpumem-kernel {total - len(fails)} of {total} ({took:.0f} s)", flush=True)
        if stock:
            nb, took = run_stock(path, os.path.join(out_dir, f"{name}.stock.ipynb"))
            fails = failures(nb)
            row["stock"] = {"ran": total - len(fails), "failed": fails, "seconds": round(took, 1)}
            print(f"{name}: stock evcxr {total - len(fails)} of {total} ({took:.0f} s)", flush=True)
        rows.append(row)
    json.dump(rows, open(os.path.join(out_dir, "corpus.json"), "w"), indent=1)
    lines = ["| notebook | code cells | run as written in gpumem-kernel | in the stock evcxr kernel (0.22.0) |",
             "|---|---:|---:|---:|"]
    for r in rows:
        s = f"{r['stock']['ran']} of {r['cells']}" if "stock" in r else "not run"
        lines.append(f"| `{r['notebook']}` | {r['cells']} | **{r['gpumem']['ran']} of {r['cells']}** | {s} |")
    detail = []
    for r in rows:
        for kernel_name in ("gpumem", "stock"):
            for i, first, err in r.get(kernel_name, {}).get("failed", []):
                label = "gpumem-kernel" if kernel_name == "gpumem" else "stock evcxr"
                detail.append(f"- `{r['notebook']}`, {label}, cell {i} (`{first[:60]}`): {err[:200]}")
    md = "\n".join(lines) + "\n" + ("\nFailing cells:\n\n" + "\n".join(detail) + "\n" if detail else "")
    open(os.path.join(out_dir, "corpus.md"), "w").write(md)
    print(md)
    return 1 if any(r["gpumem"]["failed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
