//! What happens before a cell's code runs, in order: the readings before it (and the full
//! recording a `%%gpumem` cell asks for), a `:restart` line done by the kernel, the live line (or,
//! headless, the build's progress on the console), and the prelude: the cell's new `:dep` crates
//! loaded once for the session and the trait that shows its value in one compile.

use super::{Engine, RecordSetting};
use crate::build::progress::{self, Watch};
use crate::build::session_deps::{self, Load};
use crate::cell::hooks::{Before, HOOK_TIMEOUT};
use crate::cell::live::{self, Sampler};
use crate::cell::magic;
use crate::output::Progress;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What watches a running cell: its live line, or the build's progress on the console.
pub(super) struct Watchers {
    pub(super) sampler: Option<Sampler>,
    pub(super) ticker: Option<progress::Ticker>,
}

impl Watchers {
    /// Stops both; the live line's last state (its display id and cost) when there was one.
    pub(super) fn stop(self) -> Option<live::Finished> {
        if let Some(t) = self.ticker {
            t.stop();
        }
        self.sampler.map(Sampler::stop)
    }
}

/// What ran before the cell's code.
pub(super) struct Prelude {
    /// A session-dependency generation that did not load, and why (said once the cell built).
    pub(super) not_loaded: Option<(Load, String)>,
    /// The first generation, linked with the cell's own build ([`Engine::settle_link`] after).
    pub(super) linking: Option<Load>,
    /// A new generation of session dependencies loaded in this cell.
    pub(super) new_generation: bool,
    /// How long the prelude took (for the cell benchmark).
    pub(super) ms: f64,
}

impl Engine {
    /// The readings before the cell; for a `%%gpumem` cell, the full recording switched on
    /// (with stacks when it asks for a snapshot).
    pub(super) fn read_before(
        &mut self,
        count: u64,
        run_code: &str,
        cell_magic: Option<&(bool, Option<PathBuf>)>,
    ) -> Before {
        self.hooks.poll(self.child_pid());
        self.hooks.note_code(count, run_code);
        let before = self.hooks.before(count, self.child_pid());
        if let Some((_, snap)) = cell_magic {
            let setting = RecordSetting { on: true, max_entries: None, stacks: snap.is_some() };
            if self.hooks.control().connected().is_some() {
                let sent = self.hooks.control().request(setting.request(), HOOK_TIMEOUT).is_ok();
                if sent {
                    self.hooks.note_recording(true);
                }
            }
        }
        before
    }

    /// `:restart` is done here: evcxr 0.22's own `:restart` leaves the cell's copy of the
    /// variable list behind, so the next cell asks the fresh child for variables it never had
    /// and aborts it. Returns the code evcxr gets (the line commented out) when the cell
    /// restarted.
    pub(super) fn restart_if_asked(&mut self, run_code: &str) -> Option<String> {
        if !run_code.lines().any(|l| l.trim() == ":restart") {
            return None;
        }
        self.restart_child();
        self.stream("stdout", "Child process restarted");
        Some(
            run_code
                .split_inclusive('\n')
                .map(|l| {
                    if l.trim() == ":restart" { l.replacen(":restart", "// :restart (done)", 1) } else { l.to_string() }
                })
                .collect(),
        )
    }

    /// A long cell's live line, where outputs can be updated in place; without one (`run`),
    /// the build's progress goes to the sink as it comes. Both count seconds from `origin`, the
    /// cell's request.
    pub(super) fn watch(&mut self, count: u64, origin: Instant, before: &Before, run_code: &str) -> Watchers {
        // The cell runs on the child's main thread, whose thread id is the child's pid.
        self.pump.begin_cell(self.child_pid());
        let has_code = magic::has_code(run_code);
        let sampler = (self.show && self.sink.updates_in_place() && has_code)
            .then(|| {
                let base = live::Baseline::of(before, self.own_declared);
                let control = self.hooks.shared_control();
                Sampler::start(count, origin, self.child_pid(), base, control, self.compile.clone(), self.sink.clone())
                    .ok()
            })
            .flatten();
        let ticker = match (&sampler, &self.compile) {
            (None, Some(watch)) if has_code => self.ticker(count, origin, watch.clone()),
            _ => None,
        };
        Watchers { sampler, ticker }
    }

