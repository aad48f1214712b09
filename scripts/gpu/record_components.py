#!/usr/bin/env python3
"""Record a PyTorch memory snapshot whose memory is known by component, for gpumem-replay's
`components` (issue 33): an MLP with BatchNorm trained with AdamW, recorded from its first CUDA
allocation, with the model's own counts beside it.

    python3 scripts/gpu/record_components.py OUTDIR [--stacks all]

Runs on a machine with one CUDA GPU and PyTorch (2.11); nothing is downloaded. The model is made
on the CPU and moved with `.to("cuda")` (its parameters and buffers copied in `Module._apply`),
then trained for three steps with `torch.optim.AdamW` (`zero_grad` at the start of each step, so
the gradients of the last one are still held at the end). Writes, in OUTDIR:

- `components_adamw_bn.pickle`: `torch.cuda.memory._dump_snapshot()` with Python stacks;
- `components_adamw_bn.json`: what the model says it holds at the end: `parameter`, `buffer`
  (BatchNorm's running mean and variance and its batch counter), `gradient` and
  `optimizer_state` bytes (sums of `numel() * element_size()`), each tensor's address
  (`data_ptr()`) per component, PyTorch's `memory_stats()` and the torch version; `workspace`:
  what PyTorch gives back when asked to clear its cuBLAS workspaces
  (`torch._C._cuda_clearCublasWorkspaces()`, after the snapshot), the bytes it holds for them.

With `--stacks all` the snapshot has C++ frames too (`stacks="all"`), and the files are named
`components_adamw_bn_all.*`: there the cuBLAS workspaces have frames of their own.
"""
import json
import os
import sys
import time

import torch


def train():
    """The workload: the model made on the CPU, moved, three AdamW steps. `fit_check.py` runs the
    same under a memory cap."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 1024),
        torch.nn.BatchNorm1d(1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 256),
    )
    model = model.to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        x = torch.randn(512, 1024, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return model, opt


def main():
    out = sys.argv[1]
    stacks = sys.argv[3] if sys.argv[2:3] == ["--stacks"] else "python"
    name = "components_adamw_bn" if stacks == "python" else f"components_adamw_bn_{stacks}"
    os.makedirs(out, exist_ok=True)
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks=stacks, max_entries=1_000_000)
    t0 = time.time()
    model, opt = train()
    snap = os.path.join(out, name + ".pickle")
    torch.cuda.memory._dump_snapshot(snap)
    torch.cuda.memory._record_memory_history(enabled=None)
    stats = torch.cuda.memory_stats()
    held = torch.cuda.memory_allocated()
    torch._C._cuda_clearCublasWorkspaces()
    workspace = held - torch.cuda.memory_allocated()

    def size(t):
        return t.numel() * t.element_size()

    params = list(model.parameters())
    buffers = list(model.buffers())
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.is_cuda]
    grads = [p.grad for p in params if p.grad is not None]
    facts = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "wall_s": round(time.time() - t0, 3),
        "components": {
            "parameter": sum(size(p) for p in params),
            "buffer": sum(size(b) for b in buffers),
            "gradient": sum(size(g) for g in grads),
            "optimizer_state": sum(size(s) for s in state),
            "workspace": workspace,
        },
        "stacks": stacks,
        "addresses": {
            "parameter": [p.data_ptr() for p in params],
            "buffer": [b.data_ptr() for b in buffers],
            "gradient": [g.data_ptr() for g in grads],
            "optimizer_state": [s.data_ptr() for s in state],
        },
        "buffers": {name: size(b) for name, b in model.named_buffers()},
        "stats": dict(stats),
    }
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(facts, f, indent=1, sort_keys=True)
    print(json.dumps(facts["components"]), "snapshot", os.path.getsize(snap), "bytes")


if __name__ == "__main__":
    main()
