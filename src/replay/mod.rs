//! Replay of recorded PyTorch allocator traces through the policy, on the replay device.
//!
//! A trace (`tests/fixtures/traces/README.md`) is one event a line, tab-separated:
//! `action addr size stream time_us`, optionally gzip-compressed. The replayer calls the
//! policy for the caller-level events (`alloc`, `free_requested`, `free_completed`, `oom`) and
//! checks that the policy produces the device-level events (`segment_*`) the trace recorded.
//!
//! How each recorded situation is reproduced:
//! - **Segment addresses**: the trace's `segment_alloc` addresses are queued on the replay
//!   device (`ReplayBackend`), so best-fit tie-breaks by address go the way they went in
//!   PyTorch.
//! - **Cross-stream frees**: a `free_requested` whose `free_completed` is not the next line was
//!   waiting on another stream (`record_stream`). The block is marked as used on a stream of
//!   its own, and its event completes when the trace's `free_completed` line is reached.
//! - **Releases** (`segment_free`/`segment_unmap` before a caller event) come from
//!   `empty_cache`, the out-of-memory path, or garbage collection. The replayer tries, on a
//!   copy of the state, a plain malloc, a malloc whose first device allocation fails (the OOM
//!   path), and `empty_cache` followed by the event, and keeps the first whose device events
//!   match the trace's.
//! - **`oom`**: the malloc is replayed with every device allocation failing.
//!
//! Everything the policy does that the trace did not record is counted as a divergence.
//!
//! [`replay_sequence`] instead replays only the allocations and frees, under any policy, on a
//! simulated device (`sequence.rs`): what `compact:True` would have reserved for the program.

use crate::device::StreamId;
use crate::device::replay::ReplayBackend;
use crate::error::AllocError;
use crate::policy::config::AllocatorConfig;
use crate::policy::{BlockId, DeviceState};
use crate::record::history::{RecordMode, TraceAction, TraceEntry};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

pub mod components;
pub mod fit;
mod input;
mod sequence;
pub(crate) use input::Ordered;
pub use input::{
    DeviceTrace, EventInfo, Foreign, InputKind, Recording, SourcePeaks, TraceStart, check_start, from_snapshot,
    read_recording, settings_conf,
};
pub use sequence::{SequenceReport, replay_sequence, trace_reserved_peak};

/// One line of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceLine {
    /// 1-based line number in the file.
    pub line: usize,
    /// The action.
    pub action: TraceAction,
    /// Address (for `oom`: the device's free bytes, or 0 when the column is empty).
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// Stream handle.
    pub stream: StreamId,
    /// Timestamp, µs.
    pub time_us: i64,
}

/// A trace that could not be read or replayed, with where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceError {
    /// The file.
    pub path: String,
    /// 1-based line (of a TSV trace), or event number (in a snapshot's device trace), when
    /// the problem is at one.
    pub line: Option<usize>,
    /// The device whose trace it is, for a snapshot (`None` for a TSV trace).
    pub device: Option<i32>,
    /// What was wrong.
    pub message: String,
}

impl TraceError {
    /// An error about the file as a whole.
    pub fn file(path: &str, message: impl Into<String>) -> Self {
        TraceError { path: path.to_string(), line: None, device: None, message: message.into() }
    }

    /// The same error, about `device`'s trace of a snapshot.
    pub fn on_device(mut self, device: i32) -> Self {
        self.device = Some(device);
        self
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.device, self.line) {
            (Some(d), Some(l)) => write!(f, "{}: device {d}, event {l}: {}", self.path, self.message),
            (Some(d), None) => write!(f, "{}: device {d}: {}", self.path, self.message),
            (None, Some(l)) => write!(f, "{}:{}: {}", self.path, l, self.message),
            (None, None) => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

impl std::error::Error for TraceError {}

/// Reads a `.tsv` or `.tsv.gz` trace (gzip is detected by its magic bytes).
pub fn read_trace(path: &Path) -> Result<Vec<TraceLine>, TraceError> {
    let name = path.display().to_string();
    let err = |line: Option<usize>, message: String| TraceError { path: name.clone(), line, device: None, message };
    let mut file = std::fs::File::open(path).map_err(|e| err(None, format!("cannot open: {e}")))?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).map_err(|e| err(None, format!("cannot read: {e}")))?;
    let head = std::io::Cursor::new(magic[..n].to_vec()).chain(file);
    let reader: Box<dyn Read> = if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(flate2::read::MultiGzDecoder::new(head))
    } else {
        Box::new(head)
    };
    parse_trace(BufReader::new(reader), &name)
}

