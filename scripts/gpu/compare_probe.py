#!/usr/bin/env python3
"""Compares PyTorch's allocator probe with gpumem-nb's, case by case.

    compare_probe.py TORCH.json OURS.json

TORCH.json is what scripts/gpu/probe.py writes (results.json); OURS.json is
what `examples/gpu_probe.rs` writes, in the same shape. Compared, at every checkpoint: the
probe's key statistics, segment/block layouts (as multisets: device addresses differ), the full
122-key statistics maps, memory_summary() byte for byte, the numbers of the out-of-memory
messages, and the trace's action/size sequences (PyTorch's "snapshot" entries left out).

Numbers that depend on the physical device at that instant (free bytes from cuMemGetInfo, the
process's own device memory from NVML) legitimately differ between two processes; they are
printed as "info" and never fail the comparison. Differences that are documented PyTorch
behaviour gpumem-nb does not copy are "explained" (with the reason). Anything else is a "DIFF",
and the script exits 1.
"""
import json
import re
import sys

MATCH, DIFF, EXPLAINED, INFO, SKIP = "match", "DIFF", "explained", "info", "skipped"

rows = []  # (case, item, status, detail)


def row(case, item, status, detail=""):
    rows.append((case, item, status, detail))


def canon(v):
    return json.dumps(v, sort_keys=True)


def dict_diff(o, t):
    """Keys whose values differ: 'key: ours X, torch Y'."""
    out = []
    for k in sorted(set(o) | set(t)):
        if o.get(k, "<absent>") != t.get(k, "<absent>"):
            out.append(f"{k}: ours {o.get(k, '<absent>')}, torch {t.get(k, '<absent>')}")
    return out


def cmp_dict(case, item, o, t):
    if o is None or t is None:
        row(case, item, DIFF, f"missing: ours {o is not None}, torch {t is not None}")
        return
    d = dict_diff(o, t)
    row(case, item, MATCH if not d else DIFF, f"{len(t)} keys" if not d else "; ".join(d))


def norm_segs(segs):
    out = []
    for s in segs:
        s = dict(s)
        s.pop("off", None)
        s["blocks"] = [list(b) for b in s["blocks"]]
        out.append(canon(s))
    return sorted(out)


def cmp_segs(case, item, o, t):
    if o is None or t is None:
        row(case, item, DIFF, f"missing: ours {o is not None}, torch {t is not None}")
        return
    a, b = norm_segs(o), norm_segs(t)
    if a == b:
        row(case, item, MATCH, f"{len(b)} segment(s), {sum(len(s['blocks']) for s in t)} block(s)")
    else:
        only_o = [s for s in a if s not in b]
        only_t = [s for s in b if s not in a]
        row(case, item, DIFF, f"only ours: {only_o}; only torch: {only_t}")


def cmp_exact(case, item, o, t):
    row(case, item, MATCH if o == t else DIFF, "" if o == t else f"ours {o!r}, torch {t!r}")


def cmp_checkpoints(case, o, t):
    if len(o) != len(t):
        row(case, "checkpoints", DIFF, f"ours {len(o)}, torch {len(t)}")
    for oc, tc in zip(o, t):
        label = tc["label"]
        if oc["label"] != label:
            row(case, f"@{label}", DIFF, f"label ours {oc['label']!r}")
            continue
        cmp_dict(case, f"@{label} key stats", oc["stats"], tc["stats"])
        cmp_segs(case, f"@{label} segments", oc["segs"], tc["segs"])


def trace_seq(tr, with_snapshot=False):
    return [(e["action"], e["size"]) for e in tr if with_snapshot or e["action"] != "snapshot"]


