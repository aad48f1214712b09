//! The CUDA backend: cudarc's driver API on a real GPU (feature `cuda`).
//!
//! This file is the only place in the crate with `unsafe` code. Every block names the invariant
//! it relies on in a `// SAFETY:` comment.
//!
//! # Probing, never panicking
//! cudarc loads `libcuda` lazily and *panics* when it is absent, on the first call into the
//! driver. So [`probe`] asks [`cudarc::driver::sys::is_culib_present`] first (cached in a
//! `OnceLock`), and only then calls `cuInit` and `cuDeviceGetCount`. Every failure is a value:
//! `Err(String)` from [`probe`], [`crate::Error::NoCuda`] from [`CudaBackend::new`]. Driver
//! errors are named from their `CUresult` variant (`CUDA_ERROR_NO_DEVICE`), never through
//! `DriverError`'s `Debug`/`Display`, which call back into the driver library.
//!
//! # Streams and events
//! A [`StreamId`] is the raw `CUstream` handle value: 0 is the legacy default stream, 2 the
//! per-thread default stream, anything else a stream this backend created ([`Backend::new_stream`])
//! or adopted ([`CudaBackend::adopt_stream`]) and keeps alive. An unknown stream handle is an
//! error value, never passed to the driver. Events come from a small pool of `CUevent`s
//! (created with `CU_EVENT_DISABLE_TIMING`); an [`EventId`] is the raw event handle, and a
//! completed event goes back to the pool.
//!
//! # Driver entry points
//!
//! | entry point | reached through | used by |
//! | --- | --- | --- |
//! | `dlopen("libcuda.so…")` | `sys::is_culib_present` | [`probe`] (cached) |
//! | `cuInit` | `result::init` | [`probe`] |
//! | `cuDeviceGetCount` | `result::device::get_count` | [`probe`] |
//! | `cuDeviceGet`, `cuDevicePrimaryCtxRetain`, `cuCtxSetCurrent` | `CudaContext::new` | [`CudaBackend::new`] |
//! | `cuDeviceTotalMem_v2` | `CudaContext::total_mem` | [`CudaBackend::new`] (cached) |
//! | `cuCtxGetCurrent`, `cuCtxSetCurrent` | `CudaContext::bind_to_thread` | before every raw call |
//! | `cuMemGetInfo_v2` | `CudaContext::mem_get_info` | `mem_get_info` |
//! | `cuMemAlloc_v2` | `result::malloc_sync` | `reserve` |
//! | `cuMemFree_v2` | `result::free_sync` | `release`, drop |
//! | `cuMemAddressReserve` | `sys` | `reserve_address_range` |
//! | `cuMemAddressFree` | `sys` | `release_address_range`, drop |
//! | `cuMemCreate` | `sys` | `map_pages` |
//! | `cuMemMap` | `sys` | `map_pages` |
//! | `cuMemSetAccess` | `sys` | `map_pages` |
//! | `cuMemUnmap` | `sys` | `unmap_pages`, `map_pages` rollback, drop |
//! | `cuMemRelease` | `sys` | `unmap_pages`, `map_pages` rollback, drop |
//! | `cuStreamCreate` | `CudaContext::new_stream` | `new_stream` |
//! | `cuStreamSynchronize` | `CudaStream::synchronize` | `unmap_pages`, buffer copies |
//! | `cuCtxSynchronize` | `CudaContext::synchronize` | `unmap_pages` (unknown stream), drop |
//! | `cuEventCreate` | `CudaContext::new_event` | `record_event` (pool empty) |
//! | `cuEventRecord` | `CudaEvent::record` | `record_event` |
//! | `cuEventQuery` | `CudaEvent::try_is_complete` | `query_event` |
//! | `cuEventSynchronize` | `CudaEvent::synchronize` | `synchronize_event` |
//! | `cuEventDestroy_v2` | `CudaEvent`'s drop | pool overflow, drop |
//! | `cuMemcpyHtoDAsync_v2` | `result::memcpy_htod_async`, `sys` | [`crate::DeviceBuffer`] uploads; [`PinnedHostMemory::copy_to_device_async`] |
//! | `cuMemcpyDtoHAsync_v2` | `result::memcpy_dtoh_async`, `sys` | [`crate::DeviceBuffer`] downloads; [`PinnedHostMemory::copy_from_device_async`] |
//! | `cuMemsetD8Async` | `result::memset_d8_async` | [`crate::DeviceBuffer::zeros`] |
//! | `cuDeviceGet`, `cuDeviceGetUuid_v2` | `result::device::{get, get_uuid}` | [`device_uuid`], [`CudaBackend::uuid`] (NVML matching) |
//! | `cuMemHostAlloc` (flags `PORTABLE`, never `WRITECOMBINED`) | `result::malloc_host` | [`PinnedHostMemory::alloc`] |
//! | `cuMemFreeHost` | `result::free_host` | [`PinnedHostMemory`]'s drop |
//! | `cuEventCreate`, `cuEventRecord` | `CudaStream::record_event` | after each [`PinnedHostMemory`] copy |
//! | `cuEventQuery` | `CudaEvent::try_is_complete` | [`PinnedHostMemory::is_idle`] |
//! | `cuEventSynchronize` | `CudaEvent::synchronize` | [`PinnedHostMemory`] slices, drop |
//! | `cuStreamSynchronize` | `CudaStream::synchronize` | [`PinnedHostMemory`] copies when an event cannot be recorded |
//! | NVML `nvmlDeviceGetComputeRunningProcesses_v3` | [`super::nvml`] | `process_memory` (OOM messages) |
//! | `cuDeviceGetMemPool` | `result::device::get_mem_pool` | `pool_usage`, `reset_pool_high_water` |
//! | `cuMemPoolGetAttribute` | `result::mem_pool::get_attribute` | `pool_usage` |
//! | `cuMemPoolSetAttribute` | `result::mem_pool::set_attribute` | `reset_pool_high_water` |
//! | `cuLaunchHostFunc` | `result::stream::launch_host_function` | [`CudaBackend::sleep_on_stream`] (a busy stream, for probes and tests) |
//!
//! # Pinned host memory
//! [`PinnedHostMemory`] is one page-locked host allocation (`cuMemHostAlloc` with
//! `CU_MEMHOSTALLOC_PORTABLE`: usable from every context; not write-combined, whose uncached
//! host reads are very slow). It is zeroed once when allocated, so every byte is initialised and
//! any [`Element`] may be read from it. Its asynchronous copies record an event after each copy;
//! a shared slice first waits for the copies that write into it, a mutable slice and the drop
//! wait for every copy, so the device never writes memory that Rust code is reading and the
//! memory is never freed under a copy. The caching policy around it (size classes, reuse after
//! stream work completes, statistics) is [`crate::pinned`]'s.
//!
//! # cudarc interop
//! [`CudaView`] and [`CudaViewMut`] borrow a [`crate::DeviceBuffer`] and implement cudarc's
//! [`DeviceSlice`], [`DevicePtr`], [`DevicePtrMut`] and [`PushKernelArg`], so
//! `stream.memcpy_htod(&host, &mut view)`, `stream.clone_dtoh(&view)`,
//! `launch_builder().arg(&view)` and cuBLAS `gemm` take allocator memory directly. They return
//! `SyncOnDrop::Sync(None)`: stream safety is the allocator's own (`record_stream`), as in
//! PyTorch.

use super::{Backend, BackendKind, DeviceError, EventId, ProcessMemory, StreamId};
use crate::buffer::Element;
use crate::error::Error;
use cudarc::driver::sys::{self, CUdeviceptr, CUmemGenericAllocationHandle};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, DriverError, LaunchArgs, PushKernelArg,
    SyncOnDrop, result,
};
use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// The legacy default stream handle (`NULL`).
const LEGACY_STREAM: StreamId = StreamId(0);
/// `CU_STREAM_PER_THREAD`: the per-thread default stream handle.
const PER_THREAD_STREAM: StreamId = StreamId(2);
/// At most this many idle events are kept for reuse; more are destroyed.
const EVENT_POOL_LIMIT: usize = 64;

