//! Frameworks with their own books of device memory, next to the driver's view: a notebook
//! watches one, and every cell's record and line carry its numbers (what it holds in use, what
//! it keeps cached, what it reserved, per pool kind) beside every tracked allocation and NVML.
//!
//! - `cubecl` (feature `cubecl`): cubecl 0.11's memory pools, one by one, which burn 0.22's
//!   CUDA, ROCm, wgpu and CPU backends allocate from: `frameworks::cubecl::watch(&client)`.
//! - `cubecl010` (feature `cubecl010`): cubecl 0.10's totals, for burn 0.21:
//!   `frameworks::cubecl010::watch(&client)`.
//!
//! Without a feature nothing here is compiled, and without a `watch` nothing is read.

#[cfg(feature = "cubecl")]
pub mod cubecl;
#[cfg(feature = "cubecl010")]
pub mod cubecl010;
