//! ipyexperiments' GPU helpers (`utils/mem.py`), with every number saying what it covers.
//!
//! | helper | ipyexperiments | here |
//! | --- | --- | --- |
//! | [`free`], [`total`] | `gpu_mem_get_free_mbs`, `gpu_mem_get_total_mbs` (NVML, whole device, MiB truncated) | bytes, whole device (`cuMemGetInfo`, or the simulated capacity) |
//! | [`used`] | `gpu_mem_get_used_mbs` (NVML, whole device) | this process (NVML, matched by UUID) where NVML can tell, else the whole device — the reading says which |
//! | [`free_after_flush`], [`used_after_flush`] | `…_no_cache_mbs` (gc + `empty_cache` first) | `empty_cache` first |
//! | [`allocate_mib`], [`allocate_mib_fatal`] | `gpu_mem_allocate_mbs(n, fatal)` | `Option<DeviceBuffer<u8>>` / `Result` |
//! | [`leave_free_mib`] | `gpu_mem_leave_free_mbs(n)` | a [`Filler`] that holds the rest; an impossible request is an error value |
//! | [`preload`] | `preload_pytorch()` | also measures the CUDA context's own memory |
//! | [`mem_info`] | `gpu_mem_get_mbs` → `GPUMemory(total, free, used)` | [`MemInfo`]: device, this process, allocator, and the gaps between them |
//! | [`cap_cuda_pool`] | (`torch.cuda.set_per_process_memory_fraction` caps PyTorch's allocator) | caps the CUDA pool candle and cudarc allocate from |
//!
//! What a number covers ([`Coverage`]):
//! - **whole device**: every process on the GPU plus the driver (`cuMemGetInfo`; on the
//!   simulated device, its capacity minus what this allocator reserved);
//! - **this process**: NVML's per-process number (context, allocator, every library);
//! - **allocator**: this crate's caching allocator only (`memory_allocated` / `memory_reserved`).
//!
//! Every helper has an `*_on(&Arc<Allocator>, …)` form; the short forms use [`crate::current`].
#![forbid(unsafe_code)]

use crate::allocator::Allocator;
use crate::buffer::DeviceBuffer;
use crate::device::nvml;
use crate::device::{BackendKind, StreamId};
use crate::error::{AllocError, Error, Result};
use crate::render::{MimeBundle, Table};
use crate::units::{MIB, iec};
use std::fmt;
use std::sync::Arc;

// The filler's chunk sizes follow the policy: the driver's 2 MiB granularity, segments of their
// own size from `MIN_LARGE_ALLOC` (PyTorch's `kMinLargeAlloc`) up, small-pool blocks up to
// `SMALL_SIZE` (`kSmallSize`).
use crate::device::sim::GRANULARITY;
use crate::policy::constants::{MIN_LARGE_ALLOC, SMALL_SIZE};

mod pool;
pub use pool::{PoolCap, cap_cuda_pool, cap_cuda_pool_on};

/// What a number covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Coverage {
    /// Every process on the device, and the driver.
    WholeDevice,
    /// This process only (NVML).
    ThisProcess,
    /// This crate's caching allocator only.
    Allocator,
}

impl Coverage {
    /// "whole device", "this process", "allocator".
    pub fn label(self) -> &'static str {
        match self {
            Coverage::WholeDevice => "whole device",
            Coverage::ThisProcess => "this process",
            Coverage::Allocator => "allocator",
        }
    }
}

/// Which quantity a [`MemReading`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Quantity {
    /// Free memory.
    Free,
    /// Memory in use.
    Used,
    /// Memory installed.
    Total,
}

impl Quantity {
    /// "free", "used", "total".
    pub fn label(self) -> &'static str {
        match self {
            Quantity::Free => "free",
            Quantity::Used => "used",
            Quantity::Total => "total",
        }
    }
}