/// Whether the CUDA driver library can be loaded (cached: cudarc's check dlopens every time).
pub fn library_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries `libloading::Library::new` on the driver library's
    // names and closes it again; loading libcuda runs its initialisers, which the NVIDIA driver
    // library supports (cudarc itself loads it the same way on first use). No cudarc symbol is
    // resolved, so nothing can panic.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Probes the CUDA driver: `Ok(number of devices)` (at least 1), or why there is no usable GPU.
///
/// Never panics: without a driver library nothing of cudarc's driver module is touched. The
/// answer is cached for the process.
pub fn probe() -> Result<usize, String> {
    static PROBE: OnceLock<Result<usize, String>> = OnceLock::new();
    PROBE.get_or_init(probe_uncached).clone()
}

fn probe_uncached() -> Result<usize, String> {
    if !library_present() {
        return Err("the CUDA driver library (libcuda.so) could not be loaded: no NVIDIA driver is installed, \
                    or it is not on the library search path"
            .into());
    }
    result::init().map_err(|e| init_failure(e, "cuInit"))?;
    let count = result::device::get_count().map_err(|e| init_failure(e, "cuDeviceGetCount"))?;
    match usize::try_from(count) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("the CUDA driver reports no devices (check CUDA_VISIBLE_DEVICES)".into()),
    }
}

/// The 16-byte UUID of CUDA device `ordinal` (`cuDeviceGetUuid`), without creating a context:
/// what NVML devices are matched by ([`super::nvml`]). `Err` (why) when there is no usable driver
/// or no such device; never panics.
pub fn device_uuid(ordinal: usize) -> Result<[u8; 16], String> {
    let count = probe()?;
    if ordinal >= count {
        return Err(format!("CUDA device {ordinal} requested, but {count} device(s) are visible"));
    }
    let ord = i32::try_from(ordinal).map_err(|_| format!("CUDA device {ordinal}"))?;
    let dev = result::device::get(ord).map_err(|e| format!("cuDeviceGet({ordinal}) failed ({})", code_name(e)))?;
    let uuid = result::device::get_uuid(dev).map_err(|e| format!("cuDeviceGetUuid failed ({})", code_name(e)))?;
    Ok(uuid_bytes(&uuid))
}

fn uuid_bytes(u: &sys::CUuuid) -> [u8; 16] {
    u.bytes.map(|b| b as u8)
}

/// The `CUresult` variant name (`CUDA_ERROR_OUT_OF_MEMORY`), without calling into the driver.
fn code_name(e: DriverError) -> String {
    format!("{:?}", e.0)
}

/// A clear sentence for a failure of `cuInit` / `cuDeviceGetCount`.
fn init_failure(e: DriverError, call: &str) -> String {
    use sys::CUresult as R;
    let why = match e.0 {
        R::CUDA_ERROR_NO_DEVICE => "no CUDA-capable device is visible (check CUDA_VISIBLE_DEVICES)",
        R::CUDA_ERROR_STUB_LIBRARY => {
            "the libcuda found is the CUDA toolkit's stub library, not a driver: no NVIDIA driver is installed here"
        }
        R::CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER => "the installed NVIDIA driver is too old for this CUDA version",
        R::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH => "the NVIDIA kernel module and the user-space driver do not match",
        R::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => {
            "the CUDA forward-compatibility driver does not support this GPU"
        }
        R::CUDA_ERROR_DEVICE_UNAVAILABLE => "the CUDA device is busy or unavailable (exclusive compute mode?)",
        R::CUDA_ERROR_OPERATING_SYSTEM => "the operating system refused the CUDA driver",
        _ => "the CUDA driver failed to initialise",
    };
    format!("{why} ({call}: {})", code_name(e))
}

/// Any driver failure as [`DeviceError::Driver`], naming the call.
fn driver(call: &str, e: DriverError) -> DeviceError {
    DeviceError::Driver(format!("{} in {call}", code_name(e)))
}

/// Like [`driver`], but `CUDA_ERROR_OUT_OF_MEMORY` becomes [`DeviceError::OutOfMemory`] (the
/// policy then frees cached blocks and retries). The driver API keeps no sticky "last error" for
/// an out-of-memory result (unlike the runtime's `cudaGetLastError`), so there is nothing to
/// clear.
fn oom_or_driver(call: &str, e: DriverError) -> DeviceError {
    if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY { DeviceError::OutOfMemory } else { driver(call, e) }
}

fn to_usize(v: u64) -> Result<usize, DeviceError> {
    usize::try_from(v).map_err(|_| DeviceError::Driver(format!("CUDA_ERROR_INVALID_VALUE: {v} bytes")))
}

fn stream_id(s: &CudaStream) -> StreamId {
    StreamId(s.cu_stream() as usize as u64)
}

/// The host function queued by [`CudaBackend::sleep_on_stream`]: sleeps for `micros`
/// microseconds (carried in the pointer's bits; never dereferenced). Calls no CUDA API.
extern "C" fn sleep_host_fn(micros: *mut std::ffi::c_void) {
    std::thread::sleep(std::time::Duration::from_micros(micros.addr() as u64));
}

/// `CUmemAllocationProp` for pinned device memory on `ordinal` (built per call: the struct holds a
/// raw pointer, which would make the backend `!Send`).
fn allocation_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: device_location(ordinal),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// `CUmemLocation { type_, id }` (the cuda-13000 layout; from cuda-13020 on `id` is a union).
fn device_location(ordinal: i32) -> sys::CUmemLocation {
    sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: ordinal }
}

/// A real GPU through cudarc's driver API.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    ordinal: i32,
    total: u64,
    default_stream: Arc<CudaStream>,
    per_thread_stream: Arc<CudaStream>,
    /// Streams created or adopted here, kept alive while the backend lives.
    streams: HashMap<StreamId, Arc<CudaStream>>,
    /// Live `cuMemAlloc` segments: address → size.
    segments: HashMap<u64, u64>,
    /// Live VMM address reservations: address → size.
    ranges: BTreeMap<u64, u64>,
    /// Mapped pages: page address → (physical handle, page size).
    pages: HashMap<u64, (CUmemGenericAllocationHandle, u64)>,
    /// Recorded, not yet completed events, by raw handle.
    events: HashMap<u64, CudaEvent>,
    /// Idle events for reuse.
    event_pool: Vec<CudaEvent>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("ordinal", &self.ordinal)
            .field("total", &self.total)
            .field("segments", &self.segments.len())
            .field("mapped_pages", &self.pages.len())
            .field("streams", &self.streams.len())
            .finish()
    }
}

