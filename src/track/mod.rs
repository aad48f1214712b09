//! Every device allocation of the process, whoever made it: the books kept from driver events
//! ([`crate::device::driver`]), as pure code.
//!
//! [`Tracker`] receives each event with its stack (raw return addresses) and the current label
//! (the notebook cell), and keeps: the live allocations (address → size, kind, device, source,
//! label, stack, time), live and peak bytes per device and per [`Source`], independent peak
//! slots (a cell's exact peak over all sources, whatever else measures at the same time), and,
//! while recording, the events themselves for snapshots and timelines.
//!
//! Virtual-memory allocations follow the driver's rule: `cuMemCreate`'s bytes count until the
//! handle is released (its last reference) and unmapped everywhere. Address space alone
//! (`cuMemAddressReserve`) is not memory and is not counted.
//!
//! Nothing here knows CUPTI or a device: the process-wide glue (which events arrive, when
//! tracking starts) is `crate::notebook::tracking`; who made an allocation is [`owner`].
#![forbid(unsafe_code)]

pub(crate) mod changes;
pub(crate) mod owner;
pub(crate) mod stacks;

use crate::device::{DriverCall, DriverEvent, DriverKind};
use crate::record::frames::Frames;
use crate::record::labels::Labels;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Who holds the memory, as reports group it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Source {
    /// gpumem-nb's own caching allocator (its segments and mapped pages).
    Allocator,
    /// The CUDA stream-ordered pool (`cuMemAllocAsync`): cudarc's `CudaSlice`, candle.
    Pool,
    /// Plain driver allocations (`cuMemAlloc`, `cudaMalloc`): cuBLAS workspaces, libtorch,
    /// burn/cubecl, the runtime.
    Driver,
    /// Virtual-memory physical allocations (`cuMemCreate`) of other code.
    Vmm,
    /// Unified memory (`cuMemAllocManaged`).
    Managed,
    /// Page-locked host memory (`cuMemHostAlloc`, `cudaMallocHost`): on the host, not the device.
    HostPinned,
}

impl Source {
    /// Every source, in report order.
    pub(crate) const ALL: [Source; 6] =
        [Source::Allocator, Source::Pool, Source::Driver, Source::Vmm, Source::Managed, Source::HostPinned];

    /// The name reports show.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Source::Allocator => "gpumem-nb allocator",
            Source::Pool => "CUDA pool (cuMemAllocAsync)",
            Source::Driver => "driver (cuMemAlloc)",
            Source::Vmm => "VMM (cuMemCreate)",
            Source::Managed => "managed (cuMemAllocManaged)",
            Source::HostPinned => "host pinned (cuMemHostAlloc)",
        }
    }

    /// The short key used in data (`allocator`, `pool`, `driver`, `vmm`, `managed`, `host_pinned`).
    pub(crate) fn key(self) -> &'static str {
        match self {
            Source::Allocator => "allocator",
            Source::Pool => "pool",
            Source::Driver => "driver",
            Source::Vmm => "vmm",
            Source::Managed => "managed",
            Source::HostPinned => "host_pinned",
        }
    }

    fn of(kind: DriverKind, ours: bool) -> Source {
        if ours {
            return Source::Allocator;
        }
        match kind {
            DriverKind::Alloc => Source::Driver,
            DriverKind::Pool => Source::Pool,
            DriverKind::Vmm => Source::Vmm,
            DriverKind::Managed => Source::Managed,
            DriverKind::HostPinned => Source::HostPinned,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Where memory lives: a device (CUDA ordinal) or the host.
pub(crate) type Place = Option<i32>;

/// One live allocation (or, for virtual memory, one physical handle).
#[derive(Clone, Debug)]
pub(crate) struct TrackedAlloc {
    /// Address (for a handle: the address it was first mapped at, 0 before that).
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// Device, or `None` on the host.
    pub device: Place,
    /// Who holds it.
    pub source: Source,
    /// The stream of a stream-ordered allocation.
    pub stream: u64,
    /// Label id at allocation (see [`Tracker::label_name`]).
    pub label: u32,
    /// The allocating stack, when stacks were captured.
    pub frames: Option<Frames>,
    /// Its interned id ([`stacks::StackBooks`]; 0: none).
    pub stack: stacks::StackId,
    /// Microseconds since the Unix epoch.
    pub time_us: i64,
}

/// Live and peak bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Level {
    /// Bytes now.
    pub live: u64,
    /// Highest `live` seen.
    pub peak: u64,
}

impl Level {
    fn add(&mut self, n: u64) {
        self.live += n;
        self.peak = self.peak.max(self.live);
    }
    fn sub(&mut self, n: u64) {
        self.live = self.live.saturating_sub(n);
    }
}

/// One place's totals: everything, and each source.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PlaceTotals {
    /// All sources together.
    pub total: Level,
    /// By source, indexed by [`Source`] order ([`Source::ALL`]).
    pub by_source: [Level; 6],
}

