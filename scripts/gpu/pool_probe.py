#!/usr/bin/env python3
"""How the CUDA driver's stream-ordered pool reserves memory, and where a pool with a
`maxSize` refuses (issue 33, item 4: capping a candle notebook, which allocates through cudarc's
`cuMemAllocAsync` from the device's current pool, not through gpumem-nb's allocator).

    python3 scripts/gpu/pool_probe.py OUT.jsonl

The driver API through ctypes, no PyTorch. One JSON line per step:
- `default`: the device's default pool, allocations of growing sizes one after another, with
  the pool's used and reserved bytes after each (CU_MEMPOOL_ATTR_*_MEM_CURRENT);
- `capped`: a pool created with `maxSize` and made the device's current pool
  (`cuDeviceSetMemPool`, what `cuMemAllocAsync` then draws from), filled with one size until it
  refuses, for several sizes and a mix: how many fit, used and reserved at the refusal, and the
  error code;
- `release`: what the pool keeps after the frees and a stream synchronize (release threshold 0,
  the default) and after raising the threshold.
"""
import ctypes
import json
import sys

MIB = 1 << 20
cu = ctypes.CDLL("libcuda.so.1")
OUT = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout


def check(rc, what):
    if rc != 0:
        name = ctypes.c_char_p()
        cu.cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{what}: {rc} {name.value.decode() if name.value else ''}")


def emit(**row):
    OUT.write(json.dumps(row) + "\n")
    OUT.flush()


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class PoolProps(ctypes.Structure):
    # CUDA 12.6+ / 13.0 (cudarc's sys for cuda-13000): 88 bytes.
    _fields_ = [
        ("allocType", ctypes.c_int),
        ("handleTypes", ctypes.c_int),
        ("location", Location),
        ("win32SecurityAttributes", ctypes.c_void_p),
        ("maxSize", ctypes.c_size_t),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 54),
    ]


RESERVED, USED, THRESHOLD = 5, 7, 4

check(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
stream = ctypes.c_void_p()
check(cu.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
ver = ctypes.c_int()
cu.cuDriverGetVersion(ctypes.byref(ver))
emit(step="driver", version=ver.value)


def attr(pool, a):
    v = ctypes.c_uint64()
    check(cu.cuMemPoolGetAttribute(pool, a, ctypes.byref(v)), "cuMemPoolGetAttribute")
    return v.value


def books(pool):
    return {"used": attr(pool, USED), "reserved": attr(pool, RESERVED)}


def alloc(size):
    p = ctypes.c_uint64()
    rc = cu.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t(size), stream)
    return rc, p.value


def free_all(ptrs):
    for p in ptrs:
        check(cu.cuMemFreeAsync(ctypes.c_uint64(p), stream), "cuMemFreeAsync")
    ptrs.clear()
    check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")


def current_pool():
    pool = ctypes.c_void_p()
    check(cu.cuDeviceGetMemPool(ctypes.byref(pool), dev), "cuDeviceGetMemPool")
    return pool


# The default pool: what each allocation adds to what it reserves.
pool = current_pool()
ptrs = []
for size in [4096, 65536, MIB, 3 * MIB, 8 * MIB, 20 * MIB, 33 * MIB, 64 * MIB, 100 * MIB, 1000 * MIB, 4096]:
    rc, p = alloc(size)
    check(rc, f"default alloc {size}")
    ptrs.append(p)
    emit(step="default", size=size, **books(pool))
free_all(ptrs)
emit(step="release", pool="default", threshold=attr(pool, THRESHOLD), after="free+sync", **books(pool))

# Pools with a maxSize made current.
for cap in [256 * MIB, 1000 * MIB]:
    props = PoolProps()
    props.allocType = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
    props.location = Location(1, dev.value)  # CU_MEM_LOCATION_TYPE_DEVICE
    props.maxSize = cap
    capped = ctypes.c_void_p()
    check(cu.cuMemPoolCreate(ctypes.byref(capped), ctypes.byref(props)), "cuMemPoolCreate")
    check(cu.cuDeviceSetMemPool(dev, capped), "cuDeviceSetMemPool")
    assert current_pool().value == capped.value
    for size in [MIB, 2 * MIB, 3 * MIB, 5 * MIB, 20 * MIB, 33 * MIB, 100 * MIB, cap // 2, cap]:
        n, rc = 0, 0
        while True:
            rc, p = alloc(size)
            if rc != 0:
                break
            ptrs.append(p)
            n += 1
        emit(step="capped", cap=cap, size=size, fitted=n, bytes=n * size, rc=rc, **books(capped))
        free_all(ptrs)
        emit(step="release", pool="capped", cap=cap, threshold=attr(capped, THRESHOLD), after="free+sync", **books(capped))
    # A mix, as a training step makes it: small and large, half freed, then large again.
    sizes = [64 * 1024, 4 * MIB, 16 * MIB, 3 * MIB, 8 * MIB] * 40
    made, refused = [], None
    for i, size in enumerate(sizes):
        rc, p = alloc(size)
        if rc != 0:
            refused = {"at": i, "size": size, "rc": rc}
            break
        made.append((p, size))
    emit(step="capped-mix", cap=cap, made=len(made), live=sum(s for _, s in made), refused=refused, **books(capped))
    for p, _ in made[::2]:
        check(cu.cuMemFreeAsync(ctypes.c_uint64(p), stream), "cuMemFreeAsync")
    live = sum(s for _, s in made[1::2])
    n, rc = 0, 0
    big = []
    while True:
        rc, p = alloc(24 * MIB)
        if rc != 0:
            break
        big.append(p)
        n += 1
    emit(step="capped-mix-after-half-freed", cap=cap, live_before=live, fitted_24mib=n, rc=rc, **books(capped))
    free_all(big)
    free_all([p for p, _ in made[1::2]])
    # Keep what is freed: the threshold at the cap.
    check(cu.cuMemPoolSetAttribute(capped, THRESHOLD, ctypes.byref(ctypes.c_uint64(cap))), "threshold")
    rc, p = alloc(cap // 4)
    check(rc, "alloc a quarter")
    free_all([p])
    emit(step="release", pool="capped", cap=cap, threshold=attr(capped, THRESHOLD), after="free+sync, threshold=cap", **books(capped))
    default = ctypes.c_void_p()
    check(cu.cuDeviceGetDefaultMemPool(ctypes.byref(default), dev), "cuDeviceGetDefaultMemPool")
    check(cu.cuDeviceSetMemPool(dev, default), "cuDeviceSetMemPool default")
    check(cu.cuMemPoolDestroy(capped), "cuMemPoolDestroy")
emit(step="done")
