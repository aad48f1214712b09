//! Kernel-side NVML: whole-device memory and per-process usage, read without a CUDA context.
//!
//! The kernel never touches CUDA itself (a context would cost memory on the device it
//! measures). NVML lists every process with a context on each GPU; the evcxr child is found
//! there by its pid, and devices are named by their NVML UUID, which is how a reading from the
//! crate (CUDA numbering) is matched to an NVML device. Without NVML (no driver) every reading
//! is an error value and the report says so. The reading is the library's (the stock evcxr
//! kernel's in-child reports read the same).

pub use gpumem_nb::device::nvml::{NvmlDevice, NvmlProcess, NvmlSnapshot, snapshot as read};
