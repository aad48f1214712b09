//! Memory snapshots with PyTorch's structure (`torch.cuda.memory._snapshot()`), and writers
//! that PyTorch's own tools read.
//!
//! - [`model`]: the plain data (segments, blocks, device traces, allocator settings).
//! - [`pickle`]: pickle protocol 4 using only the opcodes `MemoryViz.js` understands, so the
//!   file drags into pytorch.org/memory_viz and `python -m torch.cuda._memory_viz` reads it.
//! - [`json`]: the same structure as JSON (the newest viewer accepts it too).
//! - [`timeline`]: the running totals after every event, rebuilt from a trace.
//! - [`diff`]: two states compared allocation by allocation ([`diff()`], [`SnapshotDiff`]).
//!
//! The offline HTML page, and writing all three files, are rendering: `crate::render`.
//!
//! Taking a snapshot is split in two: [`RawSnapshot`] is copied out of the allocator under its
//! lock (cheap: raw addresses, no symbol lookup), then [`Snapshot::from_raw`] symbolises stacks
//! outside the lock.

pub mod diff;
pub mod json;
mod model;
pub mod pickle;
mod timeline;

pub use diff::{SnapshotDiff, diff};
pub use model::{AllocatorSettings, BlockSnap, Segment, Snapshot, TraceSnap};
pub use timeline::{MemoryTimeline, TimelinePoint, TimelineSource};

use crate::policy::config::AllocatorConfig;
use crate::policy::{DeviceState, SegmentView};
use crate::record::history::TraceEntry;

/// What a snapshot copies out of the allocator under the lock.
#[derive(Clone, Debug)]
pub struct RawSnapshot {
    /// Device index.
    pub device: i32,
    /// Segments and blocks.
    pub segments: Vec<SegmentView>,
    /// Recorded events, oldest first.
    pub trace: Vec<TraceEntry>,
    /// Label texts by id.
    pub labels: Vec<String>,
    /// The configuration.
    pub config: AllocatorConfig,
    /// What the numbers come from.
    pub backend: Option<crate::device::BackendKind>,
}

impl RawSnapshot {
    /// Copies the state, then records PyTorch's "snapshot" event as `_snapshot()` does (after
    /// the copy: a snapshot's own event shows up in the next snapshot, not in itself).
    pub fn take(state: &mut DeviceState, device: i32) -> Self {
        let raw = RawSnapshot {
            device,
            segments: state.segments(),
            trace: state.history.entries().iter().cloned().collect(),
            labels: state.labels(),
            config: state.config().clone(),
            backend: None,
        };
        state.record_snapshot_event();
        raw
    }
}