/// Parses trace lines from any reader; `name` labels errors.
pub fn parse_trace(reader: impl BufRead, name: &str) -> Result<Vec<TraceLine>, TraceError> {
    let mut out = Vec::new();
    let err =
        |line: usize, message: String| TraceError { path: name.to_string(), line: Some(line), device: None, message };
    for (i, line) in reader.lines().enumerate() {
        let lineno = i + 1;
        let line = line.map_err(|e| {
            let what = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "truncated gzip stream (unexpected end of file)".to_string()
            } else if e.kind() == std::io::ErrorKind::InvalidData {
                format!("unreadable data: {e}")
            } else {
                format!("read error: {e}")
            };
            err(lineno, what)
        })?;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 5 {
            return Err(err(
                lineno,
                format!("expected 5 tab-separated fields (action addr size stream time_us), found {}", f.len()),
            ));
        }
        let action =
            TraceAction::from_name(f[0].trim()).ok_or_else(|| err(lineno, format!("unknown action '{}'", f[0])))?;
        let num = |idx: usize, what: &str| -> Result<u64, TraceError> {
            let t = f[idx].trim();
            if t.is_empty() && action == TraceAction::Oom && idx == 1 {
                return Ok(0);
            }
            t.parse::<u64>().map_err(|_| err(lineno, format!("{what} '{t}' is not a non-negative integer")))
        };
        let addr = num(1, "address")?;
        let size = num(2, "size")?;
        let stream = StreamId(num(3, "stream")?);
        let t = f[4].trim();
        let time_us = t.parse::<i64>().map_err(|_| err(lineno, format!("time_us '{t}' is not an integer")))?;
        out.push(TraceLine { line: lineno, action, addr, size, stream, time_us });
    }
    Ok(out)
}

/// The outcome of a replay.
#[derive(Clone, Debug)]
pub struct ReplayReport {
    /// Events in the trace.
    pub events: usize,
    /// `allocated_bytes.all.peak`.
    pub allocated_peak: i64,
    /// `reserved_bytes.all.peak`.
    pub reserved_peak: i64,
    /// `num_device_alloc`.
    pub num_device_alloc: i64,
    /// `num_device_free`.
    pub num_device_free: i64,
    /// Size of every new segment (or mapped range), in order.
    pub segment_sizes: Vec<u64>,
    /// The trace's own `segment_alloc`/`segment_map` sizes, in order.
    pub trace_segment_sizes: Vec<u64>,
    /// The full `memory_stats()` at the end.
    pub stats: BTreeMap<String, i64>,
    /// Caller events whose device events differed from the trace's.
    pub divergences: usize,
    /// The first divergence, described.
    pub first_divergence: Option<String>,
    /// Allocations that landed at another address than in the trace.
    pub address_mismatches: usize,
    /// How releases were explained: (plain, oom-path, empty_cache) counts.
    pub strategies: [usize; 3],
    /// Indices into the trace's events before which the program called `empty_cache` (the
    /// length of the trace: at its end), as the releases were explained.
    pub empty_cache_before: Vec<usize>,
    /// The final state (for snapshots and the invariant check).
    pub(crate) state: DeviceState,
    /// Every replayed event, when `keep_history` was set; timestamps are the trace's.
    pub history: Vec<TraceEntry>,
}

impl ReplayReport {
    /// Recounts every invariant of the replay's end state.
    pub fn check_invariants(&self) -> Result<(), crate::policy::InvariantViolation> {
        self.state.check_invariants()
    }

    /// Segments and blocks of the replay's end state.
    pub fn segments(&self) -> Vec<crate::policy::SegmentView> {
        self.state.segments()
    }

