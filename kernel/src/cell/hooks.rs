//! The per-cell hooks, apart from how a cell runs.
//!
//! Before a cell: accept a (re)connecting child on the control channel, read NVML, and ask the
//! crate in the child for `pre` (which opens a fresh peak slot per device, labels allocations
//! "cell N" and restarts the CUDA pool's high-water marks). After it: the same with `post`.
//! [`record`] turns the two readings into the cell's [`CellRecord`].
//!
//! The engine runs these around evcxr's evaluation; `tests/hook_path.rs` runs the same calls
//! around a compiled program playing the notebook child, which is how the path is checked on a
//! GPU machine where evcxr cannot compile cells.

use crate::session::control::ControlServer;
use gpumem_nb::device::nvml::{self, NvmlSnapshot};
use gpumem_nb::kernel::protocol::{FrameworkReading, OomEvent, Op, Reply, VariablesReading};
use gpumem_nb::kernel::report::{
    CellRecord, CrateReading, Readings, TrackedReadings, build_record, framework_parts, variables_part,
};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Timeout of the per-cell control requests: their reading, after the crate's settle step
/// (at most a second: the devices and watched frameworks run what was queued first).
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(4);

/// What the hooks read before a cell.
pub struct Before {
    /// The child's pid then.
    pub pid: Option<u32>,
    /// NVML then.
    pub nvml: NvmlSnapshot,
    /// The crate's readings (`pre`), when the crate was connected.
    pub crate_readings: Option<Vec<CrateReading>>,
    /// Every allocation of the child (tracking), when the crate was connected.
    pub tracked: Option<TrackedReadings>,
    /// The watched frameworks' own numbers (cubecl's pools), when one is watched.
    pub frameworks: Option<Vec<FrameworkReading>>,
    /// What the variables held by a framework's types at the last probed cell's end.
    pub variables: Option<VariablesReading>,
    /// Whether `pre` opened a peak slot, so that the peaks cover exactly the cell.
    pub slot_opened: bool,
    /// Time the hooks took, microseconds.
    pub us: u64,
}

/// What the hooks read after a cell.
pub struct After {
    /// The child's pid now (another one after a crash or restart).
    pub pid: Option<u32>,
    /// NVML now.
    pub nvml: NvmlSnapshot,
    /// The crate's readings (`post`), when the crate is connected.
    pub crate_readings: Option<Vec<CrateReading>>,
    /// Every allocation of the child (tracking), when the crate is connected.
    pub tracked: Option<TrackedReadings>,
    /// The watched frameworks' own numbers (cubecl's pools), when one is watched.
    pub frameworks: Option<Vec<FrameworkReading>>,
    /// What the variables hold by a framework's types, when the session library probes them.
    pub variables: Option<VariablesReading>,
    /// The cell's first out-of-memory failure, when `%gpumem snapshot --on-oom` watches.
    /// What did not settle before the reading (read as it stood).
    pub unsettled: Vec<gpumem_nb::kernel::protocol::Settled>,
    pub oom: Option<OomEvent>,
    /// Time the hooks took, microseconds.
    pub us: u64,
}

/// The control channel, shared: the engine's thread uses it around cells and for magics, the
/// live line's sampler while a cell runs, the Jupyter control task for `usage_request`. Each
/// request holds the lock for its round trip, so requests never interleave on the socket.
pub type SharedControl = Arc<Mutex<ControlServer>>;

/// Locks the control channel (a panic while it was held leaves nothing half-written that the
/// next request trips over: a stale reply is skipped by its id).
pub fn lock(control: &SharedControl) -> MutexGuard<'_, ControlServer> {
    control.lock().unwrap_or_else(|e| e.into_inner())
}

/// Microseconds since the Unix epoch: the clock of the crate's recorded history.
pub fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// The kernel's end of the hooks: the control channel and what a connecting child is told.
pub struct Hooks {
    control: SharedControl,
    on_connect: Option<Op>,
    oom_on_connect: Option<Op>,
    /// The child recording history, and since when (µs since the epoch).
    recording: Option<(u32, i64)>,
    /// Every cell's code so far, as the user sees it: sent to each child as it connects (and
    /// each new cell's before it runs), so that sites get their cell lines.
    codes: std::collections::BTreeMap<u64, String>,
}

impl Hooks {
    /// Hooks over `control`.
    pub fn new(control: ControlServer) -> Hooks {
        Hooks {
            control: Arc::new(Mutex::new(control)),
            on_connect: None,
            oom_on_connect: None,
            recording: None,
            codes: Default::default(),
        }
    }

