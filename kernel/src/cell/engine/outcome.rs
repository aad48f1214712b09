//! What a cell ended with, after its code ran and its readings after were taken: the result or
//! the error Jupyter is shown (a panic, an `Err` the code returned, out of memory, a lost CUDA
//! context, a stopped child), the cell's status, its record, and the record kept in the history.

use super::{Engine, errors, is_unit, mime_map, panic};
use crate::cell::hooks::{self, After, Before};
use crate::output::{ErrorInfo, Output};
use gpumem_nb::device::LostContext;
use gpumem_nb::kernel::protocol::OomEvent;
use gpumem_nb::kernel::report::{CellRecord, CellStatus, CrateReading};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

/// How a cell's code ended, as evcxr and the child told it.
pub(super) struct Ending {
    /// The error Jupyter was shown, if any.
    pub(super) error: Option<ErrorInfo>,
    /// The code panicked.
    pub(super) panicked: bool,
    /// The child ended during the cell (its last words).
    pub(super) terminated: Option<String>,
    /// The cell was interrupted.
    pub(super) interrupted: bool,
    /// The device's CUDA context was lost in this cell.
    pub(super) lost_here: Option<LostContext>,
    /// An out-of-memory a framework refused on its own, without asking the driver (cubecl's
    /// device thread, seen in its panic), for the record.
    pub(super) refused: Option<OomEvent>,
}

impl Ending {
    /// The record's status: the worst of what happened.
    fn status(&self) -> CellStatus {
        let ename = self.error.as_ref().map(|e| e.ename.as_str());
        if ename.is_some_and(|n| gpumem_nb::device::Fault::from_code(n).is_some()) {
            CellStatus::Lost
        } else if ename == Some("OutOfMemoryError") {
            // Also where a thread panicked of it (cubecl's device thread).
            CellStatus::Oom
        } else if self.panicked {
            CellStatus::Panicked
        } else if ename.is_some() {
            CellStatus::Error
        } else {
            CellStatus::Ok
        }
    }
}

