#!/usr/bin/env python3
"""PyTorch's side of the `leave_free` conformance case (ipyexperiments' `gpu_mem_leave_free_mbs`).

    PYTHONPATH=DIR_OF_PROBE_PY leave_free_torch.py OUT.json [N_MIB]

probe.py has no such case, so this script plays it for PyTorch in one fresh process, in the
shape that `examples/gpu_probe.rs --case leave_free` writes for gpumem-nb, with probe.py's own
`key_stats` and `seg_summary`; probe_compare.sh adds it to PyTorch's results under "leave_free"
and compare_probe.py compares the two.

The sequence, on a real card with nearly all of its memory free:
1. open the device; `free_before` from cuMemGetInfo (`torch.cuda.mem_get_info`);
2. leave N MiB free the way ipyexperiments does: empty the cache, read what is free in whole
   MiB, and hold one tensor of (free - N) MiB (ipyexperiments reads NVML's free number; both
   sides here read cuMemGetInfo, so that they measure the same thing);
3. ask for N + 2 MiB: out of memory, with PyTorch's message;
4. ask for N / 2 MiB: fits;
5. let everything go and empty the cache: the device is back where it started.
"""
import json
import sys

import torch
from probe import key_stats, seg_summary  # scripts/gpu/probe.py

MiB = 1 << 20


def free_now():
    return torch.cuda.mem_get_info()[0]


def main():
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    R = {"test": "leave_free", "conf": "", "n_mib": n}
    torch.cuda.init()
    R["free_before"] = free_now()
    # ipyexperiments: gpu_mem_get_free_no_cache() then gpu_mem_allocate_mbs(avail - n).
    torch.cuda.empty_cache()
    avail_mib = free_now() // MiB
    filler = torch.empty((avail_mib - n) * MiB, dtype=torch.uint8, device="cuda")
    R["filler_bytes"] = filler.numel()
    R["free_after_fill"] = free_now()
    R["after_fill"] = key_stats(torch)
    R["segs_fill"] = seg_summary(torch)
    try:
        torch.empty((n + 2) * MiB, dtype=torch.uint8, device="cuda")
        R["oom_msg"] = None
    except torch.OutOfMemoryError as ex:
        R["oom_msg"] = str(ex)
    R["after_oom"] = key_stats(torch)
    half = torch.empty(n // 2 * MiB, dtype=torch.uint8, device="cuda")
    R["after_half"] = key_stats(torch)
    R["free_after_half"] = free_now()
    del half, filler
    torch.cuda.empty_cache()
    R["after_release"] = key_stats(torch)
    R["free_end"] = free_now()
    with open(out, "w") as f:
        json.dump(R, f, indent=1)
    print(f"leave_free (PyTorch {torch.__version__}): left {(R['free_after_fill']) / MiB:.0f} MiB free "
          f"for {n} MiB asked, holding {R['filler_bytes']} B")


if __name__ == "__main__":
    main()
