//! The memory timeline: allocated, reserved, active and requested bytes after every event of a
//! trace, rebuilt from the trace's own geometry and PyTorch's rounding and split rules. A model
//! of the data (what [`crate::render`] draws as "memory over time"), beside the snapshot it is
//! usually read from.
#![forbid(unsafe_code)]

use super::Snapshot;
use crate::policy::config::AllocatorConfig;
use crate::policy::constants::{MIN_BLOCK_SIZE, SMALL_SIZE};
use crate::policy::rounding::{PoolKind, round_size};
use crate::record::history::{TraceAction, TraceEntry};
use crate::units::iec;
use std::collections::{BTreeMap, HashSet};

/// Totals after a number of events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelinePoint {
    /// Events applied so far (0 = before the first event).
    pub event: usize,
    /// Time of the last applied event (µs since the Unix epoch; 0 before the first).
    pub time_us: i64,
    /// Bytes in allocated blocks (`memory_allocated()`; rounded block sizes).
    pub allocated: u64,
    /// Bytes reserved from the device (`memory_reserved()`).
    pub reserved: u64,
    /// Bytes in active blocks (allocated or awaiting stream events).
    pub active: u64,
    /// Requested (unrounded) bytes of active blocks.
    pub requested: u64,
}

/// Allocated / reserved / active / requested bytes after every event of a trace.
///
/// A trace records the *requested* size of each allocation, not the block it got, so the
/// block size is recovered from the trace's own geometry: segments come from
/// `segment_alloc` / `segment_map`, live blocks from `alloc` … `free_completed`, and a new
/// block takes the front of the free gap at its address, rounded with PyTorch's `round_size`
/// and split (or not) with PyTorch's rule. For a trace recorded from the allocator's start
/// with the allocator's configuration this is exact: the last point equals
/// `memory_allocated()` / `memory_reserved()` and the maxima equal the peaks.
///
/// A trace that starts late (ring buffer full, recording switched on mid-way) still works:
/// segments and blocks freed before they were seen are taken as present from the start, and
/// a [`Snapshot`]'s end state supplies the rest; sizes that had to be guessed are counted in
/// [`MemoryTimeline::estimated`] and clear [`MemoryTimeline::exact`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryTimeline {
    /// What the events come from ("allocator history", "snapshot, device 0").
    pub source: String,
    /// `points[k]`: totals after `k` events; `points[0]` is the state before the first.
    pub points: Vec<TimelinePoint>,
    /// Event numbers (1-based, as in `points`) of out-of-memory events.
    pub ooms: Vec<usize>,
    /// Block sizes that could not be derived from the trace and were estimated.
    pub estimated: usize,
    /// Whether every total is exact (no estimates, consistent with any end state given).
    pub exact: bool,
    /// Why the totals are not exact, when they are not.
    pub note: Option<String>,
}

/// Something a [`MemoryTimeline`] can be built from.
pub trait TimelineSource {
    /// The timeline of this source.
    fn timeline(&self) -> MemoryTimeline;
}

impl TimelineSource for [TraceEntry] {
    fn timeline(&self) -> MemoryTimeline {
        MemoryTimeline::from_trace(self, &AllocatorConfig::default())
    }
}

impl TimelineSource for Vec<TraceEntry> {
    fn timeline(&self) -> MemoryTimeline {
        self.as_slice().timeline()
    }
}

impl TimelineSource for Snapshot {
    fn timeline(&self) -> MemoryTimeline {
        MemoryTimeline::from_snapshot(self)
    }
}

impl TimelineSource for MemoryTimeline {
    fn timeline(&self) -> MemoryTimeline {
        self.clone()
    }
}

/// One event, whatever it was read from.
#[derive(Clone, Copy, Debug)]
struct Ev {
    action: Option<TraceAction>,
    addr: u64,
    size: u64,
    time_us: i64,
}

impl From<&TraceEntry> for Ev {
    fn from(e: &TraceEntry) -> Self {
        Ev { action: Some(e.action), addr: e.addr, size: e.size, time_us: e.time_us }
    }
}

#[derive(Clone, Copy, Debug)]
struct Blk {
    size: u64,
    requested: u64,
    allocated: bool,
}

