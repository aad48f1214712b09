//! Every allocation any code makes through the CUDA driver in this process, seen through
//! CUPTI's callback API: one subscriber, the driver-API domain, enabled per callback id. CUPTI
//! calls our callback synchronously on the thread that made the driver call, at entry and at
//! exit; we act only at exit: of a successful call, when the out-parameters (the new address,
//! the new handle) are filled in, and of an allocation refused with `CUDA_ERROR_OUT_OF_MEMORY`
//! (what it asked for: a framework's out-of-memory, seen where it happens); we decode the call
//! into a [`DriverEvent`] and hand it to the sink given to [`start`]. The runtime (`cudaMalloc`, `cudaMallocAsync`, `cudaMallocHost`), cuBLAS,
//! NCCL, cudarc and candle all end in these driver entry points.
//!
//! # Loading libcupti ourselves
//! cudarc 0.19's CUPTI loader tries bare sonames only (`libcupti.so` first, which may be another
//! toolkit's library), panics when none loads and panics on a missing symbol. So this module
//! loads one chosen absolute path itself (`GPUMEM_CUPTI_LIB`, a libcupti already mapped into the
//! process, `LD_LIBRARY_PATH`, `CUDA_HOME`/`CUDA_PATH`, conda, Python wheels'
//! `nvidia/cu13/lib` and `nvidia/cuda_cupti/lib`, `/usr/local/cuda*`, then bare sonames),
//! skips CUPTIs newer than the driver, resolves the few entry points with every C enum as
//! `u32` (so a newer libcupti's values can never be an invalid Rust enum), and never unloads
//! it. Only types come from `cudarc::cupti::sys`.
//!
//! # The callback's rules
//! It never unwinds into C (`catch_unwind`), never calls the driver (only `cuptiGetDeviceId`,
//! once per context), never re-enters itself (a thread-local guard), and holds no lock while
//! the sink runs. One subscriber per process is CUPTI's rule: while we are subscribed, Nsight
//! or `torch.profiler` cannot attach ([`stop`] lets them), and if one is attached first,
//! [`start`] says which.

