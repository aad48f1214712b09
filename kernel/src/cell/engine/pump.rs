//! evcxr's stdout/stderr, forwarded to the sink in order; the cell's panic, another thread's
//! panic while the cell runs and the text of an error the cell's code returned taken out of
//! stderr (`panic::Capture`) to become the cell's error.

use super::panic::{Capture, PanicText, ReturnedText};
use crate::cell::stderr_sync::MARK;
use crate::output::{Output, Sink};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the end of a cell waits for the child's stderr marker.
const SYNC_TIMEOUT: Duration = Duration::from_secs(2);

/// A flush request: the marker to wait for on stderr (`None`: take what is there), and where
/// to say it is done.
type Flush = (Option<String>, crossbeam_channel::Sender<bool>);

/// Forwards evcxr's stdout/stderr lines to the sink on its own thread; [`flush`](Self::flush)
/// is a barrier that makes sure every line the cell wrote is out (or, for the cell's panic,
/// taken) before the result.
pub(super) struct StreamPump {
    flush_tx: crossbeam_channel::Sender<Flush>,
    capture: Arc<Mutex<Capture>>,
}

/// The stream thread's side.
struct Forward {
    sink: Arc<dyn Sink>,
    capture: Arc<Mutex<Capture>>,
    /// Markers that came by before their flush request did (the child answers a token at
    /// once; the request reaches this thread on another channel and may come second).
    early: std::cell::RefCell<std::collections::VecDeque<String>>,
}

/// How many early markers are remembered (one per cell is the most a session makes).
const EARLY_KEPT: usize = 8;

impl Forward {
    /// One line of `name`, with what else is already waiting on the same channel (batched into
    /// one output, no waiting). Returns true when `marker` went by on stderr.
    fn lines(
        &self,
        name: &'static str,
        first: String,
        rx: &crossbeam_channel::Receiver<String>,
        marker: Option<&str>,
    ) -> bool {
        let mut text = String::new();
        let mut seen = self.take(name, first, marker, &mut text);
        for _ in 0..1000 {
            if seen {
                break;
            }
            match rx.try_recv() {
                Ok(l) => seen = self.take(name, l, marker, &mut text),
                Err(_) => break,
            }
        }
        self.emit(name, text);
        seen
    }

    /// One line into `text` (a marker is dropped, a panic's line taken); true for `marker`.
    fn take(&self, name: &'static str, l: String, marker: Option<&str>, text: &mut String) -> bool {
        if name == "stderr" && l.starts_with(MARK) {
            if marker == Some(l.as_str()) {
                return true;
            }
            let mut early = self.early.borrow_mut();
            if early.len() == EARLY_KEPT {
                early.pop_front();
            }
            early.push_back(l);
            return false;
        }
        if name == "stderr" && l == crate::cell::user_error::MARK {
            if let Ok(mut c) = self.capture.lock() {
                c.returned_err();
            }
            return false;
        }
        let passed = if name == "stderr" {
            match self.capture.lock() {
                Ok(mut c) => c.line(&l),
                Err(_) => vec![l],
            }
        } else {
            vec![l]
        };
        for l in passed {
            text.push_str(&l);
            text.push('\n');
        }
        false
    }

    fn emit(&self, name: &'static str, text: String) {
        if !text.is_empty() {
            self.sink.emit(Output::Stream { name, text });
        }
    }

