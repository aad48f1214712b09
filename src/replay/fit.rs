//! Will it fit: a recorded program replayed on a device of a given size, under any policy,
//! with PyTorch's out-of-memory path (free cached blocks, retry) when the device is full.
//!
//! # What is replayed
//! The program, not PyTorch's decisions: every `alloc` is a malloc of the recorded size on the
//! recorded stream, every `free_requested` a free (one whose `free_completed` comes later waits
//! on an event that completes at that line, as in [`super::replay_sequence`]), and every
//! `empty_cache()` the program called (the releases the exact replay explained that way) is
//! called at the same point. Recorded `oom` lines are requests that failed in the recording:
//! the program went on without them, so the replay does too (they are counted). gpumem-nb's
//! tracked allocations of other sources (CUDA pool, driver, VMM, managed) take their size
//! rounded up to the driver's 2 MiB granularity from the same device; the caching allocator
//! does not release its cache for them (a driver never asks it to).
//!
//! The device (`ReplayBackend::with_capacity`) gives a segment the address the trace's
//! segment of that size got when it is free, so a run on a device at least as large as the
//! recorded peak makes exactly the recorded decisions (best fit breaks ties by address).
//!
//! A request that cannot be placed even after the out-of-memory path is a failure: it is
//! recorded (the first one with its site and the reserved bytes' parts at that moment) and the
//! replay goes on without it, its free skipped, so every later part of the program is judged
//! too (as if the failed allocation had been avoided).
//!
//! # The smallest device ([`min_device`])
//! Every reservation is a multiple of 2 MiB (PyTorch's segment sizes, expandable and compact
//! pages, the driver's granularity for other sources), so whether a run fits changes only at
//! multiples of 2 MiB, and the search looks at those only. No device below the program's own
//! live peak (the requests it holds at once, other sources included) can fit; a device as large
//! as the peak of an unconstrained run fits by construction (the run never reaches it; this is
//! also checked by running it). Between the two it bisects, **assuming that fitting is
//! monotone in the device's size**. PyTorch's policy does not guarantee that: on a smaller
//! device the out-of-memory path empties the cache earlier, which can leave less fragmentation
//! than a larger device's run has. The answer is a size that fits, with 2 MiB less measured not
//! to; every size probed is reported.
//!
//! # Not modelled
//! Memory outside the program's allocations: the CUDA context (about 300–600 MiB per process
//! on current GPUs), other processes on the device, libraries' workspaces not recorded
//! (NCCL's buffers, cuBLAS/cuDNN workspaces allocated before recording), the CUDA pool's own
//! caching beyond its live bytes, and CUDA graphs' private pools. Leave room for them.

use super::input::{DeviceTrace, EventInfo, Ordered};
use super::{TraceError, TraceLine};
use crate::device::replay::ReplayBackend;
use crate::device::sim::GRANULARITY;
use crate::device::{EventId, StreamId};
use crate::error::AllocError;
use crate::policy::config::AllocatorConfig;
use crate::policy::{BlockId, DeviceState, ReservedParts};
use crate::record::frames::Frame;
use crate::record::history::TraceAction;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};

/// The label of the allocations made before a trace began ([`super::TraceStart::Prologue`]).
pub const BEFORE_TRACE: &str = "before recording";

/// The policies a fit is planned under, as the notebook's table shows them: (name,
/// configuration).
pub const POLICIES: [(&str, &str); 3] =
    [("default", ""), ("expandable", "expandable_segments:True"), ("compact", "compact:True")];

/// A recorded program on one device: its events and what the exact replay learnt of them.
#[derive(Clone, Debug)]
pub struct Program<'a> {
    trace: &'a DeviceTrace,
    /// Indices of the events before which the program called `empty_cache` (sorted).
    empty_cache_before: Vec<usize>,
    /// Indices of the `free_requested` events whose completion comes later.
    later: HashSet<usize>,
    /// The trace's segments, (size, address), in order.
    segments: Vec<(u64, u64)>,
    /// The size the recording's device reported (the address space expandable segments take).
    device_total: u64,
}

