//! What the magics do: settings before the cell's code, `%%gpumem`'s timeline and snapshot
//! after it, the output magics (history, plot, ranks, summary, snapshot, diff, export, fit,
//! explain) last.

use super::{Engine, SLOW_TIMEOUT};
use crate::cell::hooks::HOOK_TIMEOUT;
use crate::cell::magic::{self, ExportFormat, Magic};
use crate::session::ranks;
use gpumem_nb::RecordMode;
use gpumem_nb::kernel::protocol::{Op, RecordRequest};
use gpumem_nb::render::escape;
use gpumem_nb::render::explain::ReservedView;
use gpumem_nb::units::iec;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// `%gpumem explain`'s parts for programs, beside its table. A vendor type: JupyterLab renders
/// the richest MIME type it knows, and `application/json` would show as a collapsed tree instead
/// of the table (classic Notebook and VS Code rank it the same way).
pub(super) const EXPLAIN_MIME: &str = "application/vnd.gpumem.explain+json";

/// `%gpumem fit`'s plan for programs, beside its table (see [`EXPLAIN_MIME`]).
pub(super) const FIT_MIME: &str = "application/vnd.gpumem.fit+json";

/// `%gpumem restart`'s note for programs: the notebook process's pid now and why it changed
/// (`{"child_pid": 4242, "reason": "%gpumem restart"}`), the only part of its output (JupyterLab
/// shows nothing for a type it has no renderer for).
pub(super) const SESSION_MIME: &str = "application/vnd.gpumem.session+json";

/// `%gpumem record` as the session wants it (re-sent to every new child).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RecordSetting {
    pub(super) on: bool,
    pub(super) max_entries: Option<u64>,
    pub(super) stacks: bool,
}

impl RecordSetting {
    pub(super) fn request(&self) -> Op {
        Op::Record(RecordRequest {
            enabled: if self.on { RecordMode::All } else { RecordMode::Off },
            max_entries: Some(self.max_entries.unwrap_or(u64::from(u32::MAX))),
            stacks: self.stacks,
        })
    }
}

impl Engine {
    pub(super) fn finish_cell_magic(&mut self, count: u64, timeline: bool, snap: Option<&Path>, was_loaded: bool) {
        if self.hooks.control().connected().is_none() {
            self.stream(
                "stderr",
                "%%gpumem: gpumem-nb is not loaded in this notebook, so there is no allocator history \
                 (load it with `:dep gpumem-nb = { path = \"…\" }` and use a device first)",
            );
            return;
        }
        if !was_loaded {
            self.stream("stderr", "%%gpumem: gpumem-nb was loaded during this cell; its history starts at first use");
        }
        if timeline {
            let reply = self.hooks.control().request(Op::HistorySvg, SLOW_TIMEOUT);
            match reply {
                Ok(reply) => {
                    let mut m = Map::new();
                    let text = reply.text.as_deref().unwrap_or("memory over time");
                    m.insert("text/plain".into(), Value::String(format!("cell {count}: {text}")));
                    if let Some(svg) = reply.svg {
                        m.insert("text/html".into(), Value::String(gpumem_nb::render::chart::svg_html(&svg)));
                        m.insert("image/svg+xml".into(), Value::String(svg));
                    }
                    self.display(m);
                }
                Err(e) => self.stream("stderr", format!("%%gpumem --timeline: {e}")),
            }
        }
        if let Some(dir) = snap {
            self.snapshot(count, Some(dir));
        }
        let sent = self.hooks.control().request(self.record.request(), HOOK_TIMEOUT).is_ok();
        if sent {
            self.hooks.note_recording(self.record.on);
        }
    }

