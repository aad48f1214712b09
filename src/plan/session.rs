//! Will this session fit on a device of a given size: its recorded allocations of every source,
//! replayed per policy, with each cell's verdict and the smallest device per policy.

use crate::error::Error;
use crate::policy::config::AllocatorConfig;
use crate::record::component::Component;
use crate::replay::components::{ComponentBytes, peak_parts};
use crate::replay::fit::{self, BEFORE_TRACE, Failure, POLICIES, Program};
use crate::replay::{DeviceTrace, Ordered, ReplayOptions, TraceStart, from_snapshot, replay, settings_conf};
use crate::snapshot::Snapshot;
use crate::units::iec;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

/// Cards people plan for, by their nominal size in GB (taken as GiB: a card's usable memory is a
/// little less).
pub const CARDS_GB: [u64; 8] = [16, 24, 40, 48, 80, 94, 141, 192];

/// The smallest card of [`CARDS_GB`] that holds `bytes`, with its margin over them.
pub fn smallest_card(bytes: u64) -> Option<(u64, u64)> {
    CARDS_GB.iter().map(|gb| (*gb, gb << 30)).find(|(_, b)| *b >= bytes).map(|(gb, b)| (gb, b - bytes))
}

/// `16, 24, 40, 48, 80, 94, 141, 192 GB`.
fn cards() -> String {
    let list: Vec<String> = CARDS_GB.iter().map(|g| g.to_string()).collect();
    format!("{} GB", list.join(", "))
}

/// What a program's peak is made of, as the peers' estimators show it, for `%gpumem fit` and
/// `gpumem-replay --fit` alike: each component live at the requested peak (and its own peak);
/// the allocator's rounding and cache, which is the smallest device the program fits on under
/// `policy` (`min_device`, replayed) less the components at the peak; the CUDA context and
/// modules (`Ok`: measured, `Err`: why not); and the smallest card of [`CARDS_GB`] that holds the
/// smallest device and the context. `before` is what the allocations made before the recording
/// began held at the peak: a row of its own (no stack tells what they are).
pub fn component_table(
    components: &BTreeMap<Component, ComponentBytes>,
    before: u64,
    policy: &str,
    min_device: u64,
    context: std::result::Result<u64, &str>,
) -> crate::render::Table {
    let mut t = crate::render::Table::new(["what", "at the peak", "own peak", "source"]).right_align([1, 2]);
    let mut at_peak = 0;
    for (c, b) in components.iter().filter(|(_, b)| b.peak > 0) {
        at_peak += b.at_peak;
        t.row([c.key().to_string(), iec(b.at_peak), iec(b.peak), "recorded allocations (requested bytes)".into()]);
    }
    if before > 0 {
        at_peak += before;
        t.row([
            "live before recording".into(),
            iec(before),
            "–".into(),
            "allocations made before the recording began, still live at the peak (no stack: record from the first \
             cell to tell what they are)"
                .into(),
        ]);
    }
    t.row(if components.is_empty() {
        [
            "allocations, rounding and cache".into(),
            iec(min_device),
            "–".into(),
            format!("the smallest device under {policy} (replayed; no stacks to tell components)"),
        ]
    } else {
        [
            "rounding and cache".into(),
            iec(min_device.saturating_sub(at_peak)),
            "–".into(),
            format!("the smallest device under {policy} − the components at the peak (replayed)"),
        ]
    });
    t.row(match context {
        Ok(b) => ["CUDA context and modules".into(), iec(b), "–".into(), "NVML, now".into()],
        Err(why) => ["CUDA context and modules".into(), "not measured".into(), "–".into(), why.into()],
    });
    let need = min_device + context.unwrap_or(0);
    let card = match smallest_card(need) {
        // A CUDA context takes 300-600 MiB: a margin below that, with the context not measured,
        // may not hold it.
        Some((gb, margin)) if context.is_err() && margin < 600 << 20 => {
            format!("{gb} GB (margin {}, less than a CUDA context may take)", iec(margin))
        }
        Some((gb, margin)) => format!("{gb} GB (margin {})", iec(margin)),
        None => "none of 16 to 192 GB".into(),
    };
    let needed = if context.is_ok() {
        format!("{} needed", iec(need))
    } else {
        format!("{} needed, and the CUDA context", iec(need))
    };
    t.row(["smallest card".into(), card, "–".into(), needed]);
    t
}

