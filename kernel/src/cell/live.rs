//! The live line: while a cell runs longer than [`FIRST_AFTER`], its report line shows the
//! memory so far and updates in place every [`PERIOD`] (Jupyter's `update_display_data` on one
//! display id); the cell's final report replaces it under the same id.
//!
//! A [`Sampler`] thread of the kernel asks the crate in the child for `live` (its readings with
//! the cell's peaks so far; the cell's slots stay open) over the shared control channel, and
//! reads NVML for the child's process. With each reading it lists the child's own worker
//! processes on the device (`gpumem_nb::kernel::children`), so the record can give each its
//! highest reading in the cell. Only a sink that can update outputs in place gets one
//! (`Sink::updates_in_place`): headless `gpumem-kernel run` keeps the final line only.
//!
//! What it costs is measured on the sampler's own thread (its CPU time, [`LiveCost`]) and kept
//! in the cell's record; `tests/overhead.rs` measures a long cell (BENCHMARKS.md).

use crate::build::progress::Watch;
use crate::cell::hooks::{self, SharedControl};
use crate::output::Progress;
use crate::output::{Output, Sink};
use gpumem_nb::device::nvml::{self, NvmlSnapshot};
use gpumem_nb::kernel::children::Sampled;
use gpumem_nb::kernel::protocol::Op;
use gpumem_nb::kernel::report::{
    CrateReading, LINE_WIDTH, LiveCost, TrackedReadings, allocator_absent, device_name, format_ms, line_html,
    other_device, quantity, short_device,
};
use gpumem_nb::units::{iec3, iec3_delta};
use serde_json::{Map, Value};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a cell runs before its live line appears.
pub const FIRST_AFTER: Duration = Duration::from_secs(1);

/// Time between two updates (at most two a second).
pub const PERIOD: Duration = Duration::from_millis(500);

/// How long one `live` request may take before the line goes without the crate's numbers.
const LIVE_TIMEOUT: Duration = Duration::from_millis(250);

/// One reading while a cell runs.
#[derive(Clone, Debug, Default)]
pub struct LiveReading {
    /// The crate's `live` readings (peaks since the cell began), when it is connected.
    pub devices: Option<Vec<CrateReading>>,
    /// Every allocation of the child (tracking), when the crate is connected.
    pub tracked: Option<TrackedReadings>,
    /// NVML now.
    pub nvml: NvmlSnapshot,
}

/// Reads the crate (when it is connected and answers within 250 ms) and NVML.
pub fn read(control: &SharedControl) -> LiveReading {
    let mut r = LiveReading { nvml: nvml::snapshot(), ..Default::default() };
    let mut control = hooks::lock(control);
    if control.connected().is_some()
        && let Ok(mut reply) = control.request(Op::Live, LIVE_TIMEOUT)
    {
        r.tracked = TrackedReadings::take(&mut reply);
        r.devices = reply.devices;
    }
    r
}

/// What the hooks read before the cell: the live line's changes (Δ) are from there.
#[derive(Clone, Debug, Default)]
pub struct Baseline {
    /// The crate's readings before the cell (`None`: it was not loaded, so it starts at 0).
    pub devices: Option<Vec<CrateReading>>,
    /// Every allocation of the child before the cell (tracking).
    pub tracked: Option<TrackedReadings>,
    /// NVML before the cell.
    pub nvml: NvmlSnapshot,
    /// The notebook declared `:dep gpumem-nb` (the crate loads at its first use).
    pub declared: bool,
}

impl Baseline {
    /// The baseline of a cell from its pre-cell hooks.
    pub fn of(before: &hooks::Before, declared: bool) -> Baseline {
        Baseline {
            devices: before.crate_readings.clone(),
            tracked: before.tracked.clone(),
            nvml: before.nvml.clone(),
            declared,
        }
    }
}

/// What one reading shows for the device a live line follows: the crate's reading of device 0
/// (or the first in use), NVML's device of the process, every tracked allocation there, and the
/// device's short name (`sim`, `cuda:0`, or before the crate opens one, the one it will open).
struct Shown<'a> {
    reading: Option<&'a CrateReading>,
    nvml: Option<&'a gpumem_nb::device::nvml::NvmlDevice>,
    tracked: Option<&'a gpumem_nb::kernel::protocol::PlaceReading>,
    device: String,
}

