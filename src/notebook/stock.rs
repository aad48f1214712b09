//! Per-cell reports in the stock evcxr Jupyter kernel (`evcxr_jupyter`), from inside the child.
//!
//! gpumem-kernel measures every cell from the parent ([`super::control`]). The stock kernel has
//! no hooks, so when this crate opens its first device in an evcxr child that no gpumem-kernel
//! drives, it puts itself between evcxr and the child. evcxr's runtime reads
//! `LOAD_AND_RUN <so> <fn>` lines on stdin and writes the cell's output, its content blocks and
//! `EVCXR_EXECUTION_COMPLETE` on stdout (evcxr 0.22, `runtime.rs`, `eval_context.rs`); fds 0
//! and 1 become pipes, and two threads forward every byte, in order:
//! - before a `LOAD_AND_RUN` goes on, [`Steps::begin`]: the `pre` reading of the control
//!   channel's session (a fresh peak slot per device and for tracking, allocations labelled
//!   "cell N");
//! - before the COMPLETE goes on, [`Steps`]' `post` reading and the record built from both
//!   ([`super::report`]: the same record and line as gpumem-kernel's). The line is the cell's
//!   last stdout line; the record goes in an `application/vnd.gpumem.cell+json` block next to
//!   the cell's own value when it has one (a mime type of its own, so it replaces nothing, and
//!   a cell without a value gets no new output).
//!
//! The switches are the process-wide anchor's (every cell links its own copy of the crate);
//! the threads run the code of the copy that installed them, which evcxr never unloads. A
//! restarted child is a new process: the hooks come back with its first device. The readings
//! run on a worker thread with a timeout, so a stuck reading costs a report, never the kernel.
#![forbid(unsafe_code)]

use super::protocol::CONTROL_VAR;
use super::report::CELL_MIME;
use super::steps::Steps;
use crate::device::nvml;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// `off` keeps the hooks out of the evcxr child altogether.
pub(crate) const REPORTS_VAR: &str = "GPUMEM_NB_REPORTS";

/// Set in the process evcxr runs cells in (and in no other).
pub(crate) const RUNTIME_VAR: &str = "EVCXR_IS_RUNTIME";

// evcxr 0.22's protocol lines.
const LOAD_AND_RUN: &[u8] = b"LOAD_AND_RUN ";
const COMPLETE: &[u8] = b"EVCXR_EXECUTION_COMPLETE";
const PANIC: &[u8] = b"EVCXR_PANIC_NOTIFICATION";
const BEGIN_CONTENT: &[u8] = b"EVCXR_BEGIN_CONTENT ";
const END_CONTENT: &[u8] = b"EVCXR_END_CONTENT";
const TYPE_CHANGED: &[u8] = b"EVCXR_VARIABLE_CHANGED_TYPE:";

/// The longest a cell waits for one reading; past it the cell has no report. The first
/// post-cell reading names stacks in the cells' debug build (evcxr's default), which took over
/// 4 s on a 2-core machine under load (tests/stock.rs lost its first report so).
const HOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// The process-wide switches (in the anchor).
pub(crate) struct Switches {
    installed: Mutex<bool>,
    on: AtomicBool,
}

impl Switches {
    pub(crate) fn new() -> Self {
        Switches { installed: Mutex::new(false), on: AtomicBool::new(true) }
    }
}

fn switches() -> &'static Switches {
    super::anchor::per_process!("stock-reports", Switches, Switches::new)
}

/// Turns the per-cell reports of the stock evcxr kernel on or off, from the next cell on
/// (gpumem-kernel's reports are its own: `%gpumem off` hides them). On by default.
pub fn set_reports(on: bool) {
    switches().on.store(on, Ordering::SeqCst);
    if on {
        start_if_evcxr();
    }
}

