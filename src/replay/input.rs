//! What a replay reads: a TSV trace (`tests/fixtures/traces/README.md`), or a memory snapshot with its
//! trace: a pickle written by `torch.cuda.memory._dump_snapshot` after
//! `torch.cuda.memory._record_memory_history(enabled="all")`, or a snapshot of gpumem-nb's own
//! (`Snapshot::save`'s directory, its pickle or JSON, `gpumem_nb::tracking::snapshot`).
//!
//! A snapshot's `device_traces[d]` is device `d`'s ring buffer of events, oldest first, each a
//! dict with `action`, `addr` (`device_free` for `oom`), `size`, `stream`, `time_us`,
//! `compile_context`, `user_metadata` and, when a stack was recorded, `frames`
//! (as `torch.cuda.memory._snapshot()` returns them). Every device with events becomes a [`DeviceTrace`].
//! gpumem-nb's own snapshots add the allocations of every other source it tracked (CUDA pool,
//! driver, VMM, managed) as one-block segments whose events carry the source's name in
//! `user_metadata` (`"cell 3 · CUDA pool (cuMemAllocAsync)"`): those become [`Foreign`] events,
//! kept apart from the allocator's, in order.
//!
//! # Does the trace start at the first allocation?
//! A ring buffer that wrapped (more events than `max_entries`), or recording switched on after
//! memory was allocated, leaves a trace that does not begin with an empty device, and a replay
//! of it would start from the wrong state. [`check_start`] replays the trace's bookkeeping from
//! an empty device and refuses it, naming the first event that proves otherwise:
//! - a free (`free_requested`, `free_completed`, `segment_free`, `segment_unmap`) of memory no
//!   earlier event allocated or mapped;
//! - an `alloc` at an address inside no segment or mapped range an earlier event created;
//! - a `segment_alloc`/`segment_map` over memory that is already live;
//! - at the end, the snapshot's own segments and allocated blocks (the state when it was taken)
//!   differing from what the trace leaves live: memory allocated before the trace began and
//!   never freed since.
//!
//! What no check can see: a lost beginning that left nothing behind (every segment it created
//! was released before the trace starts). The trace is then a faithful record of an empty
//! device from its first event on, but the peaks PyTorch reports may come from the lost part.

use super::{TraceError, TraceLine, read_trace};
use crate::device::StreamId;
use crate::policy::config::AllocatorConfig;
use crate::record::frames::Frame;
use crate::record::history::TraceAction;
use crate::snapshot::{Segment, Snapshot, TraceSnap};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

/// Where an event came from in the program: the label it was recorded under (gpumem-nb: the
/// notebook cell) and its stack, innermost frame first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventInfo {
    /// `user_metadata` (gpumem-nb: `"cell 3"`), "" when none.
    pub label: String,
    /// The stack (`frames`), innermost first; empty when none was recorded.
    pub frames: Vec<Frame>,
}

impl EventInfo {
    /// The frame that best names the program's line: a notebook cell's frame (`filename` =
    /// `cell N`), else the innermost frame outside PyTorch's and Python's own files, else the
    /// innermost frame.
    pub fn site(&self) -> Option<&Frame> {
        let own = |f: &&Frame| {
            let p = f.filename.replace('\\', "/");
            !(p.contains("/torch/") || p.contains("/site-packages/") || p.contains("/lib/python") || p == "??")
        };
        self.frames
            .iter()
            .find(|f| f.filename.starts_with("cell "))
            .or_else(|| self.frames.iter().find(own))
            .or_else(|| self.frames.first())
    }

    /// `name (filename:line)` of [`EventInfo::site`], or the label alone.
    pub fn describe(&self) -> Option<String> {
        match (self.site(), self.label.is_empty()) {
            // A closure or a cell's body in a notebook cell: named by its place alone.
            (Some(f), _) if f.filename.starts_with("cell ") && f.is_anonymous() => {
                Some(format!("{}:{}", f.filename, f.line))
            }
            (Some(f), _) => Some(format!("{} ({}:{})", f.name, f.filename, f.line)),
            (None, false) => Some(self.label.clone()),
            (None, true) => None,
        }
    }
}

