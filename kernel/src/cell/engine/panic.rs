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
//! [`Capture`] takes such a block out of the stderr stream, and [`error_info`] turns it into the
//! cell's error. The cell's own thread is the child's main thread, whose id is the child's pid.
//! A panic on any other thread of the notebook's process (a framework's device thread, a thread
//! the cell spawned, gpumem's own `gpumem-*` threads) while the cell runs is taken too, and
//! [`thread_error_info`] makes it the cell's error: the cell's code may go on after it (a
//! `join` that returns `Err`, a device thread that died and left zeros behind), but what it
//! computed is not to be trusted. `src/lib.rs` is the crate evcxr generated for the cell: a
//! location there is the notebook's code, named by cell and line where a [`Locate`] can say
//! which (issue "which line holds my memory"), else by the cell alone.
//!
//! An error's text may carry a backtrace after its message (candle's `WithBacktrace`, anyhow's
//! `Stack backtrace:`, cubecl's `IoError`): [`split_backtrace`] takes it out, for an error the
//! cell's code returned (`errors::returned_error`) and for a panic's message (an unwrapped
//! error), and [`folded`] folds it as a panic's own, its first frames (where anyhow or candle
//! made the error) with std's.

pub(super) use super::backtrace::Locate;
use super::backtrace::{folded, place, split_backtrace};
use crate::cell::user_error;
use crate::output::ErrorInfo;

/// One panic, as std's hook wrote it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct PanicText {
    /// The thread's name as the header gives it (`main`, `worker-1`, `<unnamed>`).
    pub thread: String,
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

/// Takes panic blocks out of stderr, line by line: the cell thread's always, other threads'
/// while a cell runs.
///
/// A panic on another thread after the cell ended (between cells: [`finish`](Self::finish)
/// was called, and the next cell's capture is not made yet) is left as ordinary stderr: the
/// front end shows it under whichever cell its output goes to then, and no cell is made an error
/// for it.
#[derive(Debug)]
pub(super) struct Capture {
    /// The thread id of the cell's thread (the child's pid), when known.
    tid: Option<u32>,
    state: State,
    /// The block being read is another thread's (in [`others`](Self::others)).
    in_other: bool,
    /// A cell is running: other threads' panics are the cell's.
    running: bool,
    /// A blank line held back: std's hook writes one before its header.
    blank: bool,
    /// The cell thread's blocks taken so far.
    pub panics: Vec<PanicText>,
    /// Other threads' blocks taken while the cell ran.
    pub others: Vec<PanicText>,
    /// The last ordinary stderr lines (at most [`RECENT`]): an error the cell's code returned is
    /// printed there just before the child marks it.
    recent: std::collections::VecDeque<String>,
    /// The text of the error the cell's code returned (`crate::cell::user_error`), when it did.
    pub returned_error: Option<ReturnedText>,
    /// The text of an error the code is returning (after evcxr's [`user_error::BEGINS`]), held
    /// back from stderr: it is shown once, as the cell's error.
    held: Option<Vec<String>>,
}

/// The text of an error the cell's code returned through `?`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ReturnedText {
    /// Its lines.
    pub lines: Vec<String>,
    /// The lines are the error's text and nothing else (evcxr marked where it began,
    /// [`user_error::BEGINS`]); otherwise they are the last stderr lines before the child's mark,
    /// the error's text last.
    pub whole: bool,
}

/// How many of the last stderr lines a [`Capture`] keeps for an error the cell returned.
const RECENT: usize = 16;

impl Capture {
    /// A capture for a cell running on thread `tid` (the child's pid).
    pub(super) fn new(tid: Option<u32>) -> Capture {
        Capture {
            tid,
            state: State::Outside,
            in_other: false,
            running: true,
            blank: false,
            held: None,
            panics: Vec::new(),
            others: Vec::new(),
            recent: std::collections::VecDeque::new(),
            returned_error: None,
        }
    }

    /// A capture while no cell runs (before the first): only the cell thread's panics are taken.
    pub(super) fn between_cells() -> Capture {
        Capture { running: false, ..Capture::new(None) }
    }

