//! A program's own steps measured as cells are: the record a notebook cell gets
//! ([`CellRecord`], `application/vnd.gpumem.cell+json`) around each step a program marks with
//! [`Steps::begin`] and [`Steps::end`], counted for the metrics endpoint
//! (`gpumem_nb::metrics::serve`, feature `metrics`) as a cell's record is. A training binary
//! that outgrew the notebook serves the same numbers, step by step, on every rank.
//!
//! ```
//! # fn main() -> gpumem_nb::Result<()> {
//! use gpumem_nb::{DeviceBuffer, StreamId};
//! let alloc = gpumem_nb::current()?;
//! let mut steps = gpumem_nb::steps::Steps::new();
//! for step in 1..=3 {
//!     steps.begin(step);
//!     let _activations = DeviceBuffer::<f32>::zeros(&alloc, 1 << 20, StreamId::DEFAULT)?;
//!     let rec = steps.end().expect("the step's record");
//!     assert_eq!(rec.cell, step);
//!     assert!(rec.allocator.unwrap().peak_allocated >= 4 << 20);
//! }
//! # Ok(()) }
//! ```
//!
//! A step's record is a cell's: `cell` is the step's number, the allocations made during it
//! carry the label `cell N` in snapshots, its peaks are the step's own (`begin` opens a peak
//! slot on every open device and one over every tracked allocation; nothing else's peaks are
//! reset), and what memory is after it, by component, is there when the program stamps
//! components ([`crate::components`]). Open the devices before the first `begin`: a device
//! opened during a step is in its record from then on. Each `begin`/`end` pair costs what a
//! cell's report costs (every device and watched framework settled, NVML read twice, the owners
//! of live memory named): measure every step of a short job, every Nth of a long one.
#![forbid(unsafe_code)]

use super::control::Session;
use super::protocol::{FrameworkReading, Op};
use super::report::{CellRecord, CellStatus, CrateReading, Readings, TrackedReadings, build_record, framework_parts};
use crate::device::nvml::{self, NvmlSnapshot};
use std::time::Instant;

/// Records steps one after another: at most one is open. The stock evcxr kernel's hooks build
/// each cell's record with one too (`notebook::stock`).
#[derive(Default)]
pub struct Steps {
    session: Session,
    open: Option<Open>,
}

/// What `begin` read.
struct Open {
    step: u64,
    devices: Vec<CrateReading>,
    tracked: Option<TrackedReadings>,
    frameworks: Option<Vec<FrameworkReading>>,
    nvml: NvmlSnapshot,
    reading_us: u64,
    started: Instant,
}

impl std::fmt::Debug for Steps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steps").field("open", &self.open.as_ref().map(|o| o.step)).finish()
    }
}

impl Steps {
    /// No step open yet.
    pub fn new() -> Steps {
        Steps::default()
    }

    /// Opens step `step`: reads every open device, the tracked allocations and NVML, and opens
    /// the step's peak slots. A step still open is closed without a record. When the reading
    /// fails the step has no record ([`Steps::end`] says `None`).
    pub fn begin(&mut self, step: u64) {
        self.open = None;
        let t = Instant::now();
        // The crate settles and reads first, NVML last: what earlier steps queued is the
        // driver's by then.
        let mut reply = self.session.handle(step, &Op::Pre { cell: step });
        let nvml = nvml::snapshot();
        if reply.ok {
            let frameworks = reply.frameworks.take();
            let (devices, tracked) = TrackedReadings::of_reply(reply);
            let reading_us = t.elapsed().as_micros() as u64;
            self.open = Some(Open { step, devices, tracked, frameworks, nvml, reading_us, started: Instant::now() });
        }
    }

    /// The step open now, if any.
    pub fn open(&self) -> Option<u64> {
        self.open.as_ref().map(|o| o.step)
    }

    /// Closes the open step: reads again, closes its peak slots and builds its record
    /// (status `ok`, or `lost` when the device's context was lost), which the metrics endpoint
    /// serves from now on. `None` when no step is open or a reading failed.
    pub fn end(&mut self) -> Option<CellRecord> {
        self.close(false, true)
    }

    /// Closes the open step whatever happens, and builds its record when `report` is true;
    /// `panicked`: the step's code panicked (its status, unless the context was lost).
    pub(crate) fn close(&mut self, panicked: bool, report: bool) -> Option<CellRecord> {
        let o = self.open.take()?;
        let wall = o.started.elapsed();
        let t = Instant::now();
        // Closes the step's slots and label whether or not it is reported.
        let mut reply = self.session.handle(o.step, &Op::Post { cell: o.step });
        if !reply.ok || !report {
            return None;
        }
        let frameworks = reply.frameworks.take();
        let oom = reply.oom.take();
        let unsettled = reply.unsettled.take().unwrap_or_default();
        let (devices, tracked) = TrackedReadings::of_reply(reply);
        let nvml = nvml::snapshot();
        let pid = Some(std::process::id());
        let mut rec = build_record(
            o.step,
            &Readings {
                crate_before: Some(&o.devices),
                crate_after: Some(&devices),
                tracked_before: o.tracked.as_ref(),
                tracked_after: tracked.as_ref(),
                slot_opened: true,
                nvml_before: &o.nvml,
                nvml_after: &nvml,
                pid_before: pid,
                pid_after: pid,
            },
        );
        rec.frameworks = framework_parts(o.frameworks.as_deref(), frameworks.as_deref());
        rec.status = if rec.lost.is_some() {
            CellStatus::Lost
        } else if panicked {
            CellStatus::Panicked
        } else {
            CellStatus::Ok
        };
        rec.oom = oom;
        rec.unsettled = unsettled;
        rec.wall_ms = wall.as_secs_f64() * 1e3;
        rec.hook_us = o.reading_us + t.elapsed().as_micros() as u64;
        super::metrics::exported().observe(&rec);
        Some(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::DeviceBuffer;
    use crate::device::StreamId;

    /// A step's record has its number and its own peak, and is what the endpoint shows next;
    /// `begin` replaces an open step; `close` without a report closes it quietly. (Exact numbers:
    /// `tests/steps.rs`, a process of its own; here other tests share the device.)
    #[test]
    fn a_step_is_recorded_and_served_as_the_latest() {
        // Readings take the watched frameworks' ended stamps: not beside the tests that count them.
        let _one = crate::sync::lock(&crate::notebook::watched::ONE_AT_A_TIME);
        let alloc = crate::notebook::session::current().unwrap();
        let mut steps = Steps::new();
        assert_eq!(steps.end(), None, "no step open");
        steps.begin(41);
        assert_eq!(steps.open(), Some(41));
        {
            let _temp = DeviceBuffer::<u8>::zeros(&alloc, 96 << 20, StreamId::DEFAULT).unwrap();
        }
        let rec = steps.end().unwrap();
        assert_eq!((rec.cell, rec.status, steps.open()), (41, CellStatus::Ok, None));
        let a = rec.allocator.as_ref().unwrap();
        assert!(a.peak_is_cell && a.peak_allocated >= 96 << 20, "{a:?}");
        assert_eq!(rec.child_pid, Some(std::process::id()));
        let served = super::super::metrics::exported().render(&Default::default());
        assert!(served.contains("gpumem_cell{host=\"\"} 41\n"), "{served}");
        steps.begin(50);
        steps.begin(51);
        assert_eq!(steps.end().unwrap().cell, 51);
        steps.begin(60);
        assert_eq!(steps.close(false, false), None);
        assert_eq!(steps.open(), None);
        steps.begin(61);
        assert_eq!(steps.close(true, true).unwrap().status, CellStatus::Panicked);
    }
}
