//! The details table under a cell's line: every number of the record with its source, one row
//! per place and source (each GPU the process is on, the host's pinned memory, child
//! processes), and NVML's change on each device explained by what was tracked there.

use super::line::{LEGEND, allocator_absent, format_ms};
use super::{CellRecord, Span};
use crate::notebook::protocol::Held;
use crate::record::component::Component;
use crate::render::Table;
use crate::units::{iec, iec_delta};

impl CellRecord {
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
                for c in &p.by_component {
                    t.row([
                        format!("  {}", c.component),
                        b(c.before),
                        iec(c.after),
                        c.delta().map_or("–".into(), iec_delta),
                        c.peak.map_or("–".into(), iec),
                        if c.component == Held::Cached {
                            "tracked: the allocator's cached free memory".into()
                        } else {
                            "tracked, what it is (stamp, or rules on its stack)".into()
                        },
                    ]);
                }
                for k in &p.kept {
                    t.row([
                        format!("  kept: {} at {}", k.component.unwrap_or(Component::Other), k.site()),
                        "–".into(),
                        iec(k.bytes),
                        "–".into(),
                        "–".into(),
                        "tracked: an activation or temporary still live after the code that made it".into(),
                    ]);
                }
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
                    for (i, o) in p.top.iter().enumerate() {
                        let head = if i == 0 { "  top sites" } else { "" };
                        t.row([
                            head.into(),
                            "–".into(),
                            iec(o.bytes),
                            "–".into(),
                            "–".into(),
                            format!("{} ({})", o.site(), o.owner),
                        ]);
                    }
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
            if let Some(p) = &a.explain {
                t.row([
                    "  reserved, explained".into(),
                    "–".into(),
                    iec(p.reserved),
                    "–".into(),
                    "–".into(),
                    format!(
                        "requested {} + rounding {} + pending frees {} + cached free {}; empty_cache() returns {}, \
                         largest free block {} (%gpumem explain)",
                        iec(p.requested),
                        iec(p.rounding),
                        iec(p.pending_free),
                        iec(p.cached_bytes()),
                        iec(p.releasable),
                        iec(p.largest_free_small.max(p.largest_free_large))
                    ),
                ]);
            }
        } else {
            t.row([
                "allocator".to_string(),
                "–".into(),
                "–".into(),
                "–".into(),
                "–".into(),
                allocator_absent(self.restarted && self.crate_loaded.before, self.crate_declared),
            ]);
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
        if let Some(v) = &self.variables {
            v.rows(&mut t);
        }
        if let Some(o) = &self.oom {
            t.row([
                "out of memory".into(),
                "–".into(),
                iec(o.requested),
                "–".into(),
                "–".into(),
                match &o.files {
                    Some(f) => format!("{} (the allocator, as it failed); snapshot then: {}", o.why, f.html),
                    None => format!("{} (the allocator, as it failed)", o.why),
                },
            ]);
        }
        if let Some(why) = &self.nvml.unavailable {
            t.row([
                "this process (total)".into(),
                "–".into(),
                "–".into(),
                "–".into(),
                "–".into(),
                format!("NVML: {why}"),
            ]);
        } else {
            // On several GPUs, each device's row says which it is.
            let label = match self.nvml_devices.iter().find(|n| n.uuid == self.nvml.uuid).and_then(|n| n.device) {
                Some(d) => format!("this process, device {d} (total)"),
                None => "this process (total)".into(),
            };
            t.row([
                label,
                b(self.nvml.process.before),
                b(self.nvml.process.after),
                d(&self.nvml.process),
                "–".into(),
                self.sources.process.clone(),
            ]);
        }
        let held = |s: fn(&Span) -> Option<u64>| -> Option<u64> {
            let proc_ = s(&self.nvml.process)?;
            let alloc = self.allocator.as_ref().and_then(|a| s(&a.reserved)).unwrap_or(0);
            let pool = self.pool.as_ref().and_then(|p| s(&p.reserved)).unwrap_or(0);
            Some(proc_.saturating_sub(alloc + pool))
        };
        let rest = Span { before: held(|s| s.before), after: held(|s| s.after) };
        if let Some(g) = self.nvml_gap() {
            t.row([
                "NVML's change, explained".into(),
                "–".into(),
                "–".into(),
                iec_delta(g.nvml),
                "–".into(),
                self.explained(
                    self.all_allocations.as_ref().and_then(|a| a.place.device),
                    self.nvml.uuid.as_deref(),
                    &g,
                ),
            ]);
        }
        if self.nvml.unavailable.is_none() {
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
        }
        for l in &self.local_memory {
            let main = self.nvml.uuid.as_deref().is_some_and(|u| l.uuid.eq_ignore_ascii_case(u));
            let name = if main && self.local_memory.len() == 1 {
                "kernel stacks".to_string()
            } else {
                format!("kernel stacks, device {}", l.device)
            };
            let span = Span { before: l.bytes(|s| s.before), after: l.bytes(|s| s.after) };
            t.row([
                name,
                b(span.before),
                b(span.after),
                d(&span),
                "–".into(),
                format!(
                    "driver: each thread's stack ({} B, cuCtxGetLimit) × {} threads (SMs × threads per SM); NVML counts it, no tracker sees it",
                    l.stack_bytes.after.map_or("?".into(), crate::units::group_digits),
                    crate::units::group_digits(l.resident_threads)
                ),
            ]);
        }
        for part in self.nvml_devices.iter().filter(|n| n.uuid != self.nvml.uuid) {
            let name = part.device.map_or_else(|| part.uuid.clone().unwrap_or_default(), |d| format!("device {d}"));
            t.row([
                format!("this process, {name} (total)"),
                b(part.process.before),
                b(part.process.after),
                d(&part.process),
                "–".into(),
                format!("NVML per-process ({})", part.uuid.as_deref().unwrap_or("?")),
            ]);
            if let Some(g) = self.nvml_gap_on(part) {
                t.row([
                    format!("NVML's change on {name}, explained"),
                    "–".into(),
                    "–".into(),
                    iec_delta(g.nvml),
                    "–".into(),
                    self.explained(part.device, part.uuid.as_deref(), &g),
                ]);
            }
            t.row([
                format!("other processes on {name}"),
                "–".into(),
                b(part.others_after),
                "–".into(),
                "–".into(),
                "NVML, every other pid on the device".into(),
            ]);
        }
        for c in &self.children {
            t.row(c.details_row());
        }
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
            "cell {} · {} · child pid {} · wall {} · kernel hooks {}",
            self.cell,
            self.device,
            self.child_pid.map_or("?".into(), |p| p.to_string()),
            format_ms(self.wall_ms),
            crate::units::format_duration_us(self.hook_us as i64)
        );
        cap.push_str(LEGEND);
        t.caption(cap)
    }

    /// NVML's change on one device in words: every tracked allocation there (with the
    /// components that changed and the site holding the most: `NCCL ← cell 3`), the CUDA pool's
    /// cache, and the rest no tracker sees.
    fn explained(&self, device: Option<i32>, uuid: Option<&str>, g: &super::record::NvmlGap) -> String {
        let place = self.all_allocations.as_ref().and_then(|a| a.devices.iter().find(|p| p.device == device));
        let mut what: Vec<String> = place
            .into_iter()
            .flat_map(|p| &p.by_component)
            .filter_map(|c| Some((c.component, c.delta().filter(|&x| x != 0)?)))
            .map(|(c, x)| format!("{c} {}", iec_delta(x)))
            .collect();
        // The site holding the most of what this cell made there (not an earlier cell's).
        let made_here = |t: &&crate::notebook::protocol::OwnerBytes| {
            t.function.as_deref() != Some(crate::notebook::protocol::CACHED_FREE) && t.cell == Some(self.cell)
        };
        if let Some(top) = place.and_then(|p| p.top.iter().find(made_here)) {
            what.push(format!("most by {}", top.site()));
        }
        let what = if what.is_empty() { String::new() } else { format!(" ({})", what.join(", ")) };
        // The driver's local memory for kernels' stacks, where it changed: with the stack sizes.
        let local = self
            .local_memory_part(uuid)
            .filter(|_| g.local_memory != 0)
            .map(|l| {
                let b = |x: Option<u64>| x.map_or("?".into(), crate::units::group_digits);
                format!(
                    " + kernel stacks (driver: {} → {} B a thread × {} threads) {}",
                    b(l.stack_bytes.before),
                    b(l.stack_bytes.after),
                    crate::units::group_digits(l.resident_threads),
                    iec_delta(g.local_memory)
                )
            })
            .unwrap_or_default();
        format!(
            "= all allocations {}{what} + CUDA pool cache {}{local} + CUDA context and modules (no tracker sees them) {}",
            iec_delta(g.tracked),
            iec_delta(g.pool_cache),
            iec_delta(g.rest)
        )
    }
}
