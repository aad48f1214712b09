//! The CUDA backend: cudarc's driver API on a real GPU (feature `cuda`).
//!
//! This folder and `notebook::anchor` are the only places in the crate with `unsafe` code.
//! Every block names the invariant it relies on in a `// SAFETY:` comment.
//!
//! # Probing, never panicking
//! cudarc (feature `fallback-dynamic-loading`) loads `libcuda` lazily and *panics* when it is
//! absent, on the first call into the driver. So [`probe`] first checks that the driver library
//! loads at all (`library_present`, cached), and only then calls `cuInit` and
//! `cuDeviceGetCount`. Every failure is a value: `DeviceError::Unavailable` from [`probe`] and
//! [`CudaBackend::new`]. Driver errors are named from their `CUresult` variant
//! (`CUDA_ERROR_NO_DEVICE`), never through `DriverError`'s `Debug`/`Display`, which call back
//! into the driver library.
//!
//! Why `fallback-dynamic-loading` and not `dynamic-loading`: a notebook that also loads candle
//! (whose cudarc is `dynamic-linking`) gets one cudarc with both features, and cudarc refuses
//! `dynamic-loading` together with `dynamic-linking`; the fallback steps aside instead, and the
//! probe below works either way.
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
//! | `dlopen("libcuda.so.1")` | `libloading` | `library_present` (cached) |
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
//! | `cuDevicePrimaryCtxGetState`, `cuDevicePrimaryCtxRetain`/`Release`, `cuCtxPushCurrent_v2`, `cuCtxGetLimit(STACK_SIZE)`, `cuCtxPopCurrent_v2`, `cuDeviceGetAttribute` | `sys`, `result::{primary_ctx, ctx::get_limit, device::get_attribute}` | [`primary_local_memory`] (kernels' local memory, explaining NVML) |
//! | `cuMemHostAlloc` (flags `PORTABLE`, never `WRITECOMBINED`) | `result::malloc_host` | [`PinnedHostMemory::alloc`] |
//! | `cuMemFreeHost` | `result::free_host` | [`PinnedHostMemory`]'s drop |
//! | `cuEventCreate`, `cuEventRecord` | `CudaStream::record_event` | after each [`PinnedHostMemory`] copy |
//! | `cuEventQuery` | `CudaEvent::try_is_complete` | [`PinnedHostMemory::is_idle`] |
//! | `cuEventSynchronize` | `CudaEvent::synchronize` | [`PinnedHostMemory`] slices, drop |
//! | `cuStreamSynchronize` | `CudaStream::synchronize` | [`PinnedHostMemory`] copies when an event cannot be recorded |
//! | NVML `nvmlDeviceGetComputeRunningProcesses_v3` | [`crate::device::nvml`] | `process_memory` (OOM messages) |
//! | `cuDeviceGetMemPool` | `result::device::get_mem_pool` | `pool_usage`, `reset_pool_high_water`, [`primary_local_memory`], [`reset_primary_pool_high`] |
//! | `cuMemPoolGetAttribute` | `result::mem_pool::get_attribute` | `pool_usage`, [`primary_local_memory`] |
//! | `cuMemPoolSetAttribute` | `result::mem_pool::set_attribute` | `reset_pool_high_water`, [`reset_primary_pool_high`] |
//! | `cuDriverGetVersion` | `sys` | `driver_version` (CUPTI's library, the pool cap) |
//! | `cuMemPoolCreate` (`maxSize`), `cuDeviceSetMemPool`, `cuMemPoolDestroy` (if setting fails) | `result::mem_pool::{create, destroy}`, `result::device::set_mem_pool` | `cap_stream_ordered_pool` |
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

#[cfg(doc)]
use crate::device::Element;
use crate::device::{
    Backend, BackendKind, DeviceError, DriverCall, DriverEvent, DriverSink, EventId, ProcessMemory, StreamId,
};
use cudarc::driver::sys::{self, CUdeviceptr, CUmemGenericAllocationHandle};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, result};
#[cfg(doc)]
use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceSlice, PushKernelArg};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