    /// The block being read.
    fn block(&mut self) -> Option<&mut PanicText> {
        if self.in_other { self.others.last_mut() } else { self.panics.last_mut() }
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
                if let Some(p) = self.block() {
                    p.backtrace.push(line.to_string());
                }
                return out;
            }
            self.state = State::Outside;
            if t.starts_with("note: Some details are omitted") || t.starts_with("note: run with `RUST_BACKTRACE") {
                return out;
            }
        }
        if let Some((location, thread, mine)) = self.header(line) {
            self.blank = false;
            self.state = State::Message;
            self.in_other = !mine;
            let p = PanicText { thread, location, ..Default::default() };
            if mine {
                self.panics.push(p)
            } else {
                self.others.push(p)
            }
            return out;
        }
        if self.state == State::Message {
            if line == "stack backtrace:" {
                self.state = State::Backtrace;
            } else if line.starts_with("note: run with `RUST_BACKTRACE") {
                self.state = State::Outside;
            } else if let Some(p) = self.block() {
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
        let recent: Vec<String> = self.recent.drain(..).collect();
        self.returned_error = Some(match self.held.take() {
            Some(lines) => ReturnedText { lines, whole: true },
            None => ReturnedText { lines: recent, whole: false },
        });
    }

    /// The end of the cell: a blank line still held back. From here on other threads' panics
    /// are ordinary stderr (the rest of a block cut by the end among them).
    pub(super) fn finish(&mut self) -> Vec<String> {
        self.state = State::Outside;
        self.running = false;
        self.in_other = false;
        let mut out = if std::mem::take(&mut self.blank) { vec![String::new()] } else { Vec::new() };
        // Held back for an error that was never marked: it was stderr after all.
        out.extend(self.held.take().unwrap_or_default());
        out
    }

    /// The location and the thread's name, when `line` is the header of a panic to take:
    /// `thread 'NAME' (TID) panicked at LOCATION:`, and whether it is the cell's thread (Rust ≥
    /// 1.89 names the thread id; without one, every thread's panic is the cell's). Another
    /// thread's is taken only while a cell runs.
    fn header(&self, line: &str) -> Option<(String, String, bool)> {
        let rest = line.strip_prefix("thread '")?;
        let (name, rest) = rest.split_once("' ")?;
        let (tid, rest) = match rest.strip_prefix('(') {
            Some(r) => {
                let (tid, r) = r.split_once(") ")?;
                (tid.parse::<u32>().ok(), r)
            }
            None => (None, rest),
        };
        let location = rest.strip_prefix("panicked at ")?.strip_suffix(':')?;
        let mine = !matches!((tid, self.tid), (Some(t), Some(mine)) if t != mine);
        (mine || self.running).then(|| (location.to_string(), name.to_string(), mine))
    }
}

/// A panic's message (an error's text when the code unwrapped one: candle's or cubecl's message,
/// then the backtrace the error carries) and what follows it in the traceback: the message, the
/// panic's backtrace folded, and the error's own backtrace folded, when the message carried one.
fn panic_text(p: &PanicText, cell: u64, locate: Locate<'_>) -> (String, Vec<String>) {
    let (message, inner) = split_backtrace(&p.message);
    let mut tb = message.clone();
    tb.extend(folded(&p.backtrace, "stack backtrace", cell, locate));
    tb.extend(folded(&inner, "the error's own backtrace", cell, locate));
    let message = if message.is_empty() { "(no message)".to_string() } else { message.join("\n") };
    (message, tb)
}

/// The error of cell `cell` that panicked with `p`.
pub(super) fn error_info(p: &PanicText, cell: u64, locate: Locate<'_>) -> ErrorInfo {
    let (message, rest) = panic_text(p, cell, locate);
    let mut tb = vec![format!("\x1b[1;31mpanicked\x1b[0m at {}:", place(&p.location, cell, locate))];
    tb.extend(rest);
    ErrorInfo { ename: "panic".into(), evalue: message, traceback: tb }
}

