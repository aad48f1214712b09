#!/usr/bin/env python3
"""Proves a `%%gpumem sweep` answer on the card it was measured on (issue 57, item 3).

Runs a notebook through jupyter_client (nbclient, kernel `gpumem`) cell by cell, reads the sweep
cell's figures (`application/vnd.gpumem.sweep+json`): the largest value that fits the chosen
target (default: this device, the first answer). Then, in the same kernel, runs the swept cell's
body once at that value (it must finish) and once at 5 % more (it must fail with an
out-of-memory, named as PyTorch names it), as cells appended to the notebook, each after a
`%gpumem trim` cell, as the sweep trims before each of its runs. Checks that every
swept value is at most half the answer (the prediction reaches at least twice past what was
measured). Writes the executed notebook and a JSON summary; prints PASS/FAIL lines; exits 1 on
any FAIL.

    sweep_proof.py NOTEBOOK OUT_DIR [--target PREFIX]
    sweep_proof.py --self-test           (each check fails when its figure is broken)
"""
import json
import math
import os
import sys

SWEEP = "application/vnd.gpumem.sweep+json"


def text_of(v):
    return "".join(v) if isinstance(v, list) else (v or "")


def sweep_cell(nb):
    """(index, variable, body) of the notebook's `%%gpumem sweep` cell."""
    for i, cell in enumerate(nb["cells"]):
        src = text_of(cell.get("source"))
        head, _, body = src.partition("\n")
        if cell["cell_type"] == "code" and head.startswith("%%gpumem sweep "):
            var = head.split()[2].split("=")[0]
            return i, var, body
    raise SystemExit("the notebook has no `%%gpumem sweep` cell")


def figures(cell):
    return next((o["data"][SWEEP] for o in cell.get("outputs", []) if SWEEP in o.get("data", {})), None)


def errors(cell):
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def answer(fig, target):
    """The chosen target's answer: the first whose name starts with `target`, or the first."""
    answers = fig.get("answers", [])
    if target:
        answers = [a for a in answers if a["target"].startswith(target)]
    return answers[0] if answers else None


def proof_cell(var, body, value):
    """The swept cell's body as one block at `value`: its `let`s drop at its end, as in a sweep."""
    return f"{{\n    let {var} = {value};\n{body}\n}}"


def check(fig, swept_values, fit_cell, over_cell, target):
    """PASS/FAIL lines for the sweep's figures and the two proof cells' outputs."""
    lines = []

    def expect(ok, what):
        lines.append(("PASS " if ok else "FAIL ") + what)

    a = answer(fig, target) if fig else None
    expect(a is not None, f"the sweep answered for {target or 'this device'}")
    if a is None:
        return lines, None
    largest = a["largest"]
    expect(largest.get("verdict") == "value", f"{a['target']}: a largest value ({largest})")
    if largest.get("verdict") != "value":
        return lines, None
    b = int(largest["value"])
    expect(all(v <= b / 2 for v in swept_values),
           f"every swept value {swept_values} is at most half the answer {b:,}")
    expect(fig.get("ended") is None, f"every swept value ran ({fig.get('ended')})")
    if fit_cell is not None:
        errs = errors(fit_cell)
        expect(not errs, f"the step at the answer, {b:,}, runs "
                         f"{[e.get('ename', '') + ': ' + e.get('evalue', '')[:200] for e in errs]}")
    if over_cell is not None:
        errs = errors(over_cell)
        over = math.ceil(b * 1.05)
        named = [e for e in errs if e.get("ename") == "OutOfMemoryError" and "out of memory" in e.get("evalue", "")]
        expect(bool(named), f"the step at 5 % more, {over:,}, fails with a named out-of-memory "
                            f"{[e.get('ename', '') + ': ' + e.get('evalue', '')[:300] for e in errs] or 'none: it ran'}")
    return lines, b