    /// A snapshot of the replay's end state with the whole replayed history.
    pub fn snapshot(&self) -> crate::snapshot::Snapshot {
        snapshot_of(&self.state, &self.history, crate::device::BackendKind::Replay)
    }
}

/// A snapshot of a replayed state with its history.
fn snapshot_of(
    state: &DeviceState,
    history: &[TraceEntry],
    backend: crate::device::BackendKind,
) -> crate::snapshot::Snapshot {
    let raw = crate::snapshot::RawSnapshot {
        device: 0,
        segments: state.segments(),
        trace: history.to_vec(),
        labels: state.labels(),
        config: state.config().clone(),
        backend: Some(backend),
    };
    crate::snapshot::Snapshot::from_raw(&raw)
}

/// Options of a replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Allocator configuration the trace was recorded with.
    pub config: AllocatorConfig,
    /// Device total memory to report (OOM text, expandable address-space size).
    pub device_total: u64,
    /// Keep every replayed event (with the trace's timestamps) for a snapshot.
    pub keep_history: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions { config: AllocatorConfig::default(), device_total: 80 << 30, keep_history: false }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Strategy {
    Plain,
    OomPath,
    EmptyCache,
}

struct Replayer<'a> {
    path: &'a str,
    state: DeviceState,
    dev: ReplayBackend,
    live: HashMap<u64, BlockId>,
    pending: HashMap<u64, Vec<crate::device::EventId>>,
    next_private_stream: u64,
    divergences: usize,
    first_divergence: Option<String>,
    address_mismatches: usize,
    strategies: [usize; 3],
    segment_sizes: Vec<u64>,
    /// Every replayed event, when the history is kept (for snapshots).
    kept: Option<Vec<TraceEntry>>,
    /// Lines of `free_requested` events whose `free_completed` comes later.
    deferred: std::collections::HashSet<usize>,
    /// Indices of the events before which the program called `empty_cache`.
    empty_cache_before: Vec<usize>,
}

fn seg_key(e: &TraceEntry) -> (TraceAction, u64, u64) {
    (e.action, e.addr, e.size)
}