use crate::device::{DeviceError, DriverCall, DriverEvent, DriverKind, DriverSink};
use crate::sync::lock;
use cudarc::cupti::sys::{
    self as cs, CUpti_CallbackData, CUpti_SubscriberHandle, CUpti_SubscriberParams,
    CUpti_driver_api_trace_cbid_enum as Cb,
};
use cudarc::driver::sys::{CUcontext, CUmemAllocationProp};
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, OsStr, c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Where decoded events go (the copy of the crate that subscribed set it: see Note [Sinks are
/// data, not statics] in `device::driver`).
static SINK: OnceLock<DriverSink> = OnceLock::new();
/// `CUcontext` -> device ordinal, filled by `cuptiGetDeviceId`.
static CTX_DEVICE: Mutex<Option<HashMap<usize, u32>>> = Mutex::new(None);
/// The subscriber handle while tracking (as usize: raw pointers are not Send).
static SUBSCRIBER: Mutex<Option<usize>> = Mutex::new(None);

thread_local! {
    /// Set while this thread is inside [`on_driver_api`]: a nested driver call must not
    /// re-enter the sink.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// Whether tracking is subscribed now.
#[cfg(test)]
fn is_started() -> bool {
    lock(&SUBSCRIBER).is_some()
}

// -------------------------------------------------------------------------------------------
// Loading

/// The callback type CUPTI calls (`CUpti_CallbackFunc`), with the C enum `domain` taken as a
/// plain `u32` (ABI-identical to the C `enum`, and never an invalid Rust enum value).
type RawCallback = unsafe extern "C" fn(userdata: *mut c_void, domain: u32, cbid: u32, cbdata: *const c_void);

type SubscribeFn = unsafe extern "C" fn(*mut CUpti_SubscriberHandle, Option<RawCallback>, *mut c_void) -> u32;
type Subscribe2Fn = unsafe extern "C" fn(
    *mut CUpti_SubscriberHandle,
    Option<RawCallback>,
    *mut c_void,
    *mut CUpti_SubscriberParams,
) -> u32;
type UnsubscribeFn = unsafe extern "C" fn(CUpti_SubscriberHandle) -> u32;
type EnableCallbackFn = unsafe extern "C" fn(u32, CUpti_SubscriberHandle, u32, u32) -> u32;
type GetDeviceIdFn = unsafe extern "C" fn(CUcontext, *mut u32) -> u32;
type GetVersionFn = unsafe extern "C" fn(*mut u32) -> u32;
type GetResultStringFn = unsafe extern "C" fn(u32, *mut *const c_char) -> u32;

/// CUPTI entry points of one loaded libcupti.
struct Cupti {
    /// The file that was loaded.
    path: PathBuf,
    /// `cuptiGetVersion`: the CUPTI API version (130001 for CUDA 13.0's CUPTI; 18..28 for 12.x).
    api_version: u32,
    subscribe: SubscribeFn,
    /// `cuptiSubscribe_v2` (CUPTI 13.0+): on error 39 it names the subscriber already there.
    subscribe_v2: Option<Subscribe2Fn>,
    unsubscribe: UnsubscribeFn,
    enable_callback: EnableCallbackFn,
    get_device_id: GetDeviceIdFn,
    get_result_string: GetResultStringFn,
    /// Keeps the library mapped; never dropped (the `OnceLock` below is never emptied).
    _lib: libloading::Library,
}

// SAFETY: `Cupti` holds plain `extern "C"` function pointers, a path, and a library handle that
// libloading already declares Send + Sync; CUPTI's entry points are thread-safe.
unsafe impl Send for Cupti {}
// SAFETY: as above; nothing in `Cupti` is mutated after construction.
unsafe impl Sync for Cupti {}

impl Cupti {
    /// `cuptiGetResultString`, or the number when CUPTI has no string for it.
    fn result_string(&self, code: u32) -> String {
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: `get_result_string` was resolved from libcupti under its documented name with
        // the documented signature (CUptiResult is a C enum, passed as u32); `s` is a valid
        // out-pointer on our stack.
        let r = unsafe { (self.get_result_string)(code, &mut s) };
        if r == 0 && !s.is_null() {
            // SAFETY: CUPTI returned success and a non-null pointer to a static, NUL-terminated
            // string (documented: "a constant string").
            let text = unsafe { CStr::from_ptr(s) };
            format!("{} ({code})", text.to_string_lossy())
        } else {
            format!("CUPTI error {code}")
        }
    }
}

static CUPTI: OnceLock<Result<Cupti, String>> = OnceLock::new();

/// The process-wide libcupti, loaded on first call. `Err` says why none could be used
/// (every candidate tried, each with its reason). Never panics.
fn get() -> Result<&'static Cupti, &'static str> {
    CUPTI.get_or_init(load_first).as_ref().map_err(|e| e.as_str())
}

fn load_first() -> Result<Cupti, String> {
    if !crate::device::cuda::library_present() {
        return Err("no CUDA driver here (libcuda.so cannot be loaded)".into());
    }
    let mut why = Vec::new();
    for cand in candidates() {
        match load(&cand) {
            Ok(c) => return Ok(c),
            Err(e) => why.push(format!("{}: {e}", cand.display())),
        }
    }
    Err(format!("no usable libcupti ({})", if why.is_empty() { "no candidates".into() } else { why.join("; ") }))
}

fn load(path: &Path) -> Result<Cupti, String> {
    use libloading::os::unix::{Library as UnixLib, RTLD_LOCAL, RTLD_NOW};
    // SAFETY: loading a shared library runs its initialisers. libcupti's are NVIDIA's and are
    // what every CUPTI user runs; RTLD_LOCAL keeps its symbols out of the global scope so it can
    // not interpose on anything loaded later (e.g. a different libcupti that PyTorch links).
    let lib: libloading::Library =
        unsafe { UnixLib::open(Some(path.as_os_str()), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| describe(&e))?.into();
    macro_rules! sym {
        ($name:literal, $ty:ty) => {{
            // SAFETY: the symbol is looked up by its exported C name, and `$ty` is the C
            // prototype from cupti_callbacks.h / cupti_activity.h / cupti_result.h with every
            // C enum spelled as u32 (same size and passing convention). The pointer stays valid
            // while `lib` is alive, and `lib` is stored next to it and never unloaded.
            unsafe { lib.get::<$ty>($name) }.map(|s| *s).map_err(|e| format!("{}: {}", $name, describe(&e)))
        }};
    }
    let subscribe = sym!("cuptiSubscribe", SubscribeFn)?;
    let subscribe_v2 = sym!("cuptiSubscribe_v2", Subscribe2Fn).ok();
    let unsubscribe = sym!("cuptiUnsubscribe", UnsubscribeFn)?;
    let enable_callback = sym!("cuptiEnableCallback", EnableCallbackFn)?;
    let get_device_id = sym!("cuptiGetDeviceId", GetDeviceIdFn)?;
    let get_version = sym!("cuptiGetVersion", GetVersionFn)?;
    let get_result_string = sym!("cuptiGetResultString", GetResultStringFn)?;
    let mut api_version = 0u32;
    // SAFETY: `get_version` has the C prototype `CUptiResult cuptiGetVersion(uint32_t*)`;
    // `api_version` is a valid out-pointer. It does not touch the driver.
    let r = unsafe { get_version(&mut api_version) };
    if r != 0 {
        return Err(format!("cuptiGetVersion failed ({r})"));
    }
    Ok(Cupti {
        path: path.to_path_buf(),
        api_version,
        subscribe,
        subscribe_v2,
        unsubscribe,
        enable_callback,
        get_device_id,
        get_result_string,
        _lib: lib,
    })
}

/// libloading's error with its source (the `dlerror()` text), which its Display leaves out.
fn describe(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(src) => format!("{e}: {src}"),
        None => e.to_string(),
    }
}

/// Sonames to look for in each directory, newest first. CUPTI is backward compatible with newer
/// drivers but not forward: a libcupti newer than the driver fails in `cuptiSubscribe`, so the
/// caller should put the driver's own major first (see [`candidates_for_driver`]).
const SONAMES: [&str; 3] = ["libcupti.so.13", "libcupti.so.12", "libcupti.so"];

#[cfg(target_arch = "aarch64")]
const TARGET_LIB: &str = "targets/sbsa-linux/lib";
#[cfg(not(target_arch = "aarch64"))]
const TARGET_LIB: &str = "targets/x86_64-linux/lib";

/// Ordered candidate files (absolute paths first, bare sonames last).
fn candidates() -> Vec<PathBuf> {
    candidates_for_driver(driver_major())
}

/// The CUDA driver's major version (13 for driver 580), if libcuda loads; never panics.
fn driver_major() -> Option<u32> {
    crate::device::cuda::driver_version().map(|v| v / 1000)
}

fn candidates_for_driver(driver_major: Option<u32>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut files: Vec<PathBuf> = Vec::new();

    // 1. Explicit override: a file, or a directory.
    if let Some(p) = std::env::var_os("GPUMEM_CUPTI_LIB") {
        let p = PathBuf::from(p);
        if p.is_dir() { dirs.push(p) } else { files.push(p) }
    }
    // 2. A libcupti already mapped into this process (e.g. PyTorch's): loading the same file
    //    again returns the same handle, so we share it instead of adding a second copy.
    files.extend(already_loaded());
    // 3. LD_LIBRARY_PATH, in order (what the user asked the dynamic loader to prefer).
    if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()));
    }
    // 4. A CUDA toolkit named by the environment.
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR"] {
        if let Some(root) = std::env::var_os(var) {
            dirs.extend(toolkit_dirs(Path::new(&root)));
        }
    }
    // 5. conda (cuda-cupti package: $PREFIX/lib and $PREFIX/targets/<arch>/lib).
    if let Some(prefix) = std::env::var_os("CONDA_PREFIX") {
        let prefix = PathBuf::from(prefix);
        dirs.push(prefix.join("lib"));
        dirs.push(prefix.join(TARGET_LIB));
    }
    // 6. Python wheels: nvidia-cuda-cupti (CUDA 13: site-packages/nvidia/cu13/lib) and
    //    nvidia-cuda-cupti-cu12 (site-packages/nvidia/cuda_cupti/lib).
    for sp in site_packages() {
        dirs.push(sp.join("nvidia/cu13/lib"));
        dirs.push(sp.join("nvidia/cuda_cupti/lib"));
    }
    // 7. System toolkits: /usr/local/cuda first, then /usr/local/cuda-X.Y newest first.
    dirs.extend(toolkit_dirs(Path::new("/usr/local/cuda")));
    for root in versioned_toolkits() {
        dirs.extend(toolkit_dirs(&root));
    }

    // Order sonames so the driver's own major comes first, and drop majors newer than it.
    let mut names: Vec<&str> = SONAMES.to_vec();
    if let Some(m) = driver_major {
        names.retain(|n| n.rsplit('.').next().and_then(|x| x.parse::<u32>().ok()).is_none_or(|x| x <= m));
        names.sort_by_key(|n| n.rsplit('.').next().and_then(|x| x.parse::<u32>().ok()) != Some(m));
    }
    for d in &dirs {
        for n in &names {
            let f = d.join(n);
            if f.is_file() {
                files.push(f);
            }
        }
    }
    // 8. Bare sonames last: RUNPATH of the executable, LD_LIBRARY_PATH, ld.so.cache, /lib, /usr/lib.
    files.extend(names.iter().map(PathBuf::from));

    // Same file reached twice (symlinks, overlapping variables): keep the first.
    let mut seen = std::collections::HashSet::new();
    files.retain(|f| seen.insert(std::fs::canonicalize(f).unwrap_or_else(|_| f.clone())));
    files
}