impl Engine {
    /// Shows the cell's result, or its error, and says how it ended.
    pub(super) fn show_result(
        &mut self,
        count: u64,
        run_code: &str,
        result: Result<evcxr::EvalOutputs, evcxr::Error>,
        (before, last_held): (&Before, Option<u64>),
        after: &After,
    ) -> Ending {
        let interrupted = self.interrupted.swap(false, Ordering::SeqCst);
        let panicked = self.pump.panics().pop();
        // Panics on other threads of the notebook's process while the cell ran.
        let threads = self.pump.thread_panics();
        // A panic's or a returned error's places in evcxr's generated code, as cell lines: the
        // generated `lib.rs` is still the failing cell's (read only when there is a backtrace
        // to place).
        let placed = panicked.is_some() || !threads.is_empty() || self.pump.returned_error().is_some();
        let lines = placed.then_some(()).and_then(|_| {
            let lib = std::env::var_os("EVCXR_TMPDIR").map(|d| PathBuf::from(d).join("src").join("lib.rs"))?;
            let text = std::fs::read_to_string(lib).ok()?;
            let codes: Vec<(u64, &str)> = self.hooks.codes().iter().map(|(c, s)| (*c, s.as_str())).collect();
            Some(gpumem_nb::kernel::cells::LineMap::build(&text, &codes))
        });
        let locate = |line: u32| -> Option<(u64, u32)> { lines.as_ref()?.lookup(line) };
        // The device's CUDA context lost in this cell (a kernel faulted): the cell's error,
        // whatever its code made of the failing call.
        let lost_here = after
            .crate_readings
            .as_ref()
            .and_then(|v| v.iter().find_map(|d| d.lost.clone()))
            .filter(|_| self.lost.is_none());
        let mut terminated = None;
        let mut error = match result {
            Ok(out) => match &panicked {
                Some(p) => {
                    let mut info = panic::error_info(p, count, &locate);
                    // The code panicked on a failing call of the lost context: the loss is the
                    // cell's error, the panic its detail.
                    if let Some(l) = &lost_here {
                        let mut lost = errors::context_lost(l, count);
                        lost.traceback.append(&mut info.traceback);
                        info = lost;
                    }
                    Some(info)
                }
                None => self.show_value(count, out, (before, after), lost_here.as_ref(), (&locate, &threads)),
            },
            Err(e) => {
                if let evcxr::Error::SubprocessTerminated(msg) = &e {
                    terminated = Some(msg.lines().last().unwrap_or("").to_string());
                }
                // What the process held when it was stopped: the live line's last reading, else
                // the cell's start (it ended before the live line's first reading).
                let held = last_held.or_else(|| held(before));
                let mut info = errors::error_info(&e, run_code, interrupted, held);
                if let (evcxr::Error::CompilationErrors(errs), Some(gone)) = (&e, &self.gone) {
                    info.traceback.extend(gone.notes(errs.iter().map(|e| e.message())));
                }
                // A panic that ended the child (it was not caught): its text first.
                if let Some(p) = &panicked {
                    let mut tb = panic::error_info(p, count, &locate).traceback;
                    tb.append(&mut info.traceback);
                    info.traceback = tb;
                }
                Some(info)
            }
        };
        // Other threads' panics while the cell ran: the cell's error when it has none, else
        // told after it (a thread's panic is often why the cell's own code failed).
        for p in &threads {
            let info = panic::thread_error_info(p, count, &locate);
            match error.as_mut() {
                None => {
                    let mut info = info;
                    info.traceback.push(
                        "The cell's own code went on after this panic (its variables are kept), but what it \
                         computed may be wrong."
                            .into(),
                    );
                    error = Some(info);
                }
                Some(e) => {
                    e.traceback.push(String::new());
                    e.traceback.extend(info.traceback);
                }
            }
        }
        // A later cell that failed after a thread of the process panicked (a framework's device
        // thread: it may not come back): its error says so, and the way out.
        if let (Some(info), Some((cell, thread, message))) = (error.as_mut(), &self.died) {
            info.traceback.push(format!(
                "Thread '{thread}' of this notebook's process panicked in cell {cell} ({message}): where this \
                 cell's error is its framework's device side failing since, `%gpumem restart` starts a fresh \
                 notebook process (variables are lost, the history is kept)."
            ));
        }
        if let Some(p) = threads.iter().find(|p| !p.thread.starts_with("gpumem-")).filter(|_| self.died.is_none()) {
            let first = p.message.iter().find(|l| !l.trim().is_empty()).map_or("", |l| l.trim());
            let first = if first.chars().count() > 160 {
                format!("{}…", first.chars().take(159).collect::<String>())
            } else {
                first.to_string()
            };
            self.died = Some((count, p.thread.clone(), first));
        }
        // A cell after the loss that failed: its error (the named one a device call returned,
        // or what the code made of it) says why every device call fails, and the way out.
        if let (Some(info), Some((cell, lost))) = (error.as_mut(), &self.lost) {
            info.traceback.push(errors::after_loss_note(lost, *cell));
        }
        // Out of memory in the cell (a framework's, seen where the driver refused it, or
        // gpumem-nb's allocator's): a failed cell's error says so as PyTorch does, with who asked
        // and what holds the device, the framework's own words after it.
        let refused = after.oom.is_none().then(|| threads.iter().find_map(|p| refused_by(p, count, after))).flatten();
        if let (Some(info), Some(oom)) = (error.as_mut(), after.oom.as_ref().or(refused.as_ref())) {
            name_oom(info, oom, after);
        }
        if let Some(info) = &error {
            self.sink.emit(Output::Error(info.clone()));
        }
        Ending {
            error,
            panicked: panicked.is_some() || !threads.is_empty(),
            terminated,
            interrupted,
            lost_here,
            refused,
        }
    }

