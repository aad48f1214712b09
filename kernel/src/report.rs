//! Per-cell records and what is shown from them: the one-line report with its details view,
//! the session history table, the peaks chart, CSV/JSON export.
//!
//! Every number says where it comes from: the gpumem-nb allocator in the child (exact, over
//! the control channel), the CUDA stream-ordered pool that cudarc's own `CudaSlice` uses
//! (exact, from the driver, through the crate), NVML (this process and the others on the
//! device), or the simulated device.

use crate::nvml::{NvmlDevice, NvmlSnapshot};
use gpumem_nb::render::chart::{Series, peak_bars};
use gpumem_nb::render::{MimeBundle, Table, escape};
use gpumem_nb::units::{iec, iec_delta};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt::Write as _;

/// The MIME type of the machine-readable per-cell record.
pub const CELL_MIME: &str = "application/vnd.gpumem.cell+json";

/// One device's numbers from the crate (the control channel's READING), bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrateReading {
    /// CUDA device index (as the child numbers it).
    pub device: i32,
    /// `cuda` or `simulated`.
    pub backend: String,
    /// Bytes in live allocations.
    pub allocated: u64,
    /// Bytes in segments the allocator holds.
    pub reserved: u64,
    /// Bytes in active blocks.
    #[serde(default)]
    pub active: u64,
    /// Bytes requested by callers (before rounding).
    #[serde(default)]
    pub requested: u64,
    /// Peak allocated over the cell (or overall, when no cell slot was open).
    pub peak_allocated: u64,
    /// Peak reserved over the cell.
    pub peak_reserved: u64,
    /// Free device memory (cuMemGetInfo, or the simulated capacity left).
    #[serde(default)]
    pub device_free: Option<u64>,
    /// Device size.
    #[serde(default)]
    pub device_total: Option<u64>,
    /// CUDA pool: bytes in use.
    #[serde(default)]
    pub pool_used: Option<u64>,
    /// CUDA pool: bytes reserved.
    #[serde(default)]
    pub pool_reserved: Option<u64>,
    /// CUDA pool: high-water mark of use since `pre`.
    #[serde(default)]
    pub pool_used_high: Option<u64>,
    /// CUDA pool: high-water mark of reservation since `pre`.
    #[serde(default)]
    pub pool_reserved_high: Option<u64>,
    /// Allocation failures so far.
    #[serde(default)]
    pub num_ooms: u64,
    /// The device's UUID (`GPU-…`), when the crate sends it: matches the NVML device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

impl CrateReading {
    /// Parses the `devices` array of a control reply.
    pub fn list_from(reply: &Value) -> Vec<CrateReading> {
        reply
            .get("devices")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|d| serde_json::from_value(d.clone()).ok()).collect())
            .unwrap_or_default()
    }

    fn is_simulated(&self) -> bool {
        self.backend != "cuda"
    }
}

/// Before and after of one quantity, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    /// At the start of the cell.
    pub before: Option<u64>,
    /// At the end.
    pub after: Option<u64>,
}

impl Span {
    /// after − before, when both are known.
    pub fn delta(&self) -> Option<i64> {
        Some(self.after? as i64 - self.before? as i64)
    }
}

/// The allocator's numbers for one cell on one device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatorPart {
    /// CUDA index in the child.
    pub device: i32,
    /// `cuda` or `simulated`.
    pub backend: String,
    /// Allocated bytes.
    pub allocated: Span,
    /// Reserved bytes.
    pub reserved: Span,
    /// Peak allocated during the cell.
    pub peak_allocated: u64,
    /// Peak reserved during the cell.
    pub peak_reserved: u64,
    /// Whether the peaks cover exactly this cell (a slot opened by `pre`), or everything
    /// since the crate was loaded (it was loaded during this cell).
    pub peak_is_cell: bool,
    /// Allocation failures during the cell.
    pub ooms: u64,
}