/// One number with what it covers and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemReading {
    /// Free, used or total.
    pub quantity: Quantity,
    /// Bytes.
    pub bytes: u64,
    /// What the number covers.
    pub covers: Coverage,
    /// Device index.
    pub device: i32,
    /// The device's backend.
    pub backend: BackendKind,
    /// Where it came from: "cuMemGetInfo", "simulated capacity", "NVML, GPU-…".
    pub source: String,
    /// Whether the allocator's cache was emptied first.
    pub after_flush: bool,
    /// Why a narrower number was not available (e.g. `used` fell back to the whole device).
    pub note: Option<String>,
}

impl MemReading {
    /// The number in MiB (ipyexperiments' unit, truncated as it does).
    pub fn mib(&self) -> u64 {
        self.bytes / MIB
    }

    fn table(&self) -> Table {
        let mut t = Table::new(["", "bytes", "covers", "source"]).right_align([1]);
        t.row([
            self.quantity.label().to_string(),
            iec(self.bytes),
            self.covers.label().to_string(),
            self.source.clone(),
        ]);
        let mut caption = format!("device {}, {}", self.device, self.backend.name());
        if self.after_flush {
            caption.push_str(", after empty_cache");
        }
        if let Some(n) = &self.note {
            caption.push_str("; ");
            caption.push_str(n);
        }
        t.caption(caption)
    }

    /// Text and HTML.
    pub fn bundle(&self) -> MimeBundle {
        MimeBundle::text(self.to_string()).with_html(self.table().to_html())
    }
}

impl fmt::Display for MemReading {
    /// `free 924.00 MiB — whole device (device 0, simulated; simulated capacity)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} — {} (device {}, {}; {}{})",
            self.quantity.label(),
            iec(self.bytes),
            self.covers.label(),
            self.device,
            self.backend.name(),
            self.source,
            if self.after_flush { "; after empty_cache" } else { "" }
        )?;
        if let Some(n) = &self.note {
            write!(f, "; {n}")?;
        }
        Ok(())
    }
}

/// Every memory number of one device at once, each with what it covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// Device index.
    pub device: i32,
    /// The device's backend.
    pub backend: BackendKind,
    /// Whole device: free bytes.
    pub free: u64,
    /// Whole device: installed bytes.
    pub total: u64,
    /// Whole device: `total − free` (every process and the driver).
    pub used_device: u64,
    /// This process (NVML), when NVML can tell.
    pub used_process: Option<u64>,
    /// Allocator: bytes in allocated blocks (`memory_allocated()`).
    pub allocated: u64,
    /// Allocator: bytes reserved from the device (`memory_reserved()`).
    pub reserved: u64,
    /// Where `free` / `total` came from ("cuMemGetInfo", "simulated capacity").
    pub source: String,
    /// Where `used_process` came from ("NVML, GPU-…"), or why it is `None`.
    pub process_source: String,
    /// Whether the allocator's cache was emptied first.
    pub after_flush: bool,
}

impl MemInfo {
    /// This process's memory outside the allocator (CUDA context, cuBLAS/cuDNN workspaces,
    /// other libraries): `used_process − reserved`.
    pub fn outside_allocator(&self) -> Option<u64> {
        self.used_process.map(|p| p.saturating_sub(self.reserved))
    }

    /// The rest of the device: other processes and the driver (`used_device − used_process`).
    pub fn rest_of_device(&self) -> Option<u64> {
        self.used_process.map(|p| self.used_device.saturating_sub(p))
    }

    /// The used-memory reading: this process where NVML can tell, the whole device otherwise.
    pub fn used_reading(&self) -> MemReading {
        let base = |covers, bytes, source: String, note| MemReading {
            quantity: Quantity::Used,
            bytes,
            covers,
            device: self.device,
            backend: self.backend,
            source,
            after_flush: self.after_flush,
            note,
        };
        match self.used_process {
            Some(p) => base(Coverage::ThisProcess, p, self.process_source.clone(), None),
            None => base(
                Coverage::WholeDevice,
                self.used_device,
                self.source.clone(),
                Some(format!("not per process: {}", self.process_source)),
            ),
        }
    }

