//! # gpumem-nb
//!
//! GPU memory, seen cell by cell, for people who write Rust in Jupyter: a PyTorch-exact CUDA
//! caching allocator over cudarc (and a simulated device, so everything runs without a GPU),
//! with PyTorch's statistics, `memory_summary()`, peak slots, history and snapshots that
//! PyTorch's own viewer opens, scoped measurement, the ipyexperiments helpers, pinned host
//! memory and inline rendering for evcxr.
//!
//! ## Where things are
//! The root holds the everyday names: [`current`] and [`device()`] (the allocator of a device),
//! [`DeviceBuffer`], the allocator's types, its errors and its history settings, and what
//! memory is ([`Component`], stamped with [`component`]). Everything else has one path, in the
//! module of its concern: [`mem`] (the ipyexperiments helpers), [`scope`] (`measure`,
//! `save_memory_snapshot`), [`tracking`] (every allocation of the process, `top`),
//! [`components`] (stamps and the rules on stacks), [`metrics`] (Prometheus), [`steps`] (a
//! program's steps recorded as cells are), [`snapshot`], [`render`], [`replay`], [`plan`] (will
//! it fit), [`pinned`], [`stats`], [`blocks`] (the allocator's raw API), [`device`](mod@device)
//! (backends and NVML), [`frameworks`] (cubecl's pools for burn), [`units`], [`procfs`]
//! (`/proc`), and [`kernel`] (what a Jupyter kernel shares with the crate). HOW_IT_WORKS.md
//! walks through the rooms.
//!
//! ## Layers
//! Each folder (or root file) uses only those on earlier lines, never a later one; in
//! non-test code the import graph has no cycle between them. `tests/layers.rs` reads this
//! list and checks every `crate::` path against it (and the list in `notebook/mod.rs` inside
//! that folder). Inside the crate every path names the module that defines the thing: none goes
//! through this root.
//!
//! 1. `units`, `sync`, `procfs` — sizes, durations and dates for people; the one way the
//!    crate takes a lock; the process table as `/proc` shows it.
//! 2. `device` — the device seam: the [`Backend`] trait and its vocabulary ([`StreamId`],
//!    [`BackendKind`], `DeviceError`, `Element`), `device::cuda` (cudarc, feature `cuda`),
//!    `device::sim` (simulated, with its process table), `device::replay` (a trace's
//!    addresses), `device::nvml`.
//! 3. `record`, `stats` — what the policy writes as it runs: the event ring and stacks
//!    ([`TraceEntry`], [`RecordMode`]; stacks walked by framehop, symbolised late; evcxr's
//!    generated lines mapped to cell lines); the 122 `memory_stats()` counters, peak slots and
//!    the `memory_summary()` text.
//! 4. `policy`, `track` — PyTorch's caching policy as pure code: config
//!    ([`AllocatorConfig`]), rounding, pools, best fit, split and merge, events, release, GC,
//!    fraction, expandable segments, out-of-memory ([`AllocError`], [`OomReport`]), and our
//!    own compact policy (PyTorch's API and statistics, less reserved memory); the books
//!    of every driver allocation of the process, by source and owner.
//! 5. `snapshot`, `error` — PyTorch's snapshot structure read back from the policy, its
//!    pickle and JSON writers (and JSON reader), the memory timeline, and two states compared
//!    allocation by allocation; [`Error`] gathering every failure.
//! 6. `allocator` — [`CachingAllocator`]: the thread-safe front, `torch.cuda`'s memory API as
//!    methods.
//! 7. `render`, `buffer`, `replay` — tables, charts and the offline snapshot page (plain
//!    data in, text/HTML/SVG out); [`DeviceBuffer`]; PyTorch traces replayed through the policy
//!    (exactly, or only their allocations and frees under any policy).
//! 8. `pinned` — `PinnedBuffer` and the caching `HostAllocator`.
//! 9. `notebook` — one state per process however many copies of the crate evcxr loads, and
//!    what lives in it: the device registry and what opening a device starts ([`current`],
//!    [`device()`]), tracking, the kernel's control channel and its protocol, the out-of-memory
//!    watch, the per-cell report both kernels show and the stock evcxr kernel's hooks that
//!    show it, scopes and the mem helpers (its own layer list is in `notebook/mod.rs`).
//! 10. `plan` — will it fit: a session's recorded allocations replayed on a device of any size
//!     under each policy, and every reserved byte explained.
//! 11. `frameworks` — frameworks with their own books of device memory, watched from a
//!     notebook: cubecl's pools for burn (features `cubecl`, `cubecl010`).
//!
//! Units: bytes everywhere in data; [`units`] formats them for people.
#![deny(unsafe_code)]

pub mod procfs;
mod sync;
pub mod units;

pub mod device;

mod record;
pub mod stats;

mod policy;
mod track;

pub mod snapshot;

mod allocator;
mod error;

pub mod render;

mod buffer;
pub mod replay;

pub mod pinned;

mod notebook;

pub mod plan;

pub mod frameworks;

// The allocator and its PyTorch-named API.
pub use allocator::{Allocator, CachingAllocator, OomObserver, PeakSlot};
pub use device::seam::{Backend, BackendKind, StreamId};
pub use error::{AllocError, Error, OomReport, Result};
pub use notebook::session::{current, device, watch};
pub use policy::config::AllocatorConfig;

// History (`record_memory_history`).
pub use record::history::{HistoryOptions, RecordMode, StackContext, TraceAction, TraceEntry};

// Memory on the device.
pub use buffer::DeviceBuffer;

// What a notebook uses, a module each; what memory is, as PyTorch names it.
pub use notebook::components::{Component, component};
pub use notebook::{components, mem, metrics, scope, steps, tracking};

/// The cudarc this crate is built with (with its `driver` and `nvrtc` modules), for cells that
/// launch kernels on gpumem-nb buffers: its types are the ones `DeviceBuffer::cuda()` lends, so
/// no second `:dep cudarc` (and no version or feature mismatch) is needed.
#[cfg(feature = "cuda")]
pub use cudarc;

/// This crate's version (gpumem-kernel checks that a notebook's `:dep gpumem-nb` matches it).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The allocator's raw API and what it shows of its state, in PyTorch's words: the block an
/// allocation got ([`CachingAllocator::malloc`]), blocks and segments as a snapshot lists them,
/// where the reserved bytes are, and the invariants' verdict.
pub mod blocks {
    pub use crate::policy::{
        Allocation, BlockId, BlockView, CachedClass, InvariantViolation, PoolKind, ReservedParts, SegmentView,
    };
}

/// What a Jupyter kernel shares with this crate: gpumem-kernel (in this repository) speaks to
/// the crate in its notebook process through [`control`](kernel::control) and
/// [`protocol`](kernel::protocol), builds the same per-cell [`report`](kernel::report), lists
/// the notebook's [`children`](kernel::children), maps evcxr's generated lines to
/// [`cells`](kernel::cells), reads the devices already [`opened`](kernel::opened) (without
/// opening one); the stock evcxr kernel's own per-cell reports are switched with
/// [`set_reports`](kernel::set_reports).
pub mod kernel {
    pub use crate::notebook::registry::{device_before_use, opened};
    pub use crate::notebook::session::watch_from_start;
    pub use crate::notebook::stock::set_reports;
    pub use crate::notebook::{children, control, oom, protocol, report};
    pub use crate::record::cells;
}
