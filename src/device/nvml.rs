//! NVML through `nvml-wrapper`: whole-device and per-process memory of a GPU, with CUDA devices
//! matched to NVML devices by UUID.
//!
//! NVML answers two questions the CUDA driver cannot: how much device memory *this process*
//! holds (its CUDA context, cuBLAS workspaces, other libraries — not only our allocator), and
//! which other processes share the GPU. That is what explains "your number is not nvidia-smi".
//!
//! # Matching devices
//! NVML numbers GPUs in PCI order, the CUDA driver in its own order, and `CUDA_VISIBLE_DEVICES`
//! renumbers CUDA devices again, so an index never identifies an NVML device (ipyexperiments
//! issue 2 measured the wrong card that way). Every function here takes the CUDA device's
//! 16-byte UUID (`cuDeviceGetUuid`, see `backend::cuda::device_uuid`) and looks the NVML device
//! up by the string NVML prints for it (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, or `MIG-…`
//! for a MIG instance).
//!
//! # Never panicking
//! `nvml-wrapper` loads `libnvidia-ml.so` at run time and answers `Err` when it is absent. One
//! [`Nvml`] is kept for the process in a `OnceLock` (a `Device` borrows it); a failed
//! initialisation is remembered as its reason. Every failure is a one-line
//! `DeviceError::Unavailable` that says what was unavailable.
#![forbid(unsafe_code)]

use super::{DeviceError, ProcessMemory};
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use std::sync::OnceLock;

/// The process's NVML handle, initialised on first use; `Err` (why) when NVML is unavailable.
pub fn nvml() -> Result<&'static Nvml, DeviceError> {
    static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();
    NVML.get_or_init(|| match std::panic::catch_unwind(Nvml::init) {
        Ok(Ok(n)) => Ok(n),
        Ok(Err(e)) => Err(format!("NVML is unavailable ({e})")),
        Err(_) => Err("NVML is unavailable (its initialisation panicked)".into()),
    })
    .as_ref()
    .map_err(|e| DeviceError::Unavailable(e.clone()))
}

fn unavailable(why: String) -> DeviceError {
    DeviceError::Unavailable(why)
}

/// Whether NVML can be used in this process.
pub fn available() -> bool {
    nvml().is_ok()
}

/// The UUID as NVML prints it: `PREFIX-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (lowercase hex),
/// `prefix` being `GPU` for a whole GPU, `MIG` for a MIG instance.
pub fn uuid_string(prefix: &str, uuid: [u8; 16]) -> String {
    let hex = |r: std::ops::Range<usize>| uuid[r].iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!("{prefix}-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
}

/// The NVML device of the CUDA device with this UUID (tries the `GPU-` form, then `MIG-`).
fn device(uuid: [u8; 16]) -> Result<nvml_wrapper::Device<'static>, DeviceError> {
    let nvml = nvml()?;
    let gpu = uuid_string("GPU", uuid);
    match nvml.device_by_uuid(gpu.as_str()) {
        Ok(d) => Ok(d),
        Err(e) => nvml
            .device_by_uuid(uuid_string("MIG", uuid).as_str())
            .map_err(|_| unavailable(format!("NVML knows no device with the CUDA device's UUID {gpu} ({e})"))),
    }
}

/// Whole-device memory as NVML reports it (`nvmlDeviceGetMemoryInfo_v2`), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmlMemory {
    /// Installed memory.
    pub total: u64,
    /// Unallocated memory.
    pub free: u64,
    /// Memory in use by every process (and the driver's bookkeeping), without `reserved`.
    pub used: u64,
    /// Memory the driver sets aside (firmware, ECC, …).
    pub reserved: u64,
}

/// Whole-device memory of the CUDA device with this UUID.
pub fn device_memory(uuid: [u8; 16]) -> Result<NvmlMemory, DeviceError> {
    let m = device(uuid)?.memory_info().map_err(|e| unavailable(format!("NVML memory_info failed ({e})")))?;
    Ok(NvmlMemory { total: m.total, free: m.free, used: m.used, reserved: m.reserved })
}

/// One process in NVML's lists; `used` is `None` when NVML cannot say (WDDM, MIG, the R570
/// `u64::MAX` sentinel, or a value above the device's size).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NvmlProcess {
    /// Process id (the host's PID namespace: in a container it may not be ours).
    pub pid: u32,
    /// Bytes in use on the device.
    pub used: Option<u64>,
}

/// Every process with a context on the device (compute and graphics lists merged by PID).
pub fn processes(uuid: [u8; 16]) -> Result<Vec<NvmlProcess>, DeviceError> {
    let dev = device(uuid)?;
    let total = dev.memory_info().map(|m| m.total).unwrap_or(u64::MAX);
    processes_of(&dev, total)
}

