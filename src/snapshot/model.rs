//! The snapshot as plain data, mirroring the dict `torch.cuda.memory._snapshot()` returns in
//! PyTorch 2.11 (key names, order and meaning: `torch/cuda/memory.py` and the `SnapshotInfo` of
//! `c10/cuda/CUDACachingAllocator.h`).

use super::RawSnapshot;
use crate::record::frames::{Frame, Symbolizer};
use crate::record::history::TraceAction;
use serde::Serialize;
use std::collections::HashMap;

/// A whole snapshot.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    /// Segments of every device, each device's sorted by address.
    pub segments: Vec<Segment>,
    /// One list of events per device index, oldest first.
    pub device_traces: Vec<Vec<TraceSnap>>,
    /// The allocator's configuration.
    pub allocator_settings: AllocatorSettings,
    /// `record_function` annotations (none are recorded yet).
    pub external_annotations: Vec<serde_json::Value>,
    /// What the numbers came from (not part of PyTorch's format, so not written to the pickle
    /// or JSON; renderers show it).
    #[serde(skip)]
    pub backend: Option<crate::device::BackendKind>,
}

/// One segment (for expandable segments: one contiguous mapped run).
#[derive(Clone, Debug, Serialize)]
pub struct Segment {
    /// Device index.
    pub device: i32,
    /// First byte.
    pub address: u64,
    /// Sum of block sizes.
    pub total_size: u64,
    /// Sum of allocated block sizes.
    pub allocated_size: u64,
    /// Sum of active block sizes.
    pub active_size: u64,
    /// Sum of requested sizes of active blocks.
    pub requested_size: u64,
    /// Raw stream handle (0 = default stream).
    pub stream: u64,
    /// "small" or "large".
    pub segment_type: &'static str,
    /// (0, 0): the default pool.
    pub segment_pool_id: (u64, u64),
    /// Part of an expandable segment.
    pub is_expandable: bool,
    /// Stack of the call that created the segment (often empty).
    pub frames: Vec<Frame>,
    /// Blocks in address order.
    pub blocks: Vec<BlockSnap>,
}

/// One block of a segment.
#[derive(Clone, Debug, Serialize)]
pub struct BlockSnap {
    /// Address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Requested size (stale for inactive blocks, as in PyTorch).
    pub requested_size: u64,
    /// "active_allocated", "active_pending_free" or "inactive".
    pub state: &'static str,
    /// Allocation stack (empty for inactive blocks).
    pub frames: Vec<Frame>,
}

/// One trace entry (PyTorch's keys; `device_free` replaces `addr` for "oom").
#[derive(Clone, Debug, Serialize)]
pub struct TraceSnap {
    /// PyTorch's action name.
    pub action: &'static str,
    /// Address (absent for "oom").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<u64>,
    /// Device free bytes (only for "oom").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
    /// Size in bytes.
    pub size: u64,
    /// Raw stream handle.
    pub stream: u64,
    /// µs since the Unix epoch.
    pub time_us: i64,
    /// "N/A" (no compiled regions in Rust).
    pub compile_context: &'static str,
    /// The label the event was recorded under (e.g. "cell 3"), "" for none.
    pub user_metadata: String,
    /// The event's stack, when one was recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frames: Option<Vec<Frame>>,
}

/// `allocator_settings`, PyTorch 2.11's keys.
#[derive(Clone, Debug, Serialize)]
pub struct AllocatorSettings {
    /// The configuration string (GPUMEM_NB_ALLOC_CONF), under PyTorch's key name.
    #[serde(rename = "PYTORCH_CUDA_ALLOC_CONF")]
    pub conf: String,
    /// −1 when unlimited.
    pub max_split_size: i64,
    /// 0.0 when off.
    pub garbage_collection_threshold: f64,
    /// Expandable segments on.
    pub expandable_segments: bool,
    /// Pinned memory registration threads.
    pub pinned_num_register_threads: u64,
    /// Lock released around cudaMalloc.
    pub release_lock_on_cudamalloc: bool,
    /// Pinned memory through cudaHostRegister.
    pub pinned_use_cuda_host_register: bool,
    /// Stream reuse during graph capture.
    pub graph_capture_record_stream_reuse: bool,
    /// Divisions per interval, keyed by the interval's start in MiB ("1" … "32768").
    #[serde(serialize_with = "as_map")]
    pub roundup_power2_divisions: Vec<(String, u64)>,
}

