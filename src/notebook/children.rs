//! The notebook's own worker processes on the device: every process below the notebook's
//! process in the process tree that holds device memory, by pid, with its name. On a GPU the
//! numbers are NVML's per-process list; on the simulated device, the simulated process table
//! (`device::sim_procs`); the tree is `/proc`'s ([`crate::procfs`]). They are not the notebook process's own exact numbers, and not
//! counted in them: a record shows them beside.

use crate::device::nvml::NvmlSnapshot;
use crate::device::sim_procs;
use serde::{Deserialize, Serialize};

/// One process of the notebook's process tree holding device memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildProcess {
    /// Its pid.
    pub pid: u32,
    /// Its name (`/proc/<pid>/comm`).
    pub name: String,
    /// The device: NVML's UUID (`GPU-…`), or `sim-0` for the simulated device.
    pub device: String,
    /// Bytes it holds there.
    pub used: u64,
    /// `nvml` or `simulated`.
    pub source: String,
}

/// The processes below `root` (the notebook's process) holding memory on any device NVML lists
/// in `nvml`, or on the simulated device.
pub fn of_tree(root: u32, nvml: &NvmlSnapshot) -> Vec<ChildProcess> {
    of_tree_in(root, nvml, &sim_procs::dir())
}

/// [`of_tree`] with the simulated process table in `sim_dir`.
pub fn of_tree_in(root: u32, nvml: &NvmlSnapshot, sim_dir: &std::path::Path) -> Vec<ChildProcess> {
    let below = crate::procfs::descendants(root);
    if below.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for d in &nvml.devices {
        for p in d.processes.iter().filter(|p| below.contains(&p.pid)) {
            out.push(ChildProcess {
                pid: p.pid,
                name: crate::procfs::process_name(p.pid),
                device: d.uuid.clone(),
                used: p.used.unwrap_or(0),
                source: "nvml".into(),
            });
        }
    }
    for p in sim_procs::processes_in(sim_dir, 0).into_iter().filter(|p| below.contains(&p.pid) && p.used > 0) {
        out.push(ChildProcess {
            pid: p.pid,
            name: p.name,
            device: "sim-0".into(),
            used: p.used,
            source: "simulated".into(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child process of this one on the simulated device: its row, by pid and name. The child
    /// is this test binary itself, run as a worker that opens the simulated device, allocates
    /// and waits (`worker` below).
    #[test]
    fn a_worker_on_the_simulated_device_is_listed() {
        let dir = std::env::temp_dir().join(format!("gpumem-children-{}", std::process::id()));
        let exe = std::env::current_exe().unwrap();
        let mut child = std::process::Command::new(exe)
            .args(["--exact", "notebook::children::tests::worker", "--nocapture", "--ignored"])
            .env("GPUMEM_NB_CHILD_WORKER", "1")
            .env("GPUMEM_NB_DEVICE", "sim:1GiB")
            .env(sim_procs::PROCS_VAR, &dir)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Wait for the worker's row (it allocates 96 MiB through the caching allocator).
        let t = std::time::Instant::now();
        let rows = loop {
            let rows = of_tree_in(std::process::id(), &NvmlSnapshot::default(), &dir);
            if !rows.is_empty() || t.elapsed().as_secs() > 60 {
                break rows;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        assert_eq!(rows.len(), 1, "the worker's table entry");
        let want = ChildProcess {
            pid: child.id(),
            name: crate::procfs::process_name(child.id()),
            device: "sim-0".into(),
            used: 96 << 20,
            source: "simulated".into(),
        };
        assert_eq!(rows, [want], "a 96 MiB buffer is one 96 MiB segment");
        assert!(!rows[0].name.is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The worker of the test above (only when started by it).
    #[test]
    #[ignore = "a child process of a_worker_on_the_simulated_device_is_listed"]
    fn worker() {
        if std::env::var_os("GPUMEM_NB_CHILD_WORKER").is_none() {
            return;
        }
        let alloc = crate::notebook::session::current().unwrap();
        let _b = crate::buffer::DeviceBuffer::<u8>::zeros(&alloc, 96 << 20, crate::device::StreamId::DEFAULT).unwrap();
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}
