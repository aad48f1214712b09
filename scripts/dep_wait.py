"""How long the first cell after `:dep gpumem-nb` waits when nothing is built yet (issue 55,
item 2; BENCHMARKS.md, "The first cell after a new `:dep`"), for one or more gpumem-kernel
binaries, alternating, each session from an empty cache directory.

    python3 scripts/dep_wait.py OUT_JSON [--rounds N] NAME=KERNEL_BINARY [NAME=KERNEL_BINARY ...]

Each round runs every binary once, in turn: a kernel started through jupyter_client with
XDG_CACHE_HOME a new empty directory (so the cells' build directory and the session library are
built from nothing; cargo's download cache is the user's), then `:dep gpumem-nb`, then, sent the
moment it is idle, a cell that uses the crate. Prints and keeps each cell's time from the request
to idle, and the kernel's own line about the wait ("this cell waited … for type inference", said
from 1 s). Needs jupyter_client (a venv: `python3 -m venv v && v/bin/pip install jupyter_client`).
"""

import json
import os
import shutil
import sys
import tempfile

from dep_start import execute
from jupyter_client.manager import start_new_kernel

CELLS = [":dep gpumem-nb", "let size = gpumem_nb::units::iec(3 << 20);\nsize"]


def session(binary, root):
    spec = os.path.join(root, "jupyter", "kernels", "gpumem-wait")
    os.makedirs(spec)
    with open(os.path.join(spec, "kernel.json"), "w") as f:
        json.dump({"argv": [binary, "--connection-file", "{connection_file}"], "display_name": "w",
                   "language": "rust"}, f)
    env = dict(os.environ, XDG_CACHE_HOME=os.path.join(root, "cache"))
    os.environ["JUPYTER_PATH"] = os.path.join(root, "jupyter")
    km, kc = start_new_kernel(kernel_name="gpumem-wait", startup_timeout=120, env=env)
    try:
        out = []
        for code in CELLS:
            texts = []
            seconds, status = execute(kc, code, texts=texts)
            if status != "ok":
                sys.exit(f"FAIL: {code.splitlines()[0]!r}: {status}")
            waited = next((t.strip() for t in texts if "for type inference to read" in t), None)
            out.append({"cell": code.splitlines()[0], "seconds": round(seconds, 2), "waited_line": waited})
        return out
    finally:
        km.shutdown_kernel(now=True)


def main():
    args = sys.argv[1:]
    rounds = 1
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        del args[i:i + 2]
    out_json, kernels = args[0], [a.split("=", 1) for a in args[1:]]
    samples = []
    for r in range(1, rounds + 1):
        for name, binary in kernels:
            root = tempfile.mkdtemp(prefix="dep-wait-")
            try:
                cells = session(os.path.realpath(binary), root)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            with open("/proc/loadavg") as f:
                load = f.read().split()[0]
            samples.append({"round": r, "kernel": name, "cells": cells, "load_after": float(load)})
            dep, nxt = cells
            print(f"round {r} {name}: :dep {dep['seconds']} s, next cell {nxt['seconds']} s "
                  f"({nxt['waited_line'] or 'no wait said: under 1 s'}); load {load}", flush=True)
    with open(out_json, "w") as f:
        json.dump(samples, f, indent=1)


if __name__ == "__main__":
    main()