impl Replayer<'_> {
    fn fail(&self, line: usize, message: String) -> TraceError {
        TraceError { path: self.path.to_string(), line: Some(line), device: None, message }
    }

    fn note_divergence(&mut self, line: usize, what: String) {
        self.divergences += 1;
        if self.first_divergence.is_none() {
            self.first_divergence = Some(format!("line {line}: {what}"));
        }
    }

    fn queue_addresses(dev: &mut ReplayBackend, segs: &[&TraceLine]) {
        dev.clear_queued();
        for s in segs {
            match s.action {
                TraceAction::SegmentAlloc => dev.push_segment_address(s.addr),
                TraceAction::SegmentMap => dev.push_range_base(s.addr),
                _ => {}
            }
        }
    }

    /// Runs one caller event under a strategy on the given state/device.
    fn run(
        state: &mut DeviceState,
        dev: &mut ReplayBackend,
        ev: &TraceLine,
        strategy: Strategy,
    ) -> Result<Option<crate::policy::Allocation>, AllocError> {
        if strategy == Strategy::EmptyCache {
            state.empty_cache(dev)?;
        }
        match ev.action {
            TraceAction::Alloc => {
                if strategy == Strategy::OomPath {
                    dev.fail_next(1);
                }
                let r = state.malloc(dev, ev.size, ev.stream);
                dev.fail_next(0);
                r.map(Some)
            }
            TraceAction::Oom => {
                dev.fail_next(u32::MAX);
                let r = state.malloc(dev, ev.size.max(1), ev.stream);
                dev.fail_next(0);
                match r {
                    Err(AllocError::OutOfMemory(_)) => Ok(None),
                    Err(e) => Err(e),
                    Ok(a) => Ok(Some(a)),
                }
            }
            _ => Ok(None),
        }
    }

    /// Replays one caller event together with the device events and deferred completions
    /// the trace recorded just before it (see the module doc for how releases are explained).
    fn caller_event(
        &mut self,
        group: &[&TraceLine],
        ev: Option<&TraceLine>,
        index: usize,
        lookahead: Vec<u64>,
    ) -> Result<(), TraceError> {
        let segs: Vec<&TraceLine> = group.iter().copied().filter(|e| e.action.is_segment()).collect();
        let want: Vec<(TraceAction, u64, u64)> = segs.iter().map(|s| (s.action, s.addr, s.size)).collect();
        let want_done: Vec<u64> =
            group.iter().filter(|e| e.action == TraceAction::FreeCompleted).map(|e| e.addr).collect();
        self.state.prioritize_pending(&want_done);
        let releases = segs.iter().any(|s| matches!(s.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap));
        let is_malloc = ev.is_some_and(|e| matches!(e.action, TraceAction::Alloc | TraceAction::Oom));
        let line = ev.map(|e| e.line).or_else(|| group.first().map(|e| e.line)).unwrap_or(0);
        // Completions recorded before the first device event came from the malloc's own event
        // processing (already complete when it started); later ones from the synchronisation
        // in a release path. Which blocks to mark complete up front is tried in that order.
        let first_seg = group.iter().position(|e| e.action.is_segment()).unwrap_or(group.len());
        let early: Vec<u64> =
            group[..first_seg].iter().filter(|e| e.action == TraceAction::FreeCompleted).map(|e| e.addr).collect();
        let mut pre_sets: Vec<&[u64]> = vec![&early];
        for set in [&want_done[..], &[][..]] {
            if !pre_sets.contains(&set) {
                pre_sets.push(set);
            }
        }
        let candidates: Vec<(Strategy, &[u64])> = if is_malloc {
            let mut c: Vec<(Strategy, &[u64])> = pre_sets.iter().map(|p| (Strategy::Plain, *p)).collect();
            if releases || !want_done.is_empty() {
                for st in [Strategy::EmptyCache, Strategy::OomPath] {
                    c.extend(pre_sets.iter().map(|p| (st, *p)));
                }
            }
            c
        } else if releases || !want_done.is_empty() {
            vec![(Strategy::EmptyCache, &[][..])]
        } else {
            vec![(Strategy::Plain, &[][..])]
        };
        let mut chosen = candidates[0];
        if candidates.len() > 1 {
            for &(s, pre) in &candidates {
                let mut st = self.state.clone();
                let mut dv = self.dev.clone();
                Self::queue_addresses(&mut dv, &segs);
                dv.set_lookahead_range_bases(lookahead.clone());
                self.complete(&mut dv, pre);
                // The outcome must match too: the recorded address, or the recorded failure.
                let ok = ev.is_none_or(|e| match (e.action, Self::run(&mut st, &mut dv, e, s)) {
                    (TraceAction::Alloc, Ok(Some(a))) => a.addr == e.addr,
                    (TraceAction::Oom, Ok(None)) => true,
                    _ => false,
                });
                if ok && Self::take_device_events(&mut st) == (want.clone(), want_done.clone()) {
                    chosen = (s, pre);
                    break;
                }
            }
        }
        let (strategy, pre) = chosen;
        self.strategies[strategy as usize] += 1;
        if strategy == Strategy::EmptyCache {
            self.empty_cache_before.push(index);
        }
        Self::queue_addresses(&mut self.dev, &segs);
        self.dev.set_lookahead_range_bases(lookahead);
        let mut dev = std::mem::replace(&mut self.dev, ReplayBackend::new(0));
        self.complete(&mut dev, pre);
        self.dev = dev;
        for a in &want_done {
            self.pending.remove(a);
        }
        let mut result = Ok(None);
        if strategy == Strategy::EmptyCache && !is_malloc {
            self.state.empty_cache(&mut self.dev).map_err(|e| self.fail(line, format!("empty_cache failed: {e}")))?;
        }
        if let (true, Some(e)) = (is_malloc, ev) {
            result = Self::run(&mut self.state, &mut self.dev, e, strategy);
        }
        let (got, got_done) = Self::device_events(&self.drain_kept(ev.map(|e| e.time_us)));
        for (a, _, size) in &got {
            if matches!(a, TraceAction::SegmentAlloc | TraceAction::SegmentMap) {
                self.segment_sizes.push(*size);
            }
        }
        if got != want || got_done != want_done {
            let fmt = |v: &[(TraceAction, u64, u64)]| {
                v.iter().map(|(a, ad, s)| format!("{}({ad},{s})", a.name())).collect::<Vec<_>>().join(" ")
            };
            self.note_divergence(
                line,
                format!(
                    "trace has [{}] completing {want_done:?}, replay did [{}] completing {got_done:?}",
                    fmt(&want),
                    fmt(&got)
                ),
            );
        }
        let Some(ev) = ev else { return Ok(()) };
        match ev.action {
            TraceAction::FreeRequested => {
                self.free_requested(ev)?;
                self.drain_kept(Some(ev.time_us));
            }
            TraceAction::FreeCompleted => {}
            _ => {}
        }
        match (ev.action, result) {
            (TraceAction::Alloc, Ok(Some(a))) => {
                if let Some(b) = a.block {
                    if a.addr != ev.addr {
                        self.address_mismatches += 1;
                    }
                    if self.live.insert(ev.addr, b).is_some() {
                        return Err(
                            self.fail(ev.line, format!("alloc at address {} which is already allocated", ev.addr))
                        );
                    }
                }
            }
            (TraceAction::Alloc, Err(e)) => {
                self.note_divergence(ev.line, format!("replayed alloc of {} failed: {e}", ev.size));
            }
            (TraceAction::Oom, Ok(Some(a))) => {
                self.note_divergence(ev.line, "trace has an out-of-memory error, the replay allocated".into());
                if let Some(b) = a.block {
                    let _ = self.state.free(&mut self.dev, b);
                    self.drain_kept(Some(ev.time_us));
                }
            }
            (_, Err(e)) => return Err(self.fail(ev.line, format!("device error: {e}"))),
            _ => {}
        }
        Ok(())
    }

    /// Marks the pending events of the blocks at `addrs` complete on `dev`.
    fn complete(&self, dev: &mut ReplayBackend, addrs: &[u64]) {
        for e in addrs.iter().filter_map(|a| self.pending.get(a)).flatten() {
            dev.complete_event(*e);
        }
    }

    /// Device events and completed frees the policy recorded since the last call.
    fn take_device_events(state: &mut DeviceState) -> (Vec<(TraceAction, u64, u64)>, Vec<u64>) {
        Self::device_events(&state.history.drain())
    }

    fn device_events(all: &[TraceEntry]) -> (Vec<(TraceAction, u64, u64)>, Vec<u64>) {
        let segs = all.iter().filter(|e| e.action.is_segment()).map(seg_key).collect();
        let done = all.iter().filter(|e| e.action == TraceAction::FreeCompleted).map(|e| e.addr).collect();
        (segs, done)
    }

    /// Drains the replayed state's events, keeping them (stamped with the trace's time of the
    /// caller event) when the history is wanted.
    fn drain_kept(&mut self, time_us: Option<i64>) -> Vec<TraceEntry> {
        let all = self.state.history.drain();
        if let Some(k) = &mut self.kept {
            k.extend(all.iter().cloned().map(|mut e| {
                e.time_us = time_us.unwrap_or(e.time_us);
                e
            }));
        }
        all
    }

    fn free_requested(&mut self, ev: &TraceLine) -> Result<(), TraceError> {
        let Some(block) = self.live.remove(&ev.addr) else {
            return Err(
                self.fail(ev.line, format!("free_requested of unknown address {} (no live allocation there)", ev.addr))
            );
        };
        if self.deferred.contains(&ev.line) {
            // Completed later: the block was used on another stream.
            self.next_private_stream += 1;
            let s = StreamId(u64::MAX - self.next_private_stream);
            self.state.record_stream(block, s).map_err(|e| self.fail(ev.line, e.to_string()))?;
            self.state.free(&mut self.dev, block).map_err(|e| self.fail(ev.line, e.to_string()))?;
            let evs = self.dev.take_recorded_events();
            self.pending.insert(ev.addr, evs);
        } else {
            self.state.free(&mut self.dev, block).map_err(|e| self.fail(ev.line, e.to_string()))?;
        }
        Ok(())
    }
}