    /// The control channel to the crate in the child, locked. Keep the guard for one request:
    /// bind a reply before acting on it, so that nothing locks the channel again meanwhile.
    pub fn control(&self) -> MutexGuard<'_, ControlServer> {
        lock(&self.control)
    }

    /// The control channel, for another thread.
    pub fn shared_control(&self) -> SharedControl {
        self.control.clone()
    }

    /// The `record` request sent to every child as it connects (`None`: nothing is sent); only
    /// one that turns recording on.
    pub fn set_record_on_connect(&mut self, request: Option<Op>) {
        self.on_connect = request;
        self.write_on_connect();
    }

    /// The `on_oom` request sent to every child as it connects (`None`: nothing is sent).
    pub fn set_oom_on_connect(&mut self, request: Option<Op>) {
        self.oom_on_connect = request;
        self.write_on_connect();
    }

    /// Keeps both requests in the file beside the socket that the crate reads as it connects
    /// (`protocol::on_connect_path`): a child that first uses its device in the middle of a
    /// cell applies them at once, before the kernel accepts its connection after the cell.
    fn write_on_connect(&self) {
        let path = gpumem_nb::kernel::protocol::on_connect_path(lock(&self.control).socket_path());
        let lines: String = [&self.on_connect, &self.oom_on_connect]
            .into_iter()
            .flatten()
            .filter_map(|op| serde_json::to_string(op).ok())
            .map(|l| l + "\n")
            .collect();
        let written =
            if lines.is_empty() { std::fs::remove_file(&path).or(Ok(())) } else { std::fs::write(&path, lines) };
        if let Err(e) = written {
            eprintln!(
                "gpumem-kernel: {}: {e} (a child connecting mid-cell records from the next cell)",
                path.display()
            );
        }
    }

    /// Accepts a (re)connecting child `pid` and sends it the recording setting. True when one
    /// connected now.
    pub fn poll(&mut self, pid: Option<u32>) -> bool {
        let mut control = lock(&self.control);
        let r = control.poll(pid);
        for why in &r.refused {
            eprintln!("gpumem-kernel: control channel: {why}");
        }
        if let Some(pid) = r.connected
            && let Some(req) = &self.on_connect
            && control.request(req.clone(), HOOK_TIMEOUT).is_ok()
        {
            self.recording = Some((pid, now_us()));
        }
        if r.connected.is_some()
            && let Some(req) = &self.oom_on_connect
        {
            let _ = control.request(req.clone(), HOOK_TIMEOUT);
        }
        if r.connected.is_some() {
            send_codes(&mut control, &self.codes);
        }
        r.connected.is_some()
    }

    /// The code of the cells kept, by execution count.
    pub fn codes(&self) -> &std::collections::BTreeMap<u64, String> {
        &self.codes
    }

    /// Keeps the code of the newest `keep` cells only (what a reconnecting child is sent).
    pub fn trim_codes(&mut self, keep: usize) {
        crate::session::retention::trim_map(&mut self.codes, keep);
    }

    /// Notes a cell's code (before it runs) and sends it to the connected child.
    pub fn note_code(&mut self, cell: u64, code: &str) {
        if code.len() > MAX_CODE_BYTES {
            return;
        }
        self.codes.insert(cell, code.to_string());
        let mut control = lock(&self.control);
        if control.connected().is_some() {
            let _ = control.request(Op::CellCode { cell, code: code.to_string() }, HOOK_TIMEOUT);
        }
    }

    /// Notes a `record` request the connected child accepted: recording (`on`) since now, unless
    /// this child already was; or not recording.
    pub fn note_recording(&mut self, on: bool) {
        let pid = self.control().connected().map(|(pid, _)| pid);
        self.recording = match (on, pid, self.recording) {
            (true, Some(p), Some((q, since))) if p == q => Some((q, since)),
            (true, Some(p), _) => Some((p, now_us())),
            _ => None,
        };
    }

    /// The child recording history (its pid), and since when (µs since the epoch): what
    /// `%gpumem diff` of cells needs.
    pub fn recording_since(&self) -> Option<(u32, i64)> {
        self.recording
    }

    /// Runs the pre-cell hooks for cell `cell` of child `pid`.
    pub fn before(&mut self, cell: u64, pid: Option<u32>) -> Before {
        let (nvml, mut reply, us) = self.read(Op::Pre { cell }, pid);
        let frameworks = reply.as_mut().and_then(|r| r.frameworks.take());
        let variables = reply.as_mut().and_then(|r| r.variables.take());
        let (crate_readings, tracked) = readings(reply);
        let slot_opened = crate_readings.is_some();
        Before { pid, nvml, crate_readings, tracked, frameworks, variables, slot_opened, us }
    }

    /// Runs the post-cell hooks for cell `cell`; `pid` is the child's pid now.
    pub fn after(&mut self, cell: u64, pid: Option<u32>) -> After {
        let (nvml, mut reply, us) = self.read(Op::Post { cell }, pid);
        let oom = reply.as_mut().and_then(|r| r.oom.take());
        let frameworks = reply.as_mut().and_then(|r| r.frameworks.take());
        let variables = reply.as_mut().and_then(|r| r.variables.take());
        let unsettled = reply.as_mut().and_then(|r| r.unsettled.take()).unwrap_or_default();
        let (crate_readings, tracked) = readings(reply);
        After { pid, nvml, crate_readings, tracked, frameworks, variables, oom, unsettled, us }
    }

    /// One side of the hooks: accept a (re)connecting child, ask the crate for `op` (`pre` or
    /// `post`: it settles first, so what the cell queued has run), then read NVML, last, when
    /// the memory the cell queued is the driver's; with the time it took, in microseconds.
    fn read(&mut self, op: Op, pid: Option<u32>) -> (NvmlSnapshot, Option<Reply>, u64) {
        let t = Instant::now();
        self.poll(pid);
        let polled = t.elapsed();
        let mut reply = None;
        let name = op.name();
        {
            let mut control = self.control();
            if control.connected().is_some() {
                match control.request(op, HOOK_TIMEOUT) {
                    Ok(r) => reply = Some(r),
                    Err(e) => eprintln!("gpumem-kernel: {name}-cell reading failed: {e}"),
                }
            }
        }
        let requested = t.elapsed();
        let nvml = nvml::snapshot();
        let us = t.elapsed().as_micros() as u64;
        if gpumem_nb::kernel::control::times_wanted() {
            // Beside the notebook process's own split (the same variable): the kernel's side.
            eprintln!(
                "gpumem-kernel {name}: accepting the child {} µs, the request {} µs, NVML {} µs",
                polled.as_micros(),
                (requested - polled).as_micros(),
                us - requested.as_micros() as u64
            );
        }
        (nvml, reply, us)
    }
}

