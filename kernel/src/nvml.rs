//! Kernel-side NVML: whole-device memory and per-process usage, read without a CUDA context.
//!
//! The kernel never touches CUDA itself (a context would cost memory on the device it
//! measures). NVML lists every process with a context on each GPU; the evcxr child is found
//! there by its pid, and devices are named by their NVML UUID, which is how a reading from the
//! crate (CUDA numbering) is matched to an NVML device. Without NVML (no driver) every reading
//! is an error value and the report says so.

use serde::Serialize;

/// One process on a device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NvmlProc {
    /// Host pid.
    pub pid: u32,
    /// Bytes used, when NVML can tell.
    pub used: Option<u64>,
}

/// One NVML device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
    pub processes: Vec<NvmlProc>,
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

/// Every NVML device, or why there are none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NvmlSnapshot {
    /// Devices read.
    pub devices: Vec<NvmlDevice>,
    /// Why NVML could not be read (no driver, …).
    pub error: Option<String>,
}

impl NvmlSnapshot {
    /// The device the child `pid` uses: the one listing it; else the one whose UUID is the
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

/// Reads every device now.
pub fn read() -> NvmlSnapshot {
    let nvml = match gpumem_nb::device::nvml::nvml() {
        Ok(n) => n,
        Err(e) => return NvmlSnapshot { devices: Vec::new(), error: Some(e.to_string()) },
    };
    let count = match nvml.device_count() {
        Ok(c) => c,
        Err(e) => return NvmlSnapshot { devices: Vec::new(), error: Some(format!("NVML device_count failed ({e})")) },
    };
    let mut devices = Vec::new();
    let mut error = None;
    for index in 0..count {
        let dev = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                error = Some(format!("NVML device {index} unreadable ({e})"));
                continue;
            }
        };
        let Ok(mem) = dev.memory_info() else { continue };
        let mut processes: Vec<NvmlProc> = Vec::new();
        let compute = dev.running_compute_processes().unwrap_or_default();
        let graphics = dev.running_graphics_processes().unwrap_or_default();
        for p in compute.into_iter().chain(graphics) {
            let used = match p.used_gpu_memory {
                nvml_wrapper::enums::device::UsedGpuMemory::Used(b) if b != u64::MAX && b <= mem.total => Some(b),
                _ => None,
            };
            match processes.iter_mut().find(|q| q.pid == p.pid) {
                Some(q) => q.used = q.used.max(used),
                None => processes.push(NvmlProc { pid: p.pid, used }),
            }
        }
        devices.push(NvmlDevice {
            index,
            uuid: dev.uuid().unwrap_or_default(),
            name: dev.name().unwrap_or_default(),
            total: mem.total,
            free: mem.free,
            used: mem.used,
            processes,
        });
    }
    NvmlSnapshot { devices, error }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(uuid: &str, procs: &[(u32, Option<u64>)]) -> NvmlDevice {
        NvmlDevice {
            index: 0,
            uuid: uuid.into(),
            name: "GPU".into(),
            total: 100,
            free: 50,
            used: 50,
            processes: procs.iter().map(|&(pid, used)| NvmlProc { pid, used }).collect(),
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
        let s = read();
        assert!(s.error.is_some() || !s.devices.is_empty() || s.devices.is_empty());
    }
}
