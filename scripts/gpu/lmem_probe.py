"""Where NVML's bytes go when a kernel with a large stack frame first runs (issue 46: NVML counted
+186 MiB per device at the first NCCL all-reduce that no allocation tracker saw).

Hypothesis: the driver reserves local memory for every thread the device can hold at once (the
per-thread size times SMs times resident threads per SM), grows it when a kernel needs a larger
frame than the context's current stack limit, and keeps it. This probe checks that on one GPU:
- kernels with local arrays of growing size (CuPy's RawKernel, NVRTC), each launched once; after
  each, NVML's bytes for this process, the context's stack limit (cudaLimitStackSize) and the
  kernel's own local size (its attribute), against the prediction
  (new limit - old limit) x SMs x max threads per SM;
- NCCL's kernels as its library ships them: `cuobjdump -res-usage` on libnccl.so.2 (PyTorch's
  nvidia-nccl wheel), the largest STACK of the sm_90 all-reduce kernels, what the first
  all-reduce would grow the limit to.

Usage (on the GPU machine, PyTorch's python3): python3 scripts/gpu/lmem_probe.py OUT.json
"""

import glob
import json
import os
import re
import subprocess
import sys

import cupy
import pynvml

MIB = 1 << 20


def nvml_used(handle, pid):
    for fn in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses"):
        f = getattr(pynvml, fn, None)
        if f is None:
            continue
        for p in f(handle):
            if p.pid == pid:
                return p.usedGpuMemory
        return 0
    return None


def stack_limit():
    return cupy.cuda.runtime.deviceGetLimit(cupy.cuda.runtime.cudaLimitStackSize)


KERNEL = r"""
extern "C" __global__ void frame(const int *in, int *out) {
    volatile char buf[SIZE];
    int t = threadIdx.x;
    for (int i = 0; i < SIZE; i += 64) buf[(i + t) % SIZE] = (char)(in[0] + i);
    int s = 0;
    for (int i = 0; i < SIZE; i += 64) s += buf[(i * 7 + t) % SIZE];
    out[t] = s;
}
"""


def main():
    out_path = sys.argv[1]
    pid = os.getpid()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    dev = cupy.cuda.Device(0)
    dev.use()
    props = cupy.cuda.runtime.getDeviceProperties(0)
    sms = props["multiProcessorCount"]
    per_sm = props["maxThreadsPerMultiProcessor"]
    threads = sms * per_sm
    inp = cupy.zeros(1, dtype=cupy.int32)
    out = cupy.zeros(1024, dtype=cupy.int32)
    cupy.cuda.runtime.deviceSynchronize()
    rows = []
    before = {"nvml": nvml_used(handle, pid), "stack_limit": stack_limit()}
    report = {"device": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
              "sms": sms, "threads_per_sm": per_sm, "resident_threads": threads,
              "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING"), "start": before, "kernels": rows}
    last = before
    for size in (256, 1024, 2048, 4096, 16384):
        k = cupy.RawKernel(KERNEL.replace("SIZE", str(size)), "frame")
        k((1,), (256,), (inp, out))
        cupy.cuda.runtime.deviceSynchronize()
        now = {"nvml": nvml_used(handle, pid), "stack_limit": stack_limit()}
        attrs = k.attributes
        row = {
            "local_array": size,
            "local_size_bytes": attrs.get("local_size_bytes"),
            "nvml": now["nvml"],
            "nvml_delta": None if now["nvml"] is None or last["nvml"] is None else now["nvml"] - last["nvml"],
            "stack_limit": now["stack_limit"],
            "predicted_delta": (now["stack_limit"] - last["stack_limit"]) * threads,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        last = now

    # NCCL's kernels as shipped: their stack frames on sm_90.
    libs = glob.glob(os.path.join(os.path.dirname(cupy.__file__), "..", "nvidia", "nccl", "lib", "libnccl.so*"))
    libs += glob.glob("/opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so*")
    libs += glob.glob("/opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnccl.so*")
    nccl = {"libraries": sorted(set(os.path.realpath(p) for p in libs))}
    if nccl["libraries"]:
        lib = nccl["libraries"][0]
        try:
            text = subprocess.run(["cuobjdump", "-res-usage", "-arch", "sm_90", lib], capture_output=True,
                                  text=True, timeout=300).stdout
        except (OSError, subprocess.SubprocessError) as e:
            text = ""
            nccl["error"] = str(e)
        funcs = []
        name = None
        for line in text.splitlines():
            m = re.search(r"Function (\S+):", line)
            if m:
                name = m.group(1)
                continue
            m = re.search(r"STACK:(\d+)", line)
            if m and name:
                local = re.search(r"LOCAL:(\d+)", line)
                funcs.append((name, int(m.group(1)), int(local.group(1)) if local else 0))
                name = None
        funcs.sort(key=lambda f: -f[1])
        nccl["kernels"] = len(funcs)
        nccl["largest_stack"] = funcs[:8]
        allreduce = [f for f in funcs if "AllReduce" in f[0] or "Generic" in f[0]]
        nccl["allreduce_largest_stack"] = allreduce[:4]
        if allreduce:
            grow_to = max(f[1] + f[2] for f in allreduce)
            nccl["predicted_growth_from_start_limit"] = max(0, grow_to - before["stack_limit"]) * threads
    report["nccl"] = nccl
    print(json.dumps(nccl), flush=True)
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
