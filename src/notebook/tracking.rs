//! Tracking every device allocation of the process: when it starts, where the driver events go,
//! and what reports read from it. The books themselves are `crate::track`'s.
//!
//! Tracking starts with the process's first device: on a GPU by subscribing to CUPTI's driver
//! callbacks (`device::cuda::cupti`), on the simulated device through its simulated driver.
//! `GPUMEM_NB_TRACK=off` leaves CUPTI free for a profiler; `GPUMEM_NB_TRACK=nostacks` tracks
//! without taking a stack per allocation. Without a usable libcupti every report says
//! `tracking: unavailable (<why>)` and keeps its other numbers.
//!
//! The state is one per process, in the process-wide anchor (every evcxr cell's copy of the
//! crate reaches it); the sink each backend (and CUPTI) is given is a function of the copy that
//! opened the device, which reaches the same state (Note [Sinks are data, not statics]).
#![forbid(unsafe_code)]

use super::protocol::{
    CACHED_FREE, ComponentReading, GPUMEM_NB, Held, OwnerBytes, OwnerReading, PlaceReading, SourceReading,
};
use crate::device::DriverEvent;
use crate::record::component::Component;
use crate::record::frames::{self, Frames};
use crate::sync::lock;
use crate::track::owner::{Owners, Site};
use crate::track::{Place, PlaceTotals, Recording, Source, TrackSlot, Tracker};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

mod snapshot;
pub use snapshot::snapshot;
pub(crate) use snapshot::tracked_snapshot;

/// The environment variable that switches tracking off (`off`) or its stacks (`nostacks`).
pub const TRACK_VAR: &str = "GPUMEM_NB_TRACK";

/// Frames taken per tracked allocation by default: a CUPTI callback sits under our sink,
/// CUPTI's and the driver's frames and a wrapper or two (cudarc, the runtime) before the code
/// that asked. [`set_stack_depth`] trades owners found for speed (BENCHMARKS.md).
pub const STACK_DEPTH: usize = 32;

/// Whether (and how) every allocation of the process is tracked.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrackingStatus {
    /// No device has been opened yet.
    NotStarted,
    /// CUPTI's driver callbacks, from this libcupti.
    Cupti {
        /// The library.
        library: String,
        /// `cuptiGetVersion`.
        version: u32,
    },
    /// The simulated device's driver.
    Simulated,
    /// Switched off with `GPUMEM_NB_TRACK=off`.
    Off,
    /// Not possible here, and why (one line).
    Unavailable(String),
    /// Done for this process by another copy of gpumem-nb that this one cannot share state with
    /// (gpumem-kernel's own, built by another compiler: [`TRACKER_VAR`]); its books are the
    /// kernel's, and this copy's allocations are in them as the driver calls they make.
    Elsewhere(String),
}

impl TrackingStatus {
    /// Whether allocations are being tracked.
    pub fn is_on(&self) -> bool {
        matches!(self, TrackingStatus::Cupti { .. } | TrackingStatus::Simulated)
    }

    /// What reports print: `cupti`, `simulated`, `unavailable: <why>`, `off`, `not started`.
    pub fn label(&self) -> String {
        match self {
            TrackingStatus::NotStarted => "not started".into(),
            TrackingStatus::Cupti { .. } => "cupti".into(),
            TrackingStatus::Simulated => "simulated".into(),
            TrackingStatus::Off => format!("off ({TRACK_VAR}=off)"),
            TrackingStatus::Unavailable(why) => format!("unavailable: {why}"),
            TrackingStatus::Elsewhere(who) => format!("elsewhere: {who}"),
        }
    }
}

impl fmt::Display for TrackingStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrackingStatus::Cupti { library, version } => write!(f, "tracking: cupti ({library}, CUPTI {version})"),
            other => write!(f, "tracking: {}", other.label()),
        }
    }
}

/// The process's tracking state (one per process, in the anchor).
pub(crate) struct Tracking {
    tracker: Mutex<Tracker>,
    status: Mutex<TrackingStatus>,
    /// Frames per stack; 0: no stacks.
    stack_depth: AtomicUsize,
    owners: Mutex<Option<Owners>>,
    /// Where new stacks go to be named in the background ([`name_in_background`]).
    namer: std::sync::OnceLock<Option<std::sync::mpsc::SyncSender<Frames>>>,
    /// Reports waiting for (or holding) `owners`: the namer stands aside while any is.
    readers: AtomicUsize,
}

