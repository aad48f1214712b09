//! The Jupyter kernel: the wire protocol through `jupyter-zmq-client` + `jupyter-protocol`, the
//! engine on a thread of its own.
//!
//! - One task writes iopub (fed by a channel; it also answers XPUB subscriptions with
//!   `iopub_welcome`, JEP 65).
//! - The shell task wraps every request in `busy`/`idle` and answers in the order
//!   "outputs → reply → idle": execute requests go to the engine thread and the task waits.
//! - The control task answers `kernel_info`, `interrupt_request` (kills the evcxr child, which
//!   evcxr restarts; the cell gets an error and its report) and `shutdown_request`, also while a
//!   cell runs.
//! - stdin: `input_request` round trips for `evcxr_input`, when the request allows stdin.

use crate::complete::{Completeness, is_complete};
use crate::engine::{Engine, ErrorInfo, Outcome, Output, Sink};
use jupyter_protocol::{CodeMirrorMode, DisplayData, HelpLink, Media};
use jupyter_zmq_client::{
    CommInfoReply, CompleteReply, ConnectionInfo, ErrorOutput, ExecuteInput, ExecuteReply, ExecuteResult,
    ExecutionCount, HistoryReply, InputRequest, InspectReply, InterruptReply, IoPubWelcome, IsCompleteReply,
    IsCompleteReplyStatus, JupyterMessage, JupyterMessageContent, KernelInfoReply, LanguageInfo, ReplyError,
    ReplyStatus, ShutdownReply, Status, StreamContent, SubscriptionEvent,
};
use jupyter_zmq_client::{
    create_kernel_control_connection, create_kernel_heartbeat_connection, create_kernel_iopub_xpub_connection,
    create_kernel_shell_connection, create_kernel_stdin_connection,
};
use serde_json::{Map, Value};
use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

type ChildHandle = Arc<Mutex<Option<Arc<Mutex<Child>>>>>;

/// Requests to the engine thread.
enum EngineReq {
    Execute { msg: Box<JupyterMessage>, code: String, allow_stdin: bool, reply: oneshot::Sender<Outcome> },
    Complete { code: String, cursor: usize, reply: oneshot::Sender<(Vec<String>, usize, usize)> },
    Shutdown { done: oneshot::Sender<()> },
}

/// A pending `input_request`.
struct StdinReq {
    prompt: String,
    password: bool,
    parent: JupyterMessage,
    reply: std::sync::mpsc::Sender<String>,
}

/// The engine's outputs as iopub messages, children of the current execute request.
struct ZmqSink {
    iopub: mpsc::UnboundedSender<JupyterMessage>,
    parent: Mutex<Option<JupyterMessage>>,
    stdin: mpsc::UnboundedSender<StdinReq>,
    interrupted: Arc<AtomicBool>,
    /// A cell is running (an interrupt only kills the child then).
    running: Arc<AtomicBool>,
}

impl ZmqSink {
    fn parent(&self) -> Option<JupyterMessage> {
        self.parent.lock().ok().and_then(|p| p.clone())
    }
}

fn media(data: Map<String, Value>) -> Media {
    serde_json::from_value(Value::Object(data)).unwrap_or_default()
}

impl Sink for ZmqSink {
    fn emit(&self, out: Output) {
        let content: JupyterMessageContent = match out {
            Output::ExecuteInput { code, count } => {
                ExecuteInput { code, execution_count: ExecutionCount::new(count as usize) }.into()
            }
            Output::Stream { name, text } => {
                if name == "stderr" {
                    StreamContent::stderr(&text).into()
                } else {
                    StreamContent::stdout(&text).into()
                }
            }
            Output::ExecuteResult { count, data } => {
                ExecuteResult::new(ExecutionCount::new(count as usize), media(data)).into()
            }
            Output::Display { data } => DisplayData::new(media(data)).into(),
            Output::Error(ErrorInfo { ename, evalue, traceback }) => ErrorOutput { ename, evalue, traceback }.into(),
        };
        let parent = self.parent();
        let _ = self.iopub.send(JupyterMessage::new(content, parent.as_ref()));
    }

    fn input(&self, prompt: &str, password: bool) -> String {
        let Some(parent) = self.parent() else { return String::new() };
        let (tx, rx) = std::sync::mpsc::channel();
        let req = StdinReq { prompt: prompt.to_string(), password, parent, reply: tx };
        if self.stdin.send(req).is_err() {
            return String::new();
        }
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(v) => return v,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) if !self.interrupted.load(Ordering::SeqCst) => {}
                Err(_) => return String::new(),
            }
        }
    }
}