impl<'a> Shown<'a> {
    fn of(r: &'a LiveReading, pid: Option<u32>) -> Shown<'a> {
        let reading = r.devices.as_deref().and_then(|v| v.iter().find(|d| d.device == 0).or(v.first()));
        let nvml = r.nvml.device_of(pid, reading.and_then(|a| a.uuid.as_deref()));
        let place = reading.map(|a| a.device);
        let tracked =
            r.tracked.as_ref().and_then(|t| t.places.iter().find(|p| place.is_none_or(|d| p.device == Some(d))));
        let device = short_device(&match (reading, nvml) {
            (None, None) => gpumem_nb::kernel::device_before_use(&r.nvml),
            (a, d) => device_name(a, d),
        });
        Shown { reading, nvml, tracked, device }
    }
}

/// The line while cell `cell` of child `pid` has run for `elapsed`: the same quantities as the
/// cell's report line, the same way ([`quantity`]): each one now, its change since the cell
/// began (from `base`) and its peak in the cell so far.
pub fn line(cell: u64, elapsed: Duration, r: &LiveReading, base: &Baseline, pid: Option<u32>) -> String {
    let Shown { reading, nvml, tracked, device } = Shown::of(r, pid);
    // Each part with how long it stays when the line is too long: the lowest rank goes first.
    const ALWAYS: u8 = u8::MAX;
    let mut parts: Vec<(u8, String)> = vec![
        (ALWAYS, format!("[{cell}] {device}")),
        (ALWAYS, format!("running {}", format_ms(elapsed.as_secs_f64() * 1000.0))),
    ];
    // Loaded during the cell: it started from nothing.
    let loaded_before = base.devices.is_some();
    let since = |now: u64, before: Option<u64>| -> Option<i64> {
        match before {
            Some(b) => Some(now as i64 - b as i64),
            None if !loaded_before => Some(now as i64),
            None => None,
        }
    };
    // gpumem-nb's allocator where it holds anything; else every allocation of the process
    // leads (a notebook of candle or cudarc alone), as on the report line.
    let unused =
        |a: &CrateReading| a.allocated == 0 && a.reserved == 0 && a.peak_allocated == 0 && a.peak_reserved == 0;
    let reading = reading.filter(|a| !unused(a));
    match reading {
        None if tracked.is_some() => {}
        Some(a) => {
            let b = base.devices.as_deref().and_then(|v| v.iter().find(|d| d.device == a.device));
            let allocated = since(a.allocated, b.map(|b| b.allocated));
            let reserved = since(a.reserved, b.map(|b| b.reserved));
            parts.push((ALWAYS, quantity("allocated", Some(a.allocated), allocated, Some(a.peak_allocated), "peak")));
            parts.push((ALWAYS, quantity("reserved", Some(a.reserved), reserved, Some(a.peak_reserved), "peak")));
        }
        None => parts.push((ALWAYS, allocator_absent(false, base.declared))),
    }
    // Every allocation of the process on the device, where it differs from reserved (as the
    // report line).
    if let Some(p) = tracked.filter(|p| reading.is_none_or(|a| a.reserved != p.live)) {
        let before =
            base.tracked.as_ref().map(|t| t.places.iter().find(|b| b.device == p.device).map_or(0, |b| b.live));
        let rank = if reading.is_some() { 2 } else { ALWAYS };
        parts.push((rank, quantity("all allocations", Some(p.live), since(p.live, before), Some(p.peak), "peak")));
    }
    // Every other GPU the process allocates on: what it holds there now, its change and peak
    // (kept longest: a cell on several GPUs is followed on each).
    let mut shorter: Vec<(String, String)> = Vec::new();
    let others = r
        .tracked
        .iter()
        .flat_map(|t| &t.places)
        .filter(|p| p.device.is_some() && p.device != tracked.and_then(|t| t.device) && (p.live > 0 || p.peak > 0));
    for p in others {
        let before =
            base.tracked.as_ref().map(|t| t.places.iter().find(|b| b.device == p.device).map_or(0, |b| b.live));
        let d = p.device.unwrap_or_default();
        let full =
            quantity(&format!("device {d} all allocations"), Some(p.live), since(p.live, before), Some(p.peak), "peak");
        // Its short form (`sim:1 +288 MiB`) where the line has no room for the whole.
        let change = since(p.live, before).map_or_else(|| iec3(p.live), iec3_delta);
        shorter.push((full.clone(), format!("{} {change}", other_device(&device, d))));
        parts.push((3, full));
    }
    if let Some(a) = reading
        && let Some(used) = a.pool_used.filter(|&u| u > 0 || a.pool_used_high.unwrap_or(0) > 0)
    {
        let b = base.devices.as_deref().and_then(|v| v.iter().find(|d| d.device == a.device));
        let d = b.and_then(|b| b.pool_used).map(|u| used as i64 - u as i64);
        parts.push((1, quantity("CUDA pool", Some(used), d, a.pool_used_high, "peak")));
    }
    match (nvml, reading.and_then(|a| a.device_free)) {
        (Some(d), _) => parts.push((0, format!("free {}", iec3(d.free)))),
        (None, Some(free)) => parts.push((0, format!("free {}", iec3(free)))),
        (None, None) => {}
    }
    // As the report line: at most LINE_WIDTH characters, free, the CUDA pool, every allocation
    // and then the other devices left out first (the last of a rank first); the cell, its time,
    // allocated and reserved always kept.
    let join = |parts: &[(u8, String)]| parts.iter().map(|(_, p)| p.as_str()).collect::<Vec<_>>().join(" · ");
    let mut line = join(&parts);
    while line.chars().count() > LINE_WIDTH {
        let Some(lowest) = parts.iter().map(|(rank, _)| *rank).filter(|&r| r != ALWAYS).min() else { break };
        let Some(last) = parts.iter().rposition(|(rank, _)| *rank == lowest) else { break };
        match shorter.iter().position(|(full, _)| *full == parts[last].1) {
            Some(i) => parts[last] = (lowest + 1, shorter.swap_remove(i).1),
            None => {
                parts.remove(last);
            }
        }
        line = join(&parts);
    }
    line
}

/// The MIME type of a live reading's figures in the live line's bundle, for a frontend that
/// draws them (the JupyterLab panel, `lab/`): the same readings the line words.
pub const LIVE_MIME: &str = "application/vnd.gpumem.live+json";

/// The live line's figures as numbers (bytes; `null` where there is no reading): the
/// allocator's (`allocated`, `reserved` and their peaks in the cell so far, device 0 or the
/// first in use), every tracked allocation on that device (`all_allocations`), NVML's bytes of
/// the notebook's process `pid` and the device's free and total memory.
pub fn figures(cell: u64, elapsed: Duration, r: &LiveReading, pid: Option<u32>) -> Value {
    let Shown { reading, nvml, tracked, device } = Shown::of(r, pid);
    serde_json::json!({
        "cell": cell,
        "elapsed_ms": elapsed.as_secs_f64() * 1000.0,
        "building": false,
        "device": device,
        "allocated": reading.map(|a| a.allocated),
        "reserved": reading.map(|a| a.reserved),
        "peak_allocated": reading.map(|a| a.peak_allocated),
        "peak_reserved": reading.map(|a| a.peak_reserved),
        "all_allocations": tracked.map(|p| p.live),
        "all_allocations_peak": tracked.map(|p| p.peak),
        "process": pid.and_then(|p| nvml.and_then(|d| d.process_used(p))),
        "device_free": nvml.map(|d| d.free).or(reading.and_then(|a| a.device_free)),
        "device_total": nvml.map(|d| d.total).or(reading.and_then(|a| a.device_total)),
    })
}

/// The line while cell `cell` builds dependencies: the build's progress (on a first `:dep` the
/// crate is not loaded yet, and nothing of the cell runs meanwhile).
pub fn compile_line(cell: u64, progress: &Progress) -> String {
    format!("[{cell}] {}", progress.describe())
}

/// The line as a `display_data` bundle (text and the same words in HTML, styled as the report
/// line that replaces it).
pub fn bundle(line: &str) -> Map<String, Value> {
    let html = line_html(line, "gpumem-report gpumem-live", false, "", None);
    let mut m = Map::new();
    m.insert("text/plain".into(), Value::String(line.to_string()));
    m.insert("text/html".into(), Value::String(html));
    m
}

/// The sampler of one cell: shows the live line after [`FIRST_AFTER`] and updates it until
/// [`Sampler::stop`].
pub struct Sampler {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<(LiveCost, Option<u64>, Sampled)>,
    id: String,
}

/// What a stopped sampler leaves: the display id its line was shown under (`None`: the cell
/// ended before it showed one), and what it cost.
pub struct Finished {
    /// The display id the cell's final report replaces.
    pub id: Option<String>,
    /// Lines shown and the sampler's CPU time.
    pub cost: LiveCost,
    /// What the process held on its devices at the last reading ([`held`]), when one was taken.
    pub last_held: Option<u64>,
    /// The notebook's worker processes on the device at each reading.
    pub children: Sampled,
}

/// What child `pid` holds on its devices in a reading: NVML's process memory where NVML sees it,
/// else every tracked allocation, else the allocator's reserved bytes.
pub fn held(r: &LiveReading, pid: Option<u32>) -> Option<u64> {
    pid.map(|p| r.nvml.devices.iter().filter_map(|d| d.process_used(p)).sum::<u64>())
        .filter(|&b| b > 0)
        .or_else(|| r.tracked.as_ref().map(|t| t.places.iter().map(|p| p.live).sum::<u64>()))
        .or_else(|| r.devices.as_ref().map(|v| v.iter().map(|d| d.reserved).sum::<u64>()))
}

impl Sampler {
    /// Starts sampling cell `cell`, which began at `started`, of child `pid`; its lines go to
    /// `sink` under a display id of their own. While `compile` sees the cell's dependencies
    /// being built, the line shows the build's progress instead.
    pub fn start(
        cell: u64,
        started: Instant,
        pid: Option<u32>,
        base: Baseline,
        control: SharedControl,
        compile: Option<Arc<Mutex<Watch>>>,
        sink: Arc<dyn Sink>,
    ) -> std::io::Result<Sampler> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let id = format!("gpumem-live-{}-{cell}-{nanos:x}", std::process::id());
        let (stop, stopped) = mpsc::channel::<()>();
        let shown_id = id.clone();
        let thread = std::thread::Builder::new().name("gpumem-live".into()).spawn(move || {
            let t0 = Instant::now();
            let mut cost = LiveCost::default();
            let mut last_held = None;
            let mut children = Sampled::default();
            let mut next = started + FIRST_AFTER;
            // Each tick waits for its time unless told to stop (or the sampler is dropped).
            while let Err(RecvTimeoutError::Timeout) =
                stopped.recv_timeout(next.saturating_duration_since(Instant::now()))
            {
                let building =
                    compile.as_ref().and_then(|w| w.lock().ok()?.poll(started)).filter(Progress::building_dependencies);
                let elapsed = started.elapsed();
                let (text, figures) = match building {
                    Some(p) => (
                        compile_line(cell, &p),
                        serde_json::json!({"cell": cell, "elapsed_ms": elapsed.as_secs_f64() * 1000.0, "building": true}),
                    ),
                    None => {
                        let r = read(&control);
                        last_held = held(&r, pid).or(last_held);
                        if let Some(pid) = pid {
                            children.add(gpumem_nb::kernel::children::of_tree(pid, &r.nvml));
                        }
                        (line(cell, elapsed, &r, &base, pid), figures(cell, elapsed, &r, pid))
                    }
                };
                let mut data = bundle(&text);
                data.insert(LIVE_MIME.into(), figures);
                let id = shown_id.clone();
                sink.emit(if cost.updates == 0 { Output::Updatable { id, data } } else { Output::Update { id, data } });
                cost.updates += 1;
                // A slow reading skips ticks rather than catching up.
                next = (next + PERIOD).max(Instant::now());
            }
            cost.cpu_us = thread_cpu().as_micros() as u64;
            cost.wall_ms = t0.elapsed().as_secs_f64() * 1000.0;
            (cost, last_held, children)
        })?;
        Ok(Sampler { stop, thread, id })
    }