/// What is known of the state before the first event.
#[derive(Default)]
struct Initial {
    segments: Vec<(u64, u64)>,
    mapped: Vec<(u64, u64)>,
    /// (address, requested, allocated, exact size if known)
    blocks: Vec<(u64, u64, bool, Option<u64>)>,
}

struct Rebuild<'c> {
    cfg: &'c AllocatorConfig,
    segments: BTreeMap<u64, u64>,
    /// Mapped ranges of expandable segments, merged: start → end.
    mapped: BTreeMap<u64, u64>,
    blocks: BTreeMap<u64, Blk>,
    allocated: i64,
    reserved: i64,
    active: i64,
    requested: i64,
    estimated: usize,
    negative: bool,
}

impl<'c> Rebuild<'c> {
    fn new(cfg: &'c AllocatorConfig) -> Self {
        Rebuild {
            cfg,
            segments: BTreeMap::new(),
            mapped: BTreeMap::new(),
            blocks: BTreeMap::new(),
            allocated: 0,
            reserved: 0,
            active: 0,
            requested: 0,
            estimated: 0,
            negative: false,
        }
    }

    /// End of the segment or mapped range holding `addr`.
    fn region_end(&self, addr: u64) -> Option<u64> {
        if let Some((&s, &size)) = self.segments.range(..=addr).next_back()
            && addr < s.saturating_add(size)
        {
            return Some(s.saturating_add(size));
        }
        if let Some((_, &end)) = self.mapped.range(..=addr).next_back()
            && addr < end
        {
            return Some(end);
        }
        None
    }

    /// The size of the block an allocation of `req` bytes got at `addr`: the front of the free
    /// gap there, split off when PyTorch's `should_split` says so.
    fn block_size(&mut self, addr: u64, req: u64) -> u64 {
        let rounded = round_size(req, self.cfg);
        let Some(end) = self.region_end(addr) else {
            self.estimated += 1;
            return rounded;
        };
        let next = self.blocks.range(addr.saturating_add(1)..).next().map_or(u64::MAX, |(&a, _)| a).min(end);
        let avail = next.saturating_sub(addr);
        if avail < rounded {
            self.estimated += 1;
            return rounded;
        }
        let remaining = avail - rounded;
        let split = if PoolKind::for_size(rounded) == PoolKind::Small || self.cfg.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            rounded < self.cfg.max_split_size && remaining > SMALL_SIZE
        };
        if split { rounded } else { avail }
    }

    fn map(&mut self, addr: u64, size: u64) {
        let (mut start, mut end) = (addr, addr.saturating_add(size));
        if let Some((&s, &e)) = self.mapped.range(..=start).next_back()
            && e >= start
        {
            start = s;
            end = end.max(e);
            self.mapped.remove(&s);
        }
        while let Some((&s, &e)) = self.mapped.range(start..=end).next() {
            end = end.max(e);
            self.mapped.remove(&s);
        }
        self.mapped.insert(start, end);
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        let end = addr.saturating_add(size);
        let hit: Vec<(u64, u64)> =
            self.mapped.range(..end).filter(|&(_, &e)| e > addr).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in hit {
            self.mapped.remove(&s);
            if s < addr {
                self.mapped.insert(s, addr);
            }
            if e > end {
                self.mapped.insert(end, e);
            }
        }
    }

    fn seed(&mut self, init: &Initial) {
        for &(a, s) in &init.segments {
            self.segments.insert(a, s);
            self.reserved += s as i64;
        }
        for &(a, s) in &init.mapped {
            self.map(a, s);
            self.reserved += s as i64;
        }
        for &(a, req, allocated, size) in &init.blocks {
            let size = size.unwrap_or_else(|| {
                self.estimated += 1;
                round_size(req, self.cfg)
            });
            self.blocks.insert(a, Blk { size, requested: req, allocated });
            self.active += size as i64;
            self.requested += req as i64;
            if allocated {
                self.allocated += size as i64;
            }
        }
    }

    fn apply(&mut self, e: &Ev) {
        let Some(action) = e.action else { return };
        match action {
            TraceAction::SegmentAlloc => {
                self.segments.insert(e.addr, e.size);
                self.reserved += e.size as i64;
            }
            TraceAction::SegmentFree => {
                self.segments.remove(&e.addr);
                self.reserved -= e.size as i64;
            }
            TraceAction::SegmentMap => {
                self.map(e.addr, e.size);
                self.reserved += e.size as i64;
            }
            TraceAction::SegmentUnmap => {
                self.unmap(e.addr, e.size);
                self.reserved -= e.size as i64;
            }
            TraceAction::Alloc => {
                let size = self.block_size(e.addr, e.size);
                if let Some(old) = self.blocks.insert(e.addr, Blk { size, requested: e.size, allocated: true }) {
                    // A block we never saw freed: drop its contribution.
                    self.estimated += 1;
                    self.active -= old.size as i64;
                    self.requested -= old.requested as i64;
                    if old.allocated {
                        self.allocated -= old.size as i64;
                    }
                }
                self.allocated += size as i64;
                self.active += size as i64;
                self.requested += e.size as i64;
            }
            TraceAction::FreeRequested => match self.blocks.get_mut(&e.addr) {
                Some(b) if b.allocated => {
                    b.allocated = false;
                    self.allocated -= b.size as i64;
                }
                _ => self.estimated += 1,
            },
            TraceAction::FreeCompleted => match self.blocks.remove(&e.addr) {
                Some(b) => {
                    if b.allocated {
                        self.allocated -= b.size as i64;
                    }
                    self.active -= b.size as i64;
                    self.requested -= b.requested as i64;
                }
                None => self.estimated += 1,
            },
            TraceAction::Oom | TraceAction::Snapshot => {}
        }
    }

    fn point(&mut self, event: usize, time_us: i64) -> TimelinePoint {
        let mut clamp = |v: i64| {
            if v < 0 {
                self.negative = true;
            }
            v.max(0) as u64
        };
        TimelinePoint {
            event,
            time_us,
            allocated: clamp(self.allocated),
            reserved: clamp(self.reserved),
            active: clamp(self.active),
            requested: clamp(self.requested),
        }
    }
}