    fn reading(&self, quantity: Quantity) -> MemReading {
        let bytes = match quantity {
            Quantity::Free => self.free,
            Quantity::Total => self.total,
            Quantity::Used => return self.used_reading(),
        };
        MemReading {
            quantity,
            bytes,
            covers: Coverage::WholeDevice,
            device: self.device,
            backend: self.backend,
            source: self.source.clone(),
            after_flush: self.after_flush,
            note: None,
        }
    }

    fn table(&self) -> Table {
        let mut t = Table::new(["memory", "bytes", "covers"]).right_align([1]);
        let na = |v: Option<u64>| v.map_or_else(|| "n/a".to_string(), iec);
        let dev = format!("whole device ({})", self.source);
        t.row(["total".to_string(), iec(self.total), dev.clone()]);
        t.row(["free".to_string(), iec(self.free), dev.clone()]);
        t.row(["used".to_string(), iec(self.used_device), dev]);
        t.row([
            "used by this process".to_string(),
            na(self.used_process),
            format!("this process ({})", self.process_source),
        ]);
        t.row(["reserved".to_string(), iec(self.reserved), "allocator".to_string()]);
        t.row(["allocated".to_string(), iec(self.allocated), "allocator".to_string()]);
        t.row([
            "this process outside the allocator".to_string(),
            na(self.outside_allocator()),
            "this process − allocator reserved (context, libraries)".to_string(),
        ]);
        t.row([
            "other processes and driver".to_string(),
            na(self.rest_of_device()),
            "whole device − this process".to_string(),
        ]);
        t.caption(format!(
            "device {}, {}{}",
            self.device,
            self.backend.name(),
            if self.after_flush { ", after empty_cache" } else { "" }
        ))
    }

    /// Text and HTML tables.
    pub fn bundle(&self) -> MimeBundle {
        self.table().bundle()
    }
}

impl fmt::Display for MemInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.table().to_text())
    }
}

/// Where whole-device numbers come from on this backend.
fn device_source(backend: BackendKind) -> &'static str {
    match backend {
        BackendKind::Cuda => "cuMemGetInfo",
        BackendKind::Simulated => "simulated capacity",
        BackendKind::Replay => "replay device",
    }
}

/// The allocator's CUDA device UUID, or why there is none.
fn cuda_uuid(alloc: &Arc<Allocator>) -> std::result::Result<[u8; 16], String> {
    #[cfg(feature = "cuda")]
    match alloc.with_state(|_, b| b.as_cuda().map(|c| c.uuid())) {
        Some(Ok(u)) => return Ok(u),
        Some(Err(e)) => return Err(format!("the CUDA device's UUID is unknown ({e})")),
        None => {}
    }
    Err(format!("no NVML on the {} device", alloc.backend_kind().name()))
}

/// This process's bytes on the allocator's device (NVML) and their source, or why unknown.
fn process_used(alloc: &Arc<Allocator>) -> std::result::Result<(u64, String), String> {
    let uuid = cuda_uuid(alloc)?;
    let name = nvml::uuid_string("GPU", uuid);
    match nvml::this_process(uuid).map_err(|e| e.to_string())? {
        nvml::ThisProcess::Used(b) => Ok((b, format!("NVML, {name}"))),
        nvml::ThisProcess::Unavailable => {
            Err(format!("NVML gives no per-process number on {name} (MIG instance or WDDM driver)"))
        }
        nvml::ThisProcess::NotListed => Err(format!(
            "NVML does not list this process (pid {}) on {name} (PIDs of a container namespace?)",
            std::process::id()
        )),
    }
}

/// Every memory number of `alloc`'s device.
pub fn mem_info_on(alloc: &Arc<Allocator>) -> Result<MemInfo> {
    read(alloc, false)
}

/// [`mem_info_on`] for the current device.
pub fn mem_info() -> Result<MemInfo> {
    mem_info_on(&crate::notebook::session::current()?)
}

