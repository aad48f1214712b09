//! Scoped measurement: zeta's `print_cuda_memory_usage` and `save_memory_snapshot`, done right.
//!
//! - [`MemoryScope`] (from [`measure`], [`MemoryScope::new`]) and [`measure_with`]: on exit —
//!   also when a panic unwinds through it — one line with the allocated and reserved deltas and
//!   the exact peaks *inside the scope*, in IEC units, naming the source:
//!
//!   ```text
//!   gpumem scope "forward": allocated +4.00 MiB (peak 12.00 MiB, +8.00 MiB over start), reserved +20.00 MiB (peak 20.00 MiB) [allocator, device 0, simulated] in 1.20 ms
//!   ```
//!
//!   The numbers are also data ([`ScopeReport`], bytes). Each scope holds its own peak slot
//!   ([`crate::PeakSlot`]), so nested scopes report their own exact peaks, never reset each
//!   other and never touch `max_memory_allocated()` (PyTorch issue 16266). zeta printed only the
//!   change of `memory_allocated()` in GB, with no peak and no reserved memory.
//! - [`save_memory_snapshot`] / [`SnapshotScope`]: history recording (every event, with stacks)
//!   on for the scope only — the previous settings are restored exactly, also on error and on
//!   panic — then `snapshot.pickle`, `snapshot.json` and `trace_plot.html` in a directory. zeta
//!   turned recording on and never off, and needed a `pathlib.Path`.
//!
//! Every `*_on` form takes an explicit allocator; the short forms use [`crate::current`].
//! Printing goes to stdout unless a sink is given ([`MemoryScope::with_sink`], [`Capture`]).
#![forbid(unsafe_code)]

use crate::allocator::Allocator;
use crate::allocator::PeakSlot;
use crate::device::BackendKind;
use crate::device::any::AnyBackend;
use crate::record::history::HistoryOptions;
use crate::render::SnapshotFiles;
use crate::render::{MimeBundle, Table};
use crate::stats::SlotPeaks;
use crate::units::{format_duration, iec, iec_delta};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where scope lines go.
type Sink = Box<dyn Write + Send>;

/// An in-memory sink to capture what scopes print (tests, or collecting lines in a notebook).
/// Clones share the same buffer.
#[derive(Clone, Debug, Default)]
pub struct Capture(Arc<Mutex<Vec<u8>>>);

impl Capture {
    /// An empty capture.
    pub fn new() -> Self {
        Self::default()
    }
    /// Everything written so far, as text.
    pub fn contents(&self) -> String {
        String::from_utf8_lossy(&crate::sync::lock(&self.0)).into_owned()
    }
}

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        crate::sync::lock(&self.0).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a scope measured, in bytes (allocator numbers: `memory_allocated()` /
/// `memory_reserved()` of one device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScopeReport {
    /// The scope's name.
    pub name: String,
    /// Device index.
    pub device: i32,
    /// The device's backend (a simulated device says so).
    pub backend: BackendKind,
    /// Allocated bytes when the scope opened.
    pub start_allocated: u64,
    /// Allocated bytes when it closed.
    pub end_allocated: u64,
    /// Highest allocated bytes while it was open (exact: a peak slot).
    pub peak_allocated: u64,
    /// Reserved bytes when the scope opened.
    pub start_reserved: u64,
    /// Reserved bytes when it closed.
    pub end_reserved: u64,
    /// Highest reserved bytes while it was open.
    pub peak_reserved: u64,
    /// `end_allocated − start_allocated`.
    pub allocated_delta: i64,
    /// `end_reserved − start_reserved`.
    pub reserved_delta: i64,
    /// Wall time the scope was open.
    pub wall_time: Duration,
    /// Whether the scope closed while a panic was unwinding through it.
    pub panicked: bool,
}

impl ScopeReport {
    /// How far the allocated peak rose above the starting level.
    pub fn peak_allocated_over_start(&self) -> u64 {
        self.peak_allocated.saturating_sub(self.start_allocated)
    }