def cmp_trace(case, o, t):
    if o is None or t is None:
        row(case, "trace", DIFF, f"missing: ours {o is not None}, torch {t is not None}")
        return
    a, b = trace_seq(o), trace_seq(t)
    row(case, "trace action/size (no snapshot entries)", MATCH if a == b else DIFF,
        f"{len(b)} entries" if a == b else f"ours {a}; torch {b}")
    # Streams: which entries are on a side stream (handles differ between processes).
    sa = [(e["action"], e["stream"] != 0) for e in o if e["action"] != "snapshot"]
    sb = [(e["action"], e["stream"] != 0) for e in t if e["action"] != "snapshot"]
    row(case, "trace streams (default/side)", MATCH if sa == sb else DIFF, "" if sa == sb else f"ours {sa}; torch {sb}")
    a, b = trace_seq(o, True), trace_seq(t, True)
    row(case, "trace incl. snapshot entries", MATCH if a == b else INFO,
        "" if a == b else f"ours {a}; torch {b} (informational)")
    fo = [e.get("device_free") for e in o if e["action"] == "oom"]
    ft = [e.get("device_free") for e in t if e["action"] == "oom"]
    if fo or ft:
        row(case, "oom entry device_free", INFO, f"ours {fo}, torch {ft} (free bytes of the device at that instant)")


SIZE = r"(\d+(?:\.\d+)? (?:bytes|KiB|MiB|GiB|TiB|PiB|EiB))"


def oom_numbers(msg):
    """The numbers of PyTorch's OOM sentence (and gpumem-nb's, which says gpumem-nb for PyTorch)."""
    def one(p):
        m = re.search(p, msg)
        return m.group(1) if m else None
    return {
        "tried": one(r"Tried to allocate " + SIZE),
        "total": one(r"has a total capacity of " + SIZE),
        "free": one(r"of which " + SIZE + r" is free"),
        "process": one(r"this process has " + SIZE + r" memory in use"),
        "others": re.findall(r"Process (\d+) has " + SIZE, msg),
        "allowed": one(SIZE + r" allowed;"),
        "allocated": one(r"Of the allocated memory " + SIZE + r" is allocated by"),
        "reserved_unallocated": one(r"and " + SIZE + r" is reserved by"),
    }


def cmp_oom_msg(case, item, o, t):
    if o is None or t is None:
        row(case, item, DIFF, f"missing: ours {o is not None}, torch {t is not None}")
        return
    a, b = oom_numbers(o), oom_numbers(t)
    strict = ["tried", "total", "allowed", "allocated", "reserved_unallocated"]
    d = [f"{k}: ours {a[k]}, torch {b[k]}" for k in strict if a[k] != b[k]]
    row(case, item, MATCH if not d else DIFF,
        ", ".join(f"{k} {b[k]}" for k in strict if b[k]) if not d else "; ".join(d))
    row(case, item + " (device-dependent parts)", INFO,
        f"free: ours {a['free']}, torch {b['free']}; this process: ours {a['process']}, torch {b['process']}; "
        f"other processes: ours {a['others']}, torch {b['others']}")


