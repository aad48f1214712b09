//! A cell's panic as Jupyter shows it: the message first, then the notebook's own frames, with
//! what std, evcxr and the kernel add folded away.
//!
//! evcxr runs a cell inside `catch_unwind` and tells its caller nothing when the cell panics
//! (evcxr's `runtime.rs` catches it and the parent returns `Ok`); the panic's only trace is std's panic hook
//! writing to the child's stderr:
//!
//! ```text
//! thread '<unnamed>' (8848) panicked at src/lib.rs:128:1:
//! boom
//! stack backtrace:
//!    0: __rustc::rust_begin_unwind
//!              at /rustc/…/library/std/src/panicking.rs:689:5
//!    …
//!    3: run_user_code_4
//!    4: load_and_run
//!              at …/evcxr-0.22.0/src/runtime.rs:83:39
//! note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.
//! ```
//!
//! [`Capture`] takes such a block out of the stderr stream (only one from the cell's own
//! thread: the child's main thread, whose id is the child's pid; other threads' panics stay
//! ordinary stderr), and [`error_info`] turns it into the cell's error. `src/lib.rs` is the
//! crate evcxr generated for the cell: a location there is the notebook's code, named by cell
//! and line where a [`Locate`] can say which (issue "which line holds my memory"), else by the
//! cell alone.

use crate::cell::user_error;
use crate::output::ErrorInfo;

/// Maps a line of evcxr's generated `src/lib.rs` to (cell, line in the cell), when known.
pub(super) type Locate<'a> = &'a dyn Fn(u32) -> Option<(u64, u32)>;

/// One panic, as std's hook wrote it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct PanicText {
    /// The location after "panicked at" (`src/lib.rs:128:1`).
    pub location: String,
    /// The message, one entry per line.
    pub message: Vec<String>,
    /// The backtrace's lines after "stack backtrace:" (empty without one).
    pub backtrace: Vec<String>,
}

/// Where a [`Capture`] is in a panic block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Not in a block.
    Outside,
    /// After the header: message lines.
    Message,
    /// After "stack backtrace:": frame lines.
    Backtrace,
}

/// Takes the cell thread's panic blocks out of stderr, line by line.
#[derive(Debug)]
pub(super) struct Capture {
    /// The thread id of the cell's thread (the child's pid), when known.
    tid: Option<u32>,
    state: State,
    /// A blank line held back: std's hook writes one before its header.
    blank: bool,
    /// Blocks taken so far.
    pub panics: Vec<PanicText>,
    /// The last ordinary stderr lines (at most [`RECENT`]): an error the cell's code returned is
    /// printed there just before the child marks it.
    recent: std::collections::VecDeque<String>,
    /// The stderr lines before the child's mark that the cell's code returned `Err`
    /// (`crate::cell::user_error`), when it did.
    pub returned_error: Option<Vec<String>>,
    /// The text of an error the code is returning (after evcxr's [`user_error::BEGINS`]), held
    /// back from stderr: it is shown once, as the cell's error.
    held: Option<Vec<String>>,
}

/// How many of the last stderr lines a [`Capture`] keeps for an error the cell returned.
const RECENT: usize = 16;

impl Capture {
    /// A capture for a cell running on thread `tid` (the child's pid).
    pub(super) fn new(tid: Option<u32>) -> Capture {
        Capture {
            tid,
            state: State::Outside,
            blank: false,
            held: None,
            panics: Vec::new(),
            recent: std::collections::VecDeque::new(),
            returned_error: None,
        }
    }