impl PlaceTotals {
    fn add(&mut self, s: Source, n: u64) {
        self.total.add(n);
        self.by_source[s.index()].add(n);
    }
    fn sub(&mut self, s: Source, n: u64) {
        self.total.sub(n);
        self.by_source[s.index()].sub(n);
    }
    /// A source's level.
    pub(crate) fn source(&self, s: Source) -> Level {
        self.by_source[s.index()]
    }
    /// Starts a peak window at the current values.
    fn restart(&mut self) {
        self.total.peak = self.total.live;
        for l in &mut self.by_source {
            l.peak = l.live;
        }
    }
}

/// An independent peak tracker over every place and source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TrackSlot(u32);

/// Which tracked events are kept for snapshots, and why.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Recording {
    /// None.
    #[default]
    Off,
    /// The last N, kept without being asked (gpumem-kernel's notebooks: `%gpumem fit` from any
    /// session).
    Default(usize),
    /// The last N, asked for (`%gpumem record on`, a snapshot scope).
    Asked(usize),
}

/// A recorded event (while recording), for snapshots and timelines.
#[derive(Clone, Debug)]
pub(crate) struct TrackEvent {
    /// `true` for an allocation, `false` for a release.
    pub alloc: bool,
    /// The allocation it made or released.
    pub block: TrackedAlloc,
}

#[derive(Clone, Debug)]
struct Handle {
    alloc: TrackedAlloc,
    refs: u32,
    maps: u32,
}

/// The books. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    // Keyed by address with the fast word hasher (SipHash cost a tenth of a tracked allocation).
    live: HashMap<u64, TrackedAlloc, stacks::Fast>,
    handles: HashMap<u64, Handle, stacks::Fast>,
    /// VMM mappings: address → (size, handle).
    maps: BTreeMap<u64, (u64, u64)>,
    totals: BTreeMap<Place, PlaceTotals>,
    slots: Vec<Option<BTreeMap<Place, PlaceTotals>>>,
    labels: Labels,
    label: u32,
    recording: Recording,
    events: VecDeque<TrackEvent>,
    stacks: stacks::StackBooks,
    /// The order of changes while a slot is open (components' peaks).
    changes: changes::ChangeLog,
    /// Releases of memory allocated before tracking started (or by an untracked call).
    pub untracked_frees: u64,
    /// Driver events received.
    pub events_seen: u64,
    /// The first allocation the driver refused since the last [`Tracker::take_failure`], and
    /// how many it refused in all since then.
    failure: Option<(Failure, u64)>,
}

/// An allocation the driver refused for want of memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    /// Where it was asked for (`None`: pinned host memory).
    pub device: Place,
    /// How.
    pub kind: DriverKind,
    /// Bytes asked for.
    pub size: u64,
    /// The driver entry point (`cuMemAllocAsync`).
    pub api: &'static str,
    /// Who asked (its stack).
    pub frames: Option<Frames>,
    /// The label then ("cell 3").
    pub label: String,
    /// When, µs since the epoch.
    pub time_us: i64,
}

impl Tracker {
    /// Empty books.
    pub(crate) fn new() -> Self {
        Tracker::default()
    }

    /// Labels allocations from now on (e.g. "cell 3"); `None` clears the label.
    pub(crate) fn set_label(&mut self, label: Option<&str>) {
        self.label = self.labels.intern(label);
    }

    /// The live allocation at `addr` (a segment of the allocator: its driver allocation).
    pub(crate) fn live_at(&self, addr: u64) -> Option<&TrackedAlloc> {
        self.live.get(&addr)
    }

    /// The text of a label id ("" for none).
    pub(crate) fn label_name(&self, id: u32) -> &str {
        self.labels.name(id)
    }

