//! The notebook side: what makes the crate work as one per-process state inside evcxr, and the
//! helpers a notebook user calls.
//!
//! - [`anchor`]: the process-wide anchor. Under evcxr every cell links its own copy of this
//!   crate (statics included); all copies reach one [`anchor::Shared`] through it.
//! - [`children`]: the notebook's worker processes on the device (NVML, or the simulated
//!   process table), shown beside its own numbers.
//! - [`registry`]: `GPUMEM_NB_DEVICE`, and one allocator per device per process.
//! - [`protocol`]: the control channel's typed messages, shared with gpumem-kernel.
//! - [`control`]: the child end of that channel (serves the kernel's per-cell readings).
//! - [`scope`]: `measure` / `save_memory_snapshot` scopes.
//! - [`mem`]: the ipyexperiments helpers (free/used/total, allocate, leave free, preload).
//! - [`tracking`]: every device allocation of the process (CUPTI, or the simulated driver).
//! - [`frameworks`]: frameworks with their own books of device memory (cubecl's pools), read
//!   with every cell's numbers.
//! - [`metrics`]: the per-cell numbers in the OpenMetrics text format, for Prometheus, and
//!   (feature `metrics`) the endpoint serving them.
//! - [`oom`]: out-of-memory failures caught as they happen (a snapshot then, and why).
//! - [`report`]: the per-cell record and its one-line report, shared by both kernels.
//! - [`stock`]: the same reports in the stock evcxr kernel, from hooks in the child
//!   ([`set_reports`]).

#[allow(unsafe_code)]
pub(crate) mod anchor;
pub mod children;
pub mod control;
pub mod frameworks;
pub mod mem;
pub mod metrics;
pub mod oom;
pub mod protocol;
pub mod registry;
pub mod report;
pub mod scope;
pub mod stock;
pub mod tracking;

/// Which cell and line a line of evcxr's generated `lib.rs` is ([`cells::LineMap`]): what sites
/// and snapshots name, and what a kernel maps panic frames with.
pub use crate::record::cells;
pub use stock::set_reports;