def cmp_case(case, o, t):
    if "error" in t or "rc" in t:
        row(case, "run", DIFF, f"torch failed: {t.get('error') or t}")
        return
    if "error" in o or "rc" in o:
        row(case, "run", DIFF, f"gpu_probe failed: {o.get('error') or o}")
        return
    cmp_exact(case, "conf", o.get("conf"), t.get("conf"))
    if case == "basic":
        ko, kt = o["full_keys_initial"], t["full_keys_initial"]
        if kt == [] and len(ko) == 122:
            row(case, "full_keys_initial", EXPLAINED,
                "torch [] (memory_stats() is {} until CUDA is lazily initialised by the first allocation); "
                "ours: the 122 keys at once (the allocator exists when current() returns)")
        else:
            cmp_exact(case, "full_keys_initial", ko, kt)
        for k in ["full_stats_after_1B", "stats_before_empty", "stats_after_empty", "after_reset_peak",
                  "after_reset_accum"]:
            cmp_dict(case, k, o.get(k), t.get(k))
        for k in ["summary_full", "summary_abbrev"]:
            same = o.get(k) == t.get(k)
            row(case, k + " (byte for byte)", MATCH if same else DIFF,
                f"{len(t[k])} chars" if same else first_diff(o.get(k) or "", t.get(k) or ""))
        cmp_checkpoints(case, o["checkpoints"], t["checkpoints"])
    elif case == "sizes":
        for a, b in zip(o["sizes"], t["sizes"]):
            n = b["n"]
            d = dict_diff({k: a[k] for k in ("n", "allocated", "reserved", "inactive_split_bytes")},
                          {k: b[k] for k in ("n", "allocated", "reserved", "inactive_split_bytes")})
            row(case, f"n={n} stats", MATCH if not d else DIFF,
                f"allocated {b['allocated']}, reserved {b['reserved']}" if not d else "; ".join(d))
            cmp_segs(case, f"n={n} segments", a["segs"], b["segs"])
        if len(o["sizes"]) != len(t["sizes"]):
            row(case, "count", DIFF, f"ours {len(o['sizes'])}, torch {len(t['sizes'])}")
    elif case == "streams":
        for st, sg in [("after_two_streams", "segs_two_streams"), ("after_record_stream_free", "segs_pending"),
                       ("after_sync_and_malloc", "segs_after")]:
            cmp_dict(case, st, o.get(st), t.get(st))
            cmp_segs(case, sg, o.get(sg), t.get(sg))
        cmp_trace(case, o.get("trace"), t.get("trace"))
    elif case == "oom":
        cmp_oom_msg(case, "oom_msg (1 TiB)", o.get("oom_msg"), t.get("oom_msg"))
        cmp_dict(case, "stats_after_oom", o.get("stats_after_oom"), t.get("stats_after_oom"))
        cmp_trace(case, o.get("trace"), t.get("trace"))
        mo, mt = o.get("mem_get_info") or [None, None], t.get("mem_get_info") or [None, None]
        cmp_exact(case, "mem_get_info total", mo[1], mt[1])
        row(case, "mem_get_info free", INFO, f"ours {mo[0]}, torch {mt[0]} (another process, another instant)")
        cmp_exact(case, "total_memory", o.get("total_memory"), t.get("total_memory"))
        cmp_oom_msg(case, "oom_msg_fraction0_1byte", o.get("oom_msg_fraction0_1byte"), t.get("oom_msg_fraction0_1byte"))
        cmp_exact(case, "frac001_5MiB", o.get("frac001_5MiB"), t.get("frac001_5MiB"))
        cmp_oom_msg(case, "oom_msg_fraction001 (4 GiB)", o.get("oom_msg_fraction001"), t.get("oom_msg_fraction001"))
        cmp_dict(case, "stats_end", o.get("stats_end"), t.get("stats_end"))
        cmp_exact(case, "get_fraction", o.get("get_fraction"), t.get("get_fraction"))
    elif case == "expandable":
        cmp_checkpoints(case, o["checkpoints"], t["checkpoints"])
        cmp_trace(case, o.get("trace"), t.get("trace"))
        cmp_dict(case, "allocator_settings", o.get("allocator_settings"), t.get("allocator_settings"))
    elif case in ("roundup", "roundup_list"):
        for a, b in zip(o["roundup"], t["roundup"]):
            d = dict_diff(a, b)
            row(case, f"n={b['n']}", MATCH if not d else DIFF,
                f"allocated {b['allocated']}, reserved {b['reserved']}" if not d else "; ".join(d))
        if len(o["roundup"]) != len(t["roundup"]):
            row(case, "count", DIFF, f"ours {len(o['roundup'])}, torch {len(t['roundup'])}")
    elif case == "maxsplit":
        cmp_checkpoints(case, o["checkpoints"], t["checkpoints"])
    elif case == "state_only":
        cmp_exact(case, "n_trace", o.get("n_trace"), t.get("n_trace"))
        a, b = trace_seq(o["trace"], True), trace_seq(t["trace"], True)
        row(case, "trace action/size", MATCH if a == b else DIFF, "" if a == b else f"ours {a}; torch {b}")
        a = [x[:2] for x in o["block_states"]]
        b = [x[:2] for x in t["block_states"]]
        row(case, "block [size, state]", MATCH if a == b else DIFF, "" if a == b else f"ours {a}; torch {b}")
        fo = [x[2] for x in o["block_states"]]
        ft = [x[2] for x in t["block_states"]]
        row(case, "block frame counts", INFO if bool_list(fo) == bool_list(ft) else DIFF,
            f"ours {fo}, torch {ft} (Rust vs Python stacks: only empty/non-empty is comparable)")
        so, stt = o.get("seg_frames"), t.get("seg_frames")
        if bool_list(so) == bool_list(stt):
            row(case, "segment frame counts", INFO, f"ours {so}, torch {stt}")
        elif stt == [0] * len(stt) and all(so):
            row(case, "segment frame counts", EXPLAINED,
                f"ours {so}, torch {stt}: PyTorch drops a segment's stack when its head block is split "
                "(the split makes a new head block without context_when_segment_allocated; "
                "PyTorch's snapshot docs: 'Often empty'); gpumem-nb keeps it by segment address")
        else:
            row(case, "segment frame counts", DIFF, f"ours {so}, torch {stt}")
    elif case == "leave_free":
        cmp_leave_free(case, o, t)
    elif case == "gc":
        cmp_exact(case, "allowed", o.get("allowed"), t.get("allowed"))
        cmp_dict(case, "before", o.get("before"), t.get("before"))
        cmp_dict(case, "after", o.get("after"), t.get("after"))
        cmp_segs(case, "segs", o.get("segs"), t.get("segs"))