    fn ticker(&self, count: u64, origin: Instant, watch: Arc<Mutex<Watch>>) -> Option<progress::Ticker> {
        let sink = self.sink.clone();
        let each = move |p: &Progress| {
            if p.building_dependencies() {
                sink.compiling(count, p);
            }
        };
        progress::Ticker::start(watch, origin, live::PERIOD, each).ok()
    }

    /// Before the cell's code: the trait that shows its value in one compile ((re)defined when
    /// evcxr's settings changed or `:clear` forgot it), then its new `:dep` crates, loaded once
    /// for the session.
    pub(super) fn prelude(&mut self, run_code: &str) -> Prelude {
        let started = Instant::now();
        let mut prelude = Prelude { not_loaded: None, linking: None, new_generation: false, ms: 0.0 };
        if magic::has_code(run_code) {
            let defined = self.ctx.defined_item_names().any(|n| n == crate::build::display::TRAIT);
            if let Some((shown, src)) = self.display.cell(defined) {
                match self.ctx.execute(&src) {
                    Ok(_) => self.display.defined(shown),
                    Err(_) => self.display.refused(),
                }
            }
            self.load_session_deps(run_code, &mut prelude);
        }
        prelude.ms = started.elapsed().as_secs_f64() * 1e3;
        prelude
    }

    /// The session's dependency library, when the cell's `:dep` lines make a new generation of
    /// it. The first links with the cell's own build (one build, and type inference reads the
    /// crates at the kernel's next idle moment); a later one is built and loaded before the cell
    /// (the child restarted when a loaded library was rebuilt under it).
    fn load_session_deps(&mut self, run_code: &str, prelude: &mut Prelude) {
        let cwd = std::env::current_dir().unwrap_or_default();
        let load = match self.deps.plan(run_code, &cwd) {
            Ok(Some(load)) => load,
            Ok(None) => return,
            Err(e) => {
                self.show_notice(&format!("gpumem-kernel: cannot write the session's dependencies: {e}"));
                return;
            }
        };
        self.ctx.link_in_next_execution(&load.name, &load.spec);
        if self.deps.none_loaded() {
            prelude.linking = Some(load);
            return;
        }
        let build_dir = std::env::var_os("EVCXR_TMPDIR").map(PathBuf::from);
        let before = build_dir.as_deref().map(|d| self.deps.built_libraries(d)).unwrap_or_default();
        match self.ctx.execute("") {
            Ok(_) => {
                let rebuilt = build_dir.as_deref().map(|d| self.deps.rebuilt(&before, d)).unwrap_or_default();
                self.deps.loaded(&load);
                self.ctx.probe_variables_with(self.deps.probe());
                prelude.new_generation = true;
                if !rebuilt.is_empty() {
                    self.restart_child();
                    self.restarted_by_magic = Some("session dependencies rebuilt".into());
                    self.show_notice(&session_deps::rebuilt_message(&load, &rebuilt));
                }
            }
            Err(e) => prelude.not_loaded = Some((load, e.to_string())),
        }
    }

    /// After the cell's code, the first generation it linked: loaded when the cell kept it.
    /// A cell that failed did not: the generation is linked on its own, and when that fails
    /// too (the generation cannot be one library) and the cell had failed to build, the cell
    /// runs again without it (nothing of it ran).
    pub(super) fn settle_link(
        &mut self,
        prelude: &mut Prelude,
        result: Result<evcxr::EvalOutputs, evcxr::Error>,
        run_code: &str,
        allow_stdin: bool,
    ) -> Result<evcxr::EvalOutputs, evcxr::Error> {
        let Some(load) = prelude.linking.take() else { return result };
        if result.is_err() && !self.ctx.is_linked(&load.name) {
            self.ctx.link_in_next_execution(&load.name, &load.spec);
            if let Err(e) = self.ctx.execute("") {
                let built = !matches!(result, Err(evcxr::Error::CompilationErrors(_)));
                prelude.not_loaded = Some((load, e.to_string()));
                return if built { result } else { self.run_code(run_code, allow_stdin) };
            }
        }
        self.deps.loaded(&load);
        self.ctx.probe_variables_with(self.deps.probe());
        prelude.new_generation = true;
        result
    }
}
