//! Memory snapshots with PyTorch's structure (`torch.cuda.memory._snapshot()`), and writers
//! that PyTorch's own tools read.
//!
//! - `model`: the plain data (segments, blocks, device traces, allocator settings).
//! - [`pickle`]: pickle protocol 4 using only the opcodes `MemoryViz.js` understands, so the
//!   file drags into pytorch.org/memory_viz and `python -m torch.cuda._memory_viz` reads it.
//! - [`json`]: the same structure as JSON (the newest viewer accepts it too).
//! - [`unpickle`]: a reader for the pickles PyTorch's `_dump_snapshot` (and ours) write;
//!   [`read`] takes any snapshot file or directory.
//! - `timeline` ([`MemoryTimeline`]): the running totals after every event, rebuilt from a trace.
//! - [`files`]: the files' names per rank (`snapshot_rank1.pickle` under `RANK=1`).
//! - [`diff`](mod@diff): two states compared allocation by allocation ([`diff()`], [`SnapshotDiff`]).
//!
//! The offline HTML page, and writing all three files, are rendering: `crate::render`.
//!
//! Taking a snapshot is split in two: [`RawSnapshot`] is copied out of the allocator under its
//! lock (cheap: raw addresses, no symbol lookup), then [`Snapshot::from_raw`] symbolises stacks
//! outside the lock.

pub mod diff;
pub mod files;
pub mod json;
mod model;
pub mod pickle;
mod timeline;
mod tree;
pub mod unpickle;

pub use crate::record::frames::Frame;
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
    pub(crate) fn take(state: &mut DeviceState, device: i32) -> Self {
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

/// Why a snapshot could not be read, in one line naming the file where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The file (or a directory's snapshot file) could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A directory holds several ranks' snapshots and none is this process's: name one file.
    #[error("{0}")]
    Ambiguous(String),
    /// The bytes are not a memory snapshot (neither a pickle nor JSON of PyTorch's structure),
    /// with where and why.
    #[error("{0}")]
    Malformed(String),
    /// The snapshot's recorded history does not reach back to the moment asked for (none was
    /// recorded, or its ring dropped events since then).
    #[error("{0}")]
    NoHistory(String),
}

impl ReadError {
    /// The same error with the file's name in front (a bare `Malformed` comes from bytes).
    fn in_file(self, path: &std::path::Path) -> ReadError {
        match self {
            ReadError::Malformed(why) => ReadError::Malformed(format!("{}: {why}", path.display())),
            other => other,
        }
    }
}

/// Reads a snapshot from a file or directory, whatever wrote it: a pickle (PyTorch's
/// `torch.cuda.memory._dump_snapshot`, or ours), its JSON form, or a directory written by
/// `Snapshot::save` (its `snapshot.pickle`, else `snapshot.json`). The format is told by the
/// content, not the name. Errors are one line naming the file.
pub fn read(path: &std::path::Path) -> Result<Snapshot, ReadError> {
    let file = if path.is_dir() {
        let p = files::find_in_dir(path, "snapshot", "pickle")?;
        if p.is_file() { p } else { files::find_in_dir(path, "snapshot", "json")? }
    } else {
        path.to_path_buf()
    };
    let bytes = std::fs::read(&file).map_err(|source| ReadError::Io { path: file.clone(), source })?;
    from_bytes(&bytes).map_err(|e| e.in_file(&file))
}

/// Reads a snapshot from a file's bytes: a pickle or JSON (see [`read`]).
/// (A pickle of `torch.cuda.memory_snapshot()`'s list alone is its segments, with no trace, as
/// `_memory_viz` reads it.)
pub fn from_bytes(bytes: &[u8]) -> Result<Snapshot, ReadError> {
    if unpickle::looks_like_pickle(bytes) {
        // Straight from the pickle's objects: no intermediate tree of values.
        let parsed = unpickle::parse(bytes).map_err(|e| ReadError::Malformed(e.to_string()))?;
        return tree::snapshot(parsed.root()).map_err(ReadError::Malformed);
    }
    if bytes.iter().find(|b| !b.is_ascii_whitespace()).is_some_and(|b| *b == b'{' || *b == b'[') {
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| ReadError::Malformed(format!("not JSON ({e})")))?;
        return tree::snapshot(&v).map_err(ReadError::Malformed);
    }
    Err(ReadError::Malformed("not a memory snapshot: neither a pickle (protocol 2-5) nor JSON".into()))
}