FILLER_KEYS = ["allocated_bytes.all.current", "reserved_bytes.all.current", "active_bytes.all.current",
               "requested_bytes.all.current", "reserved_bytes.large_pool.current"]


def cmp_leave_free(case, o, t):
    """ipyexperiments' gpu_mem_leave_free_mbs(N), then OOM, a fit, the release (leave_free_torch.py).

    The two sides fill differently, on purpose. ipyexperiments holds one tensor of (whole MiB
    free - N) MiB, which PyTorch rounds up to 2 MiB; when the free bytes are not a whole number
    of 2 MiB pieces that leaves less than N MiB free, and an N MiB allocation then fails.
    gpumem-nb's leave_free_mib never leaves less than N MiB nor N + 2 MiB or more. So the filler
    differs by up to 2 MiB; the allocator's counters are compared with each side's filler taken
    out (its block from the byte counters, its request from requested_bytes), and what stays free
    is checked against each side's own promise."""
    mib = 1 << 20
    n = t["n_mib"] * mib
    cmp_exact(case, "N (MiB)", o.get("n_mib"), t.get("n_mib"))
    fo, ft = o["free_before"], t["free_before"]
    row(case, "free before (cuMemGetInfo)", MATCH if fo == ft else INFO,
        f"{ft} B" if fo == ft else f"ours {fo}, torch {ft} (another process, another instant)")

    def filler_block(r):
        return sum(b[0] for s in r["segs_fill"] for b in s["blocks"] if b[2] == "active_allocated")

    (bo, ro), (bt, rt) = (filler_block(o), o["filler_bytes"]), (filler_block(t), t["filler_bytes"])
    lo, lt = o["free_after_fill"] - n, t["free_after_fill"] - n
    if lo == lt:
        row(case, "free after the fill - N MiB", MATCH, f"{lo} B")
    elif 0 <= lo < 2 * mib:
        row(case, "free after the fill - N MiB", EXPLAINED,
            f"ours {lo:+} B, torch {lt:+} B: free was {ft % (2 * mib)} B past a 2 MiB boundary; "
            f"ipyexperiments' recipe {'left less than N MiB free' if lt < 0 else 'differs'}, gpumem-nb "
            f"promises N <= free < N + 2 MiB (and keeps it)")
    else:
        row(case, "free after the fill - N MiB", DIFF, f"ours {lo:+} B breaks N <= free < N + 2 MiB; torch {lt:+} B")
    row(case, "filler (request / block)", MATCH if (ro, bo) == (rt, bt) else INFO,
        f"ours {ro} / {bo} B, torch {rt} / {bt} B")

    def norm(stats, block, req):
        out = dict(stats)
        for k in FILLER_KEYS:
            if out.get(k) is not None:
                out[k] -= req if k.startswith("requested") else block
        return out

    def shape(r, block):
        return sorted(canon({"type": s["type"], "total_size": "FILLER" if s["total_size"] == block else s["total_size"],
                             "blocks": [["FILLER" if x[0] == block else x[0], x[2]] for x in s["blocks"]]})
                      for s in r["segs_fill"])

    a, b = shape(o, bo), shape(t, bt)
    row(case, "segments after the fill", MATCH if a == b else DIFF,
        f"{len(b)} segment(s): {b}" if a == b else f"ours {a}; torch {b}")
    for k in ["after_fill", "after_oom", "after_half"]:
        cmp_dict(case, k + " (filler taken out)", norm(o[k], bo, ro), norm(t[k], bt, rt))
    cmp_dict(case, "after_release", o.get("after_release"), t.get("after_release"))
    a, b = oom_numbers(o.get("oom_msg") or ""), oom_numbers(t.get("oom_msg") or "")
    strict = ["tried", "total", "reserved_unallocated"]
    d = [f"{k}: ours {a[k]}, torch {b[k]}" for k in strict if a[k] != b[k]]
    row(case, "oom_msg (N + 2 MiB)", MATCH if not d else DIFF,
        ", ".join(f"{k} {b[k]}" for k in strict) if not d else "; ".join(d))
    row(case, "oom_msg (filler- and device-dependent parts)", INFO,
        f"allocated: ours {a['allocated']}, torch {b['allocated']}; free: ours {a['free']}, torch {b['free']}; "
        f"this process: ours {a['process']}, torch {b['process']}")
    cmp_exact(case, "free consumed by N/2 MiB", o["free_after_fill"] - o["free_after_half"],
              t["free_after_fill"] - t["free_after_half"])
    cmp_exact(case, "free at the end - free before", o["free_end"] - fo, t["free_end"] - ft)


