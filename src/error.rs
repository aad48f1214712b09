//! Errors at the crate boundary: [`Error`] gathers what the layers below fail with (an
//! allocation, a device, a setting) into one type; [`Result`] uses it.
#![forbid(unsafe_code)]

use crate::device::DeviceError;
use crate::policy::config::ConfigError;
pub use crate::policy::oom::{AllocError, OomReport};

/// Every error of the crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An allocation failed.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// A device operation failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The allocator configuration string is malformed.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No usable GPU (no driver library, no device, a stub driver), with the reason.
    #[error("no usable CUDA device: {0}")]
    NoCuda(String),
    /// `GPUMEM_NB_DEVICE` or another setting is malformed.
    #[error("{0}")]
    Setting(String),
    /// A bad argument (size, index, fraction) with what was wrong.
    #[error("{0}")]
    InvalidArgument(String),
    /// The operation needs another backend (e.g. a cudarc view of a simulated buffer).
    #[error("{0}")]
    Unsupported(String),
    /// A fit could not be planned (nothing recorded, a recording that cannot be replayed).
    #[error("{0}")]
    Plan(String),
    /// The metrics endpoint could not start (the address is taken, no thread for it).
    #[error("metrics endpoint: {0}")]
    Endpoint(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