/// The legacy default stream handle (`NULL`).
const LEGACY_STREAM: StreamId = StreamId(0);
/// `CU_STREAM_PER_THREAD`: the per-thread default stream handle.
const PER_THREAD_STREAM: StreamId = StreamId(2);
/// At most this many idle events are kept for reuse; more are destroyed.
const EVENT_POOL_LIMIT: usize = 64;

/// Whether the CUDA driver library can be loaded (cached).
pub(crate) fn library_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        ["libcuda.so.1", "libcuda.so"].iter().any(|name| {
            // SAFETY: loading the NVIDIA driver library runs its initialisers, which it supports
            // (cudarc loads it the same way on its first call); the handle is closed again at
            // once and no symbol is resolved, so nothing of it is used after.
            unsafe { libloading::Library::new(*name) }.is_ok()
        })
    })
}

/// The CUDA version the driver supports (`cuDriverGetVersion`: 13000 for CUDA 13.0), if libcuda
/// loads; never panics, needs no `cuInit` and no context.
pub(crate) fn driver_version() -> Option<u32> {
    if !library_present() {
        return None;
    }
    let mut v = 0;
    // SAFETY: libcuda is present (checked just above), so `culib()` cannot panic; the
    // `cuDriverGetVersion` symbol exists in every driver; `v` is a valid out-pointer.
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    (r == sys::CUresult::CUDA_SUCCESS && v > 0).then_some(v as u32)
}

