#!/usr/bin/env python3
"""Checks `gpumem-replay --fit`'s smallest device against PyTorch itself (issue 33): the workload
that recorded `tests/fixtures/snapshots/h200_components_adamw_bn.pickle`
(`record_components.py`'s `train()`) runs again with PyTorch's caching allocator capped by
`torch.cuda.set_per_process_memory_fraction` at the predicted smallest device, and at fractions
of it, each in a fresh process.

    python3 scripts/gpu/fit_check.py PREDICTED_BYTES [SCALE ...]     (default scales: 1.0 0.97)

The cap limits what the allocator reserves (its segments), which is what the replay's device
holds; the CUDA context is outside it, as it is outside the replay. Prints one JSON object per
scale: the cap, whether the three steps ran, the out-of-memory message's first line if not, and
the reserved peak PyTorch reports.
"""
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[2])
from record_components import train
cap = int(sys.argv[1])
total = torch.cuda.get_device_properties(0).total_memory
# The allocator allows int(fraction * total) bytes: a KiB over the cap keeps float rounding from
# taking a byte off it (the replay's sizes are whole 2 MiB).
torch.cuda.set_per_process_memory_fraction(min(1.0, (cap + 1024) / total))
out = {"cap": cap, "device_total": total}
try:
    train()
    out["ran"] = True
except torch.OutOfMemoryError as e:
    out["ran"] = False
    out["error"] = str(e).splitlines()[0]
out["reserved_peak"] = torch.cuda.max_memory_reserved()
out["allocated_peak"] = torch.cuda.max_memory_allocated()
print(json.dumps(out))
"""


def main():
    predicted = int(sys.argv[1])
    scales = [float(s) for s in sys.argv[2:]] or [1.0, 0.97]
    here = os.path.dirname(os.path.abspath(__file__))
    for scale in scales:
        cap = int(predicted * scale)
        r = subprocess.run([sys.executable, "-c", CHILD, str(cap), here], capture_output=True, text=True)
        line = (r.stdout.strip().splitlines() or ["{}"])[-1]
        try:
            out = json.loads(line)
        except json.JSONDecodeError:
            out = {"cap": cap, "ran": False, "error": (r.stderr.strip().splitlines() or ["no output"])[-1]}
        out["scale"] = scale
        out["predicted"] = predicted
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