impl CudaBackend {
    /// Opens CUDA device `ordinal` (its primary context, the one the CUDA runtime and PyTorch
    /// share). `Err(Error::NoCuda(reason))` when there is no usable driver or device; never
    /// panics.
    pub fn new(ordinal: usize) -> Result<Self, Error> {
        let count = probe().map_err(Error::NoCuda)?;
        if ordinal >= count {
            return Err(Error::InvalidArgument(format!(
                "CUDA device {ordinal} requested, but {count} device(s) are visible (indices 0..{count})"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| {
            Error::NoCuda(format!("opening the context of CUDA device {ordinal} failed ({})", code_name(e)))
        })?;
        let total = ctx.total_mem().map_err(|e| {
            Error::NoCuda(format!("reading the memory size of CUDA device {ordinal} failed ({})", code_name(e)))
        })? as u64;
        let ordinal = i32::try_from(ordinal).map_err(|_| Error::InvalidArgument(format!("device {ordinal}")))?;
        Ok(CudaBackend {
            default_stream: ctx.default_stream(),
            per_thread_stream: ctx.per_thread_stream(),
            ctx,
            ordinal,
            total,
            streams: HashMap::new(),
            segments: HashMap::new(),
            ranges: BTreeMap::new(),
            pages: HashMap::new(),
            events: HashMap::new(),
            event_pool: Vec::new(),
        })
    }

    /// The device's (primary) context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The cudarc stream for `id`: the default stream for [`StreamId::DEFAULT`], the per-thread
    /// stream for 2, or one created by [`Backend::new_stream`] / adopted by
    /// [`CudaBackend::adopt_stream`]. `None` for a handle this backend does not know.
    pub fn stream(&self, id: StreamId) -> Option<Arc<CudaStream>> {
        match id {
            LEGACY_STREAM => Some(Arc::clone(&self.default_stream)),
            PER_THREAD_STREAM => Some(Arc::clone(&self.per_thread_stream)),
            _ => self.streams.get(&id).cloned(),
        }
    }

    /// Registers a stream created elsewhere (by cudarc, candle, …) so the allocator can record
    /// events on it; returns its id. The stream must belong to this device's context.
    pub fn adopt_stream(&mut self, stream: Arc<CudaStream>) -> Result<StreamId, DeviceError> {
        if **stream.context() != *self.ctx {
            return Err(DeviceError::Driver(
                "CUDA_ERROR_INVALID_CONTEXT: the stream belongs to another context".into(),
            ));
        }
        let id = stream_id(&stream);
        if id != LEGACY_STREAM && id != PER_THREAD_STREAM {
            self.streams.insert(id, stream);
        }
        Ok(id)
    }

    /// The device's 16-byte UUID (`cuDeviceGetUuid`), to find it in NVML ([`super::nvml`]).
    pub fn uuid(&self) -> Result<[u8; 16], DeviceError> {
        self.ctx.uuid().map(|u| uuid_bytes(&u)).map_err(|e| driver("cuDeviceGetUuid_v2", e))
    }

    /// Keeps `stream` busy for `duration`: queues a host function (`cuLaunchHostFunc`) that
    /// sleeps, so work queued on the stream after it, and events recorded there, complete only
    /// once the sleep is over. Returns at once. PyTorch's `torch.cuda._sleep` does the same with a
    /// spinning kernel; this needs no kernel. Used by probes and tests of cross-stream frees
    /// (`record_stream` with the other stream still running).
    pub fn sleep_on_stream(&mut self, stream: StreamId, duration: std::time::Duration) -> Result<(), DeviceError> {
        let s = self.lookup_stream(stream)?;
        let micros = usize::try_from(duration.as_micros())
            .map_err(|_| DeviceError::Driver("CUDA_ERROR_INVALID_VALUE: sleep too long".into()))?;
        self.bind()?;
        // SAFETY: `s` is a live stream of this backend's context (kept alive by the backend, and
        // by the `Arc` held here during the call), and that context is bound. The host function
        // only sleeps: it calls no CUDA API (which a host function must not) and dereferences
        // nothing; its argument is the sleep in microseconds passed by value in the pointer's
        // bits, so no memory has to outlive the call.
        unsafe {
            result::stream::launch_host_function(s.cu_stream(), sleep_host_fn, std::ptr::without_provenance_mut(micros))
        }
        .map_err(|e| driver("cuLaunchHostFunc", e))
    }

    fn lookup_stream(&self, id: StreamId) -> Result<Arc<CudaStream>, DeviceError> {
        self.stream(id).ok_or_else(|| {
            DeviceError::Driver(format!(
                "CUDA_ERROR_INVALID_HANDLE: stream {:#x} is unknown to the allocator (create it with new_stream, \
                 or register it with adopt_stream)",
                id.0
            ))
        })
    }

    fn bind(&self) -> Result<(), DeviceError> {
        self.ctx.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))
    }

    /// Unmaps one page and releases its physical memory; on failure, the call that failed.
    fn unmap_one(
        page: u64,
        handle: CUmemGenericAllocationHandle,
        size: usize,
    ) -> Result<(), (&'static str, DriverError)> {
        // SAFETY: `page` was mapped by `map_pages` with exactly `size` bytes (one cuMemMap per
        // page, so this covers a whole mapping), and the caller synchronised the work that used
        // it. The context is bound by the caller.
        unsafe { sys::cuMemUnmap(page, size).result() }.map_err(|e| ("cuMemUnmap", e))?;
        // SAFETY: `handle` came from cuMemCreate in `map_pages`, its only mapping is gone, and it
        // is released exactly once (the caller removed it from `pages`, or never inserted it).
        unsafe { sys::cuMemRelease(handle).result() }.map_err(|e| ("cuMemRelease", e))
    }

    fn range_contains(&self, addr: u64, len: u64) -> bool {
        self.ranges
            .range(..=addr)
            .next_back()
            .is_some_and(|(&start, &size)| addr.checked_add(len).is_some_and(|end| end <= start + size))
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn device_index(&self) -> i32 {
        self.ordinal
    }

    fn total_memory(&self) -> u64 {
        self.total
    }

    fn mem_get_info(&mut self) -> Result<(u64, u64), DeviceError> {
        let (free, total) = self.ctx.mem_get_info().map_err(|e| driver("cuMemGetInfo_v2", e))?;
        Ok((free as u64, total as u64))
    }

    fn reserve(&mut self, size: u64, _stream: StreamId) -> Result<u64, DeviceError> {
        let bytes = to_usize(size)?;
        self.bind()?;
        // SAFETY: the context is bound to this thread; the result is a fresh device allocation
        // that nothing else refers to yet (the caller owns it until `release`).
        let addr = unsafe { result::malloc_sync(bytes) }.map_err(|e| oom_or_driver("cuMemAlloc_v2", e))?;
        self.segments.insert(addr, size);
        Ok(addr)
    }

    fn release(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        match self.segments.get(&addr) {
            Some(&s) if s == size => {}
            Some(&s) => {
                return Err(DeviceError::Driver(format!(
                    "CUDA_ERROR_INVALID_VALUE: release of {size} bytes at {addr:#x}, reserved {s}"
                )));
            }
            None => {
                return Err(DeviceError::Driver(format!(
                    "CUDA_ERROR_INVALID_VALUE: {addr:#x} is not a segment of this allocator"
                )));
            }
        }
        self.bind()?;
        // SAFETY: `addr` is a live cuMemAlloc_v2 allocation of this backend (checked just above),
        // freed once: it leaves `segments` below. The policy releases a segment only when none of
        // its blocks is allocated or waiting on stream events, so no caller still uses it.
        unsafe { result::free_sync(addr) }.map_err(|e| driver("cuMemFree_v2", e))?;
        self.segments.remove(&addr);
        Ok(())
    }

    fn reserve_address_range(&mut self, size: u64) -> Result<u64, DeviceError> {
        let bytes = to_usize(size)?;
        self.bind()?;
        let mut addr: CUdeviceptr = 0;
        // SAFETY: `addr` is a valid out-pointer for the duration of the call; alignment 0 and
        // fixed address 0 ask the driver to choose; flags must be 0.
        unsafe { sys::cuMemAddressReserve(&mut addr, bytes, 0, 0, 0).result() }
            .map_err(|e| oom_or_driver("cuMemAddressReserve", e))?;
        self.ranges.insert(addr, size);
        Ok(addr)
    }

    fn release_address_range(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        if self.ranges.get(&addr) != Some(&size) {
            return Err(DeviceError::Driver(format!(
                "CUDA_ERROR_INVALID_VALUE: {addr:#x} (+{size}) is not an address range of this allocator"
            )));
        }
        if self.pages.keys().any(|&p| p >= addr && p < addr + size) {
            return Err(DeviceError::Driver(format!(
                "CUDA_ERROR_INVALID_VALUE: range {addr:#x} still has mapped pages"
            )));
        }
        let bytes = to_usize(size)?;
        self.bind()?;
        // SAFETY: the range was reserved by `reserve_address_range` with this exact size (checked
        // above) and has no mapped pages left; it is freed once (removed from `ranges` below).
        unsafe { sys::cuMemAddressFree(addr, bytes).result() }.map_err(|e| driver("cuMemAddressFree", e))?;
        self.ranges.remove(&addr);
        Ok(())
    }

    fn map_pages(&mut self, addr: u64, page_size: u64, pages: u64) -> Result<(), DeviceError> {
        let total = page_size
            .checked_mul(pages)
            .ok_or_else(|| DeviceError::Driver("CUDA_ERROR_INVALID_VALUE: page count overflows".into()))?;
        if !self.range_contains(addr, total) {
            return Err(DeviceError::Driver(format!(
                "CUDA_ERROR_INVALID_VALUE: pages {addr:#x} (+{total}) lie outside every reserved range"
            )));
        }
        if let Some(p) = (0..pages).map(|i| addr + i * page_size).find(|p| self.pages.contains_key(p)) {
            return Err(DeviceError::Driver(format!("CUDA_ERROR_INVALID_VALUE: page {p:#x} already mapped")));
        }
        let ps = to_usize(page_size)?;
        self.bind()?;
        let prop = allocation_prop(self.ordinal);
        let access = sys::CUmemAccessDesc {
            location: device_location(self.ordinal),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let mut done: Vec<(u64, CUmemGenericAllocationHandle)> = Vec::new();
        let mut failure = None;
        for i in 0..pages {
            let page = addr + i * page_size;
            let mut handle: CUmemGenericAllocationHandle = 0;
            // SAFETY: `handle` and `prop` are valid for the call; `prop` describes pinned memory
            // on this device with no export handle types; flags must be 0.
            if let Err(e) = unsafe { sys::cuMemCreate(&mut handle, ps, &prop, 0).result() } {
                failure = Some(oom_or_driver("cuMemCreate", e));
                break;
            }
            // SAFETY: `page..page + ps` lies inside a range reserved by `reserve_address_range`
            // (checked above) and is not mapped (checked above; the pages of this call are
            // distinct); `handle` is a fresh allocation of exactly `ps` bytes; offset, flags 0.
            if let Err(e) = unsafe { sys::cuMemMap(page, ps, 0, handle, 0).result() } {
                // SAFETY: `handle` was just created and is mapped nowhere; released once.
                let _ = unsafe { sys::cuMemRelease(handle).result() };
                failure = Some(oom_or_driver("cuMemMap", e));
                break;
            }
            done.push((page, handle));
            // SAFETY: `page..page + ps` is exactly the mapping made above; `access` is one valid
            // descriptor (read/write from this device), count 1.
            if let Err(e) = unsafe { sys::cuMemSetAccess(page, ps, &access, 1).result() } {
                failure = Some(oom_or_driver("cuMemSetAccess", e));
                break;
            }
        }
        if let Some(err) = failure {
            // All or nothing: undo this call's mappings (nothing has used them yet).
            for (page, handle) in done {
                let _ = Self::unmap_one(page, handle, ps);
            }
            return Err(err);
        }
        for (page, handle) in done {
            self.pages.insert(page, (handle, page_size));
        }
        Ok(())
    }

    fn unmap_pages(&mut self, addr: u64, page_size: u64, pages: u64, stream: StreamId) -> Result<(), DeviceError> {
        let list: Vec<u64> = (0..pages).map(|i| addr + i * page_size).collect();
        for &p in &list {
            match self.pages.get(&p) {
                Some(&(_, s)) if s == page_size => {}
                _ => {
                    return Err(DeviceError::Driver(format!(
                        "CUDA_ERROR_INVALID_VALUE: page {p:#x} ({page_size} bytes) is not mapped"
                    )));
                }
            }
        }
        let ps = to_usize(page_size)?;
        self.bind()?;
        // Work queued on the stream may still touch the pages: wait for it first.
        match self.stream(stream) {
            Some(s) => s.synchronize().map_err(|e| driver("cuStreamSynchronize", e))?,
            None => self.ctx.synchronize().map_err(|e| driver("cuCtxSynchronize", e))?,
        }
        for p in list {
            if let Some((handle, _)) = self.pages.remove(&p) {
                Self::unmap_one(p, handle, ps).map_err(|(call, e)| driver(call, e))?;
            }
        }
        Ok(())
    }

    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        let s = self.lookup_stream(stream)?;
        let event = match self.event_pool.pop() {
            Some(e) => e,
            None => self.ctx.new_event(None).map_err(|e| driver("cuEventCreate", e))?,
        };
        if let Err(e) = event.record(&s) {
            self.event_pool.push(event);
            return Err(driver("cuEventRecord", e));
        }
        let id = event.cu_event() as usize as u64;
        self.events.insert(id, event);
        Ok(EventId(id))
    }

    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        let ev = self
            .events
            .get(&event.0)
            .ok_or_else(|| DeviceError::Driver(format!("CUDA_ERROR_INVALID_HANDLE: event {:#x} unknown", event.0)))?;
        self.ctx.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        match ev.try_is_complete() {
            Ok(true) => {
                if let Some(ev) = self.events.remove(&event.0)
                    && self.event_pool.len() < EVENT_POOL_LIMIT
                {
                    self.event_pool.push(ev);
                }
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(e) => Err(driver("cuEventQuery", e)),
        }
    }

    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        let ev = self
            .events
            .remove(&event.0)
            .ok_or_else(|| DeviceError::Driver(format!("CUDA_ERROR_INVALID_HANDLE: event {:#x} unknown", event.0)))?;
        ev.synchronize().map_err(|e| driver("cuEventSynchronize", e))?;
        if self.event_pool.len() < EVENT_POOL_LIMIT {
            self.event_pool.push(ev);
        }
        Ok(())
    }

    /// Every process on this GPU with its device memory, from NVML (matched by UUID). Empty
    /// when NVML is unavailable or cannot tell (the OOM message then leaves the part out).
    fn process_memory(&mut self) -> Vec<ProcessMemory> {
        match self.uuid() {
            Ok(u) => super::nvml::process_memory(u).unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    /// The device's current memory pool (cudarc's `CudaSlice` allocates from it with
    /// `cuMemAllocAsync`), read with `cuMemPoolGetAttribute`.
    fn pool_usage(&mut self) -> Option<super::PoolUsage> {
        if !self.ctx.has_async_alloc() || self.bind().is_err() {
            return None;
        }
        // SAFETY: the context is bound to this thread and `cu_device` is its device; the call
        // only writes the pool handle.
        let pool = unsafe { result::device::get_mem_pool(self.ctx.cu_device()) }.ok()?;
        let get = |attr: sys::CUmemPool_attribute| -> Option<u64> {
            let mut v: u64 = 0;
            // SAFETY: `pool` is the device's live current pool; the four `*_MEM_*` attributes
            // are `cuuint64_t`, so the driver writes 8 bytes into `v`.
            unsafe { result::mem_pool::get_attribute(pool, attr, (&mut v as *mut u64).cast()) }.ok()?;
            Some(v)
        };
        use sys::CUmemPool_attribute as A;
        Some(super::PoolUsage {
            used: get(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            reserved: get(A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            used_high: get(A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            reserved_high: get(A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
        })
    }

    fn reset_pool_high_water(&mut self) {
        if !self.ctx.has_async_alloc() || self.bind().is_err() {
            return;
        }
        // SAFETY: as in `pool_usage`: bound context, its own device.
        let Ok(pool) = (unsafe { result::device::get_mem_pool(self.ctx.cu_device()) }) else { return };
        for attr in [
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        ] {
            let mut zero: u64 = 0;
            // SAFETY: the `*_HIGH` attributes are `cuuint64_t` and are reset by setting them to 0
            // (the driver reads 8 bytes from `zero`); `pool` is the live current pool.
            let r = unsafe { result::mem_pool::set_attribute(pool, attr, (&mut zero as *mut u64).cast()) };
            self.ctx.record_err(r);
        }
    }

    fn new_stream(&mut self) -> Result<StreamId, DeviceError> {
        let s = self.ctx.new_stream().map_err(|e| driver("cuStreamCreate", e))?;
        let id = stream_id(&s);
        self.streams.insert(id, s);
        Ok(id)
    }
}

impl Drop for CudaBackend {
    /// Returns every segment, page and address range still held (the allocator is gone, so
    /// nobody can reach them any more). Errors are recorded on the context, never panicked on.
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        self.ctx.record_err(self.ctx.synchronize());
        for (addr, _) in self.segments.drain() {
            // SAFETY: a live cuMemAlloc_v2 allocation of this backend, freed once (drained); the
            // context was synchronised, and with the allocator gone no block of it is reachable.
            self.ctx.record_err(unsafe { result::free_sync(addr) });
        }
        for (page, (handle, size)) in self.pages.drain() {
            if let Ok(size) = usize::try_from(size) {
                self.ctx.record_err(Self::unmap_one(page, handle, size).map_err(|(_, e)| e));
            }
        }
        for (addr, size) in std::mem::take(&mut self.ranges) {
            if let Ok(size) = usize::try_from(size) {
                // SAFETY: a reservation of this backend with its exact size; its pages were all
                // unmapped just above; freed once (taken out of `ranges`).
                self.ctx.record_err(unsafe { sys::cuMemAddressFree(addr, size).result() });
            }
        }
    }
}

/// The base address of a page-locked host allocation: a one-field newtype, so that `Send` and
/// `Sync` are asserted for exactly this pointer and nothing else.
struct HostPtr(NonNull<u8>);

// SAFETY: the pointer is the base of a `cuMemHostAlloc` allocation owned by exactly one
// `PinnedHostMemory`, which gives access to it only through `&self` / `&mut self` methods (so
// Rust's borrow rules order every host access, whatever the thread). Page-locked memory is not
// tied to the thread that allocated it, and the context is bound before every driver call, so
// moving the owner to another thread is like moving a `Box<[u8]>`.
unsafe impl Send for HostPtr {}
// SAFETY: through `&PinnedHostMemory` the memory is only read (`as_slice`, and device reads
// queued by `copy_to_device_async`), after every device write into it has completed; the list
// of copies in flight is behind a mutex.
unsafe impl Sync for HostPtr {}

/// What a queued copy does to the host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeviceAccess {
    /// A host→device copy reads it.
    Reads,
    /// A device→host copy writes it.
    Writes,
}

/// One page-locked host allocation (`cuMemHostAlloc`, flags `CU_MEMHOSTALLOC_PORTABLE`), zeroed
/// when allocated, with asynchronous copies to and from allocator memory. See the module's
/// "Pinned host memory" section for the waits that keep it sound; [`crate::pinned`] caches these.
pub struct PinnedHostMemory {
    ptr: HostPtr,
    size: usize,
    ctx: Arc<CudaContext>,
    /// Copies queued on streams that touch the memory, each followed by an event.
    in_flight: Mutex<Vec<(CudaEvent, DeviceAccess)>>,
    /// A copy was queued whose completion can no longer be proven (event and stream
    /// synchronisation both failed): the memory is never handed out or freed again.
    poisoned: AtomicBool,
}

impl std::fmt::Debug for PinnedHostMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedHostMemory")
            .field("ptr", &self.ptr.0)
            .field("size", &self.size)
            .field("copies_in_flight", &self.in_flight().len())
            .finish()
    }
}

impl PinnedHostMemory {
    /// The `cuMemHostAlloc` flags used: portable (pinned for every context), never
    /// write-combined (uncached for host reads; only worth it for write-only staging buffers).
    pub const FLAGS: u32 = sys::CU_MEMHOSTALLOC_PORTABLE;

    /// Allocates `size` bytes (> 0) of page-locked host memory through `ctx`, zeroed.
    /// `Err(OutOfMemory)` when the host cannot pin that much.
    pub fn alloc(ctx: &Arc<CudaContext>, size: usize) -> Result<Self, DeviceError> {
        if size == 0 {
            return Err(DeviceError::Driver("CUDA_ERROR_INVALID_VALUE: pinned allocation of 0 bytes".into()));
        }
        ctx.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        // SAFETY: a context is bound to this thread; cudarc passes a valid out-pointer and returns
        // the new allocation's address; the flags are `PORTABLE` only.
        let raw = unsafe { result::malloc_host(size, Self::FLAGS) }.map_err(|e| oom_or_driver("cuMemHostAlloc", e))?;
        let Some(ptr) = NonNull::new(raw.cast::<u8>()) else {
            return Err(DeviceError::Driver("CUDA_ERROR_INVALID_VALUE: cuMemHostAlloc returned NULL".into()));
        };
        // SAFETY: `ptr` is the base of a fresh, writable host allocation of `size` bytes that
        // nothing else refers to yet. Zeroing it makes every byte initialised.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, size) };
        Ok(PinnedHostMemory {
            ptr: HostPtr(ptr),
            size,
            ctx: Arc::clone(ctx),
            in_flight: Mutex::new(Vec::new()),
            poisoned: AtomicBool::new(false),
        })
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The host address (for display and identity; access goes through the slices).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.0.as_ptr()
    }

    /// The context the memory was allocated through.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn in_flight(&self) -> MutexGuard<'_, Vec<(CudaEvent, DeviceAccess)>> {
        // Every update of the list is one push or remove: a panic cannot leave it half-done.
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the queued copies that write into the memory (`writes_only`), or for all of
    /// them, and forgets them.
    fn wait(&self, writes_only: bool) -> Result<(), DeviceError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(DeviceError::Driver(
                "CUDA_ERROR_ILLEGAL_STATE: a copy into this pinned memory could not be waited for".into(),
            ));
        }
        let mut list = self.in_flight();
        while let Some(i) = list.iter().position(|(_, a)| !writes_only || *a == DeviceAccess::Writes) {
            list[i].0.synchronize().map_err(|e| driver("cuEventSynchronize", e))?;
            list.swap_remove(i);
        }
        Ok(())
    }

    /// Whether every copy queued on this memory has completed (completed ones are forgotten).
    pub fn is_idle(&self) -> Result<bool, DeviceError> {
        let mut list = self.in_flight();
        let mut i = 0;
        while i < list.len() {
            let ev = &list[i].0;
            ev.context().bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
            if ev.try_is_complete().map_err(|e| driver("cuEventQuery", e))? {
                list.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(list.is_empty() && !self.poisoned.load(Ordering::Acquire))
    }

    /// Bytes of `len` values of `T`, checked against the size and `T`'s alignment.
    fn span<T>(&self, len: usize) -> Result<usize, DeviceError> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).filter(|&b| b <= self.size).ok_or_else(|| {
            DeviceError::Driver(format!(
                "CUDA_ERROR_INVALID_VALUE: {len} × {} bytes exceed the pinned allocation of {} bytes",
                std::mem::size_of::<T>(),
                self.size
            ))
        })?;
        if !(self.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(DeviceError::Driver("CUDA_ERROR_INVALID_VALUE: misaligned pinned memory".into()));
        }
        Ok(bytes)
    }

    /// The first `len` values of `T`, once every queued copy into the memory has completed.
    pub fn as_slice<T: Element>(&self, len: usize) -> Result<&[T], DeviceError> {
        self.span::<T>(len)?;
        self.wait(true)?;
        // SAFETY: `ptr` is the live base of `size` bytes, aligned for `T`, and `len` values of `T`
        // fit in them (both checked by `span`). Every byte is initialised (zeroed at allocation,
        // later written only by host code through `&mut self` or by device copies) and
        // `T: Element` admits every bit pattern. No device copy writes into the memory any more
        // (waited for just above) and none can be queued while the returned borrow of `self`
        // lives: `copy_from_device_async` and host writes take `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.0.as_ptr().cast::<T>(), len) })
    }

    /// The first `len` values of `T`, mutably, once every queued copy (reads too) has completed.
    pub fn as_mut_slice<T: Element>(&mut self, len: usize) -> Result<&mut [T], DeviceError> {
        self.span::<T>(len)?;
        self.wait(false)?;
        // SAFETY: as in `as_slice` (bounds, alignment, initialised bytes, `T: Element`), and no
        // copy touches the memory any more: all were waited for above, and none can be queued
        // while the returned exclusive borrow of `self` lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.0.as_ptr().cast::<T>(), len) })
    }

    /// Remembers a copy just queued on `stream` (an event after it), or waits for it when no
    /// event can be recorded.
    fn track(&self, stream: &CudaStream, access: DeviceAccess) -> Result<(), DeviceError> {
        match stream.record_event(None) {
            Ok(ev) => {
                self.in_flight().push((ev, access));
                Ok(())
            }
            Err(record) => match stream.synchronize() {
                // The copy has completed; nothing to remember.
                Ok(()) => Ok(()),
                Err(_) => {
                    self.poisoned.store(true, Ordering::Release);
                    Err(driver("cuEventRecord", record))
                }
            },
        }
    }

    /// Queues a copy of the first `dst.len()` values into the device buffer behind `dst`, on
    /// `stream` (not waited for). The memory stays alive and unwritten until the copy completes.
    pub fn copy_to_device_async<T: Element>(
        &self,
        dst: &mut CudaViewMut<'_, T>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), DeviceError> {
        let bytes = self.span::<T>(dst.len)?;
        if bytes == 0 {
            return Ok(());
        }
        // Host writes need `&mut self`, so none is under way; device writes must finish first.
        self.wait(true)?;
        stream.context().bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        // SAFETY: source: `bytes` ≤ `size` initialised bytes at `ptr` (checked by `span`), which
        // stay alive and unwritten until the event recorded by `track` completes (`as_mut_slice`,
        // new device writes and the drop all wait for it first). Destination: by the view's
        // invariant a live device block of `dst.len × size_of::<T>()` = `bytes` bytes, exclusively
        // borrowed. The copy is ordered on `stream`, whose context is bound.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst.ptr, self.as_ptr().cast(), bytes, stream.cu_stream()).result() }
            .map_err(|e| driver("cuMemcpyHtoDAsync_v2", e))?;
        self.track(stream, DeviceAccess::Reads)
    }

    /// Queues a copy of the device buffer behind `src` into the first `src.len()` values, on
    /// `stream` (not waited for: the slices wait for it).
    pub fn copy_from_device_async<T: Element>(
        &mut self,
        src: &CudaView<'_, T>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), DeviceError> {
        let bytes = self.span::<T>(src.len)?;
        if bytes == 0 {
            return Ok(());
        }
        // Copies still reading or writing the memory must finish before it is overwritten.
        self.wait(false)?;
        stream.context().bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        // SAFETY: destination: `bytes` ≤ `size` bytes at `ptr` (checked), exclusively borrowed
        // through `&mut self`, and no Rust slice of it can be made before the event recorded by
        // `track` completes (the slices and the drop wait for it); any bit pattern is a valid
        // `Element`. Source: by the view's invariant a live device block of `bytes` bytes. The
        // copy is ordered on `stream`, whose context is bound.
        unsafe { sys::cuMemcpyDtoHAsync_v2(self.ptr.0.as_ptr().cast(), src.ptr, bytes, stream.cu_stream()).result() }
            .map_err(|e| driver("cuMemcpyDtoHAsync_v2", e))?;
        self.track(stream, DeviceAccess::Writes)
    }
}

impl Drop for PinnedHostMemory {
    /// Waits for every queued copy, then frees the memory. When completion cannot be proven
    /// (driver failure) the memory is leaked rather than freed under a copy. Never panics.
    fn drop(&mut self) {
        if self.poisoned.load(Ordering::Acquire) {
            return;
        }
        if self.wait(false).is_err() {
            // Some event could not be waited for: only synchronising the contexts the copies ran
            // in proves that none is still running.
            let contexts: Vec<Arc<CudaContext>> =
                self.in_flight().iter().map(|(e, _)| Arc::clone(e.context())).collect();
            if contexts.iter().any(|c| c.synchronize().is_err()) {
                return;
            }
        }
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed exactly once, here; no copy uses it
        // any more (all were waited for above, or we returned and leaked it), and no Rust borrow
        // of it outlives `self`.
        self.ctx.record_err(unsafe { result::free_host(self.ptr.0.as_ptr().cast()) });
    }
}

/// A read-only borrow of a [`crate::DeviceBuffer`] for cudarc's safe API (from
/// [`crate::DeviceBuffer::cuda`]): implements [`DeviceSlice`], [`DevicePtr`] and
/// `PushKernelArg<&CudaView<T>>`.
///
/// Not to be confused with cudarc's own `CudaView`, which borrows a `CudaSlice`.
pub struct CudaView<'a, T> {
    ptr: CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    _borrow: PhantomData<&'a [T]>,
}

