//! The snapshot as JSON: the same structure as the pickle (tuples become 2-element arrays).
//! The newest pytorch.org/memory_viz loads it directly.

use super::Snapshot;

/// The snapshot as a JSON string.
pub fn to_string(snapshot: &Snapshot) -> String {
    // Serialising plain data with string keys cannot fail.
    serde_json::to_string(snapshot).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}