/// The error of cell `cell` during which another thread of the notebook's process panicked
/// with `p` (ename `panic`, as the cell's own; the value names the thread): the thread's
/// message, where it panicked, its backtrace folded as the cell's own panic's is.
pub(super) fn thread_error_info(p: &PanicText, cell: u64, locate: Locate<'_>) -> ErrorInfo {
    let (message, rest) = panic_text(p, cell, locate);
    let thread = &p.thread;
    let mut tb = vec![format!(
        "\x1b[1;31mpanicked\x1b[0m on thread '{thread}' (not the cell's own) at {}:",
        place(&p.location, cell, locate)
    )];
    tb.extend(rest);
    ErrorInfo { ename: "panic".into(), evalue: format!("thread '{thread}' panicked: {message}"), traceback: tb }
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

    /// What std 1.95's hook wrote in gpumem-kernel's child (pid 8848) for a panic on a thread
    /// the cell spawned (`std::thread::Builder::new().name("w1".into()).spawn(|| panic!("one"))`,
    /// the session's first cell): the process's first backtrace, the cell's closure named.
    const W1: &str = "
thread 'w1' (8861) panicked at src/lib.rs:21:56:
one
stack backtrace:
   0: __rustc::rust_begin_unwind
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/panicking.rs:689:5
   1: core::panicking::panic_fmt
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/panicking.rs:80:14
   2: ctx::run_user_code_2::{{closure}}::{{closure}}
             at /root/.cache/gpumem-kernel/evcxr/src/lib.rs:21:56
note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.";

    /// The same code as the next cell: its library was loaded after the process's first
    /// backtrace, and std names none of its frames.
    const W2: &str = "
thread 'w2' (8870) panicked at src/lib.rs:21:56:
two
stack backtrace:
   0: __rustc::rust_begin_unwind
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/panicking.rs:689:5
   1: core::panicking::panic_fmt
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/panicking.rs:80:14
   2: <unknown>
   3: <unknown>
   4: <unknown>
   5: <unknown>
   6: <unknown>
   7: <unknown>
   8: <unknown>
   9: <unknown>
  10: <alloc::boxed::Box<dyn core::ops::function::FnOnce<(), Output = ()> + core::marker::Send> as core::ops::function::FnOnce<()>>::call_once
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/alloc/src/boxed.rs:2240:9
  11: <std::sys::thread::unix::Thread>::new::thread_start
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/sys/thread/unix.rs:118:17
  12: start_thread
             at ./nptl/pthread_create.c:442:8
  13: clone3
             at ./misc/../sysdeps/unix/sysv/linux/x86_64/clone3.S:81:0
note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.";

    #[test]
    fn another_threads_panic_while_the_cell_runs_is_the_cells_error() {
        let mut c = Capture::new(Some(8848));
        let passed = feed(&mut c, &format!("before\n{W1}\nafter"));
        assert_eq!(passed, ["before", "after"], "the block and the blank line before it are taken");
        assert!(c.panics.is_empty(), "not the cell thread's own");
        assert_eq!(c.others.len(), 1);
        let p = &c.others[0];
        assert_eq!(
            (p.thread.as_str(), p.location.as_str(), &p.message[..]),
            ("w1", "src/lib.rs:21:56", &["one".to_string()][..])
        );
        assert_eq!(p.backtrace.len(), 6);
        let e = thread_error_info(p, 1, &|l| (l == 21).then_some((1, 1)));
        assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("panic", "thread 'w1' panicked: one"));
        assert_eq!(
            e.traceback[..4],
            [
                "\x1b[1;31mpanicked\x1b[0m on thread 'w1' (not the cell's own) at cell [1] line 1:",
                "one",
                "stack backtrace (innermost first; 2 frames of std, evcxr and gpumem-kernel hidden):",
                "   0: cell [1]",
            ]
        );
        // The cell's own panic and another thread's, in one cell: each where it belongs.
        let mut c = Capture::new(Some(8848));
        feed(&mut c, &format!("{W1}\n{SEEN}"));
        assert_eq!((c.panics.len(), c.others.len()), (1, 1));
        assert_eq!(c.panics[0].message, ["boom"]);
    }

    #[test]
    fn another_threads_panic_between_cells_stays_on_stderr() {
        // After a cell's end (and before the next cell's capture): ordinary stderr, every line.
        let mut c = Capture::new(Some(8848));
        c.finish();
        assert_eq!(W2.lines().flat_map(|l| c.line(l)).collect::<Vec<_>>(), W2.lines().collect::<Vec<_>>());
        assert!(c.panics.is_empty() && c.others.is_empty());
        // A block cut by the cell's end: the rest passes.
        let mut c = Capture::new(Some(8848));
        let head: Vec<&str> = W2.lines().take(3).collect();
        assert!(head.iter().flat_map(|l| c.line(l)).next().is_none());
        c.finish();
        assert_eq!(c.line("stack backtrace:"), ["stack backtrace:"]);
        assert_eq!(c.others[0].message, ["two"]);
        // Without thread ids (older Rust, or before the first cell: the child's pid is not
        // known) every panic is the cell's, as it was.
        let mut c = Capture::between_cells();
        let passed = feed(
            &mut c,
            "\nthread 'main' panicked at src/lib.rs:3:5:\nline one\nline two\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\nlater\n\n",
        );
        assert_eq!(passed, ["later", ""]);
        assert_eq!(c.panics[0].message, ["line one", "line two"]);
    }

    #[test]
    fn frames_std_could_not_name_are_said_not_shown() {
        let mut c = Capture::new(Some(8848));
        feed(&mut c, W2);
        let e = thread_error_info(&c.others[0], 2, &|_| None);
        assert_eq!(e.evalue, "thread 'w2' panicked: two");
        assert_eq!(
            e.traceback[2..],
            ["stack backtrace (14 frames hidden: of std, evcxr and gpumem-kernel, and 8 std could not name):"]
        );
    }

    /// What gpumem-kernel's child (pid 8848) printed for candle 0.11's error unwrapped in cell 3
    /// (`let z = x.matmul(&x).unwrap();`, its line 2, with `x` a `(1, 784)` tensor on the CPU):
    /// the panic's message is candle's `Display`, its `WithBacktrace`'s frames included.
    const CANDLE_UNWRAP: &str = include_str!("fixtures/candle_unwrap_panic.txt");

    /// A burn device thread's panic for a failed allocation, as cubecl 0.10.0 writes it: its
    /// `IoError::BufferTooBig` (`can't allocate buffer of size: {size}\n{backtrace}`, with the
    /// backtrace it captured in `GpuStorage::alloc` after `CUDA_ERROR_OUT_OF_MEMORY`), unwrapped at
    /// `compute/server.rs:124:46`; the header and message as an H100 showed them, the frames
    /// from cubecl's sources in the format of std's (cubecl prints them with backtrace-rs).
    const DEVICE_THREAD: &str = "