    /// The end of a cell: everything on stdout, and stderr up to `marker` (or what is there).
    /// False when the marker did not come within [`SYNC_TIMEOUT`].
    fn flush(
        &self,
        marker: Option<&str>,
        out: &crossbeam_channel::Receiver<String>,
        err: &crossbeam_channel::Receiver<String>,
    ) -> bool {
        while let Ok(l) = out.try_recv() {
            self.lines("stdout", l, out, None);
        }
        let came_early = |m: &str| {
            let mut early = self.early.borrow_mut();
            let at = early.iter().position(|e| e == m);
            at.map(|i| early.drain(..=i).count()).is_some()
        };
        let mut seen = marker.is_none();
        match marker {
            // Everything the cell wrote to stderr was before its marker: already emitted.
            Some(m) if came_early(m) => seen = true,
            Some(m) => {
                let deadline = Instant::now() + SYNC_TIMEOUT;
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match err.recv_timeout(left) {
                        Ok(l) => {
                            if self.lines("stderr", l, err, Some(m)) {
                                seen = true;
                                break;
                            }
                        }
                        Err(_) => break,
                    }
                }
            }
            None => {
                while let Ok(l) = err.try_recv() {
                    self.lines("stderr", l, err, None);
                }
            }
        }
        while let Ok(l) = out.try_recv() {
            self.lines("stdout", l, out, None);
        }
        let held = self.capture.lock().map(|mut c| c.finish()).unwrap_or_default();
        self.emit("stderr", held.iter().map(|l| format!("{l}\n")).collect());
        seen
    }
}

impl StreamPump {
    pub(super) fn start(outputs: evcxr::EvalContextOutputs, sink: Arc<dyn Sink>) -> StreamPump {
        let (flush_tx, flush_rx) = crossbeam_channel::unbounded::<Flush>();
        let capture = Arc::new(Mutex::new(Capture::between_cells()));
        let fwd = Forward { sink, capture: capture.clone(), early: Default::default() };
        std::thread::Builder::new()
            .name("gpumem-streams".into())
            .spawn(move || {
                let (out, err) = (outputs.stdout, outputs.stderr);
                // Both senders belong to the evcxr context and go away with it: stop then.
                loop {
                    crossbeam_channel::select! {
                        recv(out) -> l => match l {
                            Ok(l) => { fwd.lines("stdout", l, &out, None); }
                            Err(_) => return,
                        },
                        recv(err) -> l => match l {
                            Ok(l) => { fwd.lines("stderr", l, &err, None); }
                            Err(_) => return,
                        },
                        recv(flush_rx) -> req => match req {
                            Ok((marker, ack)) => {
                                let seen = fwd.flush(marker.as_deref(), &out, &err);
                                let _ = ack.send(seen);
                            }
                            Err(_) => return,
                        },
                    }
                }
            })
            .expect("spawn the stream thread");
        StreamPump { flush_tx, capture }
    }

    /// A new cell runs on the thread `tid` (the child's main thread: its id is the child's pid).
    /// Until its [`flush`](Self::flush) other threads' panics are the cell's too.
    pub(super) fn begin_cell(&self, tid: Option<u32>) {
        if let Ok(mut c) = self.capture.lock() {
            *c = Capture::new(tid);
        }
    }

    /// The panics of the cell's thread since [`begin_cell`](Self::begin_cell), taken out of
    /// stderr.
    pub(super) fn panics(&self) -> Vec<PanicText> {
        self.capture.lock().map(|c| c.panics.clone()).unwrap_or_default()
    }

    /// Panics on other threads of the notebook's process from
    /// [`begin_cell`](Self::begin_cell) to the cell's [`flush`](Self::flush), taken out of stderr.
    pub(super) fn thread_panics(&self) -> Vec<PanicText> {
        self.capture.lock().map(|c| c.others.clone()).unwrap_or_default()
    }

    /// The text of the error the cell's code returned (`?`), when it returned one.
    pub(super) fn returned_error(&self) -> Option<ReturnedText> {
        self.capture.lock().ok().and_then(|c| c.returned_error.clone())
    }

