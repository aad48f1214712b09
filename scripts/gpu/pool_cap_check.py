#!/usr/bin/env python3
"""Issue 33, item 4, for candle: does a candle notebook fit where `%gpumem fit` says its CUDA
pool fits, and fail where it says it fails?

    python3 scripts/gpu/pool_cap_check.py OUT [--chunks]   (on the GPU machine, after notebook.sh setup)

Runs `notebooks/gpu_pool_cap.ipynb` in gpumem-kernel four times (a copy in notebooks/ each time,
its last cell's `%gpumem fit` size and the pool's cap set per run):
  A  uncapped, `%gpumem fit 16GiB`: what the pool reserved at most (R, the driver's count);
  B  uncapped, `%gpumem fit C` with C = 0.97 R (with --chunks, rounded down to the pool's 32 MiB
     chunks): the cell the plan says a pool capped at C refuses first in;
  C  capped at R (`GPUMEM_POOL_CAP`, read by the notebook's `mem::cap_cuda_pool`): every cell runs;
  D  capped at C: the first cell that fails is B's, with CUDA's out of memory, and none before.
Writes the executed notebooks, their logs and pool_cap_check.json to OUT; prints PASS or FAIL
lines and exits 1 on any FAIL.
"""
import json
import os
import re
import subprocess
import sys

MIB = 1 << 20
CHUNK = 32 * MIB  # the pool's reservation step on the H200 (scripts/gpu/pool_probe.py)
FIT_MIME = "application/vnd.gpumem.fit+json"
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NOTEBOOK = os.path.join(REPO, "notebooks", "gpu_pool_cap.ipynb")


def run(out, name, cap, fit_size):
    nb = json.load(open(NOTEBOOK))
    fit = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).startswith("%gpumem fit")]
    fit[-1]["source"] = [f"%gpumem fit {fit_size}"]
    src = os.path.join(REPO, "notebooks", f".pool-cap-{name}.ipynb")
    json.dump(nb, open(src, "w"))
    dst = os.path.join(out, f"gpu_pool_cap-{name}.ipynb")
    env = dict(os.environ)
    env.pop("GPUMEM_POOL_CAP", None)
    if cap is not None:
        env["GPUMEM_POOL_CAP"] = str(cap)
    cmd = f". /opt/gpumem/env.sh && gpumem-kernel run {src} --output {dst}"
    p = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, cwd=REPO)
    open(os.path.join(out, f"gpu_pool_cap-{name}.log"), "w").write(p.stdout + p.stderr)
    os.remove(src)
    done = json.load(open(dst)) if os.path.exists(dst) else {"cells": []}
    errors, plan = [], None
    for c in done["cells"]:
        if c["cell_type"] != "code":
            continue
        streams = "".join("".join(o.get("text", "")) for o in c.get("outputs", []) if o.get("output_type") == "stream")
        for o in c.get("outputs", []):
            if o.get("output_type") == "error":
                text = (o.get("evalue", "") + " " + streams)[:600]
                errors.append({"cell": c.get("execution_count"), "ename": o.get("ename"), "evalue": text})
            if FIT_MIME in o.get("data", {}):
                plan = o["data"][FIT_MIME]
    return {"exit": p.returncode, "errors": errors, "pool": (plan or {}).get("pool")}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    report, fails = {}, []

    def say(ok, text):
        print(("PASS " if ok else "FAIL ") + text, flush=True)
        if not ok:
            fails.append(text)

    a = report["A"] = run(out, "A", None, "16GiB")
    pool = a["pool"] or {}
    say(a["exit"] == 0 and not a["errors"] and pool.get("reserved_high"), f"A uncapped: ran, pool read: {pool and {k: pool[k] for k in ('reserved_high', 'high_cell')}} {a['errors']}")
    if fails:
        return finish(out, report, fails)
    need = pool["reserved_high"]
    cap = 97 * need // 100
    if "--chunks" in sys.argv:
        cap = cap // CHUNK * CHUNK
    report["need"], report["cap_097"] = need, cap

    b = report["B"] = run(out, "B", None, str(cap))
    over = (b["pool"] or {}).get("first_over")
    say(b["exit"] == 0 and over is not None, f"B uncapped, fit at {cap} (0.97 x {need}{', in 32 MiB chunks' if '--chunks' in sys.argv else ''}): the plan says cell {over and over['cell']} refuses ({over})")
    if fails:
        return finish(out, report, fails)

    c = report["C"] = run(out, "C", need, str(need))
    cpool = c["pool"] or {}
    say(c["exit"] == 0 and not c["errors"], f"C capped at {need} (what A's pool reserved at most): every cell ran {c['errors']}")
    say(cpool.get("reserved_high", need + 1) <= need, f"C: the capped pool reserved at most {cpool.get('reserved_high')} <= {need}")

    d = report["D"] = run(out, "D", cap, str(cap))
    first = d["errors"][0] if d["errors"] else None
    oom = bool(first and re.search(r"OUT_OF_MEMORY|out of memory", first["evalue"], re.I))
    say(first is not None and first["cell"] == over["cell"] and oom,
        f"D capped at {cap}: first failure in cell {first and first['cell']} (the plan: cell {over['cell']}), out of memory: {oom}: {first}")
    return finish(out, report, fails)


def finish(out, report, fails):
    report["failures"] = fails
    json.dump(report, open(os.path.join(out, "pool_cap_check.json"), "w"), indent=1)
    print(f"pool_cap_check: {len(fails)} failures")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
