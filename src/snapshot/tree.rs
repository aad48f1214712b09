//! Reading PyTorch's snapshot structure out of any tree of plain data: parsed JSON
//! ([`serde_json::Value`]) or a pickle's objects as the pickle machine left them
//! (`super::unpickle::Parsed`), without building one from the other.
//!
//! Missing keys take PyTorch's defaults; trace events of an unknown action are skipped; what is
//! not a snapshot at all is an error saying what is missing. A frame list that several entries
//! share (PyTorch writes one list per distinct stack and refers back to it) is read once.

use super::{AllocatorSettings, BlockSnap, Segment, Snapshot, TraceSnap};
use crate::record::frames::Frame;
use crate::record::history::TraceAction;
use serde_json::Value;
use std::collections::HashMap;

/// A node of a tree of plain data (a dict, list, string, number, bool or none).
pub(crate) trait Tree<'a>: Copy {
    /// A dict's value for a string key.
    fn get(self, key: &str) -> Option<Self>;
    /// A non-negative integer.
    fn u64(self) -> Option<u64>;
    /// An integer.
    fn i64(self) -> Option<i64>;
    /// A number.
    fn f64(self) -> Option<f64>;
    /// A bool.
    fn bool(self) -> Option<bool>;
    /// A string.
    fn str(self) -> Option<&'a str>;
    /// A list's (or tuple's) items; `None` for anything else.
    fn items(self) -> Option<Vec<Self>>;
    /// A dict's entries with string keys.
    fn entries(self) -> Vec<(&'a str, Self)>;
    /// The same node, as a JSON value.
    fn to_value(self) -> Value;
    /// Identity: equal for the same shared object.
    fn id(self) -> usize;
}

impl<'a> Tree<'a> for &'a Value {
    fn get(self, key: &str) -> Option<Self> {
        Value::get(self, key)
    }
    fn u64(self) -> Option<u64> {
        self.as_u64()
    }
    fn i64(self) -> Option<i64> {
        self.as_i64()
    }
    fn f64(self) -> Option<f64> {
        self.as_f64()
    }
    fn bool(self) -> Option<bool> {
        self.as_bool()
    }
    fn str(self) -> Option<&'a str> {
        self.as_str()
    }
    fn items(self) -> Option<Vec<Self>> {
        self.as_array().map(|a| a.iter().collect())
    }
    fn entries(self) -> Vec<(&'a str, Self)> {
        self.as_object().map(|m| m.iter().map(|(k, v)| (k.as_str(), v)).collect()).unwrap_or_default()
    }
    fn to_value(self) -> Value {
        self.clone()
    }
    fn id(self) -> usize {
        std::ptr::from_ref(self) as usize
    }
}

/// Reads a snapshot; a bare list is `torch.cuda.memory_snapshot()`'s segments alone.
pub(crate) fn snapshot<'a, T: Tree<'a>>(root: T) -> Result<Snapshot, String> {
    let mut r = Reader { frames: HashMap::new() };
    if let Some(segments) = root.items() {
        return Ok(r.build(segments, Vec::new(), None, Vec::new()));
    }
    let segments = root.get("segments").and_then(Tree::items).ok_or("not a memory snapshot: no `segments` list")?;
    let traces: Vec<Vec<TraceSnap>> = root
        .get("device_traces")
        .and_then(Tree::items)
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.items().unwrap_or_default().into_iter().filter_map(|e| r.trace_entry(e)).collect())
        .collect();
    let annotations =
        root.get("external_annotations").and_then(Tree::items).unwrap_or_default().into_iter().map(Tree::to_value);
    Ok(r.build(segments, traces, root.get("allocator_settings"), annotations.collect()))
}

struct Reader {
    /// Frame lists read so far, by node identity.
    frames: HashMap<usize, Vec<Frame>>,
}

fn num<'a, T: Tree<'a>>(v: T, key: &str) -> u64 {
    v.get(key).and_then(Tree::u64).unwrap_or(0)
}

fn flag<'a, T: Tree<'a>>(v: Option<T>, key: &str) -> bool {
    v.and_then(|v| v.get(key)).and_then(Tree::bool).unwrap_or(false)
}

fn text<'a, T: Tree<'a>>(v: Option<T>, key: &str) -> String {
    v.and_then(|v| v.get(key)).and_then(Tree::str).unwrap_or("").to_string()
}

