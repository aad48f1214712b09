//! The kernel's core, shared by the Jupyter kernel and headless `run`: an evcxr
//! `CommandContext`, the per-cell hooks, magics and reports.
//!
//! The engine is blocking and lives on one thread. Its outputs go to a [`Sink`] in order: the
//! cell's streams, then its result or error, then the memory report (its own `display_data`),
//! then whatever the magics show.

use crate::control::{CONTROL_VAR, ControlServer};
use crate::hooks::{self, HOOK_TIMEOUT, Hooks};
use crate::magic::{self, ExportFormat, Magic};
use crate::report::{CellRecord, History};
use gpumem_nb::render::escape;
use gpumem_nb::units::iec;
use serde_json::{Map, Value, json};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Timeout of the heavier requests (snapshot, chart, summary).
const SLOW_TIMEOUT: Duration = Duration::from_secs(120);

/// One output of a cell, in the order it is produced.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// The cell's code is about to run with this execution count.
    ExecuteInput {
        /// The code as sent.
        code: String,
        /// Execution count.
        count: u64,
    },
    /// Text on `stdout` or `stderr`.
    Stream {
        /// `stdout` or `stderr`.
        name: &'static str,
        /// The text (lines end with `\n`).
        text: String,
    },
    /// The value of the cell's last expression, by MIME type.
    ExecuteResult {
        /// Execution count.
        count: u64,
        /// MIME type → data.
        data: Map<String, Value>,
    },
    /// Something shown (reports, magics).
    Display {
        /// MIME type → data.
        data: Map<String, Value>,
    },
    /// The cell failed.
    Error(ErrorInfo),
}

/// A cell's error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorInfo {
    /// Short name.
    pub ename: String,
    /// One-line value.
    pub evalue: String,
    /// Lines to show.
    pub traceback: Vec<String>,
}

/// Where the engine's outputs go.
pub trait Sink: Send + Sync {
    /// One output, in order.
    fn emit(&self, out: Output);
    /// Asks the user for a line (the cell called `evcxr_input`); only called when the
    /// request allowed stdin.
    fn input(&self, prompt: &str, password: bool) -> String;
}

/// What an execution ended with.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Execution count.
    pub count: u64,
    /// `Some` when the reply is an error.
    pub error: Option<ErrorInfo>,
    /// The record of the cell, when it ran code.
    pub record: Option<CellRecord>,
}

/// `%gpumem record` as the session wants it (re-sent to every new child).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RecordSetting {
    on: bool,
    max_entries: Option<u64>,
    stacks: bool,
}

impl RecordSetting {
    fn request(&self) -> Value {
        json!({
            "enabled": if self.on { "all" } else { "off" },
            "max_entries": self.max_entries.unwrap_or(u64::from(u32::MAX)),
            "stacks": self.stacks,
        })
    }
}

/// The engine.
pub struct Engine {
    ctx: evcxr::CommandContext,
    child: Arc<Mutex<Child>>,
    hooks: Hooks,
    sink: Arc<dyn Sink>,
    pump: StreamPump,
    count: u64,
    history: History,
    show: bool,
    record: RecordSetting,
    interrupted: Arc<AtomicBool>,
    /// Hook timings of the last cell (pre, post), microseconds.
    pub last_hook_us: (u64, u64),
}

/// The active toolchain's directory holding the `libstd-*.so` that evcxr's cells link against:
/// `$(rustc --print sysroot)/lib/rustlib/<host>/lib` (rustup's layout) or `…/lib`.
fn toolchain_lib_dir() -> Option<std::path::PathBuf> {
    let out = std::process::Command::new("rustc").args(["--print", "sysroot"]).output().ok()?;
    let sysroot = std::path::PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    let has_std = |dir: &std::path::Path| {
        std::fs::read_dir(dir).is_ok_and(|rd| {
            rd.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("libstd-") && n.ends_with(".so")))
        })
    };
    let rustlib = sysroot.join("lib").join("rustlib");
    let mut candidates: Vec<std::path::PathBuf> =
        std::fs::read_dir(&rustlib).map(|rd| rd.flatten().map(|e| e.path().join("lib")).collect()).unwrap_or_default();
    candidates.push(sysroot.join("lib"));
    candidates.into_iter().find(|d| has_std(d))
}