/// An allocation of another source than the caching allocator (gpumem-nb's tracked
/// allocations: the CUDA pool, plain driver allocations, VMM, managed memory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Foreign {
    /// It happened just before the allocator's event at this index of
    /// [`DeviceTrace::events`] (the length: after the last one).
    pub before: usize,
    /// An allocation (`true`) or its release.
    pub alloc: bool,
    /// Address.
    pub addr: u64,
    /// Bytes the program asked for.
    pub size: u64,
    /// `pool`, `driver`, `vmm` or `managed` (the tracker's source keys).
    pub source: &'static str,
    /// Its cell and stack.
    pub info: Option<Arc<EventInfo>>,
    /// Event number in the device's trace (1-based).
    pub event: usize,
}

/// One device's events.
#[derive(Clone, Debug, Default)]
pub struct DeviceTrace {
    /// Device index.
    pub device: i32,
    /// The caching allocator's events, in order (`line`: the line of a TSV trace, or the
    /// 1-based event number in the snapshot's device trace).
    pub events: Vec<TraceLine>,
    /// Label and stack of each event of `events` (same index), where the input had them.
    pub info: Vec<Option<Arc<EventInfo>>>,
    /// Other sources' allocations and releases, in order.
    pub foreign: Vec<Foreign>,
    /// Entries of actions this reader does not replay (newer PyTorch's `annotate`, …).
    pub skipped: usize,
    /// Allocations that existed before the trace began, when it was read with
    /// [`TraceStart::Prologue`] and does not start at the first allocation (`alloc` lines with
    /// `line` 0, in address order); empty otherwise.
    pub prologue: Vec<TraceLine>,
}

/// One step of a device's recording, in the order it happened (see [`DeviceTrace::in_order`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ordered<'a> {
    /// Another source's allocation or release.
    Foreign(&'a Foreign),
    /// The caching allocator's event, with its index in `events`.
    Event(usize, &'a TraceLine),
}

impl DeviceTrace {
    /// The allocator's events and the other sources' in the order they happened: each other
    /// source's entry before the event it was recorded before, those after the last event last.
    pub(crate) fn in_order(&self) -> impl Iterator<Item = Ordered<'_>> {
        let mut fi = self.foreign.iter().peekable();
        let mut ei = self.events.iter().enumerate().peekable();
        std::iter::from_fn(move || match (fi.peek(), ei.peek()) {
            (Some(f), Some((i, _))) if f.before <= *i => fi.next().map(Ordered::Foreign),
            (_, Some(_)) => ei.next().map(|(i, e)| Ordered::Event(i, e)),
            (Some(_), None) => fi.next().map(Ordered::Foreign),
            (None, None) => None,
        })
    }

    /// Label and stack of `events[i]`.
    pub(crate) fn info_of(&self, i: usize) -> Option<&EventInfo> {
        self.info.get(i).and_then(|x| x.as_deref())
    }

    /// Peaks as the recording shows them: the allocator's reserved bytes (from its segment
    /// events), each other source's live bytes (at their sizes), and everything together.
    pub fn source_peaks(&self) -> SourcePeaks {
        let mut out = SourcePeaks::default();
        let (mut reserved, mut all) = (0u64, 0u64);
        let mut by: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
        let mut sizes: HashMap<u64, u64> = HashMap::new();
        for step in self.in_order() {
            match step {
                Ordered::Foreign(f) => {
                    let e = by.entry(f.source).or_default();
                    if f.alloc {
                        sizes.insert(f.addr, f.size);
                        e.0 += f.size;
                        all += f.size;
                    } else if let Some(s) = sizes.remove(&f.addr) {
                        e.0 -= s;
                        all -= s;
                    }
                    e.1 = e.1.max(e.0);
                    out.all = out.all.max(all);
                }
                Ordered::Event(_, e) => {
                    match e.action {
                        TraceAction::SegmentAlloc | TraceAction::SegmentMap => {
                            reserved += e.size;
                            all += e.size;
                        }
                        TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                            reserved = reserved.saturating_sub(e.size);
                            all = all.saturating_sub(e.size);
                        }
                        _ => {}
                    }
                    out.allocator = out.allocator.max(reserved);
                    out.all = out.all.max(all);
                }
            }
        }
        out.others = by.into_iter().map(|(k, (_, peak))| (k.to_string(), peak)).collect();
        out
    }
}