    /// Feeds one stderr line; returns the lines to pass on as ordinary stderr (none while in a
    /// panic block, and a blank line is held until the next line says whether a header follows).
    pub(super) fn line(&mut self, line: &str) -> Vec<String> {
        let mut out = Vec::new();
        if line == user_error::BEGINS {
            self.held = Some(Vec::new());
            return out;
        }
        if let Some(h) = &mut self.held {
            h.push(line.to_string());
            return out;
        }
        if self.state == State::Backtrace {
            let t = line.trim_start();
            let frame = t.starts_with("at ")
                || t.split_once(": ").is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                || (line.starts_with("      ") && !t.is_empty());
            if frame {
                if let Some(p) = self.panics.last_mut() {
                    p.backtrace.push(line.to_string());
                }
                return out;
            }
            self.state = State::Outside;
            if t.starts_with("note: Some details are omitted") || t.starts_with("note: run with `RUST_BACKTRACE") {
                return out;
            }
        }
        if let Some(location) = self.header(line) {
            self.blank = false;
            self.state = State::Message;
            self.panics.push(PanicText { location, ..Default::default() });
            return out;
        }
        if self.state == State::Message {
            if line == "stack backtrace:" {
                self.state = State::Backtrace;
            } else if line.starts_with("note: run with `RUST_BACKTRACE") {
                self.state = State::Outside;
            } else if let Some(p) = self.panics.last_mut() {
                p.message.push(line.to_string());
            }
            return out;
        }
        if std::mem::take(&mut self.blank) {
            out.push(String::new());
        }
        if line.is_empty() {
            self.blank = true;
        } else {
            out.push(line.to_string());
            if self.recent.len() == RECENT {
                self.recent.pop_front();
            }
            self.recent.push_back(line.to_string());
        }
        out
    }

    /// The child's mark that the cell's code returned `Err`: the lines before it are the
    /// error's text.
    pub(super) fn returned_err(&mut self) {
        let recent = self.recent.drain(..).collect();
        self.returned_error = Some(self.held.take().unwrap_or(recent));
    }

    /// The end of the cell: a blank line still held back.
    pub(super) fn finish(&mut self) -> Vec<String> {
        self.state = State::Outside;
        let mut out = if std::mem::take(&mut self.blank) { vec![String::new()] } else { Vec::new() };
        // Held back for an error that was never marked: it was stderr after all.
        out.extend(self.held.take().unwrap_or_default());
        out
    }

    /// The location, when `line` is the header of a panic on the cell's thread:
    /// `thread 'NAME' (TID) panicked at LOCATION:` (Rust ≥ 1.89 names the thread id; without
    /// one, every thread's panic counts).
    fn header(&self, line: &str) -> Option<String> {
        let rest = line.strip_prefix("thread '")?;
        let (_, rest) = rest.split_once("' ")?;
        let (tid, rest) = match rest.strip_prefix('(') {
            Some(r) => {
                let (tid, r) = r.split_once(") ")?;
                (tid.parse::<u32>().ok(), r)
            }
            None => (None, rest),
        };
        let location = rest.strip_prefix("panicked at ")?.strip_suffix(':')?;
        match (tid, self.tid) {
            (Some(t), Some(mine)) if t != mine => None,
            _ => Some(location.to_string()),
        }
    }
}

/// Whose a backtrace frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// std and core (panicking machinery, closures' call shims, the runtime's start).
    Std,
    /// evcxr's runtime and the kernel's `main`.
    Internal,
    /// The notebook's code (evcxr's generated crate).
    Cell,
    /// Any other crate (the cell's dependencies).
    Dep,
}

/// One frame: its function and where (`None` without line tables).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Frame {
    name: String,
    at: Option<String>,
}

fn frames(lines: &[String]) -> Vec<Frame> {
    let mut out: Vec<Frame> = Vec::new();
    for l in lines {
        let t = l.trim();
        if let Some(at) = t.strip_prefix("at ") {
            if let Some(f) = out.last_mut().filter(|f| f.at.is_none()) {
                f.at = Some(at.to_string());
            }
            continue;
        }
        let name = match t.split_once(": ") {
            Some((n, rest)) if n.bytes().all(|b| b.is_ascii_digit()) => rest,
            _ => t,
        };
        if !name.is_empty() {
            out.push(Frame { name: name.to_string(), at: None });
        }
    }
    out
}

/// The cell crate's own file, as rustc names it in locations: `src/lib.rs:L:C`, or with the
/// build directory in front (`/…/evcxr/src/lib.rs:L:C`) since cells carry line tables.
fn cell_file_line(at: &str) -> Option<u32> {
    let rest = cell_relative(at)?.strip_prefix("src/lib.rs:")?;
    rest.split(':').next()?.parse().ok()
}

/// `at` relative to the cell crate (`src/lib.rs:…`) when it lies in it.
fn cell_relative(at: &str) -> Option<&str> {
    if at.starts_with("src/lib.rs:") {
        return Some(at);
    }
    let dir = std::env::var_os("EVCXR_TMPDIR")?;
    let dir = dir.to_str()?.trim_end_matches('/');
    at.strip_prefix(dir)?.strip_prefix('/').filter(|r| r.starts_with("src/lib.rs:"))
}