fn toolkit_dirs(root: &Path) -> [PathBuf; 4] {
    [root.join("extras/CUPTI/lib64"), root.join(TARGET_LIB), root.join("lib64"), root.join("lib")]
}

/// `/usr/local/cuda-X.Y`, newest version first.
fn versioned_toolkits() -> Vec<PathBuf> {
    let mut v: Vec<((u32, u32), PathBuf)> = std::fs::read_dir("/usr/local")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let ver = name.to_str()?.strip_prefix("cuda-")?.to_owned();
            let mut it = ver.split('.').map(|x| x.parse::<u32>().ok());
            let major = it.next()??;
            let minor = it.next().flatten().unwrap_or(0);
            Some(((major, minor), e.path()))
        })
        .collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.0));
    v.into_iter().map(|(_, p)| p).collect()
}

/// Plausible Python `site-packages` directories, without running Python: the active venv or
/// conda env, the user site, and the system ones.
fn site_packages() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(r) = std::env::var_os(var) {
            roots.push(PathBuf::from(r).join("lib"));
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(home).join(".local/lib"));
    }
    roots.push("/usr/local/lib".into());
    roots.push("/usr/lib".into());
    let mut out = Vec::new();
    for r in roots {
        let Ok(rd) = std::fs::read_dir(&r) else {
            continue;
        };
        let mut pys: Vec<PathBuf> = rd
            .flatten()
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("python3")))
            .map(|e| e.path())
            .collect();
        pys.sort();
        pys.reverse();
        for py in pys {
            out.push(py.join("site-packages"));
            out.push(py.join("dist-packages"));
        }
    }
    if let Some(pp) = std::env::var_os("PYTHONPATH") {
        out.extend(std::env::split_paths(&pp));
    }
    out
}