impl AllocatorSettings {
    /// The settings of an allocator configured by `c`.
    pub(crate) fn of(c: &crate::policy::config::AllocatorConfig) -> Self {
        AllocatorSettings {
            conf: c.source.clone(),
            max_split_size: c.max_split_size_reported(),
            garbage_collection_threshold: c.garbage_collection_threshold,
            expandable_segments: c.expandable_segments,
            pinned_num_register_threads: c.pinned_num_register_threads,
            release_lock_on_cudamalloc: c.release_lock_on_cudamalloc,
            pinned_use_cuda_host_register: c.pinned_use_cuda_host_register,
            graph_capture_record_stream_reuse: c.graph_capture_record_stream_reuse,
            roundup_power2_divisions: c
                .roundup_power2_divisions
                .iter()
                .enumerate()
                .map(|(i, d)| ((1u64 << i).to_string(), *d))
                .collect(),
        }
    }
}

fn as_map<S: serde::Serializer>(v: &[(String, u64)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(v.len()))?;
    for (k, d) in v {
        m.serialize_entry(k, d)?;
    }
    m.end()
}

impl Snapshot {
    /// Builds the snapshot from copied state, symbolising stacks.
    pub fn from_raw(raw: &RawSnapshot) -> Self {
        let mut sym = Symbolizer::new();
        Self::from_raw_with(raw, &mut |f| sym.symbolize(f))
    }

    /// Builds the snapshot from copied state, naming each stack with `symbolize` (the
    /// notebook's: cell frames as `cell N` and their line).
    pub(crate) fn from_raw_with(raw: &RawSnapshot, symbolize: &mut dyn FnMut(&[usize]) -> Vec<Frame>) -> Self {
        let mut memo: HashMap<usize, Vec<Frame>> = HashMap::new();
        let mut frames_of = |f: &Option<crate::record::frames::Frames>| -> Vec<Frame> {
            match f {
                None => Vec::new(),
                Some(f) => memo.entry(f.as_ptr() as usize).or_insert_with(|| symbolize(f)).clone(),
            }
        };
        let segments = raw
            .segments
            .iter()
            .map(|s| Segment {
                device: raw.device,
                address: s.address,
                total_size: s.total_size,
                allocated_size: s.allocated_size(),
                active_size: s.active_size(),
                requested_size: s.requested_size(),
                stream: s.stream.0,
                segment_type: s.pool.name(),
                segment_pool_id: (0, 0),
                is_expandable: s.is_expandable,
                frames: frames_of(&s.frames),
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| BlockSnap {
                        address: b.addr,
                        size: b.size,
                        requested_size: b.requested_size,
                        state: b.state(),
                        frames: if b.active { frames_of(&b.frames) } else { Vec::new() },
                    })
                    .collect(),
            })
            .collect();
        let label = |id: u32| raw.labels.get(id as usize).cloned().unwrap_or_default();
        let trace = raw
            .trace
            .iter()
            .map(|e| {
                let oom = e.action == TraceAction::Oom;
                TraceSnap {
                    action: e.action.name(),
                    addr: (!oom).then_some(if e.action == TraceAction::Snapshot { 0 } else { e.addr }),
                    device_free: oom.then_some(e.addr),
                    size: e.size,
                    stream: e.stream.0,
                    time_us: e.time_us,
                    compile_context: "N/A",
                    user_metadata: label(e.label),
                    frames: e.frames.as_ref().map(|_| frames_of(&e.frames)),
                }
            })
            .collect();
        let mut device_traces: Vec<Vec<TraceSnap>> = (0..raw.device.max(0)).map(|_| Vec::new()).collect();
        device_traces.push(trace);
        Snapshot {
            segments,
            device_traces,
            allocator_settings: AllocatorSettings::of(&raw.config),
            external_annotations: Vec::new(),
            backend: raw.backend,
        }
    }

    /// A snapshot of no segments and no events, for `config`: what tracked allocations of a
    /// device are added to where no allocator of the crate is open there.
    pub(crate) fn empty(config: &crate::policy::config::AllocatorConfig, backend: crate::device::BackendKind) -> Self {
        Snapshot {
            segments: Vec::new(),
            device_traces: Vec::new(),
            allocator_settings: AllocatorSettings::of(config),
            external_annotations: Vec::new(),
            backend: Some(backend),
        }
    }

    /// "simulated device", "CUDA device" or "replay of a recorded trace", when known.
    pub fn source(&self) -> Option<&'static str> {
        self.backend.map(|b| match b {
            crate::device::BackendKind::Cuda => "CUDA device",
            crate::device::BackendKind::Simulated => "simulated device",
            crate::device::BackendKind::Replay => "replay of a recorded trace",
        })
    }

    /// Number of trace entries across devices.
    pub fn num_events(&self) -> usize {
        self.device_traces.iter().map(Vec::len).sum()
    }
}
