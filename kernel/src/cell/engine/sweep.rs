//! `%%gpumem sweep VAR=V1,V2,V3 [--on SIZE]`: the cell run once per value, measured, and the
//! largest value that fits each device (the fit itself: `gpumem_nb::plan::Sweep`).
//!
//! The contract, which fits evcxr's cells: the cell is the body of one closure, called once per
//! run with `let VAR = V;` before it, so its `let`s drop at the end of each run and the session
//! keeps none of them; the closure is passed where an `FnMut` is wanted, so a cell that moves an
//! earlier variable does not compile, and that is checked (`cargo check`, nothing run) before
//! any run, as is a cell that assigns one or does not use VAR: each a one-line `UsageError`.
//! A warm-up run at the smallest value is not counted (first-use costs: modules, workspaces,
//! pools); the caches are trimmed before each run, as `%gpumem trim` does; values run in
//! ascending order; a run that fails ends the sweep there, and one that runs out of memory says
//! so in the answer. Each run is a cell of its own in the history, its record the usual one.

use super::{Engine, SLOW_TIMEOUT};
use crate::cell::magic::SweepSpec;
use crate::output::ErrorInfo;
use gpumem_nb::device::nvml;
use gpumem_nb::kernel::protocol::Held;
use gpumem_nb::kernel::protocol::Op;
use gpumem_nb::kernel::report::CellRecord;
use gpumem_nb::plan::{CARDS_GB, Sweep, SweepRun, Target};
use gpumem_nb::units::iec;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::time::Instant;

/// `%%gpumem sweep`'s figures for programs, beside its tables.
pub(super) const SWEEP_MIME: &str = "application/vnd.gpumem.sweep+json";

/// What a sweep cell ends with: its error (a run's, or the contract's) and the record of its
/// last run (shown as the cell's report).
pub(super) struct Swept {
    pub error: Option<ErrorInfo>,
    pub record: Option<CellRecord>,
    pub live: Option<String>,
}

impl Engine {
    /// Runs a sweep cell: `run_code` is the cell as evcxr would get it (the magic line a comment).
    pub(super) fn sweep(
        &mut self,
        count: u64,
        queued: Option<Instant>,
        run_code: &str,
        (shown, allow_stdin): (&str, bool),
        spec: &SweepSpec,
    ) -> Swept {
        let usage = |what: String| Swept { error: Some(usage_error(what)), record: None, live: None };
        let var = spec.variable.as_str();
        if !uses(run_code, var) {
            return usage(format!("the swept cell does not use `{var}`: a sweep runs the cell with each value of it"));
        }
        let earlier: Vec<String> = self.ctx.variables_and_types().map(|(n, _)| n.to_string()).collect();
        if let Some(name) = assigned(run_code, &earlier) {
            return usage(format!(
                "the swept cell assigns `{name}`, a variable of an earlier cell: a sweep runs the cell once per value, \
                 so it may borrow earlier variables but not assign them"
            ));
        }
        let values = literals(&spec.values);
        if let Ok(errors) = self.ctx.check(&generated(run_code, var, &values[0])) {
            let text: String = errors.iter().map(|e| e.rendered()).collect::<Vec<_>>().join("\n");
            if let Some(name) = moved(&text) {
                return usage(format!(
                    "the swept cell moves `{name}`, a variable of an earlier cell: a sweep runs the cell once per \
                     value, so it may borrow earlier variables (`&{name}`, `{name}.clone()`) but not move them"
                ));
            }
        }
        // The warm-up: first-use costs (modules, workspaces, a pool's first reserve) not counted.
        self.show_notice(&format!("sweep {var}={}: warm-up run, not counted", spec.values[0]));
        let warm =
            self.run_cell(count, queued, &generated(run_code, var, &values[0]), (shown, allow_stdin, false), None);
        if warm.error.is_some() {
            return Swept { error: warm.error, record: Some(warm.record), live: warm.live };
        }
        self.show_report(&warm.record, warm.live);
        let mut runs = Vec::new();
        let mut last = warm.record;
        let mut live = None;
        let mut ended = None;
        for (i, (written, literal)) in spec.values.iter().zip(&values).enumerate() {
            self.quiet_trim();
            if i > 0 {
                self.show_report(&last, live.take());
            }
            self.show_notice(&format!("sweep {var}={written}: run {} of {}", i + 1, values.len()));
            let ran = self.run_cell(count, None, &generated(run_code, var, literal), (shown, allow_stdin, false), None);
            let value: f64 = written.replace('_', "").parse().unwrap_or_default();
            last = ran.record;
            live = ran.live;
            if let Some(error) = ran.error {
                let oom = last.oom.is_some() || error.ename.contains("OutOfMemory");
                ended = Some((written.clone(), oom, error));
                break;
            }
            runs.push(run_of(&last, value));
        }
        self.quiet_trim();
        let overhead = self.overhead(&last);
        let error = ended.as_ref().map(|(_, _, e)| e.clone());
        if runs.len() >= 2 {
            let sweep = Sweep::new(var, runs, overhead);
            let targets = targets(&last, spec.on);
            self.show_sweep(&sweep, &targets, ended.as_ref().map(|(v, oom, _)| (v.as_str(), *oom)));
        } else if let Some((v, oom, _)) = &ended {
            let why = if *oom { "ran out of memory" } else { "failed" };
            self.show_notice(&format!(
                "sweep {var}: the run at {var}={v} {why}; {} measured run(s) are too few to fit a line",
                runs.len()
            ));
        }
        Swept { error, record: Some(last), live }
    }

