//! Device backends: the one seam between the caching policy and a device.
//!
//! The policy asks a [`Backend`] for segments, pages and stream events, and for the device's
//! free/total memory; nothing else. Three implementations:
//! - [`cuda::CudaBackend`] (feature `cuda`): cudarc's driver API on a real GPU;
//! - [`sim::SimBackend`]: a capacity-limited simulated device with deterministic addresses;
//! - `replay::ReplayBackend`: hands out the segment addresses a recorded trace got, so a
//!   replay makes exactly the decisions PyTorch made.
//!
//! [`any::AnyBackend`] picks one of the device backends at run time (what the per-process
//! registry, `crate::current`, hands out).
//!
//! # Contract
//! Every method may be called only with the allocator's lock held (`&mut self`). Errors are
//! [`DeviceError::OutOfMemory`] exactly when the device had no room (the policy then frees
//! cached memory and retries), anything else is [`DeviceError::Driver`] and is passed up.

pub mod any;
pub(crate) mod driver;
mod element;
pub mod nvml;
pub(crate) mod replay;
pub(crate) mod seam;
pub mod sim;
pub(crate) mod sim_procs;

#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod cuda;

pub use driver::{DriverCall, DriverEvent, DriverKind, DriverSink};
pub use element::Element;
pub(crate) use seam::{Backend, BackendKind, StreamId};
pub use seam::{DeviceError, EventId, Fault, LostContext, PoolUsage, ProcessMemory, Synchronizer};