thread 'DSD-0-0' (9120) panicked at REG/cubecl-cuda-0.10.0/src/compute/server.rs:124:46:
called `Result::unwrap()` on an `Err` value: can't allocate buffer of size: 34359738368
   0: <cubecl_cuda::compute::storage::gpu::GpuStorage as cubecl_runtime::storage::ComputeStorage>::alloc
             at REG/cubecl-cuda-0.10.0/src/compute/storage/gpu.rs:183:40
   1: cubecl_runtime::memory_management::memory_manage::MemoryManagement<Storage>::reserve
             at REG/cubecl-runtime-0.10.0/src/memory_management/memory_manage.rs:500:14
   2: cubecl_cuda::compute::command::Command::reserve
             at REG/cubecl-cuda-0.10.0/src/compute/command.rs:103:22
   3: <cubecl_cuda::compute::server::CudaServer as cubecl_runtime::server::ComputeServer>::initialize_memory
             at REG/cubecl-cuda-0.10.0/src/compute/server.rs:124:36
   4: std::sys::backtrace::__rust_begin_short_backtrace
             at R/std/src/sys/backtrace.rs:166:18
   5: start_thread
             at ./nptl/pthread_create.c:442:8
   6: clone3
             at ./misc/../sysdeps/unix/sysv/linux/x86_64/clone3.S:81:0
