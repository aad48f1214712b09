//! How an allocation fails. Out-of-memory is structured: [`OomReport`] carries the numbers and
//! prints PyTorch's sentence with them.
#![forbid(unsafe_code)]

use super::explain::ReservedParts;
use crate::device::{BackendKind, DeviceError, ProcessMemory};
use crate::units::format_size;
use std::fmt;

/// The numbers of an out-of-memory failure (PyTorch's OOM message, as data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomReport {
    /// Device index.
    pub device: i32,
    /// Which backend (a simulated device says so in the message).
    pub backend: BackendKind,
    /// The caller's request in bytes.
    pub requested: u64,
    /// The segment size that could not be obtained ("Tried to allocate").
    pub alloc_size: u64,
    /// Device total memory (cuMemGetInfo).
    pub total: u64,
    /// Device free memory (cuMemGetInfo).
    pub free: u64,
    /// The per-process limit, when a memory fraction is set.
    pub allowed: Option<u64>,
    /// Bytes allocated by this allocator.
    pub allocated: u64,
    /// Bytes reserved by this allocator.
    pub reserved: u64,
    /// Per-process device memory from NVML (empty without NVML).
    pub processes: Vec<ProcessMemory>,
    /// Where the reserved bytes were when it failed (after the out-of-memory path released
    /// what it could), when the state was asked to explain its failures (the default).
    pub parts: Option<ReservedParts>,
}

impl OomReport {
    /// The reserved bytes at the failure in one line: what the program held, rounding, frees
    /// waiting for streams, the free cache and its largest blocks, and what `empty_cache()`
    /// would still return. `None` without [`OomReport::parts`].
    pub fn explain(&self) -> Option<String> {
        let p = self.parts.as_ref()?;
        Some(format!(
            "reserved {} = requested {} + rounding {} + pending frees {} + cached free {} (small pool {}, largest \
             block {}; large pool {}, largest block {}); empty_cache() would return {}; a {} request {} from the cache",
            format_size(p.reserved),
            format_size(p.requested),
            format_size(p.rounding),
            format_size(p.pending_free),
            format_size(p.cached_bytes()),
            format_size(p.cached_in("small")),
            format_size(p.largest_free_small),
            format_size(p.cached_in("large")),
            format_size(p.largest_free_large),
            format_size(p.releasable),
            format_size(self.requested),
            if p.serves(self.requested) { "could be served" } else { "cannot be served" },
        ))
    }
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sim = match self.backend {
            BackendKind::Cuda => "",
            BackendKind::Simulated => " (simulated)",
            BackendKind::Replay => " (replay)",
        };
        write!(
            f,
            "CUDA out of memory. Tried to allocate {}. GPU {}{sim} has a total capacity of {} of which {} is free. ",
            format_size(self.alloc_size),
            self.device,
            format_size(self.total),
            format_size(self.free)
        )?;
        for p in &self.processes {
            if p.is_self {
                write!(f, "Including non-gpumem-nb memory, this process has {} memory in use. ", format_size(p.used))?;
            } else {
                write!(f, "Process {} has {} memory in use. ", p.pid, format_size(p.used))?;
            }
        }
        if let Some(a) = self.allowed {
            write!(f, "{} allowed; ", format_size(a))?;
        }
        write!(
            f,
            "Of the allocated memory {} is allocated by gpumem-nb, and {} is reserved by gpumem-nb but unallocated. \
             If reserved but unallocated memory is large try setting GPUMEM_NB_ALLOC_CONF=expandable_segments:True \
             to avoid fragmentation (same syntax as PYTORCH_CUDA_ALLOC_CONF).",
            format_size(self.allocated),
            format_size(self.reserved.saturating_sub(self.allocated))
        )
    }
}

/// Why an allocation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// The device (or the memory fraction) has no room, even after freeing cached blocks.
    #[error("{0}")]
    OutOfMemory(Box<OomReport>),
    /// A request of 2^60 bytes or more.
    #[error("CUDA out of memory. Tried to allocate more than 1EB memory ({0} bytes requested).")]
    TooLarge(u64),
    /// A driver failure other than out-of-memory.
    #[error(transparent)]
    Device(#[from] DeviceError),
}