    /// The caches given back between runs, as `%gpumem trim` does, without its table.
    fn quiet_trim(&mut self) {
        let pid = self.child_pid();
        self.hooks.poll(pid);
        if self.hooks.control().connected().is_some() {
            let _ = self.hooks.control().request(Op::Trim, SLOW_TIMEOUT);
        }
    }

    /// What the device holds for the process beyond its tracked allocations, after a trim:
    /// NVML's process figure less the tracked live bytes (the CUDA context, modules and what
    /// no trim gives back), or none on the simulated device.
    fn overhead(&self, last: &CellRecord) -> (u64, String) {
        // Tracked bytes now, after the trim: the last run's end still counted the framework
        // caches the trim gave back (cubecl frees its pages only in its cleanup).
        let at_end = place(last);
        let device = at_end.and_then(|p| p.device);
        let now =
            self.hooks.control().request(Op::Read, SLOW_TIMEOUT).ok().and_then(|r| {
                r.tracked?.into_iter().find(|p| p.device.is_some() && p.device == device).map(|p| p.live)
            });
        let tracked = now.or_else(|| at_end.map(|p| p.after)).unwrap_or(0);
        let nvml_now = self.child_pid().and_then(|pid| {
            let uuid = last.nvml.uuid.as_deref()?;
            nvml::snapshot().device_of(Some(pid), Some(uuid))?.process_used(pid)
        });
        match nvml_now {
            Some(used) => (
                used.saturating_sub(tracked),
                format!(
                    "NVML's figure of the process after a trim, {}, less its tracked allocations, {}: the CUDA \
                     context, modules and caches",
                    iec(used),
                    iec(tracked)
                ),
            ),
            None if last.nvml.uuid.is_none() && last.nvml.device_total.is_none() && last.cuda_total.is_none() => {
                (0, "none: the simulated device has no context or cache beyond its allocations".into())
            }
            None => (
                0,
                "not measured: NVML gave no figure for the process after the trim, so the CUDA context is not counted"
                    .into(),
            ),
        }
    }

    /// The sweep's tables and figures.
    fn show_sweep(&self, sweep: &Sweep, targets: &[Target], ended: Option<(&str, bool)>) {
        let mut tables = vec![sweep.runs_table(), sweep.fits_table(), sweep.answer_table(targets)];
        if let Some((v, oom)) = ended {
            let last = tables.pop().unwrap_or_else(|| sweep.answer_table(targets));
            let why = if oom { "ran out of memory" } else { "failed" };
            tables.push(last.title(format!(
                "the largest {} that fits (the run at {}={v} {why}: the sweep ended there)",
                sweep.variable, sweep.variable
            )));
        }
        let text: Vec<String> = tables.iter().map(|t| t.to_text()).collect();
        let html: Vec<String> = tables.iter().map(|t| t.to_html()).collect();
        let answers: Vec<Value> = targets
            .iter()
            .map(|t| json!({"target": t.name, "capacity": t.capacity, "largest": sweep.largest(t.capacity)}))
            .collect();
        let mut m = Map::new();
        m.insert("text/plain".into(), Value::String(text.join("\n\n")));
        m.insert("text/html".into(), Value::String(html.join("")));
        m.insert(
            SWEEP_MIME.into(),
            json!({
                "sweep": sweep,
                "answers": answers,
                "limiting": sweep.limiting().map(|(c, s)| json!({"component": c, "per_unit": s})),
                "ended": ended.map(|(v, oom)| json!({"value": v, "out_of_memory": oom})),
            }),
        );
        self.display(m);
    }
}

