//! The session's history: warnings that need earlier cells, the table, the peaks chart, CSV
//! and JSON export.

use gpumem_nb::Component;
use gpumem_nb::kernel::protocol::Held;
use gpumem_nb::kernel::report::{CellRecord, CellStatus, format_ms, other_device, short_device};
use gpumem_nb::render::chart::{Series, peak_bars};
use gpumem_nb::render::{MimeBundle, Table};
use gpumem_nb::units::{iec, iec_delta};

/// The session: every cell's record, the settings, re-run bookkeeping.
#[derive(Default)]
pub struct History {
    /// Records, in execution order.
    pub cells: Vec<CellRecord>,
    /// `%gpumem budget`.
    pub budget: Option<u64>,
    /// The cells no longer kept, summarised (`crate::session::retention`).
    pub dropped: crate::session::retention::Dropped,
}

impl History {
    /// Fills in the record's warnings (budget, headroom, re-run leak), and the budget they
    /// compared with.
    pub fn warn(&self, rec: &mut CellRecord) {
        rec.budget = self.budget;
        // The cell's own doing: a peak over the budget that the cell raised above what it
        // started with (memory already held before the cell warned in the cell that made it).
        let held_before = rec.allocator.as_ref().and_then(|a| a.allocated.before).unwrap_or(0)
            + rec.pool.as_ref().and_then(|p| p.used.before).unwrap_or(0);
        if let (Some(budget), Some(peak)) = (self.budget, rec.peak_total())
            && peak > budget
            && peak > held_before
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
            // The allocator's allocated bytes, a watched framework's books (live tensors apart
            // from pool reserve), or NVML with a tolerance for driver noise.
            if let Some(g) = rec.growth() {
                rec.warnings.push(g.warning(prev.cell));
            }
        }
    }

    /// The history table: one row per cell; the columns of a source only when it answered for
    /// some cell (tracking, the allocator, NVML). What a person reads first comes first (at
    /// 1400 px they are in view): the cell, its main numbers (every allocation when tracked, else
    /// the allocator's), what the memory is (one column, its largest parts), the time, notes, the
    /// site holding the most and the code (cut, whole on hover); then the allocator's and NVML's
    /// columns, which the table scrolls to.
    pub fn table(&self) -> Table {
        let tracked = self.cells.iter().any(|c| c.all_allocations.as_ref().is_some_and(|a| a.is_tracked()));
        let alloc = self.cells.iter().any(|c| c.allocator.is_some());
        let nvml = self.cells.iter().any(|c| c.nvml.process.after.is_some());
        let devices: std::collections::BTreeSet<String> = self.cells.iter().map(|c| short_device(&c.device)).collect();
        let what = self.components().iter().any(|h| h.is_classified());
        let opt = |v: Option<u64>| v.map_or("–".into(), iec);
        let optd = |v: Option<i64>| v.map_or("–".into(), iec_delta);
        // Every other GPU some cell allocated on, and its columns' headers.
        let others = self.other_devices();
        let other_headers: Vec<[String; 2]> = others
            .iter()
            .map(|&d| [format!("Δ all {}", self.device_label(d)), format!("peak all {}", self.device_label(d))])
            .collect();
        type Col<'a> = (&'a str, bool, Option<usize>, Box<dyn Fn(&CellRecord) -> String + 'a>);
        let mut cols: Vec<Col<'_>> = vec![("cell", false, None, Box::new(|c: &CellRecord| format!("[{}]", c.cell)))];
        if devices.len() > 1 {
            cols.push(("device", false, None, Box::new(|c: &CellRecord| short_device(&c.device))));
        }
        let all_cols = |cols: &mut Vec<Col<'_>>| {
            cols.push((
                "Δ all",
                true,
                None,
                Box::new(move |c: &CellRecord| optd(c.all_allocations.as_ref().and_then(|x| x.delta()))),
            ));
            cols.push((
                "peak all",
                true,
                None,
                Box::new(move |c: &CellRecord| opt(c.all_allocations.as_ref().and_then(|x| x.place.peak))),
            ));
        };
        let alloc_cols = |cols: &mut Vec<Col<'_>>| {
            cols.push((
                "Δ allocated",
                true,
                None,
                Box::new(move |c: &CellRecord| optd(c.allocator.as_ref().and_then(|a| a.allocated.delta()))),
            ));
            cols.push((
                "peak allocated",
                true,
                None,
                Box::new(move |c: &CellRecord| opt(c.allocator.as_ref().map(|a| a.peak_allocated))),
            ));
            cols.push((
                "Δ reserved",
                true,
                None,
                Box::new(move |c: &CellRecord| optd(c.allocator.as_ref().and_then(|a| a.reserved.delta()))),
            ));
        };
        if tracked {
            all_cols(&mut cols);
            // Every other GPU some cell allocated on: its own change and peak.
            for (&d, [delta_header, peak_header]) in others.iter().zip(&other_headers) {
                let place = move |c: &CellRecord| {
                    c.all_allocations.as_ref().and_then(|a| a.devices.iter().find(|p| p.device == Some(d)).cloned())
                };
                let delta = move |c: &CellRecord| place(c).and_then(|p| Some(p.after as i64 - p.before? as i64));
                cols.push((delta_header, true, None, Box::new(move |c: &CellRecord| optd(delta(c)))));
                cols.push((peak_header, true, None, Box::new(move |c: &CellRecord| opt(place(c).map(|p| p.peak)))));
            }
        } else if alloc {
            alloc_cols(&mut cols);
        }
        // What is live after each cell, by component: its largest parts.
        if what {
            cols.push(("what", false, Some(28), Box::new(|c: &CellRecord| what_after(c))));
        }
        cols.push((
            "wall",
            true,
            None,
            Box::new(|c: &CellRecord| if c.status == CellStatus::Refused { "–".into() } else { format_ms(c.wall_ms) }),
        ));
        cols.push((
            "notes",
            false,
            Some(24),
            Box::new(|c: &CellRecord| {
                let mut notes: Vec<String> = Vec::new();
                match c.status {
                    CellStatus::Ok => {}
                    CellStatus::Oom => notes.push("OOM".into()),
                    CellStatus::Lost => notes.push(format!(
                        "✗ CUDA context lost ({})",
                        c.lost.as_ref().map_or("a kernel faulted", |l| l.fault.what())
                    )),
                    CellStatus::Refused => notes.push("not run: the CUDA context was lost".into()),
                    other @ (CellStatus::Error | CellStatus::Panicked) => notes.push(other.to_string()),
                }
                if c.restarted {
                    notes.push("child restarted".into());
                }
                notes.extend(c.warnings.iter().cloned());
                notes.join("; ")
            }),
        ));
        if tracked {
            cols.push((
                "top site",
                false,
                Some(24),
                Box::new(move |c: &CellRecord| {
                    // The allocator's cached free memory is no one's: the site holding the most.
                    c.all_allocations
                        .as_ref()
                        .and_then(|x| {
                            x.place
                                .top
                                .iter()
                                .find(|t| t.function.as_deref() != Some(gpumem_nb::kernel::protocol::CACHED_FREE))
                        })
                        .map_or("–".into(), |t| format!("{} {}", t.site(), iec(t.bytes)))
                }),
            ));
        }
        cols.push(("code", false, Some(24), Box::new(|c: &CellRecord| c.first_line.clone())));
        if tracked && alloc {
            alloc_cols(&mut cols);
        }
        if nvml {
            cols.push(("process", true, None, Box::new(move |c: &CellRecord| opt(c.nvml.process.after))));
            cols.push(("Δ process", true, None, Box::new(move |c: &CellRecord| optd(c.nvml.process.delta()))));
        }
        let right: Vec<usize> = cols.iter().enumerate().filter(|(_, c)| c.1).map(|(i, _)| i).collect();
        let mut t = Table::new(cols.iter().map(|c| c.0)).right_align(right);
        for (i, c) in cols.iter().enumerate() {
            if let Some(n) = c.2 {
                t = t.cut_column(i, n);
            }
        }
        for c in &self.cells {
            t.row(cols.iter().map(|col| (col.3)(c)));
        }
        // Each source named only where it answered for some cell.
        let mut caption = vec![format!("{} this session", gpumem_nb::units::count(self.cells.len(), "cell"))];
        if devices.len() == 1 {
            caption.push(format!("device {}", devices.iter().next().map_or("", String::as_str)));
        }
        caption.extend(self.dropped.line());
        if let Some(tracking) = self
            .cells
            .iter()
            .rev()
            .find_map(|c| c.all_allocations.as_ref().filter(|a| a.is_tracked()).map(|a| a.tracking.clone()))
        {
            caption.push(format!("all: every allocation of the process (tracking: {tracking})"));
        }
        if what {
            caption.push(
                "what: live after the cell by component, largest first (tracking; untagged: no stamp or rule \
                          named it)"
                    .into(),
            );
        }
        if self.cells.iter().any(|c| c.allocator.is_some()) {
            caption.push("allocated, reserved: the gpumem-nb allocator (exact)".into());
        }
        if self.cells.iter().any(|c| c.nvml.process.after.is_some()) {
            caption.push("process: NVML".into());
        }
        if let Some(b) = self.budget {
            caption.push(format!("budget {}", iec(b)));
        }
        t.caption(caption.join(" · "))
    }

    /// Peaks per cell, with the budget line.
    pub fn plot(&self) -> MimeBundle {
        let labels: Vec<String> = self.cells.iter().map(|c| format!("[{}]", c.cell)).collect();
        let alloc: Vec<Option<u64>> =
            self.cells.iter().map(|c| c.allocator.as_ref().map(|a| a.peak_allocated)).collect();
        let resv: Vec<Option<u64>> = self.cells.iter().map(|c| c.allocator.as_ref().map(|a| a.peak_reserved)).collect();
        let proc_: Vec<Option<u64>> = self.cells.iter().map(|c| c.nvml.process.after).collect();
        let all: Vec<Option<u64>> =
            self.cells.iter().map(|c| c.all_allocations.as_ref().and_then(|a| a.place.peak)).collect();
        let mut series = Vec::new();
        if all.iter().any(Option::is_some) {
            series.push(Series::bars("all allocations peak", all));
        }
        series.extend([Series::bars("allocated peak", alloc), Series::bars("reserved peak", resv)]);
        // What is live after each cell, stacked by component.
        for held in self.components() {
            series.push(Series::stacked(
                format!("{} (after)", held.label()),
                self.cells.iter().map(|c| component_after(c, held)).collect::<Vec<_>>(),
            ));
        }
        // Every other GPU: its peak of every allocation, and NVML's bytes there.
        for d in self.other_devices() {
            let peak = self.cells.iter().map(|c| {
                c.all_allocations.as_ref().and_then(|a| a.devices.iter().find(|p| p.device == Some(d)).map(|p| p.peak))
            });
            series
                .push(Series::bars(format!("{} all allocations peak", self.device_label(d)), peak.collect::<Vec<_>>()));
        }
        if proc_.iter().any(Option::is_some) {
            series.push(Series::line("process (NVML)", proc_));
        }
        for d in self.other_devices() {
            let process = self
                .cells
                .iter()
                .map(|c| c.nvml_devices.iter().find(|n| n.device == Some(d)).and_then(|n| n.process.after));
            let process: Vec<Option<u64>> = process.collect();
            if process.iter().any(Option::is_some) {
                series.push(Series::line(format!("{} process (NVML)", self.device_label(d)), process));
            }
        }
        peak_bars(&labels, &series, self.budget).bundle()
    }

    /// The GPUs some cell allocated on beyond each record's own device (the one its numbers lead
    /// with), in order.
    fn other_devices(&self) -> Vec<i32> {
        let mut out: Vec<i32> = self
            .cells
            .iter()
            .filter_map(|c| c.all_allocations.as_ref())
            .flat_map(|a| a.devices.iter().filter(move |p| p.device != a.place.device).filter_map(|p| p.device))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Device `d` as the session's records name their kind (`sim:1`, `cuda:1`).
    fn device_label(&self, d: i32) -> String {
        other_device(self.cells.last().map_or("", |c| c.device.as_str()), d)
    }

    /// The components some cell holds after it ran, in a fixed order (what a model is made of
    /// first, the allocator's cached free memory last).
    fn components(&self) -> Vec<Held> {
        COMPONENT_ORDER
            .into_iter()
            .filter(|&held| self.cells.iter().any(|c| component_after(c, held).is_some_and(|b| b > 0)))
            .collect()
    }

    /// CSV with bytes as integers.
    pub fn to_csv(&self) -> String {
        let mut out = String::from(
            "cell,status,device,backend,tracking,all_before,all_after,all_peak,allocated_before,allocated_after,\
             peak_allocated,reserved_before,reserved_after,peak_reserved,pool_used_after,pool_reserved_high,process_before,process_after,other_processes,\
             device_free,device_total,wall_ms,hook_us,child_pid,restarted,warnings,code,top_site,top_bytes\n",
        );
        let n = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        for c in &self.cells {
            let a = c.allocator.as_ref();
            let all = c.all_allocations.as_ref();
            let p = c.pool.as_ref();
            let (free, total) = c.device_free_total().unzip();
            let fields = [
                c.cell.to_string(),
                c.status.to_string(),
                csv_quote(&c.device),
                a.map_or(String::new(), |a| a.backend.name().to_string()),
                csv_quote(&all.map_or(String::new(), |x| x.tracking.clone())),
                n(all.and_then(|x| x.place.before)),
                n(all.and_then(|x| x.place.after)),
                n(all.and_then(|x| x.place.peak)),
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
                csv_quote(&all.and_then(|x| x.place.top.first()).map_or(String::new(), |t| t.site())),
                n(all.and_then(|x| x.place.top.first()).map(|t| t.bytes)),
            ];
            out.push_str(&fields.join(","));
            out.push('\n');
        }
        out
    }

    /// JSON: the records.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(
            &serde_json::json!({"budget": self.budget, "dropped": self.dropped, "cells": self.cells}),
        )
        .unwrap_or_default()
    }
}