/// Paths of any `libcupti.so*` already mapped into this process (from `/proc/self/maps`).
fn already_loaded() -> Vec<PathBuf> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        // address perms offset dev inode pathname
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let p = Path::new(path);
        if p.file_name().and_then(OsStr::to_str).is_some_and(|n| n.starts_with("libcupti.so"))
            && !out.iter().any(|o| o == p)
        {
            out.push(p.to_path_buf());
        }
    }
    out
}

// -------------------------------------------------------------------------------------------
// Callback ids

const DRIVER_DOMAIN: u32 = cs::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API as u32;
const API_EXIT: u32 = cs::CUpti_ApiCallbackSite::CUPTI_API_EXIT as u32;

const MEM_ALLOC_V2: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2 as u32; // 243
const MEM_ALLOC_PITCH_V2: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2 as u32; // 244
const MEM_FREE_V2: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2 as u32; // 245
const MEM_ALLOC_HOST_V2: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2 as u32; // 294
const MEM_HOST_ALLOC: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc as u32; // 39
const MEM_FREE_HOST: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost as u32; // 38
const MEM_ALLOC_MANAGED: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged as u32; // 371
const MEM_CREATE: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemCreate as u32; // 549
const MEM_RELEASE: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemRelease as u32; // 550
const MEM_MAP: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemMap as u32; // 551
const MEM_UNMAP: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemUnmap as u32; // 552
const MEM_RETAIN_ALLOCATION_HANDLE: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemRetainAllocationHandle as u32; // 565
const MEM_ALLOC_ASYNC: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync as u32; // 598
const MEM_ALLOC_ASYNC_PTSZ: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz as u32; // 599
const MEM_FREE_ASYNC: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync as u32; // 600
const MEM_FREE_ASYNC_PTSZ: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz as u32; // 601
const MEM_ALLOC_FROM_POOL_ASYNC: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync as u32; // 611
const MEM_ALLOC_FROM_POOL_ASYNC_PTSZ: u32 = Cb::CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz as u32; // 612

/// Calls that make a CUDA context (or take the primary one): seen, not decoded, so that what
/// reads a device's context knows there is one to read ([`context_seen`]) without starting CUDA
/// itself in a process that never touched the GPU.
const CONTEXT_IDS: [u32; 4] = [
    Cb::CUPTI_DRIVER_TRACE_CBID_cuCtxCreate_v2 as u32,
    Cb::CUPTI_DRIVER_TRACE_CBID_cuCtxCreate_v3 as u32,
    Cb::CUPTI_DRIVER_TRACE_CBID_cuCtxCreate_v4 as u32,
    Cb::CUPTI_DRIVER_TRACE_CBID_cuDevicePrimaryCtxRetain as u32,
];

/// Whether a context call succeeded in this process since tracking began.
static CONTEXT_SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether code of this process made (or took) a CUDA context since tracking began.
pub(crate) fn context_seen() -> bool {
    CONTEXT_SEEN.load(std::sync::atomic::Ordering::Relaxed)
}

/// Every id [`start`] enables, with its name (the driver domain; never the whole domain, so
/// launches, copies and event queries never reach the callback). Address-space reservations
/// (`cuMemAddressReserve`) are not memory and are left out.
pub(crate) const CALLBACK_IDS: [(u32, &str); 18] = [
    (MEM_ALLOC_V2, "cuMemAlloc_v2"),
    (MEM_ALLOC_PITCH_V2, "cuMemAllocPitch_v2"),
    (MEM_FREE_V2, "cuMemFree_v2"),
    (MEM_ALLOC_ASYNC, "cuMemAllocAsync"),
    (MEM_ALLOC_ASYNC_PTSZ, "cuMemAllocAsync_ptsz"),
    (MEM_ALLOC_FROM_POOL_ASYNC, "cuMemAllocFromPoolAsync"),
    (MEM_ALLOC_FROM_POOL_ASYNC_PTSZ, "cuMemAllocFromPoolAsync_ptsz"),
    (MEM_FREE_ASYNC, "cuMemFreeAsync"),
    (MEM_FREE_ASYNC_PTSZ, "cuMemFreeAsync_ptsz"),
    (MEM_CREATE, "cuMemCreate"),
    (MEM_RELEASE, "cuMemRelease"),
    (MEM_MAP, "cuMemMap"),
    (MEM_UNMAP, "cuMemUnmap"),
    (MEM_RETAIN_ALLOCATION_HANDLE, "cuMemRetainAllocationHandle"),
    (MEM_ALLOC_MANAGED, "cuMemAllocManaged"),
    (MEM_HOST_ALLOC, "cuMemHostAlloc"),
    (MEM_ALLOC_HOST_V2, "cuMemAllocHost_v2"),
    (MEM_FREE_HOST, "cuMemFreeHost"),
];

// -------------------------------------------------------------------------------------------
// Start / stop

/// What [`start`] found.
#[derive(Clone, Debug)]
pub(crate) struct Started {
    /// The libcupti that was loaded.
    pub(crate) cupti_path: String,
    /// `cuptiGetVersion` (130001 for CUDA 13.0's CUPTI).
    pub(crate) cupti_api_version: u32,
}

