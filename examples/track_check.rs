//! On a GPU: every allocation of the process is tracked, whoever makes it, with its exact size,
//! and per-cell totals agree with what was made and with NVML; and what tracking costs per
//! allocation. Prints one JSON object per check; exit 0 when all pass, 1 when one fails, 2 when
//! there is no GPU or no usable CUPTI (one line says why).
//!
//! Run on the GPU machine: `GPUMEM_NB_DEVICE=cuda track_check` (built with
//! `cargo build --release --example track_check --features cublas`).
//!
//! "Cells" are driven through the control channel exactly as gpumem-kernel drives them
//! (`pre`/`post`), so the numbers checked are the ones a notebook's report shows.

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use cudarc::driver::{CudaContext, sys};
use gpumem_nb::kernel::protocol::{Op, PlaceReading, Reply};
use gpumem_nb::tracking::{self, STACK_DEPTH, TrackingStatus};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

const MIB: u64 = 1 << 20;

#[path = "../tests/common/channel.rs"]
mod channel;
use channel::Channel;

fn place(r: &Reply, device: Option<i32>) -> PlaceReading {
    r.tracked.as_ref().and_then(|v| v.iter().find(|p| p.device == device).cloned()).unwrap_or_default()
}

fn source_live(p: &PlaceReading, key: &str) -> u64 {
    p.by_source.iter().find(|s| s.source == key).map_or(0, |s| s.live)
}

fn source_peak(p: &PlaceReading, key: &str) -> u64 {
    p.by_source.iter().find(|s| s.source == key).map_or(0, |s| s.peak)
}

/// NVML's bytes for this process on the device.
fn nvml_process(uuid: Option<[u8; 16]>) -> Option<u64> {
    match gpumem_nb::device::nvml::this_process(uuid?) {
        Ok(gpumem_nb::device::nvml::ThisProcess::Used(b)) => Some(b),
        _ => None,
    }
}

struct Checks {
    failed: usize,
}

impl Checks {
    fn check(&mut self, name: &str, pass: bool, detail: serde_json::Value) {
        if !pass {
            self.failed += 1;
        }
        println!("{}", json!({"check": name, "pass": pass, "detail": detail}));
    }
}

/// One cell: pre, the work, post; the device's and the host's readings before and after, and
/// NVML's per-process bytes before and after.
struct Cell {
    before: PlaceReading,
    after: PlaceReading,
    host_before: PlaceReading,
    host_after: PlaceReading,
    nvml: (Option<u64>, Option<u64>),
}

fn cell(ch: &mut Channel, n: u64, uuid: Option<[u8; 16]>, work: impl FnOnce()) -> Cell {
    let nvml_before = nvml_process(uuid);
    let pre = ch.ask(Op::Pre { cell: n });
    work();
    let post = ch.ask(Op::Post { cell: n });
    Cell {
        before: place(&pre, Some(0)),
        after: place(&post, Some(0)),
        host_before: place(&pre, None),
        host_after: place(&post, None),
        nvml: (nvml_before, nvml_process(uuid)),
    }
}

fn nvml_delta(c: &Cell) -> Option<i64> {
    Some(c.nvml.1? as i64 - c.nvml.0? as i64)
}

/// Nanoseconds per `cuMemAllocAsync` + `cuMemFreeAsync` pair of `bytes` on a warm pool.
fn pool_pair_ns(stream: &Arc<cudarc::driver::CudaStream>, bytes: usize, n: usize) -> f64 {
    for _ in 0..1000 {
        drop(stream.alloc_zeros::<u8>(bytes).expect("warm-up"));
    }
    stream.synchronize().expect("sync");
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: the slice is dropped (freed, stream-ordered) right away, never read.
        let s = unsafe { stream.alloc::<u8>(bytes) }.expect("alloc");
        drop(s);
    }
    stream.synchronize().expect("sync");
    t.elapsed().as_nanos() as f64 / n as f64
}

