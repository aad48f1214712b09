//! The kernel's core, shared by the Jupyter kernel and headless `run`: an evcxr
//! `CommandContext`, the per-cell hooks, magics and reports.
//!
//! The engine is blocking and lives on one thread. Its outputs go to a [`Sink`] in order: the
//! cell's streams, then its result or error, then the memory report (its own `display_data`),
//! then whatever the magics show.
//!
//! - `magics`: what the `%gpumem` / `%%gpumem` magics do to the engine; `diff`: `%gpumem diff`.
//! - `errors`: evcxr's errors as [`ErrorInfo`], and the code-derived fields of a record.
//! - `pump`: the thread forwarding evcxr's stdout/stderr to the sink; `panic`: the cell's panic
//!   (and another thread's while it runs), taken out of stderr, as its error; `backtrace`: a
//!   backtrace folded to the notebook's frames, and where one sits in an error's text.
//!
//! What Jupyter sees of a cell, in order: its streams, its result or error (a panic and a bad
//! magic are errors, as a compile error is), what its `%gpumem` output magics show, and last its
//! report. A long cell's live line is replaced in place by the report when nothing came after
//! the live line; otherwise the live line is emptied and the report follows the cell's last
//! output.

mod backtrace;
mod diff;
mod errors;
mod magics;
mod outcome;
mod panic;
mod prepare;
mod pump;
mod sweep;
mod trim;

use crate::build::dep;
use crate::build::display::Display;
use crate::build::progress;
use crate::build::session_deps::{self, SessionDeps};
use crate::build::toolchain;
use crate::cell::hooks::{self, Hooks};
use crate::cell::magic::{self, Magic};
use crate::cell::stderr_sync::{SYNC_VAR, StderrSync};
use crate::output::{ErrorInfo, Output, Progress, Sink};
use crate::session::control::{CONTROL_VAR, ControlServer};
use crate::session::history::History;
use errors::first_code_line;
use gpumem_nb::kernel::report::CellRecord;
use magics::RecordSetting;
use outcome::RanCode;
use pump::StreamPump;
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the kernel runs when it is idle after a cell that loaded new dependencies, its output
/// dropped: statements that make type inference resolve std's names, an operator's trait and a
/// method (the standard library's and every dependency's items and trait impls are read once,
/// here, rather than in the user's next cell), in a variable dropped at once (nothing is left in
/// the session). The next build also records the command a build without cargo runs.
const WARM_UP: &str = "let gpumem_warm_up = format!(\"{}\", Vec::<u8>::new().len() + 1);\ndrop(gpumem_warm_up);";

/// Timeout of the heavier requests (snapshot, chart, summary).
const SLOW_TIMEOUT: Duration = Duration::from_secs(120);

/// The engine's sink: passes everything on and counts the outputs that are not the live line, so
/// that the report can tell whether the live line is still the cell's last output.
struct Tally {
    inner: Arc<dyn Sink>,
    /// Outputs other than the live line so far.
    n: AtomicU64,
    /// The live line shown last (its display id) and the count when it was shown.
    live: Mutex<Option<(String, u64)>>,
}

impl Tally {
    /// Whether something other than the live line `id` was shown after it.
    fn after_live(&self, id: &str) -> bool {
        let at = self.live.lock().ok().and_then(|l| l.as_ref().filter(|(i, _)| i == id).map(|(_, n)| *n));
        at.is_none_or(|at| self.n.load(Ordering::SeqCst) > at)
    }
}