/// Loads libcupti (without panicking), subscribes, and enables exactly [`CALLBACK_IDS`];
/// from then on every matching driver call is decoded and handed to `sink` on the calling
/// thread. Idempotent (the first sink stays). `Err(Unavailable)` is one line fit for
/// "tracking: unavailable (…)".
pub(crate) fn start(sink: DriverSink) -> Result<Started, DeviceError> {
    let _ = SINK.set(sink);
    let cupti = get().map_err(|e| DeviceError::Unavailable(e.to_string()))?;
    let mut sub = lock(&SUBSCRIBER);
    if sub.is_some() {
        return Ok(Started { cupti_path: cupti.path.display().to_string(), cupti_api_version: cupti.api_version });
    }
    let mut handle: CUpti_SubscriberHandle = std::ptr::null_mut();
    let mut old_name = [0 as c_char; 128];
    let r = match cupti.subscribe_v2 {
        Some(subscribe_v2) => {
            // SAFETY: all-zero is a valid CUpti_SubscriberParams (integers and null pointers).
            let mut params: CUpti_SubscriberParams = unsafe { std::mem::zeroed() };
            // The 13.0 layout (32 bytes). A newer libcupti reads structSize and treats the later
            // fields (13.2's allowMultipleSubscribers) as absent.
            params.structSize = std::mem::size_of::<CUpti_SubscriberParams>();
            params.subscriberName = c"gpumem-nb".as_ptr();
            params.oldSubscriberName = old_name.as_mut_ptr();
            // One byte short of the buffer: the last byte stays NUL whatever CUPTI writes.
            params.oldSubscriberSize = old_name.len() - 1;
            // SAFETY: prototype `CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle*,
            // CUpti_CallbackFunc, void*, CUpti_SubscriberParams*)` (CUPTI 13.0). `handle` and
            // `params` are valid for the call; CUPTI copies the name; `old_name` outlives the
            // call and its size is passed. `on_driver_api` is a `'static` function with the
            // callback ABI; userdata is null (the tracker's state is in statics).
            unsafe { subscribe_v2(&mut handle, Some(on_driver_api), std::ptr::null_mut(), &mut params) }
        }
        // SAFETY: prototype `CUptiResult cuptiSubscribe(CUpti_SubscriberHandle*,
        // CUpti_CallbackFunc, void*)`; same reasoning as above.
        None => unsafe { (cupti.subscribe)(&mut handle, Some(on_driver_api), std::ptr::null_mut()) },
    };
    const MULTIPLE_SUBSCRIBERS: u32 = cs::CUptiResult::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED as u32; // 39
    const MAX_LIMIT_REACHED: u32 = cs::CUptiResult::CUPTI_ERROR_MAX_LIMIT_REACHED as u32; // 12, CUPTI before ~11.x
    if r == MULTIPLE_SUBSCRIBERS || r == MAX_LIMIT_REACHED {
        // SAFETY: `old_name` is zero-initialised and CUPTI was told its size minus one, so the
        // last byte is still NUL and `from_ptr` stops inside the array.
        let who = unsafe { std::ffi::CStr::from_ptr(old_name.as_ptr()) }.to_string_lossy().into_owned();
        let who =
            if who.is_empty() { "e.g. Nsight Systems/Compute, compute-sanitizer, torch.profiler".into() } else { who };
        return Err(DeviceError::Unavailable(format!(
            "another CUPTI subscriber is active ({who}; {})",
            cupti.result_string(r)
        )));
    }
    if r != 0 || handle.is_null() {
        return Err(DeviceError::Unavailable(format!(
            "cuptiSubscribe failed: {}; libcupti {}",
            cupti.result_string(r),
            cupti.path.display()
        )));
    }
    // Ids CUPTI refused to enable (unknown to that libcupti); tracking goes on without them.
    let mut not_enabled = Vec::new();
    for (id, name) in CALLBACK_IDS {
        // SAFETY: prototype `CUptiResult cuptiEnableCallback(uint32_t enable,
        // CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId)`; `handle` was just
        // returned by a successful subscribe and is not yet unsubscribed.
        let r = unsafe { (cupti.enable_callback)(1, handle, DRIVER_DOMAIN, id) };
        if r != 0 {
            not_enabled.push(name);
        }
    }
    for id in CONTEXT_IDS {
        // SAFETY: as above; an id this libcupti does not know is refused and left out.
        let _ = unsafe { (cupti.enable_callback)(1, handle, DRIVER_DOMAIN, id) };
    }
    if not_enabled.len() == CALLBACK_IDS.len() {
        // SAFETY: `handle` is our live subscriber; unsubscribing it once is what the API expects.
        unsafe { (cupti.unsubscribe)(handle) };
        return Err(DeviceError::Unavailable("CUPTI enabled none of the allocation callbacks".into()));
    }
    *sub = Some(handle as usize);
    Ok(Started { cupti_path: cupti.path.display().to_string(), cupti_api_version: cupti.api_version })
}

/// Unsubscribes (so a profiler can attach); [`start`] may be called again. Callbacks already
/// running on other threads finish against the same sink.
pub(crate) fn stop() -> Result<(), DeviceError> {
    let Some(h) = lock(&SUBSCRIBER).take() else {
        return Ok(());
    };
    let cupti = get().map_err(|e| DeviceError::Unavailable(e.to_string()))?;
    // SAFETY: `h` is the handle of our successful subscribe, taken out of SUBSCRIBER so it is
    // unsubscribed exactly once.
    let r = unsafe { (cupti.unsubscribe)(h as CUpti_SubscriberHandle) };
    if r == 0 {
        Ok(())
    } else {
        Err(DeviceError::Driver(format!("cuptiUnsubscribe failed: {}", cupti.result_string(r))))
    }
}

