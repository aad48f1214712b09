#!/usr/bin/env python3
"""Checks a memory snapshot pickle the way PyTorch's tools will read it.

Usage: snapshot_check.py FILE.pickle [FILE.json]

Holds gpumem-nb's snapshots and PyTorch's own (the golden pickle) to one standard:
- protocol 4 header (80 04 95) and only the opcodes MemoryViz.js understands
  (reference/pytorch_allocator.md §3.8);
- top-level keys, segment / block / trace entry key sets, as PyTorch 2.11 writes them;
- every segment's blocks tile it: addresses contiguous, sizes summing to total_size;
  allocated/active/requested sizes agree with the blocks;
- block states and trace actions from PyTorch's vocabulary; "oom" has device_free, no addr;
- frames are dicts of name/filename/line.
With a JSON file too, the JSON holds the same structure (tuples as lists).
Prints a one-line summary and exits 0, or prints the first problem and exits 1.
"""
import json
import pickle
import pickletools
import sys

ALLOWED_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST",
    "APPEND", "APPENDS", "LIST", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_TUPLE", "NEWTRUE",
    "NEWFALSE", "NONE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE",
    "BINUNICODE", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
}
TOP_KEYS = {"segments", "device_traces", "allocator_settings", "external_annotations"}
SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "addr", "size", "stream", "time_us", "compile_context", "user_metadata"}
STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom"}
SETTINGS_KEYS = {"PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold",
                 "expandable_segments", "pinned_num_register_threads", "release_lock_on_cudamalloc",
                 "pinned_use_cuda_host_register", "roundup_power2_divisions"}


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check_frames(frames, where):
    if not isinstance(frames, list):
        fail(f"{where}: frames is {type(frames).__name__}, not a list")
    for f in frames:
        if not isinstance(f, dict) or set(f) != {"name", "filename", "line"}:
            fail(f"{where}: frame {f!r} is not a name/filename/line dict")
        if not isinstance(f["line"], int) or not isinstance(f["name"], str):
            fail(f"{where}: frame {f!r} has wrong types")


def check(path, json_path=None):
    data = open(path, "rb").read()
    if data[:3] != b"\x80\x04\x95":
        fail(f"header is {data[:3].hex()}, expected 800495 (protocol 4 with a frame)")
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    bad = ops - ALLOWED_OPCODES
    if bad:
        fail(f"opcodes MemoryViz.js cannot read: {sorted(bad)}")
    snap = pickle.loads(data)
    if set(snap) != TOP_KEYS:
        fail(f"top-level keys {sorted(snap)}")
    settings = snap["allocator_settings"]
    if not SETTINGS_KEYS <= set(settings):
        fail(f"allocator_settings lacks {sorted(SETTINGS_KEYS - set(settings))}")
    if sorted(settings["roundup_power2_divisions"], key=int) != [str(1 << i) for i in range(16)]:
        fail("roundup_power2_divisions keys are not 1 … 32768")
    devices = set()
    n_blocks = 0
    for i, seg in enumerate(snap["segments"]):
        where = f"segment {i}"
        if set(seg) != SEGMENT_KEYS:
            fail(f"{where}: keys {sorted(seg)}")
        if seg["segment_type"] not in ("small", "large") or not isinstance(seg["segment_pool_id"], tuple):
            fail(f"{where}: segment_type/segment_pool_id")
        devices.add(seg["device"])
        check_frames(seg["frames"], where)
        addr = seg["address"]
        total = alloc = active = req = 0
        for j, b in enumerate(seg["blocks"]):
            bw = f"{where} block {j}"
            if set(b) != BLOCK_KEYS:
                fail(f"{bw}: keys {sorted(b)}")
            if b["state"] not in STATES:
                fail(f"{bw}: state {b['state']!r}")
            if b["address"] != addr:
                fail(f"{bw}: address {b['address']} but the previous block ends at {addr}")
            if b["size"] <= 0:
                fail(f"{bw}: size {b['size']}")
            check_frames(b["frames"], bw)
            if b["state"] == "inactive" and b["frames"]:
                fail(f"{bw}: an inactive block carries frames")
            addr += b["size"]
            total += b["size"]
            if b["state"] == "active_allocated":
                alloc += b["size"]
            if b["state"] != "inactive":
                active += b["size"]
                req += b["requested_size"]
            n_blocks += 1
        if total != seg["total_size"]:
            fail(f"{where}: blocks sum to {total}, total_size is {seg['total_size']}")
        if (alloc, active, req) != (seg["allocated_size"], seg["active_size"], seg["requested_size"]):
            fail(f"{where}: allocated/active/requested sizes disagree with the blocks")
    traces = snap["device_traces"]
    if not isinstance(traces, list) or any(not isinstance(t, list) for t in traces):
        fail("device_traces is not a list of lists")
    if devices and max(devices) >= len(traces):
        fail(f"device_traces has {len(traces)} lists but segments name device {max(devices)}")
    actions = {}
    for d, t in enumerate(traces):
        for k, e in enumerate(t):
            where = f"device {d} trace entry {k}"
            if e.get("action") not in ACTIONS:
                fail(f"{where}: action {e.get('action')!r}")
            keys = set(e) - {"frames"}
            want = TRACE_KEYS - {"addr"} | {"device_free"} if e["action"] == "oom" else TRACE_KEYS
            if keys != want:
                fail(f"{where} ({e['action']}): keys {sorted(keys)}")
            if "frames" in e:
                check_frames(e["frames"], where)
            actions[e["action"]] = actions.get(e["action"], 0) + 1
    if json_path:
        def lists(x):
            if isinstance(x, (list, tuple)):
                return [lists(v) for v in x]
            if isinstance(x, dict):
                return {k: lists(v) for k, v in x.items()}
            return x
        if json.load(open(json_path)) != lists(snap):
            fail("the JSON does not hold the same structure as the pickle")
    summary = {"segments": len(snap["segments"]), "blocks": n_blocks, "actions": actions, "opcodes": sorted(ops)}
    print("OK " + json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        fail("usage: snapshot_check.py FILE.pickle [FILE.json]")
    check(*sys.argv[1:])