    /// Waits until every line received so far has been emitted, and stderr up to `marker` (the
    /// child's answer to a stderr sync request) when there is one; without a marker stderr
    /// comes through a pipe of its own and its last lines may trail stdout: give them a moment.
    /// False when the marker did not come (the barrier fell back to its timeout). The cell's end:
    /// from here until the next [`begin_cell`](Self::begin_cell), another thread's panic is
    /// ordinary stderr.
    pub(super) fn flush(&self, marker: Option<String>) -> bool {
        if marker.is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.flush_tx.send((marker, tx)).is_ok()
            && rx.recv_timeout(SYNC_TIMEOUT + Duration::from_secs(1)).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collects what the pump emits.
    #[derive(Default)]
    struct Collect(Mutex<Vec<(&'static str, String)>>);

    impl Sink for Collect {
        fn emit(&self, out: Output) {
            if let Output::Stream { name, text } = out {
                self.0.lock().unwrap().push((name, text));
            }
        }
        fn input(&self, _prompt: &str, _password: bool) -> String {
            String::new()
        }
    }

    #[test]
    fn a_marker_that_comes_before_its_request_ends_the_wait() {
        let (out_tx, out_rx) = crossbeam_channel::unbounded();
        let (err_tx, err_rx) = crossbeam_channel::unbounded();
        let sink = Arc::new(Collect::default());
        let pump = StreamPump::start(evcxr::EvalContextOutputs { stdout: out_rx, stderr: err_rx }, sink.clone());
        let marker = format!("{MARK}1");
        err_tx.send("a line the cell wrote".to_string()).unwrap();
        err_tx.send(marker.clone()).unwrap();
        out_tx.send("out".to_string()).unwrap();
        // The stream thread takes both lines before the flush request exists (the child answers
        // a token at once).
        while !err_tx.is_empty() || !out_tx.is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(pump.flush(Some(marker)), "the early marker counts: no wait for the timeout");
        let got = sink.0.lock().unwrap().clone();
        assert!(got.iter().any(|(n, t)| *n == "stderr" && t.contains("a line the cell wrote")), "{got:?}");
        assert!(!got.iter().any(|(_, t)| t.contains(MARK)), "a marker is never shown: {got:?}");

        // A marker that never comes is waited for, and said.
        assert!(!pump.flush(Some(format!("{MARK}2"))));
        // And one that comes after the request ends it.
        let m3 = format!("{MARK}3");
        let tx = err_tx.clone();
        let late = m3.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            tx.send(late).unwrap();
        });
        assert!(pump.flush(Some(m3)));
        t.join().unwrap();
    }

    #[test]
    fn another_threads_panic_is_the_cells_until_the_cells_flush() {
        let (_out_tx, out_rx) = crossbeam_channel::unbounded::<String>();
        let (err_tx, err_rx) = crossbeam_channel::unbounded();
        let sink = Arc::new(Collect::default());
        let pump = StreamPump::start(evcxr::EvalContextOutputs { stdout: out_rx, stderr: err_rx }, sink.clone());
        let block = [
            "thread 'gpumem-sampler' (8901) panicked at src/notebook/control.rs:10:5:",
            "lost",
            "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace",
        ];
        let send = |lines: &[&str]| {
            for l in lines {
                err_tx.send(l.to_string()).unwrap();
            }
        };
        // While the cell runs (the child's pid is 8848): the cell's, off stderr.
        pump.begin_cell(Some(8848));
        send(&block);
        pump.flush(None);
        let taken = pump.thread_panics();
        assert_eq!(
            (taken.len(), taken[0].thread.as_str(), &taken[0].message[..]),
            (1, "gpumem-sampler", &["lost".to_string()][..])
        );
        assert!(sink.0.lock().unwrap().is_empty(), "{:?}", sink.0.lock().unwrap());
        // After the cell's end: ordinary stderr, and not the cell's.
        send(&block);
        pump.flush(None);
        let got: String = sink.0.lock().unwrap().iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(got, block.join("\n") + "\n");
        assert_eq!(pump.thread_panics().len(), 1);
        // The next cell starts clean.
        pump.begin_cell(Some(8848));
        assert!(pump.thread_panics().is_empty());
    }
}