/// The CUDA stream-ordered pool (cudarc's `CudaSlice` allocations).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolPart {
    /// Bytes in use.
    pub used: Span,
    /// Bytes reserved.
    pub reserved: Span,
    /// High-water mark of use during the cell.
    pub used_high: Option<u64>,
    /// High-water mark of reservation during the cell.
    pub reserved_high: Option<u64>,
}

/// NVML's view of the child process and its device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlPart {
    /// The NVML device (`GPU-…`), if known.
    pub uuid: Option<String>,
    /// Its name.
    pub name: Option<String>,
    /// This process's memory on the device.
    pub process: Span,
    /// Other processes on the device, after the cell.
    pub others_after: Option<u64>,
    /// Device free memory after the cell.
    pub device_free: Option<u64>,
    /// Device size.
    pub device_total: Option<u64>,
    /// Why NVML said nothing, when it did not.
    pub unavailable: Option<String>,
}

/// Everything measured about one cell: the `application/vnd.gpumem.cell+json` object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CellRecord {
    /// Execution count.
    pub cell: u64,
    /// The label the allocations of the cell carry in snapshots ("cell N").
    pub label: String,
    /// First code line (for the history table).
    pub first_line: String,
    /// `ok` or `error`.
    pub status: String,
    /// The device the line describes, e.g. `cuda:0 NVIDIA H100 80GB HBM3` or `sim:0 (simulated)`.
    pub device: String,
    /// Where each number comes from.
    pub sources: Sources,
    /// The allocator (device 0 or the first device the crate reported), when the crate is loaded.
    pub allocator: Option<AllocatorPart>,
    /// Every device the crate reported (multi-GPU), after the cell.
    pub devices_after: Vec<CrateReading>,
    /// The CUDA pool, when the backend is CUDA.
    pub pool: Option<PoolPart>,
    /// NVML.
    pub nvml: NvmlPart,
    /// Free/total from the crate (cuMemGetInfo or the simulated device), after the cell.
    pub crate_device_free: Option<u64>,
    /// Device size from the crate.
    pub crate_device_total: Option<u64>,
    /// Wall time of the cell (compile + run), milliseconds.
    pub wall_ms: f64,
    /// Time the kernel spent in its hooks (pre + post), microseconds.
    pub hook_us: u64,
    /// The child's pid after the cell.
    pub child_pid: Option<u32>,
    /// The child's pid before the cell.
    pub child_pid_before: Option<u32>,
    /// Whether the child was replaced during the cell (crash, interrupt, `:restart`, `:clear`).
    pub restarted: bool,
    /// Why, when known.
    pub restart_reason: Option<String>,
    /// Whether gpumem-nb was loaded (connected) before the cell, after it.
    pub crate_loaded: Span2,
    /// Warnings shown in the line.
    pub warnings: Vec<String>,
    /// Hash of the cell's code (re-run detection).
    pub source_hash: String,
}

/// Two booleans: before and after.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span2 {
    /// At the start.
    pub before: bool,
    /// At the end.
    pub after: bool,
}

/// Where the numbers of a record come from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sources {
    /// The allocator numbers.
    pub allocator: String,
    /// The CUDA pool numbers.
    pub pool: String,
    /// This process / other processes.
    pub process: String,
    /// Device free/total.
    pub device: String,
}

impl CellRecord {
    /// What the budget is compared with: the cell's peak of live memory, the allocator's
    /// allocated peak plus the CUDA pool's used high-water mark (cached but free memory does
    /// not count: it is reusable).
    pub fn peak_total(&self) -> Option<u64> {
        let a = self.allocator.as_ref()?;
        let pool = self.pool.as_ref().and_then(|p| p.used_high.or(p.used.after)).unwrap_or(0);
        Some(a.peak_allocated + pool)
    }

    /// Device free after the cell, and total: NVML first, else the crate.
    pub fn device_free_total(&self) -> Option<(u64, u64)> {
        match (self.nvml.device_free, self.nvml.device_total) {
            (Some(f), Some(t)) => Some((f, t)),
            _ => Some((self.crate_device_free?, self.crate_device_total?)),
        }
    }

