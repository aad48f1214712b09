//! The child end of the gpumem kernel's control channel.
//!
//! The kernel (`gpumem-kernel`) runs notebook code in an evcxr child process and, around every
//! cell, asks the allocator in that child for its exact numbers. It listens on a private Unix
//! socket and passes its path to the child in `GPUMEM_NB_CONTROL`. The first time this crate
//! opens a device in the child it connects there (once per process: the connection lives in
//! the process-wide anchor's state), says hello, and serves the kernel's requests on a
//! background thread, without any code in the cell and without a compile per cell. The messages
//! are [`super::protocol`]'s.
#![forbid(unsafe_code)]

use super::protocol::{self, CONTROL_VAR, DeviceReading, Hello, Op, RecordRequest, Reply, Settled, SnapshotPaths};
use super::tracking;
use super::watched::settle_timeout;
use crate::allocator::Allocator;
use crate::device::Backend;
use crate::record::history::{HistoryOptions, StackContext};
use crate::stats::SlotId;
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set (to anything): each reading the hooks ask for prints where its time went, on stderr.
const TIMES_VAR: &str = "GPUMEM_NB_HOOK_TIMES";

/// Whether `GPUMEM_NB_HOOK_TIMES` (set to anything) asks for the hooks' times (the notebook
/// process's readings here, the kernel's side in gpumem-kernel).
pub fn times_wanted() -> bool {
    std::env::var_os(TIMES_VAR).is_some()
}

/// Connects to the kernel if it asked for it and this process has not connected yet.
pub(crate) fn start_if_requested() {
    let Some(path) = std::env::var_os(CONTROL_VAR) else { return };
    let started = super::anchor::per_process!("control-started", AtomicBool, || AtomicBool::new(false));
    if started.swap(true, Ordering::SeqCst) {
        return;
    }
    // gpumem-kernel's own copy serves this process (its tracker and this channel) with state
    // this copy cannot share: the kernel keeps talking to it.
    if let tracking::TrackingStatus::Elsewhere(why) = tracking::status() {
        eprintln!("gpumem-nb: {why}: the kernel's per-cell reports come from it");
        return;
    }
    let path = std::path::Path::new(&path);
    let mut session = Session::default();
    // What the kernel asks of every child as it connects, applied before the cell's first use
    // of the device goes on (the kernel sends it again when it accepts the connection).
    if let Ok(text) = std::fs::read_to_string(protocol::on_connect_path(path)) {
        for op in text.lines().filter_map(|l| serde_json::from_str::<Op>(l).ok()) {
            if matches!(op, Op::Record(_) | Op::OnOom { .. }) {
                let _ = session.try_handle(0, &op);
            }
        }
    }
    connect(path, session);
}

#[cfg(unix)]
fn connect(path: &std::path::Path, session: Session) {
    let Ok(mut stream) = std::os::unix::net::UnixStream::connect(path) else { return };
    if writeln!(stream, "{}", protocol::to_line(&Hello::new())).is_err() {
        return;
    }
    let Ok(reader) = stream.try_clone() else { return };
    let _ = std::thread::Builder::new()
        .name("gpumem-control".into())
        .spawn(move || serve_with(session, std::io::BufReader::new(reader), stream));
}

#[cfg(not(unix))]
fn connect(_path: &std::path::Path, _session: Session) {}

/// Answers requests until the kernel closes the connection (or a line exceeds
/// [`protocol::MAX_LINE`], which ends the conversation: the peer is broken).
pub fn serve(reader: impl BufRead, out: impl Write) {
    serve_with(Session::default(), reader, out)
}