    /// How far the reserved peak rose above the starting level.
    pub fn peak_reserved_over_start(&self) -> u64 {
        self.peak_reserved.saturating_sub(self.start_reserved)
    }

    /// "allocator, device 0, simulated": what the numbers cover.
    pub fn source(&self) -> String {
        format!("allocator, device {}, {}", self.device, self.backend.name())
    }

    /// The one line a scope prints (without a newline).
    pub fn line(&self) -> String {
        format!(
            "gpumem scope {:?}: allocated {} (peak {}, {} over start), reserved {} (peak {}) [{}] in {}{}",
            self.name,
            iec_delta(self.allocated_delta),
            iec(self.peak_allocated),
            iec_delta(self.peak_allocated_over_start() as i64),
            iec_delta(self.reserved_delta),
            iec(self.peak_reserved),
            self.source(),
            format_duration(self.wall_time),
            if self.panicked { " (panicked)" } else { "" }
        )
    }

    fn table(&self) -> Table {
        let mut t = Table::new(["", "start", "end", "change", "peak in scope"]).right_align([1, 2, 3, 4]);
        t.row([
            "allocated".to_string(),
            iec(self.start_allocated),
            iec(self.end_allocated),
            iec_delta(self.allocated_delta),
            iec(self.peak_allocated),
        ]);
        t.row([
            "reserved".to_string(),
            iec(self.start_reserved),
            iec(self.end_reserved),
            iec_delta(self.reserved_delta),
            iec(self.peak_reserved),
        ]);
        t.caption(format!(
            "scope {:?}: {}; {}{}",
            self.name,
            self.source(),
            format_duration(self.wall_time),
            if self.panicked { "; closed by a panic" } else { "" }
        ))
    }

    /// Text and HTML tables.
    pub fn bundle(&self) -> MimeBundle {
        self.table().bundle()
    }
}

impl fmt::Display for ScopeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line())
    }
}

/// A measuring scope on one device: prints its line when it closes (drop, or
/// [`MemoryScope::finish`]), including when a panic unwinds through it. See the module docs.
pub struct MemoryScope {
    alloc: Arc<Allocator>,
    slot: PeakSlot<AnyBackend>,
    name: String,
    start_allocated: u64,
    start_reserved: u64,
    started: Instant,
    /// `None`: quiet.
    sink: Option<Sink>,
    closed: bool,
}

impl fmt::Debug for MemoryScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryScope").field("name", &self.name).field("device", &self.alloc.device()).finish()
    }
}

impl MemoryScope {
    /// Opens a scope named `name` on `alloc`'s device, printing to stdout when it closes.
    pub fn new(alloc: &Arc<Allocator>, name: impl Into<String>) -> Self {
        let slot = alloc.peak_slot();
        let (start_allocated, start_reserved) = alloc.with_state(|s, _| {
            let st = s.stats();
            (st.allocated_bytes[0].current as u64, st.reserved_bytes[0].current as u64)
        });
        MemoryScope {
            alloc: Arc::clone(alloc),
            slot,
            name: name.into(),
            start_allocated,
            start_reserved,
            started: Instant::now(),
            sink: Some(Box::new(std::io::stdout())),
            closed: false,
        }
    }

    /// Prints to `sink` instead of stdout.
    pub fn with_sink(mut self, sink: impl Write + Send + 'static) -> Self {
        self.sink = Some(Box::new(sink));
        self
    }

    /// Prints nothing (the report is still returned by [`MemoryScope::finish`]).
    pub fn quiet(mut self) -> Self {
        self.sink = None;
        self
    }

    /// The scope's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The allocator measured.
    pub fn allocator(&self) -> &Arc<Allocator> {
        &self.alloc
    }

    /// Peaks since the scope opened (or its last [`MemoryScope::reset_peak`]).
    pub fn peaks(&self) -> SlotPeaks {
        self.slot.peaks()
    }

    /// Restarts this scope's peak at the current levels (no other scope, and not the global
    /// peak, is affected).
    pub fn reset_peak(&self) {
        self.slot.reset();
    }