impl Sink for Tally {
    fn emit(&self, out: Output) {
        match &out {
            Output::Updatable { id, .. } => {
                if let Ok(mut l) = self.live.lock() {
                    *l = Some((id.clone(), self.n.load(Ordering::SeqCst)));
                }
            }
            Output::Update { .. } => {}
            _ => {
                self.n.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.inner.emit(out);
    }

    fn input(&self, prompt: &str, password: bool) -> String {
        self.inner.input(prompt, password)
    }

    fn updates_in_place(&self) -> bool {
        self.inner.updates_in_place()
    }

    fn compiling(&self, cell: u64, progress: &Progress) {
        self.inner.compiling(cell, progress);
    }
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

/// The engine.
pub struct Engine {
    ctx: evcxr::CommandContext,
    child: Arc<Mutex<Child>>,
    hooks: Hooks,
    sink: Arc<dyn Sink>,
    tally: Arc<Tally>,
    pump: StreamPump,
    /// The barrier on the child's stderr (`crate::cell::stderr_sync`).
    sync: Option<StderrSync>,
    count: u64,
    history: History,
    show: bool,
    record: RecordSetting,
    interrupted: Arc<AtomicBool>,
    /// Hook timings of the last cell (pre, post), microseconds.
    pub last_hook_us: (u64, u64),
    /// Said once, as a display message of the first cell (another build directory, a toolchain
    /// without `rust-src`).
    notice: Option<String>,
    /// The cell in which the notebook process's CUDA context was lost, and why: later cells run
    /// (host code works; every device call fails) and an error of theirs says so, until
    /// `%gpumem restart`.
    lost: Option<(u64, gpumem_nb::device::LostContext)>,
    /// A thread of the notebook's process (not the cells' own) that panicked while a cell ran:
    /// (that cell, the thread's name, its message's first line). A framework's device thread
    /// (burn's) does not come back; a later cell that fails is told so, until the process is
    /// replaced.
    died: Option<(u64, String, String)>,
    /// Why `%gpumem restart` replaced the child before this cell's code (its record says so).
    restarted_by_magic: Option<String>,
    /// The variables lost with the last process replaced (an interrupt, a crash, a restart): the
    /// names not defined again since, the cell in which it happened and why. An error naming one
    /// says so.
    gone: Option<outcome::Gone>,
    /// The cells' build, watched for the live line and the console.
    compile: Option<Arc<Mutex<progress::Watch>>>,
    /// The gpumem-nb this kernel was built with (what `:dep gpumem-nb` loads).
    own: dep::Own,
    /// A cell declared `:dep gpumem-nb` (it loads in the child at its first use).
    own_declared: bool,
    /// The session's `:dep` crates, loaded once as one shared library.
    deps: SessionDeps,
    /// A cell's value shown in one compile (`crate::build::display`).
    display: Display,
    /// When each cell that ran code ended (the child's pid then, µs since the epoch), for
    /// `%gpumem diff` of cells.
    cell_ends: std::collections::BTreeMap<u64, (Option<u32>, i64)>,
    /// Every cell's record counted for the metrics endpoint, and the endpoint when it is on.
    metrics: crate::session::metrics::Endpoint,
    /// The idle work: the cell whose new dependencies type inference has yet to read; the last
    /// such work done (the cell, when it ended).
    warm_up: Option<u64>,
    warmed: Option<(u64, Instant)>,
    /// When the engine was ready (evcxr started): a request that came before it waited for the
    /// kernel's start.
    ready: Instant,
}

impl Engine {
    /// Starts evcxr (its child inherits `GPUMEM_NB_CONTROL`) and the control socket.
    /// `interrupted` is set by whoever kills the child on an interrupt request.
    pub fn new(sink: Arc<dyn Sink>, interrupted: Arc<AtomicBool>) -> anyhow::Result<Engine> {
        let tally = Arc::new(Tally { inner: sink, n: AtomicU64::new(0), live: Mutex::new(None) });
        let sink: Arc<dyn Sink> = tally.clone();
        let control = ControlServer::new()?;
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        // The child (and every restarted child: evcxr re-spawns this same command) gets the
        // socket path. Set on the command rather than with `set_var`, which is `unsafe`.
        cmd.env(CONTROL_VAR, control.socket_path());
        let sync_path = control.dir().join("stderr-sync.sock");
        let sync = match StderrSync::bind(&sync_path) {
            Ok(s) => {
                cmd.env(SYNC_VAR, &sync_path);
                Some(s)
            }
            Err(e) => {
                eprintln!("gpumem-kernel: no stderr barrier ({e}): a panic's text may trail the cell's report");
                None
            }
        };
        // Cells are cdylibs linked against the toolchain's `libstd-*.so` (evcxr builds with
        // `-C prefer-dynamic`): the child must find it. A cell's rpath does not: rustc makes it
        // relative to `deps/`, where it writes the library, and evcxr loads cargo's copy one
        // directory up (`$ORIGIN/../` seven times from `debug/` ends at `/`). So the child gets
        // the host's std directory on its library path (the host's only: see `std_lib_dir`).
        let dirs = toolchain::dirs();
        if let Some(lib) = dirs.as_ref().ok().and_then(toolchain::std_lib_dir) {
            let mut paths = vec![lib];
            if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
                paths.extend(std::env::split_paths(&old));
            }
            if let Ok(joined) = std::env::join_paths(paths) {
                cmd.env("LD_LIBRARY_PATH", joined);
            }
        }
        let (mut eval, outputs) = evcxr::EvalContext::with_subprocess_command(cmd).map_err(|e| {
            // Most often no toolchain: then the error leads with what to install.
            match toolchain::take_notice() {
                Some(notice) => {
                    anyhow::anyhow!("{} (evcxr failed to start: {e})", notice.trim_start_matches("gpumem-kernel: "))
                }
                // A toolchain on PATH that does not run (rustup's proxies with no toolchain):
                // its own words first, and what fixes it.
                None => match &dirs {
                    Err(why) => anyhow::anyhow!(
                        "the Rust toolchain on PATH does not run: {why}. Install or choose one (`rustup default \
                         stable`, or `{}`), then restart the kernel (evcxr failed to start: {e})",
                        toolchain::RUSTUP_COMMAND
                    ),
                    Ok(_) => anyhow::anyhow!("evcxr failed to start: {e}"),
                },
            }
        })?;
        // Cells keep line tables for their own code (`crate::build::cell_lines`): sites then name
        // their cell lines. Set as evcxr's `:build_env` does, so `install`'s prebuild and every
        // session build alike.
        let mut state = eval.state();
        if crate::build::cell_lines::enabled() {
            for (key, value) in crate::build::cell_lines::build_envs(&std::env::current_exe()?) {
                state.set_build_env(&key, &value);
            }
        }
        // An error a cell returns through `?` is written with `{:#}` (vendor/evcxr PATCHES.md
        // §9): anyhow's whole chain (`outer: inner: root`), any other error as its `Display`.
        // `:efmt` changes it.
        state.set_error_format("{:#}").map_err(|e| anyhow::anyhow!("evcxr refused the error format: {e}"))?;
        // No code: evcxr only takes the new state (nothing is compiled).
        eval.eval_with_state("", state).map_err(|e| anyhow::anyhow!("evcxr refused the build environment: {e}"))?;
        let mut ctx = evcxr::CommandContext::with_eval_context(eval);
        let child = ctx.process_handle();
        let pump = StreamPump::start(outputs, sink.clone());
        let (metrics, metrics_notice) = crate::session::metrics::Endpoint::from_env();
        if let Err(e) = ctx.execute(":load_config --quiet") {
            eprintln!("gpumem-kernel: evcxr startup configuration not loaded: {e}");
        }
        let deps_root = SessionDeps::default_root().unwrap_or_else(|| std::env::temp_dir().join("gpumem-deps"));
        // Generations no session planned for a month go, beside the session (a few file system
        // calls; said in the kernel's log).
        let prune_root = deps_root.clone();
        std::thread::spawn(move || {
            let pruned = session_deps::prune(&prune_root, session_deps::KEEP_UNUSED, std::time::SystemTime::now());
            if !pruned.names.is_empty() {
                eprintln!(
                    "gpumem-kernel: removed {} session-dependency builds unused for {} days ({} MiB)",
                    pruned.names.len(),
                    session_deps::KEEP_UNUSED.as_secs() / 86_400,
                    pruned.bytes >> 20
                );
            }
        });
        Ok(Engine {
            ctx,
            child,
            hooks: Hooks::new(control),
            sink,
            tally,
            pump,
            sync,
            count: 0,
            history: History::default(),
            show: true,
            record: RecordSetting::default(),
            interrupted,
            last_hook_us: (0, 0),
            notice: notices([
                crate::build::build_dir::take_notice().map(|n| format!("gpumem-kernel: {n}")),
                toolchain::take_notice(),
                dirs.as_ref().ok().and_then(|d| toolchain::rust_src_notice(&d.sysroot)),
                metrics_notice,
            ]),
            compile: std::env::var_os("EVCXR_TMPDIR")
                .map(|d| Arc::new(Mutex::new(progress::Watch::new(std::path::Path::new(&d))))),
            own: dep::Own::of_this_build(),
            own_declared: false,
            deps: SessionDeps::new(deps_root),
            display: Display::new(evcxr::config_dir().as_deref()),
            lost: None,
            died: None,
            restarted_by_magic: None,
            gone: None,
            ready: Instant::now(),
            cell_ends: Default::default(),
            metrics,
            warm_up: None,
            warmed: None,
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

    /// The control channel to the crate in the child, for another thread.
    pub fn shared_control(&self) -> crate::cell::hooks::SharedControl {
        self.hooks.shared_control()
    }

    /// The control socket's path.
    pub fn control_path(&self) -> PathBuf {
        self.hooks.control().socket_path().to_path_buf()
    }

    /// Where the metrics endpoint serves, when it is on.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.addr()
    }

    /// What a scrape of the metrics endpoint gets now.
    pub fn metrics_text(&self) -> String {
        self.metrics.text()
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

    /// A short message in the report's style (not stderr, which a notebook shows as an alarm).
    fn show_notice(&self, notice: &str) {
        let html = notice
            .lines()
            .map(|l| {
                format!(
                    "<div class=\"gpumem-notice\" style=\"font-family:var(--jp-code-font-family,monospace);\
                     font-size:var(--jp-code-font-size,12px);color:{}\">ⓘ {}</div>",
                    gpumem_nb::render::TEXT2,
                    gpumem_nb::render::escape(l)
                )
            })
            .collect();
        self.display_text_html(notice, html);
    }

    fn magic_error(&self, what: &str) {
        self.stream("stderr", format!("%gpumem: {what}\n"));
    }

    /// Runs one cell: magics, hooks, evcxr, report. `queued`: when its request arrived (the
    /// kernel's shell; the engine takes requests in turn), from which the cell's time counts.
    pub fn execute(&mut self, code: &str, allow_stdin: bool, queued: Option<Instant>) -> Outcome {
        self.count += 1;
        let count = self.count;
        self.sink.emit(Output::ExecuteInput { code: code.to_string(), count });
        // What the kernel had to say at its start: a short message in the report's style (not
        // stderr, which a notebook shows as an alarm).
        if let Some(notice) = self.notice.take() {
            self.show_notice(&notice);
        }
        if let Some(waited) = self.waited_for_idle_work(queued) {
            self.show_notice(&waited);
        }
        let (magics, run_code) = magic::parse(code);
        // What the history shows of the cell: its code as written (not the `:dep` evcxr gets).
        let shown = first_code_line(&run_code);
        // A magic that cannot be understood fails the cell before anything of it runs, as a
        // compile error does (a "run all" stops there).
        if let Some(Magic::Bad { line, text, error }) = magics.iter().find(|m| matches!(m, Magic::Bad { .. })) {
            let what = format!("%gpumem: {error} (line {line}: `{text}`)");
            let info = ErrorInfo {
                ename: "UsageError".into(),
                evalue: what.clone(),
                traceback: vec![format!("\x1b[1;31mUsageError\x1b[0m: {what}"), magic::usage(), NOTHING_RAN.into()],
            };
            self.sink.emit(Output::Error(info.clone()));
            return Outcome { count, error: Some(info), record: None };
        }
        // `:dep gpumem-nb` is the crate this kernel was built with.
        let run_code = match dep::resolve(&run_code, &self.own) {
            Ok(resolved) => resolved,
            Err(why) => {
                let info = ErrorInfo { ename: "DependencyError".into(), evalue: why.clone(), traceback: vec![why] };
                self.sink.emit(Output::Error(info.clone()));
                return Outcome { count, error: Some(info), record: None };
            }
        };
        if dep::names_own(&run_code) {
            self.own_declared = true;
        }
        // `:allow_static_linking` is the kernel's (evcxr's own dylib mode does not build).
        let (static_linking, run_code) = session_deps::static_linking_setting(&run_code);
        if let Some(stat) = static_linking {
            self.deps.set_enabled(!stat);
            self.show_notice(if stat {
                "gpumem-kernel: :dep crates from now on are linked into each cell (their statics are per cell)"
            } else {
                "gpumem-kernel: :dep crates from now on are loaded once for the session (one copy of their statics)"
            });
        }
        let mut cell_magic: Option<(bool, Option<PathBuf>)> = None;
        for m in &magics {
            match m {
                Magic::Cell { timeline, snapshot } => cell_magic = Some((*timeline, snapshot.clone())),
                m if !m.runs_after_code() => self.apply_setting(m),
                _ => {}
            }
        }
        let mut outcome = Outcome { count, error: None, record: None };
        let mut live = None;
        // `%gpumem trim` runs inside the cell's measured time (after its code), so that the
        // cell's report shows what it gave back; a cell of the magic alone is measured too.
        let trim = magics.contains(&Magic::Trim);
        let sweep = magics.iter().find_map(|m| if let Magic::Sweep(s) = m { Some(s.clone()) } else { None });
        // After a lost CUDA context the cell runs all the same: host code works (results can be
        // saved), and each call on the device fails with the named error (`show_result`).
        if let Some(spec) = sweep {
            let swept = self.sweep(count, queued, &run_code, (shown.as_str(), allow_stdin), &spec);
            if let Some(e) = &swept.error
                && swept.record.is_none()
            {
                self.sink.emit(Output::Error(e.clone()));
            }
            outcome.error = swept.error;
            outcome.record = swept.record;
            live = swept.live;
        } else if magic::has_code(&run_code) || trim {
            let how = (shown.as_str(), allow_stdin, trim);
            let ran = self.run_cell(count, queued, &run_code, how, cell_magic.as_ref());
            outcome.error = ran.error;
            outcome.record = Some(ran.record);
            live = ran.live;
        } else if let Some((timeline, snap)) = &cell_magic {
            // A %%gpumem cell without code: nothing was recorded, but honour the requests.
            if *timeline || snap.is_some() {
                self.stream("stderr", "%%gpumem: the cell has no code to record");
            }
        }
        // A restart in a cell without code is said by its own message, not by a later record.
        self.restarted_by_magic = None;
        for m in magics.iter().filter(|m| m.runs_after_code()) {
            self.run_output_magic(m, count);
        }
        // Last: the report.
        if let Some(rec) = &outcome.record
            && self.show
        {
            self.show_report(rec, live);
        }
        outcome
    }

    /// Shows a cell's report as its last output: in place of its live line `live` when nothing
    /// came after that line, else after everything (the live line emptied).
    fn show_report(&self, rec: &CellRecord, live: Option<String>) {
        match live {
            Some(id) if !self.tally.after_live(&id) => self.sink.emit(Output::Update { id, data: rec.display() }),
            Some(id) => {
                self.sink.emit(Output::Update { id, data: Map::new() });
                self.display(rec.display());
            }
            None => self.display(rec.display()),
        }
    }

    /// Runs a cell's code between its readings: the preparation (`prepare`), the code, and its
    /// outcome (`outcome`): the result or error shown, the record made and kept.
    /// `queued`: when its request arrived; `shown`: its first line for the history.
    fn run_cell(
        &mut self,
        count: u64,
        queued: Option<Instant>,
        run_code: &str,
        (shown, allow_stdin, trim): (&str, bool, bool),
        cell_magic: Option<&(bool, Option<PathBuf>)>,
    ) -> Ran {
        // The cell's time is what its user waits for: from its request to its report (a wait
        // for evcxr's start or the idle work before it, the hooks, the build, the code).
        // A request that came before the engine was ready (a notebook run as it opened: the
        // front end sent it once the kernel answered) waited for the kernel's start too: from
        // the process's start, then.
        let started = match queued {
            Some(q) if q < self.ready => crate::session::start().filter(|s| *s <= q).unwrap_or(q),
            Some(q) => q,
            None => Instant::now(),
        };
        let before = self.read_before(count, run_code, cell_magic);
        // The names a replaced process would take with it.
        let names: Vec<String> = self.ctx.variables_and_types().map(|(n, _)| n.to_string()).collect();
        self.interrupted.store(false, Ordering::SeqCst);
        let restarted = self.restart_if_asked(run_code);
        let run_code = restarted.as_deref().unwrap_or(run_code);
        // The live line's and the build's seconds are the user's wait, as the report's are.
        let watchers = self.watch(count, started, &before, run_code);
        let mut prelude = self.prelude(run_code);

        // ---- the cell's code
        let code_started = Instant::now();
        let result = self.run_code(run_code, allow_stdin);
        let result = self.settle_link(&mut prelude, result, run_code, allow_stdin);
        // New dependencies: rust-analyzer reads them at the next type inference (seconds, a
        // crate graph of every dependency and their trait impls): when the kernel is idle.
        if prelude.new_generation && result.is_ok() {
            self.warm_up = Some(count);
        }
        let code_ms = code_started.elapsed().as_secs_f64() * 1e3;
        // evcxr's phases, kept only for the cell benchmark's timings.
        let phases: Option<Vec<(String, f64)>> = crate::build::timings::enabled().then(|| {
            let phases = result.as_ref().map(|o| o.phases.as_slice()).unwrap_or_default();
            phases.iter().map(|p| (p.name.clone(), p.duration.as_secs_f64() * 1e3)).collect()
        });
        // A generation that did not load: said (and its crates linked per cell from now on)
        // only when the cell itself built, so that a `:dep` of its own is not blamed on it.
        if let Some((load, why)) = prelude.not_loaded
            && result.is_ok()
        {
            self.deps.refused(&load);
            self.show_notice(&session_deps::fallback_message(&load, &why));
        }
        if run_code.lines().any(|l| l.trim() == ":clear") {
            self.deps.cleared();
        }
        self.display.follow(run_code);
        let mut live = watchers.stop();
        // Everything the cell wrote, stderr included, before its result and report.
        let marker = self.sync.as_mut().and_then(StderrSync::request);
        self.pump.flush(marker);
        if trim {
            self.trim();
        }

        // ---- the readings after, the outcome, the record
        let after = self.hooks.after(count, self.child_pid());
        self.cell_ends.insert(count, (after.pid, hooks::now_us()));
        self.last_hook_us = (before.us, after.us);
        let last_held = live.as_ref().and_then(|l| l.last_held);
        let end = self.show_result(count, run_code, result, (&before, last_held), &after);
        let ran = RanCode { code: run_code, shown, started, restarted: restarted.is_some() };
        let mut rec = self.record(count, &ran, &before, &after, &end);
        // The worker processes as the live line's readings saw them too: each one's highest
        // reading (not when the notebook's process was replaced: those were another's).
        if let Some(sampled) = live.as_mut().map(|l| std::mem::take(&mut l.children))
            && before.pid == after.pid
        {
            rec.children = sampled.finish(std::mem::take(&mut rec.children));
        }
        self.note_gone(&rec, names);
        rec.live = live.as_ref().filter(|l| l.id.is_some()).map(|l| l.cost.clone());
        if let Some(phases) = phases {
            crate::build::timings::append(&serde_json::json!({
                "step": "cell", "cell": count, "wall_ms": rec.wall_ms, "prelude_ms": prelude.ms, "code_ms": code_ms,
                "phases": phases, "hooks_us": [before.us, after.us],
            }));
        }
        self.keep(&mut rec, &end);

        // ---- %%gpumem: timeline, snapshot, then the session's own recording setting again
        if let Some((timeline, snap)) = cell_magic {
            let was_loaded = before.crate_readings.is_some() && before.pid == after.pid;
            self.finish_cell_magic(count, *timeline, snap.as_deref(), was_loaded);
        }
        Ran { error: end.error, record: rec, live: live.and_then(|l| l.id) }
    }

    /// The cell's code through evcxr, with the user's input when the front end allows it.
    fn run_code(&mut self, run_code: &str, allow_stdin: bool) -> Result<evcxr::EvalOutputs, evcxr::Error> {
        if !magic::has_code(run_code) {
            return Ok(evcxr::EvalOutputs::new());
        }
        let sink = self.sink.clone();
        let input = move |prompt: &str, password: bool| {
            if allow_stdin { sink.input(prompt, password) } else { String::new() }
        };
        self.ctx.execute_with_callbacks(
            run_code,
            &mut evcxr::EvalCallbacks { input_reader: &|req| input(&req.prompt, req.is_password) },
        )
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
            let mut matches: Vec<String> = magic::COMMANDS
                .iter()
                .filter(|c| c.verb != "%%gpumem" && c.verb.starts_with(prefix))
                .map(|c| c.verb.to_string())
                .collect();
            matches.dedup();
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

    /// What the session does while Jupyter shows the kernel idle: type inference reads the
    /// crates a cell added ([`WARM_UP`]), then gives back the memory it no longer needs (its
    /// databases' unused entries, the heap's free pages: the kernel's own memory stays near what
    /// the notebook's crates need). A request that comes meanwhile waits, and its cell says so
    /// ([`Engine::waited_for_idle_work`]).
    pub fn idle_work(&mut self) {
        if let Some(cell) = self.warm_up.take() {
            let _ = self.ctx.execute(WARM_UP);
            self.warmed = Some((cell, Instant::now()));
        }
        self.ctx.release_analysis_memory();
    }

    /// The line said when the cell whose request arrived at `queued` waited more than a second
    /// for the idle work to end.
    fn waited_for_idle_work(&mut self, queued: Option<Instant>) -> Option<String> {
        let (cell, ended) = self.warmed.take()?;
        let waited = ended.checked_duration_since(queued?)?;
        (waited >= Duration::from_secs(1)).then(|| {
            format!(
                "gpumem-kernel: this cell waited {} for type inference to read the crates cell [{cell}] added (once per \
                 new :dep; counted in its time)",
                gpumem_nb::units::format_duration(waited)
            )
        })
    }

    /// Kills the child (for shutdown; evcxr would otherwise wait for it).
    pub fn kill_child(&self) {
        if let Ok(mut c) = self.child.lock() {
            let _ = c.kill();
        }
    }
}

/// What a cell that ran code left for [`Engine::execute`] to show.
struct Ran {
    error: Option<ErrorInfo>,
    record: CellRecord,
    /// The display id of the cell's live line, when one was shown.
    live: Option<String>,
}

/// The last line of a bad magic's error.
const NOTHING_RAN: &str = "Nothing of the cell ran: fix the magic line (or make it a comment) and run the cell again.";

/// Whether a result is only `()`: nothing to show (a statement-like last expression, a loop).
fn is_unit(data: &Map<String, Value>) -> bool {
    data.len() == 1 && data.get("text/plain").and_then(Value::as_str) == Some("()")
}

/// The notices that are there, one paragraph each.
fn notices<const N: usize>(all: [Option<String>; N]) -> Option<String> {
    let all: Vec<String> = all.into_iter().flatten().collect();
    (!all.is_empty()).then(|| all.join("\n"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(char_to_byte("héllo", 2), 3);
        assert_eq!(char_to_byte("hé", 5), 3);
        let mut m = std::collections::HashMap::new();
        m.insert("application/json".to_string(), "{\"a\":1}".to_string());
        m.insert("text/plain".to_string(), "2".to_string());
        let mm = mime_map(m);
        assert_eq!(mm["application/json"]["a"], 1);
        assert_eq!(mm["text/plain"], "2");
    }
}
