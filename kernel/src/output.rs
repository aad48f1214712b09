//! What the engine emits, and where it goes: a cell's outputs in order ([`Output`]), its error
//! ([`ErrorInfo`]), how far the build of its dependencies has come ([`Progress`]), and the
//! [`Sink`] a front end (the Jupyter kernel, a headless run) gives the engine.

use serde_json::{Map, Value};
use std::time::Duration;

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
    /// Something shown that a later [`Output::Update`] replaces in place (Jupyter's
    /// `display_data` with a `display_id`): the live line.
    Updatable {
        /// The display id.
        id: String,
        /// MIME type → data.
        data: Map<String, Value>,
    },
    /// Replaces what was shown under `id` (`update_display_data`): the live line's updates, and
    /// the final report that takes its place.
    Update {
        /// The display id.
        id: String,
        /// MIME type → data.
        data: Map<String, Value>,
    },
    /// The cell failed.
    Error(ErrorInfo),
}

/// Where the engine's outputs go.
pub trait Sink: Send + Sync {
    /// One output, in order.
    fn emit(&self, out: Output);
    /// Asks the user for a line (the cell called `evcxr_input`); only called when the
    /// request allowed stdin.
    fn input(&self, prompt: &str, password: bool) -> String;
    /// Whether a shown output can be replaced in place (a Jupyter frontend): then a long cell
    /// gets a live line (`crate::cell::live`). Headless runs keep final outputs only.
    fn updates_in_place(&self) -> bool {
        false
    }
    /// How the build of cell `cell`'s dependencies is coming along, every half second while
    /// cargo builds them, for a sink without a live line (`run`'s console).
    fn compiling(&self, _cell: u64, _progress: &Progress) {}
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

/// How far a cell's build has come.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// Packages of the graph whose library is built (earlier builds included).
    pub built: usize,
    /// Packages to build (the cells' own crate not counted); `None` while unknown.
    pub total: Option<usize>,
    /// Since the user asked: the cell's request (the seconds the user has waited).
    pub elapsed: Duration,
    /// This build has compiled a dependency and has not reached the cells' own crate yet.
    pub dependencies: bool,
    /// The dependencies cargo compiles now (or last did), in the user's words (package names).
    pub compiling: Vec<String>,
}

impl Progress {
    /// Whether dependencies are still being built (a first `:dep`), not only the cell itself:
    /// what the live line and the console show.
    pub fn building_dependencies(&self) -> bool {
        self.dependencies
    }

    /// In words: "compiling dependencies: 34 of 63 crates built · 32 s" while some have never
    /// been built; "recompiling gpumem-nb · 12 s" when all had been (a dependency changed: a
    /// path crate edited or moved, other features); "compiling · 2 s" otherwise.
    pub fn describe(&self) -> String {
        let secs = format!("{} s", self.elapsed.as_secs());
        match self.total {
            Some(total) if self.built < total => {
                format!("compiling dependencies: {} of {total} crates built · {secs}", self.built)
            }
            _ if !self.compiling.is_empty() => format!("recompiling {} · {secs}", self.compiling.join(", ")),
            _ => format!("compiling · {secs}"),
        }
    }
}
