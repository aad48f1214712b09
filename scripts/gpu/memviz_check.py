#!/usr/bin/env python3
"""PyTorch's `_memory_viz segments` and `memory` on a gpumem-nb snapshot, numbers checked.

    memviz_check.py DIR [RENDERER]

DIR holds what `gpumem_nb::snapshot::write_all` wrote: snapshot.pickle (what PyTorch's tools
read) and snapshot.json (the same snapshot through our JSON writer, for our numbers).

1. The command lines `python -m torch.cuda._memory_viz segments|memory DIR/snapshot.pickle -o F`
   must exit 0 and write an SVG flame graph. PyTorch renders with Brendan Gregg's
   flamegraph.pl, which it downloads on first use (to ~/.cache/flamegraph.pl in recent
   releases, /tmp/<uid>_flamegraph.pl in older ones); the GPU machine has no network, so when
   RENDERER is given (an executable taking flamegraph.pl's arguments, e.g. inferno-flamegraph,
   the Rust port) it is put at those paths first, where nothing is there yet. What is checked is
   PyTorch's own code reading our pickle; the renderer only draws what it produced.
2. The folded stacks that `segments()` and `memory()` hand to the renderer (called in process
   with an identity renderer) must add up to our numbers: every byte of every segment
   (reserved), per segment, the allocated blocks (allocated) and within them what was
   requested.

Prints one line per check; exits 1 if any fails.
"""
import json
import os
import pickle
import subprocess
import sys
from collections import defaultdict

from torch.cuda import _memory_viz as mv

failures = []


def check(what, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}")
    if not ok:
        failures.append(what)


def folded(lines):
    """'a;b;c 123' lines -> [(['a','b','c'], 123)]."""
    out = []
    for line in lines.splitlines():
        if not line.strip():
            continue
        stack, n = line.rsplit(" ", 1)
        out.append((stack.split(";"), int(n)))
    return out


def main():
    d = sys.argv[1]
    pkl, js = os.path.join(d, "snapshot.pickle"), os.path.join(d, "snapshot.json")
    ours = json.load(open(js))
    segs = ours["segments"]
    reserved = sum(s["total_size"] for s in segs)
    blocks = [b for s in segs for b in s["blocks"]]
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    requested = sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated")
    print(f"our snapshot: {len(segs)} segments, reserved {reserved} B, allocated {allocated} B, "
          f"requested {requested} B")

    # 1. The command lines, with a renderer at the path PyTorch looks at.
    if len(sys.argv) > 2:
        renderer = os.path.abspath(sys.argv[2])
        for script in [os.path.expanduser("~/.cache/flamegraph.pl"), f"/tmp/{os.getuid()}_flamegraph.pl"]:
            if os.path.exists(script):
                print(f"renderer: {script} is already there")
                continue
            os.makedirs(os.path.dirname(script), exist_ok=True)
            with open(script, "w") as f:
                f.write(f'#!/bin/sh\nexec "{renderer}" "$@"\n')
            os.chmod(script, 0o755)
            print(f"renderer: {script} -> {renderer}")
    for cmd in ["segments", "memory"]:
        svg = os.path.join(d, f"{cmd}.svg")
        p = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", cmd, pkl, "-o", svg],
                           capture_output=True, text=True)
        wrote = os.path.exists(svg) and "<svg" in open(svg).read(4096)
        check(f"_memory_viz {cmd} exits 0 and writes an SVG", p.returncode == 0 and wrote,
              f"exit {p.returncode}, {os.path.getsize(svg) if os.path.exists(svg) else 0} B"
              + (f", stderr: {p.stderr.strip()[-300:]}" if p.returncode else ""))

    # 2. What PyTorch's code makes of our pickle, before rendering.
    with open(pkl, "rb") as f:
        snap = pickle.load(f)
    ident = lambda lines: lines  # noqa: E731
    seg_lines = folded(mv.segments(snap, ident))
    mem_lines = folded(mv.memory(snap, ident))
    for name, lines in [("segments", seg_lines), ("memory", mem_lines)]:
        total = sum(n for _, n in lines)
        check(f"{name}(): all bytes = reserved", total == reserved, f"{total} vs {reserved}")
        by_state = defaultdict(int)
        asked = 0
        for stack, n in lines:
            state = stack[2] if name == "segments" else stack[1]
            by_state[state] += n
            if state == "active_allocated" and stack[-1] != "<gaps>":
                asked += n
        check(f"{name}(): active_allocated bytes = allocated", by_state["active_allocated"] == allocated,
              f"{by_state['active_allocated']} vs {allocated}")
        check(f"{name}(): requested part = requested", asked == requested, f"{asked} vs {requested}")
    per_seg = defaultdict(int)
    for stack, n in seg_lines:
        per_seg[int(stack[1].removeprefix("seg_"))] += n
    want = {s["address"]: s["total_size"] for s in segs}
    check("segments(): per segment = its total_size", dict(per_seg) == want,
          f"{len(per_seg)} segments" if dict(per_seg) == want else f"{dict(per_seg)} vs {want}")
    named = [s for s, _ in seg_lines if s[-1] not in ("<gaps>", "<non-python>")]
    print(f"stacks with frames: {len(named)} of {len(seg_lines)}; e.g. {';'.join(named[0][3:]) if named else '-'}")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all memory_viz checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