impl Tracking {
    pub(crate) fn new() -> Self {
        Tracking {
            tracker: Mutex::new(Tracker::new()),
            status: Mutex::new(TrackingStatus::NotStarted),
            stack_depth: AtomicUsize::new(STACK_DEPTH),
            owners: Mutex::new(None),
            namer: std::sync::OnceLock::new(),
            readers: AtomicUsize::new(0),
        }
    }
}

fn state() -> &'static Tracking {
    super::anchor::per_process!("tracking", Tracking, Tracking::new)
}

/// The sink every backend and CUPTI report to: takes the stack on the allocating thread, then
/// updates the books.
pub(crate) fn sink(ev: &DriverEvent) {
    let t = state();
    // Only what starts an allocation keeps a stack (a release is shown with its allocation's).
    let depth = match ev.call {
        crate::device::DriverCall::Alloc { .. }
        | crate::device::DriverCall::Create { .. }
        | crate::device::DriverCall::Failed { .. } => t.stack_depth.load(Ordering::Relaxed),
        _ => 0,
    };
    let now = crate::record::history::now_us();
    if depth > 0 {
        // The walk stays in this thread's buffer: the books intern it, allocating only for a
        // stack they have not seen; a walk that repeated this thread's last one (an allocation
        // loop) takes the id that one got, without hashing the stack again.
        // The stamp of this thread, set through whichever copy of the crate (it rides after
        // the frames: `super::components`).
        let stamp = super::components::current();
        let first_seen = frames::with_captured(depth, stamp, |stack, serial| {
            let mut tracker = lock(&t.tracker);
            let (interned, new) = LAST_STACK.with(|last| {
                let mut last = last.borrow_mut();
                match &*last {
                    Some((s, c, id, f)) if *s == serial && *c == stamp => ((*id, f.clone()), false),
                    _ => {
                        let (id, f, new) = tracker.intern(stack);
                        *last = Some((serial, stamp, id, f.clone()));
                        ((id, f), new)
                    }
                }
            });
            let first_seen = new.then(|| interned.1.clone());
            tracker.record(ev, Some(interned), now);
            first_seen
        });
        if let Some(f) = first_seen {
            name_in_background(t, f);
        }
    } else {
        lock(&t.tracker).record(ev, None, now);
    }
}

/// Stacks waiting for the namer; beyond this, new stacks are left to the reports.
const NAMER_QUEUE: usize = 1024;

/// Hands a stack the books saw for the first time to the namer thread (started by the first
/// one), which reads its symbols and line tables into the owners' caches while the cell runs:
/// a report then names what is live from the caches (BENCHMARKS.md, "Sites": the first cell of
/// a large library read at report time cost 24 ms on an H200). Only new stacks travel, so an
/// allocation loop sends nothing; a full queue drops them (a report names them itself); and
/// the namer takes the caches one stack at a time, never while a report waits for them.
fn name_in_background(t: &'static Tracking, frames: Frames) {
    let namer = t.namer.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Frames>(NAMER_QUEUE);
        let spawned = std::thread::Builder::new().name("gpumem-namer".into()).spawn(move || {
            let stand_aside = || {
                while t.readers.load(Ordering::Acquire) > 0 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            };
            for f in rx {
                // The costly part (a module's symbol table and line tables, read the first time
                // one of its addresses is asked for: a hundred milliseconds for a large program)
                // is read without the owners' lock, so that a report never waits for it unless
                // it needs that very module; then the cheap lookups fill the caches.
                stand_aside();
                let tables = lock(&t.owners).get_or_insert_with(Owners::new).tables_to_read(&f);
                crate::record::frames::read_tables(&tables);
                stand_aside();
                lock(&t.owners).get_or_insert_with(Owners::new).warm(&f);
            }
        });
        // Without the thread (none could start) reports name stacks themselves, as before.
        spawned.is_ok().then_some(tx)
    });
    if let Some(tx) = namer {
        let _ = tx.try_send(frames);
    }
}