/// What a fit plan replays, in its own words (shown under every plan).
pub(crate) const MODELLED: &str = "this session's recorded allocations and frees (allocator blocks under each policy with \
    its out-of-memory path; CUDA pool, driver and VMM allocations at their sizes, rounded to the driver's 2 MiB), \
    replayed on a simulated device of that size";

/// What it does not (leave room for it).
pub(crate) const NOT_MODELLED: &str = "the CUDA context (300-600 MiB per process), other processes on the device, NCCL \
    and other library memory that was not tracked, the CUDA pool's own chunks and caching beyond its live bytes (read \
    instead, cell by cell, where the notebook has a pool: the CUDA pool table), CUDA graphs' private pools";

/// One policy's answer.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyFit {
    /// `default`, `expandable` or `compact`.
    pub policy: String,
    /// Its configuration (`GPUMEM_NB_ALLOC_CONF`).
    pub alloc_conf: String,
    /// Whether every request is placed on the device of the plan's size.
    pub fits: bool,
    /// How many are not.
    pub failures: usize,
    /// The first that is not, with its cell and site.
    pub first_failure: Option<Failure>,
    /// The smallest device it fits on (a multiple of 2 MiB; see `replay::fit` for the search).
    pub min_device_bytes: u64,
    /// The allocator's reserved peak on the device of the plan's size.
    pub reserved_peak: u64,
    /// Everything on the device at its highest, on the device of the plan's size.
    pub device_peak: u64,
}

/// One cell's verdict under each policy.
#[derive(Clone, Debug, Serialize)]
pub struct CellFit {
    /// `cell 5` (or `before recording` for allocations made before the history began).
    pub label: String,
    /// The device's peak during the cell under PyTorch's default policy, on a device with room
    /// to spare: what the cell needed with the cells before it.
    pub peak: u64,
    /// Per policy (in [`PolicyFit`] order): the cell's first failure on the plan's device, or
    /// `None` when all of it fits.
    pub failures: Vec<Option<Failure>>,
}

/// Will it fit: the plan for one device of a session (or snapshot).
#[derive(Clone, Debug, Serialize)]
pub struct FitPlan {
    /// The device size asked about.
    pub device_bytes: u64,
    /// The device whose recording was replayed.
    pub device: i32,
    /// Per policy: default, expandable segments, compact.
    pub policies: Vec<PolicyFit>,
    /// Per cell, in the order they ran.
    pub cells: Vec<CellFit>,
    /// Allocations made before recording began (placed first), and their bytes.
    pub before_recording: (usize, u64),
    /// The program's live peak: no device below it can run it.
    pub live_peak: u64,
    /// The most bytes the session asked for at once, every source at its requested size: the
    /// session's tracked peak (`live_peak` counts other sources at the driver's 2 MiB).
    pub requested_peak: u64,
    /// What the recording's memory was, by component (bytes requested, every source): at the
    /// end, at the requested peak, and each component's own peak.
    pub components: BTreeMap<Component, ComponentBytes>,
    /// What the allocations made before recording began held at that peak.
    pub before_recording_at_peak: u64,
    /// The CUDA context and modules of the notebook's process, where measured (NVML's process
    /// bytes beyond every tracked allocation and the CUDA pool's cache); set by the kernel.
    pub context: Option<u64>,
    /// The CUDA stream-ordered pool as its driver counted it cell by cell, and where a pool capped
    /// at the plan's size would first refuse; set by the kernel, from its cells' records.
    pub pool: Option<super::PoolFit>,
    /// What is modelled.
    pub modelled: &'static str,
    /// What is not.
    pub not_modelled: &'static str,
}

/// Plans a fit from a snapshot with its trace (gpumem-nb's own, with tracked allocations, or
/// PyTorch's): its first device with events. A trace that began after the first allocation is
/// taken with what it shows of the earlier ones ([`TraceStart::Prologue`]).
pub fn fit_snapshot(snap: &Snapshot, device_bytes: u64) -> Result<FitPlan, Error> {
    // A notebook's allocator keeps its last event only, unless recording was asked for.
    if snap.device_traces.iter().all(|t| t.len() <= 1) {
        return Err(Error::Plan(
            "nothing recorded to plan from: `%gpumem record on` (or the allocator's record_memory_history) from the \
             first cell, then fit"
                .into(),
        ));
    }
    let rec =
        from_snapshot(snap, "the session's recording", TraceStart::Prologue).map_err(|e| Error::Plan(e.to_string()))?;
    let trace = rec.devices.first().ok_or_else(|| Error::Plan("nothing recorded".into()))?;
    let recorded = AllocatorConfig::parse(&settings_conf(snap)).unwrap_or_default();
    plan(trace, &recorded, device_bytes)
}