fn usage_error(what: String) -> ErrorInfo {
    let what = format!("%%gpumem sweep: {what}");
    ErrorInfo {
        ename: "UsageError".into(),
        evalue: what.clone(),
        traceback: vec![format!("\x1b[1;31mUsageError\x1b[0m: {what}"), super::NOTHING_RAN.into()],
    }
}

/// The values as Rust literals of one type: `1` becomes `1.0` when another value is fractional.
fn literals(values: &[String]) -> Vec<String> {
    let float = values.iter().any(|v| v.contains('.'));
    values.iter().map(|v| if float && !v.contains('.') { format!("{v}.0") } else { v.clone() }).collect()
}

/// The cell as one run at `value`: the magic's comment line becomes the head of a closure passed
/// where an `FnMut` is wanted (so the cell keeps its line numbers), the cell its body.
fn generated(run_code: &str, var: &str, value: &str) -> String {
    let head = format!(
        "{{ fn __gpumem_sweep<R>(mut run: impl FnMut() -> R) -> R {{ run() }} __gpumem_sweep(|| -> \
         ::std::result::Result<(), ::std::boxed::Box<dyn ::std::error::Error + Send + Sync>> {{ let {var} = {value};"
    );
    let mut out = String::with_capacity(run_code.len() + head.len() + 32);
    let mut replaced = false;
    for line in run_code.split_inclusive('\n') {
        if !replaced && line.trim_start().starts_with("// %%gpumem") {
            out.push_str(&head);
            out.push('\n');
            replaced = true;
        } else {
            out.push_str(line);
        }
    }
    if !replaced {
        out.insert_str(0, &format!("{head}\n"));
    }
    out.push_str("\n; Ok(()) })?; }");
    out
}

/// The code of each line without its `//` comment.
fn code_lines(code: &str) -> impl Iterator<Item = &str> {
    code.lines().map(|l| l.split_once("//").map_or(l, |(c, _)| c))
}