/// A mutable borrow of a [`crate::DeviceBuffer`] for cudarc's safe API (from
/// [`crate::DeviceBuffer::cuda_mut`]): implements [`DeviceSlice`], [`DevicePtr`],
/// [`DevicePtrMut`] and `PushKernelArg<&CudaViewMut<T>>` / `PushKernelArg<&mut CudaViewMut<T>>`.
pub struct CudaViewMut<'a, T> {
    ptr: CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    _borrow: PhantomData<&'a mut [T]>,
}

impl<T> std::fmt::Debug for CudaView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaView {{ ptr: {:#x}, len: {} }}", self.ptr, self.len)
    }
}

impl<T> std::fmt::Debug for CudaViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaViewMut {{ ptr: {:#x}, len: {} }}", self.ptr, self.len)
    }
}

impl<'a, T> CudaView<'a, T> {
    /// Invariant (relied on by the copies below): `ptr..ptr + len * size_of::<T>()` is a live
    /// block of the allocator that the returned view borrows for `'a` (only
    /// [`crate::DeviceBuffer`] constructs views), on `stream`'s device.
    pub(crate) fn new(ptr: u64, len: usize, stream: Arc<CudaStream>) -> Self {
        CudaView { ptr, len, stream, _borrow: PhantomData }
    }

