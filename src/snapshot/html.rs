//! The offline HTML page (placeholder until the timeline and segment map land).

use super::Snapshot;

/// A self-contained page for the snapshot.
pub fn render(snapshot: &Snapshot) -> String {
    format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>gpumem-nb snapshot</title></head>\
         <body><p>{} segments, {} events</p></body></html>",
        snapshot.segments.len(),
        snapshot.num_events()
    )
}
