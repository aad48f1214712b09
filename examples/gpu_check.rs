//! GPU-only checks of what the simulated device cannot show, for scripts/gpu/run.sh:
//!
//! - `pool`: cudarc's own `CudaSlice` allocations (`cuMemAllocAsync` from the device's pool)
//!   show up in the CUDA-pool numbers, with exact high-water marks;
//! - `nvml`: NVML's number for this process moves by what `cuMemGetInfo` says the device lost,
//!   within the driver's 2 MiB granularity, when the allocator reserves 1 GiB;
//! - `uuid`: the CUDA device is matched to its NVML device by UUID (run it under
//!   `CUDA_VISIBLE_DEVICES` set to an index and to a UUID);
//! - `multi`: every device has its own allocator; allocations on one leave the others alone.
//!
//! Prints one JSON line per check (`"pass"` true or false, and the numbers) and exits non-zero
//! if any check fails. `gpu_check [pool|nvml|uuid|multi]...` (default: all).

use gpumem_nb::device::nvml;
use gpumem_nb::{Backend, DeviceBuffer, StreamId};
use serde_json::json;

fn report(name: &str, pass: bool, details: serde_json::Value) -> bool {
    println!("{}", json!({"check": name, "pass": pass, "details": details}));
    pass
}

fn cuda_uuid(alloc: &gpumem_nb::Allocator) -> Option<[u8; 16]> {
    alloc.with_backend(|b| b.as_cuda().and_then(|c| c.uuid().ok()))
}

fn pool() -> gpumem_nb::Result<bool> {
    let alloc = gpumem_nb::current()?;
    let ctx = alloc.with_backend(|b| b.as_cuda().map(|c| c.context().clone()));
    let Some(ctx) = ctx else { return Ok(report("pool", false, json!({"error": "not a CUDA device"}))) };
    let stream = ctx.default_stream();
    alloc.with_backend(|b| b.reset_pool_high_water());
    let before = alloc.with_backend(|b| b.pool_usage()).unwrap_or_default();
    let n = 48 << 20;
    let slice = stream.alloc_zeros::<u8>(n).map_err(|e| gpumem_nb::Error::NoCuda(format!("alloc_zeros: {e:?}")))?;
    stream.synchronize().ok();
    let during = alloc.with_backend(|b| b.pool_usage()).unwrap_or_default();
    drop(slice);
    stream.synchronize().ok();
    let after = alloc.with_backend(|b| b.pool_usage()).unwrap_or_default();
    let pass = during.used == before.used + n as u64
        && during.used_high == before.used + n as u64
        && after.used == before.used
        && after.used_high == during.used_high
        && during.reserved >= during.used;
    Ok(report(
        "pool",
        pass,
        json!({"slice_bytes": n, "before": format!("{before:?}"), "during": format!("{during:?}"), "after": format!("{after:?}")}),
    ))
}

fn nvml_vs_mem_get_info() -> gpumem_nb::Result<bool> {
    let alloc = gpumem_nb::current()?;
    let Some(uuid) = cuda_uuid(&alloc) else { return Ok(report("nvml", false, json!({"error": "no CUDA UUID"}))) };
    let read = || -> (Option<u64>, u64) {
        let me = match nvml::this_process(uuid) {
            Ok(nvml::ThisProcess::Used(b)) => Some(b),
            _ => None,
        };
        (me, alloc.mem_get_info().map(|m| m.0).unwrap_or(0))
    };
    let (nvml0, free0) = read();
    let buf = DeviceBuffer::<u8>::zeros(&alloc, 1 << 30, StreamId::DEFAULT)?;
    let (nvml1, free1) = read();
    drop(buf);
    alloc.empty_cache()?;
    let (nvml2, free2) = read();
    let granule = 2i64 << 20;
    let dev_delta = free0 as i64 - free1 as i64;
    let proc_delta = nvml1.zip(nvml0).map(|(a, b)| a as i64 - b as i64);
    let pass = proc_delta.is_some_and(|p| (p - dev_delta).abs() <= granule)
        && (dev_delta - (1 << 30)).abs() <= granule
        && (free2 as i64 - free0 as i64).abs() <= granule;
    Ok(report(
        "nvml",
        pass,
        json!({"reserved_by_allocator": alloc.memory_reserved(), "nvml_this_process": [nvml0, nvml1, nvml2],
               "cuMemGetInfo_free": [free0, free1, free2], "device_delta": dev_delta, "process_delta": proc_delta}),
    ))
}

fn uuid() -> gpumem_nb::Result<bool> {
    let alloc = gpumem_nb::current()?;
    let Some(uuid) = cuda_uuid(&alloc) else { return Ok(report("uuid", false, json!({"error": "no CUDA UUID"}))) };
    let cuda = nvml::uuid_string("GPU", uuid);
    let n = nvml::nvml()?;
    let found = n.device_by_uuid(cuda.as_str()).ok().and_then(|d| d.index().ok());
    let me_listed = matches!(nvml::this_process(uuid), Ok(nvml::ThisProcess::Used(_)));
    Ok(report(
        "uuid",
        found.is_some() && me_listed,
        json!({"CUDA_VISIBLE_DEVICES": std::env::var("CUDA_VISIBLE_DEVICES").ok(), "cuda_ordinal": 0,
               "cuda_uuid": cuda, "nvml_index": found, "this_process_listed": me_listed}),
    ))
}

fn multi() -> gpumem_nb::Result<bool> {
    let count = gpumem_nb::device::cuda::probe().unwrap_or(0);
    if count < 2 {
        return Ok(report("multi", true, json!({"devices": count, "note": "one device: nothing to compare"})));
    }
    let mut rows = Vec::new();
    let mut bufs = Vec::new();
    for d in 0..count {
        let alloc = gpumem_nb::device(d)?;
        bufs.push(DeviceBuffer::<u8>::zeros(&alloc, (d + 1) << 26, StreamId::DEFAULT)?);
    }
    let mut pass = true;
    for d in 0..count {
        let alloc = gpumem_nb::device(d)?;
        let want = ((d + 1) << 26) as u64;
        pass &= alloc.memory_allocated() == want && alloc.device() == d as i32;
        rows.push(json!({"device": d, "allocated": alloc.memory_allocated(), "reserved": alloc.memory_reserved(),
                         "free": alloc.mem_get_info().ok().map(|m| m.0), "uuid": cuda_uuid(&alloc).map(|u| nvml::uuid_string("GPU", u))}));
    }
    drop(bufs);
    Ok(report("multi", pass, json!({"devices": count, "rows": rows})))
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let want = |c: &str| args.is_empty() || args.iter().any(|a| a == c);
    let mut ok = true;
    type Check = fn() -> gpumem_nb::Result<bool>;
    let checks: [(&str, Check); 4] = [("pool", pool), ("nvml", nvml_vs_mem_get_info), ("uuid", uuid), ("multi", multi)];
    for (name, f) in checks {
        if want(name) {
            ok &= f().unwrap_or_else(|e| report(name, false, json!({"error": e.to_string()})));
        }
    }
    if ok { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE }
}
