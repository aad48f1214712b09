//! # gpumem-nb
//!
//! GPU memory, seen cell by cell, for people who write Rust in Jupyter: a PyTorch-exact CUDA
//! caching allocator over cudarc (and a simulated device, so everything runs without a GPU),
//! with PyTorch's statistics, `memory_summary()`, peak slots, history and snapshots that
//! PyTorch's own viewer opens, scoped measurement, the ipyexperiments helpers, pinned host
//! memory and inline rendering for evcxr.
//!
//! ## Layers
//! Each folder (or root file) uses only those on earlier lines, never a later one; in
//! non-test code the import graph has no cycle between them. `tests/layers.rs` reads this
//! list and checks every `crate::` path against it.
//!
//! 1. [`units`] — sizes, durations and dates for people.
//! 2. [`device`] — the device seam: the [`Backend`] trait and its vocabulary ([`StreamId`],
//!    [`DeviceError`], [`Element`]), [`device::cuda`] (cudarc, feature `cuda`), `device::sim`
//!    (simulated), `device::replay` (a trace's addresses), `device::nvml`.
//! 3. `record`, `stats` — what the policy writes as it runs: the event ring and stacks
//!    ([`TraceEntry`], [`RecordMode`]; stacks walked by framehop, symbolised late; evcxr's
//!    generated lines mapped to cell lines); the 122 `memory_stats()` counters, peak slots and
//!    the `memory_summary()` text.
//! 4. `policy`, `track` — PyTorch's caching policy as pure code: config
//!    ([`AllocatorConfig`]), rounding, pools, best fit, split and merge, events, release, GC,
//!    fraction, expandable segments, out-of-memory ([`AllocError`], [`OomReport`]), and our
//!    own compact policy (PyTorch's API and statistics, less reserved memory); the books
//!    of every driver allocation of the process, by source and owner.
//! 5. [`snapshot`], `error` — PyTorch's snapshot structure read back from the policy, its
//!    pickle and JSON writers (and JSON reader), the memory timeline, and two states compared
//!    allocation by allocation ([`SnapshotDiff`]); [`Error`] gathering every failure.
//! 6. `allocator` — [`CachingAllocator`]: the thread-safe front, `torch.cuda`'s memory API as
//!    methods.
//! 7. [`render`], `buffer`, [`replay`] — tables, charts and the offline snapshot page (plain
//!    data in, text/HTML/SVG out); [`DeviceBuffer`]; PyTorch traces replayed through the policy
//!    (exactly, or only their allocations and frees under any policy).
//! 8. `pinned` — [`PinnedBuffer`] and the caching [`HostAllocator`].
//! 9. [`notebook`] — the per-process anchor (with `device::cuda` and the unwinder's register and
//!    stack reads, the only `unsafe` code), the
//!    device registry ([`current`], [`device()`]), the kernel's control channel and its
//!    [`notebook::protocol`], the out-of-memory watch ([`notebook::oom`]), the per-cell
//!    [`notebook::report`] both kernels show and the stock evcxr kernel's hooks that show it
//!    ([`notebook::stock`]), [`scope`]s and the [`mem`] helpers.
//! 10. [`plan`] — will it fit: a session's recorded allocations replayed on a device of any size
//!     under each policy, and every reserved byte explained.
//! 11. [`frameworks`] — frameworks with their own books of device memory, watched from a
//!     notebook: cubecl's pools for burn (feature `cubecl`).
//!
//! Units: bytes everywhere in data; [`units`] formats them for people.
#![deny(unsafe_code)]

pub mod units;

pub mod device;

mod record;
mod stats;

mod policy;
mod track;

pub mod snapshot;

mod allocator;
mod error;

pub mod render;

mod buffer;
pub mod frameworks;
pub mod notebook;
mod pinned;
pub mod plan;
pub mod replay;

pub use notebook::tracking::top;
pub use notebook::{mem, metrics, scope, tracking};

// The allocator and its PyTorch-named API.
pub use allocator::{CachingAllocator, OomObserver, PeakSlot};
pub use device::any::AnyBackend;
pub use device::{Backend, BackendKind, DeviceError, Element, PoolUsage, ProcessMemory, StreamId};
pub use error::{AllocError, Error, OomReport, Result};
pub use notebook::registry::{DeviceSelection, current, device};
pub use policy::config::AllocatorConfig;
pub use policy::{
    Allocation, BlockId, BlockView, CachedClass, InvariantViolation, PoolKind, ReservedParts, SegmentView,
};
pub use stats::{DeviceStats, SlotPeaks, Stat};

/// The allocator of a device picked at run time (CUDA or simulated): what [`device`] and
/// [`current`] hand out, and what a [`DeviceBuffer`] allocates from.
pub type Allocator = CachingAllocator<AnyBackend>;

// History and snapshots.
pub use record::frames::Frame;
pub use record::frames::set_depth as set_stack_depth;
pub use record::history::{HistoryOptions, RecordMode, StackContext, TraceAction, TraceEntry};
pub use render::SnapshotFiles;
pub use snapshot::{MemoryTimeline, Snapshot, SnapshotDiff};

// Memory on the device and the host.
pub use buffer::DeviceBuffer;
pub use pinned::{HostAllocator, HostCacheState, HostMemoryKind, HostStats, PinnedBuffer};

// Measurement and the ipyexperiments helpers.
pub use mem::{Coverage, Filler, MemInfo, MemReading, PreloadReport};
pub use scope::{MemoryScope, ScopeReport, SnapshotError, SnapshotScope, measure, measure_with, save_memory_snapshot};

// What a notebook shows.
pub use render::chart::{Chart, ChartOptions, Series};
pub use render::reports::{MemoryStatsTable, MemorySummary, SegmentTable, SnapshotSummary};

/// This crate's version (gpumem-kernel checks that a notebook's `:dep gpumem-nb` matches it).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The cudarc this crate is built with (with its `driver` and `nvrtc` modules), for cells that
/// launch kernels on gpumem-nb buffers: its types are the ones `DeviceBuffer::cuda()` lends, so
/// no second `:dep cudarc` (and no version or feature mismatch) is needed.
#[cfg(feature = "cuda")]
pub use cudarc;