fn read(alloc: &Arc<Allocator>, flush: bool) -> Result<MemInfo> {
    if flush {
        alloc.empty_cache()?;
    }
    let (free, total) = alloc.mem_get_info()?;
    let (allocated, reserved) = (alloc.memory_allocated(), alloc.memory_reserved());
    let (used_process, process_source) = match process_used(alloc) {
        Ok((b, src)) => (Some(b), src),
        Err(why) => (None, why),
    };
    let backend = alloc.backend_kind();
    Ok(MemInfo {
        device: alloc.device(),
        backend,
        free,
        total,
        used_device: total.saturating_sub(free),
        used_process,
        allocated,
        reserved,
        source: device_source(backend).to_string(),
        process_source,
        after_flush: flush,
    })
}

/// Free bytes of the whole device.
pub fn free_on(alloc: &Arc<Allocator>) -> Result<MemReading> {
    Ok(read(alloc, false)?.reading(Quantity::Free))
}

/// [`free_on`] for the current device.
pub fn free() -> Result<MemReading> {
    free_on(&crate::notebook::session::current()?)
}

/// Free bytes of the whole device after `empty_cache()` (the allocator's cached blocks go back
/// to the device first).
pub fn free_after_flush_on(alloc: &Arc<Allocator>) -> Result<MemReading> {
    Ok(read(alloc, true)?.reading(Quantity::Free))
}

/// [`free_after_flush_on`] for the current device.
pub fn free_after_flush() -> Result<MemReading> {
    free_after_flush_on(&crate::notebook::session::current()?)
}

/// Installed bytes of the device.
pub fn total_on(alloc: &Arc<Allocator>) -> Result<MemReading> {
    Ok(read(alloc, false)?.reading(Quantity::Total))
}

/// [`total_on`] for the current device.
pub fn total() -> Result<MemReading> {
    total_on(&crate::notebook::session::current()?)
}

/// Used bytes: this process's (NVML) where NVML can tell, else the whole device's
/// (`total − free`, with a note saying why). [`MemReading::covers`] says which.
pub fn used_on(alloc: &Arc<Allocator>) -> Result<MemReading> {
    Ok(read(alloc, false)?.used_reading())
}

/// [`used_on`] for the current device.
pub fn used() -> Result<MemReading> {
    used_on(&crate::notebook::session::current()?)
}

/// [`used_on`] after `empty_cache()`.
pub fn used_after_flush_on(alloc: &Arc<Allocator>) -> Result<MemReading> {
    Ok(read(alloc, true)?.used_reading())
}

/// [`used_after_flush_on`] for the current device.
pub fn used_after_flush() -> Result<MemReading> {
    used_after_flush_on(&crate::notebook::session::current()?)
}

/// `n` MiB on the device's default stream, or the reason it failed (out of memory is
/// [`AllocError::OutOfMemory`] with PyTorch's message). The contents are unspecified.
pub fn allocate_mib_fatal_on(alloc: &Arc<Allocator>, n: u64) -> Result<DeviceBuffer<u8>> {
    let bytes = n
        .checked_mul(MIB)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| Error::InvalidArgument(format!("allocate_mib({n}): {n} MiB does not fit in memory sizes")))?;
    DeviceBuffer::alloc(alloc, bytes, StreamId::DEFAULT)
}

/// [`allocate_mib_fatal_on`] for the current device.
pub fn allocate_mib_fatal(n: u64) -> Result<DeviceBuffer<u8>> {
    allocate_mib_fatal_on(&crate::notebook::session::current()?, n)
}

/// `n` MiB on the device's default stream, or `None` when it cannot be had (ipyexperiments'
/// `gpu_mem_allocate_mbs(n, fatal=False)`).
pub fn allocate_mib_on(alloc: &Arc<Allocator>, n: u64) -> Option<DeviceBuffer<u8>> {
    allocate_mib_fatal_on(alloc, n).ok()
}

/// [`allocate_mib_on`] for the current device (`None` without a device too).
pub fn allocate_mib(n: u64) -> Option<DeviceBuffer<u8>> {
    allocate_mib_on(&crate::notebook::session::current().ok()?, n)
}