/// What the trace itself says existed before its first event: segments and blocks that are
/// freed (or unmapped) before they were ever allocated (or mapped) in it.
fn initial_from_trace(events: &[Ev]) -> Initial {
    let mut init = Initial::default();
    let mut seen_seg = HashSet::new();
    let mut seen_blk = HashSet::new();
    let mut mapped_seen: Vec<(u64, u64)> = Vec::new();
    for e in events {
        let Some(action) = e.action else { continue };
        // Whether this is the first event at its address (segment or block).
        let first_seg =
            matches!(action, TraceAction::SegmentAlloc | TraceAction::SegmentFree) && seen_seg.insert(e.addr);
        let first_blk = matches!(action, TraceAction::Alloc | TraceAction::FreeRequested | TraceAction::FreeCompleted)
            && seen_blk.insert(e.addr);
        match action {
            TraceAction::SegmentFree if first_seg => init.segments.push((e.addr, e.size)),
            TraceAction::SegmentMap => mapped_seen.push((e.addr, e.addr.saturating_add(e.size))),
            TraceAction::SegmentUnmap => {
                let end = e.addr.saturating_add(e.size);
                if !mapped_seen.iter().any(|&(s, x)| s < end && x > e.addr) {
                    init.mapped.push((e.addr, e.size));
                }
                mapped_seen.push((e.addr, end));
            }
            TraceAction::FreeRequested if first_blk => init.blocks.push((e.addr, e.size, true, None)),
            TraceAction::FreeCompleted if first_blk => init.blocks.push((e.addr, e.size, false, None)),
            _ => {}
        }
    }
    init
}

/// The allocator configuration a snapshot was taken under (what matters for block sizes).
fn config_of(snapshot: &Snapshot) -> AllocatorConfig {
    let s = &snapshot.allocator_settings;
    let mut cfg = AllocatorConfig {
        max_split_size: if s.max_split_size < 0 { u64::MAX } else { s.max_split_size as u64 },
        expandable_segments: s.expandable_segments,
        ..AllocatorConfig::default()
    };
    for (i, (_, d)) in s.roundup_power2_divisions.iter().enumerate() {
        if let Some(slot) = cfg.roundup_power2_divisions.get_mut(i) {
            *slot = *d;
        }
    }
    cfg
}

