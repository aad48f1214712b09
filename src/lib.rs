//! # gpumem-nb
//!
//! GPU memory, seen cell by cell, for people who write Rust in Jupyter: a PyTorch-exact CUDA
//! caching allocator over cudarc (and a simulated device, so everything runs without a GPU),
//! with PyTorch's statistics, `memory_summary()`, peak slots, and a trace replayer.
//!
//! ## Layers (each depends only on those above it in this list)
//! 1. [`backend`] — the device seam: [`backend::cuda`] (cudarc, feature `cuda`),
//!    [`backend::sim`] (simulated), [`backend::replay`] (recorded addresses).
//! 2. [`policy`] — PyTorch's caching policy as pure code: rounding, pools, best fit, split and
//!    merge, events, release, GC, fraction, expandable segments. No `unsafe`, no device.
//! 3. [`stats`] / [`summary`] — `memory_stats()` (122 keys), resets, peak slots, the summary.
//! 4. [`history`] — PyTorch's trace vocabulary and the event ring.
//! 5. [`allocator`] — the thread-safe front, one per device; [`trace`] — replay of recorded
//!    PyTorch traces.
//!
//! Units: bytes everywhere in data; [`units`] formats them for people.

pub mod allocator;
pub mod anchor;
pub mod backend;
pub mod buffer;
pub mod config;
pub mod control;
pub mod error;
pub mod frames;
pub mod history;
pub mod mem;
pub mod pinned;
pub mod policy;
pub mod registry;
pub mod render;
pub mod scope;
pub mod snapshot;
pub mod stats;
pub mod summary;
pub mod trace;
pub mod units;

pub use allocator::{CachingAllocator, PeakSlot};
pub use backend::any::AnyBackend;
pub use backend::{Backend, BackendKind, DeviceError, StreamId};
pub use buffer::{DeviceBuffer, Element};
pub use config::AllocatorConfig;
pub use error::{AllocError, Error, OomReport, Result};
pub use history::{HistoryOptions, RecordMode, StackContext, TraceAction, TraceEntry};
pub use policy::{Allocation, BlockId, DeviceState};
pub use registry::{DeviceSelection, current, device};
pub use stats::{DeviceStats, SlotPeaks};

/// The allocator of a device picked at run time (CUDA or simulated): what [`registry::device`]
/// and [`registry::current`] hand out, and what a [`DeviceBuffer`] allocates from.
pub type Allocator = CachingAllocator<AnyBackend>;
pub use render::charts::{Chart, ChartOptions, MemoryTimeline, Series};
pub use render::reports::{MemoryStatsTable, MemorySummary, SegmentTable, SnapshotSummary};

// Scopes, the ipyexperiments helpers, pinned host memory.
pub use mem::{Coverage, Filler, MemInfo, MemReading, PreloadReport};
pub use pinned::{HostAllocator, HostStats, PinnedBuffer};
pub use scope::{MemoryScope, ScopeReport, SnapshotError, SnapshotScope, measure, measure_with, save_memory_snapshot};