    /// Keeps the last `max_entries` events for snapshots (`None`: stop recording, forget them).
    /// A recording asked for while only the default ring was kept starts empty, as PyTorch's
    /// `_record_memory_history` does (what came before is the snapshot's "before recording").
    pub(crate) fn set_recording(&mut self, max_entries: Option<usize>) {
        if max_entries.is_none() || matches!(self.recording, Recording::Default(_)) {
            self.events.clear();
        }
        self.recording = max_entries.map_or(Recording::Off, Recording::Asked);
    }

    /// Keeps the last `max_entries` events unless a recording was asked for: what `fit` plans
    /// from in a session that never asked to record.
    pub(crate) fn keep_by_default(&mut self, max_entries: usize) {
        if self.recording == Recording::Off {
            self.recording = Recording::Default(max_entries);
        }
    }

    /// What is kept now.
    pub(crate) fn recording(&self) -> Recording {
        self.recording
    }

    /// Puts back what was kept before ([`Tracker::recording`]), keeping the events (`Off`
    /// forgets them).
    pub(crate) fn restore_recording(&mut self, before: Recording) {
        if before == Recording::Off {
            self.events.clear();
        }
        self.recording = before;
    }

    /// The recorded events, oldest first.
    pub(crate) fn events(&self) -> impl Iterator<Item = &TrackEvent> {
        self.events.iter()
    }

    /// The id of a stack, its shared copy ([`stacks::StackBooks::intern`]) and whether the books
    /// saw it for the first time.
    pub(crate) fn intern(&mut self, frames: &[usize]) -> (stacks::StackId, Frames, bool) {
        let seen = self.stacks.count();
        let (id, shared) = self.stacks.intern(Some(frames));
        (id, shared.unwrap_or_else(|| Frames::from(frames)), id as usize > seen)
    }

    /// Applies one driver event. `stack` is the allocating stack, interned (captured by the
    /// caller on the allocating thread), `time_us` the time.
    pub(crate) fn record(&mut self, ev: &DriverEvent, mut stack: Option<(stacks::StackId, Frames)>, time_us: i64) {
        self.events_seen += 1;
        let label = self.label;
        match ev.call {
            // Zero bytes or address 0 carry no memory (cudarc's null stream allocates 0 bytes)
            // and would alias each other at address 0.
            DriverCall::Alloc { size: 0, .. } | DriverCall::Alloc { addr: 0, .. } | DriverCall::Free { addr: 0 } => {}
            DriverCall::Alloc { kind, addr, size, stream } => {
                let device = if kind.is_host() { None } else { ev.device };
                let (stack, frames) = stack.take().map_or((0, None), |(id, f)| (id, Some(f)));
                let a = TrackedAlloc {
                    addr,
                    size,
                    device,
                    source: Source::of(kind, ev.ours),
                    stream,
                    label,
                    frames,
                    stack,
                    time_us,
                };
                if let Some(old) = self.live.insert(addr, a.clone()) {
                    // A release we never saw: take the old one out first.
                    self.sub(old.device, old.source, old.size);
                    self.stacks.sub(old.device, (old.stack, old.label), old.size);
                    self.log(&old, false);
                }
                self.add_at(&a);
                self.log(&a, true);
                self.note(true, &a);
            }
            DriverCall::Free { addr } => match self.live.remove(&addr) {
                Some(a) => {
                    self.sub(a.device, a.source, a.size);
                    self.stacks.sub(a.device, (a.stack, a.label), a.size);
                    self.log(&a, false);
                    self.note(false, &TrackedAlloc { time_us, ..a });
                }
                None => self.untracked_frees += 1,
            },
            DriverCall::Create { handle, size } => {
                let (stack, frames) = stack.take().map_or((0, None), |(id, f)| (id, Some(f)));
                let a = TrackedAlloc {
                    addr: 0,
                    size,
                    device: ev.device,
                    source: Source::of(DriverKind::Vmm, ev.ours),
                    stream: 0,
                    label,
                    frames,
                    stack,
                    time_us,
                };
                self.add_at(&a);
                self.log(&a, true);
                if let Some(old) = self.handles.insert(handle, Handle { alloc: a, refs: 1, maps: 0 }) {
                    self.sub(old.alloc.device, old.alloc.source, old.alloc.size);
                    self.stacks.sub(old.alloc.device, (old.alloc.stack, old.alloc.label), old.alloc.size);
                    self.log(&old.alloc, false);
                }
            }
            DriverCall::Retain { handle } => {
                if let Some(h) = self.handles.get_mut(&handle) {
                    h.refs += 1;
                }
            }
            DriverCall::Release { handle } => match self.handles.get_mut(&handle) {
                Some(h) => {
                    h.refs = h.refs.saturating_sub(1);
                    self.drop_handle_if_gone(handle, time_us);
                }
                None => self.untracked_frees += 1,
            },
            DriverCall::Map { va, size, handle } => {
                self.maps.insert(va, (size, handle));
                if let Some(h) = self.handles.get_mut(&handle) {
                    h.maps += 1;
                    if h.maps == 1 {
                        h.alloc.addr = va;
                        let a = h.alloc.clone();
                        self.note(true, &a);
                    }
                }
            }
            DriverCall::Unmap { va, size } => {
                let end = va.saturating_add(size);
                let hit: Vec<u64> = self.maps.range(va..end).map(|(&a, _)| a).collect();
                for a in hit {
                    if let Some((_, handle)) = self.maps.remove(&a)
                        && let Some(h) = self.handles.get_mut(&handle)
                    {
                        h.maps = h.maps.saturating_sub(1);
                        self.drop_handle_if_gone(handle, time_us);
                    }
                }
            }
            DriverCall::Claim { addr } => self.claim(addr),
            DriverCall::Failed { kind, size } => match &mut self.failure {
                Some((_, count)) => *count += 1,
                None => {
                    let device = if kind.is_host() { None } else { ev.device };
                    let frames = stack.take().map(|(_, f)| f);
                    let label = self.labels.name(label).to_string();
                    let f = Failure { device, kind, size, api: ev.api, frames, label, time_us };
                    self.failure = Some((f, 1));
                }
            },
        }
    }