/// What a recording's own events say about its peaks (see [`DeviceTrace::source_peaks`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SourcePeaks {
    /// The caching allocator's reserved bytes at their highest.
    pub allocator: u64,
    /// Each other source's live bytes at their highest (`pool`, `driver`, `vmm`, `managed`).
    pub others: BTreeMap<String, u64>,
    /// Everything together at its highest.
    pub all: u64,
}

/// What kind of file a recording came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// A `.tsv`/`.tsv.gz` trace.
    Tsv,
    /// A snapshot pickle.
    SnapshotPickle,
    /// A snapshot as JSON (or a saved snapshot directory).
    SnapshotJson,
}

impl InputKind {
    /// `tsv trace`, `snapshot pickle`, `snapshot json`.
    pub fn name(self) -> &'static str {
        match self {
            InputKind::Tsv => "tsv trace",
            InputKind::SnapshotPickle => "snapshot pickle",
            InputKind::SnapshotJson => "snapshot json",
        }
    }
}

/// Everything a replay needs from one input file.
#[derive(Clone, Debug)]
pub struct Recording {
    /// The file, as errors name it.
    pub path: String,
    /// Its kind.
    pub kind: InputKind,
    /// Every device with events, by index.
    pub devices: Vec<DeviceTrace>,
    /// The allocator settings the snapshot recorded (`allocator_settings`), as a configuration
    /// string; `None` for a TSV trace.
    pub alloc_conf: Option<String>,
}

/// What to do with a snapshot whose trace does not start at the first allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TraceStart {
    /// Refuse it with a one-line error (`gpumem-replay`: a replay from the wrong state would
    /// be wrong, and PyTorch's peaks could not be reproduced).
    #[default]
    Strict,
    /// Take it for planning (a notebook that switched recording on after its first cells): the
    /// allocations that existed before the trace and that it shows (their frees, or live blocks
    /// at the end) become [`DeviceTrace::prologue`], made before the first event. Free cached
    /// memory from before the trace is left out: it is the allocator's, not the program's.
    Prologue,
}

/// Reads a TSV trace or a snapshot; what it is is told by the content (a directory is a saved
/// snapshot). A snapshot's traces must start at the first allocation ([`check_start`]).
pub fn read_recording(path: &Path) -> Result<Recording, TraceError> {
    let name = path.display().to_string();
    let kind = if path.is_dir() {
        InputKind::SnapshotJson
    } else {
        let mut head = [0u8; 8];
        let n = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
            .map_err(|e| TraceError::file(&name, format!("cannot open: {e}")))?;
        let first = head[..n].iter().find(|b| !b.is_ascii_whitespace()).copied();
        if crate::snapshot::unpickle::looks_like_pickle(&head[..n]) {
            InputKind::SnapshotPickle
        } else if first == Some(b'{') {
            InputKind::SnapshotJson
        } else {
            InputKind::Tsv
        }
    };
    if kind == InputKind::Tsv {
        let events = read_trace(path)?;
        let info = Vec::new();
        let dev = DeviceTrace { device: 0, events, info, foreign: Vec::new(), skipped: 0, prologue: Vec::new() };
        return Ok(Recording { path: name, kind, devices: vec![dev], alloc_conf: None });
    }
    let snap = crate::snapshot::read(path).map_err(|e| TraceError::file(&name, e.to_string()))?;
    let mut rec = from_snapshot(&snap, &name, TraceStart::Strict)?;
    if path.is_dir() && crate::snapshot::files::find_in_dir(path, "snapshot", "pickle").is_ok_and(|p| p.is_file()) {
        rec.kind = InputKind::SnapshotPickle;
    } else {
        rec.kind = kind;
    }
    Ok(rec)
}