// -------------------------------------------------------------------------------------------
// The callback

/// CUPTI's callback (`CUpti_CallbackFunc`).
///
/// # Safety
/// Called by CUPTI only, with `cbdata` pointing at a `CUpti_CallbackData` valid for the
/// duration of the call (domain == driver API).
unsafe extern "C" fn on_driver_api(_userdata: *mut c_void, domain: u32, cbid: u32, cbdata: *const c_void) {
    if domain != DRIVER_DOMAIN || cbdata.is_null() {
        return;
    }
    let data = cbdata.cast::<CUpti_CallbackData>();
    // SAFETY: CUPTI passes a valid CUpti_CallbackData for driver-domain callbacks, alive for
    // this call. We read `callbackSite` through a u32 pointer (it is a C enum, 4 bytes, at
    // offset 0), never as the Rust enum, so no value can be invalid.
    let site = unsafe { std::ptr::addr_of!((*data).callbackSite).cast::<u32>().read() };
    if site != API_EXIT {
        return;
    }
    // SAFETY: field reads of the same valid struct (raw-place projections; no reference to the
    // whole struct is made).
    let (ret, params, ctx, name) =
        unsafe { ((*data).functionReturnValue, (*data).functionParams, (*data).context, (*data).functionName) };
    if ret.is_null() || params.is_null() {
        return;
    }
    // SAFETY: at API exit, for the driver domain, `functionReturnValue` points at the call's
    // CUresult (a C enum: 4 bytes); read as u32, not as cudarc's Rust enum.
    let status = unsafe { ret.cast::<u32>().read() };
    if CONTEXT_IDS.contains(&cbid) {
        if status == 0 {
            CONTEXT_SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        return;
    }
    let decoded = match status {
        // SAFETY: `params` is the `<function>_params` struct for `cbid` (CUPTI contract); `decode`
        // only casts it to the struct that matches `cbid`, at exit, after a successful call.
        0 => unsafe { decode(cbid, params) },
        // A refused allocation: what it asked for (its in-parameters only; nothing was written).
        // SAFETY: as above, for `decode_refused`'s contract (the call failed: no out-pointer is
        // read).
        OUT_OF_MEMORY => unsafe { decode_refused(cbid, params) },
        _ => None, // other failed calls allocate nothing
    };
    let Some(decoded) = decoded else {
        return;
    };
    // `try_with` cannot fail for a const-initialised Cell (no destructor), but never panic here.
    if IN_CALLBACK.try_with(|c| c.replace(true)).unwrap_or(true) {
        return;
    }
    let api = api_name(cbid, name);
    // Never unwind into C: a panic here would abort the process (extern "C"), so catch it.
    let _ = std::panic::catch_unwind(|| {
        let (call, device) = decoded;
        let device = match call {
            DriverCall::Alloc { kind: DriverKind::HostPinned, .. }
            | DriverCall::Failed { kind: DriverKind::HostPinned, .. } => None,
            DriverCall::Create { .. } | DriverCall::Failed { kind: DriverKind::Vmm, .. } => device,
            _ => context_device(ctx),
        };
        if let Some(sink) = SINK.get() {
            sink(&DriverEvent { call, device: device.map(|d| d as i32), api, ours: false });
        }
    });
    let _ = IN_CALLBACK.try_with(|c| c.set(false));
}

/// The static name for `cbid` (functionName is a global constant too, but a `&'static str` of
/// our own avoids keeping C pointers around).
fn api_name(cbid: u32, _c_name: *const c_char) -> &'static str {
    CALLBACK_IDS.iter().find(|(id, _)| *id == cbid).map_or("?", |(_, n)| n)
}

