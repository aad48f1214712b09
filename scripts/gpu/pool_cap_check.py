#!/usr/bin/env python3
"""Issue 33, item 4, for candle: does a candle notebook fit where `%gpumem fit` says its CUDA
pool fits, and fail where it says it fails?

    python3 scripts/gpu/pool_cap_check.py OUT      (on the GPU machine, after notebook.sh setup)

Runs `notebooks/gpu_pool_cap.ipynb` in gpumem-kernel (a copy in notebooks/ each time, its last
cells' `%gpumem fit` sizes and the pool's cap set per run):
  A  uncapped, `%gpumem fit 16GiB`: what the pool reserved at most (R, the driver's count), and
     in each cell;
  B  uncapped, one `%gpumem fit CAP` per cap below: the plan's verdict for each (the first cell
     a pool capped at CAP refuses in, or none);
  then one run capped at each CAP (`GPUMEM_POOL_CAP`, read by the notebook's
  `mem::cap_cuda_pool`): the first cell that fails must be the plan's, with CUDA's out of
  memory, and no cell before it; where the plan says none, every cell runs.
The caps: R (what the pool needs); 0.97 R; R - 16 MiB (between two of the pool's 32 MiB chunks:
it holds R); 0.97 of the highest reservation of a cell before R's (a refusal before the
session's highest cell). Writes the executed notebooks, their logs and pool_cap_check.json to
OUT; prints PASS or FAIL lines and exits 1 on any FAIL.
"""
import json
import os
import re
import subprocess
import sys

MIB = 1 << 20
FIT_MIME = "application/vnd.gpumem.fit+json"
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NOTEBOOK = os.path.join(REPO, "notebooks", "gpu_pool_cap.ipynb")


def run(out, name, cap, fit_sizes):
    nb = json.load(open(NOTEBOOK))
    fit = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).startswith("%gpumem fit")][-1]
    at = nb["cells"].index(fit)
    nb["cells"][at:at + 1] = [dict(fit, source=[f"%gpumem fit {s}"]) for s in fit_sizes]
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
    errors, plans = [], []
    for c in done["cells"]:
        if c["cell_type"] != "code":
            continue
        streams = "".join("".join(o.get("text", "")) for o in c.get("outputs", []) if o.get("output_type") == "stream")
        for o in c.get("outputs", []):
            if o.get("output_type") == "error":
                text = (o.get("evalue", "") + " " + streams)[:600]
                errors.append({"cell": c.get("execution_count"), "ename": o.get("ename"), "evalue": text})
            if FIT_MIME in o.get("data", {}):
                plans.append(o["data"][FIT_MIME].get("pool"))
    return {"exit": p.returncode, "errors": errors, "pools": plans}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    report, fails = {}, []

    def say(ok, text):
        print(("PASS " if ok else "FAIL ") + text, flush=True)
        if not ok:
            fails.append(text)

    a = report["A"] = run(out, "A", None, ["16GiB"])
    pool = (a["pools"] or [None])[0] or {}
    say(a["exit"] == 0 and not a["errors"] and pool.get("reserved_high"),
        f"A uncapped: ran, the pool reserved at most {pool.get('reserved_high')} (cell {pool.get('high_cell')}) {a['errors']}")
    if fails:
        return finish(out, report, fails)
    need = pool["reserved_high"]
    earlier = [c for c in pool["cells"] if c["cell"] < pool["high_cell"] and c["reserved_high"] > 0]
    caps = {"need": need, "0.97": 97 * need // 100, "need-16MiB": need - 16 * MIB}
    if earlier:
        caps["0.97-of-earlier"] = 97 * max(c["reserved_high"] for c in earlier) // 100
    report["caps"] = caps

    b = report["B"] = run(out, "B", None, [str(v) for v in caps.values()])
    ok = b["exit"] == 0 and len(b["pools"]) == len(caps) and all(b["pools"])
    say(ok, f"B uncapped, the plan at {len(caps)} caps: {[(k, p and p.get('first_over')) for k, p in zip(caps, b['pools'])]}")
    if fails:
        return finish(out, report, fails)
    for (name, cap), plan in zip(caps.items(), b["pools"]):
        over = plan.get("first_over")
        r = report[f"capped-{name}"] = run(out, f"capped-{name}", cap, [str(cap)])
        first = r["errors"][0] if r["errors"] else None
        if over is None:
            say(r["exit"] == 0 and first is None, f"capped at {cap} ({name}): the plan says every cell runs (holds {plan['holds']}); ran: {first}")
        else:
            oom = bool(first and re.search(r"OUT_OF_MEMORY|out of memory", first["evalue"], re.I))
            say(first is not None and first["cell"] == over["cell"] and oom,
                f"capped at {cap} ({name}): the plan says cell {over['cell']} refuses; first failure in cell "
                f"{first and first['cell']}, out of memory: {oom}: {first and first['evalue'][:160]}")
    return finish(out, report, fails)


def finish(out, report, fails):
    report["failures"] = fails
    json.dump(report, open(os.path.join(out, "pool_cap_check.json"), "w"), indent=1)
    print(f"pool_cap_check: {len(fails)} failures")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