/// The order of the components' columns and stacked bars: what a model is made of first (an
/// optimizer's state beside its gradients, not [`Component::ALL`]'s order), the allocator's
/// cached free memory last.
const COMPONENT_ORDER: [Held; 9] = [
    Held::Component(Component::Parameter),
    Held::Component(Component::Buffer),
    Held::Component(Component::Gradient),
    Held::Component(Component::OptimizerState),
    Held::Component(Component::Activation),
    Held::Component(Component::Temp),
    Held::Component(Component::Workspace),
    Held::Component(Component::Other),
    Held::Cached,
];

/// What `held` held after the cell (its device's tracked allocations), when the record has
/// components.
/// What is live after a cell by component, its two largest parts (`optimizer_state 512.00 MiB,
/// gradient 256.00 MiB, …`), the allocator's cache left out; `–` where nothing is.
fn what_after(c: &CellRecord) -> String {
    let Some(a) = c.all_allocations.as_ref() else { return "–".into() };
    let mut parts: Vec<_> =
        a.place.by_component.iter().filter(|x| x.component != Held::Cached && x.after > 0).collect();
    parts.sort_by(|x, y| y.after.cmp(&x.after).then(x.component.key().cmp(y.component.key())));
    let mut shown: Vec<String> =
        parts.iter().take(2).map(|x| format!("{} {}", x.component.label(), iec(x.after))).collect();
    if parts.len() > 2 {
        shown.push("…".into());
    }
    if shown.is_empty() { "–".into() } else { shown.join(", ") }
}