/// Probes the CUDA driver: `Ok(number of devices)` (at least 1), or why there is no usable GPU.
///
/// Never panics: without a driver library nothing of cudarc's driver module is touched. The
/// answer is cached for the process.
pub fn probe() -> Result<usize, DeviceError> {
    static PROBE: OnceLock<Result<usize, String>> = OnceLock::new();
    PROBE.get_or_init(probe_uncached).clone().map_err(DeviceError::Unavailable)
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
/// what NVML devices are matched by ([`crate::device::nvml`]). `Err` (why) when there is no usable driver
/// or no such device; never panics.
pub fn device_uuid(ordinal: usize) -> Result<[u8; 16], DeviceError> {
    let dev = device_handle(ordinal)?;
    let uuid = result::device::get_uuid(dev).map_err(|e| driver("cuDeviceGetUuid", e))?;
    Ok(uuid_bytes(&uuid))
}

/// CUDA device `ordinal`'s handle (`cuDeviceGet`) after the probe (`cuInit`): `Err` (why) when
/// there is no usable driver or no such device.
fn device_handle(ordinal: usize) -> Result<sys::CUdevice, DeviceError> {
    let count = probe()?;
    let unavailable = DeviceError::Unavailable;
    if ordinal >= count {
        return Err(unavailable(format!("CUDA device {ordinal} requested, but {count} device(s) are visible")));
    }
    let ord = i32::try_from(ordinal).map_err(|_| unavailable(format!("CUDA device {ordinal}")))?;
    result::device::get(ord).map_err(|e| driver(&format!("cuDeviceGet({ordinal})"), e))
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

/// Any driver failure as [`DeviceError::Driver`], naming the call; a fault that poisons the
/// context (an illegal address, a device-side assert, …) as [`DeviceError::ContextLost`].
fn driver(call: &str, e: DriverError) -> DeviceError {
    let code = code_name(e);
    match crate::device::Fault::from_code(&code) {
        Some(fault) => DeviceError::ContextLost(crate::device::LostContext { fault, call: call.to_string() }),
        None => DeviceError::Driver(format!("{code} in {call}")),
    }
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
    /// Told which driver allocations are the allocator's own (see `device::driver`).
    sink: Option<DriverSink>,
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
    /// share). `Err(DeviceError::Unavailable(reason))` when there is no usable driver or device;
    /// never panics.
    pub fn new(ordinal: usize) -> Result<Self, DeviceError> {
        let count = probe()?;
        let unavailable = DeviceError::Unavailable;
        if ordinal >= count {
            return Err(unavailable(format!(
                "CUDA device {ordinal} requested, but {count} device(s) are visible (indices 0..{count})"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| {
            unavailable(format!("opening the context of CUDA device {ordinal} failed ({})", code_name(e)))
        })?;
        let total = ctx.total_mem().map_err(|e| {
            unavailable(format!("reading the memory size of CUDA device {ordinal} failed ({})", code_name(e)))
        })? as u64;
        let ordinal = i32::try_from(ordinal).map_err(|_| unavailable(format!("CUDA device {ordinal}")))?;
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
            sink: None,
        })
    }

    /// Tells the sink that the allocation at `addr` (a segment, a mapped page) is ours.
    fn claim(&self, addr: u64) {
        if let Some(sink) = self.sink {
            sink(&DriverEvent {
                call: DriverCall::Claim { addr },
                device: Some(self.ordinal),
                api: "gpumem-nb",
                ours: true,
            });
        }
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

    /// The device's 16-byte UUID (`cuDeviceGetUuid`), to find it in NVML ([`crate::device::nvml`]).
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

    fn set_driver_sink(&mut self, sink: DriverSink) {
        self.sink = Some(sink);
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

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        self.ctx.synchronize().map_err(|e| driver("cuCtxSynchronize", e))
    }

    fn synchronizer(&mut self) -> Option<crate::device::Synchronizer> {
        let ctx = self.ctx.clone();
        Some(Box::new(move || ctx.synchronize().map_err(|e| driver("cuCtxSynchronize", e))))
    }

    fn reserve(&mut self, size: u64, _stream: StreamId) -> Result<u64, DeviceError> {
        let bytes = to_usize(size)?;
        self.bind()?;
        // SAFETY: the context is bound to this thread; the result is a fresh device allocation
        // that nothing else refers to yet (the caller owns it until `release`).
        let addr = unsafe { result::malloc_sync(bytes) }.map_err(|e| oom_or_driver("cuMemAlloc_v2", e))?;
        self.segments.insert(addr, size);
        self.claim(addr);
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
            self.claim(page);
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
            Ok(u) => crate::device::nvml::process_memory(u).unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    /// The device's current memory pool (cudarc's `CudaSlice` allocates from it with
    /// `cuMemAllocAsync`), read with `cuMemPoolGetAttribute`.
    fn pool_usage(&mut self) -> Option<crate::device::PoolUsage> {
        if !self.ctx.has_async_alloc() || self.bind().is_err() {
            return None;
        }
        let pool = stacks::current_pool(self.ctx.cu_device())?;
        use sys::CUmemPool_attribute as A;
        Some(crate::device::PoolUsage {
            used: stacks::pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            reserved: stacks::pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            used_high: stacks::pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            reserved_high: stacks::pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
        })
    }

    fn reset_pool_high_water(&mut self) {
        if !self.ctx.has_async_alloc() || self.bind().is_err() {
            return;
        }
        let Some(pool) = stacks::current_pool(self.ctx.cu_device()) else { return };
        for attr in [
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        ] {
            let r = stacks::reset_pool_mark(pool, attr);
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

pub(crate) mod books;
pub(crate) mod cupti;
mod host;
mod stacks;
mod view;

pub use host::PinnedHostMemory;
pub use stacks::{LocalMemory, PoolTrim, primary_local_memory, reset_primary_pool_high, trim_primary_pool};

/// Device memory straight from the driver (`cuMemAlloc`), past any caching allocator: what a
/// foreign library does, for demos and tests of tracking. Freed (`cuMemFree`) on drop.
pub(crate) struct DriverAllocation {
    ctx: Arc<CudaContext>,
    addr: CUdeviceptr,
    size: u64,
}

impl std::fmt::Debug for DriverAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DriverAllocation {{ addr: {:#x}, size: {} }}", self.addr, self.size)
    }
}

impl DriverAllocation {
    /// `cuMemAlloc(size)` in `ctx`. `Err(OutOfMemory)` when the device is full.
    pub(crate) fn new(ctx: &Arc<CudaContext>, size: u64) -> Result<Self, DeviceError> {
        let bytes = to_usize(size)?;
        ctx.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        // SAFETY: the context is bound to this thread; the result is a fresh allocation owned by
        // the returned value alone, freed once in `drop`.
        let addr = unsafe { result::malloc_sync(bytes) }.map_err(|e| oom_or_driver("cuMemAlloc_v2", e))?;
        Ok(DriverAllocation { ctx: ctx.clone(), addr, size })
    }

    /// Device address.
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }
}

impl Drop for DriverAllocation {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `addr` came from cuMemAlloc in `new` and is freed exactly once, here;
            // nothing else holds it (no copies are handed out).
            self.ctx.record_err(unsafe { result::free_sync(self.addr) });
        }
    }
}
/// Caps the device's CUDA stream-ordered pool, what `cuMemAllocAsync` (cudarc's `CudaSlice`,
/// candle) draws from: a pool created with `maxSize = max_bytes` becomes the device's current
/// pool (`cuDeviceSetMemPool`), so the stream-ordered allocations made from now on fail with
/// `CUDA_ERROR_OUT_OF_MEMORY` once it would reserve more. Allocations already made stay in the
/// pool that made them; the new pool is kept for the life of the process (destroying the
/// current pool would put the uncapped default one back). Needs a driver of CUDA 12.2 or later,
/// the first to read `maxSize`. Returns the pool's handle.
pub(crate) fn cap_stream_ordered_pool(ctx: &Arc<CudaContext>, max_bytes: u64) -> Result<usize, DeviceError> {
    let max_size = to_usize(max_bytes)?;
    ctx.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
    let version = driver_version().unwrap_or(0);
    if version < 12020 {
        return Err(DeviceError::Driver(format!(
            "the driver (CUDA {}.{}) predates a pool's maxSize (CUDA 12.2): a pool made here would not be capped",
            version / 1000,
            version % 1000 / 10
        )));
    }
    let dev = ctx.cu_device();
    // SAFETY: `dev` is this context's device; both calls only read which pools it has.
    let (current, default) = unsafe { (result::device::get_mem_pool(dev), result::device::get_default_mem_pool(dev)) };
    let current = current.map_err(|e| driver("cuDeviceGetMemPool", e))?;
    if current != default.map_err(|e| driver("cuDeviceGetDefaultMemPool", e))? {
        return Err(DeviceError::Driver(
            "the device's current CUDA pool is not its default one: it was capped already, or another library set it"
                .into(),
        ));
    }
    let props = sys::CUmemPoolProps {
        allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        handleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: dev },
        win32SecurityAttributes: std::ptr::null_mut(),
        maxSize: max_size,
        usage: 0,
        reserved: [0; 54],
    };
    // SAFETY: the context is bound to this thread; `props` is a fully initialised
    // `CUmemPoolProps` in the CUDA 13.0 header's layout (cudarc's bindings), which drivers read
    // from CUDA 12.2 on (checked above), and it outlives the call; the pool returned is owned
    // here and kept for the life of the process once it is the device's pool.
    let pool = unsafe { result::mem_pool::create(&props) }.map_err(|e| driver("cuMemPoolCreate", e))?;
    // SAFETY: `dev` is this context's device and `pool` a live pool created for it just above.
    if let Err(e) = unsafe { result::device::set_mem_pool(dev, pool) } {
        // SAFETY: `pool` was created above, never handed out nor made current: destroyed once.
        let _ = unsafe { result::mem_pool::destroy(pool) };
        return Err(driver("cuDeviceSetMemPool", e));
    }
    Ok(pool as usize)
}

pub use view::{CudaView, CudaViewMut};

#[cfg(test)]
mod tests;