/// A snapshot's traces, device by device, checked to start at the first allocation (see
/// [`TraceStart`] for what happens when one does not).
pub fn from_snapshot(snap: &Snapshot, path: &str, start: TraceStart) -> Result<Recording, TraceError> {
    let mut devices = Vec::new();
    let mut held: BTreeMap<i32, u64> = BTreeMap::new();
    for s in &snap.segments {
        *held.entry(s.device).or_default() += s.total_size;
    }
    for (d, trace) in snap.device_traces.iter().enumerate() {
        let device = d as i32;
        if trace.is_empty() {
            continue;
        }
        let segments: Vec<&Segment> = snap.segments.iter().filter(|s| s.device == device).collect();
        let checked = check_start(trace, &segments);
        let mut dt = device_trace(device, trace);
        match (checked, start) {
            (Ok(()), _) => {}
            (Err((event, why)), TraceStart::Strict) => {
                return Err(TraceError {
                    path: path.to_string(),
                    line: Some(event),
                    device: Some(device),
                    message: why,
                });
            }
            (Err(_), TraceStart::Prologue) => dt.prologue = prologue(trace, &segments),
        }
        devices.push(dt);
    }
    if devices.is_empty() {
        let why = if snap.device_traces.is_empty() {
            "the snapshot has no trace (no `device_traces`)"
        } else {
            "the snapshot's trace is empty"
        };
        return Err(TraceError::file(
            path,
            format!(
                "{why}: nothing to replay; record one with torch.cuda.memory._record_memory_history(enabled=\"all\") \
                 before the first allocation (gpumem-nb: `%gpumem record on` or record_memory_history), then dump the \
                 snapshot"
            ),
        ));
    }
    for (d, bytes) in &held {
        if start == TraceStart::Strict && !devices.iter().any(|t| t.device == *d) {
            return Err(TraceError::file(
                path,
                format!(
                    "device {d} holds {bytes} bytes in segments but has no trace: recording began after its memory was \
                     allocated"
                ),
            )
            .on_device(*d));
        }
    }
    Ok(Recording {
        path: path.to_string(),
        kind: InputKind::SnapshotJson,
        devices,
        alloc_conf: Some(settings_conf(snap)),
    })
}

/// The source key of an event gpumem-nb's tracking added (its `user_metadata` ends with the
/// source's name), or `None` for the allocator's own.
fn foreign_source(meta: &str) -> Option<(&'static str, String)> {
    use crate::track::Source;
    Source::ALL.iter().filter(|s| **s != Source::Allocator).find_map(|s| {
        let label = if meta == s.name() {
            Some(String::new())
        } else {
            meta.strip_suffix(s.name()).and_then(|l| l.strip_suffix(" · ")).map(str::to_string)
        };
        label.map(|l| (s.key(), l))
    })
}

