//! evcxr's stdout/stderr, forwarded to the sink in order; the cell's panic taken out of stderr
//! (`panic::Capture`) to become the cell's error.

use super::panic::{Capture, PanicText};
use crate::cell::stderr_sync::MARK;
use crate::output::{Output, Sink};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the end of a cell waits for the child's stderr marker.
const SYNC_TIMEOUT: Duration = Duration::from_secs(2);

/// A flush request: the marker to wait for on stderr (`None`: take what is there), and where
/// to say it is done.
type Flush = (Option<String>, crossbeam_channel::Sender<()>);

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
}

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
            return marker == Some(l.as_str());
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
    fn flush(
        &self,
        marker: Option<&str>,
        out: &crossbeam_channel::Receiver<String>,
        err: &crossbeam_channel::Receiver<String>,
    ) {
        while let Ok(l) = out.try_recv() {
            self.lines("stdout", l, out, None);
        }
        match marker {
            Some(m) => {
                let deadline = Instant::now() + SYNC_TIMEOUT;
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match err.recv_timeout(left) {
                        Ok(l) => {
                            if self.lines("stderr", l, err, Some(m)) {
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
    }
}

impl StreamPump {
    pub(super) fn start(outputs: evcxr::EvalContextOutputs, sink: Arc<dyn Sink>) -> StreamPump {
        let (flush_tx, flush_rx) = crossbeam_channel::unbounded::<Flush>();
        let capture = Arc::new(Mutex::new(Capture::new(None)));
        let fwd = Forward { sink, capture: capture.clone() };
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
                                fwd.flush(marker.as_deref(), &out, &err);
                                let _ = ack.send(());
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

    /// The text of the error the cell's code returned (`?`), when it returned one: the stderr
    /// lines before the child's mark.
    pub(super) fn returned_error(&self) -> Option<Vec<String>> {
        self.capture.lock().ok().and_then(|c| c.returned_error.clone())
    }

    /// Waits until every line received so far has been emitted, and stderr up to `marker` (the
    /// child's answer to a stderr sync request) when there is one; without a marker stderr
    /// comes through a pipe of its own and its last lines may trail stdout: give them a moment.
    pub(super) fn flush(&self, marker: Option<String>) {
        if marker.is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        if self.flush_tx.send((marker, tx)).is_ok() {
            let _ = rx.recv_timeout(SYNC_TIMEOUT + Duration::from_secs(1));
        }
    }
}