    /// Stops the sampler and waits for it (at most one reading in flight).
    pub fn stop(self) -> Finished {
        let _ = self.stop.send(());
        let (cost, last_held, children) = self.thread.join().unwrap_or_default();
        Finished { id: (cost.updates > 0).then_some(self.id), cost, last_held, children }
    }
}

/// CPU time of the calling thread (zero where it cannot be read).
pub fn thread_cpu() -> Duration {
    use nix::time::{ClockId, clock_gettime};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(Duration::ZERO, |t| Duration::new(t.tv_sec().max(0) as u64, t.tv_nsec().max(0) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_nb::kernel::protocol::PlaceReading;

    const MIB: u64 = 1 << 20;

    /// A reading in a cell on the simulated device without NVML: 64 MiB allocated (peak 96),
    /// 80 MiB reserved (peak 100), 90 MiB of every allocation (peak 200), 1 GiB free of 8.
    fn reading() -> LiveReading {
        LiveReading {
            devices: Some(vec![CrateReading {
                backend: gpumem_nb::BackendKind::Simulated,
                allocated: 64 * MIB,
                reserved: 80 * MIB,
                peak_allocated: 96 * MIB,
                peak_reserved: 100 * MIB,
                device_free: Some(1 << 30),
                device_total: Some(8 << 30),
                ..Default::default()
            }]),
            tracked: Some(TrackedReadings {
                status: "simulated".into(),
                places: vec![PlaceReading { device: Some(0), live: 90 * MIB, peak: 200 * MIB, ..Default::default() }],
                ..Default::default()
            }),
            nvml: NvmlSnapshot { devices: vec![], error: Some("no NVML".into()) },
        }
    }

    /// A cell working on a second GPU: the live line follows that device too.
    #[test]
    fn the_line_follows_every_device_in_use() {
        let mut r = reading();
        let t = r.tracked.as_mut().unwrap();
        t.places.push(PlaceReading { device: Some(1), live: 288 * MIB, peak: 300 * MIB, ..Default::default() });
        let base = Baseline {
            devices: r.devices.clone(),
            tracked: Some(TrackedReadings {
                status: "simulated".into(),
                places: vec![PlaceReading { device: Some(0), live: 90 * MIB, peak: 90 * MIB, ..Default::default() }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let l = line(4, Duration::from_secs(2), &r, &base, None);
        // No room for the whole part beside the allocator's numbers: its short form.
        assert!(l.ends_with(" · sim:1 +288 MiB"), "{l}");
        assert!(l.chars().count() <= LINE_WIDTH, "{l}");
    }

    #[test]
    fn the_line_has_current_and_peak_so_far() {
        let mib = MIB;
        let r = reading();
        let base = Baseline {
            devices: Some(vec![CrateReading {
                backend: gpumem_nb::BackendKind::Simulated,
                allocated: 64 * mib,
                reserved: 64 * mib,
                ..Default::default()
            }]),
            tracked: Some(TrackedReadings {
                status: "simulated".into(),
                places: vec![PlaceReading { device: Some(0), live: 64 * mib, peak: 64 * mib, ..Default::default() }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let l = line(7, Duration::from_millis(2500), &r, &base, Some(1));
        assert_eq!(
            l,
            "[7] sim · running 2.50 s · allocated 64.0 MiB (peak 96.0 MiB) · reserved 80.0 MiB (+16.0 MiB, peak 100 MiB)"
        );
        // Loaded during the cell: the changes are from nothing.
        let l = line(7, Duration::from_millis(2500), &r, &Baseline::default(), Some(1));
        assert!(l.contains("allocated 64.0 MiB (+64.0 MiB, peak 96.0 MiB)"), "{l}");
        let none = line(2, Duration::from_secs(3), &LiveReading::default(), &Baseline::default(), None);
        // Before the crate opens a device, the one it will open (the simulated one here, or the
        // first GPU NVML lists).
        assert!(
            none.starts_with("[2] ")
                && none
                    .ends_with(" · running 3.00 s · allocator n/a (gpumem-nb not in this notebook: `:dep gpumem-nb`)")
                && !none.contains("device n/a"),
            "{none}"
        );
        let declared = Baseline { declared: true, ..Default::default() };
        let l = line(1, Duration::from_secs(3), &LiveReading::default(), &declared, None);
        assert!(l.ends_with("allocator: gpumem-nb loads at its first use"), "{l}");
        let b = bundle("a < b");
        assert_eq!(b["text/plain"], "a < b");
        assert!(b["text/html"].as_str().unwrap().contains("a &lt; b"));
    }

    #[test]
    fn the_figures_are_the_readings_the_line_words() {
        let mib = MIB;
        let r = reading();
        let f = figures(7, Duration::from_millis(2500), &r, Some(1));
        assert_eq!(f["cell"], 7);
        assert_eq!(f["elapsed_ms"], 2500.0);
        assert_eq!(f["device"], "sim");
        assert_eq!((f["allocated"].as_u64(), f["reserved"].as_u64()), (Some(64 * mib), Some(80 * mib)));
        assert_eq!((f["peak_allocated"].as_u64(), f["peak_reserved"].as_u64()), (Some(96 * mib), Some(100 * mib)));
        assert_eq!(
            (f["all_allocations"].as_u64(), f["all_allocations_peak"].as_u64()),
            (Some(90 * mib), Some(200 * mib))
        );
        // No NVML: the crate's view of the device, and no process figure.
        assert_eq!((f["device_free"].as_u64(), f["device_total"].as_u64()), (Some(1 << 30), Some(8 << 30)));
        assert!(f["process"].is_null());
        // Nothing read: every figure null, none made up.
        let none = figures(2, Duration::from_secs(3), &LiveReading::default(), None);
        for k in ["allocated", "reserved", "all_allocations", "process", "device_free", "device_total"] {
            assert!(none[k].is_null(), "{k}: {none}");
        }
    }

    #[test]
    fn thread_cpu_time_grows() {
        let a = thread_cpu();
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(20) {
            std::hint::black_box(0);
        }
        assert!(thread_cpu() > a);
    }
}