fn device_trace(device: i32, trace: &[TraceSnap]) -> DeviceTrace {
    let mut out = DeviceTrace { device, ..Default::default() };
    let mut infos: HashMap<(String, usize), Arc<EventInfo>> = HashMap::new();
    let mut info_of = |label: &str, frames: Option<&Vec<Frame>>| -> Option<Arc<EventInfo>> {
        let frames = frames.filter(|f| !f.is_empty());
        if label.is_empty() && frames.is_none() {
            return None;
        }
        // Entries with the same stack share one frame list in the pickle: share it here too.
        let key = (label.to_string(), frames.map_or(0, |f| f.as_ptr() as usize));
        let make = || Arc::new(EventInfo { label: label.to_string(), frames: frames.cloned().unwrap_or_default() });
        Some(if frames.is_some() { infos.entry(key).or_insert_with(make).clone() } else { make() })
    };
    for (i, e) in trace.iter().enumerate() {
        let event = i + 1;
        let Some(action) = TraceAction::from_name(e.action) else {
            out.skipped += 1;
            continue;
        };
        if let Some((source, label)) = foreign_source(&e.user_metadata) {
            let alloc = match action {
                TraceAction::Alloc => true,
                TraceAction::SegmentFree => false,
                _ => continue,
            };
            let addr = e.addr.unwrap_or(0);
            let info = info_of(&label, e.frames.as_ref());
            out.foreign.push(Foreign { before: out.events.len(), alloc, addr, size: e.size, source, info, event });
            continue;
        }
        let addr = if action == TraceAction::Oom { e.device_free.unwrap_or(0) } else { e.addr.unwrap_or(0) };
        out.events.push(TraceLine {
            line: event,
            action,
            addr,
            size: e.size,
            stream: StreamId(e.stream),
            time_us: e.time_us,
        });
        out.info.push(info_of(&e.user_metadata, e.frames.as_ref()));
    }
    out
}

/// The allocator configuration a snapshot's `allocator_settings` describe. The recorded
/// string (`PYTORCH_CUDA_ALLOC_CONF`, the last one set) when it parses and agrees with the
/// recorded values; otherwise a string built from the values (a setting made through another
/// variable or `_set_allocator_settings`).
pub fn settings_conf(snap: &Snapshot) -> String {
    let s = &snap.allocator_settings;
    let divisions: Vec<u64> = {
        let mut v: Vec<(u64, u64)> =
            s.roundup_power2_divisions.iter().filter_map(|(k, d)| Some((k.parse::<u64>().ok()?, *d))).collect();
        v.sort_unstable();
        v.into_iter().map(|(_, d)| d).collect()
    };
    let agrees = |c: &AllocatorConfig| {
        c.expandable_segments == s.expandable_segments
            && c.max_split_size_reported() == s.max_split_size
            && (c.garbage_collection_threshold - s.garbage_collection_threshold).abs() < 1e-9
            && (divisions.is_empty() || c.roundup_power2_divisions[..] == divisions[..])
    };
    if let Ok(c) = AllocatorConfig::parse(&s.conf)
        && (c.compact || agrees(&c))
    {
        return s.conf.clone();
    }
    let mut parts = Vec::new();
    if s.expandable_segments {
        parts.push("expandable_segments:True".to_string());
    }
    if s.max_split_size > 0 {
        parts.push(format!("max_split_size_mb:{}", s.max_split_size as u64 >> 20));
    }
    if s.garbage_collection_threshold > 0.0 {
        parts.push(format!("garbage_collection_threshold:{}", s.garbage_collection_threshold));
    }
    if divisions.iter().any(|&d| d > 1) {
        let list: Vec<String> = divisions.iter().enumerate().map(|(i, d)| format!("{}:{d}", 1u64 << i)).collect();
        parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
    }
    parts.join(",")
}

/// The allocations a trace shows to have existed before it began: those it frees without
/// having allocated them, and the snapshot's allocated blocks it never allocated, in address
/// order (as `alloc` lines numbered 0).
fn prologue(trace: &[TraceSnap], segments: &[&Segment]) -> Vec<TraceLine> {
    let mut live: HashMap<u64, bool> = HashMap::new();
    let mut before: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for e in trace {
        let Some(action) = TraceAction::from_name(e.action) else { continue };
        let a = e.addr.unwrap_or(0);
        if foreign_source(&e.user_metadata).is_some() {
            // Another source's allocation: its one-block segment is the program's, not cache.
            match action {
                TraceAction::Alloc => {
                    live.insert(a, true);
                }
                TraceAction::SegmentFree => {
                    live.remove(&a);
                }
                _ => {}
            }
            continue;
        }
        match action {
            TraceAction::Alloc => {
                live.insert(a, true);
            }
            TraceAction::FreeRequested if live.remove(&a).is_none() => {
                before.insert(a, (e.size, e.stream));
            }
            _ => {}
        }
    }
    for s in segments {
        for b in s.blocks.iter().filter(|b| b.state == "active_allocated") {
            if !live.contains_key(&b.address) {
                before.entry(b.address).or_insert((b.requested_size.max(1), s.stream));
            }
        }
    }
    before
        .into_iter()
        .map(|(addr, (size, stream))| TraceLine {
            line: 0,
            action: TraceAction::Alloc,
            addr,
            size,
            stream: StreamId(stream),
            time_us: 0,
        })
        .collect()
}

