//! The snapshot as JSON: the same structure as the pickle (tuples become 2-element arrays).
//! The newest pytorch.org/memory_viz loads it directly. [`from_str`] and [`load`] read it back
//! (ours, or PyTorch's snapshot dict dumped with `json.dump`), for [`super::diff`](mod@super::diff).

use super::{AllocatorSettings, BlockSnap, Segment, Snapshot, TraceSnap};
use crate::record::frames::Frame;
use crate::record::history::TraceAction;
use serde_json::Value;
use std::path::Path;

/// The snapshot as a JSON string.
pub fn to_string(snapshot: &Snapshot) -> String {
    // Serialising plain data with string keys cannot fail.
    serde_json::to_string(snapshot).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// Reads a snapshot's JSON. Missing keys take PyTorch's defaults; trace events of an unknown
/// action are skipped; what is not a snapshot at all is an error saying what is missing.
pub fn from_str(text: &str) -> Result<Snapshot, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e})"))?;
    from_value(&v)
}

/// Reads a snapshot from its tree (parsed JSON, or a pickle read by
/// [`super::unpickle::from_bytes`]), with the same defaults as [`from_str`].
pub fn from_value(v: &Value) -> Result<Snapshot, String> {
    let segments = v.get("segments").and_then(Value::as_array).ok_or("not a memory snapshot: no `segments` list")?;
    let device_traces = match v.get("device_traces") {
        Some(Value::Array(traces)) => traces.iter().map(|t| list(t).iter().filter_map(trace_entry).collect()).collect(),
        _ => Vec::new(),
    };
    let s = v.get("allocator_settings").cloned().unwrap_or(Value::Null);
    Ok(Snapshot {
        segments: segments.iter().map(segment).collect(),
        device_traces,
        allocator_settings: AllocatorSettings {
            conf: str_of(&s, "PYTORCH_CUDA_ALLOC_CONF"),
            max_split_size: s.get("max_split_size").and_then(Value::as_i64).unwrap_or(-1),
            garbage_collection_threshold: s.get("garbage_collection_threshold").and_then(Value::as_f64).unwrap_or(0.0),
            expandable_segments: flag(&s, "expandable_segments"),
            pinned_num_register_threads: num(&s, "pinned_num_register_threads"),
            release_lock_on_cudamalloc: flag(&s, "release_lock_on_cudamalloc"),
            pinned_use_cuda_host_register: flag(&s, "pinned_use_cuda_host_register"),
            graph_capture_record_stream_reuse: flag(&s, "graph_capture_record_stream_reuse"),
            roundup_power2_divisions: s
                .get("roundup_power2_divisions")
                .and_then(Value::as_object)
                .map(|m| m.iter().map(|(k, d)| (k.clone(), d.as_u64().unwrap_or(0))).collect())
                .unwrap_or_default(),
        },
        external_annotations: list(v.get("external_annotations").unwrap_or(&Value::Null)).to_vec(),
        backend: None,
    })
}

/// Reads `snapshot.json` from `path`: the file itself, or the one in a directory written by
/// `Snapshot::save` (or beside a `snapshot.pickle` named by mistake: the pickle is not read).
pub fn load(path: &Path) -> std::io::Result<Snapshot> {
    let file = if path.is_dir() {
        path.join("snapshot.json")
    } else if path.extension().is_some_and(|e| e == "pickle") {
        path.with_extension("json")
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&file)
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot read {}: {e}", file.display())))?;
    from_str(&text)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", file.display())))
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map_or(&[], Vec::as_slice)
}

fn num(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

fn flag(v: &Value, key: &str) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn str_of(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

fn frames(v: Option<&Value>) -> Vec<Frame> {
    list(v.unwrap_or(&Value::Null))
        .iter()
        .map(|f| Frame {
            name: str_of(f, "name"),
            filename: str_of(f, "filename"),
            line: u32::try_from(num(f, "line")).unwrap_or(0),
        })
        .collect()
}

fn segment(s: &Value) -> Segment {
    let pool = list(s.get("segment_pool_id").unwrap_or(&Value::Null));
    let pool_part = |i: usize| pool.get(i).and_then(Value::as_u64).unwrap_or(0);
    Segment {
        device: s.get("device").and_then(Value::as_i64).unwrap_or(0) as i32,
        address: num(s, "address"),
        total_size: num(s, "total_size"),
        allocated_size: num(s, "allocated_size"),
        active_size: num(s, "active_size"),
        requested_size: num(s, "requested_size"),
        stream: num(s, "stream"),
        segment_type: if s.get("segment_type").and_then(Value::as_str) == Some("small") { "small" } else { "large" },
        segment_pool_id: (pool_part(0), pool_part(1)),
        is_expandable: flag(s, "is_expandable"),
        frames: frames(s.get("frames")),
        blocks: list(s.get("blocks").unwrap_or(&Value::Null))
            .iter()
            .map(|b| BlockSnap {
                address: num(b, "address"),
                size: num(b, "size"),
                requested_size: num(b, "requested_size"),
                state: match b.get("state").and_then(Value::as_str) {
                    Some("active_allocated") => "active_allocated",
                    Some("active_pending_free") => "active_pending_free",
                    _ => "inactive",
                },
                frames: frames(b.get("frames")),
            })
            .collect(),
    }
}

fn trace_entry(e: &Value) -> Option<TraceSnap> {
    let action = TraceAction::from_name(e.get("action")?.as_str()?)?.name();
    Some(TraceSnap {
        action,
        addr: e.get("addr").and_then(Value::as_u64),
        device_free: e.get("device_free").and_then(Value::as_u64),
        size: num(e, "size"),
        stream: num(e, "stream"),
        time_us: e.get("time_us").and_then(Value::as_i64).unwrap_or(0),
        compile_context: "N/A",
        user_metadata: str_of(e, "user_metadata"),
        frames: e.get("frames").map(|f| frames(Some(f))),
    })
}
