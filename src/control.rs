//! The child end of the gpumem kernel's control channel.
//!
//! The kernel (`gpumem-kernel`) runs notebook code in an evcxr child process and, around every
//! cell, asks the allocator in that child for its exact numbers. It listens on a private Unix
//! socket and passes its path to the child in `GPUMEM_NB_CONTROL`. The first time this crate
//! opens a device in the child it connects there (once per process: the connection lives in
//! the process-wide anchor's state), says hello, and serves the kernel's requests on a
//! background thread, without any code in the cell and without a compile per cell.
//!
//! Protocol: one JSON object per line each way. The child sends
//! `{"hello":1,"pid":P,"version":V}`; then for each request `{"id":n,"op":...}` it answers
//! `{"id":n,"ok":true,...}` or `{"id":n,"ok":false,"error":"..."}`. Operations:
//! - `pre` `{"cell":N}`: label allocations "cell N", open a fresh peak slot per device, restart
//!   the CUDA pool's high-water marks; answer the readings.
//! - `post` `{"cell":N}`: the readings, with peaks since `pre`; close the slots, clear the label.
//! - `read`: the readings now.
//! - `record` `{"enabled":"all"|"state"|"off","max_entries":M,"stacks":bool}`.
//! - `snapshot` `{"dir":D}`: write snapshot.pickle/.json/trace_plot.html for device 0.
//! - `history_svg`: the memory-over-time chart of device 0's recorded history.
//! - `summary`: device 0's `memory_summary()`.
//!
//! A reading: `{"device","backend","allocated","reserved","active","requested",
//! "peak_allocated","peak_reserved","device_free","device_total","pool_used","pool_reserved",
//! "pool_used_high","pool_reserved_high","num_ooms"}` in bytes; `pool_*` (the CUDA
//! stream-ordered pool that cudarc's own `CudaSlice` uses) are null on the simulated device.

use crate::Allocator;
use crate::backend::Backend;
use crate::history::{HistoryOptions, RecordMode, StackContext};
use crate::stats::SlotId;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::sync::Arc;

/// The environment variable naming the kernel's control socket.
pub const CONTROL_VAR: &str = "GPUMEM_NB_CONTROL";

/// Connects to the kernel if it asked for it and this process has not connected yet.
pub(crate) fn start_if_requested() {
    let Some(path) = std::env::var_os(CONTROL_VAR) else { return };
    let shared = crate::anchor::shared();
    let mut started = shared.control_started.lock().unwrap_or_else(|e| e.into_inner());
    if *started {
        return;
    }
    *started = true;
    drop(started);
    connect(std::path::Path::new(&path));
}

#[cfg(unix)]
fn connect(path: &std::path::Path) {
    let Ok(mut stream) = std::os::unix::net::UnixStream::connect(path) else { return };
    let hello = json!({"hello": 1, "pid": std::process::id(), "version": env!("CARGO_PKG_VERSION")});
    if writeln!(stream, "{hello}").is_err() {
        return;
    }
    let Ok(reader) = stream.try_clone() else { return };
    let _ =
        std::thread::Builder::new().name("gpumem-control".into()).spawn(move || serve(BufReader::new(reader), stream));
}

#[cfg(not(unix))]
fn connect(_path: &std::path::Path) {}

/// Answers requests until the kernel closes the connection.
pub fn serve(reader: impl BufRead, mut out: impl Write) {
    let mut session = Session::default();
    for line in reader.lines() {
        let Ok(line) = line else { return };
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(req) => {
                let id = req.get("id").cloned().unwrap_or(Value::Null);
                let mut r = match session.handle(&req) {
                    Ok(Value::Object(m)) => Value::Object(m),
                    Ok(other) => json!({"value": other}),
                    Err(e) => json!({"ok": false, "error": e}),
                };
                r["id"] = id;
                if r.get("ok").is_none() {
                    r["ok"] = json!(true);
                }
                r
            }
            Err(e) => json!({"id": null, "ok": false, "error": format!("malformed request: {e}")}),
        };
        // One write per reply (formatting straight into the socket writes token by token).
        let mut line = reply.to_string();
        line.push('\n');
        if out.write_all(line.as_bytes()).and_then(|()| out.flush()).is_err() {
            return;
        }
    }
}

/// What the serving thread remembers between requests: the open peak slots per device.
#[derive(Default)]
struct Session {
    slots: HashMap<i32, SlotId>,
}