    pub(super) fn apply_setting(&mut self, m: &Magic) {
        match m {
            Magic::On => {
                self.show = true;
                self.stream("stdout", "gpumem: per-cell reports on");
            }
            Magic::Off => {
                self.show = false;
                self.stream(
                    "stdout",
                    "gpumem: per-cell reports off (cells are still measured; %gpumem history shows them)",
                );
            }
            Magic::Budget(b) => {
                self.history.budget = *b;
                match b {
                    Some(b) => self.stream(
                        "stdout",
                        format!(
                            "gpumem: budget {} ({} bytes) per cell peak; sizes are binary (1.5 GB is read as 1.5 GiB)",
                            iec(*b),
                            gpumem_nb::units::group_digits(*b)
                        ),
                    ),
                    None => self.stream("stdout", "gpumem: budget off"),
                }
            }
            Magic::Metrics(Some(addr)) => match self.metrics.start(addr) {
                Ok(at) => self
                    .stream("stdout", format!("gpumem: metrics at http://{at}/metrics (OpenMetrics, for Prometheus)")),
                Err(why) => self.stream("stderr", format!("%gpumem metrics: {why}")),
            },
            Magic::Metrics(None) => match self.metrics.stop() {
                Some(at) => self.stream("stdout", format!("gpumem: metrics endpoint at {at} stopped")),
                None => self.stream("stdout", "gpumem: metrics endpoint was off"),
            },
            Magic::Restart => {
                self.restart_child();
                let lost = self.lost.take();
                let was = match &lost {
                    Some((cell, l)) => format!(" (the CUDA context was lost in cell {cell}: {})", l.fault.what()),
                    None => String::new(),
                };
                self.restarted_by_magic = Some(match &lost {
                    Some((cell, _)) => format!("%gpumem restart, the context lost in cell {cell}"),
                    None => "%gpumem restart".into(),
                });
                self.stream(
                    "stdout",
                    format!("gpumem: a fresh notebook process{was}; variables are lost, the history is kept"),
                );
                // For a frontend (the JupyterLab panel): the process is another from here on,
                // before any record says so. A vendor type only: nothing shows in the notebook.
                let mut m = Map::new();
                let note = serde_json::json!({ "child_pid": self.child_pid(), "reason": self.restarted_by_magic });
                m.insert(SESSION_MIME.into(), note);
                self.display(m);
            }
            Magic::Reset => {
                let n = self.history.cells.len();
                self.history.cells.clear();
                self.history.dropped = Default::default();
                self.stream(
                    "stdout",
                    format!(
                        "gpumem: forgot {} of history (the allocator is untouched)",
                        gpumem_nb::units::count(n, "cell")
                    ),
                );
            }
            Magic::Record { on, max_entries, stacks } => {
                self.record = RecordSetting { on: *on, max_entries: *max_entries, stacks: *stacks };
                self.hooks.set_record_on_connect(self.record.on.then(|| self.record.request()));
                let pid = self.child_pid();
                self.hooks.poll(pid);
                let what = if *on {
                    format!(
                        "gpumem: recording allocator history{}{}",
                        max_entries.map_or(String::new(), |n| format!(" (last {n} events)")),
                        if *stacks { " with stacks" } else { "" }
                    )
                } else {
                    "gpumem: history recording off".to_string()
                };
                if self.hooks.control().connected().is_some() {
                    let reply = self.hooks.control().request(self.record.request(), HOOK_TIMEOUT);
                    match reply {
                        Ok(_) => {
                            self.hooks.note_recording(*on);
                            self.stream("stdout", what);
                        }
                        Err(e) => self.magic_error(&format!("record failed: {e}")),
                    }
                } else {
                    self.stream("stdout", format!("{what} (from when gpumem-nb is first used)"));
                }
            }
            Magic::OnOom(dir) => {
                let dir = dir.as_deref().map(absolute);
                let request = Op::OnOom { dir: dir.as_ref().map(|d| d.display().to_string()) };
                self.hooks.set_oom_on_connect(dir.is_some().then(|| request.clone()));
                let pid = self.child_pid();
                self.hooks.poll(pid);
                let what = match &dir {
                    Some(d) => format!(
                        "gpumem: a cell that runs out of memory writes a snapshot into {} at that moment",
                        d.join("cell-N").display()
                    ),
                    None => "gpumem: no snapshots on out-of-memory".to_string(),
                };
                if self.hooks.control().connected().is_some() {
                    let reply = self.hooks.control().request(request, HOOK_TIMEOUT);
                    match reply {
                        Ok(_) => self.stream("stdout", what),
                        Err(e) => self.magic_error(&format!("snapshot --on-oom failed: {e}")),
                    }
                } else {
                    self.stream("stdout", format!("{what} (from when gpumem-nb is first used)"));
                }
            }
            Magic::Help => {
                self.display_text_html(&magic::help_text(), magic::help_html());
            }
            _ => {}
        }
    }