fn owner(f: &Frame) -> Owner {
    let at = f.at.as_deref().unwrap_or("");
    if cell_relative(at).is_some() || f.name.starts_with("run_user_code_") || f.name.starts_with("ctx::") {
        return Owner::Cell;
    }
    if at.contains("/evcxr-")
        || at.contains(concat!(env!("CARGO_MANIFEST_DIR"), "/"))
        || ["load_and_run", "handle_line", "run_loop", "runtime_hook", "main"].contains(&f.name.as_str())
        || f.name.starts_with("evcxr::")
        || f.name.starts_with("gpumem_kernel::")
    {
        return Owner::Internal;
    }
    const STD: [&str; 14] = [
        "__rustc::",
        "rust_begin_unwind",
        "__rust_begin_short_backtrace",
        "__rust_end_short_backtrace",
        "__rust_try",
        "std::",
        "core::",
        "alloc::",
        "<alloc::",
        "<core::",
        "<std::",
        "__libc_start",
        "_start",
        "clone3",
    ];
    // std, core and alloc by their sources (a toolchain's `rustlib/src/rust/library/…` or the
    // `/rustc/<hash>/library/…` of its debug info), and frames without a symbol (`<unknown>`:
    // std's code inlined into the unwinder's callers) with them.
    let library = ["/library/std/", "/library/core/", "/library/alloc/", "/library/panic_"];
    if at.contains("/rustc/")
        || library.iter().any(|l| at.contains(l))
        || f.name == "<unknown>"
        || STD.iter().any(|p| f.name.starts_with(p))
    {
        return Owner::Std;
    }
    Owner::Dep
}

/// A location for people: the notebook's as `cell [N] line L` (or the cell alone), a
/// dependency's from its crate directory on (`ndarray-0.16.1/src/lib.rs:10:5`).
fn place(at: &str, cell: u64, locate: Locate<'_>) -> String {
    if let Some(line) = cell_file_line(at) {
        return match locate(line) {
            Some((c, l)) => format!("cell [{c}] line {l}"),
            None => format!("cell [{cell}]"),
        };
    }
    match at.find("/registry/src/") {
        Some(i) => at[i + "/registry/src/".len()..].split_once('/').map_or(at, |(_, p)| p).to_string(),
        None => at.to_string(),
    }
}

/// A frame's function for people: a cell's body as `cell [N]`, an item the notebook defined
/// without evcxr's crate name.
fn function(f: &Frame, cell: u64) -> String {
    let name = f.name.strip_prefix("ctx::").unwrap_or(&f.name);
    // The cell's body (and its closures), or std's `catch_unwind` shim with the body inlined.
    if name.starts_with("run_user_code_") || (name == "__rust_try" && owner(f) == Owner::Cell) {
        return format!("cell [{cell}]");
    }
    // The symbol's hash, when the demangler left one (`::h0123…`).
    match name.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => head.to_string(),
        _ => name.to_string(),
    }
}