def bool_list(v):
    return [bool(x) for x in (v or [])]


def first_diff(a, b):
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    la, lb = a[:i].count("\n") + 1, b[:i].count("\n") + 1
    return (f"first difference at char {i} (line {lb}): ours {a.splitlines()[la - 1] if a else ''!r}, "
            f"torch {b.splitlines()[lb - 1] if b else ''!r}")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    torch, ours = (json.load(open(p)) for p in sys.argv[1:3])
    ti, oi = torch.get("info", {}), ours.get("info", {})
    print(f"torch: {ti.get('torch')} on {ti.get('device')}, total_memory {ti.get('total_memory')}")
    print(f"ours:  gpumem-nb {oi.get('gpumem_nb')} ({oi.get('backend')}) on {oi.get('device')}, "
          f"total_memory {oi.get('total_memory')}")
    cmp_exact("info", "total_memory", oi.get("total_memory"), ti.get("total_memory"))
    for case, t in torch.items():
        if case == "info":
            continue
        if case == "snapshot":
            row(case, "all", SKIP, "not run by gpu_probe: the pickle and PyTorch's viewer are checked by "
                                   "tests/snapshot.rs and scripts/gpu/run.sh")
            continue
        o = ours.get(case)
        if o is None:
            row(case, "run", DIFF, "missing from ours")
            continue
        cmp_case(case, o, t)
    for case in ours:
        if case not in torch:
            row(case, "run", DIFF, "missing from torch")

    w = [max(len(r[i]) for r in rows) for i in range(3)]
    print()
    print(f"{'case':<{w[0]}}  {'item':<{w[1]}}  {'result':<{w[2]}}  detail")
    print(f"{'-' * w[0]}  {'-' * w[1]}  {'-' * w[2]}  ------")
    for c, i, s, d in rows:
        print(f"{c:<{w[0]}}  {i:<{w[1]}}  {s:<{w[2]}}  {d}")
    counts = {s: sum(1 for r in rows if r[2] == s) for s in (MATCH, DIFF, EXPLAINED, INFO, SKIP)}
    print()
    print("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    per_case = {}
    for c, _, s, _ in rows:
        per_case.setdefault(c, {}).setdefault(s, 0)
        per_case[c][s] += 1
    for c, m in per_case.items():
        print(f"  {c:<14} " + ", ".join(f"{v} {k}" for k, v in m.items()))
    if counts[DIFF]:
        print(f"{counts[DIFF]} unexplained difference(s)")
        return 1
    print("no unexplained difference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