    fn simulated(&self) -> bool {
        self.allocator.as_ref().is_some_and(|a| a.backend != "cuda")
    }

    /// The compact line (text form; the HTML summary is the same words).
    pub fn line(&self) -> String {
        let mut parts = vec![format!("[{}] {}", self.cell, self.device)];
        match &self.allocator {
            Some(a) => {
                let peak_note = if a.peak_is_cell { "" } else { " since load" };
                parts.push(format!(
                    "allocated {} (peak{peak_note} {})",
                    a.allocated.delta().map_or("n/a".into(), iec_delta),
                    iec(a.peak_allocated)
                ));
                parts.push(format!("reserved {}", a.reserved.delta().map_or("n/a".into(), iec_delta)));
            }
            None if self.restarted && self.crate_loaded.before => {
                parts.push("allocator n/a (new child: gpumem-nb registers again on first use)".into())
            }
            None => parts.push("allocator n/a (gpumem-nb not loaded)".into()),
        }
        if let Some(p) = &self.pool
            && (p.used.after.unwrap_or(0) > 0 || p.used_high.unwrap_or(0) > 0)
        {
            parts.push(format!("CUDA pool {}", p.used.delta().map_or("n/a".into(), iec_delta)));
        }
        parts.push(match (self.nvml.process.after, self.nvml.process.delta()) {
            (Some(after), Some(d)) => format!("process {} ({})", iec(after), iec_delta(d)),
            (Some(after), None) => format!("process {}", iec(after)),
            (None, _) if self.simulated() => "process n/a (simulated device)".into(),
            (None, _) if self.nvml.unavailable.is_some() => "process n/a (no NVML)".into(),
            (None, _) => "process 0 B (not on a GPU)".into(),
        });
        if let Some((free, _)) = self.device_free_total() {
            let sim = if self.simulated() && self.nvml.device_free.is_none() { " (simulated)" } else { "" };
            parts.push(format!("device free {}{sim}", iec(free)));
        }
        parts.push(format_ms(self.wall_ms));
        let mut line = parts.join(" · ");
        if self.restarted {
            let why = self.restart_reason.as_deref().unwrap_or("child process replaced");
            let _ = write!(line, " · ⟳ child restarted ({why}; variables lost)");
        }
        for w in &self.warnings {
            let _ = write!(line, " · ⚠ {w}");
        }
        line
    }

    /// The details table: allocator / CUDA pool / rest of this process / other processes.
    pub fn details(&self) -> Table {
        let mut t = Table::new(["", "before", "after", "Δ", "peak in cell", "source"]).right_align([1, 2, 3, 4]);
        let b = |v: Option<u64>| v.map_or("–".to_string(), iec);
        let d = |s: &Span| s.delta().map_or("–".to_string(), iec_delta);
        if let Some(a) = &self.allocator {
            t.row([
                "allocator: allocated".into(),
                b(a.allocated.before),
                b(a.allocated.after),
                d(&a.allocated),
                iec(a.peak_allocated),
                self.sources.allocator.clone(),
            ]);
            t.row([
                "allocator: reserved".into(),
                b(a.reserved.before),
                b(a.reserved.after),
                d(&a.reserved),
                iec(a.peak_reserved),
                self.sources.allocator.clone(),
            ]);
        } else {
            t.row(["allocator", "–", "–", "–", "–", "gpumem-nb not loaded (:dep gpumem-nb = …)"]);
        }
        if let Some(p) = &self.pool {
            t.row([
                "CUDA pool: used".into(),
                b(p.used.before),
                b(p.used.after),
                d(&p.used),
                b(p.used_high),
                self.sources.pool.clone(),
            ]);
            t.row([
                "CUDA pool: reserved".into(),
                b(p.reserved.before),
                b(p.reserved.after),
                d(&p.reserved),
                b(p.reserved_high),
                self.sources.pool.clone(),
            ]);
        }
        t.row([
            "this process (total)".into(),
            b(self.nvml.process.before),
            b(self.nvml.process.after),
            d(&self.nvml.process),
            "–".into(),
            self.sources.process.clone(),
        ]);
        let held = |s: fn(&Span) -> Option<u64>| -> Option<u64> {
            let proc_ = s(&self.nvml.process)?;
            let alloc = self.allocator.as_ref().and_then(|a| s(&a.reserved)).unwrap_or(0);
            let pool = self.pool.as_ref().and_then(|p| s(&p.reserved)).unwrap_or(0);
            Some(proc_.saturating_sub(alloc + pool))
        };
        let rest = Span { before: held(|s| s.before), after: held(|s| s.after) };
        t.row([
            "rest of this process".into(),
            b(rest.before),
            b(rest.after),
            d(&rest),
            "–".into(),
            "NVML total − allocator reserved − CUDA pool (context, libraries, other allocations)".into(),
        ]);
        t.row([
            "other processes".into(),
            "–".into(),
            b(self.nvml.others_after),
            "–".into(),
            "–".into(),
            "NVML, every other pid on the device".into(),
        ]);
        if let Some((free, total)) = self.device_free_total() {
            t.row([
                "device free / total".into(),
                "–".into(),
                format!("{} / {}", iec(free), iec(total)),
                "–".into(),
                "–".into(),
                self.sources.device.clone(),
            ]);
        }
        let mut cap = format!(
            "cell {} · child pid {} · wall {} · kernel hooks {} µs",
            self.cell,
            self.child_pid.map_or("?".into(), |p| p.to_string()),
            format_ms(self.wall_ms),
            self.hook_us
        );
        if let Some(why) = &self.nvml.unavailable {
            let _ = write!(cap, " · {why}");
        }
        t.caption(cap)
    }

