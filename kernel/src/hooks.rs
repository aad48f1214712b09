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

use crate::control::ControlServer;
use crate::nvml::{self, NvmlSnapshot};
use crate::report::{CellRecord, CrateReading, Readings, TrackedReadings, build_record};
use gpumem_nb::notebook::protocol::Op;
use std::time::{Duration, Instant};

/// Timeout of the per-cell control requests.
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(3);

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
    /// Time the hooks took, microseconds.
    pub us: u64,
}

/// The kernel's end of the hooks: the control channel and what a connecting child is told.
pub struct Hooks {
    /// The control channel to the crate in the child.
    pub control: ControlServer,
    on_connect: Option<Op>,
}

impl Hooks {
    /// Hooks over `control`.
    pub fn new(control: ControlServer) -> Hooks {
        Hooks { control, on_connect: None }
    }

    /// The `record` request sent to every child as it connects (`None`: nothing is sent).
    pub fn set_record_on_connect(&mut self, request: Option<Op>) {
        self.on_connect = request;
    }

    /// Accepts a (re)connecting child `pid` and sends it the recording setting. True when one
    /// connected now.
    pub fn poll(&mut self, pid: Option<u32>) -> bool {
        let r = self.control.poll(pid);
        for why in &r.refused {
            eprintln!("gpumem-kernel: control channel: {why}");
        }
        if r.connected.is_some()
            && let Some(req) = &self.on_connect
        {
            let _ = self.control.request(req.clone(), HOOK_TIMEOUT);
        }
        r.connected.is_some()
    }

    /// Runs the pre-cell hooks for cell `cell` of child `pid`.
    pub fn before(&mut self, cell: u64, pid: Option<u32>) -> Before {
        let (nvml, crate_readings, tracked, us) = self.read(Op::Pre { cell }, pid);
        let slot_opened = crate_readings.is_some();
        Before { pid, nvml, crate_readings, tracked, slot_opened, us }
    }

    /// Runs the post-cell hooks for cell `cell`; `pid` is the child's pid now.
    pub fn after(&mut self, cell: u64, pid: Option<u32>) -> After {
        let (nvml, crate_readings, tracked, us) = self.read(Op::Post { cell }, pid);
        After { pid, nvml, crate_readings, tracked, us }
    }

    /// One side of the hooks: accept a (re)connecting child, read NVML, ask the crate for `op`
    /// (`pre` or `post`); with the time it took, in microseconds.
    fn read(
        &mut self,
        op: Op,
        pid: Option<u32>,
    ) -> (NvmlSnapshot, Option<Vec<CrateReading>>, Option<TrackedReadings>, u64) {
        let t = Instant::now();
        self.poll(pid);
        let nvml = nvml::read();
        let (mut crate_readings, mut tracked) = (None, None);
        if self.control.connected().is_some() {
            let name = op.name();
            match self.control.request(op, HOOK_TIMEOUT) {
                Ok(reply) => {
                    let (devices, t) = TrackedReadings::of_reply(reply);
                    (crate_readings, tracked) = (Some(devices), t);
                }
                Err(e) => eprintln!("gpumem-kernel: {name}-cell reading failed: {e}"),
            }
        }
        (nvml, crate_readings, tracked, t.elapsed().as_micros() as u64)
    }
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
    rec.hook_us = before.us + after.us;
    rec
}
