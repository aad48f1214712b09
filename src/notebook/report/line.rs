//! What a record shows: the one-line report, its details table, the `display_data` bundle.

use super::fit::{Keep, Parts};
use super::{AllAllocations, CELL_MIME, CellRecord, CellStatus, PoolPart, Span};
use crate::notebook::protocol::Held;
use crate::render::{TEXT2, escape, nowrap_units};
use crate::units::{iec3, iec3_delta};
use serde_json::Value;

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
    /// The line a person reads at a glance (text form; the HTML summary is the same words), at
    /// most [`LINE_WIDTH`] characters: the cell, the device (`sim` or `cuda:N`), the time, the
    /// allocator's allocated and reserved bytes with their change over the cell (and the cell's
    /// peak, where it went above both ends), what went wrong; then, as room allows, in this order
    /// of importance: what the tracked bytes are (the components by their largest changes, and
    /// the one that made the cell's peak), every allocation of the process on the device where it
    /// differs from reserved, the CUDA pool and watched frameworks, the site holding the most,
    /// child processes, what NVML counts beyond, the device's free memory. What does not fit is in
    /// the details table, which has every number with its source, and a legend. Numbers have three
    /// significant digits here (the details and the record are exact). The live line while a long
    /// cell runs (gpumem-kernel's `live`) shows the same quantities the same way ([`quantity`]).
    pub fn line(&self) -> String {
        self.line_within(LINE_WIDTH, false)
    }

    /// [`Self::line`] at most `width` characters (what fits of its parts, by importance).
    /// `linked`: the out-of-memory snapshot is linked after the words (HTML), not named in them.
    fn line_within(&self, width: usize, linked: bool) -> String {
        let head = format!("[{}] {}", self.cell, short_device(&self.device));
        if self.status == CellStatus::Refused {
            // Refused before it ran (the context was lost in an earlier cell; records of earlier
            // versions, which refused such cells): nothing to time.
            return [
                head,
                format!(
                    "✗ not run: the CUDA context is lost ({})",
                    self.lost.as_ref().map_or("a kernel faulted", |l| l.fault.what())
                ),
                "restart the kernel's process to go on (variables are lost)".into(),
            ]
            .join(" · ");
        }
        let mut parts = Parts::default();
        parts.keep(head);
        parts.keep(format_ms(self.wall_ms));
        // A lost context: its numbers can no longer be read; NVML's still can. The cell's host
        // code ran; what it asked of the device failed.
        if let Some(l) = &self.lost {
            parts.keep_variants(vec![
                format!("✗ CUDA context lost ({}): device calls fail, host code runs", l.fault.what()),
                format!("✗ CUDA context lost ({}): host code runs", l.fault.what()),
            ]);
            if let Some(p) = self.nvml.process.after {
                parts.add(Keep::Nvml, format!("process {} (NVML)", iec3(p)));
            }
            parts.keep_variants(vec![
                "restart the process to use the device again (variables are lost)".into(),
                "restart the process to go on".into(),
            ]);
            return parts.fit(width);
        }
        let all = self.all_allocations.as_ref().filter(|a| a.is_tracked());
        // Who holds the memory leads: each owner of the notebook's device with its change, the
        // one that changed most first (always kept); gpumem-nb's allocator by its own figures
        // where it holds memory.
        let allocator_holds = self.allocator.as_ref().is_some_and(|a| !allocator_unused(a));
        let mut owners = lead_owners(all, allocator_holds);
        if allocator_holds {
            let ours = owners.iter().position(|o| o.owner == crate::notebook::protocol::GPUMEM_NB);
            let change = ours.map_or(0, |i| owners[i].change);
            let at = owners.iter().position(|o| o.change < change).unwrap_or(owners.len());
            owners.insert(at.min(ours.unwrap_or(usize::MAX)), LeadOwner::allocator(change));
            owners.retain(|o| o.allocator || o.owner != crate::notebook::protocol::GPUMEM_NB);
        }
        if owners.is_empty() {
            parts.keep(match (all, self.allocator.as_ref()) {
                // Tracked, and nothing of the process on the device: one phrase.
                (Some(_), _) => "no device memory".into(),
                (None, Some(_)) => "allocator unused (0 B)".into(),
                (None, None) => match self.nvml.process.after {
                    Some(p) => format!("process {} (NVML)", iec3(p)),
                    None => "no device memory seen".into(),
                },
            });
        }
        for (i, o) in owners.iter().enumerate() {
            if o.allocator {
                self.allocator_parts(&mut parts, all, i == 0);
                continue;
            }
            let full = quantity(&o.owner, Some(o.after), o.delta, o.peak, "peak");
            let short = match o.delta {
                Some(d) if d != 0 => format!("{} {}", o.owner, iec3_delta(d)),
                _ => format!("{} {}", o.owner, iec3(o.after)),
            };
            let keep = if i == 0 { Keep::Always } else { Keep::Owner };
            parts.add_forms(vec![(keep, full), (keep, short)]);
        }
        // What went wrong comes right after the allocator's numbers.
        if let Some(o) = &self.oom {
            let count = if o.count > 1 { format!(" ({} failures)", o.count) } else { String::new() };
            // In the unit of the error's own message (PyTorch's: GiB at most).
            let asked = crate::units::format_size(o.requested);
            parts.keep_variants(vec![
                format!("✗ out of memory: asked for {asked}{count}"),
                format!("✗ OOM: asked for {asked}{count}"),
            ]);
            // Where its snapshot is: its last two folders (the whole path in the details; the
            // HTML line links it).
            if let Some(f) = o.files.as_ref().filter(|_| !linked) {
                let dir = std::path::Path::new(&f.html).parent().unwrap_or(std::path::Path::new(""));
                let tail: Vec<_> = dir.iter().rev().take(2).collect();
                let tail: Vec<_> = tail.iter().rev().map(|c| c.to_string_lossy()).collect();
                parts.add(Keep::Flag, format!("snapshot then: …/{}", tail.join("/")));
            }
        }
        if self.restarted {
            let why = self.restart_reason.as_deref().unwrap_or("child process replaced");
            parts.add_forms(vec![
                (Keep::Restart, format!("⟳ restarted ({why}; variables lost)")),
                (Keep::FlagShort, "⟳ restarted".into()),
            ]);
        }
        for u in &self.unsettled {
            parts.add(Keep::Flag, format!("⚠ {} did not settle: {}", u.key, u.error.as_deref().unwrap_or("")));
        }
        for w in &self.warnings {
            let short = w.split(':').next().unwrap_or(w);
            parts.add_forms(vec![(Keep::Flag, format!("⚠ {w}")), (Keep::FlagShort, format!("⚠ {short}"))]);
        }
        if let Some(all) = all {
            // Every allocation together, where more than one owner holds them (the allocator's
            // reserved bytes are its share).
            let holders = all.place.by_owner.iter().filter(|o| o.after > 0).count();
            let reserved = self.allocator.as_ref().and_then(|a| a.reserved.after);
            let beyond_allocator = allocator_holds && reserved != all.place.after;
            // Beyond the allocator's reserved bytes it says what they leave out; beside several
            // owners on the line, only their sum (it goes before any of them).
            let keep = if beyond_allocator || all.place.by_owner.is_empty() { Keep::All } else { Keep::Owner };
            let unnamed = all.place.by_owner.is_empty() && reserved.unwrap_or(0) != all.place.after.unwrap_or(0);
            if holders > 1 || beyond_allocator || unnamed {
                parts.add(keep, quantity("all allocations", all.place.after, all.delta(), all.place.peak, "peak"));
            }
        }
        if let Some(p) = &self.pool {
            parts.add_forms(pool_forms(p, all.and_then(AllAllocations::delta)));
        }
        for f in &self.frameworks {
            // Its stamps' changes go first, then what it keeps cached; what is in use stays as
            // long as a framework's figures do.
            parts.add_forms(vec![
                (Keep::Framework, f.line()),
                (Keep::Framework, f.short_line()),
                (Keep::FrameworkShort, f.shortest_line()),
            ]);
        }
        if let Some(v) = &self.variables {
            let forms = v.line_forms();
            let n = forms.len();
            // Kept as the components of tracked memory are: the longer forms as long as
            // `what:`, the last (the largest change alone) to the end of `what:`'s shortest,
            // after a framework's stamps and cache are dropped and before its in-use figure is.
            parts.add_forms(
                forms
                    .into_iter()
                    .enumerate()
                    .map(|(i, f)| (if i + 1 == n { Keep::WhatShortest } else { Keep::What }, f))
                    .collect(),
            );
        }
        if let Some(all) = all {
            parts.add_forms(what_it_is(&all.place.by_component));
        }
        // The code holding the most (the allocator's cached free memory is no one's).
        let held = |t: &&crate::notebook::protocol::OwnerBytes| {
            t.function.as_deref() != Some(crate::notebook::protocol::CACHED_FREE)
        };
        if let Some(top) = all.and_then(|a| a.place.top.iter().find(held)) {
            parts.add(Keep::Top, format!("top {}", top.site()));
        }
        // What NVML counts beyond every tracked allocation and the CUDA pool's cache.
        if let Some(g) = self.nvml_gap() {
            g.add_to(&mut parts, "");
        }
        let forms = crate::notebook::children::line_forms(&self.children);
        parts.add_forms(forms.into_iter().map(|f| (Keep::Children, f)).collect());
        if let Some((free, _)) = self.device_free_total() {
            parts.add(Keep::Free, format!("free {}", iec3(free)));
        }
        if let Some(all) = all {
            // The other GPU that changed most keeps its change on the line longest; the rest are in
            // the details when the line is full.
            let change = |p: &super::PlaceAll| p.before.map_or(0, |b| (p.after as i64 - b as i64).unsigned_abs());
            let largest = all
                .devices
                .iter()
                .filter(|p| p.device.is_some() && p.device != all.place.device)
                .max_by_key(|p| change(p))
                .and_then(|p| p.device);
            for p in all.devices.iter().filter(|p| p.device != all.place.device && (p.after > 0 || p.peak > 0)) {
                let delta = p.before.map(|b| p.after as i64 - b as i64);
                let Some(d) = p.device else {
                    parts.add(Keep::Devices, quantity("host pinned", Some(p.after), delta, Some(p.peak), "peak"));
                    continue;
                };
                // Another GPU the cell used: its change stays on the line as long as every
                // allocation's does, in its short form once the line is full.
                let mut forms = vec![(
                    Keep::Devices,
                    quantity(&format!("device {d} all allocations"), Some(p.after), delta, Some(p.peak), "peak"),
                )];
                if let Some(delta) = delta.filter(|&x| x != 0) {
                    let keep = if Some(d) == largest { Keep::Flag } else { Keep::All };
                    forms.push((keep, format!("{} {}", other_device(&self.device, d), iec3_delta(delta))));
                }
                parts.add_forms(forms);
            }
        }
        // What NVML counts on each other device beyond what was tracked there.
        for part in self.nvml_devices.iter().filter(|n| n.device.is_some() && n.uuid != self.nvml.uuid) {
            if let (Some(d), Some(g)) = (part.device, self.nvml_gap_on(part)) {
                g.add_to(&mut parts, &format!("cuda:{d} "));
            }
        }
        if let Some(all) = self.all_allocations.as_ref().filter(|a| !a.is_tracked()) {
            parts.add(Keep::Nvml, format!("tracking {}", all.tracking.split(':').next().unwrap_or("")));
        }
        parts.fit(width)
    }

    /// gpumem-nb's allocator's figures on the line: allocated (with the component that made the
    /// cell's peak) and reserved. `first`: it leads the line (always kept).
    fn allocator_parts(&self, parts: &mut Parts, all: Option<&super::AllAllocations>, first: bool) {
        let Some(a) = &self.allocator else { return };
        let peak = if a.peak_is_cell { "peak" } else { "peak since load" };
        let mut allocated = quantity("allocated", a.allocated.after, a.allocated.delta(), Some(a.peak_allocated), peak);
        // The component that made the peak, where the line shows one.
        if let Some(c) = all
            .filter(|all| {
                all.place
                    .by_component
                    .iter()
                    .any(|c| c.component.is_classified() && (c.after > 0 || c.peak.unwrap_or(0) > 0))
            })
            .and_then(|all| peak_component(&all.place.by_component))
            && let Some(open) = allocated.strip_suffix(')').filter(|o| o.contains(peak))
        {
            allocated = format!("{open} by {c})");
        }
        if first {
            parts.keep(allocated);
        } else {
            parts.add(Keep::Owner, allocated);
        }
        parts.add_forms(vec![
            (Keep::Reserved, quantity("reserved", a.reserved.after, a.reserved.delta(), Some(a.peak_reserved), peak)),
            (Keep::ReservedShort, quantity("reserved", a.reserved.after, None, None, peak)),
        ]);
    }

    /// The out-of-memory snapshot's page, as a link relative to the working directory (the
    /// notebook's) when it is below it.
    fn oom_link(&self) -> Option<String> {
        let html = self.oom.as_ref()?.files.as_ref()?.html.clone();
        let cwd = std::env::current_dir().unwrap_or_default();
        let href = std::path::Path::new(&html).strip_prefix(&cwd).map_or(html.clone(), |p| p.display().to_string());
        Some(format!(" <a href=\"{}\" target=\"_blank\">{OOM_LINK_TEXT}</a>", escape(&href)))
    }

    /// The display_data bundle: text/plain, text/html, and the JSON record.
    pub fn display(&self) -> serde_json::Map<String, Value> {
        let warn = !self.warnings.is_empty()
            || self.restarted
            || self.oom.is_some()
            || self.lost.is_some()
            || !self.unsettled.is_empty();
        // As a person sees it: the sign before the words and the link after them count too.
        let link = self.oom_link();
        let extra = usize::from(warn) * 2 + link.as_ref().map_or(0, |_| OOM_LINK_TEXT.chars().count() + 1);
        let linked = self.line_within(LINE_WIDTH - extra, link.is_some());
        let html =
            line_html(&linked, "gpumem-report", warn, &link.unwrap_or_default(), Some(&self.details().to_html()));
        let line = self.line();
        let mut m = serde_json::Map::new();
        m.insert("text/plain".into(), Value::String(line));
        m.insert("text/html".into(), Value::String(html));
        m.insert(CELL_MIME.into(), serde_json::to_value(self).unwrap_or(Value::Null));
        m
    }
}