fn serve_with(mut session: Session, mut reader: impl BufRead, mut out: impl Write) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match std::io::Read::take(reader.by_ref(), protocol::MAX_LINE as u64 + 1).read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) if n > protocol::MAX_LINE => {
                let reply = Reply::error(None, format!("request longer than {} bytes", protocol::MAX_LINE));
                let _ = writeln!(out, "{}", protocol::to_line(&reply));
                return;
            }
            Ok(_) => {}
        }
        // JSON's own whitespace only: anything else around a request makes it malformed.
        let json_ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\r' | b'\n');
        if buf.iter().all(json_ws) {
            continue;
        }
        let reply = match std::str::from_utf8(&buf) {
            Ok(line) => match protocol::parse_request(line.trim_matches(|c| matches!(c, ' ' | '\t' | '\r' | '\n'))) {
                Ok(req) => session.handle(req.id, &req.op),
                Err((id, why)) => Reply::error(id, why),
            },
            Err(e) => Reply::error(None, format!("malformed request: not UTF-8 ({e})")),
        };
        // One write per reply (formatting straight into the socket writes token by token).
        let mut text = protocol::to_line(&reply);
        text.push('\n');
        if out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_err() {
            return;
        }
    }
}

/// What the serving thread remembers between requests: the open peak slots per device, the
/// tracker's slot over every allocation, the out-of-memory watch. The stock kernel's in-child
/// hooks (`notebook::stock`) keep one too.
pub(crate) struct Session {
    slots: HashMap<i32, SlotId>,
    tracked: Option<crate::track::TrackSlot>,
    /// The process's one watch (a device opened mid-cell joins it: [`opened`]).
    oom: Arc<super::oom::OomWatch>,
}

impl Default for Session {
    fn default() -> Self {
        Session { slots: HashMap::new(), tracked: None, oom: super::oom::process_watch() }
    }
}

/// One device's numbers now; peaks since `slot` was opened when there is one; with `explain`,
/// where its reserved bytes are.
pub(crate) fn reading(alloc: &Allocator, slot: Option<SlotId>, explain: bool) -> DeviceReading {
    // A lost context is not touched: its numbers are the allocator's own, as they stood.
    let lost = alloc.lost();
    let (stats, peaks, pool, info, uuid, parts) = alloc.with_state(|s, b| {
        let peaks = slot.and_then(|id| s.slot_peaks(id));
        let parts = explain.then(|| s.reserved_parts());
        if lost.is_some() {
            return (s.stats().clone(), peaks, None, None, None, parts);
        }
        (s.stats().clone(), peaks, b.pool_usage(), b.mem_get_info().ok(), device_uuid(b), parts)
    });
    let (peak_allocated, peak_reserved) = match peaks {
        Some(p) => (p.allocated, p.reserved),
        None => (stats.allocated_bytes[0].peak, stats.reserved_bytes[0].peak),
    };
    let count = |v: i64| v.max(0) as u64;
    DeviceReading {
        device: alloc.device(),
        backend: alloc.backend_kind(),
        allocated: count(stats.allocated_bytes[0].current),
        reserved: count(stats.reserved_bytes[0].current),
        active: count(stats.active_bytes[0].current),
        requested: count(stats.requested_bytes[0].current),
        peak_allocated: count(peak_allocated),
        peak_reserved: count(peak_reserved),
        device_free: info.map(|i| i.0),
        device_total: info.map(|i| i.1),
        pool_used: pool.map(|p| p.used),
        pool_reserved: pool.map(|p| p.reserved),
        pool_used_high: pool.map(|p| p.used_high),
        pool_reserved_high: pool.map(|p| p.reserved_high),
        num_ooms: count(stats.num_ooms),
        uuid,
        explain: parts,
        lost,
    }
}

/// The CUDA device's UUID in NVML's form ("GPU-…"), for the kernel's NVML matching.
fn device_uuid(b: &crate::device::any::AnyBackend) -> Option<String> {
    #[cfg(feature = "cuda")]
    if let Some(c) = b.as_cuda() {
        return c.uuid().ok().map(|u| crate::device::nvml::uuid_string("GPU", u));
    }
    let _ = b;
    None
}

fn device0() -> Result<Arc<Allocator>, String> {
    super::registry::opened().into_iter().find(|a| a.device() == 0).ok_or_else(|| "no device is open".to_string())
}

/// Device 0's snapshot: its allocator's with every other tracked allocation there, or, where
/// the notebook's code never opened the crate's allocator (candle, burn, cudarc), tracking's alone.
fn snapshot0() -> Result<crate::snapshot::Snapshot, String> {
    match device0() {
        Ok(a) => Ok(tracking::snapshot(&a)),
        Err(e) => tracking::tracked_snapshot(0).ok_or(e),
    }
}