stack backtrace:
   0: __rustc::rust_begin_unwind
             at R/std/src/panicking.rs:689:5
   1: core::panicking::panic_fmt
             at R/core/src/panicking.rs:80:14
   2: core::result::unwrap_failed
             at R/core/src/result.rs:1867:5
   3: <cubecl_cuda::compute::server::CudaServer as cubecl_runtime::server::ComputeServer>::initialize_memory
             at REG/cubecl-cuda-0.10.0/src/compute/server.rs:124:46
note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.";

    #[test]
    fn an_unwrapped_error_is_the_message_and_both_backtraces_are_folded() {
        // The kernel knows the build directory (`EVCXR_TMPDIR`): the cell's file as rustc names
        // it relative to it.
        let text = CANDLE_UNWRAP.replace("/root/.cache/gpumem-kernel/evcxr/", "");
        let mut c = Capture::new(Some(8848));
        feed(&mut c, &text);
        let e = error_info(&c.panics[0], 3, &|l| (119..=120).contains(&l).then(|| (3, l - 118)));
        let message =
            "called `Result::unwrap()` on an `Err` value: shape mismatch in matmul, lhs: [1, 784], rhs: [1, 784]";
        assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("panic", message));
        assert_eq!(
            e.traceback,
            [
                "\x1b[1;31mpanicked\x1b[0m at cell [3] line 2:",
                message,
                "stack backtrace (innermost first; 17 frames of std, evcxr and gpumem-kernel hidden):",
                "   0: cell [3]",
                "          at cell [3] line 2",
                "the error's own backtrace (innermost first; 29 frames of std, evcxr, gpumem-kernel and the error's making hidden):",
                "   0: candle_core::tensor::Tensor::matmul",
                "   1: cell [3]",
                "          at cell [3] line 2",
            ]
        );
    }

    #[test]
    fn a_device_threads_panic_says_the_thread_and_the_frameworks_message() {
        let text = DEVICE_THREAD.replace("REG", REGISTRY).replace("R/", &format!("{RUSTC_LIBRARY}/"));
        let mut c = Capture::new(Some(8848));
        assert_eq!(feed(&mut c, &format!("loss 0.25\n{text}")), ["loss 0.25"]);
        let e = thread_error_info(&c.others[0], 9, &|_| None);
        assert_eq!(
            e.evalue,
            "thread 'DSD-0-0' panicked: called `Result::unwrap()` on an `Err` value: can't allocate buffer of size: 34359738368"
        );
        assert_eq!(
            e.traceback,
            [
                "\x1b[1;31mpanicked\x1b[0m on thread 'DSD-0-0' (not the cell's own) at cubecl-cuda-0.10.0/src/compute/server.rs:124:46:",
                "called `Result::unwrap()` on an `Err` value: can't allocate buffer of size: 34359738368",
                "stack backtrace (innermost first; 3 frames of std, evcxr and gpumem-kernel hidden):",
                "   0: <cubecl_cuda::compute::server::CudaServer as cubecl_runtime::server::ComputeServer>::initialize_memory",
                "          at cubecl-cuda-0.10.0/src/compute/server.rs:124:46",
                "the error's own backtrace (innermost first; 3 frames of std, evcxr and gpumem-kernel hidden):",
                "   0: <cubecl_cuda::compute::storage::gpu::GpuStorage as cubecl_runtime::storage::ComputeStorage>::alloc",
                "          at cubecl-cuda-0.10.0/src/compute/storage/gpu.rs:183:40",
                "   1: cubecl_runtime::memory_management::memory_manage::MemoryManagement<Storage>::reserve",
                "          at cubecl-runtime-0.10.0/src/memory_management/memory_manage.rs:500:14",
                "   2: cubecl_cuda::compute::command::Command::reserve",
                "          at cubecl-cuda-0.10.0/src/compute/command.rs:103:22",
                "   3: <cubecl_cuda::compute::server::CudaServer as cubecl_runtime::server::ComputeServer>::initialize_memory",
                "          at cubecl-cuda-0.10.0/src/compute/server.rs:124:36",
            ]
        );
    }

    const REGISTRY: &str = "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f";
    const RUSTC_LIBRARY: &str = "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library";

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
            thread: "main".into(),
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
            thread: "main".into(),
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
            thread: "main".into(),
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