/// Whether nothing of the cell (or before it) went through gpumem-nb's allocator.
fn allocator_unused(a: &super::AllocatorPart) -> bool {
    [a.allocated.after, a.reserved.after].iter().all(|v| *v == Some(0))
        && a.peak_allocated == 0
        && a.peak_reserved == 0
        && a.reserved.delta().unwrap_or(0) == 0
}

/// One owner the line leads with.
struct LeadOwner {
    owner: String,
    after: u64,
    delta: Option<i64>,
    peak: Option<u64>,
    /// |change| over the cell: the order (largest first).
    change: u64,
    /// gpumem-nb's allocator, shown by its own figures.
    allocator: bool,
}

impl LeadOwner {
    fn allocator(change: u64) -> LeadOwner {
        LeadOwner {
            owner: crate::notebook::protocol::GPUMEM_NB.into(),
            after: 0,
            delta: None,
            peak: None,
            change,
            allocator: true,
        }
    }
}

/// The owners of the notebook's device the line names: each that holds memory after the cell
/// or changed in it, the largest change first (then the most held). The rule when several
/// change and the line is full: the one that changed most is always kept (shortened to its
/// change), and the others are left out smallest change first, after the device's free
/// memory, NVML's figures, other devices, the top site, worker processes and the CUDA pool,
/// before the components; the details table has every owner.
fn lead_owners(all: Option<&super::AllAllocations>, allocator_holds: bool) -> Vec<LeadOwner> {
    let Some(all) = all else { return Vec::new() };
    let mut out: Vec<LeadOwner> = all
        .place
        .by_owner
        .iter()
        .filter(|o| o.after > 0 || o.delta().is_some_and(|d| d != 0) || o.peak.unwrap_or(0) > o.after)
        .filter(|o| !(allocator_holds && o.owner == crate::notebook::protocol::GPUMEM_NB && o.after == 0))
        .map(|o| LeadOwner {
            owner: o.owner.clone(),
            after: o.after,
            delta: o.delta(),
            peak: o.peak,
            change: o.delta().unwrap_or(o.after as i64).unsigned_abs(),
            allocator: false,
        })
        .collect();
    out.sort_by(|a, b| b.change.cmp(&a.change).then(b.after.cmp(&a.after)).then(a.owner.cmp(&b.owner)));
    out
}

