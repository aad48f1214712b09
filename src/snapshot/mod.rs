//! Memory snapshots with PyTorch's structure (`torch.cuda.memory._snapshot()`), and writers
//! that PyTorch's own tools read.
//!
//! - [`model`]: the plain data (segments, blocks, device traces, allocator settings).
//! - [`pickle`]: pickle protocol 4 using only the opcodes `MemoryViz.js` understands, so the
//!   file drags into pytorch.org/memory_viz and `python -m torch.cuda._memory_viz` reads it.
//! - [`json`]: the same structure as JSON (the newest viewer accepts it too).
//! - [`html`]: a self-contained offline page: an active-memory timeline and a segment map.
//!
//! Taking a snapshot is split in two: [`RawSnapshot`] is copied out of the allocator under its
//! lock (cheap: raw addresses, no symbol lookup), then [`Snapshot::from_raw`] symbolises stacks
//! outside the lock.

pub mod html;
pub mod json;
pub mod model;
pub mod pickle;

pub use model::{AllocatorSettings, BlockSnap, Segment, Snapshot, TraceSnap};

use crate::config::AllocatorConfig;
use crate::history::TraceEntry;
use crate::policy::{DeviceState, SegmentView};
use std::path::{Path, PathBuf};

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
    pub backend: Option<crate::backend::BackendKind>,
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

/// Paths written by [`write_all`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFiles {
    /// `snapshot.pickle`: for pytorch.org/memory_viz and `torch.cuda._memory_viz`.
    pub pickle: PathBuf,
    /// `snapshot.json`: the same structure as JSON.
    pub json: PathBuf,
    /// `trace_plot.html`: the offline page.
    pub html: PathBuf,
}

/// Writes `snapshot.pickle`, `snapshot.json` and `trace_plot.html` into `dir` (created if
/// missing). An unwritable directory is an error naming the path.
pub fn write_all(snapshot: &Snapshot, dir: &Path) -> std::io::Result<SnapshotFiles> {
    let ctx =
        |what: &str, p: &Path, e: std::io::Error| std::io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()));
    std::fs::create_dir_all(dir).map_err(|e| ctx("cannot create directory", dir, e))?;
    let files = SnapshotFiles {
        pickle: dir.join("snapshot.pickle"),
        json: dir.join("snapshot.json"),
        html: dir.join("trace_plot.html"),
    };
    let write = |p: &Path, bytes: &[u8]| std::fs::write(p, bytes).map_err(|e| ctx("cannot write", p, e));
    write(&files.pickle, &pickle::to_bytes(snapshot))?;
    write(&files.json, json::to_string(snapshot).as_bytes())?;
    let opts = html::HtmlOptions { source: snapshot.source().map(String::from), ..Default::default() };
    write(&files.html, html::render_with(snapshot, &opts).as_bytes())?;
    Ok(files)
}
