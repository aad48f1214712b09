#!/usr/bin/env python3
"""Record PyTorch CUDA caching-allocator traces of real workloads, for gpumem-nb's replay.

    python3 scripts/gpu/record_traces.py OUTDIR [--quick] [--only NAME,...] [--jobs N]

Runs on a machine with one CUDA GPU, PyTorch (2.11), transformers (5.x), torchvision and,
optionally, peft.  Nothing is downloaded: every model is built from a config with random
weights.  Each workload runs in a fresh process (the trace starts at process start, before
the first CUDA allocation), twice: with the allocator configuration unset (PyTorch's default
policy) and with ``expandable_segments:True``.

For every run it writes, in OUTDIR:

- ``<name>.trace.tsv.gz`` (default policy) or ``<name>_expandable.trace.tsv.gz``: the full
  allocator trace, one event a line, tab-separated, the format of ``shared/traces``::

      action  addr  size  stream  time_us

  ``action`` is PyTorch's trace action (segment_alloc, segment_free, alloc, free_requested,
  free_completed, segment_map, segment_unmap, oom, ...); ``addr`` the device address in decimal
  (for ``oom``: the device's free bytes, as gpumem-replay reads it); ``size`` bytes (the
  request for alloc/free_*, the segment or mapped range for segment_*); ``stream`` the CUDA
  stream handle as an integer (0 = default stream); ``time_us`` PyTorch's clock.
- ``<name>.json`` / ``<name>_expandable.json``: the sidecar: workload settings, the allocator
  configuration (``alloc_conf``, read by gpumem-replay), the device's ``total_memory``,
  event counts, the final ``torch.cuda.memory_stats()`` (``stats``), wall time, and whether the
  trace's ring buffer overflowed.  The default run's sidecar also gets the expandable run's
  peaks under ``expandable`` once both have run.
- ``summary.json`` and, on stdout, a table: requested, allocated and reserved peaks of both
  policies, and their overheads over the requested peak.

Workloads (``--quick`` shrinks every one of them to a smoke test):

- ``gpt2_train``: GPT-2 small (124M, from GPT2Config), batch 8 x 512, bf16 autocast, AdamW,
  3 steps.
- ``resnet50_train``: torchvision ResNet-50 (weights=None), batch 64 x 3 x 224 x 224, SGD with
  momentum, 3 steps.
- ``infer_varlen``: GPT-2 small in bf16 under ``torch.no_grad``: forward passes over batch 4 at
  sequence lengths 37, 512, 129, 1024, 7, 300, and greedy generation of 8 tokens from a batch-2
  prompt of each length, 3 rounds.
- ``batch_sweep``: GPT-2 small, sequence 256, bf16 autocast, AdamW: one training step at each
  batch size 8, 16, 24, 32, 48, 64, in one process.
- ``finetune_lora``: a Llama-style decoder (about 0.2B parameters, from LlamaConfig) fine-tuned
  with LoRA (peft, r=8 on q/k/v/o projections), batch 8 x 512, bf16 autocast, AdamW, 4 steps.
  If peft is missing or its API fails, partial fine-tuning instead (all but the last two
  decoder layers frozen); the sidecar's ``settings.mode`` says which.

Training loops are written the usual way (no ``del``): a step's input and loss stay alive until
the next step rebinds the names, as in the traces of ``shared/traces``.

A failing workload does not stop the others: its error is printed, written to the sidecar
(``error``) and shown in the table.  The whole set took 228 s on an H100 (10 processes).

In the repository: ``tests/fixtures/traces/recorded/h100_natural/`` holds this script's output
on an H100 80GB (PyTorch 2.11.0+cu130, transformers 5.17.0); ``h100_del/`` an earlier version's,
whose loops ``del`` each step's tensors and whose ``infer_varlen`` generates 16 tokens.  Only the
default-policy traces are kept, with both sidecars (``<name>.json``, ``<name>_expandable.json``).
``tests/traces.rs`` replays them: exactly under PyTorch's policy, under ``compact:True`` (below
both of PyTorch's reserved peaks on every one), and as a sequence under expandable segments
(PyTorch's own expandable peak on every one).  BENCHMARKS.md, "Replay", has the table.
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import time
import traceback

MAX_ENTRIES = 1_000_000          # trace ring buffer: far more than any workload here records
WORKLOADS = ["gpt2_train", "resnet50_train", "infer_varlen", "batch_sweep", "finetune_lora"]
CONFS = [("", ""), ("expandable", "expandable_segments:True")]
STAT_KEYS = ["requested_bytes.all.peak", "allocated_bytes.all.peak", "reserved_bytes.all.peak",
             "num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms"]


# ------------------------------------------------------------------------------------------
# Workloads (run inside the worker process, after recording has started)
# ------------------------------------------------------------------------------------------

def _gpt2_config(quick, n_positions=1024):
    from transformers import GPT2Config
    if quick:
        return GPT2Config(n_layer=2, n_head=4, n_embd=256, vocab_size=50257, n_positions=n_positions)
    return GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=n_positions)


def _lm_steps(torch, model, opt, shapes, vocab):
    """Training steps written the way scripts usually are: each step's tensors stay alive until
    the next step rebinds the names (so two steps' inputs and losses overlap briefly), and
    gradients are dropped with zero_grad(set_to_none=True)."""
    ids = loss = None
    for batch, seq in shapes:
        ids = torch.randint(0, vocab, (batch, seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return ids, loss


def gpt2_train(torch, quick):
    from transformers import GPT2LMHeadModel
    cfg = _gpt2_config(quick)
    model = GPT2LMHeadModel(cfg).to("cuda")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch, seq, steps = (2, 128, 2) if quick else (8, 512, 3)
    _lm_steps(torch, model, opt, [(batch, seq)] * steps, cfg.vocab_size)
    torch.cuda.synchronize()
    return dict(model="GPT2LMHeadModel", n_layer=cfg.n_layer, n_embd=cfg.n_embd, batch=batch,
                seq=seq, steps=steps, dtype="fp32 weights, bf16 autocast", optimizer="AdamW")


def resnet50_train(torch, quick):
    import torchvision
    model = torchvision.models.resnet50(weights=None).to("cuda")
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    batch, res, steps = (8, 64, 2) if quick else (64, 224, 3)
    for _ in range(steps):
        x = torch.randn(batch, 3, res, res, device="cuda")
        y = torch.randint(0, 1000, (batch,), device="cuda")
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return dict(model="torchvision resnet50", batch=batch, resolution=res, steps=steps,
                dtype="fp32", optimizer="SGD momentum 0.9")


def infer_varlen(torch, quick):
    from transformers import GPT2LMHeadModel
    cfg = _gpt2_config(quick)
    model = GPT2LMHeadModel(cfg).to(device="cuda", dtype=torch.bfloat16)
    model.eval()
    lengths = [37, 512, 129, 1024, 7, 300]
    batch, gen_batch, new_tokens, rounds = (2, 1, 4, 1) if quick else (4, 2, 8, 3)
    with torch.no_grad():
        for _ in range(rounds):
            for n in lengths:
                ids = torch.randint(0, cfg.vocab_size, (batch, n), device="cuda")
                logits = model(input_ids=ids).logits
                # prompt + new tokens must fit in n_positions
                plen = min(n, cfg.n_positions - new_tokens)
                prompt = torch.randint(0, cfg.vocab_size, (gen_batch, plen), device="cuda")
                out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                     max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                     do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return dict(model="GPT2LMHeadModel", n_layer=cfg.n_layer, n_embd=cfg.n_embd, lengths=lengths,
                batch=batch, generate_batch=gen_batch, new_tokens=new_tokens, rounds=rounds,
                dtype="bf16 weights", mode="no_grad forward + greedy generate")


def batch_sweep(torch, quick):
    from transformers import GPT2LMHeadModel
    cfg = _gpt2_config(quick)
    model = GPT2LMHeadModel(cfg).to("cuda")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    seq = 64 if quick else 256
    batches = [2, 4, 6] if quick else [8, 16, 24, 32, 48, 64]
    _lm_steps(torch, model, opt, [(b, seq) for b in batches], cfg.vocab_size)
    torch.cuda.synchronize()
    return dict(model="GPT2LMHeadModel", n_layer=cfg.n_layer, n_embd=cfg.n_embd, seq=seq,
                batches=batches, steps_per_batch=1, dtype="fp32 weights, bf16 autocast",
                optimizer="AdamW")


def finetune_lora(torch, quick):
    from transformers import LlamaConfig, LlamaForCausalLM
    if quick:
        cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, vocab_size=32000,
                          max_position_embeddings=1024)
    else:
        cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                          num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                          max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg)
    mode, why = "lora", None
    try:
        from peft import LoraConfig, get_peft_model
        lcfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, bias="none",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                          task_type="CAUSAL_LM")
        model = get_peft_model(model, lcfg)
    except Exception as e:  # peft absent or its API changed: plain partial fine-tuning
        mode, why = "partial", f"{type(e).__name__}: {e}"
        for p in model.parameters():
            p.requires_grad_(False)
        for layer in model.model.layers[-2:]:
            for p in layer.parameters():
                p.requires_grad_(True)
        for p in model.model.norm.parameters():
            p.requires_grad_(True)
    model = model.to("cuda")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    batch, seq, steps = (2, 128, 2) if quick else (8, 512, 4)
    _lm_steps(torch, model, opt, [(batch, seq)] * steps, cfg.vocab_size)
    torch.cuda.synchronize()
    out = dict(model="LlamaForCausalLM", hidden=cfg.hidden_size, layers=cfg.num_hidden_layers,
               vocab=cfg.vocab_size, batch=batch, seq=seq, steps=steps, mode=mode,
               trainable_params=sum(p.numel() for p in params),
               dtype="fp32 weights, bf16 autocast", optimizer="AdamW")
    if why:
        out["peft_error"] = why
    return out


WORKLOAD_FNS = {f.__name__: f for f in (gpt2_train, resnet50_train, infer_varlen, batch_sweep,
                                        finetune_lora)}


# ------------------------------------------------------------------------------------------
# Worker: one workload under one allocator configuration, in its own process
# ------------------------------------------------------------------------------------------

def _write_trace(path, entries):
    counts = {}
    with gzip.open(path, "wt", compresslevel=6) as f:
        for e in entries:
            action = e["action"]
            counts[action] = counts.get(action, 0) + 1
            if action == "oom":
                addr = e.get("device_free", e.get("addr", 0))
            else:
                addr = e.get("addr", 0)
            f.write(f"{action}\t{int(addr)}\t{int(e.get('size', 0))}\t{int(e.get('stream', 0))}\t"
                    f"{int(e.get('time_us', 0))}\n")
    return counts


def worker(name, tag, conf, outdir, quick):
    t0 = time.time()
    import torch
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=MAX_ENTRIES)
    dev = torch.cuda.current_device()
    side = {
        "name": name + (f"_{tag}" if tag else ""),
        "workload": name,
        "torch": torch.__version__,
        "alloc_conf": conf,
        "env": {k: os.environ.get(k) for k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")},
        "device_name": torch.cuda.get_device_name(dev),
        "total_memory": torch.cuda.get_device_properties(dev).total_memory,
        "quick": quick,
    }
    try:
        import transformers
        side["transformers"] = transformers.__version__
    except Exception:
        pass
    try:
        side["settings"] = WORKLOAD_FNS[name](torch, quick)
    except Exception as e:
        side["error"] = f"{type(e).__name__}: {e}"
        side["traceback"] = traceback.format_exc()
        print(f"[{side['name']}] workload failed: {side['error']}", file=sys.stderr)
        traceback.print_exc()
    try:
        torch.cuda.synchronize()
    except Exception:
        pass
    snap = torch.cuda.memory._snapshot()
    stats = dict(torch.cuda.memory_stats(dev))
    torch.cuda.memory._record_memory_history(enabled=None)
    traces = snap.get("device_traces", [])
    entries = traces[dev] if dev < len(traces) else []
    stem = os.path.join(outdir, side["name"])
    counts = _write_trace(stem + ".trace.tsv.gz", entries)
    side["events"] = len(entries)
    side["counts"] = counts
    side["trace_truncated"] = len(entries) >= MAX_ENTRIES
    side["expandable_seen"] = bool(counts.get("segment_map"))
    side["segments_at_end"] = len(snap.get("segments", []))
    side["allocator_settings"] = snap.get("allocator_settings")
    side["stats"] = stats
    side["wall_s"] = time.time() - t0
    with open(stem + ".json", "w") as f:
        json.dump(side, f, indent=1, default=str)
    return 0 if "error" not in side else 3


# ------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------

def _env_for(conf):
    env = dict(os.environ)
    # 2.11 reads PYTORCH_ALLOC_CONF first and PYTORCH_CUDA_ALLOC_CONF as a fallback
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run_one(name, tag, conf, outdir, quick, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), outdir, "--worker", name, "--tag", tag,
           "--conf", conf] + (["--quick"] if quick else [])
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=_env_for(conf), timeout=timeout, capture_output=True, text=True)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = 124, f"timed out after {timeout}s\n{e.stderr or ''}"
    label = name + (f"_{tag}" if tag else "")
    if rc != 0:
        tail = "\n".join((err or "").strip().splitlines()[-15:])
        print(f"!! {label}: exit {rc} after {time.time() - t0:.1f}s\n{tail}", flush=True)
    else:
        print(f"   {label}: ok in {time.time() - t0:.1f}s", flush=True)
    return label, rc, err


def _load(outdir, label):
    try:
        with open(os.path.join(outdir, label + ".json")) as f:
            return json.load(f)
    except Exception:
        return None


def _pct(x, base):
    return f"{100.0 * (x - base) / base:+.1f}%" if x and base else "n/a"


def _mib(x):
    return f"{x / 2**20:,.0f}" if x is not None else "n/a"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--quick", action="store_true", help="tiny models and few steps (smoke test)")
    ap.add_argument("--only", help="comma-separated workloads (default: all)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="run this many processes at once (default 1; traces are per process)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per process")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--tag", default="", help=argparse.SUPPRESS)
    ap.add_argument("--conf", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    if args.worker:
        sys.exit(worker(args.worker, args.tag, args.conf, args.outdir, args.quick))

    names = args.only.split(",") if args.only else WORKLOADS
    unknown = [n for n in names if n not in WORKLOAD_FNS]
    if unknown:
        ap.error(f"unknown workloads: {unknown}; choose from {WORKLOADS}")
    runs = [(n, tag, conf) for n in names for tag, conf in CONFS]
    t0 = time.time()
    print(f"recording {len(runs)} runs into {args.outdir}{' (quick)' if args.quick else ''}", flush=True)
    results = {}
    if args.jobs > 1:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(args.jobs) as ex:
            futs = [ex.submit(_run_one, n, t, c, args.outdir, args.quick, args.timeout) for n, t, c in runs]
            for f in futs:
                label, rc, err = f.result()
                results[label] = rc
    else:
        for n, t, c in runs:
            label, rc, err = _run_one(n, t, c, args.outdir, args.quick, args.timeout)
            results[label] = rc

    # merge the expandable run's peaks into the default run's sidecar, build the summary
    summary = []
    for n in names:
        d, e = _load(args.outdir, n), _load(args.outdir, n + "_expandable")
        row = {"workload": n}
        for key, side in (("default", d), ("expandable", e)):
            if side is None:
                row[key] = {"error": f"no sidecar (exit {results.get(n if key == 'default' else n + '_expandable')})"}
                continue
            s = side.get("stats", {})
            row[key] = {k: s.get(k) for k in STAT_KEYS}
            row[key]["events"] = side.get("events")
            row[key]["trace_truncated"] = side.get("trace_truncated")
            if key == "expandable":
                row[key]["expandable_seen"] = side.get("expandable_seen")
            if side.get("error"):
                row[key]["error"] = side["error"]
        if d is not None and e is not None and "error" not in row["expandable"]:
            d["expandable"] = row["expandable"]
            with open(os.path.join(args.outdir, n + ".json"), "w") as f:
                json.dump(d, f, indent=1, default=str)
        summary.append(row)
    with open(os.path.join(args.outdir, "summary.json"), "w") as f:
        json.dump({"runs": summary, "quick": args.quick, "wall_s": time.time() - t0}, f, indent=1)

    hdr = (f"{'workload':16s} {'events':>7s} {'requested':>10s} {'allocated':>10s} "
           f"{'reserved':>10s} {'over req':>8s} | {'exp. reserved':>13s} {'over req':>8s}  (MiB)")
    print("\n" + hdr + "\n" + "-" * len(hdr))
    failed = 0
    for row in summary:
        d, e = row["default"], row["expandable"]
        if "error" in d or "error" in e:
            failed += 1
        req = d.get("requested_bytes.all.peak")
        print(f"{row['workload']:16s} {str(d.get('events', '-')):>7s} {_mib(req):>10s} "
              f"{_mib(d.get('allocated_bytes.all.peak')):>10s} {_mib(d.get('reserved_bytes.all.peak')):>10s} "
              f"{_pct(d.get('reserved_bytes.all.peak'), req):>8s} | "
              f"{_mib(e.get('reserved_bytes.all.peak')):>13s} "
              f"{_pct(e.get('reserved_bytes.all.peak'), e.get('requested_bytes.all.peak')):>8s}"
              + ("" if "error" not in d and "error" not in e else
                 f"  ERROR: {d.get('error') or e.get('error')}"))
    print(f"\n{len(summary) - failed}/{len(summary)} workloads recorded under both policies "
          f"in {time.time() - t0:.0f}s; files in {args.outdir}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