/// The words of the out-of-memory snapshot's link after the line.
const OOM_LINK_TEXT: &str = "open the snapshot";

/// What the line's words mean, under every details table.
pub(crate) const LEGEND: &str = " · candle, burn/cubecl, cudarc, cuBLAS, …: what that framework or library holds \
     on the device (who made each allocation, from its stack); allocated: blocks gpumem-nb's allocator handed out; \
     reserved: the segments it holds from the device (allocated + cached); all allocations: every allocation of the \
     process on the device, whoever made it, shown on the line when several hold memory or it differs from \
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

/// The most characters a report line (and the live line) takes: what does not fit is in the
/// details table.
pub const LINE_WIDTH: usize = 120;

/// What the tracked bytes are, for the line, in forms from richest to shortest: the components
/// the cell changed, by their largest changes (`what: optimizer_state +512 MiB, gradient +256
/// MiB`), or, where it changed no named one, what they hold, largest first. Empty when nothing but
/// `other` and the allocator's cache holds any (nothing was stamped or matched a rule: the line
/// stays as it was). The details table has every component.
fn what_it_is(parts: &[super::ComponentDelta]) -> Vec<(Keep, String)> {
    let classified = |c: &&super::ComponentDelta| c.component.is_classified();
    if !parts.iter().filter(classified).any(|c| c.after > 0 || c.delta().is_some_and(|d| d != 0)) {
        return Vec::new();
    }
    let own: Vec<&super::ComponentDelta> = parts.iter().filter(|c| c.component != Held::Cached).collect();
    let mut changed: Vec<(&super::ComponentDelta, i64)> =
        own.iter().filter_map(|c| Some((*c, c.delta().filter(|d| *d != 0)?))).collect();
    changed
        .sort_by(|a, b| b.1.unsigned_abs().cmp(&a.1.unsigned_abs()).then(a.0.component.key().cmp(b.0.component.key())));
    // Where no named component changed (only untagged bytes did, or nothing), what is held says
    // more: largest first, with its change where it made one.
    let items: Vec<String> = if !changed.iter().any(|(c, _)| c.component.is_classified()) {
        let mut held: Vec<&&super::ComponentDelta> = own.iter().filter(|c| c.after > 0).collect();
        held.sort_by(|a, b| b.after.cmp(&a.after).then(a.component.key().cmp(b.component.key())));
        held.iter()
            .map(|c| match c.delta().filter(|d| *d != 0) {
                Some(d) => format!("{} {} ({})", c.component.label(), iec3(c.after), iec3_delta(d)),
                None => format!("{} {}", c.component.label(), iec3(c.after)),
            })
            .collect()
    } else {
        changed.iter().map(|(c, d)| format!("{} {}", c.component.label(), iec3_delta(*d))).collect()
    };
    (1..=items.len().min(3))
        .rev()
        .map(|n| {
            let more = if items.len() > n { ", …" } else { "" };
            let keep = if n == 1 { Keep::WhatShortest } else { Keep::What };
            (keep, format!("what: {}{more}", items[..n].join(", ")))
        })
        .collect()
}

