//! Snapshots of what tracking saw: the allocator's with every other allocation of its device
//! added, or tracking's alone where the notebook's code never opened the crate's allocator.

use super::{Tracking, TrackingStatus, lock, owners_for_report, state, status};
use crate::notebook::components;
use crate::record::component::Component;
use crate::record::frames::Frames;
use crate::snapshot::{BlockSnap, Segment, Snapshot, TraceSnap};
use crate::track::owner::Owners;
use crate::track::{Source, TrackedAlloc};
use std::collections::{BTreeMap, HashMap};

/// A stack's frames as a snapshot lists them, with what its memory is as one more frame,
/// the outermost (`component optimizer_state`, file [`COMPONENT_FILE`]) where it is more than
/// `other`: PyTorch's viewer shows it with the stack, and gpumem-replay reads it back.
fn snapshot_frames(
    owners: &mut Owners,
    f: &[usize],
    rules: &crate::record::component::Rules,
    generation: u64,
) -> Vec<crate::record::frames::Frame> {
    let mut v = owners.frames(f);
    let c = owners.component(f, rules, generation);
    if c != Component::Other {
        v.push(crate::record::frames::Frame {
            name: format!("component {}", c.key()),
            filename: crate::record::component::COMPONENT_FILE.into(),
            line: 0,
        });
    }
    v
}

/// The allocator's snapshot of `device` with every other live allocation on it added as a
/// segment of one block (its stack and label kept), and, while recording, their events in the
/// device's trace: what PyTorch's viewer and the offline page then show side by side.
pub fn snapshot(alloc: &crate::allocator::Allocator) -> Snapshot {
    let t = state();
    let snap = {
        let mut owners = owners_for_report(t);
        let owners = owners.get();
        components::with_rules(|rules, generation| {
            alloc.snapshot_with(&mut |f| snapshot_frames(owners, f, rules, generation))
        })
    };
    with_tracked(t, snap, alloc.device())
}

/// A snapshot of device `device` from tracking alone, for a notebook whose code never opened the
/// crate's allocator there (candle, burn, cudarc): every live tracked allocation as a segment and
/// the kept events as its trace, under the default configuration. `None` when tracking is not on.
pub(crate) fn tracked_snapshot(device: i32) -> Option<Snapshot> {
    let backend = match status() {
        TrackingStatus::Cupti { .. } => crate::device::BackendKind::Cuda,
        TrackingStatus::Simulated => crate::device::BackendKind::Simulated,
        _ => return None,
    };
    Some(tracked_only(state(), device, backend))
}

fn tracked_only(t: &Tracking, device: i32, backend: crate::device::BackendKind) -> Snapshot {
    let empty = Snapshot::empty(&crate::policy::config::AllocatorConfig::default(), backend);
    with_tracked(t, empty, device)
}