/// The owners' caches for a report (or the cell code it needs): the namer stands aside from
/// the moment this asks until the guard is dropped.
fn owners_for_report(t: &Tracking) -> OwnersGuard<'_> {
    t.readers.fetch_add(1, Ordering::AcqRel);
    let guard = lock(&t.owners);
    OwnersGuard { guard, readers: &t.readers }
}

struct OwnersGuard<'a> {
    guard: MutexGuard<'a, Option<Owners>>,
    readers: &'a AtomicUsize,
}

impl OwnersGuard<'_> {
    fn get(&mut self) -> &mut Owners {
        self.guard.get_or_insert_with(Owners::new)
    }
}

impl Drop for OwnersGuard<'_> {
    fn drop(&mut self) {
        self.readers.fetch_sub(1, Ordering::AcqRel);
    }
}

thread_local! {
    /// This thread's last interned stack: its walk's serial, stamp, id and shared copy (the
    /// process has one set of books, and ids are never reused).
    #[allow(clippy::type_complexity)]
    static LAST_STACK: std::cell::RefCell<Option<(u64, Option<Component>, crate::track::stacks::StackId, Frames)>> =
        const { std::cell::RefCell::new(None) };
}

/// The environment variable by which gpumem-kernel's own copy of the crate, tracking the
/// notebook's process from its start ([`super::session::watch_from_start`]), tells every copy a
/// notebook loads later: `<pid>@<build fingerprint>`. A copy that finds its own state already
/// started shares the tracker; one that cannot share it (another compiler built it) leaves CUPTI
/// to the kernel's copy ([`TrackingStatus::Elsewhere`]): CUPTI takes one subscriber per process.
pub const TRACKER_VAR: &str = "GPUMEM_NB_TRACKER";

/// Says another copy of the crate, one this copy cannot share state with, tracks the process
/// ([`TrackingStatus::Elsewhere`]), unless tracking started here; true when it said so.
pub(crate) fn set_elsewhere(why: String) -> bool {
    let mut status = lock(&state().status);
    if *status != TrackingStatus::NotStarted {
        return false;
    }
    *status = TrackingStatus::Elsewhere(why);
    true
}

/// Whether any allocation was ever tracked on a device (not only pinned host memory).
#[cfg(feature = "cuda")]
pub(crate) fn touched_a_device() -> bool {
    lock(&state().tracker).totals().keys().any(Option::is_some)
}

/// Starts tracking for the process, once (`simulated`: the simulated device reports to [`sink`]
/// itself).
pub(crate) fn start(simulated: bool) {
    let t = state();
    let mut status = lock(&t.status);
    if *status != TrackingStatus::NotStarted {
        return;
    }
    let setting = std::env::var(TRACK_VAR).unwrap_or_default().to_ascii_lowercase();
    if setting.trim() == "nostacks" {
        t.stack_depth.store(0, Ordering::Relaxed);
    }
    *status = if setting.trim() == "off" {
        TrackingStatus::Off
    } else if simulated {
        TrackingStatus::Simulated
    } else {
        start_cupti()
    };
}

#[cfg(feature = "cuda")]
fn start_cupti() -> TrackingStatus {
    match crate::device::cuda::cupti::start(sink) {
        Ok(s) => TrackingStatus::Cupti { library: s.cupti_path, version: s.cupti_api_version },
        Err(e) => TrackingStatus::Unavailable(e.to_string()),
    }
}

#[cfg(not(feature = "cuda"))]
fn start_cupti() -> TrackingStatus {
    TrackingStatus::Unavailable("gpumem-nb was built without the `cuda` feature".into())
}

/// Whether every allocation of the process is tracked, and how.
pub fn status() -> TrackingStatus {
    lock(&state().status).clone()
}

/// Stops CUPTI tracking so that a profiler (Nsight, `torch.profiler`) can subscribe; the books
/// so far are kept, and tracking does not restart by itself.
pub fn stop() -> crate::error::Result<()> {
    let t = state();
    let mut status = lock(&t.status);
    if let TrackingStatus::Cupti { .. } = *status {
        #[cfg(feature = "cuda")]
        crate::device::cuda::cupti::stop()?;
        *status = TrackingStatus::Unavailable("stopped (gpumem_nb::tracking::stop)".into());
    }
    Ok(())
}

/// Whether a stack is taken for each tracked allocation (for owners and snapshots).
pub fn set_stacks(on: bool) {
    set_stack_depth(if on { STACK_DEPTH } else { 0 });
}