/// Device memory straight from the driver, past the caching allocator: what a foreign library
/// (candle, cuBLAS, libtorch) does. On a GPU it is a `cuMemAlloc`; on the simulated device, an
/// allocation of its simulated driver, taking capacity the allocator no longer has. Tracking
/// ([`crate::tracking`]) counts it under "driver"; the allocator's own numbers do not change.
/// Freed on drop.
pub struct DriverBuffer {
    alloc: Arc<Allocator>,
    addr: u64,
    size: u64,
    #[cfg(feature = "cuda")]
    cuda: Option<crate::device::cuda::DriverAllocation>,
}

impl fmt::Debug for DriverBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DriverBuffer {{ device: {}, addr: {:#x}, size: {} }}", self.alloc.device(), self.addr, self.size)
    }
}

impl DriverBuffer {
    /// Device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Device index.
    pub fn device(&self) -> i32 {
        self.alloc.device()
    }
}

impl Drop for DriverBuffer {
    fn drop(&mut self) {
        #[cfg(feature = "cuda")]
        if self.cuda.take().is_some() {
            return;
        }
        let addr = self.addr;
        let _ = self.alloc.with_backend(|b| b.as_sim_mut().map(|s| s.driver_free(addr)));
    }
}

/// `n` MiB straight from `alloc`'s device driver, past the caching allocator ([`DriverBuffer`]).
pub fn driver_alloc_mib_on(alloc: &Arc<Allocator>, n: u64) -> Result<DriverBuffer> {
    let size = n.checked_mul(MIB).filter(|&s| s > 0).ok_or_else(|| {
        Error::InvalidArgument(format!("driver_alloc_mib: {n} MiB is not a size that can be allocated"))
    })?;
    let oom = |e: crate::device::DeviceError| match e {
        crate::device::DeviceError::OutOfMemory => Error::InvalidArgument(format!(
            "driver_alloc_mib: device {} ({}) has no room for {n} MiB (out of memory)",
            alloc.device(),
            alloc.backend_kind().name()
        )),
        e => Error::Device(e),
    };
    #[cfg(feature = "cuda")]
    if let Some(ctx) = alloc.with_backend(|b| b.as_cuda().map(|c| c.context().clone())) {
        let cuda = crate::device::cuda::DriverAllocation::new(&ctx, size).map_err(oom)?;
        return Ok(DriverBuffer { alloc: Arc::clone(alloc), addr: cuda.addr(), size, cuda: Some(cuda) });
    }
    let addr = alloc
        .with_backend(|b| match b.as_sim_mut() {
            Some(s) => s.driver_alloc(size),
            None => Err(crate::device::DeviceError::Driver("no driver to allocate from on this backend".into())),
        })
        .map_err(oom)?;
    Ok(DriverBuffer {
        alloc: Arc::clone(alloc),
        addr,
        size,
        #[cfg(feature = "cuda")]
        cuda: None,
    })
}

/// `n` MiB straight from the current device's driver, past the caching allocator: what a
/// foreign library does, for demos and tests ([`DriverBuffer`], freed on drop).
pub fn driver_alloc_mib(n: u64) -> Result<DriverBuffer> {
    driver_alloc_mib_on(&crate::notebook::session::current()?, n)
}

/// Memory held so that only a chosen amount of the device stays free ([`leave_free_mib`]).
/// Dropping it returns the memory to the allocator's cache (call `empty_cache()` to hand it back
/// to the device).
pub struct Filler {
    buffers: Vec<DeviceBuffer<u8>>,
    /// Device index.
    pub device: i32,
    /// The device's backend.
    pub backend: BackendKind,
    /// The free bytes asked for (whole device).
    pub requested_free: u64,
    /// Free bytes of the whole device before filling (after `empty_cache`).
    pub free_before: u64,
    /// Free bytes of the whole device after filling: `requested_free` rounded up to the device's
    /// 2 MiB granularity at most.
    pub free_after: u64,
    /// Bytes held by the filler's buffers.
    pub filled: u64,
}

impl fmt::Debug for Filler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Filler")
            .field("buffers", &self.buffers.len())
            .field("requested_free", &self.requested_free)
            .field("free_after", &self.free_after)
            .field("filled", &self.filled)
            .finish()
    }
}