    /// The raw device address (for `builder.arg(&ptr)` style launches).
    pub fn device_address(&self) -> u64 {
        self.ptr
    }
}

impl<T: Element> CudaView<'_, T> {
    /// Copies the whole view to a new host vector (on the view's stream, then waits for it).
    pub(crate) fn read_to_host(&self) -> Result<Vec<T>, DeviceError> {
        let mut out = vec![T::ZERO; self.len];
        if self.len == 0 {
            return Ok(out);
        }
        self.stream.context().bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        // SAFETY: by the view's invariant `ptr` is a live device block of `len * size_of::<T>()`
        // bytes, exactly `size_of_val(out)`; `out` is a valid, exclusively borrowed host slice
        // that outlives the copy (we synchronise the stream before returning); `T: Element`
        // admits every bit pattern, so whatever the device holds is a valid `T`.
        unsafe { result::memcpy_dtoh_async(&mut out, self.ptr, self.stream.cu_stream()) }
            .map_err(|e| driver("cuMemcpyDtoHAsync_v2", e))?;
        self.stream.synchronize().map_err(|e| driver("cuStreamSynchronize", e))?;
        Ok(out)
    }
}

impl<'a, T> CudaViewMut<'a, T> {
    /// Same invariant as [`CudaView::new`], with an exclusive borrow.
    pub(crate) fn new(ptr: u64, len: usize, stream: Arc<CudaStream>) -> Self {
        CudaViewMut { ptr, len, stream, _borrow: PhantomData }
    }