    pub(super) fn run_output_magic(&mut self, m: &Magic, count: u64) {
        match m {
            Magic::History => {
                let b = self.history.table().bundle();
                self.display_text_html(&b.text, b.html.unwrap_or_default());
            }
            Magic::Plot => {
                if self.history.cells.is_empty() {
                    self.stream("stdout", "gpumem: no cells measured yet");
                    return;
                }
                let b = self.history.plot();
                let mut data = Map::new();
                data.insert("text/plain".into(), Value::String(b.text));
                if let Some(html) = b.html {
                    data.insert("text/html".into(), Value::String(html));
                }
                if let Some(svg) = b.svg {
                    data.insert("image/svg+xml".into(), Value::String(svg));
                }
                self.display(data);
            }
            Magic::Ranks(cell) => self.ranks(*cell),
            Magic::Summary => {
                let pid = self.child_pid();
                self.hooks.poll(pid);
                let reply = self.hooks.control().request(Op::Summary, SLOW_TIMEOUT);
                match reply {
                    Ok(reply) => {
                        let text = reply.text.unwrap_or_default();
                        self.display_text_html(&text, format!("<pre style=\"font-size:12px\">{}</pre>", escape(&text)));
                    }
                    Err(e) => self.magic_error(&format!("summary: {e}")),
                }
            }
            Magic::Top(n) => {
                let pid = self.child_pid();
                self.hooks.poll(pid);
                if self.hooks.control().connected().is_none() {
                    self.stream("stdout", "gpumem: no sites yet (gpumem-nb is not loaded in this kernel's child)");
                    return;
                }
                let reply = self.hooks.control().request(Op::Top { n: *n }, SLOW_TIMEOUT);
                match reply.map(|r| r.top) {
                    Ok(Some(top)) => {
                        let b = top.bundle();
                        self.display_text_html(&b.text, b.html.unwrap_or_default());
                    }
                    Ok(None) => self.magic_error("top: this gpumem-nb is too old to name sites"),
                    Err(e) => self.magic_error(&format!("top: {e}")),
                }
            }
            Magic::Snapshot(dir) => self.snapshot(count, dir.as_deref()),
            Magic::Explain => self.explain(count),
            // Ran inside the cell's measured time (`run_cell`), so that its report shows it.
            Magic::Trim => {}
            Magic::Fit(size) => self.fit(count, *size),
            Magic::Diff(a, b) => self.diff(count, a, b),
            Magic::Export(path, format) => {
                let body = match format {
                    ExportFormat::Csv => self.history.to_csv(),
                    ExportFormat::Json => self.history.to_json(),
                };
                let path = &ranked(path);
                match std::fs::write(path, body) {
                    Ok(()) => self.stream(
                        "stdout",
                        format!(
                            "gpumem: wrote {} to {}",
                            gpumem_nb::units::count(self.history.cells.len(), "cell"),
                            path.display()
                        ),
                    ),
                    Err(e) => self.magic_error(&format!("export: cannot write {}: {e}", path.display())),
                }
            }
            _ => {}
        }
    }