impl MemoryTimeline {
    /// The timeline of recorded events (oldest first), for an allocator with `config`.
    pub fn from_trace(entries: &[TraceEntry], config: &AllocatorConfig) -> Self {
        let events: Vec<Ev> = entries.iter().map(Ev::from).collect();
        let init = initial_from_trace(&events);
        let mut tl = Self::build(&events, &init, config, None);
        tl.source = "allocator history".to_string();
        tl
    }

    /// The timeline of a snapshot's trace (the device with data; the highest index if several),
    /// checked against, and completed by, the snapshot's end state.
    pub fn from_snapshot(snapshot: &Snapshot) -> Self {
        let device = snapshot_device(snapshot);
        Self::from_snapshot_device(snapshot, device)
    }

    /// The timeline of one device of a snapshot.
    pub fn from_snapshot_device(snapshot: &Snapshot, device: i32) -> Self {
        let cfg = config_of(snapshot);
        let trace = usize::try_from(device).ok().and_then(|d| snapshot.device_traces.get(d));
        let events: Vec<Ev> = trace
            .map(|t| {
                t.iter()
                    .map(|e| Ev {
                        action: TraceAction::from_name(e.action),
                        addr: e.addr.or(e.device_free).unwrap_or(0),
                        size: e.size,
                        time_us: e.time_us,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut init = initial_from_trace(&events);
        // The end state fills in what the trace never touched.
        let seg_addrs: HashSet<u64> = events
            .iter()
            .filter(|e| matches!(e.action, Some(TraceAction::SegmentAlloc | TraceAction::SegmentFree)))
            .map(|e| e.addr)
            .collect();
        let blk_addrs: HashSet<u64> = events
            .iter()
            .filter(|e| {
                matches!(e.action, Some(TraceAction::Alloc | TraceAction::FreeRequested | TraceAction::FreeCompleted))
            })
            .map(|e| e.addr)
            .collect();
        let maps: Vec<(u64, u64)> = events
            .iter()
            .filter(|e| matches!(e.action, Some(TraceAction::SegmentMap | TraceAction::SegmentUnmap)))
            .map(|e| (e.addr, e.addr.saturating_add(e.size)))
            .collect();
        let segs = snapshot.segments.iter().filter(|s| s.device == device);
        let (mut final_allocated, mut final_reserved) = (0u64, 0u64);
        for s in segs {
            final_allocated += s.allocated_size;
            final_reserved += s.total_size;
            if s.is_expandable {
                let end = s.address.saturating_add(s.total_size);
                // Mapped in part during the trace: the starting extent is not known exactly, and
                // the end-state check below tells whether it mattered.
                if !maps.iter().any(|&(a, e)| a < end && e > s.address) {
                    init.mapped.push((s.address, s.total_size));
                }
            } else if !seg_addrs.contains(&s.address) {
                init.segments.push((s.address, s.total_size));
            }
            for b in &s.blocks {
                if b.state != "inactive" && !blk_addrs.contains(&b.address) {
                    init.blocks.push((b.address, b.requested_size, b.state == "active_allocated", Some(b.size)));
                }
            }
        }
        let mut tl = Self::build(&events, &init, &cfg, Some((final_allocated, final_reserved)));
        tl.source = format!("snapshot, device {device}");
        tl
    }

    fn build(events: &[Ev], init: &Initial, cfg: &AllocatorConfig, end: Option<(u64, u64)>) -> Self {
        let mut r = Rebuild::new(cfg);
        r.seed(init);
        let mut points = Vec::with_capacity(events.len() + 1);
        let mut ooms = Vec::new();
        points.push(r.point(0, 0));
        for (i, e) in events.iter().enumerate() {
            r.apply(e);
            if e.action == Some(TraceAction::Oom) {
                ooms.push(i + 1);
            }
            points.push(r.point(i + 1, e.time_us));
        }
        let mut notes = Vec::new();
        if r.estimated > 0 {
            notes.push(format!("{} block sizes estimated (the trace does not cover them)", r.estimated));
        }
        if r.negative {
            notes.push("memory freed that the trace never allocated".to_string());
        }
        if let (Some((fa, fr)), Some(last)) = (end, points.last())
            && (last.allocated != fa || last.reserved != fr)
        {
            notes.push(format!(
                "end state differs from the snapshot's (allocated {} vs {}, reserved {} vs {})",
                iec(last.allocated),
                iec(fa),
                iec(last.reserved),
                iec(fr)
            ));
        }
        MemoryTimeline {
            source: String::new(),
            points,
            ooms,
            estimated: r.estimated,
            exact: notes.is_empty(),
            note: (!notes.is_empty()).then(|| notes.join("; ")),
        }
    }

    /// Number of events.
    pub fn events(&self) -> usize {
        self.points.len().saturating_sub(1)
    }

    /// The totals after the last event.
    pub fn last(&self) -> TimelinePoint {
        self.points.last().copied().unwrap_or_default()
    }

    /// The highest allocated bytes and the point it was reached.
    pub fn peak_allocated(&self) -> TimelinePoint {
        self.points.iter().copied().max_by_key(|p| (p.allocated, std::cmp::Reverse(p.event))).unwrap_or_default()
    }

    /// The highest reserved bytes and the point it was reached.
    pub fn peak_reserved(&self) -> TimelinePoint {
        self.points.iter().copied().max_by_key(|p| (p.reserved, std::cmp::Reverse(p.event))).unwrap_or_default()
    }
}

fn snapshot_device(snapshot: &Snapshot) -> i32 {
    let from_traces = snapshot.device_traces.iter().rposition(|t| !t.is_empty()).map(|d| d as i32);
    let from_segments = snapshot.segments.iter().map(|s| s.device).max();
    from_traces.max(from_segments).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::StreamId;
    use crate::units::MIB;

    fn ev(action: TraceAction, addr: u64, size: u64) -> TraceEntry {
        TraceEntry { action, addr, size, stream: StreamId::DEFAULT, time_us: 1, frames: None, label: 0 }
    }

    #[test]
    fn block_size_follows_split_rule() {
        use TraceAction::*;
        let a = 0x1000_0000;
        // 19.5 MiB in a 20 MiB segment: the 0.5 MiB rest is not split off (≤ 1 MiB).
        let t = vec![
            ev(SegmentAlloc, a, 20 * MIB),
            ev(Alloc, a, 19 * MIB + MIB / 2),
            ev(FreeRequested, a, 19 * MIB + MIB / 2),
            ev(FreeCompleted, a, 19 * MIB + MIB / 2),
            ev(Alloc, a, 3 * MIB),
            ev(Alloc, a + 3 * MIB, 1000),
        ];
        let tl = MemoryTimeline::from_trace(&t, &AllocatorConfig::default());
        assert_eq!(tl.points[2].allocated, 20 * MIB);
        assert_eq!(tl.points[3].allocated, 0);
        assert_eq!(tl.points[4].active, 0);
        assert_eq!(tl.points[5].allocated, 3 * MIB);
        // 1000 B rounds to 1024; the block is carved from the large segment's free rest, which
        // (17 MiB − 1024 B remaining) is split.
        assert_eq!(tl.points[6].allocated, 3 * MIB + 1024);
        assert_eq!(tl.last().reserved, 20 * MIB);
        assert!(tl.exact, "{:?}", tl.note);
    }

    #[test]
    fn late_trace_takes_unseen_segments_as_present() {
        use TraceAction::*;
        let t = vec![ev(FreeRequested, 0x2000, 512), ev(FreeCompleted, 0x2000, 512), ev(SegmentFree, 0x2000, 2 * MIB)];
        let tl = MemoryTimeline::from_trace(&t, &AllocatorConfig::default());
        assert_eq!(tl.points[0].reserved, 2 * MIB);
        assert_eq!(tl.points[0].allocated, 512);
        assert_eq!(tl.last().reserved, 0);
        assert_eq!(tl.estimated, 1);
        assert!(!tl.exact);
    }
}
