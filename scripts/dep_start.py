"""How long a new session's first `:dep` takes: gpumem-kernel against the stock evcxr kernel, in
one run (issue 43, item 4).

Usage (scripts/dep_start.sh sets it up): python3 scripts/dep_start.py OUT_JSON [--rounds N] [LINE...]

Each round starts a new session of each kernel (which goes first alternates) through
jupyter_client, as Jupyter starts them, and times from the execute request to idle: the `:dep`
cell, then a small cell after it (`let x = 40 + 2;`), then a cell that uses the crate. Both kernels
are warm: their build directories hold the crates from an earlier session (gpumem-kernel's is
`~/.cache/gpumem-kernel/evcxr`, as a user's; the stock kernel's is a directory of its own set
with EVCXR_TMPDIR, without which every stock session builds its crates from nothing: that is
measured once too, "stock, new temp dir"). gpumem-kernel also writes where each cell's time went
(GPUMEM_KERNEL_CELL_TIMES). Prints a markdown table of medians and writes every sample to
OUT_JSON. Not a test: nothing is asserted.
"""

import json
import os
import statistics
import sys
import tempfile
import time

from jupyter_client.manager import KernelManager

LINES = {
    ":dep gpumem-nb": "gpumem_nb::current()?.backend_kind()",
    ':dep candle-core = "0.11"': "candle_core::Tensor::arange(0f32, 6., &candle_core::Device::Cpu)?.dims().to_vec()",
    ':dep burn = { version = "0.21", features = ["ndarray", "autodiff"] }':
        "burn::tensor::Tensor::<burn::backend::NdArray, 1>::zeros([3], &Default::default()).dims()",
}
SMALL = "let x = 40 + 2;"


def execute(kc, code, timeout=3600, texts=None):
    """Seconds from the execute request to idle; the reply's status. `texts`, when given, gets
    the cell's stream and plain-text outputs."""
    started = time.time()
    msg_id = kc.execute(code)
    status = None
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if texts is not None and msg["msg_type"] == "stream":
            texts.append(msg["content"]["text"])
        elif texts is not None and msg["msg_type"] in ("display_data", "execute_result", "update_display_data"):
            texts.append(msg["content"]["data"].get("text/plain", ""))
        if msg["msg_type"] == "error":
            status = "error: " + msg["content"].get("evalue", "")[:200]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=timeout)
    took = time.time() - started
    return took, status or reply["content"]["status"]


def as_stock(line):
    """The line as the stock kernel needs it: gpumem-nb from this checkout (it is not on
    crates.io; gpumem-kernel's bare `:dep gpumem-nb` is the crate it was built with)."""
    if line.strip() == ":dep gpumem-nb":
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        return f':dep gpumem-nb = {{ path = "{repo}" }}'
    return line


def session(spec, env, line, use):
    """One new session: its start, the `:dep` cell, a small cell, a cell using the crate."""
    if spec == "rust":
        line = as_stock(line)
    km = KernelManager(kernel_name=spec)
    full = dict(os.environ)
    full.update(env)
    started = time.time()
    km.start_kernel(env=full)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=600)
    ready = time.time() - started
    try:
        dep, s1 = execute(kc, line)
        small, s2 = execute(kc, SMALL)
        used, s3 = execute(kc, use)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return {"ready_s": ready, "dep_s": dep, "small_s": small, "use_s": used, "status": [s1, s2, s3]}


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    out = args.pop(0)
    rounds = 3
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        del args[i:i + 2]
    lines = args or list(LINES)
    stock_dir = os.environ["DEP_START_STOCK_DIR"]
    times_file = os.path.join(tempfile.mkdtemp(), "cell-times.jsonl")
    kernels = {
        "gpumem-kernel": ("gpumem", {"GPUMEM_KERNEL_CELL_TIMES": times_file, "GPUMEM_NB_DEVICE": "sim:8GiB"}),
        "stock evcxr": ("rust", {"EVCXR_TMPDIR": stock_dir, "GPUMEM_NB_DEVICE": "sim:8GiB"}),
    }
    samples = []
    for line in lines:
        use = LINES.get(line, "1 + 1")
        # Warm both: a session each that builds the crates where that kernel keeps them.
        for label, (spec, env) in kernels.items():
            r = session(spec, env, line, use)
            print(f"warm-up {label} `{line}`: {r['dep_s']:.1f} s {r['status']}", flush=True)
        for n in range(rounds):
            order = list(kernels.items()) if n % 2 == 0 else list(reversed(kernels.items()))
            for label, (spec, env) in order:
                r = session(spec, env, line, use)
                r.update(kernel=label, line=line, round=n)
                samples.append(r)
                print(f"{label} `{line}` round {n}: dep {r['dep_s']:.1f} s, small {r['small_s']:.2f} s, "
                      f"use {r['use_s']:.2f} s {r['status']}", flush=True)
        if os.environ.get("DEP_START_COLD_STOCK") == "1":
            with tempfile.TemporaryDirectory() as cold:
                r = session("rust", {"EVCXR_TMPDIR": cold, "GPUMEM_NB_DEVICE": "sim:8GiB"}, line, use)
                r.update(kernel="stock evcxr, new temp dir", line=line, round=0)
                samples.append(r)
                print(f"stock, new temp dir `{line}`: dep {r['dep_s']:.1f} s", flush=True)
    phases = []
    if os.path.exists(times_file):
        phases = [json.loads(l) for l in open(times_file) if l.strip()]
    json.dump({"samples": samples, "gpumem_cell_times": phases}, open(out, "w"), indent=1)
    print("| line | kernel | new session ready | `:dep` cell | next small cell | a cell using it |")
    print("|---|---|---:|---:|---:|---:|")
    for line in lines:
        for label in list(kernels) + ["stock evcxr, new temp dir"]:
            rs = [s for s in samples if s["line"] == line and s["kernel"] == label]
            if not rs:
                continue
            med = lambda k: statistics.median(s[k] for s in rs)
            print(f"| `{line}` | {label} | {med('ready_s'):.1f} s | **{med('dep_s'):.1f} s** | "
                  f"{med('small_s'):.2f} s | {med('use_s'):.2f} s |")


if __name__ == "__main__":
    main()