/// How many frames each tracked allocation's stack walks (0: none; at most 64). Each frame
/// costs about 0.2 µs on the allocating thread (BENCHMARKS.md, "Tracking").
pub fn set_stack_depth(frames: usize) {
    state().stack_depth.store(frames.min(64), Ordering::Relaxed);
}

/// The frames each tracked allocation's stack walks (0: none).
pub fn stack_depth() -> usize {
    state().stack_depth.load(Ordering::Relaxed)
}

/// What gpumem-nb's allocator records of its own in a notebook when nothing else is asked: the
/// stack of every live block (PyTorch's `_record_memory_history(enabled="state",
/// context="state")`), so that sites name the code holding memory, not the code that made a
/// segment; `None` when tracking takes no stacks (`GPUMEM_NB_TRACK=nostacks`, `off`).
pub(crate) fn block_stacks() -> Option<crate::record::history::HistoryOptions> {
    use crate::record::history::{HistoryOptions, RecordMode, StackContext};
    (status().is_on() && stack_depth() > 0).then_some(HistoryOptions {
        enabled: RecordMode::State,
        context: StackContext::State,
        max_entries: 1,
    })
}

/// Frames each live block's stack walks (see [`block_stacks`]): deep enough to pass the
/// allocator's, the buffer's and evcxr's frames to the notebook's.
pub(crate) const BLOCK_STACK_DEPTH: usize = 16;

/// Labels tracked allocations from now on ("cell 3"); `None` clears it.
pub(crate) fn set_label(label: Option<&str>) {
    lock(&state().tracker).set_label(label);
}

/// Keeps tracked events for snapshots (`None`: stop).
pub(crate) fn set_recording(max_entries: Option<usize>) {
    lock(&state().tracker).set_recording(max_entries);
}

/// Which tracked events are kept for snapshots now.
pub(crate) fn recording() -> Recording {
    lock(&state().tracker).recording()
}

/// Puts back what [`recording`] said was kept.
pub(crate) fn restore_recording(before: Recording) {
    lock(&state().tracker).restore_recording(before);
}

/// Tracked events a notebook keeps without being asked to record: what `%gpumem fit` plans from
/// in any session, the oldest dropped first. Each costs `size_of::<TrackEvent>()` (80 bytes on
/// x86-64, its stack shared with the books), so the ring holds at most 8 MB (BENCHMARKS.md).
pub const DEFAULT_EVENTS: usize = 100_000;

/// Keeps the last [`DEFAULT_EVENTS`] tracked events unless a recording was asked for (the
/// notebook's process, from its start).
pub(crate) fn keep_by_default() {
    lock(&state().tracker).keep_by_default(DEFAULT_EVENTS);
}

/// Whether `alloc` is the process's allocator of its device (the one tracking's books cover),
/// not a private one (tests, replays).
pub(crate) fn covers(alloc: &crate::allocator::Allocator) -> bool {
    status().is_on() && super::registry::opened().iter().any(|a| std::ptr::eq(&**a, alloc))
}

/// Opens a peak slot over every device and source.
pub(crate) fn open_slot() -> TrackSlot {
    lock(&state().tracker).open_slot()
}

/// Closes a peak slot.
pub(crate) fn close_slot(slot: TrackSlot) {
    lock(&state().tracker).close_slot(slot);
}

fn place_reading(place: Place, t: &PlaceTotals, top: Vec<OwnerBytes>) -> PlaceReading {
    PlaceReading {
        device: place,
        uuid: None,
        live: t.total.live,
        peak: t.total.peak,
        by_source: Source::ALL
            .iter()
            .filter(|s| t.source(**s).peak > 0)
            .map(|s| SourceReading { source: s.key().to_string(), live: t.source(*s).live, peak: t.source(*s).peak })
            .collect(),
        top,
        by_component: Vec::new(),
        kept: Vec::new(),
        by_owner: Vec::new(),
    }
}