/// What a reading includes beyond the devices' numbers: each is work a live line must not do.
#[derive(Clone, Copy)]
struct Full {
    /// The tracked places' top owners (naming them symbolises stacks).
    owners: bool,
    /// The reserved bytes explained.
    explain: bool,
    /// The watched frameworks' own numbers (they may wait on a framework's queue).
    frameworks: bool,
    /// What the tracked bytes are, by component (classifying symbolises stacks not seen before).
    components: bool,
    /// Every CUDA device's ordinal, UUID and kernel stacks (driver calls per device).
    cuda_devices: bool,
}

impl Full {
    const ALL: Full = Full { owners: true, explain: true, frameworks: true, components: true, cuda_devices: true };
}

/// Brings every open device and watched framework to a point where the work queued before now
/// has run (each on a thread of its own, all within [`settle_timeout`]): a cell's reading then
/// counts what the cell queued (a framework allocates on its own device thread, a kernel's
/// fault shows in the cell that launched it). What did not settle in time is read as it is;
/// `None` when everything settled.
pub(crate) fn settle() -> Option<Vec<Settled>> {
    let end = std::time::Instant::now() + settle_timeout();
    let mut waiting = Vec::new();
    for a in super::registry::opened() {
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::time::Instant::now();
        let key = format!("device {}", a.device());
        let spawned = std::thread::Builder::new().name("gpumem-settle".into()).spawn(move || {
            let _ = tx.send(a.synchronize());
        });
        if spawned.is_ok() {
            waiting.push((key, rx, t));
        }
    }
    let mut late: Vec<Settled> =
        super::watched::settle(settle_timeout()).into_iter().filter(|s| s.error.is_some()).collect();
    for (key, rx, t) in waiting {
        let left = end.saturating_duration_since(std::time::Instant::now());
        // A lost context is noted by the allocator (the reading says so); not a settle failure.
        if rx.recv_timeout(left).is_err() {
            let error = Some(format!("still busy after {:.1} s: read as it is", settle_timeout().as_secs_f64()));
            late.push(Settled { key, waited_us: t.elapsed().as_micros() as u64, error });
        }
    }
    (!late.is_empty()).then_some(late)
}

/// What a `record` request sets on an allocator, and the ring's size. Live blocks keep their
/// stacks whatever is recorded (see `tracking::block_stacks`); the allocation events keep the
/// same stack (captured for the block anyway), so a recording says what each allocation was
/// (its component, `%gpumem fit`).
fn record_options(r: &RecordRequest) -> (HistoryOptions, usize) {
    let max_entries = r.max_entries.map_or(usize::MAX, |m| m.min(usize::MAX as u64) as usize);
    let blocks = tracking::block_stacks();
    let context = match (r.stacks, blocks) {
        (true, _) => StackContext::All,
        (false, Some(_)) => StackContext::Alloc,
        (false, None) => StackContext::None,
    };
    let options = match (r.enabled, blocks) {
        (crate::record::history::RecordMode::Off, Some(b)) => b,
        _ => HistoryOptions { enabled: r.enabled, context, max_entries },
    };
    (options, max_entries)
}

/// The last `record` request the kernel made in this process, for a device opened after it.
fn recorded() -> &'static std::sync::Mutex<Option<RecordRequest>> {
    super::anchor::per_process!("record-request", std::sync::Mutex<Option<RecordRequest>>, || {
        std::sync::Mutex::new(None)
    })
}

/// What the kernel asked of every device before this one was opened, applied to it as it opens:
/// the history recording of the last `record` request, and the out-of-memory watch (its cell,
/// its snapshots), so that the cell that first uses a device has it as the cells after it do.
/// `None`: nothing was asked (the device's own defaults stand).
pub(crate) fn opened(alloc: &Arc<Allocator>) {
    super::oom::process_watch().watch_device(alloc);
    let request = crate::sync::lock(recorded()).clone();
    if let Some(r) = request.filter(|r| r.enabled != crate::record::history::RecordMode::Off) {
        alloc.record_memory_history_with(record_options(&r).0);
    }
}