impl<'a> Program<'a> {
    /// The program of `trace`; `empty_cache_before` from the exact replay
    /// ([`super::ReplayReport::empty_cache_before`]; empty when it was not replayed exactly).
    pub fn new(trace: &'a DeviceTrace, empty_cache_before: Vec<usize>, device_total: u64) -> Self {
        let ev = &trace.events;
        let later = ev
            .iter()
            .enumerate()
            .filter(|(i, e)| {
                e.action == TraceAction::FreeRequested
                    && !ev.get(i + 1).is_some_and(|n| n.action == TraceAction::FreeCompleted && n.addr == e.addr)
            })
            .map(|(i, _)| i)
            .collect();
        let segments = ev.iter().filter(|e| e.action == TraceAction::SegmentAlloc).map(|e| (e.size, e.addr)).collect();
        let mut empty_cache_before = empty_cache_before;
        empty_cache_before.sort_unstable();
        Program { trace, empty_cache_before, later, segments, device_total }
    }

    /// The device's trace.
    pub fn trace(&self) -> &DeviceTrace {
        self.trace
    }

    /// The most bytes the program holds at once: the requests of its live allocations, and
    /// other sources' allocations at the driver's granularity. No smaller device can run it.
    pub fn live_peak(&self) -> u64 {
        self.peak_of(driver_bytes)
    }

    /// The most bytes the program asked for at once, every source at its requested size: what
    /// tracking counted as the session's peak (the driver's granularity makes
    /// [`Program::live_peak`] higher).
    pub fn requested_peak(&self) -> u64 {
        self.peak_of(|size| size)
    }

    fn peak_of(&self, foreign_bytes: fn(u64) -> u64) -> u64 {
        let mut sizes: HashMap<u64, u64> = self.trace.prologue.iter().map(|e| (e.addr, e.size)).collect();
        let (mut now, mut peak) = (sizes.values().sum::<u64>(), 0u64);
        peak = peak.max(now);
        let mut foreign: HashMap<u64, u64> = HashMap::new();
        for step in self.trace.in_order() {
            match step {
                Ordered::Foreign(f) if f.alloc => {
                    let s = foreign_bytes(f.size);
                    foreign.insert(f.addr, s);
                    now += s;
                }
                Ordered::Foreign(f) => now -= foreign.remove(&f.addr).unwrap_or(0),
                Ordered::Event(_, e) => match e.action {
                    TraceAction::Alloc => {
                        sizes.insert(e.addr, e.size);
                        now += e.size;
                    }
                    TraceAction::FreeRequested => now -= sizes.remove(&e.addr).unwrap_or(0),
                    _ => {}
                },
            }
            peak = peak.max(now);
        }
        peak
    }
}

/// A request that could not be placed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// Position of the request in the device's trace, from 0 (a TSV trace: its line − 1).
    pub index: usize,
    /// The event as errors name it: its number in the snapshot's device trace, or its line.
    pub event: usize,
    /// Bytes asked for.
    pub size: u64,
    /// The stream (raw handle, 0 = default).
    pub stream: u64,
    /// `allocator` (the caching allocator), or the other source (`pool`, `driver`, `vmm`,
    /// `managed`).
    pub source: String,
    /// The label it was recorded under (gpumem-nb: the notebook cell).
    pub label: Option<String>,
    /// The program's line: `function (file:line)` of its site frame, when a stack was recorded.
    pub site: Option<String>,
    /// Its stack, innermost first (up to 8 frames).
    pub frames: Vec<Frame>,
    /// Device bytes free when it failed.
    pub device_free: u64,
    /// The allocator's reserved and allocated bytes then.
    pub reserved: u64,
    /// Allocated bytes then.
    pub allocated: u64,
    /// Where the reserved bytes were (for the first failure of a run).
    pub parts: Option<ReservedParts>,
}