    /// The display_data bundle: text/plain, text/html, and the JSON record.
    pub fn display(&self) -> serde_json::Map<String, Value> {
        let line = self.line();
        let details = self.details();
        let warn = !self.warnings.is_empty() || self.restarted;
        let color = if warn { "#a15c00" } else { "#555" };
        let html = format!(
            "<div class=\"gpumem-report\" style=\"font-family:monospace;font-size:12px;color:{color}\">\
             <details><summary style=\"cursor:pointer\">{}</summary>{}</details></div>",
            escape(&line),
            details.to_html()
        );
        let mut m = serde_json::Map::new();
        m.insert("text/plain".into(), Value::String(line));
        m.insert("text/html".into(), Value::String(html));
        m.insert(CELL_MIME.into(), serde_json::to_value(self).unwrap_or(Value::Null));
        m
    }
}

/// `12 ms`, `1.23 s`, `2 min 5 s`.
pub fn format_ms(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else if ms < 120_000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{} min {} s", (ms / 60_000.0) as u64, ((ms / 1000.0) as u64) % 60)
    }
}

/// Inputs to [`build_record`]: what the hooks read.
pub struct Readings<'a> {
    /// Crate readings before (from `pre`), if the crate was connected.
    pub crate_before: Option<&'a [CrateReading]>,
    /// Crate readings after (from `post`, or `read` when the crate connected during the cell).
    pub crate_after: Option<&'a [CrateReading]>,
    /// Whether `pre` opened a cell slot (peaks cover exactly the cell).
    pub slot_opened: bool,
    /// NVML before.
    pub nvml_before: &'a NvmlSnapshot,
    /// NVML after.
    pub nvml_after: &'a NvmlSnapshot,
    /// Child pids.
    pub pid_before: Option<u32>,
    /// Child pid after.
    pub pid_after: Option<u32>,
}