    /// The report as of now (the scope stays open).
    pub fn report(&self) -> ScopeReport {
        self.report_now(false)
    }

    fn report_now(&self, panicked: bool) -> ScopeReport {
        let peaks = self.slot.peaks();
        let (end_allocated, end_reserved) = self.alloc.with_state(|s, _| {
            let st = s.stats();
            (st.allocated_bytes[0].current as u64, st.reserved_bytes[0].current as u64)
        });
        ScopeReport {
            name: self.name.clone(),
            device: self.alloc.device(),
            backend: self.alloc.backend_kind(),
            start_allocated: self.start_allocated,
            end_allocated,
            peak_allocated: (peaks.allocated.max(0) as u64).max(end_allocated),
            start_reserved: self.start_reserved,
            end_reserved,
            peak_reserved: (peaks.reserved.max(0) as u64).max(end_reserved),
            allocated_delta: end_allocated as i64 - self.start_allocated as i64,
            reserved_delta: end_reserved as i64 - self.start_reserved as i64,
            wall_time: self.started.elapsed(),
            panicked,
        }
    }

    fn close(&mut self, panicked: bool) -> ScopeReport {
        self.closed = true;
        let r = self.report_now(panicked);
        if let Some(sink) = self.sink.as_mut() {
            // A failing sink must not turn a scope exit (possibly during unwinding) into a panic.
            let _ = writeln!(sink, "{}", r.line());
            let _ = sink.flush();
        }
        r
    }

    /// Closes the scope: prints its line and returns the report.
    pub fn finish(mut self) -> ScopeReport {
        self.close(false)
    }
}

impl Drop for MemoryScope {
    fn drop(&mut self) {
        if !self.closed {
            self.close(std::thread::panicking());
        }
    }
}

/// Opens a scope on the current device ([`crate::current`]).
pub fn measure(name: impl Into<String>) -> crate::error::Result<MemoryScope> {
    Ok(MemoryScope::new(&crate::notebook::session::current()?, name))
}

/// Runs `f` inside a scope on `alloc`'s device; returns its value and the report (the line is
/// printed to stdout). If `f` panics, the line is printed (marked "panicked") and the panic
/// continues.
pub fn measure_with_on<R>(alloc: &Arc<Allocator>, name: impl Into<String>, f: impl FnOnce() -> R) -> (R, ScopeReport) {
    let scope = MemoryScope::new(alloc, name);
    let value = f();
    (value, scope.finish())
}

/// [`measure_with_on`] on the current device. `Err` (and `f` not run) when there is no device.
pub fn measure_with<R>(name: impl Into<String>, f: impl FnOnce() -> R) -> crate::error::Result<(R, ScopeReport)> {
    Ok(measure_with_on(&crate::notebook::session::current()?, name, f))
}

/// Why [`save_memory_snapshot`] wrote nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The directory or a file could not be written (the message names the path).
    #[error("save_memory_snapshot: {0}")]
    Io(#[from] std::io::Error),
    /// No device to take the snapshot from.
    #[error("save_memory_snapshot: {0}")]
    Device(#[from] crate::error::Error),
}

/// History recording on for a scope, then a snapshot written to a directory. Created by
/// [`SnapshotScope::new`] (or used through [`save_memory_snapshot`]). The directory is created
/// at once; recording is set to [`HistoryOptions::default`] (every event, with stacks) until
/// the scope closes, then the previous settings come back exactly — on [`SnapshotScope::finish`],
/// on drop, and while a panic unwinds (the snapshot is still written then: the state that led to
/// the panic is what one wants to see).
pub struct SnapshotScope {
    alloc: Arc<Allocator>,
    dir: PathBuf,
    previous: HistoryOptions,
    /// The tracker's recording before, when the scope switched it on (the process's device).
    tracked_previous: Option<crate::track::Recording>,
    sink: Option<Sink>,
    closed: bool,
}

impl fmt::Debug for SnapshotScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotScope").field("dir", &self.dir).field("previous", &self.previous).finish()
    }
}