/// Every place's tracked bytes: peaks since `slot` opened (or since tracking began), with the
/// top sites of what is live when `owners` (which symbolises their stacks), and what the live
/// bytes are when `components` (stamps, and rules on the stacks' symbols).
pub(crate) fn readings(slot: Option<TrackSlot>, owners: bool, components: bool) -> Vec<PlaceReading> {
    let t = state();
    let need_live = owners || components;
    // The allocator's blocks, read before the tracker's lock is taken (the allocator reports to
    // the tracker under its own lock: never the other way round).
    let blocks = if need_live { allocator_blocks() } else { Vec::new() };
    let (totals, live, changes) = {
        let tr = lock(&t.tracker);
        let totals = match slot.and_then(|s| tr.slot(s)) {
            Some(s) => s,
            None => tr.totals().clone(),
        };
        let live = if need_live { live_now(&tr, blocks) } else { LiveNow::default() };
        let peak = if owners { peak_by_stack(&tr) } else { HashMap::new() };
        let changes = if components { slot.and_then(|s| cell_changes(&tr, s)) } else { None };
        (totals, (live, peak), changes)
    };
    let (live, peak) = live;
    let mut sites = if owners { live_sites(&live, usize::MAX) } else { HashMap::new() };
    let kept: HashMap<Place, Vec<OwnerBytes>> = sites.iter().map(|(p, rows)| (*p, kept_alive(rows))).collect();
    for rows in sites.values_mut() {
        rows.truncate(TOP);
    }
    let tops = sites;
    // What held the session's peak is named now too (cached per stack), while the cell's
    // library and its `lib.rs` are the ones its code was built from: `%gpumem top` asked later,
    // after other cells rewrote `lib.rs`, still gives those sites their lines.
    top_sites(&peak, 0);
    let (mut parts, mut owned) =
        if components { by_component(&live, changes.as_ref()) } else { (HashMap::new(), HashMap::new()) };
    totals
        .iter()
        .filter(|(_, t)| t.total.peak > 0 || t.total.live > 0)
        .map(|(place, tot)| {
            let mut r = place_reading(*place, tot, tops.get(place).cloned().unwrap_or_default());
            r.by_component = parts.remove(place).unwrap_or_default();
            r.by_owner = owned.remove(place).unwrap_or_default();
            r.kept = kept.get(place).cloned().unwrap_or_default();
            r
        })
        .collect()
}

/// The changes logged since a slot opened, with the stacks they name (taken under the
/// tracker's lock; classified and replayed outside it).
struct CellChanges {
    changes: Vec<crate::track::changes::Change>,
    stacks: HashMap<crate::track::stacks::StackId, Option<Frames>>,
}

fn cell_changes(tr: &Tracker, slot: TrackSlot) -> Option<CellChanges> {
    let changes = tr.changes_since(slot)?.to_vec();
    let stacks = changes.iter().map(|c| (c.stack, tr.stack_books().stack(c.stack).cloned())).collect();
    Some(CellChanges { changes, stacks })
}

