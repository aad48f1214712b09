//! The per-cell hook path end to end, without evcxr: this binary plays both sides.
//!
//! - The **kernel side** (`main`) holds the kernel's control channel and runs the kernel's own
//!   hooks (`gpumem_kernel::cell::hooks`: NVML and the crate's `pre`/`post`) around every cell, builds
//!   the cell's record and report line, and keeps the history, as `Engine::run_cell` does.
//! - The **notebook child** is this same binary started again with `GPUMEM_HOOK_PATH_CHILD=1`
//!   and `GPUMEM_NB_CONTROL`, as evcxr's child is. It loads gpumem-nb on its first cell (which
//!   registers it on the control channel) and runs scripted cells that allocate and free,
//!   through cudarc's own pool too, panic, hit an OOM, and crash; after each it answers what
//!   its allocator, the CUDA pool and NVML say about itself.
//!
//! Every report number is compared with the child's own: allocated, reserved and the cell's
//! peaks with the allocator's, pool numbers with the pool's, the process line with NVML's, and
//! the scripted sizes (exact bytes). A crash replaces the child, as evcxr does; the report must
//! say so and the next child must register again.
//!
//! It runs in CI on the simulated device (no NVML), and on a GPU machine from the carried bundle
//! (`scripts/gpu/run.sh`), where `GPUMEM_NB_EXPECT_GPU=1` makes the CUDA backend and NVML
//! required. Prints one JSON line per check and per cell, and fails if any check fails.

use gpumem_kernel::cell::hooks::{self, Hooks};
use gpumem_kernel::session::control::{CONTROL_VAR, ControlServer};
use gpumem_kernel::session::history::History;
use gpumem_nb::kernel::report::{CellRecord, CellStatus};
use gpumem_nb::{Allocator, DeviceBuffer, StreamId};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

const CHILD_VAR: &str = "GPUMEM_HOOK_PATH_CHILD";
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const WEIGHTS: u64 = 64 * MIB;
const SCRATCH: u64 = GIB;
const SLICE: u64 = 48 * MIB;
const IN_PANIC: u64 = 256 * MIB;
const IN_CRASH: u64 = 512 * MIB;
const TOO_BIG: u64 = 1 << 40;

fn main() -> ExitCode {
    if std::env::var_os(CHILD_VAR).is_some() { child_main() } else { kernel_main() }
}

// ------------------------------------------------------------------ the notebook child

/// What the child keeps between cells, as a notebook's variables.
#[derive(Default)]
struct Vars {
    buffers: HashMap<&'static str, DeviceBuffer<u8>>,
    /// cudarc's own allocations (`CudaSlice`), type-erased.
    slices: Vec<Box<dyn std::any::Any>>,
}

fn child_main() -> ExitCode {
    let mut vars = Vars::default();
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let req: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                let _ = writeln!(out, "{}", json!({"status": "error", "error": format!("bad request: {e}")}));
                continue;
            }
        };
        let op = req["do"].as_str().unwrap_or("");
        let start = gpumem_nb::kernel::opened().first().map(|a| {
            // The child's own measure of the cell's peak: the allocator's global peak, reset here.
            a.reset_peak_memory_stats();
            self_reading(a)
        });
        let (status, error) = run_cell(op, &mut vars);
        let end = gpumem_nb::kernel::opened().first().map(self_reading);
        let reply = json!({"pid": std::process::id(), "status": status, "error": error, "start": start, "end": end});
        let _ = writeln!(out, "{reply}");
        let _ = out.flush();
    }
    ExitCode::SUCCESS
}

fn device() -> Result<Arc<Allocator>, String> {
    gpumem_nb::current().map_err(|e| e.to_string())
}

fn alloc(a: &Arc<Allocator>, bytes: u64) -> Result<DeviceBuffer<u8>, String> {
    DeviceBuffer::<u8>::alloc(a, bytes as usize, StreamId::DEFAULT).map_err(|e| e.to_string())
}