/// Disjoint live address intervals, start → end.
#[derive(Default)]
struct Intervals(BTreeMap<u64, u64>);

impl Intervals {
    /// The interval holding `a`.
    fn find(&self, a: u64) -> Option<(u64, u64)> {
        self.0.range(..=a).next_back().filter(|(_, e)| **e > a).map(|(s, e)| (*s, *e))
    }
    fn overlaps(&self, a: u64, b: u64) -> bool {
        self.0.range(..b).next_back().is_some_and(|(_, e)| *e > a)
    }
    /// Adds `[a, b)` (overlapping nothing live), joined with the intervals it touches: an
    /// expandable segment's pages are mapped by many events and unmapped by one over several.
    fn insert(&mut self, a: u64, b: u64) {
        let (mut a, mut b) = (a, b);
        if let Some((s, _)) = self.0.range(..=a).next_back().filter(|(_, e)| **e == a).map(|(s, e)| (*s, *e)) {
            self.0.remove(&s);
            a = s;
        }
        if let Some(e) = self.0.remove(&b) {
            b = e;
        }
        self.0.insert(a, b);
    }
    /// Removes `[a, b)`, which must lie inside the live memory (one interval, once touching
    /// ones are joined).
    fn remove(&mut self, a: u64, b: u64) -> bool {
        let Some((s, e)) = self.find(a) else { return false };
        if b > e {
            return false;
        }
        self.0.remove(&s);
        if s < a {
            self.0.insert(s, a);
        }
        if b < e {
            self.0.insert(b, e);
        }
        true
    }
    /// Maximal runs of touching intervals.
    fn runs(&self) -> Vec<(u64, u64)> {
        runs(self.0.iter().map(|(s, e)| (*s, *e)))
    }
}

fn runs(sorted: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, e) in sorted {
        match out.last_mut() {
            Some(last) if last.1 == s => last.1 = e,
            _ => out.push((s, e)),
        }
    }
    out
}