/// What is live, by component and by owner per place (only those holding bytes or that rose
/// during the slot; components in [`Component::ALL`]'s order, owners largest first), each with
/// how far it rose above its start when the slot's changes are known, and the allocator's cached
/// free memory as the component `cached` (its owner is gpumem-nb): each way, every live byte. A
/// place whose allocator shows blocks counts the blocks, not the segments.
fn by_component(
    live: &LiveNow,
    changes: Option<&CellChanges>,
) -> (HashMap<Place, Vec<ComponentReading>>, HashMap<Place, Vec<OwnerReading>>) {
    use crate::track::changes::{Change, Of, Step, released_within_phase, rises};
    let mut owners = owners_for_report(state());
    let owners = owners.get();
    let mut sums: HashMap<Place, BTreeMap<Component, u64>> = HashMap::new();
    let mut rose: Option<HashMap<(Place, Component), u64>> = None;
    super::components::with_rules(|rules, generation| {
        let mut classify =
            |f: &Option<Frames>| f.as_ref().map_or(Component::Other, |f| owners.component(f, rules, generation));
        for (key, bytes) in &live.by_stack {
            let (place, frames, _) = key;
            *sums.entry(*place).or_default().entry(classify(frames)).or_default() += bytes;
        }
        if let Some(ch) = changes {
            let of: HashMap<_, _> = ch.stacks.iter().map(|(id, f)| (*id, classify(f))).collect();
            let component = |c: &Change| of.get(&c.stack).copied().unwrap_or(Component::Other);
            // A backward pass's, an optimizer step's and a parameter initializer's working
            // memory is `temp`, as PyTorch counts it: what they released before their run of
            // allocations ended (the gradients a store holds, the optimizer's moments and the
            // parameters outlive it; candle's uniform initializer makes a tensor and scales it
            // into another).
            let working = released_within_phase(&ch.changes, |c| match component(c) {
                k if k.has_runs() => Step::In(k),
                k if k.beside_runs() => Step::Aside,
                _ => Step::Other,
            });
            rose = Some(rises(&ch.changes, |i, c| {
                let counted =
                    if live.shown_by_block.contains(&c.place) { c.of != Of::Segment } else { c.of != Of::Block };
                counted.then(|| (c.place, if working[i] { Component::Temp } else { component(c) }))
            }));
        }
    });
    // Who holds it: gpumem-nb for the allocator's blocks and cache, the stack's framework else.
    let counted =
        |c: &Change| if live.shown_by_block.contains(&c.place) { c.of != Of::Segment } else { c.of != Of::Block };
    let by_owner = crate::track::owner::held_by(
        owners,
        live.by_stack.iter().map(|(k, b)| (k.0, k.1.as_ref(), *b, live.segment.contains_key(k))),
        live.cached.iter().map(|(p, c)| (*p, *c)),
        changes.map(|ch| (&ch.changes[..], &ch.stacks)),
        counted,
        GPUMEM_NB,
    );
    let by_owner: HashMap<Place, Vec<OwnerReading>> = by_owner
        .into_iter()
        .map(|(place, rows)| {
            (place, rows.into_iter().map(|(owner, live, rise)| OwnerReading { owner, live, rise }).collect())
        })
        .collect();
    for (place, c) in rose.iter().flat_map(|r| r.iter().filter(|(_, r)| **r > 0).map(|(k, _)| *k)) {
        sums.entry(place).or_default().entry(c).or_default();
    }
    let mut out: HashMap<Place, Vec<ComponentReading>> = sums
        .into_iter()
        .map(|(place, m)| {
            let rows = m
                .into_iter()
                .map(|(c, live)| {
                    let rise = rose.as_ref().map(|r| r.get(&(place, c)).copied().unwrap_or(0));
                    ComponentReading { component: Held::Component(c), live, rise }
                })
                .filter(|r| r.live > 0 || r.rise.unwrap_or(0) > 0)
                .collect();
            (place, rows)
        })
        .collect();
    for (place, &cached) in live.cached.iter().filter(|(_, c)| **c > 0) {
        out.entry(*place).or_default().push(ComponentReading { component: Held::Cached, live: cached, rise: None });
    }
    (out, by_owner)
}

/// What gpumem-nb's allocators tell of their blocks: the cell's changes for components' peaks.
pub(crate) fn block_observer() -> crate::allocator::BlockObserver {
    Arc::new(|device: i32, c: crate::allocator::BlockChange<'_>| {
        lock(&state().tracker).block(Some(device), c.alloc, c.addr, c.size, c.frames);
    })
}

/// The activations and temporaries among a place's live sites (largest first, at most
/// [`TOP`]): what a report flags as kept alive past the code that made it.
fn kept_alive(rows: &[OwnerBytes]) -> Vec<OwnerBytes> {
    let kept = |r: &&OwnerBytes| matches!(r.component, Some(Component::Activation | Component::Temp));
    rows.iter().filter(kept).take(TOP).cloned().collect()
}

/// How many sites a record's `top` lists.
const TOP: usize = 5;

/// Live bytes by place, stack and cell (the label's number): what sites are named from.
type ByStack = HashMap<(Place, Option<Frames>, u64), u64>;

/// One device's allocator, as its blocks show it: every segment with its blocks, and the label
/// texts by id (blocks carry ids).
type AllocatorBlocks = (Place, Vec<crate::policy::SegmentView>, Vec<String>);

/// Every opened allocator's segments and labels (each under its own lock).
fn allocator_blocks() -> Vec<AllocatorBlocks> {
    super::registry::opened()
        .iter()
        .map(|a| {
            let (segments, labels) = a.with_state(|s, _| (s.segments(), s.labels()));
            (Some(a.device()), segments, labels)
        })
        .collect()
}