/// Runs one scripted cell: (status, error).
fn run_cell(op: &str, vars: &mut Vars) -> (&'static str, Option<String>) {
    let r: Result<(), String> = (|| {
        match op {
            // Loads the crate (which registers it on the control channel) and keeps weights.
            "load" => {
                let a = device()?;
                vars.buffers.insert("weights", alloc(&a, WEIGHTS)?);
            }
            // A temporary that the cache keeps afterwards.
            "scratch" => {
                let a = device()?;
                drop(alloc(&a, SCRATCH)?);
            }
            // cudarc's own `CudaSlice`, from the CUDA stream-ordered pool, kept.
            "cudarc" => {
                let a = device()?;
                let ctx = a.with_backend(|b| b.as_cuda().map(|c| c.context().clone()));
                if let Some(ctx) = ctx {
                    let stream = ctx.default_stream();
                    let s = stream.alloc_zeros::<u8>(SLICE as usize).map_err(|e| format!("alloc_zeros: {e:?}"))?;
                    stream.synchronize().map_err(|e| format!("synchronize: {e:?}"))?;
                    vars.slices.push(Box::new(s));
                }
            }
            // Panics with a buffer alive: the unwinding frees it; evcxr's child survives a panic.
            "panic" => {
                let a = device()?;
                let caught = std::panic::catch_unwind(|| {
                    let _b = alloc(&a, IN_PANIC);
                    panic!("cell panicked on purpose");
                });
                if caught.is_err() {
                    return Err("panicked".into());
                }
            }
            "oom" => {
                let a = device()?;
                alloc(&a, TOO_BIG)?;
            }
            "empty_cache" => device()?.empty_cache().map_err(|e| e.to_string())?,
            "free_weights" => {
                vars.buffers.remove("weights");
            }
            // Dies with memory held, as a segfaulting or aborting cell does.
            "crash" => {
                let a = device()?;
                let b = alloc(&a, IN_CRASH)?;
                std::mem::forget(b);
                std::process::abort();
            }
            other => return Err(format!("unknown cell {other:?}")),
        }
        Ok(())
    })();
    match r {
        Ok(()) => ("ok", None),
        Err(e) if e == "panicked" => ("panicked", None),
        Err(e) => ("error", Some(e.lines().next().unwrap_or("").to_string())),
    }
}

/// What the child's allocator, CUDA pool and NVML say about this process.
fn self_reading(a: &Arc<Allocator>) -> Value {
    let (pool, info, uuid) = a.with_backend(|b| {
        use gpumem_nb::Backend;
        (b.pool_usage(), b.mem_get_info().ok(), b.as_cuda().and_then(|c| c.uuid().ok()))
    });
    let nvml_process = uuid.and_then(|u| match gpumem_nb::device::nvml::this_process(u) {
        Ok(gpumem_nb::device::nvml::ThisProcess::Used(b)) => Some(b),
        _ => None,
    });
    let stats = a.memory_stats();
    json!({
        "backend": a.backend_kind().name(),
        "allocated": a.memory_allocated(),
        "reserved": a.memory_reserved(),
        "peak_allocated": a.max_memory_allocated(),
        "peak_reserved": a.max_memory_reserved(),
        "num_ooms": stats.get("num_ooms").copied().unwrap_or(0),
        "pool": pool.map(|p| json!({"used": p.used, "reserved": p.reserved, "used_high": p.used_high, "reserved_high": p.reserved_high})),
        "device_free": info.map(|i| i.0),
        "nvml_process": nvml_process,
    })
}

// ------------------------------------------------------------------ the kernel side

struct Child {
    proc: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: Receiver<String>,
}

