//! The snapshot as JSON: the same structure as the pickle (tuples become 2-element arrays).
//! The newest pytorch.org/memory_viz loads it directly. [`from_str`] and [`load`] read it back
//! (ours, or PyTorch's snapshot dict dumped with `json.dump`), for [`super::diff`](mod@super::diff).

use super::{ReadError, Snapshot};
use serde_json::Value;
use std::path::Path;

/// The snapshot as a JSON string.
pub fn to_string(snapshot: &Snapshot) -> String {
    // Serialising plain data with string keys cannot fail.
    serde_json::to_string(snapshot).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// Reads a snapshot's JSON. Missing keys take PyTorch's defaults; trace events of an unknown
/// action are skipped; what is not a snapshot at all is an error saying what is missing.
pub fn from_str(text: &str) -> Result<Snapshot, ReadError> {
    let v: Value = serde_json::from_str(text).map_err(|e| ReadError::Malformed(format!("not JSON ({e})")))?;
    from_value(&v)
}

/// Reads a snapshot from its tree (parsed JSON), with the same defaults as [`from_str`].
pub fn from_value(v: &Value) -> Result<Snapshot, ReadError> {
    super::tree::snapshot(v).map_err(ReadError::Malformed)
}

/// Reads `snapshot.json` from `path`: the file itself, or the one in a directory written by
/// `Snapshot::save` (`snapshot_rankN.json` under a rank: `files::find_in_dir`),
/// `Snapshot::save` (or beside a `snapshot.pickle` named by mistake: the pickle is not read).
pub fn load(path: &Path) -> std::io::Result<Snapshot> {
    let file = if path.is_dir() {
        super::files::find_in_dir(path, "snapshot", "json")
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?
    } else if path.extension().is_some_and(|e| e == "pickle") {
        path.with_extension("json")
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&file)
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot read {}: {e}", file.display())))?;
    from_str(&text).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.in_file(&file).to_string()))
}