/// What is live now, for naming sites: every tracked allocation but the allocator's segments,
/// which show as their blocks instead (each allocated block under its own stack and cell; the
/// free ones the allocator keeps cached, one amount per device), so that a site is the code
/// holding the memory, not the code that happened to make a segment.
#[derive(Default)]
struct LiveNow {
    by_stack: ByStack,
    /// For the allocator's block groups: the stack that made the segment they are in.
    segment: HashMap<(Place, Option<Frames>, u64), Option<Frames>>,
    /// Per device: the allocator's cached free bytes.
    cached: HashMap<Place, u64>,
    /// The places whose allocator shows its blocks (its segments are not counted there).
    shown_by_block: Vec<Place>,
}

/// See [`LiveNow`] (under the tracker's lock: no symbols).
fn live_now(tr: &Tracker, blocks: Vec<AllocatorBlocks>) -> LiveNow {
    let mut out = LiveNow { shown_by_block: blocks.iter().map(|b| b.0).collect(), ..LiveNow::default() };
    let mut cells: HashMap<u32, u64> = HashMap::new();
    for a in tr.live() {
        if a.source == Source::Allocator && out.shown_by_block.contains(&a.device) {
            continue;
        }
        let cell = *cells.entry(a.label).or_insert_with(|| label_cell(tr.label_name(a.label)));
        *out.by_stack.entry((a.device, a.frames.clone(), cell)).or_default() += a.size;
    }
    for (place, segments, labels) in blocks {
        for seg in segments {
            let made_by = tr.live_at(seg.address).and_then(|t| t.frames.clone());
            for b in seg.blocks {
                if b.allocated {
                    let cell = labels.get(b.tag as usize).map_or(0, |l| label_cell(l));
                    let key = (place, b.frames.clone(), cell);
                    *out.by_stack.entry(key.clone()).or_default() += b.size;
                    out.segment.entry(key).or_insert_with(|| made_by.clone());
                } else {
                    *out.cached.entry(place).or_default() += b.size;
                }
            }
        }
    }
    out
}

/// The `n` largest sites per place of what is live now, with the allocator's cached free
/// memory as a row of its own.
fn live_sites(live: &LiveNow, n: usize) -> HashMap<Place, Vec<OwnerBytes>> {
    let mut out = top_sites_in(&live.by_stack, &live.segment, usize::MAX);
    for (place, &cached) in live.cached.iter().filter(|(_, c)| **c > 0) {
        out.entry(*place).or_default().push(OwnerBytes {
            owner: "gpumem-nb allocator".into(),
            bytes: cached,
            function: Some(CACHED_FREE.into()),
            ..Default::default()
        });
    }
    for rows in out.values_mut() {
        rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.owner.cmp(&b.owner)).then(a.line.cmp(&b.line)));
        rows.truncate(n);
    }
    out
}

/// What was live at each place's peak, summed the same way.
fn peak_by_stack(tr: &Tracker) -> ByStack {
    by_stack(tr, tr.stack_books().at_peak())
}

fn by_stack(tr: &Tracker, groups: impl Iterator<Item = (Place, crate::track::stacks::Key, u64)>) -> ByStack {
    let mut cells: HashMap<u32, u64> = HashMap::new();
    let mut out = ByStack::new();
    for (place, (stack, label), bytes) in groups {
        let cell = *cells.entry(label).or_insert_with(|| label_cell(tr.label_name(label)));
        *out.entry((place, tr.stack_books().stack(stack).cloned(), cell)).or_default() += bytes;
    }
    out
}

/// The sites holding the most memory now, and those that held the most at the session's peak
/// (since tracking began), per device: what `%gpumem top` shows (`gpumem_nb::tracking::top(n)` in the
/// stock kernel).
pub fn top(n: usize) -> crate::notebook::protocol::TopReport {
    let t = state();
    let status = status();
    let blocks = allocator_blocks();
    let (live, peak, totals) = {
        let tr = lock(&t.tracker);
        (live_now(&tr, blocks), peak_by_stack(&tr), tr.totals().clone())
    };
    let (mut now, mut at_peak) = (live_sites(&live, n), top_sites(&peak, n));
    let places = totals
        .iter()
        .filter(|(_, t)| t.total.peak > 0)
        .map(|(place, tot)| crate::notebook::protocol::PlaceTop {
            device: *place,
            live: tot.total.live,
            peak: tot.total.peak,
            now: now.remove(place).unwrap_or_default(),
            at_peak: at_peak.remove(place).unwrap_or_default(),
        })
        .collect();
    crate::notebook::protocol::TopReport { tracking: status.label(), places }
}