/// The component that made the cell's peak: the one that rose most above both its ends (a
/// MiB at least), e.g. the activations a step freed.
fn peak_component(parts: &[super::ComponentDelta]) -> Option<&'static str> {
    let rise =
        |c: &&super::ComponentDelta| c.peak.map_or(0, |p| p.saturating_sub(c.after.max(c.before.unwrap_or(c.after))));
    parts
        .iter()
        .filter(|c| c.component != Held::Cached)
        .filter(|c| rise(c) >= 1 << 20)
        .max_by_key(|c| rise(c))
        .map(|c| c.component.label())
}

/// The CUDA pool on the line: what is in use, with what it keeps cached beyond (the driver and
/// NVML count that, whatever was freed). Where the cache itself changed by 1 MiB or more (a
/// dropped tensor kept, or `%gpumem trim` giving it back) the change is said, kept as long as
/// every allocation's where it is the larger of the two (`tracked`: every allocation's change).
fn pool_forms(p: &PoolPart, tracked: Option<i64>) -> Vec<(Keep, String)> {
    let cache = |at: fn(&Span) -> Option<u64>| Some(at(&p.reserved)?.saturating_sub(at(&p.used)?));
    let cached = cache(|s| s.after).unwrap_or(0);
    let change = cache(|s| s.after)
        .zip(cache(|s| s.before))
        .map(|(a, b)| a as i64 - b as i64)
        .filter(|c| c.unsigned_abs() >= 1 << 20);
    let used = p.used.after.unwrap_or(0) > 0 || p.used_high.unwrap_or(0) > 0;
    if !used && change.is_none() {
        return Vec::new();
    }
    let q = quantity("CUDA pool", p.used.after, p.used.delta(), p.used_high, "peak");
    let Some(change) = change else {
        if cached < 1 << 20 {
            return vec![(Keep::Pool, q)];
        }
        let q = match q.strip_suffix(')') {
            Some(open) => format!("{open}, cached {})", iec3(cached)),
            None => format!("{q} (cached {})", iec3(cached)),
        };
        return vec![(Keep::Pool, q)];
    };
    let cache_part = format!("cached {} ({})", iec3(cached), iec3_delta(change));
    let keep = if change.unsigned_abs() > tracked.unwrap_or(0).unsigned_abs() { Keep::All } else { Keep::Pool };
    vec![(keep, format!("{q}, {cache_part}")), (keep, format!("CUDA pool {cache_part}"))]
}

