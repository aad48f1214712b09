//! Jupyter's `usage_request` (a control message: what jupyter-resource-usage's kernel panel
//! asks ipykernel every few seconds), answered with ipykernel's fields plus GPU memory.
//!
//! ipykernel's `usage_reply` (ipykernel ≥ 6.10, `kernelbase.py`, computed with psutil) holds
//! `hostname`, `pid`, `kernel_cpu` (percent of a core since the previous request, summed over
//! the kernel and every process below it), `kernel_memory` (their PSS, else RSS, bytes),
//! `host_cpu_percent` (left out on the first request, as psutil's first reading is
//! meaningless), `cpu_count` and `host_virtual_memory` (psutil's `virtual_memory()` fields,
//! bytes). Here the same numbers come from `/proc` (gpumem-nb's `procfs`, which the crate reads
//! its process table with too): the kernel's processes are the kernel, its
//! evcxr child and whatever they started (cargo and rustc while a cell compiles).
//!
//! `gpu_memory` is ours: one entry per GPU NVML lists (`total`, `used`, `free`, and `kernel`:
//! what the evcxr child holds there), with the gpumem-nb allocator's `allocated` and `reserved`
//! where the crate is loaded (matched by UUID); on the simulated device, one entry from the
//! crate. `nvml_error` says why NVML could not be read. The panel shows the ipykernel fields;
//! other clients read `gpu_memory`.

use crate::cell::hooks::SharedControl;
use gpumem_nb::device::nvml;
use gpumem_nb::kernel::protocol::{DeviceReading, Op};
use gpumem_nb::procfs::{self, kb_field, process_memory, read};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a usage request waits for the control channel (another thread may be asking the
/// crate) and for the crate's answer.
const CRATE_WAIT: Duration = Duration::from_millis(200);

/// What is remembered between requests, to give CPU use since the previous one.
#[derive(Default)]
pub struct Usage {
    /// Per process: CPU ticks (user + system) at the previous request.
    ticks: HashMap<u32, u64>,
    /// When the previous request was answered.
    at: Option<Instant>,
    /// The host's (busy, total) ticks at the previous request.
    host: Option<(u64, u64)>,
}

impl Usage {
    /// The `usage_reply` content now. `child`: the evcxr child's pid; `control`: the channel to
    /// the crate in it, when the engine is up.
    pub fn reply(&mut self, child: Option<u32>, control: Option<&SharedControl>) -> Value {
        let me = std::process::id();
        let table = procfs::processes();
        let mut pids = procfs::descendants_in(me, &table);
        pids.insert(0, me);
        // The child, even if /proc showed it under another parent (it never should).
        if let Some(c) = child.filter(|c| !pids.contains(c)) {
            pids.push(c);
        }
        let now = Instant::now();
        let elapsed = self.at.map(|t| now.duration_since(t).as_secs_f64());
        let hz = clock_ticks_per_second();
        let mut kernel_cpu = 0.0;
        let mut ticks = HashMap::new();
        for &pid in &pids {
            let Some(t) = table.get(&pid).map(|p| p.ticks) else { continue };
            // A process seen for the first time counts from now (psutil's first reading is 0).
            if let (Some(dt), Some(old)) = (elapsed.filter(|&d| d > 0.0), self.ticks.get(&pid)) {
                kernel_cpu += t.saturating_sub(*old) as f64 / hz / dt * 100.0;
            }
            ticks.insert(pid, t);
        }
        self.ticks = ticks;
        self.at = Some(now);
        let kernel_memory: u64 = pids.iter().filter_map(|&p| process_memory(p)).sum();

        let mut reply = json!({
            "hostname": hostname(),
            "pid": me,
            "kernel_cpu": round1(kernel_cpu),
            "kernel_memory": kernel_memory,
            "cpu_count": cpu_count(),
            "host_virtual_memory": read("/proc/meminfo").map_or(json!({}), |m| virtual_memory(&m)),
        });
        if let Some((busy, total)) = read("/proc/stat").and_then(|s| host_ticks(&s)) {
            if let Some((b0, t0)) = self.host
                && total > t0
            {
                let pct = busy.saturating_sub(b0) as f64 / (total - t0) as f64 * 100.0;
                reply["host_cpu_percent"] = json!(round1(pct));
            }
            self.host = Some((busy, total));
        }
        let (gpus, nvml_error) = gpu_memory(child, control.and_then(crate_readings).as_deref());
        reply["gpu_memory"] = Value::Array(gpus);
        if let Some(e) = nvml_error {
            reply["nvml_error"] = json!(e);
        }
        reply
    }
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// psutil's `virtual_memory()` on Linux, from `/proc/meminfo`.
fn virtual_memory(meminfo: &str) -> Value {
    let f = |name: &str| kb_field(meminfo, name).unwrap_or(0);
    let (total, free, buffers) = (f("MemTotal"), f("MemFree"), f("Buffers"));
    let cached = f("Cached") + f("SReclaimable");
    let available = kb_field(meminfo, "MemAvailable").unwrap_or(free + buffers + cached);
    let used = match total.checked_sub(free + buffers + cached) {
        Some(u) => u,
        None => total.saturating_sub(free),
    };
    let percent = if total > 0 { round1((total - available.min(total)) as f64 / total as f64 * 100.0) } else { 0.0 };
    json!({
        "total": total, "available": available, "percent": percent, "used": used, "free": free,
        "active": f("Active"), "inactive": f("Inactive"), "buffers": buffers, "cached": cached,
        "shared": f("Shmem"), "slab": f("Slab"),
    })
}

/// The host's (busy, total) CPU ticks from `/proc/stat`'s first line (busy: not idle, not
/// waiting for I/O; guest time is already inside user time).
fn host_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

fn cpu_count() -> usize {
    let n = read("/proc/stat").map_or(0, |s| {
        s.lines().filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit)).count()
    });
    if n > 0 { n } else { std::thread::available_parallelism().map_or(1, |n| n.get()) }
}