fn component_after(c: &CellRecord, held: Held) -> Option<u64> {
    let a = c.all_allocations.as_ref().filter(|a| !a.place.by_component.is_empty())?;
    Some(a.place.by_component.iter().find(|x| x.component == held).map_or(0, |x| x.after))
}

fn csv_quote(s: &str) -> String {
    if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_nb::device::nvml::{NvmlDevice, NvmlProcess, NvmlSnapshot};
    use gpumem_nb::kernel::report::{CELL_MIME, CrateReading, Readings, Span, build_record, framework_parts};
    use serde_json::Value;

    fn reading(alloc: u64, resv: u64, peak: u64) -> CrateReading {
        CrateReading {
            device: 0,
            backend: gpumem_nb::BackendKind::Simulated,
            allocated: alloc,
            reserved: resv,
            peak_allocated: peak,
            peak_reserved: resv,
            device_free: Some(80 << 30),
            device_total: Some(80 << 30),
            ..Default::default()
        }
    }

    /// A record from the crate's readings before and after, in one process, without NVML.
    fn crate_record(cell: u64, before: &[CrateReading], after: &[CrateReading]) -> CellRecord {
        let none = NvmlSnapshot::default();
        build_record(
            cell,
            &Readings {
                crate_before: Some(before),
                crate_after: Some(after),
                tracked_before: None,
                tracked_after: None,
                slot_opened: true,
                nvml_before: &none,
                nvml_after: &none,
                pid_before: Some(1),
                pid_after: Some(1),
            },
        )
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
                tracked_before: None,
                tracked_after: None,
                slot_opened: true,
                nvml_before: &none,
                nvml_after: &none,
                pid_before: Some(10),
                pid_after: Some(10),
            },
        );
        let line = rec.line();
        assert_eq!(
            line,
            "[3] sim · 0 µs · allocated 512 MiB (+512 MiB, peak 1.00 GiB) · reserved 512 MiB (+512 MiB) · free 80.0 GiB"
        );
        assert!(line.chars().count() <= 120, "{line}");
        assert!(!rec.restarted);
        let d = rec.display();
        assert!(d["text/html"].as_str().unwrap().contains("<details>"));
        assert_eq!(d[CELL_MIME]["allocator"]["allocated"]["after"], 512 << 20);
        assert_eq!(d[CELL_MIME]["cell"], 3);
        let text = rec.details().to_text();
        assert!(text.contains("allocator: allocated") && text.contains("allocated: blocks"), "{text}");
        // Without NVML it is said once, and the rows that would need it are left out.
        assert_eq!(text.matches("NVML is unavailable").count(), 1, "{text}");
        assert!(!text.contains("other processes") && !text.contains("rest of this process"), "{text}");
    }

    #[test]
    fn the_budget_warns_in_the_cell_that_raised_the_peak_only() {
        let mk = |before: u64, after: u64, peak: u64| {
            let (b, a) = ([reading(before, before, before)], [reading(after, after, peak)]);
            crate_record(5, &b, &a)
        };
        let h = History { budget: Some(1 << 30), ..Default::default() };
        let mut grew = mk(512 << 20, 2 << 30, 2 << 30);
        h.warn(&mut grew);
        assert_eq!(grew.warnings, vec!["over budget: peak 2.00 GiB > 1.00 GiB".to_string()]);
        let mut idle = mk(2 << 30, 2 << 30, 2 << 30);
        h.warn(&mut idle);
        assert!(idle.warnings.is_empty(), "2 GiB held since an earlier cell: this one allocated nothing");
        // The record carries the budget it was compared with; none set, none said.
        assert_eq!((grew.budget, idle.budget), (Some(1 << 30), Some(1 << 30)));
        let mut plain = mk(0, 1 << 20, 1 << 20);
        History::default().warn(&mut plain);
        assert_eq!(plain.budget, None);
        assert!(!serde_json::to_string(&plain).unwrap().contains("budget"));
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
            processes: vec![NvmlProcess { pid: 20, used: Some(used) }, NvmlProcess { pid: 99, used: Some(70 << 30) }],
        };
        let b = NvmlSnapshot { devices: vec![dev(1 << 30)], error: None };
        let a = NvmlSnapshot { devices: vec![dev(2 << 30)], error: None };
        let mut rec = build_record(
            4,
            &Readings {
                crate_before: None,
                crate_after: None,
                tracked_before: None,
                tracked_after: None,
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
        let h = History { budget: Some(1 << 30), ..Default::default() };
        h.warn(&mut rec);
        let line = rec.line();
        assert!(line.starts_with("[4] NVIDIA H100"), "{line}");
        assert!(rec.details().to_text().contains("NVIDIA H100"));
        assert!(line.contains("⟳ restarted"), "{line}");
        // Each warning at least by its name on the line; whole in the record (and the notes).
        assert!(line.contains("⚠ over budget") && line.contains("⚠ low headroom"), "{line}");
        assert!(line.chars().count() <= 120, "{line}");
        assert!(rec.warnings.iter().any(|w| w == "over budget: process 2.00 GiB > 1.00 GiB"), "{:?}", rec.warnings);
    }

    #[test]
    fn rerun_leak_is_flagged_and_history_renders() {
        let mk = |cell, before: u64, after: u64| {
            let b = [reading(before, before, before)];
            let a = [reading(after, after, after)];
            let mut r = crate_record(cell, &b, &a);
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
        // No tracking in these records: its four columns are empty.
        let row = csv.lines().nth(2).unwrap();
        assert!(row.starts_with("2,ok,sim:0 (simulated),simulated,,,,,2097152,4194304,"), "{row}");
        let json: Value = serde_json::from_str(&h.to_json()).unwrap();
        assert_eq!(json["cells"].as_array().unwrap().len(), 3);
        let plot = h.plot();
        assert!(plot.svg.as_deref().unwrap_or("").contains("<svg"));
    }

    /// Cells on two GPUs: the history has the second device's change and peak as columns of
    /// their own, and the plot its peaks and NVML's bytes there as series of their own.
    #[test]
    fn a_second_gpu_has_its_own_columns_and_series() {
        use gpumem_nb::kernel::report::{AllAllocations, NvmlPart, PlaceAll};
        let mib = 1u64 << 20;
        let mk = |cell, d1: (u64, u64, u64), process1: u64| {
            let mut r = crate_record(cell, &[reading(0, 0, 0)], &[reading(0, 0, 0)]);
            let place = |device, (before, after, peak)| PlaceAll {
                device: Some(device),
                before: Some(before),
                after,
                peak,
                ..Default::default()
            };
            r.all_allocations = Some(AllAllocations {
                tracking: "cupti".into(),
                place: PlaceAll {
                    device: Some(0),
                    before: Some(0),
                    after: Some(0),
                    peak: Some(0),
                    ..Default::default()
                },
                devices: vec![place(0, (0, 0, 0)), place(1, d1)],
            });
            r.nvml_devices = vec![
                NvmlPart { device: Some(0), uuid: Some("GPU-0".into()), ..Default::default() },
                NvmlPart {
                    device: Some(1),
                    uuid: Some("GPU-1".into()),
                    process: Span { before: None, after: Some(process1) },
                    ..Default::default()
                },
            ];
            r
        };
        let mut h = History::default();
        h.cells.push(mk(1, (0, 196 * mib, 196 * mib), 600 * mib));
        h.cells.push(mk(2, (196 * mib, 484 * mib, 500 * mib), 986 * mib));
        let t = h.table().to_text();
        // The records are the simulated device's: the other device is `sim:1`.
        for s in ["Δ all sim:1", "peak all sim:1", "+288.00 MiB", "500.00 MiB"] {
            assert!(t.contains(s), "{s:?} not in\n{t}");
        }
        let svg = h.plot().svg.unwrap_or_default();
        assert!(svg.contains("sim:1 all allocations peak") && svg.contains("sim:1 process (NVML)"), "{svg}");
    }

    /// burn's re-runs: the allocator saw nothing, cubecl's books say what grew.
    #[test]
    fn rerun_leak_of_a_watched_framework_says_live_tensors_or_pool_reserve() {
        use gpumem_nb::kernel::protocol::{FrameworkPool, FrameworkReading};
        let mib = 1u64 << 20;
        let books = |in_use: u64, reserved: u64| {
            vec![FrameworkReading {
                framework: "cubecl".into(),
                device: "cuda stream 0".into(),
                pools: vec![FrameworkPool { kind: "all pools".into(), in_use, reserved, ..Default::default() }],
                ..Default::default()
            }]
        };
        let mk = |cell, before: (u64, u64), after: (u64, u64)| {
            let r = [reading(0, 0, 0)];
            let mut rec = crate_record(cell, &r, &r);
            rec.frameworks = framework_parts(Some(&books(before.0, before.1)), Some(&books(after.0, after.1)));
            rec.source_hash = "epoch".into();
            rec
        };
        let mut h = History::default();
        let mut first = mk(1, (0, 64 * mib), (0, 96 * mib));
        h.warn(&mut first);
        assert!(first.warnings.is_empty(), "a first run is no re-run: {:?}", first.warnings);
        assert!(first.line().contains("cubecl in use 0 B (±0 B, cached 96.00 MiB)"), "{}", first.line());
        h.cells.push(first);
        let mut kept = mk(2, (0, 96 * mib), (32 * mib, 96 * mib));
        h.warn(&mut kept);
        assert_eq!(
            kept.warnings,
            ["re-run leak: same code as [1], this run left +32.00 MiB more (cubecl: live tensors +32.00 MiB, pool \
              reserve -32.00 MiB)"]
        );
        h.cells.push(kept);
        let mut grew = mk(3, (32 * mib, 96 * mib), (32 * mib, 160 * mib));
        h.warn(&mut grew);
        assert_eq!(
            grew.warnings,
            ["re-run leak: same code as [2], this run left +64.00 MiB more (cubecl: live tensors ±0 B, pool reserve \
              +64.00 MiB)"]
        );
        let mut steady = mk(4, (32 * mib, 160 * mib), (32 * mib, 160 * mib));
        h.warn(&mut steady);
        assert!(steady.warnings.is_empty(), "{:?}", steady.warnings);
    }

    #[test]
    fn spans_serialize_as_before() {
        let bytes: Span = Span { before: None, after: Some(5) };
        assert_eq!(serde_json::to_string(&bytes).unwrap(), r#"{"before":null,"after":5}"#);
        assert_eq!(bytes.delta(), None);
        assert_eq!(Span { before: Some(7), after: Some(5) }.delta(), Some(-2));
        let flag = Span { before: false, after: true };
        assert_eq!(serde_json::to_string(&flag).unwrap(), r#"{"before":false,"after":true}"#);
        let rec = CellRecord { crate_loaded: flag, ..Default::default() };
        let v = serde_json::to_value(&rec).unwrap();
        assert_eq!(v["crate_loaded"], serde_json::json!({"before": false, "after": true}));
        assert_eq!(serde_json::from_value::<CellRecord>(v).unwrap(), rec);
    }
}
