//! Writing a snapshot's files: the pickle and JSON of [`crate::snapshot`] and the offline page
//! of [`super::trace_plot`], side by side in one directory.
#![forbid(unsafe_code)]

use super::trace_plot;
use crate::snapshot::{self, Snapshot};
use std::path::{Path, PathBuf};

/// Paths written by [`Snapshot::save`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFiles {
    /// `snapshot.pickle`: for pytorch.org/memory_viz and `torch.cuda._memory_viz`.
    pub pickle: PathBuf,
    /// `snapshot.json`: the same structure as JSON.
    pub json: PathBuf,
    /// `trace_plot.html`: the offline page.
    pub html: PathBuf,
}

impl Snapshot {
    /// Writes `snapshot.pickle`, `snapshot.json` and `trace_plot.html` into `dir` (created if
    /// missing): PyTorch's `torch.cuda.memory._dump_snapshot`, plus the JSON and the offline
    /// page. In a process with a rank (`RANK`, else `LOCAL_RANK`) the names carry it:
    /// `snapshot_rank1.pickle`, `snapshot_rank1.json`, `trace_plot_rank1.html`. An unwritable directory is an error naming the path.
    pub fn save(&self, dir: &Path) -> std::io::Result<SnapshotFiles> {
        write_all(self, dir)
    }
}

fn write_all(snapshot: &Snapshot, dir: &Path) -> std::io::Result<SnapshotFiles> {
    let ctx =
        |what: &str, p: &Path, e: std::io::Error| std::io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()));
    std::fs::create_dir_all(dir).map_err(|e| ctx("cannot create directory", dir, e))?;
    let name = snapshot::files::file_name;
    let files = SnapshotFiles {
        pickle: dir.join(name("snapshot", "pickle")),
        json: dir.join(name("snapshot", "json")),
        html: dir.join(name("trace_plot", "html")),
    };
    let write = |p: &Path, bytes: &[u8]| std::fs::write(p, bytes).map_err(|e| ctx("cannot write", p, e));
    write(&files.pickle, &snapshot::pickle::to_bytes(snapshot))?;
    write(&files.json, snapshot::json::to_string(snapshot).as_bytes())?;
    let opts = trace_plot::HtmlOptions { source: snapshot.source().map(String::from), ..Default::default() };
    write(&files.html, trace_plot::render_with(snapshot, &opts).as_bytes())?;
    Ok(files)
}
