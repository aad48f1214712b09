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
//! 2. `history`, `metrics` — the session's history: warnings that need earlier cells, the table,
//!    the peaks chart, export; the OpenMetrics endpoint for Prometheus (`%gpumem metrics on`).
//!
//! And when the kernel's process started ([`mark_start`], [`start`]): a cell sent before the
//! kernel was ready is timed from there, as its user waited.

pub mod control;
pub mod retention;

pub mod history;
pub mod metrics;

static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Notes that the kernel's process starts now (the first call counts).
pub fn mark_start() {
    let _ = START.set(std::time::Instant::now());
}

/// When the kernel's process started, when it was noted.
pub fn start() -> Option<std::time::Instant> {
    START.get().copied()
}