/// `kernel_info_reply`.
fn kernel_info() -> KernelInfoReply {
    KernelInfoReply {
        status: ReplyStatus::Ok,
        protocol_version: "5.3".into(),
        implementation: "gpumem-kernel".into(),
        implementation_version: env!("CARGO_PKG_VERSION").into(),
        language_info: LanguageInfo {
            name: "Rust".into(),
            version: String::new(),
            mimetype: Some("text/rust".into()),
            file_extension: Some(".rs".into()),
            pygments_lexer: Some("rust".into()),
            codemirror_mode: Some(CodeMirrorMode::Simple("rust".into())),
            nbconvert_exporter: None,
        },
        banner: format!(
            "gpumem-kernel {}: Rust through evcxr, with a GPU memory report after every cell (%gpumem help)",
            env!("CARGO_PKG_VERSION")
        ),
        help_links: vec![HelpLink { text: "evcxr".into(), url: "https://github.com/evcxr/evcxr".into() }],
        debugger: false,
        error: None,
    }
}

fn reply_error(e: &ErrorInfo) -> Box<ReplyError> {
    Box::new(ReplyError { ename: e.ename.clone(), evalue: e.evalue.clone(), traceback: e.traceback.clone() })
}

/// Starts the engine thread. Execute requests that arrive before evcxr is up wait in the
/// channel.
fn start_engine(
    sink: Arc<ZmqSink>,
    interrupted: Arc<AtomicBool>,
    child: ChildHandle,
) -> std::sync::mpsc::Sender<EngineReq> {
    let (tx, rx) = std::sync::mpsc::channel::<EngineReq>();
    std::thread::Builder::new()
        .name("gpumem-engine".into())
        .spawn(move || {
            let engine = Engine::new(sink.clone(), interrupted);
            let mut engine = match engine {
                Ok(e) => {
                    if let Ok(mut c) = child.lock() {
                        *c = Some(e.process_handle());
                    }
                    Some(e)
                }
                Err(e) => {
                    eprintln!("gpumem-kernel: {e:#}");
                    None
                }
            };
            let mut count = 0u64;
            while let Ok(req) = rx.recv() {
                match req {
                    EngineReq::Execute { msg, code, allow_stdin, reply } => {
                        if let Ok(mut p) = sink.parent.lock() {
                            *p = Some(*msg);
                        }
                        sink.running.store(true, Ordering::SeqCst);
                        let outcome = match engine.as_mut() {
                            Some(e) => e.execute(&code, allow_stdin),
                            None => {
                                count += 1;
                                let info = ErrorInfo {
                                    ename: "KernelError".into(),
                                    evalue: "evcxr failed to start (see the kernel log); is cargo on PATH?".into(),
                                    traceback: vec![
                                        "evcxr failed to start (see the kernel log); is cargo on PATH?".into(),
                                    ],
                                };
                                sink.emit(Output::Error(info.clone()));
                                Outcome { count, error: Some(info), record: None }
                            }
                        };
                        sink.running.store(false, Ordering::SeqCst);
                        let _ = reply.send(outcome);
                    }
                    EngineReq::Complete { code, cursor, reply } => {
                        let r = engine.as_mut().map_or((Vec::new(), cursor, cursor), |e| e.complete(&code, cursor));
                        let _ = reply.send(r);
                    }
                    EngineReq::Shutdown { done } => {
                        if let Some(e) = engine.take() {
                            e.kill_child();
                            drop(e);
                        }
                        let _ = done.send(());
                        return;
                    }
                }
            }
        })
        .expect("spawn the engine thread");
    tx
}

/// Kills the current evcxr child, if there is one yet.
fn kill(child: &ChildHandle) {
    let handle = child.lock().ok().and_then(|c| c.clone());
    if let Some(h) = handle
        && let Ok(mut c) = h.lock()
    {
        let _ = c.kill();
    }
}

/// Runs the kernel on a connection file until shutdown.
pub fn run(connection_file: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(connection_file)?;
    let info: ConnectionInfo = serde_json::from_str(&text)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(serve(info))
}