/// One replay on a device of one size.
#[derive(Clone, Debug, Serialize)]
pub struct FitRun {
    /// The device's size (`None`: unconstrained).
    pub capacity: Option<u64>,
    /// Whether every request was placed.
    pub fits: bool,
    /// Requests that could not be placed.
    pub failures: usize,
    /// The first of them.
    pub first_failure: Option<Failure>,
    /// The first failure of each label (gpumem-nb: each notebook cell).
    pub first_failure_by_label: BTreeMap<String, Failure>,
    /// `reserved_bytes.all.peak` of the allocator.
    pub reserved_peak: u64,
    /// `allocated_bytes.all.peak`.
    pub allocated_peak: u64,
    /// `requested_bytes.all.peak`.
    pub requested_peak: u64,
    /// The most the device held: the allocator's reserved bytes and other sources' together.
    pub device_peak: u64,
    /// The device's peak during each label's events.
    pub device_peak_by_label: BTreeMap<String, u64>,
    /// `num_alloc_retries` (the out-of-memory path ran: cache freed, retried).
    pub num_alloc_retries: u64,
    /// Recorded `oom` lines (not replayed).
    pub skipped_ooms: usize,
    /// Index of the event after which the allocator's reserved bytes first reached their peak.
    pub reserved_peak_event: Option<usize>,
    /// The reserved bytes' parts after the events [`RunOptions::explain_at`] asked for.
    pub explained: Vec<(usize, ReservedParts)>,
}

/// How to run a program.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// The device's size (`None`: as large as the program needs; it reports the recording's
    /// size).
    pub capacity: Option<u64>,
    /// Explain the reserved bytes after these event indices (the number of events: at the end).
    pub explain_at: Vec<usize>,
}

/// Replays `program` under `config` on a device of `capacity` bytes (`None`: as large as it
/// needs, reporting the recording's size).
pub fn run(program: &Program<'_>, config: &AllocatorConfig, capacity: Option<u64>) -> Result<FitRun, TraceError> {
    run_with(program, config, &RunOptions { capacity, explain_at: Vec::new() })
}