/// # Safety
/// `params` must point at the CUPTI `*_params` struct of `cbid`, at API exit of a successful
/// call (so its out-pointers were written and point at live caller memory).
unsafe fn decode(cbid: u32, params: *const c_void) -> Option<(DriverCall, Option<u32>)> {
    // SAFETY: (a) the caller guarantees `params` is the `<api>_params` struct of `cbid`, and each
    // arm casts it to exactly the struct cudarc::cupti::sys mirrors for that id (from CUPTI's
    // generated_cuda_meta.h); (b) at the exit of a successful call every out-pointer (dptr, pp,
    // pPitch, handle, ptr) has been written by the driver and points at the caller's storage,
    // alive until the call returns; (c) `prop` goes to `prop_device`, which accepts null. Every
    // read is by value; no reference outlives this function.
    let d = unsafe {
        match cbid {
            MEM_ALLOC_V2 => {
                let p = params.cast::<cs::cuMemAlloc_v2_params>();
                DriverCall::Alloc { kind: DriverKind::Alloc, addr: *(*p).dptr, size: (*p).bytesize as u64, stream: 0 }
            }
            MEM_ALLOC_PITCH_V2 => {
                let p = params.cast::<cs::cuMemAllocPitch_v2_params>();
                let size = (*(*p).pPitch as u64) * ((*p).Height as u64);
                DriverCall::Alloc { kind: DriverKind::Alloc, addr: *(*p).dptr, size, stream: 0 }
            }
            MEM_ALLOC_ASYNC => {
                let p = params.cast::<cs::cuMemAllocAsync_params>();
                DriverCall::Alloc {
                    kind: DriverKind::Pool,
                    addr: *(*p).dptr,
                    size: (*p).bytesize as u64,
                    stream: (*p).hStream as u64,
                }
            }
            MEM_ALLOC_ASYNC_PTSZ => {
                let p = params.cast::<cs::cuMemAllocAsync_ptsz_params>();
                DriverCall::Alloc {
                    kind: DriverKind::Pool,
                    addr: *(*p).dptr,
                    size: (*p).bytesize as u64,
                    stream: (*p).hStream as u64,
                }
            }
            MEM_ALLOC_FROM_POOL_ASYNC => {
                let p = params.cast::<cs::cuMemAllocFromPoolAsync_params>();
                DriverCall::Alloc {
                    kind: DriverKind::Pool,
                    addr: *(*p).dptr,
                    size: (*p).bytesize as u64,
                    stream: (*p).hStream as u64,
                }
            }
            MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => {
                let p = params.cast::<cs::cuMemAllocFromPoolAsync_ptsz_params>();
                DriverCall::Alloc {
                    kind: DriverKind::Pool,
                    addr: *(*p).dptr,
                    size: (*p).bytesize as u64,
                    stream: (*p).hStream as u64,
                }
            }
            MEM_ALLOC_MANAGED => {
                let p = params.cast::<cs::cuMemAllocManaged_params>();
                DriverCall::Alloc { kind: DriverKind::Managed, addr: *(*p).dptr, size: (*p).bytesize as u64, stream: 0 }
            }
            MEM_HOST_ALLOC => {
                let p = params.cast::<cs::cuMemHostAlloc_params>();
                DriverCall::Alloc {
                    kind: DriverKind::HostPinned,
                    addr: *(*p).pp as u64,
                    size: (*p).bytesize as u64,
                    stream: 0,
                }
            }
            MEM_ALLOC_HOST_V2 => {
                let p = params.cast::<cs::cuMemAllocHost_v2_params>();
                DriverCall::Alloc {
                    kind: DriverKind::HostPinned,
                    addr: *(*p).pp as u64,
                    size: (*p).bytesize as u64,
                    stream: 0,
                }
            }
            MEM_FREE_V2 => DriverCall::Free { addr: (*params.cast::<cs::cuMemFree_v2_params>()).dptr },
            MEM_FREE_ASYNC => {
                let p = params.cast::<cs::cuMemFreeAsync_params>();
                DriverCall::Free { addr: (*p).dptr }
            }
            MEM_FREE_ASYNC_PTSZ => {
                let p = params.cast::<cs::cuMemFreeAsync_ptsz_params>();
                DriverCall::Free { addr: (*p).dptr }
            }
            MEM_FREE_HOST => DriverCall::Free { addr: (*params.cast::<cs::cuMemFreeHost_params>()).p as u64 },
            MEM_CREATE => {
                let p = params.cast::<cs::cuMemCreate_params>();
                return Some((
                    DriverCall::Create { handle: *(*p).handle, size: (*p).size as u64 },
                    prop_device((*p).prop),
                ));
            }
            MEM_RELEASE => DriverCall::Release { handle: (*params.cast::<cs::cuMemRelease_params>()).handle },
            MEM_MAP => {
                let p = params.cast::<cs::cuMemMap_params>();
                DriverCall::Map { va: (*p).ptr, size: (*p).size as u64, handle: (*p).handle }
            }
            MEM_UNMAP => {
                let p = params.cast::<cs::cuMemUnmap_params>();
                DriverCall::Unmap { va: (*p).ptr, size: (*p).size as u64 }
            }
            MEM_RETAIN_ALLOCATION_HANDLE => {
                DriverCall::Retain { handle: *(*params.cast::<cs::cuMemRetainAllocationHandle_params>()).handle }
            }
            _ => return None,
        }
    };
    Some((d, None))
}

/// `CUDA_ERROR_OUT_OF_MEMORY`, as the callback reads a CUresult (a u32).
const OUT_OF_MEMORY: u32 = cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY as u32;

