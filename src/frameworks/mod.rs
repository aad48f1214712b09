//! Frameworks with their own books of device memory, next to the driver's view: a notebook
//! watches one, and every cell's record and line carry its numbers (what it holds in use, what
//! it keeps cached, what it reserved, per pool kind) beside every tracked allocation and NVML.
//!
//! - `cubecl` (feature `cubecl`): cubecl 0.11's memory pools, one by one, which burn 0.22's
//!   CUDA, ROCm, wgpu and CPU backends allocate from: `frameworks::cubecl::watch(&client)`.
//! - `cubecl010` (feature `cubecl010`): cubecl 0.10's totals, for burn 0.21:
//!   `frameworks::cubecl010::watch(&client)`.
//!
//! - [`SimQueue`]: a framework with a device thread and a batched queue on the simulated
//!   device, for tests and demonstrations of what a cell queues (no feature).
//!
//! Without a `watch` nothing is read.

mod sim_queue;
pub use sim_queue::SimQueue;
#[cfg(feature = "cubecl")]
pub mod cubecl;
#[cfg(feature = "cubecl010")]
pub mod cubecl010;