/// [`run`] with every option.
pub fn run_with(program: &Program<'_>, config: &AllocatorConfig, opts: &RunOptions) -> Result<FitRun, TraceError> {
    let capacity = opts.capacity;
    let t = program.trace;
    let fail = |e: &TraceLine, message: String| TraceError {
        path: String::new(),
        line: Some(e.line),
        device: Some(t.device),
        message,
    };
    let mut state = DeviceState::new(t.device, config.clone());
    state.set_explain_ooms(false);
    let total = capacity.unwrap_or(program.device_total);
    let mut dev = ReplayBackend::with_capacity(total, capacity.unwrap_or(u64::MAX));
    dev.set_addresses_by_size(program.segments.iter().copied());
    let mut out = FitRun {
        capacity,
        fits: true,
        failures: 0,
        first_failure: None,
        first_failure_by_label: BTreeMap::new(),
        reserved_peak: 0,
        allocated_peak: 0,
        requested_peak: 0,
        device_peak: 0,
        device_peak_by_label: BTreeMap::new(),
        num_alloc_retries: 0,
        skipped_ooms: 0,
        reserved_peak_event: None,
        explained: Vec::new(),
    };
    let mut reserved_high = 0i64;
    let mut live: HashMap<u64, BlockId> = HashMap::new();
    let mut absent: HashSet<u64> = HashSet::new();
    let mut pending: HashMap<u64, Vec<EventId>> = HashMap::new();
    let mut foreign: HashMap<u64, u64> = HashMap::new();
    let mut private = 0u64;
    let mut ec = program.empty_cache_before.iter().copied().peekable();

    // A failure: counted, the first (and each label's first) described.
    let failed = |out: &mut FitRun,
                  state: &mut DeviceState,
                  dev: &ReplayBackend,
                  index: usize,
                  event: usize,
                  size: u64,
                  stream: u64,
                  source: &str,
                  info: Option<&EventInfo>| {
        out.failures += 1;
        out.fits = false;
        let label = info.map(|i| i.label.clone()).filter(|l| !l.is_empty());
        let first = out.first_failure.is_none();
        let first_of_label = label.as_ref().is_some_and(|l| !out.first_failure_by_label.contains_key(l));
        if !(first || first_of_label) {
            return;
        }
        let stats = state.stats();
        let f = Failure {
            index,
            event,
            size,
            stream,
            source: source.to_string(),
            label: label.clone(),
            site: info.and_then(EventInfo::describe),
            frames: info.map(|i| i.frames.iter().take(8).cloned().collect()).unwrap_or_default(),
            device_free: total.saturating_sub(dev.used()),
            reserved: stats.reserved_bytes[0].current.max(0) as u64,
            allocated: stats.allocated_bytes[0].current.max(0) as u64,
            parts: first.then(|| state.reserved_parts()),
        };
        if let Some(l) = label
            && first_of_label
        {
            out.first_failure_by_label.insert(l, Failure { parts: None, ..f.clone() });
        }
        if first {
            out.first_failure = Some(f);
        }
    };
    let peak_of = |out: &mut FitRun, used: u64, info: Option<&EventInfo>| {
        out.device_peak = out.device_peak.max(used);
        if let Some(i) = info.filter(|i| !i.label.is_empty()) {
            let p = out.device_peak_by_label.entry(i.label.clone()).or_default();
            *p = (*p).max(used);
        }
    };

    // Allocations from before the trace (a notebook that began recording late) come first.
    let before = EventInfo { label: BEFORE_TRACE.into(), frames: Vec::new() };
    for e in &t.prologue {
        match state.malloc(&mut dev, e.size, e.stream) {
            Ok(a) => {
                if let Some(b) = a.block {
                    live.insert(e.addr, b);
                }
            }
            Err(AllocError::OutOfMemory(_) | AllocError::TooLarge(_)) => {
                failed(&mut out, &mut state, &dev, 0, 0, e.size, e.stream.0, "allocator", Some(&before));
                absent.insert(e.addr);
            }
            Err(AllocError::Device(err)) => return Err(fail(e, format!("device error: {err}"))),
        }
        peak_of(&mut out, dev.used(), Some(&before));
    }
    let empty_cache = |state: &mut DeviceState, dev: &mut ReplayBackend| {
        state.empty_cache(dev).map_err(|err| TraceError::file("", format!("empty_cache failed: {err}")))
    };
    // The recording in order: the other sources' entries, and before each allocator event the
    // `empty_cache` calls recorded before it.
    for step in t.in_order() {
        let (i, e) = match step {
            Ordered::Event(i, e) => (i, e),
            Ordered::Foreign(f) => {
                let info = f.info.as_deref();
                if f.alloc {
                    let bytes = driver_bytes(f.size);
                    match dev.take_external(bytes) {
                        Ok(()) => {
                            foreign.insert(f.addr, bytes);
                        }
                        Err(_) => failed(&mut out, &mut state, &dev, f.event - 1, f.event, f.size, 0, f.source, info),
                    }
                } else if let Some(bytes) = foreign.remove(&f.addr) {
                    dev.release_external(bytes);
                }
                peak_of(&mut out, dev.used(), info);
                continue;
            }
        };
        while ec.next_if(|&k| k <= i).is_some() {
            empty_cache(&mut state, &mut dev)?;
        }
        let info = t.info_of(i);
        match e.action {
            TraceAction::Alloc => match state.malloc(&mut dev, e.size, e.stream) {
                Ok(a) => match a.block {
                    Some(b) if live.insert(e.addr, b).is_some() => {
                        return Err(fail(e, format!("alloc at address {} which is already allocated", e.addr)));
                    }
                    Some(_) => {}
                    None => {
                        absent.insert(e.addr);
                    }
                },
                Err(AllocError::OutOfMemory(_) | AllocError::TooLarge(_)) => {
                    failed(&mut out, &mut state, &dev, e.line - 1, e.line, e.size, e.stream.0, "allocator", info);
                    absent.insert(e.addr);
                }
                Err(AllocError::Device(err)) => return Err(fail(e, format!("device error: {err}"))),
            },
            TraceAction::FreeRequested => {
                let Some(b) = live.remove(&e.addr) else {
                    if absent.remove(&e.addr) {
                        continue;
                    }
                    return Err(fail(
                        e,
                        format!("free_requested of unknown address {} (no live allocation there)", e.addr),
                    ));
                };
                if program.later.contains(&i) {
                    private += 1;
                    let side = StreamId(u64::MAX - private);
                    state.record_stream(b, side).map_err(|err| fail(e, err.to_string()))?;
                    state.free(&mut dev, b).map_err(|err| fail(e, err.to_string()))?;
                    pending.insert(e.addr, dev.take_recorded_events());
                } else {
                    state.free(&mut dev, b).map_err(|err| fail(e, err.to_string()))?;
                }
            }
            TraceAction::FreeCompleted => {
                if let Some(events) = pending.remove(&e.addr) {
                    for ev in events {
                        dev.complete_event(ev);
                    }
                    state.process_events(&mut dev).map_err(|err| fail(e, err.to_string()))?;
                }
            }
            TraceAction::Oom => out.skipped_ooms += 1,
            _ => {}
        }
        peak_of(&mut out, dev.used(), info);
        let reserved = state.stats().reserved_bytes[0].current;
        if reserved > reserved_high {
            reserved_high = reserved;
            out.reserved_peak_event = Some(i);
        }
        if opts.explain_at.contains(&i) {
            out.explained.push((i, state.reserved_parts()));
        }
    }
    // After the last event: the `empty_cache` calls recorded at the end, and the end's parts.
    let end = t.events.len();
    while ec.next_if(|&k| k <= end).is_some() {
        empty_cache(&mut state, &mut dev)?;
    }
    if opts.explain_at.contains(&end) {
        out.explained.push((end, state.reserved_parts()));
    }
    let s = state.stats();
    out.reserved_peak = s.reserved_bytes[0].peak.max(0) as u64;
    out.allocated_peak = s.allocated_bytes[0].peak.max(0) as u64;
    out.requested_peak = s.requested_bytes[0].peak.max(0) as u64;
    out.num_alloc_retries = s.num_alloc_retries.max(0) as u64;
    Ok(out)
}