fn spawn_child(control: &ControlServer) -> Child {
    let exe = std::env::current_exe().expect("own path");
    let mut proc = Command::new(exe)
        .env(CHILD_VAR, "1")
        .env(CONTROL_VAR, control.socket_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the child");
    let stdin = proc.stdin.take().unwrap();
    let stdout = proc.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Child { proc, stdin, lines }
}

/// The checks, printed as they are made.
#[derive(Default)]
struct Checks {
    passed: usize,
    failed: Vec<String>,
}

impl Checks {
    fn eq<T: PartialEq + std::fmt::Debug>(&mut self, cell: u64, what: &str, report: T, truth: T) {
        let pass = report == truth;
        println!(
            "{}",
            json!({"cell": cell, "check": what, "pass": pass, "report": format!("{report:?}"), "truth": format!("{truth:?}")})
        );
        if pass {
            self.passed += 1;
        } else {
            self.failed.push(format!("cell {cell}: {what}: report {report:?}, truth {truth:?}"));
        }
    }

    fn ok(&mut self, cell: u64, what: &str, pass: bool) {
        self.eq(cell, what, pass, true);
    }
}

fn u(v: &Value) -> Option<u64> {
    v.as_u64()
}

fn kernel_main() -> ExitCode {
    let expect_gpu = std::env::var("GPUMEM_NB_EXPECT_GPU").is_ok_and(|v| v == "1");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut hooks = Hooks::new(ControlServer::in_dir(&dir.path().join("k")).expect("control socket"));
    let mut child = spawn_child(&hooks.control());
    let mut history = History::default();
    let mut checks = Checks::default();
    let script = ["load", "scratch", "cudarc", "panic", "empty_cache", "oom", "crash", "load", "free_weights"];
    let mut backend = String::new();

    for (i, op) in script.iter().enumerate() {
        let cell = i as u64 + 1;
        let before = hooks.before(cell, Some(child.proc.id()));
        let t0 = std::time::Instant::now();
        writeln!(child.stdin, "{}", json!({"do": op})).expect("send the cell");
        child.stdin.flush().unwrap();
        let reply = match child.lines.recv_timeout(Duration::from_secs(120)) {
            Ok(line) => Some(serde_json::from_str::<Value>(&line).expect("child reply")),
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => panic!("cell {cell} ({op}): the child did not answer in 120 s"),
        };
        let wall = t0.elapsed();
        // A dead child is replaced before the post-cell hooks, as evcxr does.
        let mut crashed = None;
        let old_pid = child.proc.id();
        if reply.is_none() {
            let status = child.proc.wait().expect("reap the child");
            crashed = Some(status.to_string());
            child = spawn_child(&hooks.control());
        }
        let after = hooks.after(cell, Some(child.proc.id()));
        let mut rec = hooks::record(cell, &before, &after);
        rec.first_line = (*op).to_string();
        rec.wall_ms = wall.as_secs_f64() * 1000.0;
        // The child's own word; a crash is the cell's error, as the kernel records it.
        rec.status = reply.as_ref().map_or(CellStatus::Error, |r| {
            serde_json::from_value(r["status"].clone()).expect("the child's status is a cell status")
        });
        if let Some(c) = &crashed {
            rec.restart_reason = Some(format!("crashed: {c}"));
        }
        history.warn(&mut rec);
        println!("{}", json!({"cell": cell, "op": op, "line": rec.line(), "record": &rec, "child": &reply}));

        match &reply {
            Some(r) => check_cell(&mut checks, op, &rec, r, &mut backend),
            None => check_crash(&mut checks, &rec, old_pid, &after, expect_gpu),
        }
        history.cells.push(rec);
    }

    if expect_gpu {
        checks.eq(0, "backend (GPUMEM_NB_EXPECT_GPU=1)", backend.as_str(), "cuda");
    }
    // The history table holds every cell, the crash included.
    let table = history.table().to_text();
    checks.eq(0, "history rows", history.cells.len(), script.len());
    checks.ok(0, "history names the crash", table.contains("error; child restarted"));
    println!("{table}");
    let _ = child.proc.kill();
    let _ = child.proc.wait();

    println!("{}", json!({"summary": {"backend": backend, "passed": checks.passed, "failed": checks.failed}}));
    if checks.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        for f in &checks.failed {
            eprintln!("FAILED {f}");
        }
        ExitCode::FAILURE
    }
}