/// Assembles a record (without warnings, which need the session).
pub fn build_record(cell: u64, r: &Readings<'_>) -> CellRecord {
    let mut rec = CellRecord {
        cell,
        label: format!("cell {cell}"),
        status: "ok".into(),
        child_pid: r.pid_after,
        child_pid_before: r.pid_before,
        restarted: r.pid_before.is_some() && r.pid_before != r.pid_after,
        crate_loaded: Span2 { before: r.crate_before.is_some(), after: r.crate_after.is_some() },
        ..Default::default()
    };
    let after0 = r.crate_after.and_then(|v| v.iter().find(|d| d.device == 0).or(v.first()));
    // Readings from the old child are not comparable after a restart.
    let before0 = if rec.restarted {
        None
    } else {
        r.crate_before.and_then(|v| v.iter().find(|d| Some(d.device) == after0.map(|a| a.device)))
    };
    if let Some(a) = after0 {
        // Loaded during this cell: it started from nothing.
        let start = |f: fn(&CrateReading) -> u64| match (before0, rec.crate_loaded.before) {
            (Some(b), _) => Some(f(b)),
            (None, false) if !rec.restarted => Some(0),
            _ => None,
        };
        rec.allocator = Some(AllocatorPart {
            device: a.device,
            backend: a.backend.clone(),
            allocated: Span { before: start(|x| x.allocated), after: Some(a.allocated) },
            reserved: Span { before: start(|x| x.reserved), after: Some(a.reserved) },
            peak_allocated: a.peak_allocated,
            peak_reserved: a.peak_reserved,
            peak_is_cell: r.slot_opened && before0.is_some(),
            ooms: a.num_ooms.saturating_sub(before0.map_or(0, |b| b.num_ooms)),
        });
        if !a.is_simulated() || a.pool_used.is_some() {
            rec.pool = Some(PoolPart {
                used: Span { before: before0.and_then(|b| b.pool_used), after: a.pool_used },
                reserved: Span { before: before0.and_then(|b| b.pool_reserved), after: a.pool_reserved },
                used_high: a.pool_used_high,
                reserved_high: a.pool_reserved_high,
            });
        }
        rec.crate_device_free = a.device_free;
        rec.crate_device_total = a.device_total;
        rec.devices_after = r.crate_after.map(<[_]>::to_vec).unwrap_or_default();
        rec.sources.allocator = if a.is_simulated() {
            "gpumem-nb allocator on the simulated device (exact)".into()
        } else {
            "gpumem-nb allocator (exact)".into()
        };
        rec.sources.pool = "CUDA stream-ordered pool, driver high-water marks (exact)".into();
    } else {
        rec.sources.allocator = "gpumem-nb not loaded".into();
    }
    // NVML.
    let uuid_hint = after0.and_then(|a| a.uuid.as_deref());
    let dev_after: Option<&NvmlDevice> = r.nvml_after.device_of(r.pid_after, uuid_hint);
    if let Some(d) = dev_after {
        rec.nvml.uuid = Some(d.uuid.clone());
        rec.nvml.name = Some(d.name.clone());
        rec.nvml.device_free = Some(d.free);
        rec.nvml.device_total = Some(d.total);
        rec.nvml.others_after = Some(r.pid_after.map_or(d.used, |p| d.others_used(p)));
        let listed_after = r.pid_after.is_some_and(|p| d.lists(p));
        rec.nvml.process.after = r.pid_after.and_then(|p| d.process_used(p)).or((!listed_after).then_some(0));
        if !rec.restarted {
            let before = r.nvml_before.devices.iter().find(|x| x.uuid == d.uuid);
            rec.nvml.process.before = match (before, r.pid_before) {
                (Some(b), Some(p)) => b.process_used(p).or((!b.lists(p)).then_some(0)),
                _ => None,
            };
        }
        rec.sources.process =
            format!("NVML per-process (pid {}, {})", r.pid_after.map_or("?".into(), |p| p.to_string()), d.uuid);
        rec.sources.device = format!("NVML device memory ({})", d.uuid);
    } else {
        rec.nvml.unavailable = Some(match &r.nvml_after.error {
            Some(e) => e.clone(),
            None if r.nvml_after.devices.is_empty() => "NVML lists no GPU".into(),
            None => "the child is on no GPU NVML lists".into(),
        });
        rec.sources.process = rec.nvml.unavailable.clone().unwrap_or_default();
        rec.sources.device = match after0 {
            Some(a) if a.is_simulated() => "simulated device capacity (gpumem-nb)".into(),
            Some(_) => "cuMemGetInfo (gpumem-nb)".into(),
            None => "unknown".into(),
        };
    }
    rec.device = match (after0, dev_after) {
        (Some(a), Some(d)) if !a.is_simulated() => format!("cuda:{} {}", a.device, d.name),
        (Some(a), _) if !a.is_simulated() => format!("cuda:{}", a.device),
        (Some(a), _) => format!("sim:{} (simulated)", a.device),
        (None, Some(d)) => format!("{} (NVML {})", d.name, d.index),
        (None, None) => "device n/a".into(),
    };
    rec
}

