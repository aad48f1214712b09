#!/usr/bin/env python3
"""Record PyTorch memory snapshots of real workloads, with PyTorch's own peaks beside them,
for gpumem-replay's snapshot reader and fit planner.

    python3 scripts/gpu/record_snapshots.py OUTDIR [--scale small|full] [--only NAME,...]
                                            [--replay .gpu-bundle/gpumem-replay]

Runs on a machine with one CUDA GPU and PyTorch (2.11); nothing is downloaded (every model is
defined here, with random weights). Each workload runs in a fresh process that switches
recording on before its first CUDA allocation:

    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                             max_entries=MAX_ENTRIES)

so its trace starts at the first allocation, with a Python stack on every event (the sites
`gpumem-replay --fit` names). At the end it writes, in OUTDIR:

- `<name>.pickle`: `torch.cuda.memory._dump_snapshot()` (Python's pickle, the default protocol:
  4 on Python 3.8-3.13, 5 on 3.14);
- `<name>.json`: PyTorch's own numbers for that run: `stats` (the full
  `torch.cuda.memory_stats()` at the end, whose `allocated_bytes.all.peak` and
  `reserved_bytes.all.peak` gpumem-replay must reproduce exactly), `device` (0), the allocator
  configuration, the device's name and `total_memory`, the trace's length and whether it hit
  `max_entries` (then the ring buffer wrapped and gpumem-replay must refuse the snapshot), the
  torch version, the workload's settings, and the wall time.

With `--replay PATH` it also runs `PATH SNAPSHOT --json` on each snapshot (gpumem-replay from the
bundle) and prints whether both peaks match, and what `--fit` says at PyTorch's reserved peak
and 256 MiB under the allocated peak.

Workloads (`--scale small`, the default, keeps each snapshot to a few MB, for committing as
fixtures; `--scale full` is sized for an 80 GB card):

- `convnet_varbatch`: a ResNet-style conv net (conv/batch-norm/ReLU stages, global pooling, a
  linear head) trained with SGD and momentum on batches whose size and image shape change every
  step (cuDNN picks other algorithms and workspaces per shape): the pattern where reserved grows
  far above allocated.
- `convnet_varbatch_expandable`: the same under `expandable_segments:True` (`segment_map` /
  `segment_unmap` events).
- `mlp_side_stream`: an MLP whose inputs are made on a side stream and handed to the default
  stream with `record_stream` (frees that complete later), with `torch.cuda.empty_cache()`
  between phases (releases the replay must explain as the program's own calls).

The lead commits two of the small snapshots and their JSON as fixtures in
`tests/fixtures/snapshots/` (`tests/snapshot_replay.rs` replays every one committed there).
"""
import argparse
import json
import os
import pickle
import subprocess
import sys
import time
import traceback

MAX_ENTRIES = 10_000_000
WORKLOADS = ["convnet_varbatch", "convnet_varbatch_expandable", "mlp_side_stream"]
CONF = {"convnet_varbatch_expandable": "expandable_segments:True"}
PEAKS = ["allocated_bytes.all.peak", "reserved_bytes.all.peak", "requested_bytes.all.peak",
         "num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms"]


# ------------------------------------------------------------------------------------------
# Workloads (run in the worker process, after recording has started)
# ------------------------------------------------------------------------------------------

def _convnet(torch, width):
    nn = torch.nn

    def stage(cin, cout, stride):
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    return nn.Sequential(
        nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        stage(width, width, 1), stage(width, 2 * width, 2), stage(2 * width, 4 * width, 2),
        stage(4 * width, 8 * width, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * width, 100))


def convnet_varbatch(torch, scale):
    torch.backends.cudnn.benchmark = True
    width = 32 if scale == "small" else 64
    shapes = ([(8, 64), (24, 96), (4, 128), (16, 80), (32, 64), (12, 112)] if scale == "small" else
              [(64, 224), (192, 160), (32, 320), (128, 256), (256, 128), (96, 288), (160, 224), (48, 384)])
    model = _convnet(torch, width).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = y = loss = None
    for batch, res in shapes:
        x = torch.randn(batch, 3, res, res, device="cuda")
        y = torch.randint(0, 100, (batch,), device="cuda")
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return dict(model="ResNet-style conv net", width=width, shapes=[list(s) for s in shapes],
                optimizer="SGD momentum 0.9", cudnn_benchmark=True)


def convnet_varbatch_expandable(torch, scale):
    return convnet_varbatch(torch, scale)


def mlp_side_stream(torch, scale):
    nn = torch.nn
    hidden = 1024 if scale == "small" else 8192
    model = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    side = torch.cuda.Stream()
    for phase in range(3):
        for step in range(4):
            with torch.cuda.stream(side):
                x = torch.randn(64 * (step + 1), hidden, device="cuda")
            torch.cuda.current_stream().wait_stream(side)
            x.record_stream(torch.cuda.current_stream())
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del x, loss
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return dict(model="MLP", hidden=hidden, phases=3, steps_per_phase=4, side_stream=True,
                empty_cache_between_phases=True)


WORKLOAD_FNS = {f.__name__: f for f in (convnet_varbatch, convnet_varbatch_expandable, mlp_side_stream)}


# ------------------------------------------------------------------------------------------
# Worker: one workload in its own process
# ------------------------------------------------------------------------------------------