fn clock_ticks_per_second() -> f64 {
    use nix::unistd::{SysconfVar, sysconf};
    match sysconf(SysconfVar::CLK_TCK) {
        Ok(Some(hz)) if hz > 0 => hz as f64,
        _ => 100.0,
    }
}

fn hostname() -> String {
    read("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).filter(|h| !h.is_empty()).unwrap_or_else(|| {
        nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "localhost".into())
    })
}

/// The crate's readings, when the control channel is free within [`CRATE_WAIT`] and the crate
/// is loaded.
fn crate_readings(control: &SharedControl) -> Option<Vec<DeviceReading>> {
    let deadline = Instant::now() + CRATE_WAIT;
    let mut guard = loop {
        match control.try_lock() {
            Ok(g) => break g,
            Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    };
    guard.connected()?;
    guard.request(Op::Live, CRATE_WAIT).ok()?.devices
}

/// `gpu_memory`: NVML's devices with the crate's numbers where the UUIDs match, then the
/// crate's devices NVML does not list (the simulated device); and why NVML was unreadable.
fn gpu_memory(child: Option<u32>, crate_devices: Option<&[DeviceReading]>) -> (Vec<Value>, Option<String>) {
    let snap = nvml::snapshot();
    let crate_devices = crate_devices.unwrap_or_default();
    let mut matched = vec![false; crate_devices.len()];
    let mut out = Vec::new();
    for d in &snap.devices {
        let mut e = json!({
            "device": d.index, "name": d.name, "uuid": d.uuid, "total": d.total, "used": d.used, "free": d.free,
            "kernel": child.and_then(|p| d.process_used(p)), "source": "nvml",
        });
        let reading =
            crate_devices.iter().position(|r| r.uuid.as_deref().is_some_and(|u| u.eq_ignore_ascii_case(&d.uuid)));
        if let Some(i) = reading {
            matched[i] = true;
            let r = &crate_devices[i];
            e["cuda_device"] = json!(r.device);
            e["allocated"] = json!(r.allocated);
            e["reserved"] = json!(r.reserved);
        }
        out.push(e);
    }
    for (r, _) in crate_devices.iter().zip(&matched).filter(|(_, m)| !**m) {
        out.push(json!({
            "device": r.device, "name": if r.is_simulated() { "simulated device" } else { "CUDA device" },
            "total": r.device_total, "free": r.device_free,
            "used": r.device_total.zip(r.device_free).map(|(t, f)| t.saturating_sub(f)),
            "allocated": r.allocated, "reserved": r.reserved,
            "source": if r.is_simulated() { "simulated" } else { "gpumem-nb" },
        }));
    }
    (out, snap.error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_texts_are_read_like_psutil() {
        let meminfo = "MemTotal:  1000 kB\nMemFree:  100 kB\nMemAvailable:  600 kB\nBuffers:  50 kB\n\
                       Cached:  300 kB\nSReclaimable:  50 kB\nActive:  10 kB\nInactive:  20 kB\n";
        let v = virtual_memory(meminfo);
        assert_eq!(v["total"], 1000 * 1024);
        assert_eq!(v["available"], 600 * 1024);
        assert_eq!(v["used"], 500 * 1024, "total − free − buffers − cached (with SReclaimable)");
        assert_eq!(v["percent"], 40.0);
        assert_eq!(host_ticks("cpu  10 0 10 70 10 0 0 0 0 0\ncpu0 1"), Some((20, 100)));
    }

    #[test]
    fn a_reply_has_ipykernels_fields_and_cpu_since_the_last_one() {
        let mut u = Usage::default();
        let first = u.reply(None, None);
        for key in ["hostname", "pid", "kernel_cpu", "kernel_memory", "cpu_count", "host_virtual_memory", "gpu_memory"]
        {
            assert!(first.get(key).is_some(), "{key}: {first}");
        }
        assert_eq!(first["pid"], std::process::id());
        assert!(first["kernel_memory"].as_u64().unwrap() > 0);
        assert!(first.get("host_cpu_percent").is_none(), "no first reading, as psutil");
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(0);
        }
        let second = u.reply(None, None);
        assert!(second["kernel_cpu"].as_f64().unwrap() > 0.0, "{second}");
        assert!(second.get("host_cpu_percent").is_some(), "{second}");
    }
}