/// The session: every cell's record, the settings, re-run bookkeeping.
#[derive(Default)]
pub struct History {
    /// Records, in execution order.
    pub cells: Vec<CellRecord>,
    /// `%gpumem budget`.
    pub budget: Option<u64>,
}

impl History {
    /// Fills in the record's warnings (budget, headroom, re-run leak).
    pub fn warn(&self, rec: &mut CellRecord) {
        if let (Some(budget), Some(peak)) = (self.budget, rec.peak_total())
            && peak > budget
        {
            rec.warnings.push(format!("over budget: peak {} > {}", iec(peak), iec(budget)));
        } else if let (Some(budget), None, Some(p)) = (self.budget, rec.peak_total(), rec.nvml.process.after)
            && p > budget
        {
            rec.warnings.push(format!("over budget: process {} > {}", iec(p), iec(budget)));
        }
        if let Some((free, total)) = rec.device_free_total()
            && total > 0
            && (free as f64) < 0.10 * total as f64
        {
            rec.warnings.push(format!(
                "low headroom: {} free ({:.1}% of the device)",
                iec(free),
                100.0 * free as f64 / total as f64
            ));
        }
        if !rec.restarted
            && let Some(prev) =
                self.cells.iter().rev().find(|c| c.source_hash == rec.source_hash && !c.source_hash.is_empty())
        {
            let left = rec.allocator.as_ref().and_then(|a| a.allocated.delta()).filter(|&d| d > 0).or_else(|| {
                // Without the crate: NVML, with a tolerance for driver noise.
                rec.nvml.process.delta().filter(|&d| d > 2 << 20)
            });
            if let Some(d) = left {
                rec.warnings.push(format!(
                    "re-run leak: same code as [{}], this run left {} more",
                    prev.cell,
                    iec_delta(d)
                ));
            }
        }
    }

    /// The history table.
    pub fn table(&self) -> Table {
        let mut t = Table::new([
            "cell",
            "code",
            "device",
            "Δ allocated",
            "peak allocated",
            "Δ reserved",
            "process",
            "Δ process",
            "wall",
            "notes",
        ])
        .right_align([3, 4, 5, 6, 7, 8]);
        for c in &self.cells {
            let a = c.allocator.as_ref();
            let opt = |v: Option<u64>| v.map_or("–".into(), iec);
            let optd = |v: Option<i64>| v.map_or("–".into(), iec_delta);
            let mut notes: Vec<String> = Vec::new();
            if c.status != "ok" {
                notes.push(c.status.clone());
            }
            if c.restarted {
                notes.push("child restarted".into());
            }
            notes.extend(c.warnings.iter().cloned());
            t.row([
                format!("[{}]", c.cell),
                c.first_line.clone(),
                c.device.clone(),
                optd(a.and_then(|a| a.allocated.delta())),
                opt(a.map(|a| a.peak_allocated)),
                optd(a.and_then(|a| a.reserved.delta())),
                opt(c.nvml.process.after),
                optd(c.nvml.process.delta()),
                format_ms(c.wall_ms),
                notes.join("; "),
            ]);
        }
        let budget = self.budget.map_or(String::new(), |b| format!(" · budget {}", iec(b)));
        t.caption(format!(
            "{} cells this session · allocator: gpumem-nb (exact) · process: NVML{budget}",
            self.cells.len()
        ))
    }

