//! gpumem-kernel as a library: the pieces of the Jupyter kernel, for the binary and the tests.
//!
//! - [`engine`]: evcxr's `CommandContext`, per-cell hooks, magics, reports (shared by the
//!   Jupyter kernel and headless runs).
//! - [`kernel`]: the Jupyter wire protocol (jupyter-zmq-client + jupyter-protocol).
//! - [`hooks`]: the per-cell hooks (NVML and the crate's readings around a cell).
//! - [`live`]: the live line while a long cell runs.
//! - [`control`]: the kernel end of the control channel to the gpumem-nb crate in the child.
//! - [`magic`]: the `%gpumem` / `%%gpumem` parser; [`complete`]: `is_complete`.
//! - [`report`]: per-cell records, the report line, history, chart, export.
//! - [`nvml`]: kernel-side NVML; [`install`]: the kernelspec; [`run`]: headless notebooks.
//! - [`metrics`]: the OpenMetrics endpoint for Prometheus (`%gpumem metrics on`).
//! - [`retention`]: how much of a long session is kept (`GPUMEM_NB_HISTORY_CELLS`), the rest
//!   summarised.
//! - [`usage`]: the answer to Jupyter's `usage_request` (CPU, memory, GPU memory).
//! - [`stderr_sync`]: a barrier on the evcxr child's stderr (a cell's panic before its report).
//! - [`build_dir`]: where evcxr compiles the cells (kept between kernel starts, outside any
//!   cargo workspace); [`compile`]: how far a cell's build has come; [`dep`]: `:dep gpumem-nb`
//!   is the crate the kernel was built with; [`toolchain`]: what the kernel needs from the Rust
//!   toolchain (std, `rust-src`); [`cell_lines`]: line tables in the cells' own code.

#![forbid(unsafe_code)]

pub mod build_dir;
pub mod cell_lines;
pub mod compile;
pub mod complete;
pub mod control;
pub mod dep;
pub mod engine;
pub mod hooks;
pub mod install;
pub mod kernel;
pub mod live;
pub mod magic;
pub mod metrics;
pub mod nvml;
pub mod report;
pub mod retention;
pub mod run;
pub mod stderr_sync;
pub mod toolchain;
pub mod usage;