/// A refused allocation, how many were refused in all, and who asked (`None` without a stack).
pub(crate) type Refusal = (crate::track::Failure, u64, Option<(OwnerBytes, String)>);

/// The allocation the driver refused since the last call ([`Refusal`]).
pub(crate) fn take_failure() -> Option<Refusal> {
    let t = state();
    let (f, count) = lock(&t.tracker).take_failure()?;
    let who = f.frames.as_ref().map(|frames| {
        let mut owners = owners_for_report(t);
        let owners = owners.get();
        (owner_bytes(owners.site(frames, label_cell(&f.label)), f.size), owners.framework(frames).to_string())
    });
    Some((f, count, who))
}

/// The `N` of a label "cell N" (0 for any other label).
fn label_cell(label: &str) -> u64 {
    label.strip_prefix("cell ").and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// Bytes per site and component, with the site that made the segment they are in.
type SiteSums = HashMap<(Site, Component), (u64, Option<String>)>;

/// The `n` largest sites per place (symbolising outside the tracker's lock, each distinct stack
/// once).
fn top_sites(live: &ByStack, n: usize) -> HashMap<Place, Vec<OwnerBytes>> {
    top_sites_in(live, &HashMap::new(), n)
}

/// [`top_sites`], with for some groups (the allocator's blocks) the stack that made the segment
/// they are in: named beside a site where it is another.
fn top_sites_in(
    live: &ByStack,
    segment: &HashMap<(Place, Option<Frames>, u64), Option<Frames>>,
    n: usize,
) -> HashMap<Place, Vec<OwnerBytes>> {
    let mut owners = owners_for_report(state());
    let owners = owners.get();
    // A site's memory by what it is, too: one row per site and component.
    let mut sums: HashMap<Place, SiteSums> = HashMap::new();
    super::components::with_rules(|rules, generation| {
        for (key, size) in live {
            let (place, frames, cell) = key;
            let site = match frames {
                Some(f) => owners.site(f, *cell),
                None if *cell > 0 => {
                    Site { owner: "notebook cell (no stack)".into(), cell: Some(*cell), ..Site::default() }
                }
                None => Site::unknown("unknown (no stack)"),
            };
            let component = frames.as_ref().map_or(Component::Other, |f| owners.component(f, rules, generation));
            let made = segment.get(key).cloned().flatten().map(|f| owner_bytes(owners.site(&f, 0), 0).site());
            let e = sums.entry(*place).or_default().entry((site, component)).or_default();
            e.0 += size;
            if e.1.is_none() {
                e.1 = made;
            }
        }
    });
    sums.into_iter()
        .map(|(place, m)| {
            let mut v: Vec<OwnerBytes> = m
                .into_iter()
                .map(|((site, component), (bytes, made))| {
                    let mut o = owner_bytes(site, bytes);
                    o.segment = made.filter(|s| *s != o.site());
                    o.component = Some(component);
                    o
                })
                .collect();
            v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.owner.cmp(&b.owner)).then(a.line.cmp(&b.line)));
            v.truncate(n);
            (place, v)
        })
        .collect()
}

fn owner_bytes(site: Site, bytes: u64) -> OwnerBytes {
    OwnerBytes {
        owner: site.owner,
        bytes,
        function: site.function,
        cell: site.cell,
        line: site.line,
        called_from: site.called_from,
        segment: None,
        queued: site.queued,
        component: None,
    }
}

/// Notes cells' code as their user sees it (gpumem-kernel sends each cell's before it runs, and
/// every kept cell's to a child as it connects), so that sites in them and in the functions
/// they define get their lines.
pub(crate) fn set_cell_codes<'a>(codes: impl IntoIterator<Item = (u64, &'a str)>) {
    owners_for_report(state()).get().set_cell_codes(codes);
}

/// Recounts the books from every tracked allocation; `Err` names the first count that
/// disagrees.
pub fn check() -> Result<(), crate::policy::InvariantViolation> {
    lock(&state().tracker).check().map_err(crate::policy::InvariantViolation)
}