/// Nanoseconds per `cuMemAllocAsync` and per `cuMemFreeAsync` of `bytes`, `n` of each, with
/// `depth` of the program's own frames below (so a deep stack is walked in full).
fn pool_split_ns(stream: &Arc<cudarc::driver::CudaStream>, bytes: usize, n: usize, depth: usize) -> (f64, f64) {
    #[inline(never)]
    fn nest(stream: &Arc<cudarc::driver::CudaStream>, bytes: usize, n: usize, depth: usize) -> (f64, f64) {
        if depth > 0 {
            let r = nest(stream, bytes, n, depth - 1);
            std::hint::black_box(depth);
            return r;
        }
        let mut keep = Vec::with_capacity(n);
        let t = Instant::now();
        for _ in 0..n {
            // SAFETY: never read; freed (stream-ordered) below.
            keep.push(unsafe { stream.alloc::<u8>(bytes) }.expect("alloc"));
        }
        let a = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        drop(keep);
        let f = t.elapsed().as_nanos() as f64 / n as f64;
        stream.synchronize().expect("sync");
        (a, f)
    }
    let _warm = nest(stream, bytes, n.min(1000), depth);
    (0..3).map(|_| nest(stream, bytes, n, depth)).fold((f64::MAX, f64::MAX), |b, x| (b.0.min(x.0), b.1.min(x.1)))
}