/// The one merge of NVML's process lists: compute and graphics contexts by PID (the same
/// process in both holds the same memory, not twice as much), NVML's sentinels dropped.
fn processes_of(dev: &nvml_wrapper::Device<'_>, total: u64) -> Result<Vec<NvmlProcess>, DeviceError> {
    let mut out: Vec<NvmlProcess> = Vec::new();
    let compute = dev
        .running_compute_processes()
        .map_err(|e| unavailable(format!("NVML running_compute_processes failed ({e})")))?;
    // Graphics contexts are listed separately; absent on compute-only boards, so tolerated.
    let graphics = dev.running_graphics_processes().unwrap_or_default();
    for p in compute.into_iter().chain(graphics) {
        let used = match p.used_gpu_memory {
            UsedGpuMemory::Used(b) if b != u64::MAX && b <= total => Some(b),
            _ => None,
        };
        match out.iter_mut().find(|q| q.pid == p.pid) {
            Some(q) => q.used = q.used.max(used),
            None => out.push(NvmlProcess { pid: p.pid, used }),
        }
    }
    Ok(out)
}

/// One NVML device as a whole: memory and every process on it (what a kernel reads per cell
/// without a CUDA context of its own).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NvmlDevice {
    /// NVML index (PCI order; not the CUDA index).
    pub index: u32,
    /// `GPU-…` / `MIG-…`.
    pub uuid: String,
    /// Marketing name.
    pub name: String,
    /// Installed memory, bytes.
    pub total: u64,
    /// Free memory, bytes.
    pub free: u64,
    /// Used by every process, bytes.
    pub used: u64,
    /// Processes with a context on the device.
    pub processes: Vec<NvmlProcess>,
}

impl NvmlDevice {
    /// The memory NVML reports for `pid` here (`None`: not listed, or no number).
    pub fn process_used(&self, pid: u32) -> Option<u64> {
        self.processes.iter().find(|p| p.pid == pid).and_then(|p| p.used)
    }

    /// Whether `pid` has a context on the device.
    pub fn lists(&self, pid: u32) -> bool {
        self.processes.iter().any(|p| p.pid == pid)
    }

    /// Bytes used by the processes other than `pid` (those with a number).
    pub fn others_used(&self, pid: u32) -> u64 {
        self.processes.iter().filter(|p| p.pid != pid).filter_map(|p| p.used).sum()
    }
}

/// Every NVML device now, with the first device that could not be read (if any): a partial
/// answer is still an answer.
pub fn devices() -> Result<(Vec<NvmlDevice>, Option<DeviceError>), DeviceError> {
    let nvml = nvml()?;
    let count = nvml.device_count().map_err(|e| unavailable(format!("NVML device_count failed ({e})")))?;
    let mut out = Vec::new();
    let mut error = None;
    for index in 0..count {
        let read =
            nvml.device_by_index(index).map_err(|e| unavailable(format!("NVML device {index} unreadable ({e})")));
        let dev = match read {
            Ok(d) => d,
            Err(e) => {
                error.get_or_insert(e);
                continue;
            }
        };
        let Ok(mem) = dev.memory_info() else { continue };
        out.push(NvmlDevice {
            index,
            uuid: dev.uuid().unwrap_or_default(),
            name: dev.name().unwrap_or_default(),
            total: mem.total,
            free: mem.free,
            used: mem.used,
            processes: processes_of(&dev, mem.total).unwrap_or_default(),
        });
    }
    Ok((out, error))
}

/// Every NVML device, or why there are none.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NvmlSnapshot {
    /// Devices read.
    pub devices: Vec<NvmlDevice>,
    /// Why NVML could not be read (no driver, …).
    pub error: Option<String>,
}

impl NvmlSnapshot {
    /// The device process `pid` uses: the one listing it; else the one whose UUID is the
    /// first entry of `CUDA_VISIBLE_DEVICES`; else the only device.
    pub fn device_of(&self, pid: Option<u32>, uuid_hint: Option<&str>) -> Option<&NvmlDevice> {
        if let Some(u) = uuid_hint
            && let Some(d) = self.devices.iter().find(|d| d.uuid.eq_ignore_ascii_case(u))
        {
            return Some(d);
        }
        if let Some(pid) = pid
            && let Some(d) = self.devices.iter().find(|d| d.lists(pid))
        {
            return Some(d);
        }
        if let Ok(v) = std::env::var("CUDA_VISIBLE_DEVICES")
            && let Some(first) = v.split(',').next().map(str::trim)
            && (first.starts_with("GPU-") || first.starts_with("MIG-"))
            && let Some(d) = self.devices.iter().find(|d| d.uuid.starts_with(first))
        {
            return Some(d);
        }
        if self.devices.len() == 1 { self.devices.first() } else { None }
    }
}

