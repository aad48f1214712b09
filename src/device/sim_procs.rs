//! The simulated device's process table: what NVML's per-process list is on a GPU.
//!
//! Every process whose simulated device is the notebook's (the registry's, see
//! `notebook::registry`) publishes the bytes it holds on it in a small file,
//! `<dir>/<pid>-<device>`, rewritten whenever that changes; [`processes`] lists them (with each
//! process's name from `/proc`, [`crate::procfs`]), dropping the files of processes that are gone. So a notebook
//! that starts a worker process on the simulated device sees that worker as it would see a CUDA
//! child through NVML. The directory is `GPUMEM_NB_SIM_PROCS`, else `gpumem-nb-sim-procs` in
//! the system's temporary directory; processes share it by inheriting the environment.

use std::path::PathBuf;

/// The environment variable naming the table's directory.
pub(crate) const PROCS_VAR: &str = "GPUMEM_NB_SIM_PROCS";

/// One process on the simulated device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SimProcess {
    /// Its pid.
    pub pid: u32,
    /// Its name (`/proc/<pid>/comm`), empty where unknown.
    pub name: String,
    /// Bytes it holds on the simulated device (segments, driver allocations, mapped pages).
    pub used: u64,
}

/// The table's directory.
pub(crate) fn dir() -> PathBuf {
    std::env::var_os(PROCS_VAR).map_or_else(|| std::env::temp_dir().join("gpumem-nb-sim-procs"), PathBuf::from)
}

/// This process's row of the table for one simulated device: its file, kept open, rewritten in
/// place by one positioned write of a fixed-width number whenever the bytes change (a write per
/// allocation costs about a microsecond; a new file and a rename each time cost over 100).
#[derive(Clone, Debug)]
pub(crate) struct Row {
    file: std::sync::Arc<std::fs::File>,
}

impl Row {
    /// Creates (or takes over) this process's file for `device`; `None` when the table cannot be
    /// written (the device then works, unlisted).
    pub(crate) fn open(device: i32) -> Option<Row> {
        let dir = dir();
        std::fs::create_dir_all(&dir).ok()?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{}-{device}", std::process::id())))
            .ok()?;
        Some(Row { file: std::sync::Arc::new(file) })
    }

    /// Publishes `used` bytes (best effort). The text always has the same width, so a reader
    /// never sees a longer old number's tail.
    pub(crate) fn publish(&self, used: u64) {
        let text = format!("{used:020}\n");
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileExt;
            let _ = self.file.write_all_at(text.as_bytes(), 0);
        }
        #[cfg(not(unix))]
        {
            use std::io::{Seek, SeekFrom, Write};
            let mut f = &*self.file;
            let _ = f.seek(SeekFrom::Start(0)).and_then(|_| f.write_all(text.as_bytes()));
        }
    }
}

/// Publishes this process's bytes on simulated device `device` once (best effort).
#[cfg(test)]
pub(crate) fn publish(device: i32, used: u64) {
    if let Some(row) = Row::open(device) {
        row.publish(used);
    }
}

/// Every live process on simulated device `device`, by pid; files of processes that are gone
/// are removed.
#[cfg(test)]
pub(crate) fn processes(device: i32) -> Vec<SimProcess> {
    processes_in(&dir(), device)
}

/// The live processes on simulated device `device` in the table in `dir`; files of processes
/// that are gone are removed.
pub(crate) fn processes_in(dir: &std::path::Path, device: i32) -> Vec<SimProcess> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Some(name) = entry.file_name().into_string().ok() else { continue };
        let Some((pid, dev)) = name.split_once('-') else { continue };
        let (Ok(pid), Ok(dev)) = (pid.parse::<u32>(), dev.parse::<i32>()) else { continue };
        if !crate::procfs::alive(pid) {
            let _ = std::fs::remove_file(entry.path());
            continue;
        }
        if dev != device {
            continue;
        }
        let Some(used) = std::fs::read_to_string(entry.path()).ok().and_then(|s| s.trim().parse().ok()) else {
            continue;
        };
        out.push(SimProcess { pid, name: crate::procfs::process_name(pid), used });
    }
    out.sort_by_key(|p| p.pid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table round trip, in this process (a device number no other test uses), and a dead
    /// process's file removed.
    #[test]
    fn published_usage_is_listed_and_stale_files_go() {
        let device = 9_731;
        publish(device, 12_345);
        let me = processes(device);
        let mine = me.iter().find(|p| p.pid == std::process::id()).expect("listed");
        assert_eq!(mine.used, 12_345);
        assert!(!mine.name.is_empty());
        publish(device, 0);
        assert_eq!(processes(device).iter().find(|p| p.pid == std::process::id()).unwrap().used, 0);
        // A pid that does not exist (above the kernel's pid_max).
        let stale = dir().join(format!("{}-{device}", 4_194_400));
        std::fs::write(&stale, "1").unwrap();
        assert!(processes(device).iter().all(|p| p.pid != 4_194_400));
        assert!(!stale.exists(), "removed");
        let _ = std::fs::remove_file(dir().join(format!("{}-{device}", std::process::id())));
    }
}