    /// The raw device address (for `builder.arg(&ptr)` style launches).
    pub fn device_address(&self) -> u64 {
        self.ptr
    }
}

impl<T: Element> CudaViewMut<'_, T> {
    /// Copies `src` (exactly `len` elements) into the view and waits for the copy.
    pub(crate) fn write_from_host(&mut self, src: &[T]) -> Result<(), DeviceError> {
        if src.len() != self.len {
            return Err(DeviceError::Driver(format!(
                "CUDA_ERROR_INVALID_VALUE: copy of {} elements into a buffer of {}",
                src.len(),
                self.len
            )));
        }
        if self.len == 0 {
            return Ok(());
        }
        self.stream.context().bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        // SAFETY: by the view's invariant `ptr` is a live device block of `len * size_of::<T>()`
        // bytes = `size_of_val(src)` (lengths checked above); `src` stays borrowed until the
        // stream is synchronised below; `T: Element` has no padding, so every byte read is
        // initialised.
        unsafe { result::memcpy_htod_async(self.ptr, src, self.stream.cu_stream()) }
            .map_err(|e| driver("cuMemcpyHtoDAsync_v2", e))?;
        self.stream.synchronize().map_err(|e| driver("cuStreamSynchronize", e))
    }

    /// Zeroes the view (stream-ordered on the view's stream; does not wait).
    pub(crate) fn write_zeros(&mut self) -> Result<(), DeviceError> {
        let bytes = self.len * std::mem::size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        self.stream.context().bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        // SAFETY: by the view's invariant `ptr..ptr + bytes` is a live device block borrowed
        // exclusively; the memset is ordered on the block's stream like every later use of it.
        unsafe { result::memset_d8_async(self.ptr, 0, bytes, self.stream.cu_stream()) }
            .map_err(|e| driver("cuMemsetD8Async", e))
    }
}