    /// The first allocation the driver refused since the last call, and how many it refused in
    /// all since then; forgets them.
    pub(crate) fn take_failure(&mut self) -> Option<(Failure, u64)> {
        self.failure.take()
    }

    /// The allocation (or mapping) at `addr` is gpumem-nb's allocator's: its bytes move to
    /// [`Source::Allocator`].
    fn claim(&mut self, addr: u64) {
        if let Some(a) = self.live.get_mut(&addr) {
            let (device, old, size, stack) = (a.device, a.source, a.size, a.stack);
            if old != Source::Allocator {
                a.source = Source::Allocator;
                self.sub(device, old, size);
                self.add(device, Source::Allocator, size);
                self.moved_to_allocator(device, addr, stack, size);
            }
            return;
        }
        let Some(&(_, handle)) = self.maps.get(&addr) else { return };
        if let Some(h) = self.handles.get_mut(&handle) {
            let (device, old, size, stack) = (h.alloc.device, h.alloc.source, h.alloc.size, h.alloc.stack);
            if old != Source::Allocator {
                h.alloc.source = Source::Allocator;
                self.sub(device, old, size);
                self.add(device, Source::Allocator, size);
                self.moved_to_allocator(device, addr, stack, size);
            }
        }
    }

    /// A driver allocation became a segment of gpumem-nb's allocator: so the log says.
    fn moved_to_allocator(&mut self, place: Place, addr: u64, stack: stacks::StackId, size: u64) {
        self.changes.push(place, addr, stack, -(size as i64), changes::Of::Driver);
        self.changes.push(place, addr, stack, size as i64, changes::Of::Segment);
    }

    /// Logs an allocation made (`alloc`) or released, for components' peaks.
    fn log(&mut self, a: &TrackedAlloc, alloc: bool) {
        let of = if a.source == Source::Allocator { changes::Of::Segment } else { changes::Of::Driver };
        let delta = if alloc { a.size as i64 } else { -(a.size as i64) };
        self.changes.push(a.device, a.addr, a.stack, delta, of);
    }

    /// A block of gpumem-nb's allocator at `place` handed out (`frames`: its stack) or freed.
    pub(crate) fn block(&mut self, place: Place, alloc: bool, addr: u64, size: u64, frames: Option<&[usize]>) {
        if alloc {
            let (stack, _) = self.stacks.intern(frames);
            self.changes.block_alloc(place, addr, size, stack);
        } else {
            self.changes.block_free(place, addr);
        }
    }