/// Installs the hooks once per process, when this is an evcxr child that no gpumem-kernel drives.
pub(crate) fn start_if_evcxr() {
    let off = std::env::var(REPORTS_VAR).is_ok_and(|v| v.trim().eq_ignore_ascii_case("off"));
    if off || std::env::var_os(RUNTIME_VAR).is_none() || std::env::var_os(CONTROL_VAR).is_some() {
        return;
    }
    let s = switches();
    let mut installed = crate::sync::lock(&s.installed);
    if *installed || !s.on.load(Ordering::SeqCst) {
        return;
    }
    *installed = true;
    if let Err(e) = install() {
        eprintln!("gpumem-nb: no per-cell reports in this kernel ({e})");
    }
}

#[cfg(unix)]
fn install() -> std::io::Result<()> {
    use std::fs::File;
    use std::io::BufReader;
    use std::os::fd::AsFd;

    // Duplicates with close-on-exec: what the cell's own subprocesses inherit stays fds 0 and 1.
    let real_in = File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let real_out = File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    let (in_read, in_write) = std::io::pipe()?;
    let (out_read, out_write) = std::io::pipe()?;
    let hooks = Arc::new(Worker::start()?);
    // Installed from inside a run: the next stdout COMPLETE ends it.
    let running = Arc::new(AtomicBool::new(true));
    let (h, r) = (Arc::clone(&hooks), Arc::clone(&running));
    spawn("gpumem-stdout", move || forward_stdout(BufReader::new(out_read), real_out, &*h, &r))?;
    nix::unistd::dup2_stdout(&out_write)?;
    // The stdin side reads the real stdin only once fd 0 is the pipe: two readers of one stdin
    // would steal each other's commands.
    let (go, wait) = mpsc::channel();
    spawn("gpumem-stdin", move || {
        if wait.recv() == Ok(true) {
            forward_stdin(BufReader::new(real_in), in_write, &*hooks, &running);
        }
    })?;
    let swapped = nix::unistd::dup2_stdin(&in_read);
    let _ = go.send(swapped.is_ok());
    Ok(swapped?)
}

#[cfg(not(unix))]
fn install() -> std::io::Result<()> {
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "only on Unix"))
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new().name(name.into()).spawn(f).map(drop)
}

/// What the stdout side saw of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Run {
    panicked: bool,
    /// The cell wrote a content block (its value, a table): the record can go beside it.
    content: bool,
    /// evcxr runs the cell again (a variable changed type); the second run reports.
    type_changed: bool,
    in_block: bool,
}

impl Run {
    /// Follows evcxr's own reading of a line (`run_and_capture_output`).
    fn see(&mut self, line: &[u8]) {
        if self.in_block {
            self.in_block = line != END_CONTENT && line != PANIC;
            self.panicked |= line == PANIC;
        } else if line == PANIC {
            self.panicked = true;
        } else if line.windows(BEGIN_CONTENT.len()).any(|w| w == BEGIN_CONTENT) {
            (self.content, self.in_block) = (true, true);
        } else if line.starts_with(TYPE_CHANGED) {
            self.type_changed = true;
        }
    }
}

/// A cell's report: what it has to say first (the lost context, once), the line, and the record
/// as one line of JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Report {
    notice: Option<String>,
    line: String,
    record: String,
}

/// What the forwarders call around each run.
trait Hooks {
    /// Before run `run` starts.
    fn pre(&self, run: u64);
    /// After the run, before evcxr hears it is complete: the report, if any.
    fn post(&self, run: &Run) -> Option<Report>;
}

/// evcxr's stdin to the runtime: the pre-hook before each `LOAD_AND_RUN`. Ends (closing the
/// runtime's stdin, which then exits) when evcxr closes the real stdin.
fn forward_stdin(mut from: impl BufRead, mut to: impl Write, hooks: &dyn Hooks, running: &AtomicBool) {
    let mut line = Vec::new();
    let mut last = 0;
    loop {
        line.clear();
        if matches!(from.read_until(b'\n', &mut line), Ok(0) | Err(_)) {
            return;
        }
        // Between runs evcxr sends commands; during one, only the replies to input requests.
        if !running.load(Ordering::SeqCst) && line.starts_with(LOAD_AND_RUN) {
            running.store(true, Ordering::SeqCst);
            last = run_number(&line).unwrap_or(last + 1);
            hooks.pre(last);
        }
        if to.write_all(&line).and_then(|()| to.flush()).is_err() {
            return;
        }
    }
}