async fn serve(info: ConnectionInfo) -> anyhow::Result<()> {
    let session = format!(
        "gpumem-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
    );
    let mut heartbeat = create_kernel_heartbeat_connection(&info).await?;
    let (mut shell_tx, mut shell_rx) = create_kernel_shell_connection(&info, &session).await?.split();
    let mut control = create_kernel_control_connection(&info, &session).await?;
    let mut stdin = create_kernel_stdin_connection(&info, &session).await?;
    let mut iopub = create_kernel_iopub_xpub_connection(&info, &session).await?;

    let (iopub_tx, mut iopub_rx) = mpsc::unbounded_channel::<JupyterMessage>();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                m = iopub_rx.recv() => match m {
                    Some(m) => { let _ = iopub.send(m).await; }
                    None => break,
                },
                s = iopub.recv_subscription() => {
                    if let Ok(SubscriptionEvent::Subscribe(topic)) = s {
                        let _ = iopub.send(IoPubWelcome::new(topic).into()).await;
                    }
                }
            }
        }
    });
    tokio::spawn(async move { while heartbeat.single_heartbeat().await.is_ok() {} });

    let (stdin_tx, mut stdin_rx) = mpsc::unbounded_channel::<StdinReq>();
    tokio::spawn(async move {
        while let Some(req) = stdin_rx.recv().await {
            let msg = InputRequest { prompt: req.prompt.clone(), password: req.password }.as_child_of(&req.parent);
            if stdin.send(msg).await.is_err() {
                let _ = req.reply.send(String::new());
                continue;
            }
            let value = loop {
                match stdin.read().await {
                    Ok(m) => {
                        if let JupyterMessageContent::InputReply(r) = m.content {
                            break r.value;
                        }
                    }
                    Err(_) => break String::new(),
                }
            };
            let _ = req.reply.send(value);
        }
    });

    let interrupted = Arc::new(AtomicBool::new(false));
    let running = Arc::new(AtomicBool::new(false));
    let child: ChildHandle = Arc::new(Mutex::new(None));
    let child_at_exit = child.clone();
    let sink = Arc::new(ZmqSink {
        iopub: iopub_tx.clone(),
        parent: Mutex::new(None),
        stdin: stdin_tx,
        interrupted: interrupted.clone(),
        running: running.clone(),
    });
    let engine = start_engine(sink, interrupted.clone(), child.clone());
    let _ = iopub_tx.send(Status::idle().into());

    let (shutdown_tx, mut shutdown_rx) = mpsc::unbounded_channel::<bool>();

    // Control: also served while a cell runs.
    let control_shutdown = shutdown_tx.clone();
    let control_iopub = iopub_tx.clone();
    tokio::spawn(async move {
        while let Ok(msg) = control.read().await {
            let _ = control_iopub.send(Status::busy().as_child_of(&msg));
            match &msg.content {
                JupyterMessageContent::KernelInfoRequest(_) => {
                    let _ = control.send(kernel_info().as_child_of(&msg)).await;
                }
                JupyterMessageContent::InterruptRequest(_) => {
                    // Only a running cell is stopped: killing an idle child would only make
                    // the next cell fail.
                    if running.load(Ordering::SeqCst) {
                        interrupted.store(true, Ordering::SeqCst);
                        kill(&child);
                    }
                    let _ = control.send(InterruptReply::new().as_child_of(&msg)).await;
                }
                JupyterMessageContent::ShutdownRequest(req) => {
                    let reply = ShutdownReply { restart: req.restart, status: ReplyStatus::Ok, error: None };
                    let _ = control.send(reply.as_child_of(&msg)).await;
                    let _ = control_iopub.send(Status::idle().as_child_of(&msg));
                    let _ = control_shutdown.send(req.restart);
                    return;
                }
                _ => {}
            }
            let _ = control_iopub.send(Status::idle().as_child_of(&msg));
        }
    });

    // Shell.
    let shell_engine = engine.clone();
    let shell_iopub = iopub_tx.clone();
    let shell_shutdown = shutdown_tx.clone();
    tokio::spawn(async move {
        // After a failed cell with `stop_on_error`, execute requests already queued behind it
        // (a "run all") are answered `aborted` instead of run, as ipykernel does.
        let mut pending: std::collections::VecDeque<(JupyterMessage, bool)> = Default::default();
        loop {
            let (msg, abort) = match pending.pop_front() {
                Some(p) => p,
                None => match shell_rx.read().await {
                    Ok(m) => (m, false),
                    Err(e) => {
                        eprintln!("gpumem-kernel: shell read error: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
            };
            let _ = shell_iopub.send(Status::busy().as_child_of(&msg));
            let reply: Option<JupyterMessage> = match &msg.content {
                JupyterMessageContent::KernelInfoRequest(_) => Some(kernel_info().as_child_of(&msg)),
                JupyterMessageContent::ExecuteRequest(_) if abort => Some(
                    ExecuteReply {
                        status: ReplyStatus::Aborted,
                        execution_count: ExecutionCount::new(0),
                        payload: vec![],
                        user_expressions: None,
                        error: None,
                    }
                    .as_child_of(&msg),
                ),
                JupyterMessageContent::ExecuteRequest(req) => {
                    let (tx, rx) = oneshot::channel();
                    let sent = shell_engine.send(EngineReq::Execute {
                        msg: Box::new(msg.clone()),
                        code: req.code.clone(),
                        allow_stdin: req.allow_stdin,
                        reply: tx,
                    });
                    let outcome = if sent.is_ok() { rx.await.ok() } else { None };
                    if req.stop_on_error && outcome.as_ref().is_some_and(|o| o.error.is_some()) {
                        // What is queued now (nothing more arrives within a few ms of asking).
                        while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(5), shell_rx.read()).await {
                            let is_exec = matches!(m.content, JupyterMessageContent::ExecuteRequest(_));
                            pending.push_back((m, is_exec));
                        }
                    }
                    let reply = match outcome {
                        Some(o) => ExecuteReply {
                            status: if o.error.is_some() { ReplyStatus::Error } else { ReplyStatus::Ok },
                            execution_count: ExecutionCount::new(o.count as usize),
                            payload: vec![],
                            user_expressions: None,
                            error: o.error.as_ref().map(reply_error),
                        },
                        None => ExecuteReply {
                            status: ReplyStatus::Error,
                            execution_count: ExecutionCount::new(0),
                            payload: vec![],
                            user_expressions: None,
                            error: Some(reply_error(&ErrorInfo {
                                ename: "KernelError".into(),
                                evalue: "the engine thread is gone".into(),
                                traceback: vec![],
                            })),
                        },
                    };
                    Some(reply.as_child_of(&msg))
                }
                JupyterMessageContent::CompleteRequest(req) => {
                    let (tx, rx) = oneshot::channel();
                    let sent = shell_engine.send(EngineReq::Complete {
                        code: req.code.clone(),
                        cursor: req.cursor_pos,
                        reply: tx,
                    });
                    let (matches, start, end) = if sent.is_ok() {
                        rx.await.unwrap_or_default()
                    } else {
                        (vec![], req.cursor_pos, req.cursor_pos)
                    };
                    Some(
                        CompleteReply {
                            matches,
                            cursor_start: start,
                            cursor_end: end,
                            metadata: Default::default(),
                            status: ReplyStatus::Ok,
                            error: None,
                        }
                        .as_child_of(&msg),
                    )
                }
                JupyterMessageContent::IsCompleteRequest(req) => {
                    let r = match is_complete(&req.code) {
                        Completeness::Complete => IsCompleteReply::new(IsCompleteReplyStatus::Complete, String::new()),
                        Completeness::Incomplete(indent) => {
                            IsCompleteReply::new(IsCompleteReplyStatus::Incomplete, indent)
                        }
                        Completeness::Invalid => IsCompleteReply::new(IsCompleteReplyStatus::Invalid, String::new()),
                    };
                    Some(r.as_child_of(&msg))
                }
                JupyterMessageContent::InspectRequest(_) => Some(
                    InspectReply {
                        found: false,
                        data: Media::default(),
                        metadata: Default::default(),
                        status: ReplyStatus::Ok,
                        error: None,
                    }
                    .as_child_of(&msg),
                ),
                JupyterMessageContent::HistoryRequest(_) => {
                    Some(HistoryReply { history: vec![], status: ReplyStatus::Ok, error: None }.as_child_of(&msg))
                }
                JupyterMessageContent::CommInfoRequest(_) => Some(
                    CommInfoReply { status: ReplyStatus::Ok, comms: Default::default(), error: None }.as_child_of(&msg),
                ),
                JupyterMessageContent::ShutdownRequest(req) => {
                    let _ = shell_shutdown.send(req.restart);
                    Some(ShutdownReply { restart: req.restart, status: ReplyStatus::Ok, error: None }.as_child_of(&msg))
                }
                _ => None,
            };
            if let Some(r) = reply {
                let _ = shell_tx.send(r).await;
            }
            let _ = shell_iopub.send(Status::idle().as_child_of(&msg));
        }
    });

    // Wait for a shutdown request, then stop the engine (kills the child) and leave.
    let _restart = shutdown_rx.recv().await;
    let (done_tx, done_rx) = oneshot::channel();
    // Stop a running cell first, so the engine thread can take the request.
    kill(&child_at_exit);
    let _ = engine.send(EngineReq::Shutdown { done: done_tx });
    let _ = tokio::time::timeout(Duration::from_secs(3), done_rx).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}