    /// Peaks per cell, with the budget line.
    pub fn plot(&self) -> MimeBundle {
        let labels: Vec<String> = self.cells.iter().map(|c| format!("[{}]", c.cell)).collect();
        let alloc: Vec<Option<u64>> =
            self.cells.iter().map(|c| c.allocator.as_ref().map(|a| a.peak_allocated)).collect();
        let resv: Vec<Option<u64>> = self.cells.iter().map(|c| c.allocator.as_ref().map(|a| a.peak_reserved)).collect();
        let proc_: Vec<Option<u64>> = self.cells.iter().map(|c| c.nvml.process.after).collect();
        let mut series = vec![Series::bars("allocated peak", alloc), Series::bars("reserved peak", resv)];
        if proc_.iter().any(Option::is_some) {
            series.push(Series::line("process (NVML)", proc_));
        }
        peak_bars(&labels, &series, self.budget).bundle()
    }

    /// CSV with bytes as integers.
    pub fn to_csv(&self) -> String {
        let mut out = String::from(
            "cell,status,device,backend,allocated_before,allocated_after,peak_allocated,reserved_before,reserved_after,\
             peak_reserved,pool_used_after,pool_reserved_high,process_before,process_after,other_processes,\
             device_free,device_total,wall_ms,hook_us,child_pid,restarted,warnings,code\n",
        );
        let n = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        for c in &self.cells {
            let a = c.allocator.as_ref();
            let p = c.pool.as_ref();
            let (free, total) = c.device_free_total().unzip();
            let fields = [
                c.cell.to_string(),
                c.status.clone(),
                csv_quote(&c.device),
                a.map_or(String::new(), |a| a.backend.clone()),
                n(a.and_then(|a| a.allocated.before)),
                n(a.and_then(|a| a.allocated.after)),
                n(a.map(|a| a.peak_allocated)),
                n(a.and_then(|a| a.reserved.before)),
                n(a.and_then(|a| a.reserved.after)),
                n(a.map(|a| a.peak_reserved)),
                n(p.and_then(|p| p.used.after)),
                n(p.and_then(|p| p.reserved_high)),
                n(c.nvml.process.before),
                n(c.nvml.process.after),
                n(c.nvml.others_after),
                n(free),
                n(total),
                format!("{:.3}", c.wall_ms),
                c.hook_us.to_string(),
                c.child_pid.map_or(String::new(), |p| p.to_string()),
                c.restarted.to_string(),
                csv_quote(&c.warnings.join("; ")),
                csv_quote(&c.first_line),
            ];
            out.push_str(&fields.join(","));
            out.push('\n');
        }
        out
    }

    /// JSON: the records.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&serde_json::json!({"budget": self.budget, "cells": self.cells}))
            .unwrap_or_default()
    }
}