impl<T> DeviceSlice<T> for CudaView<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DeviceSlice<T> for CudaViewMut<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for CudaView<'_, T> {
    fn device_ptr<'b>(&'b self, _stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtr<T> for CudaViewMut<'_, T> {
    fn device_ptr<'b>(&'b self, _stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtrMut<T> for CudaViewMut<'_, T> {
    fn device_ptr_mut<'b>(&'b mut self, _stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

// SAFETY: the kernel argument is the view's device address, pushed through cudarc's own
// `PushKernelArg<&u64>` impl (a `CUdeviceptr` is what a pointer parameter expects); the `&u64`
// lives inside the view, which is borrowed for `'b`, and `'b` outlives the builder's `'a`.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b CudaView<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b CudaView<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as for `&CudaView` above: the address lives in the view, borrowed for `'b: 'a`.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b CudaViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b CudaViewMut<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as for `&CudaView` above: the address lives in the view, borrowed for `'b: 'a`.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut CudaViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut CudaViewMut<'c, T>) -> &mut Self {
        let ptr: &'b CUdeviceptr = &arg.ptr;
        self.arg(ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::any::AnyBackend;
    use crate::{AllocError, DeviceBuffer};

    /// Runs everywhere: without a driver library the probe is an error value, not a panic.
    #[test]
    fn probe_without_driver_is_an_error_value() {
        let probed = probe();
        // On a GPU machine, `GPUMEM_NB_EXPECT_GPU=1` makes sure the GPU tests below really ran.
        if std::env::var_os("GPUMEM_NB_EXPECT_GPU").is_some() {
            assert!(probed.is_ok(), "GPUMEM_NB_EXPECT_GPU is set, but: {probed:?}");
        }
        if !library_present() {
            let reason = probed.expect_err("no libcuda here, so the probe must fail");
            assert!(reason.contains("libcuda"), "{reason}");
            match CudaBackend::new(0) {
                Err(Error::NoCuda(r)) => assert_eq!(r, reason),
                other => panic!("expected NoCuda, got {:?}", other.map(|_| ())),
            }
            // Cached: asking again gives the same answer and still does not panic.
            assert_eq!(probe(), Err(reason));
        } else {
            match probed {
                Ok(n) => {
                    assert!(n >= 1);
                    assert!(matches!(CudaBackend::new(n), Err(Error::InvalidArgument(_))));
                }
                Err(reason) => {
                    eprintln!("driver present, no usable device: {reason}");
                    assert!(matches!(CudaBackend::new(0), Err(Error::NoCuda(r)) if r == reason))
                }
            }
        }
    }

    /// GPU tests run one at a time: some of them fill the device on purpose.
    static GPU_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// `None` when there is no usable GPU: the GPU tests below then do nothing. Holds the GPU
    /// lock while the test runs.
    fn gpu() -> Option<(std::sync::MutexGuard<'static, ()>, CudaBackend)> {
        probe().ok()?;
        let guard = GPU_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        Some((guard, CudaBackend::new(0).expect("probe found a device, so it opens")))
    }

    fn gpu_allocator(conf: &str) -> Option<(std::sync::MutexGuard<'static, ()>, Arc<crate::Allocator>)> {
        let (guard, b) = gpu()?;
        let config = crate::AllocatorConfig::parse(conf).unwrap();
        Some((guard, Arc::new(crate::CachingAllocator::new(AnyBackend::Cuda(b), config))))
    }

    #[test]
    fn gpu_reserve_release_and_oom() {
        let Some((_gpu, mut b)) = gpu() else { return };
        let (free, total) = b.mem_get_info().unwrap();
        assert_eq!(total, b.total_memory());
        assert!(free <= total);
        let a = b.reserve(2 << 20, StreamId::DEFAULT).unwrap();
        assert_ne!(a, 0);
        assert!(b.release(a, 4 << 20).is_err(), "wrong size is refused");
        b.release(a, 2 << 20).unwrap();
        assert!(b.release(a, 2 << 20).is_err(), "double release is refused");
        // Far more than the card has: out-of-memory, as a value.
        assert_eq!(b.reserve(total * 4, StreamId::DEFAULT), Err(DeviceError::OutOfMemory));
        // And the device still works afterwards.
        let a = b.reserve(2 << 20, StreamId::DEFAULT).unwrap();
        b.release(a, 2 << 20).unwrap();
    }

    #[test]
    fn gpu_vmm_map_unmap() {
        let Some((_gpu, mut b)) = gpu() else { return };
        let page = 2u64 << 20;
        let va = b.reserve_address_range(64 * page).unwrap();
        b.map_pages(va, page, 3).unwrap();
        assert!(b.map_pages(va + page, page, 1).is_err(), "already mapped");
        assert!(b.map_pages(va + 63 * page, page, 2).is_err(), "outside the range");
        assert!(b.release_address_range(va, 64 * page).is_err(), "pages still mapped");
        // Mapping more than the device has fails all-or-nothing with OutOfMemory.
        let big = 64 * page;
        let huge = b.total_memory() / big + 2;
        let va2 = b.reserve_address_range(huge * big).unwrap();
        assert_eq!(b.map_pages(va2, big, huge), Err(DeviceError::OutOfMemory));
        assert_eq!(b.pages.len(), 3, "the failed call left nothing mapped");
        b.release_address_range(va2, huge * big).unwrap();
        b.unmap_pages(va, page, 3, StreamId::DEFAULT).unwrap();
        b.release_address_range(va, 64 * page).unwrap();
    }

    #[test]
    fn gpu_streams_and_events() {
        let Some((_gpu, mut b)) = gpu() else { return };
        let s = b.new_stream().unwrap();
        assert_ne!(s, StreamId::DEFAULT);
        assert!(b.stream(s).is_some());
        assert!(b.stream(StreamId(0xdead_0000)).is_none());
        assert!(b.record_event(StreamId(0xdead_0000)).is_err(), "unknown streams are refused");
        let e = b.record_event(s).unwrap();
        b.stream(s).unwrap().synchronize().unwrap();
        assert!(b.query_event(e).unwrap());
        assert!(b.query_event(e).is_err(), "a completed event is released");
        // The pooled event is reused.
        let e2 = b.record_event(StreamId::DEFAULT).unwrap();
        assert_eq!(e2, e);
        b.synchronize_event(e2).unwrap();
        let e3 = b.record_event(PER_THREAD_STREAM).unwrap();
        b.synchronize_event(e3).unwrap();
        // Adopting a stream from cudarc.
        let foreign = b.context().new_stream().unwrap();
        let id = b.adopt_stream(Arc::clone(&foreign)).unwrap();
        assert_eq!(id, stream_id(&foreign));
        let e4 = b.record_event(id).unwrap();
        b.synchronize_event(e4).unwrap();
    }

    #[test]
    fn gpu_sleep_keeps_a_stream_busy() {
        let Some((_gpu, mut b)) = gpu() else { return };
        let s = b.new_stream().unwrap();
        b.sleep_on_stream(s, std::time::Duration::from_millis(300)).unwrap();
        let e = b.record_event(s).unwrap();
        assert!(!b.query_event(e).unwrap(), "the event waits for the sleeping host function");
        b.synchronize_event(e).unwrap();
        assert!(b.sleep_on_stream(StreamId(0xdead_0000), std::time::Duration::from_millis(1)).is_err());
    }

    #[test]
    fn gpu_buffers_round_trip_zero_and_return_memory() {
        let Some((_gpu, a)) = gpu_allocator("") else {
            return;
        };
        let data: Vec<f32> = (0..100_000).map(|i| i as f32).collect();
        let b = DeviceBuffer::from_host(&a, &data, StreamId::DEFAULT).unwrap();
        assert_eq!(b.to_host().unwrap(), data);
        let addr = b.addr();
        drop(b);
        assert_eq!(a.memory_allocated(), 0);
        // The cached block comes back, and `zeros` really clears it.
        let z = DeviceBuffer::<f32>::zeros(&a, data.len(), StreamId::DEFAULT).unwrap();
        assert_eq!(z.addr(), addr);
        assert!(z.to_host().unwrap().iter().all(|&x| x == 0.0));
        drop(z);
        // A buffer on a stream of its own.
        let s = a.with_state(|_, b| Backend::new_stream(b)).unwrap();
        let mut u = DeviceBuffer::<u64>::alloc(&a, 4096, s).unwrap();
        let v: Vec<u64> = (0..4096u64).map(|i| i * 0x1_0000_0001).collect();
        u.copy_from_host(&v).unwrap();
        assert_eq!(u.to_host().unwrap(), v);
        assert_eq!(u.stream(), s);
        drop(u);
        let empty = DeviceBuffer::<u8>::from_host(&a, &[], StreamId::DEFAULT).unwrap();
        assert!(empty.to_host().unwrap().is_empty());
        drop(empty);
        a.check_invariants().unwrap();
        assert_eq!(a.memory_allocated(), 0);
        assert!(a.memory_reserved() > 0);
        a.empty_cache().unwrap();
        assert_eq!(a.memory_reserved(), 0);
    }

    #[test]
    fn gpu_out_of_memory_is_a_value() {
        let Some((_gpu, a)) = gpu_allocator("") else {
            return;
        };
        let total = a.with_state(|_, b| b.total_memory()) as usize;
        let err = DeviceBuffer::<u8>::alloc(&a, total * 2, StreamId::DEFAULT).unwrap_err();
        assert!(matches!(err, Error::Alloc(AllocError::OutOfMemory(_))), "{err}");
        assert!(err.to_string().starts_with("CUDA out of memory. Tried to allocate"), "{err}");
        // The device still works afterwards.
        let b = DeviceBuffer::from_host(&a, &[1u32, 2, 3], StreamId::DEFAULT).unwrap();
        assert_eq!(b.to_host().unwrap(), vec![1, 2, 3]);
    }

    #[test]
    fn gpu_expandable_segments() {
        let Some((_gpu, a)) = gpu_allocator("expandable_segments:True") else {
            return;
        };
        let mut bufs = Vec::new();
        for i in 0..20u32 {
            let n = ((i as usize % 5) + 1) * (3 << 20);
            let v: Vec<u32> = (0..n as u32).map(|x| x ^ i).collect();
            bufs.push((DeviceBuffer::from_host(&a, &v, StreamId::DEFAULT).unwrap(), v));
        }
        for (b, v) in &bufs {
            assert_eq!(&b.to_host().unwrap(), v);
        }
        assert!(a.segments().iter().any(|s| s.is_expandable));
        drop(bufs);
        a.check_invariants().unwrap();
        a.empty_cache().unwrap();
        assert_eq!(a.memory_reserved(), 0);
    }

    #[test]
    fn gpu_record_stream_defers_reuse() {
        let Some((_gpu, a)) = gpu_allocator("") else {
            return;
        };
        let side = a.with_state(|_, b| Backend::new_stream(b)).unwrap();
        let b = DeviceBuffer::<u8>::zeros(&a, 1 << 20, StreamId::DEFAULT).unwrap();
        b.record_stream(side).unwrap();
        drop(b);
        // The event recorded on `side` completes; later allocations process it.
        a.with_state(|_, be| be.as_cuda().unwrap().stream(side).unwrap().synchronize()).unwrap();
        let again = DeviceBuffer::<u8>::zeros(&a, 1 << 20, StreamId::DEFAULT).unwrap();
        drop(again);
        a.check_invariants().unwrap();
        assert_eq!(a.memory_allocated(), 0);
    }

    #[test]
    fn gpu_cudarc_copies_through_views() {
        let Some((_gpu, a)) = gpu_allocator("") else {
            return;
        };
        let host: Vec<f64> = (0..5000).map(|i| i as f64 / 3.0).collect();
        let mut x = DeviceBuffer::<f64>::alloc(&a, host.len(), StreamId::DEFAULT).unwrap();
        let mut y = DeviceBuffer::<f64>::alloc(&a, host.len(), StreamId::DEFAULT).unwrap();
        {
            let mut v = x.cuda_mut().unwrap();
            let stream = Arc::clone(DeviceSlice::stream(&v));
            stream.memcpy_htod(&host, &mut v).unwrap();
            stream.memcpy_dtod(&x.cuda().unwrap(), &mut y.cuda_mut().unwrap()).unwrap();
            assert_eq!(stream.clone_dtoh(&y.cuda().unwrap()).unwrap(), host);
            stream.memset_zeros(&mut x.cuda_mut().unwrap()).unwrap();
            assert!(stream.clone_dtoh(&x.cuda().unwrap()).unwrap().iter().all(|&v| v == 0.0));
        }
        assert_eq!(y.to_host().unwrap(), host);
    }

    /// `out[i] = out[i] * 2 + v` for `i < n`, hand-written PTX (no NVRTC library needed).
    #[cfg(feature = "nvrtc")]
    const AXPB_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry axpb(
    .param .u64 out,
    .param .f32 v,
    .param .u32 n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [out];
    ld.param.f32 %f1, [v];
    ld.param.u32 %r2, [n];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f2, [%rd4];
    fma.rn.f32 %f3, %f2, 0f40000000, %f1;
    st.global.f32 [%rd4], %f3;
DONE:
    ret;
}
"#;

    #[cfg(feature = "nvrtc")]
    #[test]
    fn gpu_kernel_launch_on_views() {
        use cudarc::driver::LaunchConfig;
        let Some((_gpu, a)) = gpu_allocator("expandable_segments:True") else {
            return;
        };
        let ctx = a.with_state(|_, b| Arc::clone(b.as_cuda().unwrap().context()));
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(AXPB_PTX)).unwrap();
        let f = module.load_function("axpb").unwrap();
        let n = 3_000_000u32; // 12 MB: more than one 2 MiB page of the expandable segment
        let host: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
        let mut buf = DeviceBuffer::from_host(&a, &host, StreamId::DEFAULT).unwrap();
        {
            let view = buf.cuda_mut().unwrap();
            let stream = Arc::clone(DeviceSlice::stream(&view));
            let mut launch = stream.launch_builder(&f);
            launch.arg(&view).arg(&0.5f32).arg(&n);
            // SAFETY: `axpb` takes (float*, float, unsigned) and touches out[0..n), which the
            // view covers (n f32 elements).
            unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.unwrap();
            stream.synchronize().unwrap();
        }
        let out = buf.to_host().unwrap();
        assert!(out.iter().zip(&host).all(|(&o, &h)| o == h * 2.0 + 0.5));
    }

    #[cfg(feature = "cublas")]
    #[test]
    fn gpu_cublas_gemm_on_views() {
        use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
        let Some((_gpu, a)) = gpu_allocator("") else {
            return;
        };
        // SAFETY: only tries to dlopen the cuBLAS library (no cudarc symbol is resolved).
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            eprintln!("skipped: no libcublas");
            return;
        }
        // Column-major 2×2: A = identity, B = [[1, 3], [2, 4]] (columns (1,2) and (3,4)).
        let ida = DeviceBuffer::from_host(&a, &[1.0f32, 0.0, 0.0, 1.0], StreamId::DEFAULT).unwrap();
        let bm = DeviceBuffer::from_host(&a, &[1.0f32, 2.0, 3.0, 4.0], StreamId::DEFAULT).unwrap();
        let mut c = DeviceBuffer::<f32>::zeros(&a, 4, StreamId::DEFAULT).unwrap();
        {
            let av = ida.cuda().unwrap();
            let bv = bm.cuda().unwrap();
            let mut cv = c.cuda_mut().unwrap();
            let blas = CudaBlas::new(Arc::clone(DeviceSlice::stream(&cv))).unwrap();
            let cfg = GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_N,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: 2,
                n: 2,
                k: 2,
                alpha: 1.0f32,
                lda: 2,
                ldb: 2,
                beta: 0.0f32,
                ldc: 2,
            };
            // SAFETY: the three views hold 4 f32 each, as m = n = k = 2 with leading dimension 2
            // needs.
            unsafe { blas.gemm(cfg, &av, &bv, &mut cv) }.unwrap();
        }
        assert_eq!(c.to_host().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    }
}