/// One quantity as the report line and the live line show it: `allocated 64.00 MiB (+16.00 MiB)`:
/// the value now (at the end of the cell, for a report) and its change since the cell began
/// (`±0 B` for none), with the highest it was in the cell (`peak` names it, e.g. `peak since
/// load`) only where that went above both ends. `n/a` when the value is unknown.
pub fn quantity(name: &str, now: Option<u64>, delta: Option<i64>, peak: Option<u64>, peak_name: &str) -> String {
    let Some(now) = now else { return format!("{name} n/a") };
    let mut more = Vec::new();
    let before = delta.map_or(now, |d| (now as i64 - d).max(0) as u64);
    let peak = peak.filter(|&p| p > now.max(before));
    // No change goes unsaid where a peak is said (`(peak 416 MiB)`: it came back).
    if let Some(d) = delta.filter(|d| *d != 0 || peak.is_none()) {
        more.push(iec3_delta(d));
    }
    if let Some(p) = peak {
        more.push(format!("{peak_name} {}", iec3(p)));
    }
    if more.is_empty() {
        format!("{name} {}", iec3(now))
    } else {
        format!("{name} {} ({})", iec3(now), more.join(", "))
    }
}

/// The device as the line names it: `sim` for the simulated device, `cuda:N` for a GPU (the
/// details table and the record have its full name).
/// Another device of the same kind as the one a record describes (`device`), by index: `sim:1`
/// beside the simulated device, `cuda:1` beside a GPU.
pub fn other_device(device: &str, index: i32) -> String {
    let kind = if device.ends_with("(simulated)") || device.starts_with("sim") { "sim" } else { "cuda" };
    format!("{kind}:{index}")
}

