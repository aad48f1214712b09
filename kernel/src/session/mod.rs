//! What the kernel keeps about a notebook session, apart from running cells: the control
//! channel to the gpumem-nb crate in the notebook process, the per-cell records with the
//! history they form and how much of it a long session keeps, and the OpenMetrics endpoint that
//! serves them. The records themselves, their line and NVML's readings are the library's
//! (`gpumem_nb::kernel::report`, `gpumem_nb::device::nvml`): the stock evcxr kernel's in-child
//! reports build the same.
//!
//! ## Layers
//! 1. `control`, `retention` — the kernel end of the control channel (a private Unix socket,
//!    the crate's protocol); how much of a long session is kept (`GPUMEM_NB_HISTORY_CELLS`), the
//!    rest summarised.
//! 2. `history`, `metrics`, `ranks` — the session's history: warnings that need earlier cells,
//!    the table, the peaks chart, export; the OpenMetrics endpoint for Prometheus (`%gpumem
//!    metrics on`); the worker processes cells started, by rank (`%gpumem ranks`).
//!
//! And when the kernel's process started ([`mark_start`], [`start`]): a cell sent before the
//! kernel was ready is timed from there, as its user waited.

pub mod control;
pub mod retention;

pub mod history;
pub mod metrics;
pub mod ranks;

static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Notes when the kernel's process started (the first call counts): the kernel's own start
/// (`/proc/self/stat`), the loading of its binary included; now where that cannot be read.
pub fn mark_start() {
    let now = std::time::Instant::now();
    let _ = START.set(process_age().and_then(|age| now.checked_sub(age)).unwrap_or(now));
}

/// How long ago this process started: the system's uptime less the process's start time, both
/// in the kernel's clock (`/proc/uptime`, field 22 of `/proc/self/stat`).
fn process_age() -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command's name (which may hold spaces) from the third on.
    let start_ticks: f64 = stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime").ok()?.split_whitespace().next()?.parse().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()?? as f64;
    Some(std::time::Duration::from_secs_f64((uptime - start_ticks / hz).max(0.0)))
}

/// When the kernel's process started, when it was noted.
pub fn start() -> Option<std::time::Instant> {
    START.get().copied()
}
