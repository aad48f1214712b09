//! What a record shows: the one-line report, its details table, the `display_data` bundle.

use super::{CELL_MIME, CellRecord, CellStatus, Span};
use crate::notebook::protocol::Held;
use crate::record::component::Component;
use crate::render::{TEXT2, Table, escape, nowrap_units};
use crate::units::{iec, iec_delta};
use serde_json::Value;
use std::fmt::Write as _;

/// What a lost CUDA context means, for the cell in which it was first seen (the error's value
/// in gpumem-kernel, the message on stderr in the stock kernel): the fault, the call that
/// reported it, and that nothing on the device works from here on.
pub fn lost_message(l: &crate::device::LostContext, cell: u64) -> String {
    format!(
        "the CUDA context of this notebook's process is lost ({}), first reported by {} in cell {cell}: every later \
         call on the device fails",
        l.fault.what(),
        l.call
    )
}

/// Why the faulting launch may be earlier than the call that reported it, and how to pin it.
pub const LOST_ASYNC_HINT: &str = "CUDA reports a kernel's fault at a later call: the faulting launch may be earlier \
     in the cell. To pin it, `:env CUDA_LAUNCH_BLOCKING=1` (every launch then waits for its kernel) and run the cell \
     again.";

impl CellRecord {
    /// The line a person reads at a glance (text form; the HTML summary is the same words):
    /// the cell, the device (`sim` or `cuda:N`), the time, the allocator's allocated and reserved
    /// bytes with their change over the cell (and the cell's peak, where it went above both
    /// ends), every allocation of the process on the device only where it differs from reserved
    /// (other libraries allocated too), the CUDA pool and watched frameworks where they hold
    /// memory, the site holding the most, the device's free memory, then what went wrong. The
    /// details table has every number with its source, and a legend. The live line while a long
    /// cell runs (gpumem-kernel's `live`) shows the same quantities the same way
    /// ([`quantity`]).
    pub fn line(&self) -> String {
        let mut parts = vec![format!("[{}] {}", self.cell, short_device(&self.device))];
        if self.status == CellStatus::Refused {
            // Refused before it ran (the context was lost in an earlier cell; records of earlier
            // versions, which refused such cells): nothing to time.
            parts.push(format!(
                "✗ not run: the CUDA context is lost ({})",
                self.lost.as_ref().map_or("a kernel faulted", |l| l.fault.what())
            ));
            parts.push("restart the kernel's process to go on (variables are lost)".into());
            return parts.join(" · ");
        }
        parts.push(format_ms(self.wall_ms));
        // A lost context: its numbers can no longer be read; NVML's still can. The cell's host
        // code ran; what it asked of the device failed.
        if let Some(l) = &self.lost {
            parts.push(format!("✗ CUDA context lost ({}): device calls fail, host code runs", l.fault.what()));
            if let Some(p) = self.nvml.process.after {
                parts.push(format!("process {} (NVML)", iec(p)));
            }
            parts.push("restart the process to use the device again (variables are lost)".into());
            return parts.join(" · ");
        }
        let all = self.all_allocations.as_ref().filter(|a| a.is_tracked());
        match &self.allocator {
            Some(a) => {
                let peak = if a.peak_is_cell { "peak" } else { "peak since load" };
                parts.push(quantity("allocated", a.allocated.after, a.allocated.delta(), Some(a.peak_allocated), peak));
                parts.push(quantity("reserved", a.reserved.after, a.reserved.delta(), Some(a.peak_reserved), peak));
            }
            None => parts.push(allocator_absent(self.restarted && self.crate_loaded.before, self.crate_declared)),
        }
        if let Some(all) = all {
            let reserved = self.allocator.as_ref().and_then(|a| a.reserved.after);
            if reserved != all.place.after {
                parts.push(quantity("all allocations", all.place.after, all.delta(), all.place.peak, "peak"));
            }
        }
        if let Some(p) = &self.pool
            && (p.used.after.unwrap_or(0) > 0 || p.used_high.unwrap_or(0) > 0)
        {
            let mut q = quantity("CUDA pool", p.used.after, p.used.delta(), p.used_high, "peak");
            // What the pool keeps reserved beyond what is in use: the driver (and NVML) still
            // count it, whatever the allocations freed.
            let cached = p.reserved.after.zip(p.used.after).map_or(0, |(r, u)| r.saturating_sub(u));
            if cached >= 1 << 20 {
                q = match q.strip_suffix(')') {
                    Some(open) => format!("{open}, cached {})", iec(cached)),
                    None => format!("{q} (cached {})", iec(cached)),
                };
            }
            parts.push(q);
        }
        parts.extend(self.frameworks.iter().map(|f| f.line()));
        // The code holding the most (the allocator's cached free memory is no one's).
        let held = |t: &&crate::notebook::protocol::OwnerBytes| {
            t.function.as_deref() != Some(crate::notebook::protocol::CACHED_FREE)
        };
        if let Some(top) = all.and_then(|a| a.place.top.iter().find(held)) {
            parts.push(format!("top {}", top.site()));
        }
        if let Some(what) = all.and_then(|a| what_it_is(&a.place.by_component)) {
            parts.push(what);
        }
        // What NVML counts beyond every tracked allocation and the CUDA pool's cache, where it
        // is not nothing (a MiB of noise aside): the CUDA context, the kernels' code.
        if let Some(g) = self.nvml_gap().filter(|g| g.rest.unsigned_abs() >= 1 << 20) {
            parts.push(format!("{} CUDA context and modules (NVML)", iec_delta(g.rest)));
        }
        if !self.children.is_empty() {
            let total: u64 = self.children.iter().map(|c| c.used).sum();
            // One or two workers by name and pid; more by count (the details list each).
            let who = if self.children.len() <= 2 {
                let named: Vec<String> = self.children.iter().map(|c| format!("{} {}", c.name, c.pid)).collect();
                named.join(", ")
            } else {
                format!("{} processes", self.children.len())
            };
            parts.push(format!("child processes {} ({who})", iec(total)));
        }
        if let Some((free, _)) = self.device_free_total() {
            parts.push(format!("free {}", iec(free)));
        }
        if let Some(all) = all {
            for p in all.devices.iter().filter(|p| p.device != all.place.device && (p.after > 0 || p.peak > 0)) {
                let delta = p.before.map(|b| p.after as i64 - b as i64);
                let place = p.device.map_or("host pinned".to_string(), |d| format!("device {d} all allocations"));
                parts.push(quantity(&place, Some(p.after), delta, Some(p.peak), "peak"));
            }
        }
        if let Some(all) = self.all_allocations.as_ref().filter(|a| !a.is_tracked()) {
            parts.push(format!("tracking {}", all.tracking.split(':').next().unwrap_or("")));
        }
        let mut line = parts.join(" · ");
        if let Some(o) = &self.oom {
            let _ = write!(line, " · ✗ out of memory: asked for {}", iec(o.requested));
            if o.count > 1 {
                let _ = write!(line, " ({} failures)", o.count);
            }
            if let Some(f) = &o.files {
                let dir = std::path::Path::new(&f.html).parent().unwrap_or(std::path::Path::new(""));
                let _ = write!(line, " · snapshot then: {}", dir.display());
            }
        }
        if self.restarted {
            let why = self.restart_reason.as_deref().unwrap_or("child process replaced");
            let _ = write!(line, " · ⟳ restarted ({why}; variables lost)");
        }
        for u in &self.unsettled {
            let _ = write!(line, " · ⚠ {} did not settle: {}", u.key, u.error.as_deref().unwrap_or(""));
        }
        for w in &self.warnings {
            let _ = write!(line, " · ⚠ {w}");
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
        if let Some(o) = &self.oom {
            t.row([
                "out of memory".into(),
                "–".into(),
                iec(o.requested),
                "–".into(),
                "–".into(),
                format!("{} (the allocator, as it failed)", o.why),
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
            t.row([
                "this process (total)".into(),
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
                format!(
                    "= all allocations {} + CUDA pool cache {} + CUDA context and modules (no tracker sees them) {}",
                    iec_delta(g.tracked),
                    iec_delta(g.pool_cache),
                    iec_delta(g.rest)
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
        for c in &self.children {
            let source = match c.source.as_str() {
                "nvml" => "NVML, a process below the notebook's in the process tree",
                "simulated" => "the simulated device's process table, a process below the notebook's",
                other => other,
            };
            t.row([
                format!("child process {} (pid {}) on {}", c.name, c.pid, c.device),
                "–".into(),
                iec(c.used),
                "–".into(),
                "–".into(),
                source.to_string(),
            ]);
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

    /// The display_data bundle: text/plain, text/html, and the JSON record.
    pub fn display(&self) -> serde_json::Map<String, Value> {
        let line = self.line();
        let warn = !self.warnings.is_empty()
            || self.restarted
            || self.oom.is_some()
            || self.lost.is_some()
            || !self.unsettled.is_empty();
        let html = line_html(
            &line,
            "gpumem-report",
            warn,
            &self.oom_link().unwrap_or_default(),
            Some(&self.details().to_html()),
        );
        let mut m = serde_json::Map::new();
        m.insert("text/plain".into(), Value::String(line));
        m.insert("text/html".into(), Value::String(html));
        m.insert(CELL_MIME.into(), serde_json::to_value(self).unwrap_or(Value::Null));
        m
    }
}

/// What the line's words mean, under every details table.
pub(crate) const LEGEND: &str = " · allocated: blocks gpumem-nb's allocator handed out; reserved: the segments it holds from \
     the device (allocated + cached); all allocations: every allocation of the process on the device, whoever made \
     it (the allocator's segments, the CUDA pool, the driver, libraries), shown on the line when it differs from \
     reserved; (+x): the change over the cell; peak: the highest in the cell, where above both ends; top: the site \
     holding the most; free: the device's free memory";

/// A report line (or the live line) as HTML: the same words, in JupyterLab's code font and
/// secondary text colour (its theme variables, with fallbacks that read on white), numbers kept
/// with their units, and the details table, when given, under a disclosure triangle. `class`
/// names the element (`gpumem-report`, `gpumem-report gpumem-live`); `warn` marks the line
/// with a sign in the theme's warning colour; `extra` is HTML put after the words (a link).
pub fn line_html(line: &str, class: &str, warn: bool, extra: &str, details: Option<&str>) -> String {
    let words = nowrap_units(&escape(line));
    let words = if warn {
        format!("<span style=\"color:var(--jp-warn-color0,#a15c00);font-weight:bold\">⚠</span> {words}")
    } else {
        words
    };
    let style = format!(
        "font-family:var(--jp-code-font-family,monospace);font-size:var(--jp-code-font-size,12px);\
         color:{TEXT2};line-height:1.4"
    );
    match details {
        Some(details) => format!(
            "<div class=\"{class}\" style=\"{style}\"><details><summary style=\"cursor:pointer\">{words}{extra}</summary>\
             {details}</details></div>"
        ),
        None => format!("<div class=\"{class}\" style=\"{style}\">{words}{extra}</div>"),
    }
}

/// What the tracked bytes are, for the line: each component that holds or changed bytes,
/// largest first, with the change where the cell made one (`optimizer_state 128.00 MiB
/// (+128.00 MiB), parameter 64.00 MiB`); `None` when nothing but `other` and the allocator's
/// cache holds any (nothing was stamped or matched a rule: the line stays as it was).
fn what_it_is(parts: &[super::record::ComponentDelta]) -> Option<String> {
    let classified = |c: &&super::record::ComponentDelta| c.component.is_classified();
    if !parts.iter().filter(classified).any(|c| c.after > 0 || c.delta().is_some_and(|d| d != 0)) {
        return None;
    }
    let mut shown: Vec<&super::record::ComponentDelta> = parts
        .iter()
        .filter(|c| c.component != Held::Cached)
        .filter(|c| c.after > 0 || c.delta().is_some_and(|d| d != 0))
        .collect();
    shown.sort_by(|a, b| b.after.cmp(&a.after).then(a.component.key().cmp(b.component.key())));
    // A component the cell did not change shows its bytes alone (the line stays short).
    let items: Vec<String> = shown
        .iter()
        .map(|c| quantity(c.component.key(), Some(c.after), c.delta().filter(|d| *d != 0), None, ""))
        .collect();
    Some(format!("what: {}", items.join(", ")))
}

/// One quantity as the report line and the live line show it: `allocated 64.00 MiB (+16.00 MiB)`:
/// the value now (at the end of the cell, for a report) and its change since the cell began
/// (`±0 B` for none), with the highest it was in the cell (`peak` names it, e.g. `peak since
/// load`) only where that went above both ends. `n/a` when the value is unknown.
pub fn quantity(name: &str, now: Option<u64>, delta: Option<i64>, peak: Option<u64>, peak_name: &str) -> String {
    let Some(now) = now else { return format!("{name} n/a") };
    let mut more = Vec::new();
    if let Some(d) = delta {
        more.push(iec_delta(d));
    }
    let before = delta.map_or(now, |d| (now as i64 - d).max(0) as u64);
    if let Some(p) = peak.filter(|&p| p > now.max(before)) {
        more.push(format!("{peak_name} {}", iec(p)));
    }
    if more.is_empty() { format!("{name} {}", iec(now)) } else { format!("{name} {} ({})", iec(now), more.join(", ")) }
}

/// The device as the line names it: `sim` for the simulated device, `cuda:N` for a GPU (the
/// details table and the record have its full name).
pub fn short_device(device: &str) -> String {
    if device.ends_with("(simulated)") {
        "sim".into()
    } else if device.starts_with("cuda:") {
        device.split_whitespace().next().unwrap_or(device).to_string()
    } else {
        device.to_string()
    }
}

/// What the line says where the allocator has no numbers: a new child after a restart (the
/// crate loads again at its first use), a notebook that declared `:dep gpumem-nb` (it loads at
/// its first use: `:dep` only builds it), or one that did not.
pub fn allocator_absent(restarted_after_load: bool, declared: bool) -> String {
    if restarted_after_load {
        "allocator: new child, gpumem-nb loads again at its first use".into()
    } else if declared {
        "allocator: gpumem-nb loads at its first use".into()
    } else {
        "allocator n/a (gpumem-nb not in this notebook: `:dep gpumem-nb`)".into()
    }
}

/// Milliseconds in the crate's one duration format ([`crate::units::format_duration`]):
/// `850 µs`, `12.3 ms`, `1.23 s`, `2 min 5 s`.
pub fn format_ms(ms: f64) -> String {
    crate::units::format_duration(std::time::Duration::from_secs_f64(ms.max(0.0) / 1e3))
}

#[cfg(test)]
mod tests {
    use super::super::{AllAllocations, PlaceAll, PoolPart};
    use super::*;

    /// A cell on a GPU where NVML grew by 128 MiB: tracked allocations +139.80 MiB, of which the
    /// CUDA pool reused 11.80 MiB it had cached; and one where 9.37 MiB more than that is
    /// NVML's alone (a kernel's first launch loads its module).
    #[test]
    fn nvml_s_change_is_explained_and_its_rest_named_only_when_not_nothing() {
        let mib = 1u64 << 20;
        let rec = |nvml_after: u64| CellRecord {
            cell: 9,
            device: "cuda:0 NVIDIA H200".into(),
            nvml: super::super::NvmlPart {
                process: Span { before: Some(1000 * mib), after: Some(nvml_after) },
                ..Default::default()
            },
            all_allocations: Some(AllAllocations {
                tracking: "cupti".into(),
                place: PlaceAll {
                    before: Some(500 * mib),
                    after: Some(500 * mib + 139 * mib + 4 * mib / 5),
                    ..Default::default()
                },
                ..Default::default()
            }),
            pool: Some(PoolPart {
                used: Span { before: Some(100 * mib), after: Some(100 * mib + 139 * mib + 4 * mib / 5) },
                reserved: Span { before: Some(200 * mib), after: Some(328 * mib) },
                ..Default::default()
            }),
            ..Default::default()
        };
        let exact = rec(1128 * mib);
        let g = exact.nvml_gap().unwrap();
        assert_eq!((g.nvml, g.pool_cache, g.rest), (128 * mib as i64, -(11 * mib as i64 + 4 * mib as i64 / 5), 0));
        assert!(!exact.line().contains("CUDA context"), "{}", exact.line());
        let loaded = rec(1128 * mib + 9 * mib + 3 * mib / 8);
        assert_eq!(loaded.nvml_gap().unwrap().rest, 9 * mib as i64 + 3 * mib as i64 / 8);
        assert!(loaded.line().contains(" · +9.38 MiB CUDA context and modules (NVML)"), "{}", loaded.line());
        // The pool's cache is on the line: the driver counts it, whatever was freed.
        assert!(
            loaded.line().contains(" · CUDA pool 239.80 MiB (+139.80 MiB, cached 88.20 MiB) · "),
            "{}",
            loaded.line()
        );
        let details = loaded.details().to_text();
        assert!(details.contains("= all allocations +139.80 MiB + CUDA pool cache -11.80 MiB"), "{details}");
        // The first cell that uses the GPU (NVML had nothing of the process before, the crate
        // was not loaded): the CUDA context is the rest, the pool empty before.
        let mut first = rec(0);
        first.nvml.process = Span { before: Some(0), after: Some(532 * mib) };
        first.all_allocations.as_mut().unwrap().place.before = Some(0);
        first.all_allocations.as_mut().unwrap().place.after = Some(2 * mib);
        first.pool = Some(PoolPart {
            used: Span { before: None, after: Some(0) },
            reserved: Span { before: None, after: Some(0) },
            ..Default::default()
        });
        assert_eq!(first.nvml_gap().unwrap().rest, 530 * mib as i64);
        assert!(first.line().contains(" · +530.00 MiB CUDA context and modules (NVML)"), "{}", first.line());
    }

    /// A cell's workers: one or two by name and pid on the line, more by count; each in the
    /// details with its bytes and where the figure comes from.
    #[test]
    fn child_processes_are_named_on_the_line_and_listed_in_the_details() {
        let child = |pid: u32, used: u64| crate::notebook::children::ChildProcess {
            pid,
            name: "gpumem-demo".into(),
            device: "sim-0".into(),
            used,
            source: "simulated".into(),
        };
        let mut rec = CellRecord { cell: 2, children: vec![child(41, 48 << 20)], ..Default::default() };
        assert!(rec.line().contains(" · child processes 48.00 MiB (gpumem-demo 41)"), "{}", rec.line());
        rec.children.push(child(42, 16 << 20));
        assert!(rec.line().contains(" · child processes 64.00 MiB (gpumem-demo 41, gpumem-demo 42)"), "{}", rec.line());
        rec.children.push(child(43, 1 << 20));
        assert!(rec.line().contains(" · child processes 65.00 MiB (3 processes)"), "{}", rec.line());
        let details = rec.details().to_text();
        for pid in [41, 42, 43] {
            assert!(details.contains(&format!("child process gpumem-demo (pid {pid}) on sim-0")), "{details}");
        }
        assert!(details.contains("the simulated device's process table"), "{details}");
    }

    /// A lost context: the line names it and shows NVML's last reading instead of numbers the
    /// allocator can no longer read; a cell an earlier version refused for it says it did not run.
    #[test]
    fn a_lost_context_is_named_instead_of_numbers() {
        let lost = crate::device::LostContext {
            fault: crate::device::Fault::IllegalAddress,
            call: "cuMemcpyDtoHAsync_v2".into(),
        };
        let mut rec = CellRecord {
            cell: 3,
            device: "cuda:0 NVIDIA H200".into(),
            wall_ms: 12.0,
            lost: Some(lost.clone()),
            status: CellStatus::Lost,
            allocator: Some(Default::default()),
            nvml: super::super::NvmlPart {
                process: Span { before: None, after: Some(788 << 20) },
                ..Default::default()
            },
            ..Default::default()
        };
        let line = rec.line();
        assert!(
            line.contains(
                "✗ CUDA context lost (illegal address): device calls fail, host code runs · process 788.00 MiB (NVML)"
            ),
            "{line}"
        );
        assert!(!line.contains("allocated"), "{line}");
        rec.status = CellStatus::Refused;
        let line = rec.line();
        assert!(line.starts_with("[3] cuda:0 · ✗ not run: the CUDA context is lost (illegal address)"), "{line}");
        assert!(
            lost_message(&lost, 3).contains("lost (illegal address), first reported by cuMemcpyDtoHAsync_v2 in cell 3")
        );
    }
}