    /// `%gpumem ranks [CELL]`: the worker processes of every cell that had some, or of one cell,
    /// from the records (this cell's included: it was kept before the output magics run).
    fn ranks(&mut self, cell: Option<u64>) {
        let (shown, json) = match cell {
            None => {
                let cells = ranks::summary(&self.history.cells);
                if cells.is_empty() {
                    self.stream(
                        "stdout",
                        "gpumem: no cell of this session had worker processes on a device (processes the notebook \
                         started that hold device memory)",
                    );
                    return;
                }
                let json =
                    serde_json::json!({"cells": cells.iter().map(ranks::CellRanks::to_json).collect::<Vec<_>>()});
                (ranks::table(&cells), json)
            }
            Some(n) => match self.history.cells.iter().rev().find(|r| r.cell == n) {
                None => return self.magic_error(&format!("ranks: no cell [{n}] in this session's history")),
                Some(rec) => match ranks::CellRanks::of(rec) {
                    None => {
                        self.stream("stdout", format!("gpumem: cell [{n}] had no worker processes on a device"));
                        return;
                    }
                    Some(c) => (ranks::cell_table(&c), serde_json::json!({"cells": [c.to_json()]})),
                },
            },
        };
        let b = shown.bundle();
        let mut m = Map::new();
        m.insert("text/plain".into(), Value::String(b.text));
        m.insert("text/html".into(), Value::String(b.html.unwrap_or_default()));
        m.insert(ranks::RANKS_MIME.into(), json);
        self.display(m);
    }

    /// `%gpumem explain`: device 0's reserved bytes after this cell, from the crate's reading.
    fn explain(&mut self, count: u64) {
        let pid = self.child_pid();
        self.hooks.poll(pid);
        if self.hooks.control().connected().is_none() {
            self.magic_error("explain: gpumem-nb is not loaded in this notebook (no allocator to explain)");
            return;
        }
        let reply = self.hooks.control().request(Op::Read, SLOW_TIMEOUT);
        let reading = match reply {
            Ok(r) => r.devices.unwrap_or_default().into_iter().find(|d| d.device == 0),
            Err(e) => return self.magic_error(&format!("explain: {e}")),
        };
        let Some((d, parts)) = reading.and_then(|d| d.explain.clone().map(|p| (d, p))) else {
            return self.magic_error("explain: device 0 is not open in the notebook");
        };
        let pool = d.pool_used.zip(d.pool_reserved).map(|(used, reserved)| gpumem_nb::device::PoolUsage {
            used,
            reserved,
            used_high: d.pool_used_high.unwrap_or(used),
            reserved_high: d.pool_reserved_high.unwrap_or(reserved),
        });
        let view =
            ReservedView { device: d.device, backend: d.backend, when: format!("after cell {count}"), parts, pool };
        let b = view.bundle();
        let mut m = Map::new();
        m.insert("text/plain".into(), Value::String(b.text));
        m.insert("text/html".into(), Value::String(b.html.unwrap_or_default()));
        let data = serde_json::json!({"device": view.device, "parts": view.parts, "pool_held": view.pool_held()});
        m.insert(EXPLAIN_MIME.into(), data);
        self.display(m);
    }