/// The `N` of `LOAD_AND_RUN <so> run_user_code_N`: evcxr's run count.
fn run_number(line: &[u8]) -> Option<u64> {
    std::str::from_utf8(line).ok()?.trim_end().rsplit_once("run_user_code_")?.1.parse().ok()
}

/// The runtime's stdout to evcxr: the post-hook and the report before each COMPLETE.
fn forward_stdout(mut from: impl BufRead, mut to: impl Write, hooks: &dyn Hooks, running: &AtomicBool) {
    let mut line = Vec::new();
    let mut run = Run::default();
    loop {
        line.clear();
        if matches!(from.read_until(b'\n', &mut line), Ok(0) | Err(_)) {
            return;
        }
        let body = line.strip_suffix(b"\n").unwrap_or(&line);
        let body = body.strip_suffix(b"\r").unwrap_or(body);
        let written = match body.strip_suffix(COMPLETE) {
            Some(glued) => {
                let mut out = Vec::new();
                // A partial line the cell flushed is glued to the COMPLETE: on a line of its own,
                // evcxr sees the COMPLETE (alone, it waits forever).
                if !glued.is_empty() {
                    out.extend_from_slice(glued);
                    out.push(b'\n');
                }
                // A block the cell left open would swallow the COMPLETE too.
                if run.in_block {
                    out.extend_from_slice(END_CONTENT);
                    out.push(b'\n');
                }
                if let Some(r) = hooks.post(&run) {
                    // On stdout, in order: stderr is another pipe that evcxr reads on another
                    // thread, and a line written there now may reach Jupyter after the cell ended.
                    if let Some(notice) = &r.notice {
                        out.extend_from_slice(notice.as_bytes());
                        out.push(b'\n');
                    }
                    out.extend_from_slice(r.line.as_bytes());
                    out.push(b'\n');
                    if run.content {
                        let block = format!("EVCXR_BEGIN_CONTENT {CELL_MIME}\n{}\nEVCXR_END_CONTENT\n", r.record);
                        out.extend_from_slice(block.as_bytes());
                    }
                }
                out.extend_from_slice(COMPLETE);
                out.push(b'\n');
                run = Run::default();
                running.store(false, Ordering::SeqCst);
                to.write_all(&out)
            }
            None => {
                run.see(body);
                to.write_all(&line)
            }
        };
        if written.and_then(|()| to.flush()).is_err() {
            return;
        }
    }
}

enum Job {
    Pre(u64, mpsc::SyncSender<()>),
    Post(Run, mpsc::SyncSender<Option<Report>>),
}

/// The hooks' readings, on a thread of their own: the forwarders wait at most [`HOOK_TIMEOUT`].
struct Worker {
    jobs: mpsc::Sender<Job>,
    busy: Arc<AtomicBool>,
}

impl Worker {
    fn start() -> std::io::Result<Worker> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let busy = Arc::new(AtomicBool::new(false));
        let b = Arc::clone(&busy);
        spawn("gpumem-hooks", move || {
            // NVML's first use can take a while: not in a cell's time.
            let _ = nvml::snapshot();
            let mut cells = Cells::default();
            for job in rx {
                b.store(true, Ordering::SeqCst);
                // A reading that panics costs its report, not the hooks. Not busy before the
                // answer: the next question may follow it at once.
                let guarded = |f: &mut dyn FnMut()| {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
                    b.store(false, Ordering::SeqCst);
                };
                match job {
                    Job::Pre(run, done) => {
                        guarded(&mut || cells.pre(run));
                        let _ = done.send(());
                    }
                    Job::Post(r, done) => {
                        let mut report = None;
                        guarded(&mut || report = cells.post(&r));
                        let _ = done.send(report);
                    }
                }
            }
        })?;
        Ok(Worker { jobs, busy })
    }

    fn ask<T>(&self, what: &str, job: impl FnOnce(mpsc::SyncSender<T>) -> Job) -> Option<T> {
        // Still stuck in an earlier reading: skip rather than queue behind it.
        if self.busy.load(Ordering::SeqCst) {
            return None;
        }
        let (tx, rx) = mpsc::sync_channel(1);
        self.jobs.send(job(tx)).ok()?;
        match rx.recv_timeout(HOOK_TIMEOUT) {
            Ok(v) => Some(v),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                eprintln!("gpumem-nb: the {what}-cell reading took over {HOOK_TIMEOUT:?}; no report for this cell");
                None
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
        }
    }
}