/// `snap` with every tracked allocation of `device` not made by the crate's allocator added: its
/// live ones as segments, the kept events in its trace.
fn with_tracked(t: &Tracking, mut snap: Snapshot, device: i32) -> Snapshot {
    let (foreign, events, labels) = {
        let tr = lock(&t.tracker);
        let foreign: Vec<TrackedAlloc> =
            tr.live().filter(|a| a.device == Some(device) && a.source != Source::Allocator).cloned().collect();
        let events: Vec<crate::track::TrackEvent> = tr
            .events()
            .filter(|e| e.block.device == Some(device) && e.block.source != Source::Allocator)
            .cloned()
            .collect();
        let labels: BTreeMap<u32, String> = foreign
            .iter()
            .map(|a| a.label)
            .chain(events.iter().map(|e| e.block.label))
            .map(|l| (l, tr.label_name(l).to_string()))
            .collect();
        (foreign, events, labels)
    };
    let mut owners = owners_for_report(t);
    let owners = owners.get();
    let mut memo: HashMap<usize, Vec<crate::record::frames::Frame>> = HashMap::new();
    let (rules, generation) = components::with_rules(|r, g| (r.clone(), g));
    let mut frames_of = |f: &Option<Frames>| match f {
        Some(f) => {
            memo.entry(f.as_ptr() as usize).or_insert_with(|| snapshot_frames(owners, f, &rules, generation)).clone()
        }
        None => Vec::new(),
    };
    let round = |n: u64| n.div_ceil(512) * 512;
    let meta = |label: u32, source: Source| {
        let l = labels.get(&label).map(String::as_str).unwrap_or("");
        if l.is_empty() { source.name().to_string() } else { format!("{l} · {}", source.name()) }
    };
    for a in &foreign {
        let frames = frames_of(&a.frames);
        snap.segments.push(Segment {
            device,
            address: a.addr,
            total_size: round(a.size),
            allocated_size: round(a.size),
            active_size: round(a.size),
            requested_size: a.size,
            stream: a.stream,
            segment_type: "large",
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: frames.clone(),
            blocks: vec![BlockSnap {
                address: a.addr,
                size: round(a.size),
                requested_size: a.size,
                state: "active_allocated",
                frames,
            }],
        });
    }
    snap.segments.sort_by_key(|s| (s.device, s.address));
    if !events.is_empty() {
        let d = device.max(0) as usize;
        while snap.device_traces.len() <= d {
            snap.device_traces.push(Vec::new());
        }
        let entry =
            |action: &'static str, e: &TrackedAlloc, size: u64, frames: &[crate::record::frames::Frame]| TraceSnap {
                action,
                addr: Some(e.addr),
                device_free: None,
                size,
                stream: e.stream,
                time_us: e.time_us,
                compile_context: "N/A",
                user_metadata: meta(e.label, e.source),
                frames: (!frames.is_empty()).then(|| frames.to_vec()),
            };
        let trace = &mut snap.device_traces[d];
        for ev in &events {
            let e = &ev.block;
            let frames = frames_of(&e.frames);
            if ev.alloc {
                trace.push(entry("segment_alloc", e, round(e.size), &frames));
                trace.push(entry("alloc", e, e.size, &frames));
            } else {
                trace.push(entry("free_requested", e, e.size, &frames));
                trace.push(entry("free_completed", e, e.size, &frames));
                trace.push(entry("segment_free", e, round(e.size), &frames));
            }
        }
        trace.sort_by_key(|t| t.time_us);
    }
    snap
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{DriverCall, DriverEvent, DriverKind};
    use crate::notebook::tracking::DEFAULT_EVENTS;

    fn call(t: &Tracking, call: DriverCall) {
        let ev = DriverEvent { call, device: Some(0), api: "cuMemAllocAsync", ours: false };
        let mut tracker = lock(&t.tracker);
        let time = tracker.events_seen as i64;
        tracker.record(&ev, None, time);
    }

    /// What the default ring holds at most, as the docs say it (BENCHMARKS.md, GUIDE.md): its
    /// events' own bytes, their stacks being shared with the books.
    #[test]
    fn the_default_ring_holds_at_most_eight_megabytes() {
        let each = std::mem::size_of::<crate::track::TrackEvent>();
        println!("{each} bytes an event, {} in all", each * DEFAULT_EVENTS);
        assert!(each * DEFAULT_EVENTS <= 8_000_000, "{each} bytes an event");
    }

    /// A session whose code never opened the crate's allocator (candle on a GPU): its snapshot is
    /// tracking's alone, and `fit` plans from the default ring with the session's tracked peak.
    #[test]
    fn a_session_without_the_allocator_plans_from_the_default_ring() {
        const MIB: u64 = 1 << 20;
        let t = Tracking::new();
        lock(&t.tracker).keep_by_default(DEFAULT_EVENTS);
        let alloc = |addr, size| DriverCall::Alloc { kind: DriverKind::Pool, addr, size, stream: 7 };
        call(&t, alloc(0x1000_0000, 100 * MIB));
        // Not a multiple of the driver's 2 MiB: the plan's live peak rounds it, the session's
        // tracked peak does not (an H100's candle session: 8,256,492 B apart, 2026-12-07).
        call(&t, alloc(0x9000_0000, 300 * MIB + 12_345));
        call(&t, DriverCall::Free { addr: 0x9000_0000 });
        call(&t, alloc(0x5000_0000, 50 * MIB));
        let peak = lock(&t.tracker).totals()[&Some(0)].total.peak;
        assert_eq!(peak, 400 * MIB + 12_345);

        let snap = tracked_only(&t, 0, crate::device::BackendKind::Cuda);
        assert_eq!(snap.segments.iter().map(|s| s.requested_size).sum::<u64>(), 150 * MIB, "live ones");
        let plan = crate::plan::fit_snapshot(&snap, 24 << 30).unwrap();
        assert_eq!(plan.requested_peak, peak, "the session's tracked peak");
        assert_eq!(plan.live_peak, 402 * MIB, "at the driver's granularity");
        assert_eq!(plan.before_recording, (0, 0), "every event kept: nothing before");
        assert!(plan.policies.iter().all(|p| p.fits), "{:?}", plan.policies);
        let small = crate::plan::fit_snapshot(&snap, 256 * MIB).unwrap();
        assert!(small.policies.iter().all(|p| !p.fits), "{:?}", small.policies);

        // Nothing kept: said, not planned.
        let off = Tracking::new();
        call(&off, alloc(0x1000_0000, 100 * MIB));
        let err = crate::plan::fit_snapshot(&tracked_only(&off, 0, crate::device::BackendKind::Cuda), 1 << 30);
        assert!(err.is_err());
    }
}