/// Replays a parsed trace. `path` labels errors.
pub fn replay(events: &[TraceLine], opts: &ReplayOptions, path: &str) -> Result<ReplayReport, TraceError> {
    let mut state = DeviceState::new(0, opts.config.clone());
    state.history.set_mode(RecordMode::All, usize::MAX);
    // Which free_requested lines complete later (not on the very next line)?
    let mut deferred = std::collections::HashSet::new();
    for (i, e) in events.iter().enumerate() {
        if e.action != TraceAction::FreeRequested {
            continue;
        }
        let adjacent = events.get(i + 1).is_some_and(|n| n.action == TraceAction::FreeCompleted && n.addr == e.addr);
        if !adjacent {
            deferred.insert(e.line);
            continue;
        }
        // An adjacent completion can still be the synchronisation of a following
        // out-of-memory path or release: then the block waited on another stream. Replaying it
        // as deferred is safe either way (a completion at the next malloc's event processing
        // frees the block before the search, exactly like an immediate free).
        let mut released = false;
        let next = events[i + 2..].iter().find(|n| {
            released |= matches!(n.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap);
            !(n.action.is_segment() || n.action == TraceAction::FreeCompleted || n.action == TraceAction::Snapshot)
        });
        if next.is_some_and(|n| n.action == TraceAction::Oom || (n.action == TraceAction::Alloc && released)) {
            deferred.insert(e.line);
        }
    }
    let mut r = Replayer {
        path,
        state,
        dev: ReplayBackend::new(opts.device_total),
        live: HashMap::new(),
        pending: HashMap::new(),
        next_private_stream: 0,
        divergences: 0,
        first_divergence: None,
        address_mismatches: 0,
        strategies: [0; 3],
        segment_sizes: Vec::new(),
        kept: opts.keep_history.then(Vec::new),
        deferred,
        empty_cache_before: Vec::new(),
    };
    // Where the expandable maps are, for the look-ahead of range bases (see `caller_event`).
    let maps: Vec<usize> =
        events.iter().enumerate().filter(|(_, e)| e.action == TraceAction::SegmentMap).map(|(i, _)| i).collect();
    let lookahead = |from: usize| -> Vec<u64> {
        let k = maps.partition_point(|&m| m < from);
        maps[k..].iter().take(32).map(|&m| events[m].addr).collect()
    };
    let trace_segment_sizes = events
        .iter()
        .filter(|e| matches!(e.action, TraceAction::SegmentAlloc | TraceAction::SegmentMap))
        .map(|e| e.size)
        .collect();
    let mut group: Vec<&TraceLine> = Vec::new();
    let mut i = 0;
    while i < events.len() {
        let idx = i;
        let ev = &events[i];
        i += 1;
        let deferred_completion = ev.action == TraceAction::FreeCompleted && r.pending.contains_key(&ev.addr);
        if ev.action.is_segment() || deferred_completion {
            group.push(ev);
            continue;
        }
        match ev.action {
            TraceAction::Snapshot | TraceAction::FreeCompleted => continue,
            TraceAction::FreeRequested if !r.deferred.contains(&ev.line) => i += 1, // with its completion
            _ => {}
        }
        r.caller_event(&group, Some(ev), idx, lookahead(i))?;
        group.clear();
    }
    if !group.is_empty() {
        // Trailing releases: an empty_cache at the end of the run.
        r.caller_event(&group, None, events.len(), Vec::new())?;
    }
    let stats = r.state.stats().memory_stats();
    Ok(ReplayReport {
        events: events.len(),
        allocated_peak: stats["allocated_bytes.all.peak"],
        reserved_peak: stats["reserved_bytes.all.peak"],
        num_device_alloc: stats["num_device_alloc"],
        num_device_free: stats["num_device_free"],
        segment_sizes: r.segment_sizes,
        trace_segment_sizes,
        stats,
        divergences: r.divergences,
        first_divergence: r.first_divergence,
        address_mismatches: r.address_mismatches,
        strategies: r.strategies,
        empty_cache_before: r.empty_cache_before,
        state: r.state,
        history: r.kept.unwrap_or_default(),
    })
}