    /// A cell that ran to its end without a panic of its own: its value shown, and its error when
    /// it returned an `Err` (through `?` or as its value), ran out of memory or lost the context.
    /// `threads`: other threads' panics while it ran (the caller makes them its error).
    fn show_value(
        &self,
        count: u64,
        out: evcxr::EvalOutputs,
        (before, after): (&Before, &After),
        lost_here: Option<&LostContext>,
        (locate, threads): (panic::Locate<'_>, &[panic::PanicText]),
    ) -> Option<ErrorInfo> {
        let data = mime_map(out.content_by_mime_type);
        let returned = self.pump.returned_error().map(|text| {
            let ooms =
                |r: &Option<Vec<CrateReading>>| r.as_ref().map_or(0, |r| r.iter().map(|d| d.num_ooms).sum::<u64>());
            let oom = after.oom.is_some() || ooms(&after.crate_readings) > ooms(&before.crate_readings);
            errors::returned_error(&text, oom, count, locate)
        });
        let value = errors::value_error(data.get("text/plain").and_then(Value::as_str));
        // After another thread's panic the value is not shown as the cell's result: it looks
        // right and may not be (a device thread that died leaves zeros behind: `0.0`, the
        // measured case). Its first line goes in a note before the cell's error, which names
        // the thread, for whoever wants it, rather than as `Out[n]`.
        if !data.is_empty() && !is_unit(&data) {
            match threads.first() {
                None => self.sink.emit(Output::ExecuteResult { count, data }),
                Some(p) => {
                    let text = data.get("text/plain").and_then(Value::as_str).unwrap_or("(no text form)");
                    let first = text.lines().next().unwrap_or("");
                    let first = if first.chars().count() > 200 {
                        format!("{}…", first.chars().take(199).collect::<String>())
                    } else {
                        first.to_string()
                    };
                    self.show_notice(&format!(
                        "The cell's value is not shown as its result: thread '{}' panicked while the cell ran, so \
                         it may be wrong. It was: {first}",
                        p.thread
                    ));
                }
            }
        }
        // The cell's variables kept for this cell only (one that borrows another, a type that
        // cannot be named), one line each: the cell ran, its other variables are kept.
        if returned.is_none() {
            for variable in &out.cell_only {
                self.show_notice(&variable.line);
            }
        }
        lost_here.map(|l| errors::context_lost(l, count)).or(returned).or(value)
    }

    /// The cell's record: its readings, status and code, and why its child was replaced.
    pub(super) fn record(
        &mut self,
        count: u64,
        run: &RanCode<'_>,
        before: &Before,
        after: &After,
        end: &Ending,
    ) -> CellRecord {
        let mut rec = hooks::record(count, before, after);
        rec.status = end.status();
        rec.first_line = run.shown.to_string();
        rec.source_hash = errors::source_hash(run.code);
        rec.wall_ms = run.started.elapsed().as_secs_f64() * 1000.0;
        rec.crate_declared = self.own_declared;
        if rec.oom.is_none() {
            rec.oom = end.refused.clone();
        }
        // An allocation the driver refused in a cell that ended well: its code recovered (a
        // framework that gave back its cache and asked again): a warning, not the cell's
        // out-of-memory.
        if end.error.is_none()
            && let Some(o) = rec.oom.take_if(|o| o.api.is_some())
        {
            rec.warnings.push(format!(
                "out of memory, recovered: {} refused {} to {}; the code went on",
                o.api.as_deref().unwrap_or("the driver"),
                gpumem_nb::units::format_size(o.requested),
                o.owner.as_deref().unwrap_or("unknown")
            ));
        }
        if let Some(why) = self.restarted_by_magic.take() {
            // `%gpumem restart` replaced the child before the cell's readings began.
            rec.restarted = true;
            rec.restart_reason = Some(why);
        } else if rec.restarted {
            rec.restart_reason = Some(if end.interrupted {
                "interrupted".into()
            } else if let Some(t) = &end.terminated {
                format!("crashed: {}", t.trim())
            } else if run.restarted || run.code.lines().any(|l| l.trim() == ":clear") {
                "restart requested".into()
            } else {
                "child process replaced".into()
            });
        }
        rec
    }

    /// The record kept: warnings that need earlier cells, counted for the metrics endpoint, in
    /// the history; a long session keeps its last cells and summarises the rest
    /// (`crate::session::retention`).
    pub(super) fn keep(&mut self, rec: &mut CellRecord, end: &Ending) {
        if rec.restarted {
            // A new process: the threads that died were the old one's.
            self.died = None;
        }
        if let Some(l) = &end.lost_here {
            self.lost = Some((rec.cell, l.clone()));
        }
        self.history.warn(rec);
        self.metrics.observe(rec);
        self.history.cells.push(rec.clone());
        let keep = crate::session::retention::keep();
        crate::session::retention::trim(&mut self.history.cells, &mut self.history.dropped, keep);
        crate::session::retention::trim_map(&mut self.cell_ends, keep);
        self.hooks.trim_codes(keep.max(crate::session::retention::CODE_CELLS));
    }
}

/// The variables lost when a cell's process was replaced.
pub(super) struct Gone {
    names: Vec<String>,
    cell: u64,
    why: String,
}

impl Gone {
    /// A note for each lost name the messages name (`` `alloc` ``): rustc's error stays whole
    /// above it.
    fn notes(&self, messages: impl Iterator<Item = String>) -> Vec<String> {
        let text: Vec<String> = messages.collect();
        self.names
            .iter()
            .filter(|n| text.iter().any(|m| m.contains(&format!("`{n}`"))))
            .map(|n| {
                format!(
                    "   = note: `{n}` was lost with the notebook's process in cell [{}] ({}): variables do not \
                     survive a new process; run the cell that made it again",
                    self.cell, self.why
                )
            })
            .collect()
    }
}

impl Engine {
    /// Keeps the names a replaced process took with it (`names`: the variables before the cell),
    /// and forgets those defined again.
    pub(super) fn note_gone(&mut self, rec: &CellRecord, names: Vec<String>) {
        if rec.restarted {
            let why = rec.restart_reason.clone().unwrap_or_else(|| "process replaced".into());
            self.gone = Some(Gone { names, cell: rec.cell, why });
        } else if let Some(g) = &mut self.gone {
            let now: std::collections::HashSet<&str> = self.ctx.variables_and_types().map(|(n, _)| n).collect();
            g.names.retain(|n| !now.contains(n.as_str()));
        }
    }
}

/// The code a cell ran, as the record tells it.
pub(super) struct RanCode<'a> {
    /// What evcxr got.
    pub(super) code: &'a str,
    /// Its first line as the history shows it.
    pub(super) shown: &'a str,
    /// When the cell began (the user's wait: hooks, build, code).
    pub(super) started: std::time::Instant,
    /// A `:restart` line restarted the child.
    pub(super) restarted: bool,
}