/// Plans a fit for one device's trace, recorded under `recorded`.
pub fn plan(trace: &DeviceTrace, recorded: &AllocatorConfig, device_bytes: u64) -> Result<FitPlan, Error> {
    // Where the program called empty_cache(): known from an exact replay of a complete trace.
    let markers = if trace.prologue.is_empty() && !recorded.compact {
        let opts = ReplayOptions { config: recorded.clone(), ..ReplayOptions::default() };
        replay(&trace.events, &opts, "").map(|r| r.empty_cache_before).unwrap_or_default()
    } else {
        Vec::new()
    };
    let program = Program::new(trace, markers, ReplayOptions::default().device_total);
    let err = |e: crate::replay::TraceError| Error::Plan(e.to_string());
    let mut policies = Vec::new();
    let mut runs = Vec::new();
    for (name, conf) in POLICIES {
        let config = AllocatorConfig::parse(conf)?;
        let r = fit::run(&program, &config, Some(device_bytes)).map_err(err)?;
        let s = fit::min_device(&program, &config).map_err(err)?;
        policies.push(PolicyFit {
            policy: name.to_string(),
            alloc_conf: conf.to_string(),
            fits: r.fits,
            failures: r.failures,
            first_failure: r.first_failure.clone(),
            min_device_bytes: s.min_device_bytes,
            reserved_peak: r.reserved_peak,
            device_peak: r.device_peak,
        });
        runs.push((r, s));
    }
    // Cells in the order they first appear.
    let mut labels: Vec<String> = Vec::new();
    if !trace.prologue.is_empty() {
        labels.push(BEFORE_TRACE.to_string());
    }
    for step in trace.in_order() {
        let info = match step {
            Ordered::Foreign(f) => f.info.as_deref(),
            Ordered::Event(i, _) => trace.info_of(i),
        };
        if let Some(l) = info.map(|x| &x.label).filter(|l| !l.is_empty() && !labels.contains(l)) {
            labels.push(l.clone());
        }
    }
    let peaks = &runs[0].1.unconstrained.device_peak_by_label;
    let cells = labels
        .into_iter()
        .map(|label| CellFit {
            peak: peaks.get(&label).copied().unwrap_or(0),
            failures: runs.iter().map(|(r, _)| r.first_failure_by_label.get(&label).cloned()).collect(),
            label,
        })
        .collect();
    let prologue = &trace.prologue;
    let parts = peak_parts(trace);
    Ok(FitPlan {
        device_bytes,
        device: trace.device,
        policies,
        cells,
        before_recording: (prologue.len(), prologue.iter().map(|e| e.size).sum()),
        live_peak: program.live_peak(),
        requested_peak: program.requested_peak(),
        components: parts.components,
        before_recording_at_peak: parts.before_recording_at_peak,
        context: None,
        pool: None,
        modelled: MODELLED,
        not_modelled: NOT_MODELLED,
    })
}

impl FitPlan {
    /// Whether it fits under at least one policy.
    pub fn fits_somehow(&self) -> bool {
        self.policies.iter().any(|p| p.fits)
    }

    fn failure_text(f: &Failure) -> String {
        // `function (file:line)` with the file's name only, the function's last two path parts.
        let at = f.frames.first().filter(|_| f.site.is_some()).map_or(String::new(), |_| {
            let site = f.site.as_deref().unwrap_or("");
            let (func, place) = site.rsplit_once(" (").unwrap_or((site, ""));
            let short: Vec<&str> = func.rsplit("::").take(2).collect();
            let func = short.into_iter().rev().collect::<Vec<_>>().join("::");
            let place = place.trim_end_matches(')');
            let file = place.rsplit(['/', '\\']).next().unwrap_or(place);
            if file.is_empty() { format!(" at {func}") } else { format!(" at {func} ({file})") }
        });
        let source = if f.source == "allocator" { String::new() } else { format!(" ({})", f.source) };
        format!("{}{source}{at}", iec(f.size))
    }

