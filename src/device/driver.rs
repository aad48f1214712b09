//! Driver allocations as events: what the CUDA driver was asked to allocate and release in this
//! process, by anyone (cudarc, candle, cuBLAS, the CUDA runtime, this crate's own allocator).
//!
//! Two sources produce them: CUPTI's driver-API callbacks on a GPU ([`super::cuda`], feature
//! `cuda`), and the simulated device, whose "driver" reports its own segments and pages and the
//! allocations made straight through it ([`super::sim::SimBackend::driver_alloc`]). Both hand
//! every event, synchronously on the allocating thread, to a [`DriverSink`]; the tracker above
//! (`crate::track`) keeps the books.
//!
//! Note [Sinks are data, not statics]: under evcxr every cell links its own copy of this crate,
//! statics and thread-locals included, and later cells run their own copy's code on objects an
//! earlier cell created. So a backend carries its sink as a field (set when the process's
//! device is opened), and CUPTI's callback reads the sink of the copy that subscribed, set by
//! that same copy just before. A backend also tells the sink which allocations are its own
//! ([`DriverCall::Claim`]) after the driver returns, since the callback cannot know.
#![forbid(unsafe_code)]

/// How the memory was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverKind {
    /// `cuMemAlloc` / `cuMemAllocPitch` (also `cudaMalloc`, `cudaMallocPitch`): plain device
    /// memory.
    Alloc,
    /// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync` (also `cudaMallocAsync`): from a
    /// stream-ordered pool; cudarc's `CudaSlice` and candle allocate here.
    Pool,
    /// `cuMemCreate`: physical memory for virtual-memory mappings (expandable segments, NCCL).
    Vmm,
    /// `cuMemAllocManaged`: unified memory.
    Managed,
    /// `cuMemHostAlloc` / `cuMemAllocHost`: page-locked host memory.
    HostPinned,
}

impl DriverKind {
    /// Every kind, in report order.
    pub const ALL: [DriverKind; 5] =
        [DriverKind::Alloc, DriverKind::Pool, DriverKind::Vmm, DriverKind::Managed, DriverKind::HostPinned];

    /// Whether the memory is on the host (no device).
    pub fn is_host(self) -> bool {
        self == DriverKind::HostPinned
    }
}

/// One driver call that allocated or released memory (or address space), decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverCall {
    /// Memory at `addr`: a plain, pool, managed or pinned-host allocation.
    Alloc {
        /// How.
        kind: DriverKind,
        /// Device (or host) address.
        addr: u64,
        /// Bytes (for pitched allocations: pitch × height).
        size: u64,
        /// The stream of a stream-ordered allocation (0 otherwise).
        stream: u64,
    },
    /// The allocation at `addr` was released.
    Free {
        /// Address.
        addr: u64,
    },
    /// `cuMemCreate`: `size` bytes of physical memory behind `handle`.
    Create {
        /// The generic allocation handle.
        handle: u64,
        /// Bytes.
        size: u64,
    },
    /// `cuMemRelease` of a handle (its memory goes once it is also unmapped everywhere).
    Release {
        /// Handle.
        handle: u64,
    },
    /// `cuMemRetainAllocationHandle`: one more reference to a handle.
    Retain {
        /// Handle.
        handle: u64,
    },
    /// `cuMemMap`: `handle`'s memory visible at `va`.
    Map {
        /// Virtual address.
        va: u64,
        /// Bytes mapped.
        size: u64,
        /// Handle.
        handle: u64,
    },
    /// `cuMemUnmap` of `size` bytes at `va`.
    Unmap {
        /// Virtual address.
        va: u64,
        /// Bytes.
        size: u64,
    },
    /// Not a driver call: gpumem-nb's caching allocator says the allocation it just made at
    /// `addr` (a segment, a mapped page run, a pinned host block) is its own.
    Claim {
        /// Address of the allocation (or of the mapping).
        addr: u64,
    },
    /// An allocation the driver refused for want of memory (`CUDA_ERROR_OUT_OF_MEMORY`): what
    /// was asked, whoever asked (a framework's out-of-memory, seen where it happens).
    Failed {
        /// How it was asked for.
        kind: DriverKind,
        /// Bytes asked for.
        size: u64,
    },
}

/// A driver call with where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverEvent {
    /// What it did.
    pub call: DriverCall,
    /// The device (CUDA ordinal), `None` for host memory or when it is not known.
    pub device: Option<i32>,
    /// The driver entry point (`"cuMemAllocAsync"`), or the simulated driver's name for it.
    pub api: &'static str,
    /// Whether gpumem-nb's own caching allocator made the call (its segments and pages, which
    /// it already accounts as reserved), when the source knows (the simulated device does;
    /// CUPTI's callback does not, and the backend sends a [`DriverCall::Claim`] afterwards).
    pub ours: bool,
}

/// Receives driver events, on the thread that made the call, while the call is in progress.
/// It must not call the CUDA driver, and must not take locks that code calling the driver may
/// hold (the allocator's lock may be held by the caller). See Note [Sinks are data, not
/// statics].
pub type DriverSink = fn(&DriverEvent);