fn csv_quote(s: &str) -> String {
    if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvml::NvmlProc;

    fn reading(alloc: u64, resv: u64, peak: u64) -> CrateReading {
        CrateReading {
            device: 0,
            backend: "simulated".into(),
            allocated: alloc,
            reserved: resv,
            peak_allocated: peak,
            peak_reserved: resv,
            device_free: Some(80 << 30),
            device_total: Some(80 << 30),
            ..Default::default()
        }
    }

    #[test]
    fn simulated_cell_record_and_line() {
        let before = [reading(0, 0, 0)];
        let after = [reading(512 << 20, 512 << 20, 1 << 30)];
        let none = NvmlSnapshot { devices: vec![], error: Some("NVML is unavailable (no driver)".into()) };
        let rec = build_record(
            3,
            &Readings {
                crate_before: Some(&before),
                crate_after: Some(&after),
                slot_opened: true,
                nvml_before: &none,
                nvml_after: &none,
                pid_before: Some(10),
                pid_after: Some(10),
            },
        );
        let line = rec.line();
        assert!(line.starts_with("[3] sim:0 (simulated)"), "{line}");
        assert!(line.contains("allocated +512.00 MiB (peak 1.00 GiB)"), "{line}");
        assert!(line.contains("process n/a (simulated device)"), "{line}");
        assert!(line.contains("device free 80.00 GiB (simulated)"), "{line}");
        assert!(!rec.restarted);
        let d = rec.display();
        assert!(d["text/html"].as_str().unwrap().contains("<details>"));
        assert_eq!(d[CELL_MIME]["allocator"]["allocated"]["after"], 512 << 20);
        assert_eq!(d[CELL_MIME]["cell"], 3);
        let text = rec.details().to_text();
        assert!(text.contains("allocator: allocated") && text.contains("other processes"), "{text}");
    }

    #[test]
    fn nvml_only_cell_with_restart_and_warnings() {
        let dev = |used: u64| NvmlDevice {
            index: 0,
            uuid: "GPU-1".into(),
            name: "NVIDIA H100".into(),
            total: 80 << 30,
            free: 4 << 30,
            used: 76 << 30,
            processes: vec![NvmlProc { pid: 20, used: Some(used) }, NvmlProc { pid: 99, used: Some(70 << 30) }],
        };
        let b = NvmlSnapshot { devices: vec![dev(1 << 30)], error: None };
        let a = NvmlSnapshot { devices: vec![dev(2 << 30)], error: None };
        let mut rec = build_record(
            4,
            &Readings {
                crate_before: None,
                crate_after: None,
                slot_opened: false,
                nvml_before: &b,
                nvml_after: &a,
                pid_before: Some(19),
                pid_after: Some(20),
            },
        );
        assert!(rec.restarted);
        assert_eq!(rec.nvml.process.after, Some(2 << 30));
        assert_eq!(rec.nvml.process.before, None, "not comparable across a restart");
        assert_eq!(rec.nvml.others_after, Some(70 << 30));
        let h = History { cells: vec![], budget: Some(1 << 30) };
        h.warn(&mut rec);
        let line = rec.line();
        assert!(line.contains("NVIDIA H100"), "{line}");
        assert!(line.contains("child restarted"), "{line}");
        assert!(line.contains("over budget: process 2.00 GiB > 1.00 GiB"), "{line}");
        assert!(line.contains("low headroom"), "{line}");
    }

    #[test]
    fn rerun_leak_is_flagged_and_history_renders() {
        let none = NvmlSnapshot::default();
        let mk = |cell, before: u64, after: u64| {
            let b = [reading(before, before, before)];
            let a = [reading(after, after, after)];
            let mut r = build_record(
                cell,
                &Readings {
                    crate_before: Some(&b),
                    crate_after: Some(&a),
                    slot_opened: true,
                    nvml_before: &none,
                    nvml_after: &none,
                    pid_before: Some(1),
                    pid_after: Some(1),
                },
            );
            r.source_hash = "h".into();
            r.first_line = "v.push(buf)".into();
            r
        };
        let mut h = History::default();
        let mut r1 = mk(1, 0, 2 << 20);
        h.warn(&mut r1);
        assert!(r1.warnings.is_empty());
        h.cells.push(r1);
        let mut r2 = mk(2, 2 << 20, 4 << 20);
        h.warn(&mut r2);
        assert_eq!(r2.warnings, vec!["re-run leak: same code as [1], this run left +2.00 MiB more".to_string()]);
        h.cells.push(r2);
        let mut r3 = mk(3, 4 << 20, 4 << 20);
        h.warn(&mut r3);
        assert!(r3.warnings.is_empty(), "an idempotent re-run is fine");
        h.cells.push(r3);
        let t = h.table().to_text();
        assert!(t.contains("[2]") && t.contains("re-run leak") && t.contains("3 cells"), "{t}");
        let csv = h.to_csv();
        assert_eq!(csv.lines().count(), 4);
        assert!(csv.lines().nth(2).unwrap().starts_with("2,ok,sim:0 (simulated),simulated,2097152,4194304,"));
        let json: Value = serde_json::from_str(&h.to_json()).unwrap();
        assert_eq!(json["cells"].as_array().unwrap().len(), 3);
        let plot = h.plot();
        assert!(plot.svg.as_deref().unwrap_or("").contains("<svg"));
    }
}