    /// The policies' table.
    pub fn policy_table(&self) -> crate::render::Table {
        let on = format!("reserved peak on {}", iec(self.device_bytes));
        let mut t = crate::render::Table::new(["policy", "fits", "smallest device", on.as_str(), "first failure"])
            .right_align([2, 3]);
        for p in &self.policies {
            let first = p.first_failure.as_ref().map_or("—".to_string(), |f| {
                format!("{}{}", f.label.as_ref().map_or(String::new(), |l| format!("{l}: ")), Self::failure_text(f))
            });
            t.row([
                format!(
                    "{} {}",
                    p.policy,
                    if p.alloc_conf.is_empty() { String::new() } else { format!("({})", p.alloc_conf) }
                ),
                if p.fits { "yes".into() } else { format!("no ({} failed)", p.failures) },
                iec(p.min_device_bytes),
                iec(p.reserved_peak),
                first,
            ]);
        }
        t.title(format!("Will it fit on {} (device {})?", iec(self.device_bytes), self.device))
            .caption(format!("Modelled: {}. Not modelled: {}.", self.modelled, self.not_modelled))
    }

    /// The cells' table.
    pub fn cell_table(&self) -> crate::render::Table {
        let mut header = vec!["cell".to_string(), "peak (default)".to_string()];
        header.extend(self.policies.iter().map(|p| p.policy.clone()));
        let mut t = crate::render::Table::new(header).right_align([1]);
        for c in &self.cells {
            let mut row = vec![c.label.clone(), iec(c.peak)];
            row.extend(
                c.failures
                    .iter()
                    .map(|f| f.as_ref().map_or("fits".to_string(), |f| format!("fails: {}", Self::failure_text(f)))),
            );
            t.row(row);
        }
        let (n, bytes) = self.before_recording;
        let before = if n > 0 {
            format!(
                "; {n} allocation{} ({}) made before recording began {} placed first (record from the first cell for \
                 their order)",
                if n == 1 { "" } else { "s" },
                iec(bytes),
                if n == 1 { "is" } else { "are" }
            )
        } else {
            String::new()
        };
        t.caption(format!(
            "each cell on {}: fits, or its first request that would fail, with the cells before it{before}",
            iec(self.device_bytes)
        ))
    }

    /// What the peak is made of ([`component_table`]) under the default policy, with the CUDA
    /// context NVML measured.
    pub fn component_table(&self) -> crate::render::Table {
        let min_device = self.policies.first().map_or(0, |p| p.min_device_bytes);
        let context = self.context.ok_or("no NVML here: leave 300-600 MiB");
        component_table(&self.components, self.before_recording_at_peak, "the default policy", min_device, context)
            .caption(format!("what the peak is made of (device {}), and the smallest card of {}", self.device, cards()))
    }

    /// The plan's tables: the policies, the cells, what the peak is made of, and the CUDA pool
    /// where it was read.
    fn tables(&self) -> Vec<crate::render::Table> {
        let mut t = vec![self.policy_table(), self.cell_table(), self.component_table()];
        t.extend(self.pool.as_ref().map(|p| p.table()));
        t
    }

    /// Text, HTML and the plan as JSON (`application/json`).
    pub fn bundle(&self) -> crate::render::MimeBundle {
        let tables = self.tables();
        let text: Vec<String> = tables.iter().map(|t| t.to_text()).collect();
        let html: Vec<String> = tables.iter().map(|t| t.to_html()).collect();
        crate::render::MimeBundle::text(text.join("\n\n")).with_html(html.join("<br>"))
    }

    /// The plan as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

impl fmt::Display for FitPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text: Vec<String> = self.tables().iter().map(|t| t.to_text()).collect();
        f.write_str(&text.join("\n\n"))
    }
}

crate::render::evcxr_display!(FitPlan);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_recorded_is_said_in_the_notebooks_words() {
        let snap = crate::snapshot::json::from_str(r#"{"segments": [], "device_traces": [[]]}"#).unwrap();
        let err = fit_snapshot(&snap, 1 << 30).unwrap_err().to_string();
        assert!(err.contains("`%gpumem record on`") && !err.contains("torch."), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }
}