impl Filler {
    /// Number of buffers held.
    pub fn buffers(&self) -> usize {
        self.buffers.len()
    }

    /// Lets the memory go (to the allocator's cache), like dropping the filler.
    pub fn release(self) {}

    fn table(&self) -> Table {
        let mut t = Table::new(["", "bytes", "covers"]).right_align([1]);
        t.row(["free before".to_string(), iec(self.free_before), "whole device".to_string()]);
        t.row(["held by the filler".to_string(), iec(self.filled), "allocator".to_string()]);
        t.row(["free now".to_string(), iec(self.free_after), "whole device".to_string()]);
        t.caption(format!(
            "leave_free_mib({}): device {}, {}; {} buffer(s)",
            self.requested_free / MIB,
            self.device,
            self.backend.name(),
            self.buffers.len()
        ))
    }

    /// Text and HTML.
    pub fn bundle(&self) -> MimeBundle {
        MimeBundle::text(self.to_string()).with_html(self.table().to_html())
    }
}

impl fmt::Display for Filler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "holding {} so that {} of device {} ({}) stay free (whole device; {} asked)",
            iec(self.filled),
            iec(self.free_after),
            self.device,
            self.backend.name(),
            iec(self.requested_free)
        )
    }
}

/// Allocates so that only `n` MiB of `alloc`'s device stay free (whole device), for
/// reproducible out-of-memory tests (ipyexperiments' `gpu_mem_leave_free_mbs`).
///
/// Empties the allocator's cache first, then fills with buffers sized so that each takes
/// exactly one segment: one buffer for the bulk, 1 MiB small-pool buffers for the last
/// megabytes. The device hands out memory in 2 MiB pieces and its free bytes need not be a
/// whole number of them, so what stays free is at least `n` MiB and less than `n + 2` MiB,
/// never less than asked (ipyexperiments' recipe, one tensor of whole free MiB minus `n`, can
/// leave up to 2 MiB less: on an H200 it left 2047.125 MiB for 2048 asked; GPU_VALIDATION.md).
/// Asking for more than is free, or a device that refuses to be filled (a memory fraction,
/// another process), is an error value that leaves nothing held.
pub fn leave_free_mib_on(alloc: &Arc<Allocator>, n: u64) -> Result<Filler> {
    let want = n
        .checked_mul(MIB)
        .ok_or_else(|| Error::InvalidArgument(format!("leave_free_mib({n}): {n} MiB is not a memory size")))?;
    let device = alloc.device();
    let backend = alloc.backend_kind();
    alloc.empty_cache()?;
    let (free_before, _) = alloc.mem_get_info()?;
    if want > free_before {
        return Err(Error::InvalidArgument(format!(
            "leave_free_mib({n}): only {} of device {device} ({}) are free (whole device, after empty_cache), \
             so {} cannot be left free",
            iec(free_before),
            backend.name(),
            iec(want)
        )));
    }
    let mut buffers: Vec<DeviceBuffer<u8>> = Vec::new();
    let mut free = free_before;
    let mut cap = u64::MAX;
    let mut failure = None;
    for _ in 0..100_000 {
        if free < want.saturating_add(GRANULARITY) {
            break;
        }
        let excess = free - want;
        let mut chunk = (excess / GRANULARITY * GRANULARITY).min(cap);
        if chunk < MIN_LARGE_ALLOC {
            chunk = SMALL_SIZE;
        }
        match DeviceBuffer::<u8>::alloc(alloc, chunk as usize, StreamId::DEFAULT) {
            Ok(b) => buffers.push(b),
            Err(Error::Alloc(AllocError::OutOfMemory(_))) if chunk > SMALL_SIZE => {
                // The device (or the allocator's limit) has less than it says: try smaller.
                cap = (chunk / 2 / GRANULARITY * GRANULARITY).max(MIN_LARGE_ALLOC);
                if cap == chunk {
                    cap = SMALL_SIZE;
                }
                continue;
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
        let now = alloc.mem_get_info()?.0;
        if now < want {
            // Overshot (another process, or a driver that rounds differently): give the last
            // buffer back to the device and stop.
            if let Some(b) = buffers.pop() {
                drop(b);
                alloc.empty_cache()?;
            }
            free = alloc.mem_get_info()?.0;
            break;
        }
        free = now;
    }
    let filled: u64 = buffers.iter().map(|b| b.num_bytes() as u64).sum();
    if free < want || free >= want.saturating_add(GRANULARITY) {
        drop(buffers);
        alloc.empty_cache()?;
        let why = failure.map_or_else(String::new, |e| format!(": {e}"));
        return Err(Error::InvalidArgument(format!(
            "leave_free_mib({n}): device {device} ({}) could not be filled to leave {} free; it stopped with {} free \
             after holding {}{why}",
            backend.name(),
            iec(want),
            iec(free),
            iec(filled)
        )));
    }
    Ok(Filler { buffers, device, backend, requested_free: want, free_before, free_after: free, filled })
}

/// [`leave_free_mib_on`] for the current device.
pub fn leave_free_mib(n: u64) -> Result<Filler> {
    leave_free_mib_on(&crate::notebook::session::current()?, n)
}

/// What [`preload`] did and measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreloadReport {
    /// Device index.
    pub device: i32,
    /// The device's backend.
    pub backend: BackendKind,
    /// Whether the device (its CUDA context) was already open before this call.
    pub already_loaded: bool,
    /// Whole device: used bytes before the context was created (NVML), when measured.
    pub device_used_before: Option<u64>,
    /// Whole device: used bytes right after the context was created (NVML), when measured.
    pub device_used_after: Option<u64>,
    /// This process: device bytes (NVML), measured before the warm-up allocation.
    pub process_used: Option<u64>,
    /// This process outside the allocator (`process_used − allocator reserved`): the CUDA
    /// context and any library workspaces. 0 on the simulated device (no context).
    pub context_overhead: Option<u64>,
    /// Allocator: reserved bytes after the warm-up allocation (cached for later use).
    pub allocator_reserved: u64,
    /// How the numbers were obtained, or why some are missing.
    pub note: String,
}

impl PreloadReport {
    /// Whole device: what creating the context took (`device_used_after − device_used_before`).
    pub fn device_delta(&self) -> Option<i64> {
        Some(self.device_used_after? as i64 - self.device_used_before? as i64)
    }

    fn table(&self) -> Table {
        let na = |v: Option<u64>| v.map_or_else(|| "n/a".to_string(), iec);
        let mut t = Table::new(["", "bytes", "covers"]).right_align([1]);
        t.row([
            "context creation".to_string(),
            self.device_delta().map_or_else(|| "n/a".to_string(), crate::units::iec_delta),
            "whole device (NVML, before vs after)".to_string(),
        ]);
        t.row(["used by this process".to_string(), na(self.process_used), "this process (NVML)".to_string()]);
        t.row([
            "context and libraries".to_string(),
            na(self.context_overhead),
            "this process − allocator reserved".to_string(),
        ]);
        t.row(["warm cache".to_string(), iec(self.allocator_reserved), "allocator".to_string()]);
        t.caption(format!(
            "preload: device {}, {}{}; {}",
            self.device,
            self.backend.name(),
            if self.already_loaded { " (already loaded)" } else { "" },
            self.note
        ))
    }

    /// Text and HTML.
    pub fn bundle(&self) -> MimeBundle {
        MimeBundle::text(self.to_string()).with_html(self.table().to_html())
    }
}

impl fmt::Display for PreloadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "preloaded device {} ({})", self.device, self.backend.name())?;
        if self.already_loaded {
            f.write_str(", already loaded")?;
        }
        match self.context_overhead {
            Some(o) => write!(f, "; context and libraries: {} (this process, outside the allocator)", iec(o))?,
            None => f.write_str("; context overhead: n/a")?,
        }
        if let Some(d) = self.device_delta() {
            write!(f, "; context creation took {} (whole device)", crate::units::iec_delta(d))?;
        }
        write!(f, "; warm cache {} (allocator); {}", iec(self.allocator_reserved), self.note)
    }
}