impl Hooks for Worker {
    fn pre(&self, run: u64) {
        self.ask("pre", |tx| Job::Pre(run, tx));
    }

    fn post(&self, run: &Run) -> Option<Report> {
        self.ask("post", |tx| Job::Post(run.clone(), tx)).flatten()
    }
}

/// The worker's state: the cells' readings and records, and whether a loss was said.
#[derive(Default)]
struct Cells {
    steps: Steps,
    /// The cell in which the device's CUDA context was lost, once said.
    lost_in: Option<u64>,
}

impl Cells {
    fn pre(&mut self, run: u64) {
        if switches().on.load(Ordering::SeqCst) {
            self.steps.begin(run);
        } else if self.steps.open().is_some() {
            self.steps.close(false, false);
        }
    }

    fn post(&mut self, run: &Run) -> Option<Report> {
        // No `pre`: the run that installed the hooks, or reports were off. Closes the run's
        // slots and label whether or not it is reported.
        let report = !run.type_changed && switches().on.load(Ordering::SeqCst);
        let rec = self.steps.close(run.panicked, report)?;
        let mut notice = None;
        if let Some(l) = rec.lost.as_ref().filter(|_| self.lost_in.is_none()) {
            // Said once, where it happened, above the line; the stock kernel has no restart of
            // its own to offer.
            self.lost_in = Some(rec.cell);
            notice = Some(format!(
                "{}: {}\n{}\nRestart the kernel to go on (Kernel → Restart Kernel…; variables are lost).",
                l.fault.code(),
                super::report::lost_message(l, rec.cell),
                super::report::LOST_ASYNC_HINT
            ));
        }
        Some(Report { notice, line: rec.line(), record: serde_json::to_string(&rec).ok()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Records the calls; reports `[N] …` after every run that had a `pre`.
    #[derive(Default)]
    struct Fake {
        calls: RefCell<Vec<String>>,
        notice: Option<String>,
    }

    impl Hooks for Fake {
        fn pre(&self, run: u64) {
            self.calls.borrow_mut().push(format!("pre {run}"));
        }

        fn post(&self, run: &Run) -> Option<Report> {
            self.calls.borrow_mut().push(format!("post {run:?}"));
            let n = self.calls.borrow().iter().rev().find_map(|c| c.strip_prefix("pre ").map(str::to_string))?;
            (!run.type_changed).then(|| Report {
                notice: self.notice.clone(),
                line: format!("[{n}] report"),
                record: "{\"cell\":1}".into(),
            })
        }
    }

    fn stdin(input: &str, running: bool) -> (String, Vec<String>) {
        let (fake, mut out) = (Fake::default(), Vec::new());
        forward_stdin(input.as_bytes(), &mut out, &fake, &AtomicBool::new(running));
        (String::from_utf8(out).unwrap(), fake.calls.into_inner())
    }

    fn stdout(input: &[u8]) -> (Vec<u8>, Vec<String>) {
        stdout_with(input, None)
    }

    fn stdout_with(input: &[u8], notice: Option<&str>) -> (Vec<u8>, Vec<String>) {
        let (fake, mut out) = (Fake { notice: notice.map(str::to_string), ..Fake::default() }, Vec::new());
        // As after a `pre`.
        fake.pre(7);
        forward_stdout(input, &mut out, &fake, &AtomicBool::new(true));
        (out, fake.calls.into_inner())
    }

    #[test]
    fn stdin_is_forwarded_unchanged_with_a_pre_hook_per_command() {
        let input = "answer typed during the install run\nLOAD_AND_RUN /t/libcode_3.so run_user_code_5\n";
        let (out, calls) = stdin(input, true);
        assert_eq!(out, input);
        assert_eq!(calls, Vec::<String>::new(), "inside a run only input replies come: no hook");
        let input = "LOAD_AND_RUN /t/libcode_3.so run_user_code_5\nLOAD_AND_RUN looks like a command\n";
        let (out, calls) = stdin(input, false);
        assert_eq!(out, input);
        assert_eq!(calls, ["pre 5"], "the second line is an input reply (the run has not completed)");
        assert_eq!(run_number(b"LOAD_AND_RUN /a b\n"), None);
        assert_eq!(run_number(b"LOAD_AND_RUN /a/libcode_1.so run_user_code_12\r\n"), Some(12));
    }

    const DONE: &str = "EVCXR_EXECUTION_COMPLETE\n";

    #[test]
    fn the_report_comes_last_and_the_record_only_beside_a_value() {
        let own = "hello\nEVCXR_BEGIN_CONTENT text/plain\n42\nEVCXR_END_CONTENT\n";
        let (out, _) = stdout(format!("{own}{DONE}").as_bytes());
        let block = format!("EVCXR_BEGIN_CONTENT {CELL_MIME}\n{{\"cell\":1}}\nEVCXR_END_CONTENT\n");
        assert_eq!(String::from_utf8(out).unwrap(), format!("{own}[7] report\n{block}{DONE}"));
        // No value: the line only. Bytes that are not UTF-8 and output after the run pass as they are.
        let own = b"bytes \xff\xfe\r\n";
        let (out, calls) = stdout(&[&own[..], DONE.as_bytes(), b"later\n"].concat());
        assert_eq!(out, [&own[..], b"[7] report\n", DONE.as_bytes(), b"later\n"].concat());
        assert_eq!(calls.len(), 2, "{calls:?}");
    }

    #[test]
    fn panics_partial_lines_open_blocks_and_reruns() {
        let (out, calls) = stdout(format!("thread panicked\nEVCXR_PANIC_NOTIFICATION\n{DONE}").as_bytes());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("thread panicked\nEVCXR_PANIC_NOTIFICATION\n[7] report\n{DONE}")
        );
        assert!(calls[1].contains("panicked: true"), "{calls:?}");
        // A flushed partial line: its own line, before the report.
        let (out, _) = stdout(format!("\rstep 3/3{DONE}").as_bytes());
        assert_eq!(String::from_utf8(out).unwrap(), format!("\rstep 3/3\n[7] report\n{DONE}"));
        // A block left open is closed, so that evcxr sees the end of the run.
        let (out, _) = stdout(format!("EVCXR_BEGIN_CONTENT text/html\n<b>{DONE}").as_bytes());
        let expect = "EVCXR_BEGIN_CONTENT text/html\n<b>\nEVCXR_END_CONTENT\n[7] report\n";
        assert!(String::from_utf8(out).unwrap().starts_with(expect));
        // evcxr runs the cell again: the second run reports.
        let (out, _) = stdout(format!("EVCXR_VARIABLE_CHANGED_TYPE:x\n{DONE}").as_bytes());
        assert_eq!(String::from_utf8(out).unwrap(), format!("EVCXR_VARIABLE_CHANGED_TYPE:x\n{DONE}"));
    }

    #[test]
    fn a_notice_comes_on_stdout_above_the_line_before_the_run_ends() {
        let (out, _) = stdout_with(format!("own\n{DONE}").as_bytes(), Some("CUDA_ERROR_X: lost\nRestart"));
        assert_eq!(String::from_utf8(out).unwrap(), format!("own\nCUDA_ERROR_X: lost\nRestart\n[7] report\n{DONE}"));
    }
}