/// The cell's out-of-memory: gpumem-nb's allocator's own failure (with who asked and what
/// held the device, where the driver's refusal says it), else the first allocation the driver
/// refused to anyone (a framework's, or one gpumem-nb's allocator recovered from by giving back
/// its cache: the kernel tells the two apart by whether the cell failed).
fn cell_oom(allocator: Option<super::protocol::OomEvent>) -> Option<super::protocol::OomEvent> {
    let refused = super::oom::refused();
    match allocator {
        Some(mut e) => {
            e.owner.get_or_insert_with(|| super::protocol::GPUMEM_NB.to_string());
            if let Some(r) = refused {
                e.site = e.site.or(r.site);
                e.by_owner = r.by_owner;
            }
            Some(e)
        }
        None => refused,
    }
}

impl Session {
    /// Every open device's reading and the tracked places (with their top owners when
    /// `Full::owners`), peaks since `pre`; the reserved bytes explained when `Full::explain`.
    /// The watched frameworks' own numbers come with every reading but the live line's, which
    /// must not wait on a framework's queue.
    fn readings(&self, id: u64, full: Full) -> Reply {
        let t0 = std::time::Instant::now();
        let slot = |a: &Allocator| self.slots.get(&a.device()).copied();
        let devices = super::registry::opened().iter().map(|a| reading(a, slot(a), full.explain)).collect();
        let t1 = std::time::Instant::now();
        let status = tracking::status();
        let tracked = status.is_on().then(|| {
            let mut places = tracking::readings(self.tracked, full.owners, full.components);
            super::gpus::name_places(&mut places);
            places
        });
        let t2 = std::time::Instant::now();
        // cubecl's own books, once it holds memory and the session library can read them: this
        // reading carries them, settled first.
        if full.frameworks && full.owners && tracked.as_deref().is_some_and(super::shims::attach) {
            super::watched::settle(settle_timeout());
        }
        let frameworks = if full.frameworks { super::watched::readings() } else { None };
        let variables = if full.frameworks { super::probe::reading() } else { None };
        if times_wanted() {
            // Where a reading's time goes (BENCHMARKS.md, "Sites"): on stderr, one line a reading.
            eprintln!(
                "gpumem-nb reading: devices {} µs, tracked{} {} µs, frameworks {} µs",
                (t1 - t0).as_micros(),
                if full.owners { " with owners" } else { "" },
                (t2 - t1).as_micros(),
                t2.elapsed().as_micros()
            );
        }
        let cuda_devices = full.cuda_devices.then(super::gpus::cuda_devices).filter(|d| !d.is_empty());
        Reply {
            devices: Some(devices),
            tracking: Some(status.label()),
            tracked,
            cuda_devices,
            frameworks,
            variables,
            ..Reply::ok(id)
        }
    }

    pub(crate) fn handle(&mut self, id: u64, op: &Op) -> Reply {
        self.try_handle(id, op).unwrap_or_else(|why| Reply::error(Some(id), why))
    }

