//! Kernel-side NVML: whole-device memory and per-process usage, read without a CUDA context.
//!
//! The kernel never touches CUDA itself (a context would cost memory on the device it
//! measures). NVML lists every process with a context on each GPU; the evcxr child is found
//! there by its pid, and devices are named by their NVML UUID, which is how a reading from the
//! crate (CUDA numbering) is matched to an NVML device. Without NVML (no driver) every reading
//! is an error value and the report says so.

pub use gpumem_nb::device::nvml::{NvmlDevice, NvmlProcess};
use serde::Serialize;

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

/// Reads every device now (the library's NVML reading: one merge of the process lists).
pub fn read() -> NvmlSnapshot {
    match gpumem_nb::device::nvml::devices() {
        Ok((devices, error)) => NvmlSnapshot { devices, error: error.map(|e| e.to_string()) },
        Err(e) => NvmlSnapshot { devices: Vec::new(), error: Some(e.to_string()) },
    }
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
        let s = read();
        assert!(s.error.is_some() || !s.devices.is_empty() || s.devices.is_empty());
    }
}