impl Reader {
    fn build<'a, T: Tree<'a>>(
        &mut self,
        segments: Vec<T>,
        device_traces: Vec<Vec<TraceSnap>>,
        s: Option<T>,
        external_annotations: Vec<Value>,
    ) -> Snapshot {
        let setting = |key: &str| s.and_then(|s| s.get(key));
        Snapshot {
            segments: segments.into_iter().map(|seg| self.segment(seg)).collect(),
            device_traces,
            allocator_settings: AllocatorSettings {
                conf: text(s, "PYTORCH_CUDA_ALLOC_CONF"),
                max_split_size: setting("max_split_size").and_then(Tree::i64).unwrap_or(-1),
                garbage_collection_threshold: setting("garbage_collection_threshold")
                    .and_then(Tree::f64)
                    .unwrap_or(0.0),
                expandable_segments: flag(s, "expandable_segments"),
                pinned_num_register_threads: setting("pinned_num_register_threads").and_then(Tree::u64).unwrap_or(0),
                release_lock_on_cudamalloc: flag(s, "release_lock_on_cudamalloc"),
                pinned_use_cuda_host_register: flag(s, "pinned_use_cuda_host_register"),
                graph_capture_record_stream_reuse: flag(s, "graph_capture_record_stream_reuse"),
                roundup_power2_divisions: setting("roundup_power2_divisions")
                    .map(|m| m.entries().into_iter().map(|(k, d)| (k.to_string(), d.u64().unwrap_or(0))).collect())
                    .unwrap_or_default(),
            },
            external_annotations,
            backend: None,
        }
    }

    fn frames<'a, T: Tree<'a>>(&mut self, v: Option<T>) -> Vec<Frame> {
        let Some(v) = v else { return Vec::new() };
        if let Some(f) = self.frames.get(&v.id()) {
            return f.clone();
        }
        let read: Vec<Frame> = v
            .items()
            .unwrap_or_default()
            .into_iter()
            .map(|f| Frame {
                name: text(Some(f), "name"),
                filename: text(Some(f), "filename"),
                line: u32::try_from(num(f, "line")).unwrap_or(0),
            })
            .collect();
        self.frames.insert(v.id(), read.clone());
        read
    }

    fn segment<'a, T: Tree<'a>>(&mut self, s: T) -> Segment {
        let pool = s.get("segment_pool_id").and_then(Tree::items).unwrap_or_default();
        let pool_part = |i: usize| pool.get(i).and_then(|p| p.u64()).unwrap_or(0);
        Segment {
            device: s.get("device").and_then(Tree::i64).unwrap_or(0) as i32,
            address: num(s, "address"),
            total_size: num(s, "total_size"),
            allocated_size: num(s, "allocated_size"),
            active_size: num(s, "active_size"),
            requested_size: num(s, "requested_size"),
            stream: num(s, "stream"),
            segment_type: if s.get("segment_type").and_then(Tree::str) == Some("small") { "small" } else { "large" },
            segment_pool_id: (pool_part(0), pool_part(1)),
            is_expandable: flag(Some(s), "is_expandable"),
            frames: self.frames(s.get("frames")),
            blocks: s
                .get("blocks")
                .and_then(Tree::items)
                .unwrap_or_default()
                .into_iter()
                .map(|b| BlockSnap {
                    address: num(b, "address"),
                    size: num(b, "size"),
                    requested_size: num(b, "requested_size"),
                    state: match b.get("state").and_then(Tree::str) {
                        Some("active_allocated") => "active_allocated",
                        Some("active_pending_free") => "active_pending_free",
                        _ => "inactive",
                    },
                    frames: self.frames(b.get("frames")),
                })
                .collect(),
        }
    }

    fn trace_entry<'a, T: Tree<'a>>(&mut self, e: T) -> Option<TraceSnap> {
        let action = TraceAction::from_name(e.get("action")?.str()?)?.name();
        Some(TraceSnap {
            action,
            addr: e.get("addr").and_then(Tree::u64),
            device_free: e.get("device_free").and_then(Tree::u64),
            size: num(e, "size"),
            stream: num(e, "stream"),
            time_us: e.get("time_us").and_then(Tree::i64).unwrap_or(0),
            compile_context: "N/A",
            user_metadata: text(Some(e), "user_metadata"),
            frames: e.get("frames").map(|f| self.frames(Some(f))),
        })
    }
}