def run(path, out_dir, target):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    index, var, body = sweep_cell(nb)
    head = text_of(nb.cells[index].source).split("\n", 1)[0]
    swept = [float(v.replace("_", "")) for v in head.split()[2].split("=", 1)[1].split(",")]
    client = NotebookClient(nb, kernel_name="gpumem", timeout=900, allow_errors=True,
                            resources={"metadata": {"path": os.path.dirname(path) or "."}})
    name = os.path.splitext(os.path.basename(path))[0]
    fit_cell = over_cell = None
    b = None
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                client.execute_cell(cell, i)
        fig = figures(nb.cells[index])
        lines, b = check(fig, swept, None, None, target)
        if b is not None:
            # Each proof run starts as each swept run did: the caches given back first (the
            # sweep's last run left its blocks in the CUDA pool, sized for a smaller batch).
            for value in (b, math.ceil(b * 1.05)):
                for source in ("%gpumem trim", proof_cell(var, body, value)):
                    cell = nbformat.v4.new_code_cell(source)
                    nb.cells.append(cell)
                    try:
                        client.execute_cell(cell, len(nb.cells) - 1)
                    except CellExecutionError:
                        pass
            fit_cell, over_cell = nb.cells[-3], nb.cells[-1]
    os.makedirs(out_dir, exist_ok=True)
    nbformat.write(nb, os.path.join(out_dir, f"{name}-proof.ipynb"))
    lines, b = check(fig, swept, fit_cell, over_cell, target)
    summary = {"notebook": path, "target": target, "swept": swept, "sweep": fig, "largest": b,
               "over": math.ceil(b * 1.05) if b else None, "checks": lines}
    with open(os.path.join(out_dir, f"{name}-proof.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return lines


def report(lines):
    print("\n".join(lines))
    return 1 if any(l.startswith("FAIL") for l in lines) else 0


def self_test():
    import copy
    fig = {"answers": [{"target": "this device (H100)", "capacity": 80 << 30,
                        "largest": {"verdict": "value", "value": 1000.0}},
                       {"target": "--on 24.00 GiB", "capacity": 24 << 30,
                        "largest": {"verdict": "value", "value": 300.0}}], "ended": None}
    ok = {"outputs": []}
    oom = {"outputs": [{"output_type": "error", "ename": "OutOfMemoryError",
                        "evalue": "CUDA out of memory. Tried to allocate 2.00 GiB."}]}
    good = (fig, [100.0, 200.0, 400.0], ok, oom, None)
    assert not any(l.startswith("FAIL") for l in check(*good)[0]), check(*good)[0]
    assert check(fig, [50.0, 100.0, 150.0], ok, oom, "--on")[1] == 300
    cases = {
        "no figures": lambda g: (None, *g[1:]),
        "a swept value past half": lambda g: (g[0], [100.0, 200.0, 600.0], *g[2:]),
        "the answer's step failed": lambda g: (*g[:2], oom, *g[3:]),
        "5 % more ran": lambda g: (*g[:3], ok, g[4]),
        "5 % more failed otherwise": lambda g: (*g[:3], {"outputs": [
            {"output_type": "error", "ename": "Error", "evalue": "shape mismatch"}]}, g[4]),
        "the sweep ended early": lambda g: (dict(copy.deepcopy(g[0]), ended={"value": "400", "out_of_memory": True}),
                                            *g[1:]),
        "no value": lambda g: ({"answers": [{"target": "this device", "capacity": 1,
                                             "largest": {"verdict": "none", "short": 5}}]}, *g[1:]),
        "no such target": lambda g: (*g[:4], "--on 16"),
    }
    for what, f in cases.items():
        fails = [l for l in check(*f(good))[0] if l.startswith("FAIL")]
        assert fails, f"{what}: not caught"
        print(f"caught: {what}: {fails[0]}")
    assert proof_cell("batch", "let x = batch;", 7) == "{\n    let batch = 7;\nlet x = batch;\n}"
    print(f"self-test: {len(cases)} of {len(cases)} broken runs caught")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    args = sys.argv[1:]
    target = None
    if "--target" in args:
        k = args.index("--target")
        target = args[k + 1]
        del args[k:k + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    sys.exit(report(run(args[0], args[1], target)))