/// A cell whose child answered: the report against the child's own numbers and the script.
fn check_cell(c: &mut Checks, op: &str, rec: &CellRecord, r: &Value, backend: &mut String) {
    let cell = rec.cell;
    let (start, end) = (&r["start"], &r["end"]);
    let status = match op {
        "panic" => "panicked",
        "oom" => "error",
        _ => "ok",
    };
    c.eq(cell, "status", rec.status.name(), status);
    let Some(a) = &rec.allocator else {
        c.ok(cell, "the report has the allocator's numbers", false);
        return;
    };
    *backend = end["backend"].as_str().unwrap_or("").to_string();
    let cuda = backend == "cuda";
    // Allocator: the report's numbers are the child's allocator's.
    c.eq(cell, "allocated after", a.allocated.after, u(&end["allocated"]));
    c.eq(cell, "reserved after", a.reserved.after, u(&end["reserved"]));
    // Loaded during the cell (first cell of a child): the report starts from zero.
    c.eq(cell, "allocated before", a.allocated.before, Some(u(&start["allocated"]).unwrap_or(0)));
    c.eq(cell, "reserved before", a.reserved.before, Some(u(&start["reserved"]).unwrap_or(0)));
    c.eq(cell, "peak allocated in the cell", Some(a.peak_allocated), u(&end["peak_allocated"]));
    c.eq(cell, "peak reserved in the cell", Some(a.peak_reserved), u(&end["peak_reserved"]));
    c.eq(cell, "OOMs in the cell", a.ooms, u(&end["num_ooms"]).unwrap_or(0) - u(&start["num_ooms"]).unwrap_or(0));
    // The peak covers the cell: from the cell's slot when the crate was loaded before it, and
    // from the crate's load when that happened during the cell (no `start`), which is inside it.
    c.eq(cell, "peak covers exactly the cell", a.peak_is_cell, true);
    // CUDA pool (cudarc's own allocations): the pool's numbers.
    let pool = &end["pool"];
    match &rec.pool {
        Some(p) if !pool.is_null() => {
            c.eq(cell, "pool used after", p.used.after, u(&pool["used"]));
            c.eq(cell, "pool reserved after", p.reserved.after, u(&pool["reserved"]));
            c.eq(cell, "pool used high-water", p.used_high, u(&pool["used_high"]));
            c.eq(cell, "pool reserved high-water", p.reserved_high, u(&pool["reserved_high"]));
        }
        None => c.ok(cell, "no pool numbers without a CUDA pool", pool.is_null()),
        Some(_) => c.ok(cell, "pool numbers only with a CUDA pool", false),
    }
    // NVML: the report's process line is NVML's number for the child.
    match u(&end["nvml_process"]) {
        Some(nv) => {
            c.eq(cell, "NVML process after", rec.nvml.process.after, Some(nv));
            if let (Some(pb), Some(nb)) = (u(&start["nvml_process"]), rec.nvml.process.before) {
                c.eq(cell, "NVML process before", nb, pb);
                // What the process holds moved by what the allocator and the pool reserved.
                let moved = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).map_or(0, |x| x as i64);
                let want = moved(end, "reserved") - moved(start, "reserved") + moved(&end["pool"], "reserved")
                    - moved(&start["pool"], "reserved");
                let what = "NVML process delta = reserved delta + pool reserved delta";
                c.eq(cell, what, rec.nvml.process.delta(), Some(want));
            }
        }
        None => c.ok(cell, "no NVML number without NVML", !cuda || rec.nvml.unavailable.is_some()),
    }
    // The script's exact sizes.
    let before = u(&start["allocated"]).unwrap_or(0);
    match op {
        "load" => {
            c.eq(cell, "loaded during the cell", (rec.crate_loaded.before, rec.crate_loaded.after), (false, true));
            c.eq(cell, "weights allocated", a.allocated.after, Some(WEIGHTS));
            c.eq(cell, "weights peak", a.peak_allocated, WEIGHTS);
        }
        "scratch" => {
            c.eq(cell, "scratch peak", a.peak_allocated, before + SCRATCH);
            c.eq(cell, "scratch freed", a.allocated.delta(), Some(0));
            c.eq(cell, "scratch kept in the cache", a.reserved.delta(), Some(SCRATCH as i64));
        }
        "cudarc" if cuda => {
            let p = rec.pool.as_ref();
            c.eq(cell, "CudaSlice in the pool", p.and_then(|p| p.used.delta()), Some(SLICE as i64));
            c.eq(cell, "pool high-water = the slice", p.and_then(|p| p.used_high), Some(SLICE));
            c.eq(cell, "allocator untouched by cudarc", a.allocated.delta(), Some(0));
        }
        "panic" => {
            c.eq(cell, "panic peak", a.peak_allocated, before + IN_PANIC);
            c.eq(cell, "unwinding freed the buffer", a.allocated.delta(), Some(0));
        }
        "oom" => {
            c.eq(cell, "one OOM", a.ooms, 1);
            c.ok(cell, "the error names the OOM", r["error"].as_str().is_some_and(|e| e.contains("out of memory")));
            c.eq(cell, "nothing held after the OOM", a.allocated.delta(), Some(0));
        }
        "empty_cache" => {
            c.eq(cell, "empty_cache left what is allocated", a.reserved.after, Some(before.next_multiple_of(2 * MIB)));
        }
        "free_weights" => c.eq(cell, "weights freed", a.allocated.after, Some(0)),
        _ => {}
    }
}

/// A cell whose child died: the report says the child was replaced, and NVML lets it go.
fn check_crash(c: &mut Checks, rec: &CellRecord, old_pid: u32, after: &hooks::After, expect_gpu: bool) {
    let cell = rec.cell;
    c.eq(cell, "status", rec.status, CellStatus::Error);
    c.ok(cell, "restart noticed (pid changed)", rec.restarted && rec.child_pid != Some(old_pid));
    c.ok(cell, "restart reason given", rec.restart_reason.as_deref().is_some_and(|r| r.starts_with("crashed")));
    c.ok(cell, "the new child has not loaded the crate", rec.allocator.is_none() && !rec.crate_loaded.after);
    c.ok(cell, "the line says the child restarted", rec.line().contains("restart"));
    if expect_gpu || rec.nvml.unavailable.is_none() {
        c.ok(cell, "NVML no longer lists the dead child", !after.nvml.devices.iter().any(|d| d.lists(old_pid)));
        c.eq(cell, "NVML process after (new child, no context yet)", rec.nvml.process.after, Some(0));
    }
}