    /// The changes logged since `slot` opened (`None`: not open, or too many to keep).
    pub(crate) fn changes_since(&self, slot: TrackSlot) -> Option<&[changes::Change]> {
        self.changes.since(slot.0 as usize)
    }

    fn drop_handle_if_gone(&mut self, handle: u64, time_us: i64) {
        let gone = self.handles.get(&handle).is_some_and(|h| h.refs == 0 && h.maps == 0);
        if gone && let Some(h) = self.handles.remove(&handle) {
            self.sub(h.alloc.device, h.alloc.source, h.alloc.size);
            self.stacks.sub(h.alloc.device, (h.alloc.stack, h.alloc.label), h.alloc.size);
            self.log(&h.alloc, false);
            if h.alloc.addr != 0 {
                self.note(false, &TrackedAlloc { time_us, ..h.alloc });
            }
        }
    }

    fn note(&mut self, alloc: bool, a: &TrackedAlloc) {
        let (Recording::Default(max) | Recording::Asked(max)) = self.recording else { return };
        if max == 0 {
            return;
        }
        while self.events.len() >= max {
            self.events.pop_front();
        }
        // Grown by doubling up to the ring's size and no further: what it holds is bounded by
        // `max` events, not by the next power of two.
        if self.events.len() == self.events.capacity() {
            let want = (self.events.capacity() * 2).max(16).min(max);
            self.events.reserve_exact(want - self.events.len());
        }
        self.events.push_back(TrackEvent { alloc, block: a.clone() });
    }

    /// Counts a new allocation in the totals and in the books by stack.
    fn add_at(&mut self, a: &TrackedAlloc) {
        let peak = self.totals.get(&a.device).map_or(0, |t| t.total.peak);
        self.add(a.device, a.source, a.size);
        let new_peak = self.totals.get(&a.device).is_some_and(|t| t.total.peak > peak);
        self.stacks.add(a.device, (a.stack, a.label), a.size, new_peak);
    }

    /// Live bytes by (stack, label) per place, and at each place's peak since tracking began.
    pub(crate) fn stack_books(&self) -> &stacks::StackBooks {
        &self.stacks
    }

    fn add(&mut self, place: Place, s: Source, n: u64) {
        self.change(place, |t| t.add(s, n));
    }

    fn sub(&mut self, place: Place, s: Source, n: u64) {
        self.change(place, |t| t.sub(s, n));
    }

    /// Applies a change to a place's totals and to every open slot's view of it (a place first
    /// touched during a slot's window starts there from its values before the change).
    fn change(&mut self, place: Place, f: impl Fn(&mut PlaceTotals)) {
        let before = self.totals.entry(place).or_default();
        let mut start = before.clone();
        start.restart();
        f(before);
        for slot in self.slots.iter_mut().flatten() {
            f(slot.entry(place).or_insert_with(|| start.clone()));
        }
    }

    /// Live and peak bytes of every place seen (peaks since tracking began).
    pub(crate) fn totals(&self) -> &BTreeMap<Place, PlaceTotals> {
        &self.totals
    }

    /// Opens a peak slot starting at the current values.
    pub(crate) fn open_slot(&mut self) -> TrackSlot {
        let mut now = self.totals.clone();
        for t in now.values_mut() {
            t.restart();
        }
        let i = match self.slots.iter().position(Option::is_none) {
            Some(i) => {
                self.slots[i] = Some(now);
                i
            }
            None => {
                self.slots.push(Some(now));
                self.slots.len() - 1
            }
        };
        self.changes.open(i);
        TrackSlot(i as u32)
    }

    /// Live and peak bytes per place since the slot was opened (places untouched since then
    /// report their current values as peaks).
    pub(crate) fn slot(&self, id: TrackSlot) -> Option<BTreeMap<Place, PlaceTotals>> {
        let slot = self.slots.get(id.0 as usize)?.as_ref()?;
        let mut out = slot.clone();
        for (place, t) in &self.totals {
            out.entry(*place).or_insert_with(|| {
                let mut t = t.clone();
                t.restart();
                t
            });
        }
        Some(out)
    }

    /// Closes a slot, returning what [`Tracker::slot`] would.
    pub(crate) fn close_slot(&mut self, id: TrackSlot) -> Option<BTreeMap<Place, PlaceTotals>> {
        let r = self.slot(id);
        if let Some(s) = self.slots.get_mut(id.0 as usize) {
            *s = None;
        }
        self.changes.close(id.0 as usize);
        r
    }

