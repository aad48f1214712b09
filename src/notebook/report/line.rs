//! What a record shows: the one-line report, its details table, the `display_data` bundle.

use super::{CELL_MIME, CellRecord, Span};
use crate::render::{Table, escape};
use crate::units::{iec, iec_delta};
use serde_json::Value;
use std::fmt::Write as _;

impl CellRecord {
    fn simulated(&self) -> bool {
        self.allocator.as_ref().is_some_and(|a| a.backend != crate::BackendKind::Cuda)
    }

    /// The compact line (text form; the HTML summary is the same words). With tracking on it
    /// leads with every allocation of the process on the device, whoever made it.
    pub fn line(&self) -> String {
        let mut parts = vec![format!("[{}] {}", self.cell, self.device)];
        let all = self.all_allocations.as_ref();
        if let Some(all) = all.filter(|a| a.is_tracked()) {
            parts.push(format!(
                "all allocations {} (peak {})",
                all.delta().map_or("n/a".into(), iec_delta),
                all.peak.map_or("n/a".into(), iec)
            ));
        }
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
        parts.extend(self.frameworks.iter().map(|f| f.line()));
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
        if let Some(all) = all.filter(|a| a.is_tracked()) {
            for p in all.devices.iter().filter(|p| p.device != all.device && (p.after > 0 || p.peak > 0)) {
                let delta = p.before.map_or("n/a".into(), |b| iec_delta(p.after as i64 - b as i64));
                let place = p.device.map_or("host pinned".to_string(), |d| format!("device {d} all"));
                parts.push(format!("{place} {delta} (peak {})", iec(p.peak)));
            }
        }
        parts.push(format_ms(self.wall_ms));
        if let Some(all) = all.filter(|a| !a.is_tracked()) {
            parts.push(format!("tracking {}", short(&all.tracking, 90)));
        }
        let mut line = parts.join(" · ");
        if self.restarted {
            let why = self.restart_reason.as_deref().unwrap_or("child process replaced");
            let _ = write!(line, " · ⟳ child restarted ({why}; variables lost)");
        }
        for w in &self.warnings {
            let _ = write!(line, " · ⚠ {w}");
        }
        if let Some(o) = &self.oom {
            let _ = write!(line, " · ⚠ {}", o.why);
            if o.count > 1 {
                let _ = write!(line, " ({} failures in the cell)", o.count);
            }
            match (&o.files, &o.snapshot_error) {
                (Some(f), _) => {
                    let dir = std::path::Path::new(&f.html).parent().unwrap_or(std::path::Path::new(""));
                    let _ = write!(line, " · snapshot then: {}", dir.display());
                }
                (None, Some(e)) => {
                    let _ = write!(line, " · no snapshot: {e}");
                }
                (None, None) => {}
            }
        }
        line
    }

    /// The out-of-memory snapshot's page, as a link relative to the working directory (the
    /// notebook's) when it is below it.
    fn oom_link(&self) -> Option<String> {
        let html = self.oom.as_ref()?.files.as_ref()?.html.clone();
        let cwd = std::env::current_dir().unwrap_or_default();
        let href = std::path::Path::new(&html).strip_prefix(&cwd).map_or(html.clone(), |p| p.display().to_string());
        Some(format!(" <a href=\"{}\" target=\"_blank\">open the snapshot</a>", escape(&href)))
    }

    /// The details table: allocator / CUDA pool / rest of this process / other processes.
    pub fn details(&self) -> Table {
        let mut t = Table::new(["", "before", "after", "Δ", "peak in cell", "source"]).right_align([1, 2, 3, 4]);
        let b = |v: Option<u64>| v.map_or("–".to_string(), iec);
        let d = |s: &Span| s.delta().map_or("–".to_string(), iec_delta);
        if let Some(all) = &self.all_allocations {
            let how = match all.tracking.as_str() {
                "cupti" => "every driver allocation, CUPTI callbacks (exact)",
                "simulated" => "every allocation, the simulated driver (exact)",
                other => other,
            };
            for p in &all.devices {
                let place =
                    p.device.map_or("host pinned memory".to_string(), |d| format!("all allocations, device {d}"));
                let delta = p.before.map_or("–".into(), |bf| iec_delta(p.after as i64 - bf as i64));
                t.row([place, b(p.before), iec(p.after), delta, iec(p.peak), how.to_string()]);
                for sd in &p.by_source {
                    t.row([
                        format!("  {}", sd.source),
                        "–".into(),
                        "–".into(),
                        iec_delta(sd.delta),
                        iec(sd.peak),
                        "tracked, by who allocated it".into(),
                    ]);
                }
                if !p.top.is_empty() {
                    let top: Vec<String> = p.top.iter().map(|o| format!("{} {}", o.owner, iec(o.bytes))).collect();
                    t.row(["  top owners".into(), "–".into(), "–".into(), "–".into(), "–".into(), top.join(", ")]);
                }
            }
            if !all.is_tracked() {
                t.row([
                    "all allocations".into(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    "–".into(),
                    format!("tracking {}", all.tracking),
                ]);
            }
        }
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
        for f in &self.frameworks {
            f.rows(&mut t);
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
        let warn = !self.warnings.is_empty() || self.restarted || self.oom.is_some();
        let color = if warn { "#a15c00" } else { "#555" };
        let html = format!(
            "<div class=\"gpumem-report\" style=\"font-family:monospace;font-size:12px;color:{color}\">\
             <details><summary style=\"cursor:pointer\">{}{}</summary>{}</details></div>",
            escape(&line),
            self.oom_link().unwrap_or_default(),
            details.to_html()
        );
        let mut m = serde_json::Map::new();
        m.insert("text/plain".into(), Value::String(line));
        m.insert("text/html".into(), Value::String(html));
        m.insert(CELL_MIME.into(), serde_json::to_value(self).unwrap_or(Value::Null));
        m
    }
}

/// At most `n` characters of `s`, with "…" when cut.
fn short(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_string() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

/// Milliseconds in the crate's one duration format ([`crate::units::format_duration`]):
/// `850 µs`, `12.3 ms`, `1.23 s`, `2 min 5 s`.
pub fn format_ms(ms: f64) -> String {
    crate::units::format_duration(std::time::Duration::from_secs_f64(ms.max(0.0) / 1e3))
}