    fn try_handle(&mut self, id: u64, op: &Op) -> Result<Reply, String> {
        match op {
            Op::Pre { cell } => {
                // What earlier cells queued lands before this one's baseline, not in it.
                let unsettled = settle();
                for a in super::registry::opened() {
                    a.set_label(Some(&format!("cell {cell}")));
                    let slot = a.with_state(|s, b| {
                        b.reset_pool_high_water();
                        s.open_slot()
                    });
                    if let Some(old) = self.slots.insert(a.device(), slot) {
                        a.with_state(|s, _| s.close_slot(old));
                    }
                }
                tracking::set_label(Some(&format!("cell {cell}")));
                super::gpus::reset_pool_high_water();
                if let Some(old) = self.tracked.replace(tracking::open_slot()) {
                    tracking::close_slot(old);
                }
                self.oom.begin(*cell);
                // What the driver refused between cells is no cell's.
                let _ = super::oom::refused();
                // Nothing reads owners before a cell (the record's `top` is what is live after
                // it), and naming them symbolises stacks: only `post` does. Components are read
                // before too, for each one's change over the cell (the stacks live now were
                // classified after the cell that made them: lookups).
                let before =
                    Full { owners: false, explain: false, frameworks: true, components: true, cuda_devices: true };
                Ok(Reply { unsettled, ..self.readings(id, before) })
            }
            Op::Post { .. } => {
                // The cell's label and slots are still open: what it queued counts as its own.
                let unsettled = settle();
                let r = Reply { oom: cell_oom(self.oom.end()), unsettled, ..self.readings(id, Full::ALL) };
                for a in super::registry::opened() {
                    if let Some(slot) = self.slots.remove(&a.device()) {
                        a.with_state(|s, _| s.close_slot(slot));
                    }
                    a.set_label(None);
                }
                if let Some(slot) = self.tracked.take() {
                    tracking::close_slot(slot);
                }
                tracking::set_label(None);
                Ok(r)
            }
            Op::Read => {
                let unsettled = settle();
                Ok(Reply { unsettled, ..self.readings(id, Full::ALL) })
            }
            Op::Live => Ok(self.readings(
                id,
                Full { owners: false, explain: false, frameworks: false, components: false, cuda_devices: false },
            )),
            Op::Record(request) => {
                let (options, max_entries) = record_options(request);
                for a in super::registry::opened() {
                    a.record_memory_history_with(options);
                }
                // A device opened later records as asked from its start (`session::device`).
                *crate::sync::lock(recorded()) = Some(request.clone());
                let on = request.enabled != crate::record::history::RecordMode::Off;
                tracking::set_recording(on.then_some(max_entries));
                Ok(Reply::ok(id))
            }
            Op::Snapshot { dir } => {
                settle();
                let files = snapshot0()?.save(std::path::Path::new(dir)).map_err(|e| e.to_string())?;
                Ok(Reply { files: Some(SnapshotPaths::from(&files)), ..Reply::ok(id) })
            }
            Op::OnOom { dir } => {
                self.oom.set_dir(dir.as_ref().map(std::path::PathBuf::from));
                Ok(Reply::ok(id))
            }
            Op::HistorySvg => {
                let timeline = if tracking::status().is_on() {
                    crate::snapshot::MemoryTimeline::from_snapshot(&snapshot0()?)
                } else {
                    crate::snapshot::MemoryTimeline::of(&*device0()?)
                };
                let chart = timeline.chart(&Default::default());
                Ok(Reply { svg: Some(chart.svg), text: Some(chart.text), ..Reply::ok(id) })
            }
            Op::Summary => Ok(Reply { text: Some(device0()?.memory_summary(false)), ..Reply::ok(id) }),
            Op::CellCode { cell, code } => {
                tracking::set_cell_codes(std::iter::once((*cell, code.as_str())));
                Ok(Reply::ok(id))
            }
            Op::CellCodes { codes } => {
                tracking::set_cell_codes(codes.iter().map(|(cell, code)| (*cell, code.as_str())));
                Ok(Reply::ok(id))
            }
            Op::Top { n } => {
                settle();
                Ok(Reply { top: Some(tracking::top(*n)), ..Reply::ok(id) })
            }
            Op::Trim => Ok(Reply { trim: Some(super::trim::trim()), ..Reply::ok(id) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(requests: &str) -> Vec<Reply> {
        let mut out = Vec::new();
        serve(requests.as_bytes(), &mut out);
        String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    #[test]
    fn malformed_and_unknown_requests_are_answered_not_fatal() {
        // Readings take the watched frameworks' ended stamps: not beside the tests that count them.
        let _one = crate::sync::lock(&crate::notebook::watched::ONE_AT_A_TIME);
        let r = run("not json\n{\"id\":7,\"op\":\"frobnicate\"}\n{\"id\":8}\n\n{\"id\":9,\"op\":\"read\"}\n");
        assert_eq!(r.len(), 4);
        assert!(!r[0].ok && r[0].id.is_none());
        assert!(r[0].error.as_deref().unwrap().starts_with("malformed request"));
        assert_eq!((r[1].id, r[1].ok), (Some(7), false));
        assert!(r[1].error.as_deref().unwrap().contains("frobnicate"));
        assert_eq!((r[2].id, r[2].ok), (Some(8), false));
        assert_eq!((r[3].id, r[3].ok), (Some(9), true), "the channel still answers");
        assert!(r[3].devices.is_some());
    }

    /// Found by the `control` fuzz target (tests/fixtures/fuzz/control-vertical-tab.jsonl): a
    /// request followed by vertical tabs was accepted (Unicode trimming), although it is no
    /// JSON; now it is malformed and changes nothing.
    #[test]
    fn only_json_whitespace_surrounds_a_request() {
        // Readings take the watched frameworks' ended stamps: not beside the tests that count them.
        let _one = crate::sync::lock(&crate::notebook::watched::ONE_AT_A_TIME);
        let fixture = include_str!("../../tests/fixtures/fuzz/control-vertical-tab.jsonl");
        let r = run(fixture);
        assert!(r.iter().all(|r| !r.ok), "{r:?}");
        let r = run("{\"id\":1,\"op\":\"read\"}\u{b}\n \t{\"id\":2,\"op\":\"read\"}\r\n");
        assert_eq!((r[0].id, r[0].ok), (None, false), "not JSON: not even its id is read");
        assert!(r[0].error.as_deref().unwrap().starts_with("malformed request"));
        assert_eq!((r[1].id, r[1].ok), (Some(2), true));
    }

    /// Found by the `control` fuzz target (tests/fixtures/fuzz/control-not-utf8.jsonl): a byte
    /// that is not UTF-8 inside a field name was replaced, the field became unknown and so
    /// ignored, and `record` ran with its defaults; now such a line is malformed.
    #[test]
    fn a_line_that_is_not_utf8_is_malformed() {
        let fixture = include_bytes!("../../tests/fixtures/fuzz/control-not-utf8.jsonl");
        let mut out = Vec::new();
        serve(&fixture[..], &mut out);
        let replies: Vec<Reply> =
            String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert!(!replies[0].ok && replies[0].error.as_deref().unwrap().contains("not UTF-8"), "{replies:?}");
        assert!(replies.iter().all(|r| !r.ok));
    }

    /// `live` reads the cell's peaks so far and leaves its slots open: a temporary freed after
    /// one `live` still counts in the next one and in `post`; no owners are computed.
    #[test]
    fn live_reads_leave_the_cells_slots_open() {
        // Readings take the watched frameworks' ended stamps: not beside the tests that count them.
        let _one = crate::sync::lock(&crate::notebook::watched::ONE_AT_A_TIME);
        let alloc = crate::notebook::session::current().unwrap();
        let mut s = Session::default();
        assert!(s.handle(1, &Op::Pre { cell: 1 }).ok);
        let peak = |r: &Reply| {
            assert!(r.ok, "{r:?}");
            r.devices.as_ref().unwrap().iter().find(|d| d.device == alloc.device()).unwrap().peak_allocated
        };
        let temp = alloc.malloc(8 << 20, crate::device::StreamId::DEFAULT).unwrap();
        let live = s.handle(2, &Op::Live);
        assert!(peak(&live) >= 8 << 20);
        assert!(live.tracked.iter().flatten().all(|p| p.top.is_empty()), "{live:?}");
        alloc.free(temp.block.unwrap()).unwrap();
        assert!(peak(&s.handle(3, &Op::Live)) >= 8 << 20, "the slot is still open");
        assert!(peak(&s.handle(4, &Op::Post { cell: 1 })) >= 8 << 20);
        assert!(s.slots.is_empty() && s.tracked.is_none(), "post closes the slots");
    }

    #[test]
    fn an_overlong_line_ends_the_conversation_with_a_reason() {
        // Readings take the watched frameworks' ended stamps: not beside the tests that count them.
        let _one = crate::sync::lock(&crate::notebook::watched::ONE_AT_A_TIME);
        let mut input = vec![b'x'; protocol::MAX_LINE + 10];
        input.extend_from_slice(b"\n{\"id\":1,\"op\":\"read\"}\n");
        let mut out = Vec::new();
        serve(&input[..], &mut out);
        let replies: Vec<Reply> =
            String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(replies.len(), 1);
        assert!(replies[0].error.as_deref().unwrap().contains("longer than"));
    }
}