    /// The live allocations (and VMM handles), in no particular order.
    pub(crate) fn live(&self) -> impl Iterator<Item = &TrackedAlloc> {
        self.live.values().chain(self.handles.values().map(|h| &h.alloc))
    }

    /// Recounts the totals from the live allocations; `Err` names the first mismatch.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut recount: BTreeMap<Place, [u64; 6]> = BTreeMap::new();
        for a in self.live() {
            recount.entry(a.device).or_default()[a.source.index()] += a.size;
        }
        for (place, t) in &self.totals {
            let r = recount.remove(place).unwrap_or_default();
            for s in Source::ALL {
                if t.source(s).live != r[s.index()] {
                    return Err(format!(
                        "{place:?} {}: counted {} live, recount {}",
                        s.key(),
                        t.source(s).live,
                        r[s.index()]
                    ));
                }
            }
            if t.total.live != r.iter().sum::<u64>() {
                return Err(format!("{place:?}: total {} is not the sum of its sources", t.total.live));
            }
        }
        match recount.into_iter().find(|(_, r)| r.iter().any(|&b| b > 0)) {
            Some((place, _)) => Err(format!("{place:?} holds live allocations but has no totals")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    fn ev(call: DriverCall, device: Option<i32>, ours: bool) -> DriverEvent {
        DriverEvent { call, device, api: "test", ours }
    }

    fn alloc(t: &mut Tracker, kind: DriverKind, addr: u64, size: u64) {
        t.record(&ev(DriverCall::Alloc { kind, addr, size, stream: 0 }, Some(0), false), None, 1);
        t.check().unwrap();
    }

    fn free(t: &mut Tracker, addr: u64) {
        t.record(&ev(DriverCall::Free { addr }, Some(0), false), None, 2);
        t.check().unwrap();
    }

    /// The default ring keeps events until a recording is asked for, which starts empty (as
    /// PyTorch's does); one asked for keeps its events when asked again; off forgets them; a
    /// snapshot scope puts back what it found.
    #[test]
    fn a_recording_asked_for_starts_where_the_default_ring_was() {
        let mut t = Tracker::new();
        alloc(&mut t, DriverKind::Pool, 0x1000, MIB);
        assert_eq!((t.recording(), t.events().count()), (Recording::Off, 0));
        t.keep_by_default(2);
        alloc(&mut t, DriverKind::Pool, 0x2000, MIB);
        alloc(&mut t, DriverKind::Pool, 0x3000, MIB);
        alloc(&mut t, DriverKind::Pool, 0x4000, MIB);
        let addrs = |t: &Tracker| t.events().map(|e| e.block.addr).collect::<Vec<_>>();
        assert_eq!(addrs(&t), [0x3000, 0x4000], "the last two");
        let before = t.recording();
        assert_eq!(before, Recording::Default(2));
        t.set_recording(Some(10));
        assert_eq!((t.recording(), addrs(&t)), (Recording::Asked(10), vec![]));
        free(&mut t, 0x4000);
        t.keep_by_default(2);
        assert_eq!(t.recording(), Recording::Asked(10), "a recording asked for stays");
        t.set_recording(Some(10));
        assert_eq!(addrs(&t), [0x4000], "asked again: kept");
        t.restore_recording(before);
        assert_eq!((t.recording(), addrs(&t)), (Recording::Default(2), vec![0x4000]));
        t.set_recording(None);
        assert_eq!((t.recording(), addrs(&t)), (Recording::Off, vec![]));
        t.keep_by_default(2);
        assert_eq!(t.recording(), Recording::Default(2), "and back to the default");

        // Memory: never more slots than the ring holds.
        let mut t = Tracker::new();
        t.keep_by_default(1000);
        for i in 0..1500u64 {
            alloc(&mut t, DriverKind::Pool, 0x1000 * (i + 1), 4096);
        }
        assert_eq!((t.events().count(), t.events.capacity()), (1000, 1000));
    }

    #[test]
    fn totals_follow_allocations_by_source() {
        let mut t = Tracker::new();
        alloc(&mut t, DriverKind::Alloc, 0x1000, 100 * MIB);
        alloc(&mut t, DriverKind::Pool, 0x9000_0000, 48 * MIB);
        t.record(
            &ev(DriverCall::Alloc { kind: DriverKind::HostPinned, addr: 0x77, size: MIB, stream: 0 }, Some(0), false),
            None,
            1,
        );
        let d0 = &t.totals()[&Some(0)];
        assert_eq!(d0.total, Level { live: 148 * MIB, peak: 148 * MIB });
        assert_eq!(d0.source(Source::Driver).live, 100 * MIB);
        assert_eq!(d0.source(Source::Pool).live, 48 * MIB);
        assert_eq!(t.totals()[&None].source(Source::HostPinned).live, MIB, "pinned memory is the host's");
        free(&mut t, 0x1000);
        let d0 = &t.totals()[&Some(0)];
        assert_eq!(d0.total, Level { live: 48 * MIB, peak: 148 * MIB });
        free(&mut t, 0xdead);
        assert_eq!(t.untracked_frees, 1);
    }

    #[test]
    fn a_slot_sees_the_exact_peak_of_its_window() {
        let mut t = Tracker::new();
        alloc(&mut t, DriverKind::Alloc, 0x1000, 500 * MIB);
        free(&mut t, 0x1000);
        let slot = t.open_slot();
        alloc(&mut t, DriverKind::Alloc, 0x2000, 300 * MIB);
        free(&mut t, 0x2000);
        let inner = t.open_slot();
        alloc(&mut t, DriverKind::Pool, 0x3000, 10 * MIB);
        let s = t.slot(slot).unwrap();
        assert_eq!(s[&Some(0)].total, Level { live: 10 * MIB, peak: 300 * MIB }, "not the 500 MiB from before");
        assert_eq!(t.slot(inner).unwrap()[&Some(0)].total.peak, 10 * MIB);
        t.close_slot(inner);
        assert!(t.slot(inner).is_none());
        assert_eq!(t.close_slot(slot).unwrap()[&Some(0)].source(Source::Driver).peak, 300 * MIB);
    }

    #[test]
    fn a_claim_moves_bytes_to_the_allocator_and_vmm_counts_until_released_and_unmapped() {
        let mut t = Tracker::new();
        alloc(&mut t, DriverKind::Alloc, 0x1000, 20 * MIB);
        t.record(&ev(DriverCall::Claim { addr: 0x1000 }, None, true), None, 1);
        t.check().unwrap();
        let d0 = t.totals()[&Some(0)].clone();
        assert_eq!((d0.source(Source::Allocator).live, d0.source(Source::Driver).live), (20 * MIB, 0));
        // VMM: create, map twice, release, unmap one, unmap the other.
        let e = |c| ev(c, Some(1), false);
        t.record(&e(DriverCall::Create { handle: 7, size: 2 * MIB }), None, 1);
        t.record(&e(DriverCall::Map { va: 0x10_0000_0000, size: 2 * MIB, handle: 7 }), None, 1);
        t.record(&e(DriverCall::Map { va: 0x20_0000_0000, size: 2 * MIB, handle: 7 }), None, 1);
        t.record(&e(DriverCall::Release { handle: 7 }), None, 1);
        t.check().unwrap();
        assert_eq!(t.totals()[&Some(1)].source(Source::Vmm).live, 2 * MIB, "still mapped: still memory");
        t.record(&e(DriverCall::Unmap { va: 0x10_0000_0000, size: 2 * MIB }), None, 1);
        assert_eq!(t.totals()[&Some(1)].total.live, 2 * MIB);
        t.record(&e(DriverCall::Unmap { va: 0x20_0000_0000, size: 2 * MIB }), None, 1);
        t.check().unwrap();
        assert_eq!(t.totals()[&Some(1)].total, Level { live: 0, peak: 2 * MIB });
    }

    #[test]
    fn recording_keeps_a_bounded_ring_and_zero_sizes_are_ignored() {
        let mut t = Tracker::new();
        t.set_recording(Some(3));
        t.set_label(Some("cell 4"));
        for i in 1..=5u64 {
            alloc(&mut t, DriverKind::Pool, i << 20, MIB);
        }
        alloc(&mut t, DriverKind::Pool, 0x99, 0);
        let evs: Vec<&TrackEvent> = t.events().collect();
        assert_eq!(evs.len(), 3);
        assert_eq!(evs[0].block.addr, 3 << 20);
        assert_eq!(t.label_name(evs[0].block.label), "cell 4");
        assert_eq!(t.totals()[&Some(0)].total.live, 5 * MIB);
    }
}