/// Replays a device trace's bookkeeping from an empty device and compares the result with the
/// snapshot's segments of that device (see the module docs). `Err((event, why))` names the
/// first event (1-based) that shows the trace does not start at the first allocation.
pub fn check_start(trace: &[TraceSnap], segments: &[&Segment]) -> Result<(), (usize, String)> {
    let hint = "the trace does not start at the first allocation: its ring buffer wrapped (raise max_entries) or \
                recording began after memory was allocated (record from the start)";
    let mut memory = Intervals::default();
    let mut segs: HashMap<u64, u64> = HashMap::new();
    // Live blocks: address → still allocated (false: free requested, completion pending).
    let mut blocks: HashMap<u64, bool> = HashMap::new();
    for (i, e) in trace.iter().enumerate() {
        let n = i + 1;
        let Some(action) = TraceAction::from_name(e.action) else { continue };
        let a = e.addr.unwrap_or(0);
        let end = a.saturating_add(e.size);
        let fail = |what: String| Err((n, format!("{hint} ({} at {a:#x}: {what})", action.name())));
        match action {
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => {
                if memory.overlaps(a, end) {
                    return fail(format!("{} bytes over memory that is already live", e.size));
                }
                memory.insert(a, end);
                if action == TraceAction::SegmentAlloc {
                    segs.insert(a, e.size);
                }
            }
            TraceAction::SegmentFree => {
                if segs.remove(&a) != Some(e.size) || !memory.remove(a, end) {
                    return fail("a segment no earlier event created".into());
                }
            }
            TraceAction::SegmentUnmap => {
                if !memory.remove(a, end) {
                    return fail("memory no earlier event mapped".into());
                }
            }
            TraceAction::Alloc => {
                if memory.find(a).is_none() {
                    return fail("inside no segment an earlier event created".into());
                }
                if blocks.insert(a, true).is_some() {
                    return fail("an address that is already allocated".into());
                }
            }
            TraceAction::FreeRequested => match blocks.get_mut(&a) {
                Some(live @ true) => *live = false,
                _ => return fail("memory no earlier event allocated".into()),
            },
            TraceAction::FreeCompleted => {
                // The completion of a free an earlier event requested.
                if blocks.remove(&a) != Some(false) {
                    return fail("memory no earlier event allocated".into());
                }
            }
            TraceAction::Oom | TraceAction::Snapshot => {}
        }
    }
    let end = trace.len();
    // The snapshot's own state must be what the trace leaves.
    let mut snap_runs: Vec<(u64, u64)> = segments.iter().map(|s| (s.address, s.address + s.total_size)).collect();
    snap_runs.sort_unstable();
    let snap_runs = runs(snap_runs.into_iter());
    let trace_runs = memory.runs();
    if snap_runs != trace_runs {
        let held: u64 = snap_runs.iter().map(|(s, e)| e - s).sum();
        let traced: u64 = trace_runs.iter().map(|(s, e)| e - s).sum();
        let first =
            snap_runs.iter().find(|r| !trace_runs.contains(r)).or(trace_runs.iter().find(|r| !snap_runs.contains(r)));
        let at = first.map_or(String::new(), |(s, e)| format!(", first difference {:#x} ({} bytes)", s, e - s));
        return Err((
            end,
            format!(
                "{hint} (the snapshot's segments hold {held} bytes, the trace leaves {traced} bytes in segments{at})"
            ),
        ));
    }
    let mut snap_live: Vec<u64> = segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == "active_allocated")
        .map(|b| b.address)
        .collect();
    let mut trace_live: Vec<u64> = blocks.iter().filter(|(_, live)| **live).map(|(a, _)| *a).collect();
    snap_live.sort_unstable();
    trace_live.sort_unstable();
    if snap_live != trace_live {
        let first = snap_live.iter().find(|a| trace_live.binary_search(a).is_err());
        let at = first.map_or(String::new(), |a| format!(", e.g. {a:#x} allocated before the trace"));
        return Err((
            end,
            format!(
                "{hint} (the snapshot has {} allocated blocks, the trace leaves {} allocated{at})",
                snap_live.len(),
                trace_live.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closure_in_a_cell_is_named_by_its_place() {
        let f = |name: &str, filename: &str, line| Frame { name: name.into(), filename: filename.into(), line };
        let info = |frames| EventInfo { label: "cell 22".into(), frames };
        let closure = info(vec![f("{closure#0}", "cell 22", 2), f("run_user_code_21", "cell 22", 1)]);
        assert_eq!(closure.describe().as_deref(), Some("cell 22:2"));
        let body = info(vec![f("ctx::run_user_code_21", "cell 22", 3)]);
        assert_eq!(body.describe().as_deref(), Some("cell 22:3"));
        let named = info(vec![f("alloc48", "cell 3", 4)]);
        assert_eq!(named.describe().as_deref(), Some("alloc48 (cell 3:4)"));
        let torch = EventInfo { label: String::new(), frames: vec![f("forward", "/home/u/model.py", 10)] };
        assert_eq!(torch.describe().as_deref(), Some("forward (/home/u/model.py:10)"));
    }
}