/// Every device now, as a per-cell hook reads it (never an `Err`: the reason is in the value).
pub fn snapshot() -> NvmlSnapshot {
    match devices() {
        Ok((devices, error)) => NvmlSnapshot { devices, error: error.map(|e| e.to_string()) },
        Err(e) => NvmlSnapshot { devices: Vec::new(), error: Some(e.to_string()) },
    }
}

/// What NVML says about this process on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThisProcess {
    /// Listed, with this many bytes.
    Used(u64),
    /// Listed, but NVML reports no number (WDDM, MIG, driver sentinel).
    Unavailable,
    /// Not listed: no CUDA context on the device yet, or PIDs are namespaced (container).
    NotListed,
}

/// This process's entry on the device with this UUID.
pub fn this_process(uuid: [u8; 16]) -> Result<ThisProcess, DeviceError> {
    let me = std::process::id();
    Ok(match processes(uuid)?.into_iter().find(|p| p.pid == me) {
        Some(NvmlProcess { used: Some(b), .. }) => ThisProcess::Used(b),
        Some(_) => ThisProcess::Unavailable,
        None => ThisProcess::NotListed,
    })
}

/// Processes on the device as the OOM message wants them (those with a known size only).
pub fn process_memory(uuid: [u8; 16]) -> Result<Vec<ProcessMemory>, DeviceError> {
    let me = std::process::id();
    Ok(processes(uuid)?
        .into_iter()
        .filter_map(|p| p.used.map(|used| ProcessMemory { pid: p.pid, used, is_self: p.pid == me }))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_strings_have_nvml_form() {
        let u = [0x5c, 0x8e, 0x3c, 0x5f, 0x01, 0x02, 0xab, 0xcd, 0xef, 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x6f];
        assert_eq!(uuid_string("GPU", u), "GPU-5c8e3c5f-0102-abcd-ef00-10203040506f");
        assert_eq!(uuid_string("MIG", [0; 16]), "MIG-00000000-0000-0000-0000-000000000000");
    }

    #[test]
    fn without_nvml_everything_is_an_error_value() {
        // On a machine without the NVIDIA driver every call is a one-line reason, never a panic;
        // with NVML, an unknown UUID is a reason too.
        let bogus = [0xee; 16];
        for r in [device_memory(bogus).map(|_| ()), processes(bogus).map(|_| ()), this_process(bogus).map(|_| ())] {
            let e = r.unwrap_err().to_string();
            assert!(!e.contains('\n') && !e.is_empty(), "{e}");
            if !available() {
                assert!(e.starts_with("NVML is unavailable"), "{e}");
            }
        }
        assert!(process_memory(bogus).is_err());
        // Cached: asking again gives the same answer.
        assert_eq!(nvml().map(|_| ()), nvml().map(|_| ()));
    }

    fn dev(uuid: &str, procs: &[(u32, Option<u64>)]) -> NvmlDevice {
        NvmlDevice {
            index: 0,
            uuid: uuid.into(),
            name: "GPU".into(),
            total: 100,
            free: 50,
            used: 50,
            processes: procs.iter().map(|&(pid, used)| NvmlProcess { pid, used }).collect(),
        }
    }

    #[test]
    fn the_childs_device_is_found_by_pid_then_uuid() {
        let snap = NvmlSnapshot {
            devices: vec![dev("GPU-a", &[(1, Some(10))]), dev("GPU-b", &[(2, Some(20)), (3, None), (4, Some(5))])],
            error: None,
        };
        assert_eq!(snap.device_of(Some(2), None).unwrap().uuid, "GPU-b");
        assert_eq!(snap.device_of(Some(9), Some("gpu-A")).unwrap().uuid, "GPU-a");
        assert!(snap.device_of(Some(9), None).is_none() || std::env::var("CUDA_VISIBLE_DEVICES").is_ok());
        let b = &snap.devices[1];
        assert_eq!(b.process_used(2), Some(20));
        assert_eq!(b.process_used(3), None);
        assert!(b.lists(3));
        assert_eq!(b.others_used(2), 5);
    }

    #[test]
    fn reading_never_panics() {
        let s = snapshot();
        assert!(s.error.is_some() || !s.devices.is_empty() || s.devices.is_empty());
    }
}