def worker(name, outdir, scale):
    t0 = time.time()
    import torch
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                             max_entries=MAX_ENTRIES)
    dev = torch.cuda.current_device()
    side = {
        "source": f"scripts/gpu/record_snapshots.py {name} --scale {scale}: torch.cuda.memory._dump_snapshot; "
                  "stats: torch.cuda.memory_stats() of the same run",
        "workload": name,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "alloc_conf": CONF.get(name, ""),
        "device": dev,
        "device_name": torch.cuda.get_device_name(dev),
        "total_memory": torch.cuda.get_device_properties(dev).total_memory,
        "scale": scale,
    }
    try:
        side["settings"] = WORKLOAD_FNS[name](torch, scale)
    except Exception as e:
        side["error"] = f"{type(e).__name__}: {e}"
        side["traceback"] = traceback.format_exc()
        traceback.print_exc()
    torch.cuda.synchronize()
    path = os.path.join(outdir, name + ".pickle")
    torch.cuda.memory._dump_snapshot(path)
    stats = dict(torch.cuda.memory_stats(dev))
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    trace = snap["device_traces"][dev]
    side["events"] = len(trace)
    side["trace_truncated"] = len(trace) >= MAX_ENTRIES
    side["actions"] = {a: sum(1 for e in trace if e["action"] == a) for a in sorted({e["action"] for e in trace})}
    side["allocator_settings"] = snap.get("allocator_settings")
    side["stats"] = stats
    side["pickle_bytes"] = os.path.getsize(path)
    side["wall_s"] = time.time() - t0
    with open(os.path.join(outdir, name + ".json"), "w") as f:
        json.dump(side, f, indent=1, default=str)
    return 0 if "error" not in side else 3


# ------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------

def _env(conf):
    env = dict(os.environ)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _replay(binary, pickle_path, side):
    """gpumem-replay on one snapshot: (peaks match, a line to print)."""
    def run(*extra):
        p = subprocess.run([binary, pickle_path, "--json", *extra], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            return None, p.stderr.strip()
        return json.loads(p.stdout), None

    got, err = run()
    if got is None:
        return False, f"gpumem-replay failed: {err}"
    s = side["stats"]
    want = (s["allocated_bytes.all.peak"], s["reserved_bytes.all.peak"])
    have = (got["allocated_peak"], got["reserved_peak"])
    ok = want == have and got.get("divergences") == 0
    line = (f"allocated peak {have[0]:,} (PyTorch {want[0]:,}), reserved peak {have[1]:,} (PyTorch {want[1]:,}), "
            f"divergences {got.get('divergences')}: {'MATCH' if ok else 'MISMATCH'}")
    for label, size in (("at PyTorch's reserved peak", want[1]), ("256 MiB under the allocated peak", max(want[0] - (256 << 20), want[0] // 2))):
        for conf in ("", "compact:True"):
            f, err = run("--fit", str(size), "--alloc-conf", conf)
            if f is None:
                line += f"\n      --fit {label} {conf or 'default'}: failed: {err}"
                continue
            ff = f["first_failure"]
            line += (f"\n      --fit {label} ({size:,}) under {conf or 'default'}: fits {f['fits']}, "
                     f"min_device_bytes {f['min_device_bytes']:,} ({f['min_device_bytes'] / want[0]:.3f} x allocated peak)"
                     + (f", first failure event {ff['event']} {ff['size']:,} bytes at {ff.get('site')}" if ff else ""))
    return ok, line


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--scale", choices=["small", "full"], default="small")
    ap.add_argument("--only", help="comma-separated workloads (default: all)")
    ap.add_argument("--replay", help="a gpumem-replay binary to check every snapshot with")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    if args.worker:
        sys.exit(worker(args.worker, args.outdir, args.scale))
    names = args.only.split(",") if args.only else WORKLOADS
    unknown = [n for n in names if n not in WORKLOAD_FNS]
    if unknown:
        ap.error(f"unknown workloads {unknown}; choose from {WORKLOADS}")
    failed = 0
    for n in names:
        t0 = time.time()
        cmd = [sys.executable, os.path.abspath(__file__), args.outdir, "--worker", n, "--scale", args.scale]
        try:
            p = subprocess.run(cmd, env=_env(CONF.get(n, "")), timeout=args.timeout, capture_output=True, text=True)
            rc, err = p.returncode, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, err = 124, f"timed out after {args.timeout}s {e.stderr or ''}"
        side_path = os.path.join(args.outdir, n + ".json")
        if rc != 0 or not os.path.exists(side_path):
            failed += 1
            print(f"!! {n}: exit {rc}\n" + "\n".join(err.strip().splitlines()[-15:]), flush=True)
            continue
        side = json.load(open(side_path))
        s = side["stats"]
        print(f"   {n}: {side['events']:,} events, allocated peak {s['allocated_bytes.all.peak'] / 2**20:,.1f} MiB, "
              f"reserved peak {s['reserved_bytes.all.peak'] / 2**20:,.1f} MiB, pickle {side['pickle_bytes'] / 2**20:.1f} MiB, "
              f"{time.time() - t0:.1f} s" + (" (TRACE WRAPPED)" if side["trace_truncated"] else ""), flush=True)
        if args.replay:
            ok, line = _replay(args.replay, os.path.join(args.outdir, n + ".pickle"), side)
            failed += 0 if ok else 1
            print("      gpumem-replay: " + line, flush=True)
    print(f"{len(names) - failed}/{len(names)} workloads recorded" + (" and replayed to PyTorch's peaks" if args.replay else "")
          + f"; files in {args.outdir}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