/// What another source's allocation takes on the device: its size rounded up to the driver's
/// granularity.
fn driver_bytes(size: u64) -> u64 {
    size.div_ceil(GRANULARITY) * GRANULARITY
}

/// The smallest device a program fits on under a policy (see the module docs).
#[derive(Clone, Debug, Serialize)]
pub struct Search {
    /// The smallest size found to fit (a multiple of [`GRANULARITY`]).
    pub min_device_bytes: u64,
    /// The largest size known not to fit: measured, or the largest multiple of the granularity
    /// below the program's live peak.
    pub does_not_fit: u64,
    /// The program's live peak (no smaller device can run it).
    pub live_peak: u64,
    /// Every size replayed, and whether it fit, in order.
    pub probes: Vec<(u64, bool)>,
    /// The unconstrained run (its device peak is where the search starts).
    pub unconstrained: FitRun,
}

/// Finds the smallest device (a multiple of [`GRANULARITY`]) on which `program` fits under
/// `config`, by bisection between its live peak and its unconstrained peak.
pub fn min_device(program: &Program<'_>, config: &AllocatorConfig) -> Result<Search, TraceError> {
    let g = GRANULARITY;
    let unconstrained = run(program, config, None)?;
    let live_peak = program.live_peak();
    let mut probes = Vec::new();
    let mut hi = unconstrained.device_peak.div_ceil(g) * g;
    // Below the live peak nothing fits: no need to run it.
    let mut lo = live_peak.saturating_sub(1) / g * g;
    if live_peak == 0 {
        return Ok(Search { min_device_bytes: 0, does_not_fit: 0, live_peak, probes, unconstrained });
    }
    // The top fits when the run never reaches it. Expandable segments and compact size their
    // address ranges by the device's size, so a smaller device can place blocks differently:
    // step up from the unconstrained peak until a size fits (measured, never assumed).
    let mut step = g;
    loop {
        let top = run(program, config, Some(hi))?;
        probes.push((hi, top.fits));
        if top.fits {
            break;
        }
        lo = hi;
        if hi > unconstrained.device_peak.saturating_mul(4).max(64 * g) {
            return Err(TraceError::file(
                "",
                format!("no device up to {hi} bytes fits the program under this policy: please report this trace"),
            ));
        }
        hi += step;
        step *= 2;
    }
    while hi - lo > g {
        let mid = lo + (hi - lo) / g / 2 * g;
        let r = run(program, config, Some(mid))?;
        probes.push((mid, r.fits));
        if r.fits {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(Search { min_device_bytes: hi, does_not_fit: lo, live_peak, probes, unconstrained })
}