/// What a refused allocation asked for: its kind and size, from its in-parameters.
///
/// # Safety
/// `params` must point at the CUPTI `*_params` struct of `cbid`, at API exit of a call that
/// failed (its out-pointers may be unwritten: none is read here; the in-parameters are the
/// caller's values, alive until the call returns).
unsafe fn decode_refused(cbid: u32, params: *const c_void) -> Option<(DriverCall, Option<u32>)> {
    // SAFETY: (a) the caller guarantees `params` is the `<api>_params` struct of `cbid`, and each
    // arm casts it to exactly the struct cudarc::cupti::sys mirrors for that id; (b) only
    // by-value in-parameters are read (sizes, heights, the property block's pointer), never an
    // out-pointer; (c) `pPitch` is an out-pointer, so a refused pitched allocation is sized by
    // its width in bytes times its height, what it asked for before any pitch was chosen.
    let d = unsafe {
        match cbid {
            MEM_ALLOC_V2 => {
                let p = params.cast::<cs::cuMemAlloc_v2_params>();
                (DriverKind::Alloc, (*p).bytesize as u64, None)
            }
            MEM_ALLOC_PITCH_V2 => {
                let p = params.cast::<cs::cuMemAllocPitch_v2_params>();
                (DriverKind::Alloc, ((*p).WidthInBytes as u64) * ((*p).Height as u64), None)
            }
            MEM_ALLOC_ASYNC => (DriverKind::Pool, (*params.cast::<cs::cuMemAllocAsync_params>()).bytesize as u64, None),
            MEM_ALLOC_ASYNC_PTSZ => {
                (DriverKind::Pool, (*params.cast::<cs::cuMemAllocAsync_ptsz_params>()).bytesize as u64, None)
            }
            MEM_ALLOC_FROM_POOL_ASYNC => {
                (DriverKind::Pool, (*params.cast::<cs::cuMemAllocFromPoolAsync_params>()).bytesize as u64, None)
            }
            MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => {
                (DriverKind::Pool, (*params.cast::<cs::cuMemAllocFromPoolAsync_ptsz_params>()).bytesize as u64, None)
            }
            MEM_ALLOC_MANAGED => {
                (DriverKind::Managed, (*params.cast::<cs::cuMemAllocManaged_params>()).bytesize as u64, None)
            }
            MEM_HOST_ALLOC => {
                (DriverKind::HostPinned, (*params.cast::<cs::cuMemHostAlloc_params>()).bytesize as u64, None)
            }
            MEM_ALLOC_HOST_V2 => {
                (DriverKind::HostPinned, (*params.cast::<cs::cuMemAllocHost_v2_params>()).bytesize as u64, None)
            }
            MEM_CREATE => {
                let p = params.cast::<cs::cuMemCreate_params>();
                (DriverKind::Vmm, (*p).size as u64, prop_device((*p).prop))
            }
            _ => return None,
        }
    };
    let (kind, size, device) = d;
    Some((DriverCall::Failed { kind, size }, device))
}

/// The device of a `cuMemCreate` property block, if it names one.
///
/// # Safety
/// `prop` is null or points at the caller's `CUmemAllocationProp` (alive during the callback).
unsafe fn prop_device(prop: *const CUmemAllocationProp) -> Option<u32> {
    if prop.is_null() {
        return None;
    }
    const DEVICE: u32 = cudarc::driver::sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32;
    // SAFETY: `prop` is valid (caller). `location.type_` is a C enum read as u32 (a newer driver
    // may use values cudarc's enum lacks); `location.id` is a plain c_int. The field offsets are
    // the same in the 13.0 struct and in 13.2's union form.
    let (ty, id) = unsafe {
        (
            std::ptr::addr_of!((*prop).location.type_).cast::<u32>().read(),
            std::ptr::addr_of!((*prop).location.id).read(),
        )
    };
    (ty == DEVICE && id >= 0).then_some(id as u32)
}

/// Device ordinal of a context, cached; `cuptiGetDeviceId` is called at most once per context,
/// never under the state lock.
fn context_device(ctx: CUcontext) -> Option<u32> {
    if ctx.is_null() {
        return None;
    }
    let key = ctx as usize;
    if let Some(d) = lock(&CTX_DEVICE).as_ref().and_then(|m| m.get(&key).copied()) {
        return Some(d);
    }
    let cupti = get().ok()?;
    let mut dev = u32::MAX;
    // SAFETY: prototype `CUptiResult cuptiGetDeviceId(CUcontext, uint32_t*)`; `ctx` is the
    // context current on this thread during the API call (from CUpti_CallbackData), `dev` a
    // valid out-pointer. Calling CUPTI from its own callback is what NVIDIA's samples do
    // (cuptiDeviceGetTimestamp(cbInfo->context)); should it reach the driver's public entry
    // points, none of those ids is enabled, and IN_CALLBACK (set by our caller) drops re-entry.
    let r = unsafe { (cupti.get_device_id)(ctx, &mut dev) };
    if r != 0 || dev == u32::MAX {
        return None;
    }
    lock(&CTX_DEVICE).get_or_insert_with(HashMap::new).insert(key, dev);
    Some(dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_sonames_come_last_and_respect_the_driver() {
        let c = candidates_for_driver(Some(12));
        let tail: Vec<_> = c.iter().rev().take(2).rev().map(|p| p.display().to_string()).collect();
        assert_eq!(tail, ["libcupti.so.12", "libcupti.so"]);
        assert!(!c.iter().any(|p| p.ends_with("libcupti.so.13")), "a CUPTI newer than the driver is skipped");
        let c = candidates_for_driver(None);
        assert!(c.iter().any(|p| p.as_os_str() == "libcupti.so.13"));
    }

    #[test]
    fn loading_fails_cleanly_without_cupti() {
        // Without a driver, or without libcupti, an Err in one line naming why (every candidate
        // tried); with both, Ok. Starting is then the same error, never a panic.
        match get() {
            Ok(c) => assert!(c.api_version > 0),
            Err(e) => {
                assert!(e.starts_with("no usable libcupti") || e.starts_with("no CUDA driver"), "{e}");
                assert!(!e.contains('\n'));
                fn sink(_: &DriverEvent) {}
                let err = start(sink).unwrap_err();
                assert_eq!(err, DeviceError::Unavailable(e.to_string()));
                assert!(!is_started());
            }
        }
    }
}