/// How many bytes of cell code one `cell_codes` request carries at most (a request line may
/// not pass [`gpumem_nb::kernel::protocol::MAX_LINE`]); a cell's code longer than this is
/// not sent at all (its sites are named without lines).
const MAX_CODE_BYTES: usize = 1 << 20;

/// Sends a connecting child the code of the cells so far: in requests of at most
/// [`MAX_CODE_BYTES`] each, one per cell to an older crate that does not know `cell_codes`
/// (whose sites simply have no lines when it knows neither).
fn send_codes(control: &mut ControlServer, codes: &std::collections::BTreeMap<u64, String>) {
    let mut batch: Vec<(u64, String)> = Vec::new();
    let mut bytes = 0;
    let mut batched = true;
    let mut send = |control: &mut ControlServer, batch: &mut Vec<(u64, String)>| {
        if batched && control.request(Op::CellCodes { codes: batch.clone() }, HOOK_TIMEOUT).is_err() {
            batched = false;
        }
        if !batched {
            for (cell, code) in batch.iter() {
                if control.connected().is_none() {
                    break;
                }
                let _ = control.request(Op::CellCode { cell: *cell, code: code.clone() }, HOOK_TIMEOUT);
            }
        }
        batch.clear();
    };
    for (cell, code) in codes {
        if bytes + code.len() > MAX_CODE_BYTES && !batch.is_empty() {
            send(control, &mut batch);
            bytes = 0;
        }
        bytes += code.len();
        batch.push((*cell, code.clone()));
    }
    if !batch.is_empty() {
        send(control, &mut batch);
    }
}

/// A `pre` or `post` reply's device readings and tracked places (`None`: no reply).
fn readings(reply: Option<Reply>) -> (Option<Vec<CrateReading>>, Option<TrackedReadings>) {
    let Some(reply) = reply else { return (None, None) };
    let (devices, tracked) = TrackedReadings::of_reply(reply);
    (Some(devices), tracked)
}

/// The record of cell `cell` from the hooks' two readings (without the warnings, which need
/// the session's history, and without what only the runner knows: status, code, wall time).
pub fn record(cell: u64, before: &Before, after: &After) -> CellRecord {
    // Readings from a child that is gone are not comparable with the new child's.
    let crate_before = if before.pid == after.pid { before.crate_readings.as_deref() } else { None };
    let mut rec = build_record(
        cell,
        &Readings {
            crate_before,
            crate_after: after.crate_readings.as_deref(),
            tracked_before: if before.pid == after.pid { before.tracked.as_ref() } else { None },
            tracked_after: after.tracked.as_ref(),
            slot_opened: before.slot_opened,
            nvml_before: &before.nvml,
            nvml_after: &after.nvml,
            pid_before: before.pid,
            pid_after: after.pid,
        },
    );
    rec.children = after.pid.map_or_else(Vec::new, |pid| gpumem_nb::kernel::children::of_tree(pid, &after.nvml));
    rec.hook_us = before.us + after.us;
    rec.oom = after.oom.clone();
    rec.unsettled = after.unsettled.clone();
    let frameworks_before = if before.pid == after.pid { before.frameworks.as_deref() } else { None };
    rec.frameworks = framework_parts(frameworks_before, after.frameworks.as_deref());
    let variables_before = if before.pid == after.pid { before.variables.as_ref() } else { None };
    rec.variables = variables_part(variables_before, after.variables.as_ref());
    // No reading names the device (a process replaced in the cell, a crate not loaded yet): the
    // device the cell had, or the one the notebook will use.
    if rec.device == "device n/a" {
        rec.device = match before.crate_readings.as_deref().and_then(|v| v.first()) {
            Some(a) => gpumem_nb::kernel::report::device_name(Some(a), None),
            None => gpumem_nb::kernel::device_before_use(&after.nvml),
        };
    }
    rec
}