/// NVML's whole-device used bytes before the context exists, when this process has none yet.
struct Before {
    uuid: Option<[u8; 16]>,
    device_used: Option<u64>,
    loaded: Option<bool>,
}

#[cfg(feature = "cuda")]
fn before_context() -> Before {
    let none = Before { uuid: None, device_used: None, loaded: None };
    // Only when CUDA is what the registry will open: never touch the driver for `sim`.
    if matches!(
        crate::notebook::registry::selection(),
        Ok(crate::notebook::registry::DeviceSelection::Sim(..)) | Err(_)
    ) {
        return none;
    }
    let Ok(uuid) = crate::device::cuda::device_uuid(0) else { return none };
    match nvml::this_process(uuid) {
        Ok(nvml::ThisProcess::NotListed) => Before {
            uuid: Some(uuid),
            device_used: nvml::device_memory(uuid).ok().map(|m| m.used),
            loaded: Some(false),
        },
        Ok(_) => Before { uuid: Some(uuid), device_used: None, loaded: Some(true) },
        Err(_) => Before { uuid: Some(uuid), device_used: None, loaded: None },
    }
}

#[cfg(not(feature = "cuda"))]
fn before_context() -> Before {
    Before { uuid: None, device_used: None, loaded: None }
}

/// Opens the current device (creating its CUDA context), warms the allocator with a small
/// allocation (one 2 MiB segment stays cached), and measures what the context itself takes, so
/// later deltas are clean: NVML's whole-device use before and after the context is created
/// (when this call creates it), and this process's memory outside the allocator. Calling it
/// again is harmless (it reports `already_loaded`).
pub fn preload() -> Result<PreloadReport> {
    let opened = crate::notebook::registry::resolved().is_some();
    let before = if opened { Before { uuid: None, device_used: None, loaded: Some(true) } } else { before_context() };
    let alloc = crate::notebook::session::current()?;
    let after = match (before.uuid, before.device_used) {
        (Some(u), Some(_)) => nvml::device_memory(u).ok().map(|m| m.used),
        _ => None,
    };
    let mut r = preload_on(&alloc)?;
    r.already_loaded = before.loaded.unwrap_or(opened);
    if let (Some(b), Some(a)) = (before.device_used, after) {
        r.device_used_before = Some(b);
        r.device_used_after = Some(a);
    }
    Ok(r)
}

/// [`preload`] on an allocator that is already open (its context exists, so only this
/// process's memory outside the allocator is measured, not the before/after delta).
pub fn preload_on(alloc: &Arc<Allocator>) -> Result<PreloadReport> {
    let backend = alloc.backend_kind();
    let (process_used, context_overhead, note) = match backend {
        BackendKind::Cuda => match process_used(alloc) {
            Ok((p, src)) => {
                let reserved = alloc.memory_reserved();
                (Some(p), Some(p.saturating_sub(reserved)), format!("measured with {src}"))
            }
            Err(why) => (None, None, format!("context overhead not measurable: {why}")),
        },
        _ => (None, Some(0), format!("the {} device has no CUDA context", backend.name())),
    };
    // Warm-up: one small block; its segment stays in the cache for later allocations.
    drop(DeviceBuffer::<u8>::alloc(alloc, 1, StreamId::DEFAULT)?);
    Ok(PreloadReport {
        device: alloc.device(),
        backend,
        already_loaded: true,
        device_used_before: None,
        device_used_after: None,
        process_used,
        context_overhead,
        allocator_reserved: alloc.memory_reserved(),
        note,
    })
}

crate::render::evcxr_display!(MemReading, MemInfo, Filler, PreloadReport);