impl Engine {
    /// Starts evcxr (its child inherits `GPUMEM_NB_CONTROL`) and the control socket.
    /// `interrupted` is set by whoever kills the child on an interrupt request.
    pub fn new(sink: Arc<dyn Sink>, interrupted: Arc<AtomicBool>) -> anyhow::Result<Engine> {
        let control = ControlServer::new()?;
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        // The child (and every restarted child: evcxr re-spawns this same command) gets the
        // socket path. Set on the command rather than with `set_var`, which is `unsafe`.
        cmd.env(CONTROL_VAR, control.socket_path());
        // Cells are cdylibs linked against the toolchain's `libstd-*.so` (evcxr builds with
        // `-C prefer-dynamic`): the child must find it. Cells normally carry an rpath to it, but
        // a kernel started by Jupyter (not under cargo/rustup) has been seen building cells
        // without one, so the child also gets the toolchain's std directory on its library path.
        if let Some(lib) = toolchain_lib_dir() {
            let mut paths = vec![lib];
            if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
                paths.extend(std::env::split_paths(&old));
            }
            if let Ok(joined) = std::env::join_paths(paths) {
                cmd.env("LD_LIBRARY_PATH", joined);
            }
        }
        let (eval, outputs) = evcxr::EvalContext::with_subprocess_command(cmd)
            .map_err(|e| anyhow::anyhow!("evcxr failed to start: {e}"))?;
        let mut ctx = evcxr::CommandContext::with_eval_context(eval);
        let child = ctx.process_handle();
        let pump = StreamPump::start(outputs, sink.clone());
        if let Err(e) = ctx.execute(":load_config --quiet") {
            eprintln!("gpumem-kernel: evcxr startup configuration not loaded: {e}");
        }
        Ok(Engine {
            ctx,
            child,
            hooks: Hooks::new(control),
            sink,
            pump,
            count: 0,
            history: History::default(),
            show: true,
            record: RecordSetting::default(),
            interrupted,
            last_hook_us: (0, 0),
        })
    }

    /// The process handle of the evcxr child (valid across restarts): kill it to interrupt.
    pub fn process_handle(&self) -> Arc<Mutex<Child>> {
        self.child.clone()
    }

    /// The current child's pid.
    pub fn child_pid(&self) -> Option<u32> {
        self.child.lock().ok().map(|c| c.id())
    }

    /// The control socket's path.
    pub fn control_path(&self) -> &Path {
        self.hooks.control.socket_path()
    }

    /// The session's records.
    pub fn history(&self) -> &[CellRecord] {
        &self.history.cells
    }

    fn stream(&self, name: &'static str, text: impl Into<String>) {
        let mut text = text.into();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        self.sink.emit(Output::Stream { name, text });
    }

    fn display(&self, data: Map<String, Value>) {
        self.sink.emit(Output::Display { data });
    }

    fn display_text_html(&self, text: &str, html: String) {
        let mut m = Map::new();
        m.insert("text/plain".into(), Value::String(text.to_string()));
        m.insert("text/html".into(), Value::String(html));
        self.display(m);
    }

    fn magic_error(&self, what: &str) {
        self.stream("stderr", format!("%gpumem: {what}\n{}", magic::usage()));
    }

    /// Runs one cell: magics, hooks, evcxr, report.
    pub fn execute(&mut self, code: &str, allow_stdin: bool) -> Outcome {
        self.count += 1;
        let count = self.count;
        self.sink.emit(Output::ExecuteInput { code: code.to_string(), count });
        let (magics, run_code) = magic::parse(code);
        let mut cell_magic: Option<(bool, Option<PathBuf>)> = None;
        for m in &magics {
            match m {
                Magic::Bad { line, text, error } => self.magic_error(&format!("{error} (line {line}: `{text}`)")),
                Magic::Cell { timeline, snapshot } => cell_magic = Some((*timeline, snapshot.clone())),
                m if !m.runs_after_code() => self.apply_setting(m),
                _ => {}
            }
        }
        let mut outcome = Outcome { count, error: None, record: None };
        if magic::has_code(&run_code) {
            let (error, rec) = self.run_cell(count, code, &run_code, allow_stdin, cell_magic.as_ref());
            outcome.error = error;
            outcome.record = rec;
        } else if let Some((timeline, snap)) = &cell_magic {
            // A %%gpumem cell without code: nothing was recorded, but honour the requests.
            if *timeline || snap.is_some() {
                self.stream("stderr", "%%gpumem: the cell has no code to record");
            }
        }
        for m in magics.iter().filter(|m| m.runs_after_code()) {
            self.run_output_magic(m, count);
        }
        outcome
    }

    fn run_cell(
        &mut self,
        count: u64,
        original: &str,
        run_code: &str,
        allow_stdin: bool,
        cell_magic: Option<&(bool, Option<PathBuf>)>,
    ) -> (Option<ErrorInfo>, Option<CellRecord>) {
        // ---- pre hooks
        let before = self.hooks.before(count, self.child_pid());
        if let Some((_, snap)) = cell_magic {
            let setting = RecordSetting { on: true, max_entries: None, stacks: snap.is_some() };
            if self.hooks.control.connected().is_some() {
                let _ = self.hooks.control.request("record", setting.request(), HOOK_TIMEOUT);
            }
        }

        // ---- the cell
        self.interrupted.store(false, Ordering::SeqCst);
        self.pump.begin_cell();
        let t0 = Instant::now();
        let sink = self.sink.clone();
        let input = move |prompt: &str, password: bool| {
            if allow_stdin { sink.input(prompt, password) } else { String::new() }
        };
        // `:restart` is done here: evcxr 0.22's own `:restart` leaves the cell's copy of the
        // variable list behind, so the next cell asks the fresh child for variables it never had
        // and aborts it.
        let restart_here = run_code.lines().any(|l| l.trim() == ":restart");
        let rest: String;
        let run_code = if restart_here {
            self.restart_child();
            self.stream("stdout", "Child process restarted");
            rest = run_code
                .split_inclusive('\n')
                .map(|l| {
                    if l.trim() == ":restart" { l.replacen(":restart", "// :restart (done)", 1) } else { l.to_string() }
                })
                .collect();
            rest.as_str()
        } else {
            run_code
        };
        let result = if magic::has_code(run_code) {
            self.ctx.execute_with_callbacks(
                run_code,
                &mut evcxr::EvalCallbacks { input_reader: &|req| input(&req.prompt, req.is_password) },
            )
        } else {
            Ok(evcxr::EvalOutputs::new())
        };
        let wall = t0.elapsed();
        self.pump.flush();

        // ---- post hooks
        let after = self.hooks.after(count, self.child_pid());
        self.last_hook_us = (before.us, after.us);

        // ---- outputs: result or error, then the report
        let interrupted = self.interrupted.swap(false, Ordering::SeqCst);
        let mut error = None;
        let mut terminated: Option<String> = None;
        match result {
            Ok(out) => {
                let data = mime_map(out.content_by_mime_type);
                if !data.is_empty() {
                    self.sink.emit(Output::ExecuteResult { count, data });
                }
            }
            Err(e) => {
                if let evcxr::Error::SubprocessTerminated(msg) = &e {
                    terminated = Some(msg.lines().last().unwrap_or("").to_string());
                }
                let info = error_info(&e, run_code, interrupted);
                self.sink.emit(Output::Error(info.clone()));
                error = Some(info);
            }
        }
        let mut rec = hooks::record(count, &before, &after);
        rec.status = if error.is_some() {
            "error".into()
        } else if self.pump.panicked() {
            "panicked".into()
        } else {
            "ok".into()
        };
        rec.first_line = first_code_line(run_code);
        rec.source_hash = source_hash(run_code);
        rec.wall_ms = wall.as_secs_f64() * 1000.0;
        if rec.restarted {
            rec.restart_reason = Some(if interrupted {
                "interrupted".into()
            } else if let Some(t) = &terminated {
                format!("crashed: {}", t.trim())
            } else if restart_here || run_code.lines().any(|l| l.trim() == ":clear") {
                "restart requested".into()
            } else {
                "child process replaced".into()
            });
        }
        self.history.warn(&mut rec);
        if self.show {
            self.display(rec.display());
        }
        self.history.cells.push(rec.clone());

        // ---- %%gpumem: timeline, snapshot, then the session's own recording setting again
        if let Some((timeline, snap)) = cell_magic {
            let was_loaded = before.crate_readings.is_some() && before.pid == after.pid;
            self.finish_cell_magic(count, *timeline, snap.as_deref(), was_loaded);
        }
        let _ = original;
        (error, Some(rec))
    }

    fn finish_cell_magic(&mut self, count: u64, timeline: bool, snap: Option<&Path>, was_loaded: bool) {
        if self.hooks.control.connected().is_none() {
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
            match self.hooks.control.request("history_svg", json!({}), SLOW_TIMEOUT) {
                Ok(reply) => {
                    let mut m = Map::new();
                    let text = reply.get("text").and_then(Value::as_str).unwrap_or("memory over time");
                    m.insert("text/plain".into(), Value::String(format!("cell {count}: {text}")));
                    if let Some(svg) = reply.get("svg").and_then(Value::as_str) {
                        m.insert("image/svg+xml".into(), Value::String(svg.to_string()));
                    }
                    self.display(m);
                }
                Err(e) => self.stream("stderr", format!("%%gpumem --timeline: {e}")),
            }
        }
        if let Some(dir) = snap {
            self.snapshot(count, Some(dir));
        }
        let _ = self.hooks.control.request("record", self.record.request(), HOOK_TIMEOUT);
    }

    fn apply_setting(&mut self, m: &Magic) {
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
                    Some(b) => self.stream("stdout", format!("gpumem: budget {} per cell peak", iec(*b))),
                    None => self.stream("stdout", "gpumem: budget off"),
                }
            }
            Magic::Reset => {
                let n = self.history.cells.len();
                self.history.cells.clear();
                self.stream("stdout", format!("gpumem: forgot {n} cells of history (the allocator is untouched)"));
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
                if self.hooks.control.connected().is_some() {
                    match self.hooks.control.request("record", self.record.request(), HOOK_TIMEOUT) {
                        Ok(_) => self.stream("stdout", what),
                        Err(e) => self.magic_error(&format!("record failed: {e}")),
                    }
                } else {
                    self.stream("stdout", format!("{what} (from when gpumem-nb is first used)"));
                }
            }
            Magic::Help => {
                let h = magic::help_text();
                self.display_text_html(&h, format!("<pre style=\"font-size:12px\">{}</pre>", escape(&h)));
            }
            _ => {}
        }
    }

    fn run_output_magic(&mut self, m: &Magic, count: u64) {
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
                if let Some(svg) = b.svg {
                    data.insert("image/svg+xml".into(), Value::String(svg));
                }
                self.display(data);
            }
            Magic::Summary => {
                let pid = self.child_pid();
                self.hooks.poll(pid);
                match self.hooks.control.request("summary", json!({}), SLOW_TIMEOUT) {
                    Ok(reply) => {
                        let text = reply.get("text").and_then(Value::as_str).unwrap_or("").to_string();
                        self.display_text_html(&text, format!("<pre style=\"font-size:12px\">{}</pre>", escape(&text)));
                    }
                    Err(e) => self.magic_error(&format!("summary: {e}")),
                }
            }
            Magic::Snapshot(dir) => self.snapshot(count, dir.as_deref()),
            Magic::Export(path, format) => {
                let body = match format {
                    ExportFormat::Csv => self.history.to_csv(),
                    ExportFormat::Json => self.history.to_json(),
                };
                match std::fs::write(path, body) {
                    Ok(()) => self.stream(
                        "stdout",
                        format!("gpumem: wrote {} cells to {}", self.history.cells.len(), path.display()),
                    ),
                    Err(e) => self.magic_error(&format!("export: cannot write {}: {e}", path.display())),
                }
            }
            _ => {}
        }
    }

    fn snapshot(&mut self, count: u64, dir: Option<&Path>) {
        let cwd = std::env::current_dir().unwrap_or_default();
        let dir = normalize(&match dir {
            Some(d) if d.is_absolute() => d.to_path_buf(),
            Some(d) => cwd.join(d),
            None => cwd.join("gpumem-snapshots").join(format!("cell-{count}")),
        });
        let pid = self.child_pid();
        self.hooks.poll(pid);
        if self.hooks.control.connected().is_none() {
            self.magic_error("snapshot: gpumem-nb is not loaded in this notebook (nothing to snapshot)");
            return;
        }
        match self.hooks.control.request("snapshot", json!({"dir": dir}), SLOW_TIMEOUT) {
            Ok(reply) => {
                let files = reply.get("files").cloned().unwrap_or(Value::Null);
                let mut text = format!("gpumem: snapshot written to {}\n", dir.display());
                let mut html = format!(
                    "<div style=\"font-family:monospace;font-size:12px\">snapshot written to <code>{}</code><ul>",
                    escape(&dir.display().to_string())
                );
                for key in ["html", "pickle", "json"] {
                    let Some(p) = files.get(key).and_then(Value::as_str) else { continue };
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

    /// Completions at `cursor` (a character offset, as Jupyter sends it): `%gpumem` verbs on
    /// magic lines, evcxr (rust-analyzer) elsewhere. Returns matches and the replaced range in
    /// characters.
    pub fn complete(&mut self, code: &str, cursor: usize) -> (Vec<String>, usize, usize) {
        let byte = char_to_byte(code, cursor);
        let line_start = code[..byte].rfind('\n').map_or(0, |i| i + 1);
        let line = &code[line_start..byte];
        if let Some(rest) = line.trim_start().strip_prefix("%gpumem ") {
            let word_start = byte - rest.len() + rest.rfind(' ').map_or(0, |i| i + 1);
            let prefix = &code[word_start..byte];
            let matches: Vec<String> = magic::COMMANDS
                .iter()
                .filter(|c| c.verb != "%%gpumem" && c.verb.starts_with(prefix))
                .map(|c| c.verb.to_string())
                .collect();
            let start = code[..word_start].chars().count();
            return (matches, start, cursor);
        }
        // Blank out magic lines (same length) so rust-analyzer sees no `%`.
        let blanked: String = code
            .split_inclusive('\n')
            .map(|l| {
                let t = l.trim_start();
                if t.starts_with("%gpumem") || t.starts_with("%%gpumem") {
                    l.chars().map(|c| if c == '\n' { '\n' } else { ' ' }).collect()
                } else {
                    l.to_string()
                }
            })
            .collect();
        match self.ctx.completions(&blanked, byte) {
            Ok(c) => {
                let start = blanked[..c.start_offset.min(blanked.len())].chars().count();
                let end = blanked[..c.end_offset.min(blanked.len())].chars().count();
                (c.completions.into_iter().map(|c| c.code).collect(), start, end)
            }
            Err(_) => (Vec::new(), cursor, cursor),
        }
    }

    /// Restarts the evcxr child the way a crash does (kill it, then let evcxr notice on a trivial
    /// evaluation and start a new one), which also drops the variables from evcxr's state.
    fn restart_child(&mut self) {
        self.kill_child();
        if let Ok(mut c) = self.child.lock() {
            let _ = c.wait();
        }
        // Fails with "subprocess terminated", and evcxr restarts the child.
        let _ = self.ctx.execute("()");
    }

    /// Kills the child (for shutdown; evcxr would otherwise wait for it).
    pub fn kill_child(&self) {
        if let Ok(mut c) = self.child.lock() {
            let _ = c.kill();
        }
    }
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

fn char_to_byte(s: &str, chars: usize) -> usize {
    s.char_indices().nth(chars).map_or(s.len(), |(i, _)| i)
}

/// evcxr's content blocks as a Jupyter MIME bundle (JSON types parsed).
fn mime_map(content: std::collections::HashMap<String, String>) -> Map<String, Value> {
    let mut m = Map::new();
    for (mime, data) in content {
        let v = if mime.contains("json") {
            serde_json::from_str(&data).unwrap_or(Value::String(data))
        } else {
            Value::String(data)
        };
        m.insert(mime, v);
    }
    m
}

fn error_info(e: &evcxr::Error, code: &str, interrupted: bool) -> ErrorInfo {
    match e {
        evcxr::Error::CompilationErrors(errors) => {
            let mut tb = Vec::new();
            let lines: Vec<&str> = code.lines().collect();
            for err in errors {
                let head = match err.code() {
                    Some(c) => format!("\x1b[1;31m{}[{c}]\x1b[0m: {}", err.level(), err.message()),
                    None => format!("\x1b[1;31m{}\x1b[0m: {}", err.level(), err.message()),
                };
                tb.push(head);
                for sm in err.spanned_messages() {
                    if let Some(span) = sm.span {
                        let src = lines.get(span.start_line.saturating_sub(1)).copied().unwrap_or("");
                        tb.push(format!("  --> cell line {}:{}", span.start_line, span.start_column));
                        tb.push(format!("   | {src}"));
                        let width = if span.end_line == span.start_line {
                            span.end_column.saturating_sub(span.start_column).max(1)
                        } else {
                            1
                        };
                        tb.push(format!(
                            "   | {}{} {}",
                            " ".repeat(span.start_column.saturating_sub(1)),
                            "^".repeat(width),
                            sm.label
                        ));
                    } else if !err.is_from_user_code() {
                        tb.extend(sm.lines.iter().cloned());
                    }
                }
                for h in err.help() {
                    tb.push(format!("   = help: {h}"));
                }
                if let Some(hint) = err.evcxr_extra_hint() {
                    tb.push(format!("   = note: {hint}"));
                }
                if !err.is_from_user_code() && err.spanned_messages().is_empty() {
                    tb.extend(err.rendered().lines().map(str::to_string));
                }
            }
            let evalue = errors.first().map(|e| e.message()).unwrap_or_default();
            ErrorInfo { ename: "CompilationError".into(), evalue, traceback: tb }
        }
        evcxr::Error::SubprocessTerminated(msg) => {
            let ename = if interrupted { "Interrupted" } else { "SubprocessTerminated" };
            let mut tb: Vec<String> = msg.lines().map(str::to_string).collect();
            tb.push(if interrupted {
                "The cell was interrupted: the evcxr child was stopped and started again (variables are lost; \
                 gpumem's per-cell history is kept)."
                    .to_string()
            } else {
                "The evcxr child process died and was started again (variables are lost; gpumem's per-cell \
                 history is kept)."
                    .to_string()
            });
            ErrorInfo { ename: ename.into(), evalue: msg.lines().last().unwrap_or("").to_string(), traceback: tb }
        }
        other => {
            let msg = other.to_string();
            ErrorInfo {
                ename: "Error".into(),
                evalue: msg.lines().next().unwrap_or("").to_string(),
                traceback: msg.lines().map(str::to_string).collect(),
            }
        }
    }
}

fn first_code_line(code: &str) -> String {
    let l = code.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with("//")).unwrap_or("");
    if l.chars().count() > 48 { format!("{}…", l.chars().take(47).collect::<String>()) } else { l.to_string() }
}

/// A stable hash of a cell's code (whitespace at line ends ignored): FNV-1a, hex.
fn source_hash(code: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for line in code.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// Forwards evcxr's stdout/stderr lines to the sink on its own thread; `flush` is a barrier
/// that makes sure every line evcxr has handed over is out before the result.
struct StreamPump {
    flush_tx: crossbeam_channel::Sender<crossbeam_channel::Sender<()>>,
    panicked: Arc<AtomicBool>,
}

impl StreamPump {
    fn start(outputs: evcxr::EvalContextOutputs, sink: Arc<dyn Sink>) -> StreamPump {
        let (flush_tx, flush_rx) = crossbeam_channel::unbounded::<crossbeam_channel::Sender<()>>();
        let panicked = Arc::new(AtomicBool::new(false));
        let flag = panicked.clone();
        let forward = move |name: &'static str, first: String, rx: &crossbeam_channel::Receiver<String>| {
            let mut text = first;
            text.push('\n');
            // Batch what is already there (no waiting).
            for _ in 0..1000 {
                match rx.try_recv() {
                    Ok(l) => {
                        text.push_str(&l);
                        text.push('\n');
                    }
                    Err(_) => break,
                }
            }
            if name == "stderr" && text.contains("panicked at") {
                flag.store(true, Ordering::SeqCst);
            }
            sink.emit(Output::Stream { name, text });
        };
        std::thread::Builder::new()
            .name("gpumem-streams".into())
            .spawn(move || {
                let (out, err) = (outputs.stdout, outputs.stderr);
                // Both senders belong to the evcxr context and go away with it: stop then.
                loop {
                    crossbeam_channel::select! {
                        recv(out) -> l => match l {
                            Ok(l) => forward("stdout", l, &out),
                            Err(_) => return,
                        },
                        recv(err) -> l => match l {
                            Ok(l) => forward("stderr", l, &err),
                            Err(_) => return,
                        },
                        recv(flush_rx) -> ack => match ack {
                            Ok(ack) => {
                                while let Ok(l) = out.try_recv() { forward("stdout", l, &out) }
                                while let Ok(l) = err.try_recv() { forward("stderr", l, &err) }
                                let _ = ack.send(());
                            }
                            Err(_) => return,
                        },
                    }
                }
            })
            .expect("spawn the stream thread");
        StreamPump { flush_tx, panicked }
    }

    fn begin_cell(&self) {
        self.panicked.store(false, Ordering::SeqCst);
    }

    /// Whether a panic message went by on stderr since [`begin_cell`](Self::begin_cell).
    fn panicked(&self) -> bool {
        self.panicked.load(Ordering::SeqCst)
    }

    /// Waits until every line received so far has been emitted. stderr comes through a pipe of
    /// its own, so its last lines may trail stdout: give them a moment.
    fn flush(&self) {
        std::thread::sleep(Duration::from_micros(300));
        let (tx, rx) = crossbeam_channel::bounded(1);
        if self.flush_tx.send(tx).is_ok() {
            let _ = rx.recv_timeout(Duration::from_secs(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(first_code_line("// %gpumem on\n\n  let x = 1;\nx"), "let x = 1;");
        assert_eq!(source_hash("let x = 1;  \n\nx"), source_hash("let x = 1;\nx\n"));
        assert_ne!(source_hash("a"), source_hash("b"));
        assert_eq!(char_to_byte("héllo", 2), 3);
        assert_eq!(char_to_byte("hé", 5), 3);
        assert_eq!(normalize(Path::new("/a/nb/../target/./x")), PathBuf::from("/a/target/x"));
        let mut m = std::collections::HashMap::new();
        m.insert("application/json".to_string(), "{\"a\":1}".to_string());
        m.insert("text/plain".to_string(), "2".to_string());
        let mm = mime_map(m);
        assert_eq!(mm["application/json"]["a"], 1);
        assert_eq!(mm["text/plain"], "2");
    }
}