fn reading(alloc: &Allocator, slot: Option<SlotId>) -> Value {
    let (stats, peaks, pool, info, uuid) = alloc.with_state(|s, b| {
        let peaks = slot.and_then(|id| s.slot_peaks(id));
        (s.stats().clone(), peaks, b.pool_usage(), b.mem_get_info().ok(), device_uuid(b))
    });
    let (peak_allocated, peak_reserved) = match peaks {
        Some(p) => (p.allocated, p.reserved),
        None => (stats.allocated_bytes[0].peak, stats.reserved_bytes[0].peak),
    };
    json!({
        "device": alloc.device(),
        "backend": alloc.backend_kind().name(),
        "allocated": stats.allocated_bytes[0].current,
        "reserved": stats.reserved_bytes[0].current,
        "active": stats.active_bytes[0].current,
        "requested": stats.requested_bytes[0].current,
        "peak_allocated": peak_allocated,
        "peak_reserved": peak_reserved,
        "device_free": info.map(|i| i.0),
        "device_total": info.map(|i| i.1),
        "pool_used": pool.map(|p| p.used),
        "pool_reserved": pool.map(|p| p.reserved),
        "pool_used_high": pool.map(|p| p.used_high),
        "pool_reserved_high": pool.map(|p| p.reserved_high),
        "num_ooms": stats.num_ooms,
        "uuid": uuid,
    })
}

/// The CUDA device's UUID in NVML's form ("GPU-…"), for the kernel's NVML matching.
fn device_uuid(b: &crate::AnyBackend) -> Option<String> {
    #[cfg(feature = "cuda")]
    if let Some(c) = b.as_cuda() {
        return c.uuid().ok().map(|u| crate::backend::nvml::uuid_string("GPU", u));
    }
    let _ = b;
    None
}

fn device0() -> Result<Arc<Allocator>, String> {
    crate::registry::opened().into_iter().find(|a| a.device() == 0).ok_or_else(|| "no device is open".to_string())
}

impl Session {
    fn readings(&self) -> Value {
        let devices: Vec<Value> =
            crate::registry::opened().iter().map(|a| reading(a, self.slots.get(&a.device()).copied())).collect();
        json!({"devices": devices})
    }

    fn handle(&mut self, req: &Value) -> Result<Value, String> {
        let op = req.get("op").and_then(Value::as_str).ok_or("request without \"op\"")?;
        match op {
            "pre" => {
                let cell = req.get("cell").and_then(Value::as_u64).ok_or("pre needs \"cell\"")?;
                for a in crate::registry::opened() {
                    a.set_label(Some(&format!("cell {cell}")));
                    let slot = a.with_state(|s, b| {
                        b.reset_pool_high_water();
                        s.open_slot()
                    });
                    if let Some(old) = self.slots.insert(a.device(), slot) {
                        a.with_state(|s, _| s.close_slot(old));
                    }
                }
                Ok(self.readings())
            }
            "post" => {
                let r = self.readings();
                for a in crate::registry::opened() {
                    if let Some(slot) = self.slots.remove(&a.device()) {
                        a.with_state(|s, _| s.close_slot(slot));
                    }
                    a.set_label(None);
                }
                Ok(r)
            }
            "read" => Ok(self.readings()),
            "record" => {
                let enabled = match req.get("enabled").and_then(Value::as_str).unwrap_or("all") {
                    "all" => RecordMode::All,
                    "state" => RecordMode::State,
                    "off" => RecordMode::Off,
                    other => return Err(format!("record: unknown mode {other:?} (all, state or off)")),
                };
                let stacks = req.get("stacks").and_then(Value::as_bool).unwrap_or(false);
                let max_entries = req
                    .get("max_entries")
                    .and_then(Value::as_u64)
                    .map_or(usize::MAX, |m| m.min(usize::MAX as u64) as usize);
                let context = if stacks { StackContext::All } else { StackContext::None };
                for a in crate::registry::opened() {
                    a.record_memory_history_with(HistoryOptions { enabled, context, max_entries });
                }
                Ok(json!({}))
            }
            "snapshot" => {
                let dir = req.get("dir").and_then(Value::as_str).ok_or("snapshot needs \"dir\"")?;
                let a = device0()?;
                let files =
                    crate::snapshot::write_all(&a.snapshot(), std::path::Path::new(dir)).map_err(|e| e.to_string())?;
                Ok(json!({"files": {"pickle": files.pickle, "json": files.json, "html": files.html}}))
            }
            "history_svg" => {
                let a = device0()?;
                let chart = crate::render::charts::MemoryTimeline::of(&*a).chart(&Default::default());
                Ok(json!({"svg": chart.svg, "text": chart.text}))
            }
            "summary" => Ok(json!({"text": device0()?.memory_summary(false)})),
            other => Err(format!("unknown op {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(requests: &str) -> Vec<Value> {
        let mut out = Vec::new();
        serve(requests.as_bytes(), &mut out);
        String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    #[test]
    fn malformed_and_unknown_requests_are_answered_not_fatal() {
        let r = run("not json\n{\"id\":7,\"op\":\"frobnicate\"}\n{\"id\":8}\n");
        assert_eq!(r.len(), 3);
        assert_eq!(r[0]["ok"], false);
        assert!(r[0]["error"].as_str().unwrap().starts_with("malformed request"));
        assert_eq!((r[1]["id"].as_u64(), r[1]["ok"].as_bool()), (Some(7), Some(false)));
        assert!(r[1]["error"].as_str().unwrap().contains("frobnicate"));
        assert_eq!(r[2]["ok"], false);
    }
}