/// An allocation a framework refused on its own device thread, from the thread's panic: cubecl
/// (burn's) checks a buffer against what its memory can hold and panics with `can't allocate
/// buffer of size: N` without asking the driver, so no refusal of the driver's names it. What
/// holds the device is the cell's reading after it.
fn refused_by(p: &panic::PanicText, cell: u64, after: &After) -> Option<OomEvent> {
    const SAID: &str = "can't allocate buffer of size: ";
    let text = p.message.join("\n");
    let at = text.find(SAID)? + SAID.len();
    let requested: u64 = text[at..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().ok()?;
    let owner = if p.location.contains("cubecl") || p.location.contains("burn") { "burn/cubecl" } else { "unknown" };
    let place =
        after.tracked.as_ref().and_then(|t| t.places.iter().find(|p| p.device.is_some())).cloned().unwrap_or_default();
    // The site reads `cubecl ← cell N`: the framework's thread did what the cell queued.
    let site = gpumem_nb::kernel::protocol::OwnerBytes {
        owner: if owner == "burn/cubecl" { "cubecl".into() } else { p.thread.clone() },
        bytes: requested,
        function: Some(p.location.clone()),
        cell: Some(cell),
        queued: true,
        ..Default::default()
    };
    // The device's size and free memory now (NVML; the refusal asked the driver nothing).
    let nvml = after.nvml.device_of(after.pid, place.uuid.as_deref());
    Some(OomEvent {
        device: place.device.unwrap_or(0),
        count: 1,
        requested,
        device_free: nvml.map_or(0, |d| d.free),
        device_total: nvml.map_or(0, |d| d.total),
        why: format!("{owner} refused {requested} bytes on its device thread '{}' ({})", p.thread, p.location),
        api: Some(format!("its own allocator, on thread '{}'", p.thread)),
        owner: Some(owner.into()),
        site: Some(site),
        top: place.top,
        by_component: place.by_component,
        by_owner: place.by_owner,
        ..Default::default()
    })
}

/// A failed cell's error when the cell ran out of memory: `OutOfMemoryError`, its value
/// PyTorch's first sentence (`CUDA out of memory. Tried to allocate 96.00 GiB. GPU 0 has a total
/// capacity of …`), then who asked and what holds the device (`oom_message`), then the error as
/// the cell's code or the framework said it, kept whole.
fn name_oom(info: &mut ErrorInfo, oom: &gpumem_nb::kernel::protocol::OomEvent, after: &After) {
    // gpumem-nb's allocator's own error already says it in PyTorch's words, with its blocks.
    if oom.api.is_none() && info.ename == "OutOfMemoryError" {
        return;
    }
    let uuid = after
        .tracked
        .as_ref()
        .and_then(|t| t.places.iter().find(|p| p.device == Some(oom.device)))
        .and_then(|p| p.uuid.as_deref());
    let nvml = after.nvml.device_of(after.pid, uuid).zip(after.pid);
    let simulated = after.tracked.as_ref().is_some_and(|t| t.status == "simulated");
    let message = gpumem_nb::kernel::report::oom_message(oom, nvml, simulated);
    let own: Vec<String> = std::mem::take(&mut info.traceback);
    let said = format!("{}: {}", info.ename, info.evalue);
    info.ename = "OutOfMemoryError".into();
    info.evalue = message[0].clone();
    info.traceback = vec![format!("\x1b[1;31mOutOfMemoryError\x1b[0m: {}", message[0])];
    info.traceback.extend(message[1..].iter().cloned());
    info.traceback.push(String::new());
    info.traceback.push(format!("What the code was told: {said}"));
    info.traceback.extend(own.into_iter().skip(1));
}

/// What the stopped process held on its devices at the cell's start (NVML's process memory,
/// else every tracked allocation, else the allocator's reserved bytes): released with it.
fn held(before: &Before) -> Option<u64> {
    before
        .pid
        .map(|p| before.nvml.devices.iter().filter_map(|d| d.process_used(p)).sum::<u64>())
        .filter(|&b| b > 0)
        .or_else(|| before.tracked.as_ref().map(|t| t.places.iter().map(|p| p.live).sum::<u64>()))
        .or_else(|| before.crate_readings.as_ref().map(|r| r.iter().map(|d| d.reserved).sum::<u64>()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_nb::kernel::protocol::{OwnerReading, PlaceReading};
    use gpumem_nb::kernel::report::TrackedReadings;

    /// cubecl 0.10's device thread refusing a 32 GiB buffer on an H100 (the panic as issue 54
    /// measured it): an out-of-memory of burn/cubecl's, what holds the device from the cell's
    /// reading; any other panic is none.
    #[test]
    fn a_framework_s_own_refusal_is_an_out_of_memory() {
        let panic = panic::PanicText {
            thread: "DSD-0-0".into(),
            location: "/opt/gpumem/vendor/cubecl-cuda-0.10.0/src/compute/server.rs:124:46".into(),
            message: vec![
                "called `Result::unwrap()` on an `Err` value: can't allocate buffer of size: 34359738368".into(),
            ],
            backtrace: Vec::new(),
        };
        let after = After {
            pid: Some(7),
            nvml: Default::default(),
            crate_readings: None,
            tracked: Some(TrackedReadings {
                status: "cupti".into(),
                places: vec![PlaceReading {
                    device: Some(0),
                    live: 20 << 20,
                    by_owner: vec![OwnerReading { owner: "burn/cubecl".into(), live: 20 << 20, rise: None }],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            frameworks: None,
            variables: None,
            unsettled: Vec::new(),
            oom: None,
            us: 0,
        };
        let e = refused_by(&panic, 3, &after).expect("an out-of-memory");
        assert_eq!((e.requested, e.device, e.owner.as_deref()), (32 << 30, 0, Some("burn/cubecl")));
        assert_eq!(e.site.as_ref().and_then(|s| s.cell), Some(3));
        assert_eq!(e.by_owner[0].live, 20 << 20);
        let other = panic::PanicText { message: vec!["index out of bounds".into()], ..panic };
        assert!(refused_by(&other, 3, &after).is_none());
    }
}
