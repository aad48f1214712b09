//! What the kernel keeps about a notebook session, apart from running cells: the control
//! channel to the gpumem-nb crate in the notebook process, kernel-side NVML, the per-cell records
//! with the history they form and how much of it a long session keeps, and the OpenMetrics
//! endpoint that serves them.
//!
//! ## Layers
//! 1. `control`, `nvml`, `retention` — the kernel end of the control channel (a private Unix
//!    socket, the crate's protocol); whole-device and per-process memory, read without a CUDA
//!    context; how much of a long session is kept (`GPUMEM_NB_HISTORY_CELLS`), the rest
//!    summarised.
//! 2. `report`, `metrics` — per-cell records, the report line, history, chart, export; the
//!    OpenMetrics endpoint for Prometheus (`%gpumem metrics on`).

pub mod control;
pub mod nvml;
pub mod retention;

pub mod metrics;
pub mod report;