/// The error of cell `cell` that panicked with `p`.
pub(super) fn error_info(p: &PanicText, cell: u64, locate: Locate<'_>) -> ErrorInfo {
    let message = if p.message.is_empty() { "(no message)".to_string() } else { p.message.join("\n") };
    let mut tb = vec![format!("\x1b[1;31mpanicked\x1b[0m at {}:", place(&p.location, cell, locate))];
    tb.extend(p.message.iter().cloned());
    let all = frames(&p.backtrace);
    if !all.is_empty() {
        let owners: Vec<Owner> = all.iter().map(owner).collect();
        // From the first frame that is not std's panicking machinery down to the last frame of
        // the notebook (or of a dependency, when no frame is the notebook's).
        let first = owners.iter().position(|o| *o != Owner::Std);
        let last =
            owners.iter().rposition(|o| *o == Owner::Cell).or_else(|| owners.iter().rposition(|o| *o == Owner::Dep));
        let shown: Vec<(usize, &Frame)> = match (first, last) {
            (Some(a), Some(b)) if a <= b => (a..=b)
                // std's frames between the notebook's (closure shims, `?`'s conversions,
                // `catch_unwind` glue) are folded as much as evcxr's and the kernel's.
                .filter(|&i| owners[i] != Owner::Internal && owners[i] != Owner::Std)
                .map(|i| (i, &all[i]))
                .collect(),
            _ => Vec::new(),
        };
        // One frame for the cell's body and its closures (and any function repeated in a row:
        // inlined shims of it), the one that says where.
        let mut kept: Vec<(usize, &Frame)> = Vec::new();
        for (i, f) in shown {
            match kept.last_mut() {
                Some(last) if function(last.1, cell) == function(f, cell) => {
                    if last.1.at.is_none() && f.at.is_some() {
                        *last = (i, f);
                    }
                }
                _ => kept.push((i, f)),
            }
        }
        let shown = kept;
        let hidden = all.len() - shown.len();
        let what = if shown.is_empty() {
            format!("{hidden} frames, all of std, evcxr and gpumem-kernel: hidden")
        } else {
            format!("innermost first; {hidden} frames of std, evcxr and gpumem-kernel hidden")
        };
        tb.push(format!("stack backtrace ({what}):"));
        for (n, (_, f)) in shown.iter().enumerate() {
            let name = function(f, cell);
            match f.at.as_deref() {
                Some(at) => {
                    let at = place(at, cell, locate);
                    tb.push(format!("{n:>4}: {name}"));
                    if at != name {
                        tb.push(format!("          at {at}"));
                    }
                }
                None => tb.push(format!("{n:>4}: {name}")),
            }
        }
    }
    ErrorInfo { ename: "panic".into(), evalue: message, traceback: tb }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What std 1.95's hook wrote for `panic!("boom")` in cell 7 (run 4) of a child with pid
    /// 8848, seen in JupyterLab.
    const SEEN: &str = "\
thread '<unnamed>' (8848) panicked at src/lib.rs:128:1:
boom
stack backtrace:
   0: __rustc::rust_begin_unwind
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/panicking.rs:689:5
   1: core::panicking::panic_fmt
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/panicking.rs:80:14
   2: __rust_try
   3: run_user_code_4
   4: load_and_run
             at /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/evcxr-0.22.0/src/runtime.rs:83:39
   5: handle_line
             at /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/evcxr-0.22.0/src/runtime.rs:71:18
   6: run_loop
             at /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/evcxr-0.22.0/src/runtime.rs:58:38
   7: runtime_hook
             at /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/evcxr-0.22.0/src/runtime.rs:27:24
   8: main
             at /work/main/kernel/src/main.rs:34:5
   9: call_once<fn(), ()>
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/ops/function.rs:250:5
note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.";

    fn feed(c: &mut Capture, text: &str) -> Vec<String> {
        let mut passed: Vec<String> = text.lines().flat_map(|l| c.line(l)).collect();
        passed.extend(c.finish());
        passed
    }

    #[test]
    fn the_cells_panic_is_taken_out_of_stderr() {
        let mut c = Capture::new(Some(8848));
        let passed = feed(&mut c, &format!("before\n\n{SEEN}\nafter"));
        assert_eq!(passed, ["before", "after"], "the blank line before the header goes with it");
        assert_eq!(c.panics.len(), 1);
        assert_eq!(c.panics[0].location, "src/lib.rs:128:1");
        assert_eq!(c.panics[0].message, ["boom"]);
        assert_eq!(c.panics[0].backtrace.len(), 18);
    }

    #[test]
    fn another_threads_panic_stays_on_stderr() {
        let mut c = Capture::new(Some(1));
        let text = "thread 'worker' (77) panicked at src/lib.rs:3:5:\nnope\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace";
        assert_eq!(feed(&mut c, text).len(), 3);
        assert!(c.panics.is_empty());
        // Without thread ids (older Rust) every panic counts.
        let mut c = Capture::new(Some(1));
        let passed = feed(
            &mut c,
            "\nthread 'main' panicked at src/lib.rs:3:5:\nline one\nline two\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\nlater\n\n",
        );
        assert_eq!(passed, ["later", ""]);
        assert_eq!(c.panics[0].message, ["line one", "line two"]);
    }

    #[test]
    fn the_error_reads_like_rust_with_evcxr_folded_away() {
        let mut c = Capture::new(Some(8848));
        feed(&mut c, SEEN);
        let e = error_info(&c.panics[0], 7, &|_| None);
        assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("panic", "boom"));
        let tb = e.traceback.join("\n");
        assert_eq!(
            tb,
            "\x1b[1;31mpanicked\x1b[0m at cell [7]:\nboom\n\
             stack backtrace (innermost first; 9 frames of std, evcxr and gpumem-kernel hidden):\n   \
             0: cell [7]"
        );
        for internal in ["load_and_run", "runtime_hook", "main.rs", "src/lib.rs", "rust_begin_unwind"] {
            assert!(!tb.contains(internal), "{internal}: {tb}");
        }
        // With the line map: cell and line.
        let e = error_info(&c.panics[0], 7, &|l| (l == 128).then_some((7, 1)));
        assert!(e.traceback[0].ends_with("at cell [7] line 1:"), "{:?}", e.traceback);
    }

    #[test]
    fn the_cells_closures_are_the_cell() {
        // What gpumem-kernel's child printed for `panic!("boom")` as cell 2 (run 2).
        let p = PanicText {
            location: "src/lib.rs:12:1".into(),
            message: vec!["boom".into()],
            backtrace: [
                "   0: __rustc::rust_begin_unwind",
                "   1: core::panicking::panic_fmt",
                "   2: ctx::run_user_code_2::{{closure}}",
                "   3: __rust_try",
                "   4: run_user_code_2",
                "   5: load_and_run",
            ]
            .map(String::from)
            .to_vec(),
        };
        let e = error_info(&p, 2, &|_| None);
        assert_eq!(
            e.traceback[2..],
            ["stack backtrace (innermost first; 5 frames of std, evcxr and gpumem-kernel hidden):", "   0: cell [2]"]
        );
    }

    #[test]
    fn std_frames_between_the_notebooks_are_folded() {
        // A cell that also uses `?`: its body runs inside a closure, called through std's shims.
        let rustc = "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library";
        let p = PanicText {
            location: "src/lib.rs:30:5".into(),
            message: vec!["boom".into()],
            backtrace: [
                "   0: __rustc::rust_begin_unwind".to_string(),
                "   1: ctx::helper".into(),
                "             at src/lib.rs:30:5".into(),
                "   2: ctx::run_user_code_4::{{closure}}".into(),
                "             at src/lib.rs:52:9".into(),
                "   3: core::ops::function::FnOnce::call_once".into(),
                format!("             at {rustc}/core/src/ops/function.rs:250:5"),
                "   4: std::panicking::try::do_call".into(),
                format!("             at {rustc}/std/src/panicking.rs:589:40"),
                "   5: run_user_code_4".into(),
                "             at src/lib.rs:50:5".into(),
                "   6: load_and_run".into(),
            ]
            .to_vec(),
        };
        let e = error_info(&p, 4, &|l| l.checked_sub(20).map(|x| (4, x)));
        let tb = e.traceback.join("\n");
        assert!(!tb.contains("/rustc/") && !tb.contains("core::ops"), "{tb}");
        assert!(e.traceback[0].ends_with("at cell [4] line 10:"), "{tb}");
        assert!(!tb.contains("closure"), "a closure of the cell is the cell: {tb}");
    }

    #[test]
    fn notebook_functions_and_dependencies_keep_their_places() {
        let p = PanicText {
            location: "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/mini-0.1.0/src/lib.rs:2:5".into(),
            message: vec!["index out of bounds".into()],
            backtrace: [
                "   0: __rustc::rust_begin_unwind",
                "   1: mini::get",
                "             at /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/mini-0.1.0/src/lib.rs:2:5",
                "   2: ctx::helper",
                "             at src/lib.rs:40:9",
                "   3: run_user_code_9",
                "             at src/lib.rs:60:5",
                "   4: load_and_run",
            ]
            .map(String::from)
            .to_vec(),
        };
        let e = error_info(&p, 12, &|l| match l {
            40 => Some((10, 3)),
            60 => Some((12, 2)),
            _ => None,
        });
        assert_eq!(
            e.traceback[1..],
            [
                "index out of bounds",
                "stack backtrace (innermost first; 2 frames of std, evcxr and gpumem-kernel hidden):",
                "   0: mini::get",
                "          at mini-0.1.0/src/lib.rs:2:5",
                "   1: helper",
                "          at cell [10] line 3",
                "   2: cell [12]",
                "          at cell [12] line 2",
            ]
        );
        assert!(e.traceback[0].ends_with("at mini-0.1.0/src/lib.rs:2:5:"), "{:?}", e.traceback);
    }
}