fn main() {
    let expect_gpu = std::env::var_os("GPUMEM_NB_EXPECT_GPU").is_some();
    // SAFETY: set before any other thread exists.
    unsafe { std::env::set_var("GPUMEM_NB_DEVICE", "cuda") };
    let skip = |why: String| -> ! {
        println!("{}", json!({"status": if expect_gpu { "FAIL" } else { "skipped" }, "reason": why}));
        std::process::exit(if expect_gpu { 1 } else { 2 });
    };
    // What tracking costs: the same loop before gpumem-nb is loaded (no CUPTI subscriber), then
    // tracked without and with stacks.
    let ctx = match gpumem_nb::device::cuda::probe() {
        Ok(_) => CudaContext::new(0).unwrap_or_else(|e| skip(format!("no CUDA context: {e:?}"))),
        Err(e) => skip(e.to_string()),
    };
    let stream = ctx.new_stream().expect("stream");
    let n = 20_000;
    let base_ns = pool_pair_ns(&stream, 4096, n);
    let base_split = pool_split_ns(&stream, 4096, n, 40);

    let alloc = gpumem_nb::current().unwrap_or_else(|e| skip(e.to_string()));
    let status = tracking::status();
    println!("{}", json!({"status": "tracking", "tracking": status.to_string(), "device": alloc.device()}));
    if !matches!(status, TrackingStatus::Cupti { .. }) {
        skip(status.to_string());
    }
    let mut c = Checks { failed: 0 };
    // A stack is taken when an allocation starts (its release is shown with it): per pair, one
    // stack and two callbacks. Measured at several depths, then back to the default.
    let mut per_depth = serde_json::Map::new();
    for depth in [0, 8, 16, STACK_DEPTH] {
        tracking::set_stack_depth(depth);
        let ns = pool_pair_ns(&stream, 4096, n);
        per_depth.insert(depth.to_string(), json!({"pair_ns": ns, "pair_overhead_ns": ns - base_ns}));
    }
    // Allocation and release apart, 40 frames of the program's own below (every depth walked in
    // full), as a table beside the untracked numbers.
    println!(
        "stack depth | alloc ns | release ns | alloc overhead ns | release overhead ns   (cuMemAllocAsync/cuMemFreeAsync, 4 KiB)"
    );
    println!("untracked   | {:8.0} | {:10.0} |                 – |                   –", base_split.0, base_split.1);
    let mut split = serde_json::Map::new();
    for depth in [0, 8, 16, STACK_DEPTH] {
        tracking::set_stack_depth(depth);
        let (a, f) = pool_split_ns(&stream, 4096, n, 40);
        println!("{depth:>11} | {a:8.0} | {f:10.0} | {:17.0} | {:19.0}", a - base_split.0, f - base_split.1);
        split.insert(
            depth.to_string(),
            json!({"alloc_ns": a, "free_ns": f, "alloc_overhead_ns": a - base_split.0, "free_overhead_ns": f - base_split.1}),
        );
    }
    c.check(
        "overhead per allocation and per release, apart (targets: ≤ 1000 ns and ≤ 500 ns at depth 32)",
        true,
        json!({"untracked_alloc_ns": base_split.0, "untracked_free_ns": base_split.1, "by_stack_depth": split}),
    );
    tracking::set_stack_depth(STACK_DEPTH);
    let over = |d: usize| per_depth[&d.to_string()]["pair_overhead_ns"].as_f64().unwrap_or(f64::NAN);
    c.check(
        "overhead per allocation (its allocation and release callbacks)",
        true,
        json!({
            "pair_ns_untracked": base_ns, "by_stack_depth": per_depth,
            "overhead_ns_no_stacks": over(0), "overhead_ns_stacks": over(STACK_DEPTH),
            "default_stack_depth": STACK_DEPTH, "pairs": n,
        }),
    );

    let uuid = gpumem_nb::device::cuda::device_uuid(0).ok();
    let mut ch = Channel::new();

    // 1. cudarc's CudaSlice: the stream-ordered pool.
    let mut pool_buf = None;
    let elems = (48 * MIB / 4) as usize;
    let x = cell(&mut ch, 1, uuid, || pool_buf = Some(stream.alloc_zeros::<f32>(elems).expect("alloc_zeros")));
    let d = x.after.live as i64 - x.before.live as i64;
    c.check(
        "cudarc alloc_zeros: +48 MiB from the pool",
        d == (48 * MIB) as i64 && source_live(&x.after, "pool") - source_live(&x.before, "pool") == 48 * MIB,
        json!({"tracked_delta": d, "nvml_delta": nvml_delta(&x), "pool_reserved": alloc.pool_usage().map(|p| p.reserved)}),
    );

    // 2. Plain cuMemAlloc, past the allocator (what libtorch or burn do).
    let mut raw = None;
    let x = cell(&mut ch, 2, uuid, || raw = Some(gpumem_nb::mem::driver_alloc_mib(100).expect("cuMemAlloc")));
    let d = x.after.live as i64 - x.before.live as i64;
    let nv = nvml_delta(&x);
    c.check(
        "cuMemAlloc 100 MiB: exact, and NVML agrees within 2 MiB",
        d == (100 * MIB) as i64 && nv.is_none_or(|nv| (nv - d).unsigned_abs() <= 2 * MIB),
        json!({"tracked_delta": d, "nvml_delta": nv, "top": x.after.top}),
    );

    // Every cell runs its closure inside `cell`, so this program's site holds the 100 MiB
    // together with what the earlier cell's closure allocated there (the pool's slice).
    let site = x
        .after
        .top
        .iter()
        .find(|o| o.bytes >= 100 * MIB && o.function.as_deref().is_some_and(|f| f.starts_with("track_check::")))
        .cloned()
        .unwrap_or_default();
    c.check(
        "sites: the 100 MiB cuMemAlloc is this program's, named by function (not cudarc's, not CUDA's)",
        site.function.as_deref().is_some_and(|f| f.starts_with("track_check::")),
        json!({"site": site.site(), "entry": site}),
    );

    // 3. A temporary: made and dropped, the cell's peak is exact.
    let x = cell(&mut ch, 3, uuid, || drop(gpumem_nb::mem::driver_alloc_mib(300).expect("cuMemAlloc")));
    c.check(
        "a 300 MiB temporary: delta 0, peak exactly 300 MiB above the start",
        x.after.live == x.before.live && x.after.peak - x.before.live == 300 * MIB,
        json!({"before": x.before.live, "after": x.after.live, "peak": x.after.peak}),
    );

    // 4. cuBLAS: a handle and a gemm allocate its own workspaces.
    let mut keep_blas = None;
    let x = cell(&mut ch, 4, uuid, || {
        let m = 1024usize;
        let a = stream.alloc_zeros::<f32>(m * m).expect("a");
        let b = stream.alloc_zeros::<f32>(m * m).expect("b");
        let mut out = stream.alloc_zeros::<f32>(m * m).expect("c");
        let blas = CudaBlas::new(stream.clone()).expect("cublas");
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: m as i32,
            n: m as i32,
            k: m as i32,
            alpha: 1.0f32,
            lda: m as i32,
            ldb: m as i32,
            beta: 0.0f32,
            ldc: m as i32,
        };
        // SAFETY: a, b and out hold m×m f32 each, as the config says.
        unsafe { blas.gemm(cfg, &a, &b, &mut out) }.expect("gemm");
        stream.synchronize().expect("sync");
        keep_blas = Some((blas, a, b, out));
    });
    let by_owner: Vec<String> = x.after.top.iter().map(|o| o.owner.clone()).collect();
    let pool_d = source_live(&x.after, "pool") - source_live(&x.before, "pool");
    let driver_d = source_live(&x.after, "driver") as i64 - source_live(&x.before, "driver") as i64;
    c.check(
        "cuBLAS: three 4 MiB matrices from the pool, its workspace from the driver, owned by libcublas",
        pool_d == 3 * 4 * MIB && driver_d > 0 && by_owner.iter().any(|o| o.contains("cublas")),
        json!({"pool_delta": pool_d, "driver_delta": driver_d, "top": x.after.top, "by_source": x.after.by_source}),
    );

    // 5. VMM: cuMemCreate + cuMemMap count from creation until released and unmapped.
    let gran = 2 * MIB as usize;
    let (mut handle, mut va) = (0u64, 0u64);
    ctx.bind_to_thread().expect("bind");
    let x = cell(&mut ch, 5, uuid, || {
        let prop = sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        };
        // SAFETY: out-pointers are valid locals; the handle is mapped into the range reserved
        // just before, with its exact size, and both are released below in cell 6.
        unsafe {
            sys::cuMemCreate(&mut handle, gran, &prop, 0).result().expect("cuMemCreate");
            sys::cuMemAddressReserve(&mut va, gran, 0, 0, 0).result().expect("reserve");
            sys::cuMemMap(va, gran, 0, handle, 0).result().expect("map");
        }
    });
    let vmm_d = source_live(&x.after, "vmm") - source_live(&x.before, "vmm");
    c.check("VMM cuMemCreate 2 MiB: +2 MiB", vmm_d == 2 * MIB, json!({"vmm_delta": vmm_d}));
    let x = cell(&mut ch, 6, uuid, || {
        // SAFETY: `va` maps exactly `handle` over `gran` bytes (cell 5); nothing uses it.
        unsafe {
            sys::cuMemUnmap(va, gran).result().expect("unmap");
            sys::cuMemRelease(handle).result().expect("release");
            sys::cuMemAddressFree(va, gran).result().expect("free va");
        }
    });
    c.check(
        "VMM unmapped and released: back to 0",
        source_live(&x.after, "vmm") == 0 && source_peak(&x.after, "vmm") == 2 * MIB,
        json!({"vmm": x.after.by_source}),
    );

    // 6. Pinned host memory: on the host, not the device.
    let mut pinned = None;
    let x = cell(&mut ch, 7, uuid, || {
        // SAFETY: the memory is never read before written (never read at all).
        pinned = Some(unsafe { ctx.alloc_pinned::<u8>(MIB as usize) }.expect("pinned"));
    });
    let host_d = x.host_after.live - x.host_before.live;
    c.check(
        "pinned host 1 MiB: +1 MiB on the host, device unchanged",
        host_d == MIB && x.after.live == x.before.live,
        json!({"host_delta": host_d, "device_delta": x.after.live as i64 - x.before.live as i64}),
    );

    // 7. gpumem-nb's own blocks: a 64 MiB buffer is a 64 MiB segment, counted as the allocator's.
    let mut buf = None;
    let x = cell(&mut ch, 8, uuid, || {
        buf =
            Some(gpumem_nb::DeviceBuffer::<u8>::zeros(&alloc, 64 << 20, gpumem_nb::StreamId::DEFAULT).expect("buffer"))
    });
    let a_d = source_live(&x.after, "allocator") - source_live(&x.before, "allocator");
    c.check(
        "gpumem-nb allocator 64 MiB: counted under its own source",
        a_d == 64 * MIB && source_live(&x.after, "driver") == source_live(&x.before, "driver"),
        json!({"allocator_delta": a_d, "reserved": alloc.memory_reserved(), "nvml_delta": nvml_delta(&x)}),
    );

    // Everything back: what the process holds returns to the start.
    drop((pool_buf, raw, keep_blas, pinned, buf));
    alloc.empty_cache().expect("empty_cache");
    stream.synchronize().expect("sync");
    c.check(
        "the books recount",
        tracking::check().is_ok(),
        json!({"check": tracking::check().err().map(|e| e.to_string())}),
    );
    println!("{}", json!({"status": if c.failed == 0 { "pass" } else { "FAIL" }, "failed": c.failed}));
    std::process::exit(if c.failed == 0 { 0 } else { 1 });
}