impl SnapshotScope {
    /// Starts recording on `alloc`'s device for a snapshot into `dir`. Never fails: a directory
    /// that cannot be created is reported when the scope closes.
    pub fn new(alloc: &Arc<Allocator>, dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        // Created now so the files land where expected even if the code changes directory; an
        // error comes back from `finish` (`Snapshot::save` tries again and names the path).
        let _ = std::fs::create_dir_all(&dir);
        let previous = alloc.history_options();
        let options = HistoryOptions::default();
        alloc.record_memory_history_with(options);
        // Every other allocation of the process on this device goes into the snapshot too.
        let tracked_previous = super::tracking::covers(alloc).then(|| {
            let prev = super::tracking::recording();
            super::tracking::set_recording(Some(options.max_entries));
            prev
        });
        SnapshotScope {
            alloc: Arc::clone(alloc),
            dir,
            previous,
            tracked_previous,
            sink: Some(Box::new(std::io::stdout())),
            closed: false,
        }
    }

    /// Where a drop without [`SnapshotScope::finish`] prints its one line (stdout by default).
    pub fn with_sink(mut self, sink: impl Write + Send + 'static) -> Self {
        self.sink = Some(Box::new(sink));
        self
    }

    /// The recording settings that were in force before, restored when the scope closes.
    pub fn previous_options(&self) -> HistoryOptions {
        self.previous
    }

    /// The target directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn close(&mut self) -> Result<SnapshotFiles, SnapshotError> {
        self.closed = true;
        // The snapshot first: restoring "off" would clear the recorded events.
        let snap = match self.tracked_previous {
            Some(_) => super::tracking::snapshot(&self.alloc),
            None => self.alloc.snapshot(),
        };
        self.alloc.record_memory_history_with(self.previous);
        if let Some(prev) = self.tracked_previous {
            super::tracking::restore_recording(prev);
        }
        Ok(snap.save(&self.dir)?)
    }

    /// Closes the scope: takes the snapshot, restores the recording settings, writes the three
    /// files. An unwritable directory is an error value (settings restored all the same).
    pub fn finish(mut self) -> Result<SnapshotFiles, SnapshotError> {
        self.close()
    }
}

impl Drop for SnapshotScope {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        let panicking = std::thread::panicking();
        let line = match self.close() {
            Ok(files) => format!(
                "gpumem snapshot{}: wrote {}, {}, {}",
                if panicking { " (panicked)" } else { "" },
                files.pickle.display(),
                files.json.display(),
                files.html.display()
            ),
            Err(e) => format!("{e}{}", if panicking { " (panicked)" } else { "" }),
        };
        if let Some(sink) = self.sink.as_mut() {
            let _ = writeln!(sink, "{line}");
            let _ = sink.flush();
        }
    }
}

/// Runs `f` with history recording on (every event, with stacks) on `alloc`'s device, restores
/// the previous recording settings exactly, and writes `snapshot.pickle`, `snapshot.json` and
/// `trace_plot.html` into `dir` (created if missing). Returns `f`'s value with the file paths,
/// or with a one-line error: `f` has run either way. A panic in `f` still restores the settings
/// and writes the files, then continues.
pub fn save_memory_snapshot_on<R>(
    alloc: &Arc<Allocator>,
    dir: impl AsRef<Path>,
    f: impl FnOnce() -> R,
) -> (R, Result<SnapshotFiles, SnapshotError>) {
    let scope = SnapshotScope::new(alloc, dir.as_ref());
    let value = f();
    (value, scope.finish())
}

/// [`save_memory_snapshot_on`] on the current device; without one, `f` still runs and the
/// error comes back in place of the files.
pub fn save_memory_snapshot<R>(
    dir: impl AsRef<Path>,
    f: impl FnOnce() -> R,
) -> (R, Result<SnapshotFiles, SnapshotError>) {
    match crate::notebook::session::current() {
        Ok(alloc) => save_memory_snapshot_on(&alloc, dir, f),
        Err(e) => (f(), Err(SnapshotError::Device(e))),
    }
}

crate::render::evcxr_display!(ScopeReport);