    /// `%gpumem fit SIZE`: the session's recording (a snapshot of device 0 with every tracked
    /// allocation, written by the crate) planned here, in the kernel.
    fn fit(&mut self, count: u64, size: u64) {
        let pid = self.child_pid();
        self.hooks.poll(pid);
        if self.hooks.control().connected().is_none() {
            self.magic_error("fit: gpumem-nb is not loaded in this notebook (nothing recorded to plan from)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("gpumem-fit-{}-{count}", std::process::id()));
        let reply = self.hooks.control().request(Op::Snapshot { dir: dir.display().to_string() }, SLOW_TIMEOUT);
        let planned = match reply {
            Ok(_) => gpumem_nb::snapshot::read(&dir)
                .map_err(|e| e.to_string())
                .and_then(|snap| gpumem_nb::plan::fit_snapshot(&snap, size).map_err(|e| e.to_string())),
            Err(e) => Err(e.to_string()),
        };
        let _ = std::fs::remove_dir_all(&dir);
        match planned {
            Ok(mut plan) => {
                plan.context = self.history.cells.last().and_then(|r| r.context_after());
                // The CUDA pool as its driver counted it, cell by cell (each record's high-water
                // reservation, restarted at every cell): read, not replayed; the cells of this
                // process only, as the recording is (from the last restart on).
                let cells = &self.history.cells;
                let from = cells.iter().rposition(|r| r.restarted).unwrap_or(0);
                let pool_cells = cells[from..].iter().filter_map(|r| {
                    let reserved_high = r.pool.as_ref()?.reserved_high?;
                    Some(gpumem_nb::plan::PoolCell { cell: r.cell, reserved_high })
                });
                plan.pool = gpumem_nb::plan::PoolFit::new(pool_cells, size);
                let b = plan.bundle();
                let mut m = Map::new();
                m.insert("text/plain".into(), Value::String(b.text));
                m.insert("text/html".into(), Value::String(b.html.unwrap_or_default()));
                m.insert(FIT_MIME.into(), plan.to_json());
                self.display(m);
            }
            Err(e) => self.magic_error(&format!("fit: {e}")),
        }
    }

    fn snapshot(&mut self, count: u64, dir: Option<&Path>) {
        let cwd = std::env::current_dir().unwrap_or_default();
        let dir = match dir {
            Some(d) => absolute(d),
            None => cwd.join("gpumem-snapshots").join(format!("cell-{count}")),
        };
        let pid = self.child_pid();
        self.hooks.poll(pid);
        if self.hooks.control().connected().is_none() {
            self.magic_error("snapshot: gpumem-nb is not loaded in this notebook (nothing to snapshot)");
            return;
        }
        let reply = self.hooks.control().request(Op::Snapshot { dir: dir.display().to_string() }, SLOW_TIMEOUT);
        match reply {
            Ok(reply) => {
                let files = reply.files.unwrap_or_default();
                let mut text = format!("gpumem: snapshot written to {}\n", dir.display());
                let mut html = format!(
                    "<div style=\"font-family:monospace;font-size:12px\">snapshot written to <code>{}</code><ul>",
                    escape(&dir.display().to_string())
                );
                for p in [&files.html, &files.pickle, &files.json] {
                    if p.is_empty() {
                        continue;
                    }
                    let size = std::fs::metadata(p).map(|m| iec(m.len())).unwrap_or_else(|_| "?".into());
                    text.push_str(&format!("  {p} ({size})\n"));
                    let href =
                        Path::new(p).strip_prefix(&cwd).map(Path::to_path_buf).unwrap_or_else(|_| PathBuf::from(p));
                    html.push_str(&format!(
                        "<li><a href=\"{}\">{}</a> ({size})</li>",
                        escape(&href.display().to_string()),
                        escape(p)
                    ));
                }
                text.push_str("open trace_plot.html offline, or drop snapshot.pickle on pytorch.org/memory_viz");
                html.push_str(
                    "</ul>open <code>trace_plot.html</code> offline, or drop <code>snapshot.pickle</code> on \
                     pytorch.org/memory_viz</div>",
                );
                self.display_text_html(&text, html);
            }
            Err(e) => self.magic_error(&format!("snapshot to {}: {e}", dir.display())),
        }
    }
}

/// A path a magic names, made absolute from the working directory (the notebook's) and
/// normalised.
pub(super) fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() { normalize(p) } else { normalize(&std::env::current_dir().unwrap_or_default().join(p)) }
}

/// `a/b/../c` → `a/c`, lexically (the directory may not exist yet).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            std::path::Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// `FILE` with the process's rank before its extension (`history_rank1.csv` under `RANK=1`),
/// so that every rank of a job writes its own file; `FILE` itself without a rank.
fn ranked(path: &std::path::Path) -> std::path::PathBuf {
    let suffix = gpumem_nb::snapshot::files::rank_suffix();
    match (path.file_stem().and_then(|s| s.to_str()), path.extension().and_then(|e| e.to_str())) {
        (Some(stem), Some(ext)) if !suffix.is_empty() => path.with_file_name(format!("{stem}{suffix}.{ext}")),
        _ => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_is_lexical() {
        assert_eq!(normalize(Path::new("/a/nb/../target/./x")), PathBuf::from("/a/target/x"));
    }
}