/// Identifiers in `line`, each with the text before and after it.
fn identifiers(line: &str) -> Vec<(&str, &str, &str)> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            out.push((&line[..start], &line[start..i], &line[i..]));
        } else if c.is_ascii_digit() {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Whether the cell's code names `var` (not as a field: `cfg.batch` is not it).
fn uses(code: &str, var: &str) -> bool {
    code_lines(code).any(|l| identifiers(l).iter().any(|(before, id, _)| *id == var && !before.ends_with('.')))
}

/// The first earlier variable the cell assigns (`x = …`, `x += …`) without a `let` of its own
/// first.
fn assigned(code: &str, earlier: &[String]) -> Option<String> {
    let mut own: Vec<&str> = Vec::new();
    for line in code_lines(code) {
        for (before, id, after) in identifiers(line) {
            let b = before.trim_end();
            if b.ends_with("let") || b.ends_with("let mut") || b.ends_with("mut") {
                own.push(id);
                continue;
            }
            if before.ends_with('.') || own.contains(&id) || !earlier.iter().any(|e| e == id) {
                continue;
            }
            let a = after.trim_start();
            let compound = ["+=", "-=", "*=", "/=", "%=", "|=", "&=", "^=", "<<=", ">>="];
            let plain = a.starts_with('=') && !a.starts_with("==") && !a.starts_with("=>");
            if plain || compound.iter().any(|op| a.starts_with(op)) {
                return Some(id.to_string());
            }
        }
    }
    None
}

/// The earlier variable rustc says the closure moves (`cannot move out of `x``, or a closure
/// that "moves the variable `x` out of its environment").
fn moved(rustc: &str) -> Option<String> {
    for marker in ["moves the variable `", "cannot move out of `"] {
        if let Some((_, rest)) = rustc.split_once(marker) {
            let name: String = rest.chars().take_while(|c| *c != '`').collect();
            let name = name.trim_start_matches('*').to_string();
            if !name.is_empty() {
                return Some(name);
            }
        }
    }
    None
}

/// The device the run's tracked bytes peaked on (the notebook's busiest place).
fn place(rec: &CellRecord) -> Option<&gpumem_nb::kernel::report::PlaceAll> {
    rec.all_allocations.as_ref()?.devices.iter().filter(|p| p.device.is_some()).max_by_key(|p| p.peak)
}

/// One run's measurement from its record: the device's tracked peak, each component's and
/// owner's own peak.
fn run_of(rec: &CellRecord, value: f64) -> SweepRun {
    let Some(p) = place(rec) else {
        return SweepRun { value, peak: 0, components: BTreeMap::new(), owners: BTreeMap::new(), held: None };
    };
    // The allocator's cached free memory is no component: its bytes are in the device peak.
    let components = p
        .by_component
        .iter()
        .filter(|c| c.component != Held::Cached)
        .map(|c| (c.component.key().to_string(), c.peak.unwrap_or(c.after)))
        .collect();
    let owners = p.by_owner.iter().map(|o| (o.owner.clone(), o.peak.unwrap_or(o.after))).collect();
    // The CUDA pool was trimmed before the run: the most it reserved during it (its high-water
    // mark, reset before the cell; a pool that gives memory back at each synchronize, as one
    // capped by `cap_cuda_pool` did on an H100, reserves little at the run's end), or where no
    // mark was read what it reserves at the end; the tracked bytes outside the pool (cuBLAS's
    // workspace, `cuMemAlloc`) are added.
    let held = rec.pool.as_ref().and_then(|pool| {
        let (reserved, used) = (pool.reserved.after?, pool.used.after?);
        Some(reserved.max(pool.reserved_high.unwrap_or(0)) + p.after.saturating_sub(used))
    });
    SweepRun { value, peak: p.peak, components, owners, held }
}

/// The devices the answer is for: this one (its size as CUDA counts it, else NVML's, less what
/// other processes hold by NVML; or the simulated device's size), each card of `%gpumem fit`'s
/// list, and `--on SIZE`.
fn targets(last: &CellRecord, on: Option<u64>) -> Vec<Target> {
    let mut out = Vec::new();
    if let Some(nvml_total) = last.nvml.device_total {
        let others = last.nvml.others_after.unwrap_or(0);
        let name = last.nvml.name.clone().unwrap_or_else(|| last.device.clone());
        // NVML's total holds what the driver keeps for itself (480 MiB of an H100's 81,559 MiB):
        // no process can be given that, so CUDA's total is the capacity where it was read.
        let (total, counted) = match last.cuda_total {
            Some(t) => (t, "as CUDA counts it"),
            None => (nvml_total, "as NVML counts it"),
        };
        out.push(Target {
            name: format!("this device ({name}, {} {counted}, less {} of other processes)", iec(total), iec(others)),
            capacity: total.saturating_sub(others),
        });
    } else if let Some(total) = last.crate_device_total {
        out.push(Target { name: format!("this device ({})", last.device), capacity: total });
    }
    if let Some(b) = on {
        out.push(Target { name: format!("--on {}", iec(b)), capacity: b });
    }
    out.extend(CARDS_GB.iter().map(|gb| Target { name: format!("{gb} GB card"), capacity: gb << 30 }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_device_is_what_cuda_can_give_less_other_processes() {
        // An H100 as the sweep of 2026-12-07 read it: NVML 81,559 MiB, CUDA 79.18 GiB.
        let mut rec = CellRecord::default();
        rec.nvml.device_total = Some(85_520_809_984);
        rec.nvml.others_after = Some(1 << 30);
        rec.nvml.name = Some("NVIDIA H100 80GB HBM3".into());
        let nvml_only = targets(&rec, None);
        assert_eq!(nvml_only[0].capacity, 85_520_809_984 - (1 << 30), "{nvml_only:?}");
        assert!(nvml_only[0].name.contains("as NVML counts it"), "{nvml_only:?}");
        rec.cuda_total = Some(85_017_755_648);
        let t = targets(&rec, Some(24 << 30));
        assert_eq!(t[0].capacity, 85_017_755_648 - (1 << 30), "{t:?}");
        assert!(t[0].name.contains("79.18 GiB as CUDA counts it, less 1.00 GiB of other processes"), "{t:?}");
        assert_eq!((t[1].name.as_str(), t[1].capacity), ("--on 24.00 GiB", 24 << 30));
        assert_eq!(t.len(), 2 + CARDS_GB.len());
    }

    #[test]
    fn a_run_holds_the_most_its_pool_reserved_during_it() {
        use gpumem_nb::kernel::report::{AllAllocations, PlaceAll, PoolPart, Span};
        // candle under a pool capped at 24 GiB on an H100 (2026-12-07): 12.0 GB tracked at the
        // peak, the pool's reservation back to 1.41 GB at the run's end.
        let mut rec = CellRecord::default();
        let place = PlaceAll { device: Some(0), after: 1_376_269_312, peak: 12_030_280_712, ..Default::default() };
        rec.all_allocations = Some(AllAllocations { devices: vec![place], ..Default::default() });
        let outside = 1_376_269_312 - 1_308_831_744;
        let mut pool = PoolPart {
            used: Span { before: None, after: Some(1_308_831_744) },
            reserved: Span { before: None, after: Some(1_409_614_848) },
            ..Default::default()
        };
        rec.pool = Some(pool.clone());
        let end = run_of(&rec, 20480.0);
        assert_eq!(end.held, Some(1_409_614_848 + outside), "no mark read: the end's reservation");
        assert_eq!(end.need(), 12_030_280_712, "below the tracked peak: the peak");
        pool.reserved_high = Some(12_448_694_272);
        rec.pool = Some(pool);
        let high = run_of(&rec, 20480.0);
        assert_eq!(high.held, Some(12_448_694_272 + outside), "the high-water mark of the run");
        assert_eq!(high.need(), 12_448_694_272 + outside);
    }

    #[test]
    fn the_generated_run_keeps_the_cells_lines_and_binds_the_value() {
        let cell = "// %%gpumem sweep batch=1,2,3\nlet x = vec![0u8; batch];\nx.len()";
        let g = generated(cell, "batch", "2");
        assert_eq!(g.lines().count(), cell.lines().count() + 1, "one closing line added:\n{g}");
        assert!(g.lines().next().unwrap().contains("let batch = 2;"), "{g}");
        assert_eq!(g.lines().nth(1), Some("let x = vec![0u8; batch];"), "line 2 is still line 2");
        assert!(g.ends_with("})?; }"), "{g}");
        assert_eq!(literals(&["1".into(), "2.5".into()]), ["1.0", "2.5"]);
        assert_eq!(literals(&["1".into(), "2".into()]), ["1", "2"]);
    }

    #[test]
    fn uses_assigns_and_moves_are_told_from_the_code() {
        assert!(uses("let x = batch * 2;", "batch"));
        assert!(!uses("let x = cfg.batch * 2; // batch", "batch"), "a field and a comment are not the variable");
        assert!(!uses("let batches = 2;", "batch"));
        let earlier = vec!["model".to_string(), "step".to_string()];
        assert_eq!(assigned("step += 1;", &earlier).as_deref(), Some("step"));
        assert_eq!(assigned("let y = 1;\nmodel = build();", &earlier).as_deref(), Some("model"));
        assert_eq!(assigned("let mut step = 0;\nstep += 1;", &earlier), None, "its own `let` first");
        assert_eq!(assigned("if step == 1 { model.w = 2; }", &earlier), None, "a comparison, a field");
        assert_eq!(assigned("let t = match step { _ => 1 };", &earlier), None);
        let e0507 = "error[E0507]: cannot move out of `data`, a captured variable in an `FnMut` closure";
        assert_eq!(moved(e0507).as_deref(), Some("data"));
        let e0525 = "closure is `FnOnce` because it moves the variable `data` out of its environment";
        assert_eq!(moved(e0525).as_deref(), Some("data"));
        assert_eq!(moved("error[E0308]: mismatched types"), None);
    }
}
