//! The Jupyter kernel: the wire protocol through `jupyter-zmq-client` + `jupyter-protocol`, the
//! engine on a thread of its own.
//!
//! - One task writes iopub (fed by a channel; it also answers XPUB subscriptions with
//!   `iopub_welcome`, JEP 65).
//! - The shell task wraps every request in `busy`/`idle` and answers in the order
//!   "outputs → reply → idle": execute requests go to the engine thread and the task waits.
//! - `kernel_info` (shell and control) carries, beside the standard fields, a `gpumem` object:
//!   the notebook process's pid now and the newest record of a cell that ran in it (`null`
//!   when it has run none), so a frontend that reconnects (a page reload, a restart) reads what
//!   the live process holds, not what the notebook's saved outputs say ([`live_process`]).
//! - The control task answers `kernel_info`, `interrupt_request` (kills the evcxr child, which
//!   evcxr restarts; the cell gets an error and its report), `shutdown_request` and
//!   `usage_request` (`crate::jupyter::usage`), also while a cell runs. Busy/idle describe execute
//!   requests: a control request publishes none while a cell runs, `usage_request` never.
//! - stdin: `input_request` round trips for `evcxr_input`, when the request allows stdin.

use crate::cell::complete::{Completeness, is_complete};
use crate::cell::engine::{Engine, Outcome};
use crate::cell::hooks::SharedControl;
use crate::jupyter::usage::Usage;
use crate::output::{ErrorInfo, Output, Sink};
use gpumem_nb::kernel::report::CellRecord;
use jupyter_protocol::{CodeMirrorMode, DisplayData, HelpLink, Media, Transient, UpdateDisplayData};
use jupyter_zmq_client::{
    CommInfoReply, CompleteReply, CompleteRequest, ConnectionInfo, ErrorOutput, ExecuteInput, ExecuteReply,
    ExecuteRequest, ExecuteResult, ExecutionCount, HistoryReply, InputRequest, InspectReply, InterruptReply,
    IoPubWelcome, IsCompleteReply, IsCompleteReplyStatus, JupyterMessage, JupyterMessageContent,
    KernelControlConnection, KernelHeartbeatConnection, KernelInfoReply, KernelIoPubXPubConnection,
    KernelStdinConnection, LanguageInfo, ReplyError, ReplyStatus, RouterRecvConnection, RouterSendConnection,
    ShutdownReply, Status, StreamContent, SubscriptionEvent,
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

/// The newest cell record of the session (any notebook process), for `kernel_info`.
type LastRecord = Arc<Mutex<Option<CellRecord>>>;

/// The engine's control channel to the crate, once the engine is up (for `usage_request`).
type ControlHandle = Arc<Mutex<Option<SharedControl>>>;

/// Requests to the engine thread.
enum EngineReq {
    /// `queued`: when the request arrived (the cell's time counts from there: it may wait for
    /// evcxr's start or for the idle work of the cell before).
    Execute {
        msg: Box<JupyterMessage>,
        code: String,
        allow_stdin: bool,
        queued: std::time::Instant,
        reply: oneshot::Sender<Outcome>,
    },
    Complete {
        code: String,
        cursor: usize,
        reply: oneshot::Sender<(Vec<String>, usize, usize)>,
    },
    Shutdown {
        done: oneshot::Sender<()>,
    },
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
            Output::Updatable { id, data } => {
                DisplayData { transient: Some(Transient { display_id: Some(id) }), ..DisplayData::new(media(data)) }
                    .into()
            }
            Output::Update { id, data } => UpdateDisplayData::new(media(data), &id).into(),
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

    fn updates_in_place(&self) -> bool {
        true
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

/// The `gpumem` object of `kernel_info_reply`: the notebook process's pid now (`null` before
/// evcxr started it) and the newest record of a cell that ran in that process (`null` when it
/// has run none: a fresh process holds no device memory). A frontend that connects reads what
/// the live process holds from here, not from the notebook's saved outputs (the JupyterLab
/// panel, lab/src/model.ts). Read on each request: a lock and a clone, no reading of the device.
fn live_process(child: &ChildHandle, last: &LastRecord) -> Value {
    let pid = child_pid(child);
    let record = last
        .lock()
        .ok()
        .and_then(|r| r.clone())
        .filter(|r| pid.is_some() && r.child_pid == pid)
        .and_then(|r| serde_json::to_value(r).ok())
        .unwrap_or(Value::Null);
    serde_json::json!({ "child_pid": pid, "record": record })
}

/// `kernel_info_reply` as a child of `msg`, with the [`live_process`] object as `gpumem`.
fn kernel_info_message(msg: &JupyterMessage, child: &ChildHandle, last: &LastRecord) -> JupyterMessage {
    let mut content = serde_json::to_value(kernel_info()).unwrap_or_else(|_| Value::Object(Map::new()));
    if let Value::Object(m) = &mut content {
        m.insert("gpumem".into(), live_process(child, last));
    }
    let reply = jupyter_protocol::UnknownMessage { msg_type: "kernel_info_reply".into(), content };
    JupyterMessage::new(JupyterMessageContent::UnknownMessage(reply), Some(msg))
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
    crate_control: ControlHandle,
) -> std::sync::mpsc::Sender<EngineReq> {
    let (tx, rx) = std::sync::mpsc::channel::<EngineReq>();
    std::thread::Builder::new()
        .name("gpumem-engine".into())
        .spawn(move || {
            let engine = Engine::new(sink.clone(), interrupted);
            // Why evcxr did not start, for every cell's error when it did not.
            let mut start_error = String::new();
            let mut engine = match engine {
                Ok(e) => {
                    if let Ok(mut c) = child.lock() {
                        *c = Some(e.process_handle());
                    }
                    if let Ok(mut c) = crate_control.lock() {
                        *c = Some(e.shared_control());
                    }
                    Some(e)
                }
                Err(e) => {
                    eprintln!("gpumem-kernel: {e:#}");
                    start_error = format!("{e:#}");
                    None
                }
            };
            let mut count = 0u64;
            while let Ok(req) = rx.recv() {
                match req {
                    EngineReq::Execute { msg, code, allow_stdin, queued, reply } => {
                        if let Ok(mut p) = sink.parent.lock() {
                            *p = Some(*msg);
                        }
                        sink.running.store(true, Ordering::SeqCst);
                        let outcome = match engine.as_mut() {
                            Some(e) => e.execute(&code, allow_stdin, Some(queued)),
                            None => {
                                count += 1;
                                let info = ErrorInfo {
                                    ename: "KernelError".into(),
                                    evalue: start_error.clone(),
                                    traceback: vec![start_error.clone()],
                                };
                                sink.emit(Output::Error(info.clone()));
                                Outcome { count, error: Some(info), record: None }
                            }
                        };
                        sink.running.store(false, Ordering::SeqCst);
                        let _ = reply.send(outcome);
                        // The kernel is idle for Jupyter now; what the session still has to do
                        // (type inference reading new crates) runs here, before the next request.
                        if let Some(e) = engine.as_mut() {
                            e.idle_work();
                        }
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
    crate::session::mark_start();
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
    let heartbeat = create_kernel_heartbeat_connection(&info).await?;
    let (shell_tx, shell_rx) = create_kernel_shell_connection(&info, &session).await?.split();
    let control = create_kernel_control_connection(&info, &session).await?;
    let stdin = create_kernel_stdin_connection(&info, &session).await?;
    let iopub = create_kernel_iopub_xpub_connection(&info, &session).await?;

    let (iopub_tx, iopub_rx) = mpsc::unbounded_channel::<JupyterMessage>();
    tokio::spawn(iopub_task(iopub, iopub_rx));
    tokio::spawn(heartbeat_task(heartbeat));
    let (stdin_tx, stdin_rx) = mpsc::unbounded_channel::<StdinReq>();
    tokio::spawn(stdin_task(stdin, stdin_rx));

    let interrupted = Arc::new(AtomicBool::new(false));
    let running = Arc::new(AtomicBool::new(false));
    let child: ChildHandle = Arc::new(Mutex::new(None));
    let crate_control: ControlHandle = Arc::new(Mutex::new(None));
    let sink = Arc::new(ZmqSink {
        iopub: iopub_tx.clone(),
        parent: Mutex::new(None),
        stdin: stdin_tx,
        interrupted: interrupted.clone(),
        running: running.clone(),
    });
    let engine = start_engine(sink, interrupted.clone(), child.clone(), crate_control.clone());
    let _ = iopub_tx.send(Status::idle().into());

    let (shutdown_tx, mut shutdown_rx) = mpsc::unbounded_channel::<bool>();
    let last: LastRecord = Arc::new(Mutex::new(None));
    let interrupt = Interrupt { running, interrupted, child: child.clone(), last: last.clone() };
    tokio::spawn(control_task(control, iopub_tx.clone(), shutdown_tx.clone(), interrupt, crate_control));
    let live = (child.clone(), last);
    tokio::spawn(shell_task(shell_tx, shell_rx, engine.clone(), iopub_tx.clone(), shutdown_tx.clone(), live));

    // Wait for a shutdown request, then stop the engine (kills the child) and leave.
    let _restart = shutdown_rx.recv().await;
    let (done_tx, done_rx) = oneshot::channel();
    // Stop a running cell first, so the engine thread can take the request.
    kill(&child);
    let _ = engine.send(EngineReq::Shutdown { done: done_tx });
    let _ = tokio::time::timeout(Duration::from_secs(3), done_rx).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}

/// iopub: writes what the channel brings, and welcomes every new subscriber (JEP 65).
async fn iopub_task(mut iopub: KernelIoPubXPubConnection, mut rx: mpsc::UnboundedReceiver<JupyterMessage>) {
    loop {
        tokio::select! {
            m = rx.recv() => match m {
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
}

/// Heartbeat: echoes until the socket fails.
async fn heartbeat_task(mut heartbeat: KernelHeartbeatConnection) {
    while heartbeat.single_heartbeat().await.is_ok() {}
}

/// stdin: one `input_request` at a time, answered with the value of its `input_reply` (or an
/// empty string when the socket fails).
async fn stdin_task(mut stdin: KernelStdinConnection, mut rx: mpsc::UnboundedReceiver<StdinReq>) {
    while let Some(req) = rx.recv().await {
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
}

/// What the control task needs to interrupt a running cell.
struct Interrupt {
    /// A cell is running.
    running: Arc<AtomicBool>,
    /// Set before the child is killed, so the cell's error says "interrupted".
    interrupted: Arc<AtomicBool>,
    /// The evcxr child.
    child: ChildHandle,
    /// The newest record, for `kernel_info`.
    last: LastRecord,
}

/// The current evcxr child's pid.
fn child_pid(child: &ChildHandle) -> Option<u32> {
    let handle = child.lock().ok()?.clone()?;
    handle.lock().ok().map(|c| c.id())
}

/// Control: `kernel_info`, `interrupt_request`, `shutdown_request`, `usage_request`; also
/// served while a cell runs. A request is wrapped in `busy`/`idle` only while no cell runs, and
/// `usage_request` never; a shutdown ends the task.
async fn control_task(
    mut control: KernelControlConnection,
    iopub: mpsc::UnboundedSender<JupyterMessage>,
    shutdown: mpsc::UnboundedSender<bool>,
    interrupt: Interrupt,
    crate_control: ControlHandle,
) {
    let mut usage = Usage::default();
    while let Ok(msg) = control.read().await {
        // The status bar shows the kernel's execution state: busy/idle go out around a control
        // request only while no cell runs (an idle then would say the kernel is idle while the
        // cell still runs), and never around `usage_request`, which a resource panel sends
        // every few seconds (ipykernel#799).
        let usage_req =
            matches!(&msg.content, JupyterMessageContent::UnknownMessage(r) if r.msg_type == "usage_request");
        let status = !usage_req && !interrupt.running.load(Ordering::SeqCst);
        if status {
            let _ = iopub.send(Status::busy().as_child_of(&msg));
        }
        match &msg.content {
            JupyterMessageContent::KernelInfoRequest(_) => {
                let _ = control.send(kernel_info_message(&msg, &interrupt.child, &interrupt.last)).await;
            }
            JupyterMessageContent::InterruptRequest(_) => {
                // Only a running cell is stopped: killing an idle child would only make
                // the next cell fail.
                if interrupt.running.load(Ordering::SeqCst) {
                    interrupt.interrupted.store(true, Ordering::SeqCst);
                    kill(&interrupt.child);
                }
                let _ = control.send(InterruptReply::new().as_child_of(&msg)).await;
            }
            JupyterMessageContent::UnknownMessage(req) if req.msg_type == "usage_request" => {
                // /proc, NVML and at most a short wait for the crate: done on this worker.
                let content = tokio::task::block_in_place(|| {
                    let crate_control = crate_control.lock().ok().and_then(|c| c.clone());
                    usage.reply(child_pid(&interrupt.child), crate_control.as_ref())
                });
                let _ = control.send(JupyterMessage::new(req.reply(content), Some(&msg))).await;
            }
            JupyterMessageContent::ShutdownRequest(req) => {
                let reply = ShutdownReply { restart: req.restart, status: ReplyStatus::Ok, error: None };
                let _ = control.send(reply.as_child_of(&msg)).await;
                if status {
                    let _ = iopub.send(Status::idle().as_child_of(&msg));
                }
                let _ = shutdown.send(req.restart);
                return;
            }
            _ => {}
        }
        if status {
            let _ = iopub.send(Status::idle().as_child_of(&msg));
        }
    }
}

/// Shell: every request wrapped in `busy`/`idle`, answered "outputs → reply → idle" (an execute
/// request waits for the engine thread).
async fn shell_task(
    mut shell_tx: RouterSendConnection,
    mut shell_rx: RouterRecvConnection,
    engine: std::sync::mpsc::Sender<EngineReq>,
    iopub: mpsc::UnboundedSender<JupyterMessage>,
    shutdown: mpsc::UnboundedSender<bool>,
    (child, last): (ChildHandle, LastRecord),
) {
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
        let _ = iopub.send(Status::busy().as_child_of(&msg));
        let reply: Option<JupyterMessage> = match &msg.content {
            JupyterMessageContent::ExecuteRequest(_) if abort => {
                Some(execute_reply(ReplyStatus::Aborted, 0, None).as_child_of(&msg))
            }
            JupyterMessageContent::ExecuteRequest(req) => {
                let outcome = execute(&engine, &msg, req).await;
                if let Some(rec) = outcome.as_ref().and_then(|o| o.record.clone())
                    && let Ok(mut l) = last.lock()
                {
                    *l = Some(rec);
                }
                if req.stop_on_error && outcome.as_ref().is_some_and(|o| o.error.is_some()) {
                    // What is queued now (nothing more arrives within a few ms of asking).
                    while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(5), shell_rx.read()).await {
                        let is_exec = matches!(m.content, JupyterMessageContent::ExecuteRequest(_));
                        pending.push_back((m, is_exec));
                    }
                }
                Some(outcome_reply(outcome).as_child_of(&msg))
            }
            JupyterMessageContent::CompleteRequest(req) => Some(complete(&engine, req).await.as_child_of(&msg)),
            JupyterMessageContent::KernelInfoRequest(_) => Some(kernel_info_message(&msg, &child, &last)),
            JupyterMessageContent::ShutdownRequest(req) => {
                let _ = shutdown.send(req.restart);
                Some(ShutdownReply { restart: req.restart, status: ReplyStatus::Ok, error: None }.as_child_of(&msg))
            }
            _ => quick_reply(&msg),
        };
        if let Some(r) = reply {
            let _ = shell_tx.send(r).await;
        }
        let _ = iopub.send(Status::idle().as_child_of(&msg));
    }
}

/// Runs an execute request on the engine thread; `None` when the thread is gone.
async fn execute(
    engine: &std::sync::mpsc::Sender<EngineReq>,
    msg: &JupyterMessage,
    req: &ExecuteRequest,
) -> Option<Outcome> {
    let (tx, rx) = oneshot::channel();
    let sent = engine.send(EngineReq::Execute {
        msg: Box::new(msg.clone()),
        code: req.code.clone(),
        allow_stdin: req.allow_stdin,
        queued: std::time::Instant::now(),
        reply: tx,
    });
    if sent.is_ok() { rx.await.ok() } else { None }
}

/// The `execute_reply` for an outcome (`None`: the engine thread is gone).
fn outcome_reply(outcome: Option<Outcome>) -> ExecuteReply {
    match outcome {
        Some(o) => {
            let status = if o.error.is_some() { ReplyStatus::Error } else { ReplyStatus::Ok };
            execute_reply(status, o.count, o.error.as_ref().map(reply_error))
        }
        None => {
            let gone = ErrorInfo {
                ename: "KernelError".into(),
                evalue: "the engine thread is gone".into(),
                traceback: vec![],
            };
            execute_reply(ReplyStatus::Error, 0, Some(reply_error(&gone)))
        }
    }
}

fn execute_reply(status: ReplyStatus, count: u64, error: Option<Box<ReplyError>>) -> ExecuteReply {
    ExecuteReply {
        status,
        execution_count: ExecutionCount::new(count as usize),
        payload: vec![],
        user_expressions: None,
        error,
    }
}

/// Completions from the engine thread.
async fn complete(engine: &std::sync::mpsc::Sender<EngineReq>, req: &CompleteRequest) -> CompleteReply {
    let (tx, rx) = oneshot::channel();
    let sent = engine.send(EngineReq::Complete { code: req.code.clone(), cursor: req.cursor_pos, reply: tx });
    let (matches, start, end) =
        if sent.is_ok() { rx.await.unwrap_or_default() } else { (vec![], req.cursor_pos, req.cursor_pos) };
    CompleteReply {
        matches,
        cursor_start: start,
        cursor_end: end,
        metadata: Default::default(),
        status: ReplyStatus::Ok,
        error: None,
    }
}

/// The replies that need neither the engine nor the shell's state; `None`: no reply.
fn quick_reply(msg: &JupyterMessage) -> Option<JupyterMessage> {
    match &msg.content {
        JupyterMessageContent::IsCompleteRequest(req) => {
            let r = match is_complete(&req.code) {
                Completeness::Complete => IsCompleteReply::new(IsCompleteReplyStatus::Complete, String::new()),
                Completeness::Incomplete(indent) => IsCompleteReply::new(IsCompleteReplyStatus::Incomplete, indent),
                Completeness::Invalid => IsCompleteReply::new(IsCompleteReplyStatus::Invalid, String::new()),
            };
            Some(r.as_child_of(msg))
        }
        JupyterMessageContent::InspectRequest(_) => Some(
            InspectReply {
                found: false,
                data: Media::default(),
                metadata: Default::default(),
                status: ReplyStatus::Ok,
                error: None,
            }
            .as_child_of(msg),
        ),
        JupyterMessageContent::HistoryRequest(_) => {
            Some(HistoryReply { history: vec![], status: ReplyStatus::Ok, error: None }.as_child_of(msg))
        }
        JupyterMessageContent::CommInfoRequest(_) => {
            Some(CommInfoReply { status: ReplyStatus::Ok, comms: Default::default(), error: None }.as_child_of(msg))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reply is still a `kernel_info_reply` to a client that knows only the standard
    /// fields, and carries the live process for one that reads `gpumem`.
    #[test]
    fn kernel_info_carries_the_live_process() {
        let child: ChildHandle = Arc::new(Mutex::new(None));
        let last: LastRecord = Arc::new(Mutex::new(None));
        let request = JupyterMessage::new(jupyter_zmq_client::KernelInfoRequest {}, None);
        let reply = kernel_info_message(&request, &child, &last);
        assert_eq!(reply.header.msg_type, "kernel_info_reply");
        let value = serde_json::to_value(&reply.content).unwrap();
        assert_eq!(value["gpumem"], serde_json::json!({ "child_pid": null, "record": null }), "{value}");
        match JupyterMessageContent::from_type_and_content("kernel_info_reply", value).unwrap() {
            JupyterMessageContent::KernelInfoReply(r) => {
                assert_eq!(r.implementation, "gpumem-kernel");
                assert_eq!(r.protocol_version, "5.3");
                assert!(r.error.is_none());
            }
            other => panic!("{other:?}"),
        }
        // A record of a process that is not the live one (no process yet) is not offered.
        *last.lock().unwrap() = Some(CellRecord { cell: 3, child_pid: Some(42), ..Default::default() });
        assert!(live_process(&child, &last)["record"].is_null());
    }
}
