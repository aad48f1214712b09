//! A trace's allocation sequence replayed under any policy on a simulated device: what another
//! policy (our `compact:True`) would have reserved for the same program.
//!
//! Only the caller's events apply: each `alloc` is a malloc of the recorded size on the recorded
//! stream, each `free_requested` a free, and a free whose `free_completed` comes later (the block
//! was used on another stream) waits on an event of its own stream that completes at that line.
//! The trace's segment events are PyTorch's decisions, not ours: they only give PyTorch's
//! reserved peak, to compare with. Recorded `oom` lines are skipped (the request never
//! existed for the program); a request our policy cannot place on the device is counted.

use super::{TraceError, TraceLine, snapshot_of};
use crate::device::StreamId;
use crate::device::sim::SimBackend;
use crate::policy::{BlockId, DeviceState};
use crate::record::history::{RecordMode, TraceAction, TraceEntry};
use crate::snapshot::Snapshot;
use std::collections::{BTreeMap, HashMap, HashSet};

/// The outcome of a sequence replay.
#[derive(Clone, Debug)]
pub struct SequenceReport {
    /// Events in the trace.
    pub events: usize,
    /// `allocated_bytes.all.peak`.
    pub allocated_peak: i64,
    /// `reserved_bytes.all.peak`.
    pub reserved_peak: i64,
    /// `requested_bytes.all.peak`: the program's own peak, the least any policy can reserve.
    pub requested_peak: i64,
    /// PyTorch's reserved peak in the trace (its segment events summed in order).
    pub pytorch_reserved_peak: u64,
    /// `num_device_alloc`.
    pub num_device_alloc: i64,
    /// `num_device_free`.
    pub num_device_free: i64,
    /// Size of every new segment or mapped range, in order.
    pub segment_sizes: Vec<u64>,
    /// Allocations the policy could not place on the device (their frees are skipped).
    pub failed_allocs: usize,
    /// The trace's `oom` lines (not replayed).
    pub skipped_ooms: usize,
    /// The full `memory_stats()` at the end.
    pub stats: BTreeMap<String, i64>,
    state: DeviceState,
    /// Every replayed event, when `keep_history` was set; timestamps are the trace's.
    pub history: Vec<TraceEntry>,
}

impl SequenceReport {
    /// Reserved peak over PyTorch's (below 1: less memory than PyTorch).
    pub fn reserved_ratio(&self) -> f64 {
        self.reserved_peak as f64 / self.pytorch_reserved_peak.max(1) as f64
    }

    /// Recounts every invariant of the replay's end state.
    pub fn check_invariants(&self) -> Result<(), crate::policy::InvariantViolation> {
        self.state.check_invariants()
    }

    /// A snapshot of the replay's end state with the whole replayed history.
    pub fn snapshot(&self) -> Snapshot {
        snapshot_of(&self.state, &self.history, crate::device::BackendKind::Simulated)
    }
}

/// PyTorch's reserved peak in a trace: its segment allocations and maps less its frees and
/// unmaps, in order.
pub fn trace_reserved_peak(events: &[TraceLine]) -> u64 {
    let (mut now, mut peak) = (0u64, 0u64);
    for e in events {
        match e.action {
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => now += e.size,
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => now = now.saturating_sub(e.size),
            _ => {}
        }
        peak = peak.max(now);
    }
    peak
}

/// Replays the allocations and frees of `events` under `opts.config` on a simulated device of
/// `opts.device_total` bytes. `path` labels errors.
pub fn replay_sequence(
    events: &[TraceLine],
    opts: &super::ReplayOptions,
    path: &str,
) -> Result<SequenceReport, TraceError> {
    let fail =
        |line: usize, message: String| TraceError { path: path.to_string(), line: Some(line), device: None, message };
    let mut state = DeviceState::new(0, opts.config.clone());
    state.history.set_mode(RecordMode::All, usize::MAX);
    let mut dev = SimBackend::new(0, opts.device_total);
    // Lines of the free_requested events whose free_completed is not the next line.
    let later: HashSet<usize> = events
        .iter()
        .enumerate()
        .filter(|(i, e)| {
            e.action == TraceAction::FreeRequested
                && !events.get(i + 1).is_some_and(|n| n.action == TraceAction::FreeCompleted && n.addr == e.addr)
        })
        .map(|(_, e)| e.line)
        .collect();
    let mut live: HashMap<u64, BlockId> = HashMap::new();
    // Addresses whose allocation failed here (or was empty): their frees are skipped.
    let mut absent: HashSet<u64> = HashSet::new();
    // Blocks waiting for their recorded completion: address → the private stream to idle.
    let mut waiting: HashMap<u64, StreamId> = HashMap::new();
    let mut kept = opts.keep_history.then(Vec::new);
    let mut segment_sizes = Vec::new();
    let (mut failed_allocs, mut skipped_ooms) = (0, 0);
    for e in events {
        match e.action {
            TraceAction::Alloc => match state.malloc(&mut dev, e.size, e.stream) {
                Ok(a) => match a.block {
                    Some(b) if live.insert(e.addr, b).is_some() => {
                        return Err(fail(e.line, format!("alloc at address {} which is already allocated", e.addr)));
                    }
                    Some(_) => {}
                    None => {
                        absent.insert(e.addr);
                    }
                },
                Err(crate::error::AllocError::OutOfMemory(_)) => {
                    failed_allocs += 1;
                    absent.insert(e.addr);
                }
                Err(err) => return Err(fail(e.line, format!("device error: {err}"))),
            },
            TraceAction::FreeRequested => {
                let Some(b) = live.remove(&e.addr) else {
                    if absent.remove(&e.addr) {
                        continue;
                    }
                    return Err(fail(
                        e.line,
                        format!("free_requested of unknown address {} (no live allocation there)", e.addr),
                    ));
                };
                if later.contains(&e.line) {
                    let side = dev.new_stream();
                    dev.set_stream_busy(side, true);
                    state.record_stream(b, side).map_err(|err| fail(e.line, err.to_string()))?;
                    waiting.insert(e.addr, side);
                }
                state.free(&mut dev, b).map_err(|err| fail(e.line, err.to_string()))?;
            }
            TraceAction::FreeCompleted => {
                if let Some(side) = waiting.remove(&e.addr) {
                    dev.set_stream_busy(side, false);
                    state.process_events(&mut dev).map_err(|err| fail(e.line, err.to_string()))?;
                }
            }
            TraceAction::Oom => skipped_ooms += 1,
            _ => continue,
        }
        for mut entry in state.history.drain() {
            if matches!(entry.action, TraceAction::SegmentAlloc | TraceAction::SegmentMap) {
                segment_sizes.push(entry.size);
            }
            if let Some(k) = &mut kept {
                entry.time_us = e.time_us;
                k.push(entry);
            }
        }
    }
    let stats = state.stats().memory_stats();
    Ok(SequenceReport {
        events: events.len(),
        allocated_peak: stats["allocated_bytes.all.peak"],
        reserved_peak: stats["reserved_bytes.all.peak"],
        requested_peak: stats["requested_bytes.all.peak"],
        pytorch_reserved_peak: trace_reserved_peak(events),
        num_device_alloc: stats["num_device_alloc"],
        num_device_free: stats["num_device_free"],
        segment_sizes,
        failed_allocs,
        skipped_ooms,
        stats,
        state,
        history: kept.unwrap_or_default(),
    })
}
