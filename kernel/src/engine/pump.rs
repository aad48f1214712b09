//! evcxr's stdout/stderr, forwarded to the sink in order.

use super::{Output, Sink};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Forwards evcxr's stdout/stderr lines to the sink on its own thread; `flush` is a barrier
/// that makes sure every line evcxr has handed over is out before the result.
pub(super) struct StreamPump {
    flush_tx: crossbeam_channel::Sender<crossbeam_channel::Sender<()>>,
    panicked: Arc<AtomicBool>,
}

impl StreamPump {
    pub(super) fn start(outputs: evcxr::EvalContextOutputs, sink: Arc<dyn Sink>) -> StreamPump {
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

    pub(super) fn begin_cell(&self) {
        self.panicked.store(false, Ordering::SeqCst);
    }

    /// Whether a panic message went by on stderr since [`begin_cell`](Self::begin_cell).
    pub(super) fn panicked(&self) -> bool {
        self.panicked.load(Ordering::SeqCst)
    }

    /// Waits until every line received so far has been emitted. stderr comes through a pipe of
    /// its own, so its last lines may trail stdout: give them a moment.
    pub(super) fn flush(&self) {
        std::thread::sleep(Duration::from_micros(300));
        let (tx, rx) = crossbeam_channel::bounded(1);
        if self.flush_tx.send(tx).is_ok() {
            let _ = rx.recv_timeout(Duration::from_secs(2));
        }
    }
}