pub fn short_device(device: &str) -> String {
    if device.ends_with("(simulated)") {
        "sim".into()
    } else if device.starts_with("cuda:") {
        device.split_whitespace().next().unwrap_or(device).to_string()
    } else {
        device.to_string()
    }
}

impl super::record::NvmlGap {
    /// What NVML counts beyond the tracked bytes and the CUDA pool's cache, on the line where it
    /// is not nothing (a MiB of noise aside): the driver's kernel stacks, grown by a kernel with
    /// a larger frame (NCCL's, a large local array), kept as long as every allocation's change
    /// where they are the larger of the two (the cell's memory went there); then the rest (the
    /// CUDA context, the kernels' code). `prefix` names another device (`cuda:1 `).
    fn add_to(&self, parts: &mut Parts, prefix: &str) {
        if self.local_memory.unsigned_abs() >= 1 << 20 {
            let larger = self.local_memory.unsigned_abs() > self.tracked.unsigned_abs();
            let keep = if larger { Keep::All } else { Keep::Nvml };
            parts.add(keep, format!("{prefix}{} kernel stacks (driver)", iec3_delta(self.local_memory)));
        }
        if self.rest.unsigned_abs() >= 1 << 20 {
            parts.add(Keep::Nvml, format!("{prefix}{} CUDA context and modules (NVML)", iec3_delta(self.rest)));
        }
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
mod tests;
