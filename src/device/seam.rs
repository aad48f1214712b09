//! The seam's vocabulary: the [`Backend`] trait the policy calls, and the types its methods
//! speak (streams, events, what backs a device, its errors, its pool and processes). The root
//! re-exports [`Backend`], [`BackendKind`] and [`StreamId`]; the rest is `device::`'s.

use super::driver::DriverSink;
use std::fmt;

/// A stream as the allocator sees it: the raw `CUstream` handle value (0 = the default stream).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The default (legacy NULL) stream.
    pub const DEFAULT: StreamId = StreamId(0);
}

/// A recorded stream event (a backend-chosen handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventId(pub u64);

/// What kind of device a number came from (every report names it). In data: `"cuda"`,
/// `"simulated"`, `"replay"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// A real GPU through the CUDA driver.
    Cuda,
    /// The simulated device (also what an unknown source is taken for: not a measured GPU).
    #[default]
    Simulated,
    /// Replaying a recorded trace.
    Replay,
}

impl BackendKind {
    /// "cuda", "simulated", "replay".
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Simulated => "simulated",
            BackendKind::Replay => "replay",
        }
    }
}

/// A device's wait for its queued work, detached from the backend ([`Backend::synchronizer`]).
pub type Synchronizer = Box<dyn FnOnce() -> Result<(), DeviceError> + Send>;

/// Device-level failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceError {
    /// The device has no room for the request.
    OutOfMemory,
    /// Any other driver failure, with the driver's name for it.
    Driver(String),
    /// The device or a library it needs (the CUDA driver, NVML, CUPTI) cannot be used here,
    /// with the reason in one line.
    Unavailable(String),
    /// The process's CUDA context is lost: a kernel faulted (an illegal address, a device-side
    /// assert, …), and every later call on the device fails the same way until the process
    /// ends. The allocator stops touching the device from then on.
    ContextLost(LostContext),
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::OutOfMemory => f.write_str("device out of memory"),
            DeviceError::Driver(s) => write!(f, "CUDA driver error: {s}"),
            DeviceError::Unavailable(s) => f.write_str(s),
            DeviceError::ContextLost(l) => write!(f, "{l}"),
        }
    }
}

/// The faults that poison a CUDA context ("sticky" errors: every later call of the process on
/// the device fails with the same code).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// `CUDA_ERROR_ILLEGAL_ADDRESS`: a kernel read or wrote outside memory it may touch.
    IllegalAddress,
    /// `CUDA_ERROR_MISALIGNED_ADDRESS`.
    MisalignedAddress,
    /// `CUDA_ERROR_ILLEGAL_INSTRUCTION`.
    IllegalInstruction,
    /// `CUDA_ERROR_ASSERT`: a device-side `assert` failed.
    DeviceAssert,
    /// `CUDA_ERROR_LAUNCH_FAILED`: an exception while a kernel ran.
    LaunchFailed,
    /// `CUDA_ERROR_LAUNCH_TIMEOUT`: a kernel ran past the watchdog.
    LaunchTimeout,
    /// `CUDA_ERROR_HARDWARE_STACK_ERROR`.
    HardwareStackError,
    /// `CUDA_ERROR_INVALID_PC`.
    InvalidPc,
    /// `CUDA_ERROR_INVALID_ADDRESS_SPACE`.
    InvalidAddressSpace,
}

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 9] = [
        Fault::IllegalAddress,
        Fault::MisalignedAddress,
        Fault::IllegalInstruction,
        Fault::DeviceAssert,
        Fault::LaunchFailed,
        Fault::LaunchTimeout,
        Fault::HardwareStackError,
        Fault::InvalidPc,
        Fault::InvalidAddressSpace,
    ];

    /// The driver's name for it (`CUDA_ERROR_ILLEGAL_ADDRESS`).
    pub fn code(self) -> &'static str {
        match self {
            Fault::IllegalAddress => "CUDA_ERROR_ILLEGAL_ADDRESS",
            Fault::MisalignedAddress => "CUDA_ERROR_MISALIGNED_ADDRESS",
            Fault::IllegalInstruction => "CUDA_ERROR_ILLEGAL_INSTRUCTION",
            Fault::DeviceAssert => "CUDA_ERROR_ASSERT",
            Fault::LaunchFailed => "CUDA_ERROR_LAUNCH_FAILED",
            Fault::LaunchTimeout => "CUDA_ERROR_LAUNCH_TIMEOUT",
            Fault::HardwareStackError => "CUDA_ERROR_HARDWARE_STACK_ERROR",
            Fault::InvalidPc => "CUDA_ERROR_INVALID_PC",
            Fault::InvalidAddressSpace => "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        }
    }

    /// In words (`illegal address`).
    pub fn what(self) -> &'static str {
        match self {
            Fault::IllegalAddress => "illegal address",
            Fault::MisalignedAddress => "misaligned address",
            Fault::IllegalInstruction => "illegal instruction",
            Fault::DeviceAssert => "device-side assert",
            Fault::LaunchFailed => "launch failure",
            Fault::LaunchTimeout => "launch timeout",
            Fault::HardwareStackError => "hardware stack error",
            Fault::InvalidPc => "invalid program counter",
            Fault::InvalidAddressSpace => "invalid address space",
        }
    }

    /// The fault a driver code names, when it is one of those that poison a context.
    pub fn from_code(code: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.code() == code)
    }
}

/// A lost CUDA context: the fault and the call that first reported it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LostContext {
    /// What went wrong.
    pub fault: Fault,
    /// The driver call that first failed with it (`cuMemcpyDtoHAsync_v2`).
    pub call: String,
}

impl fmt::Display for LostContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CUDA context lost: {} ({} in {}); every later call on the device fails: restart the process",
            self.fault.what(),
            self.fault.code(),
            self.call
        )
    }
}

impl std::error::Error for DeviceError {}

/// Memory of another process (or this one) on the device, as NVML reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessMemory {
    /// Process id.
    pub pid: u32,
    /// Bytes in use on the device.
    pub used: u64,
    /// Whether this is our own process.
    pub is_self: bool,
}

/// The CUDA stream-ordered memory pool that `cuMemAllocAsync` (and so cudarc's own `CudaSlice`,
/// and candle) allocate from: bytes in use and reserved by the driver's pool, with their
/// high-water marks since the last [`Backend::reset_pool_high_water`]. Exact (driver counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolUsage {
    /// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`.
    pub used: u64,
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
    pub reserved: u64,
    /// `CU_MEMPOOL_ATTR_USED_MEM_HIGH`.
    pub used_high: u64,
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`.
    pub reserved_high: u64,
}

/// The device operations the caching policy needs.
pub trait Backend {
    /// What this backend is.
    fn kind(&self) -> BackendKind;
    /// The device index (CUDA ordinal).
    fn device_index(&self) -> i32;
    /// Total device memory in bytes (`totalGlobalMem`).
    fn total_memory(&self) -> u64;
    /// `(free, total)` bytes, as `cuMemGetInfo` reports them.
    fn mem_get_info(&mut self) -> Result<(u64, u64), DeviceError>;
    /// Reserves a segment of `size` bytes (a multiple of 2 MiB, > 0) for `stream`; returns its
    /// address. `Err(OutOfMemory)` when the device has no room.
    fn reserve(&mut self, size: u64, stream: StreamId) -> Result<u64, DeviceError>;
    /// Returns a segment obtained from [`Backend::reserve`] (exact address and size).
    fn release(&mut self, addr: u64, size: u64) -> Result<(), DeviceError>;
    /// Reserves `size` bytes of address space with nothing mapped (expandable segments).
    fn reserve_address_range(&mut self, size: u64) -> Result<u64, DeviceError>;
    /// Releases an address range from [`Backend::reserve_address_range`] (all pages unmapped).
    fn release_address_range(&mut self, addr: u64, size: u64) -> Result<(), DeviceError>;
    /// Maps `pages` pages of `page_size` bytes at `addr` inside a reserved range, all or none.
    /// `Err(OutOfMemory)` when the device has no room.
    fn map_pages(&mut self, addr: u64, page_size: u64, pages: u64) -> Result<(), DeviceError>;
    /// Unmaps pages mapped by [`Backend::map_pages`], after synchronising `stream`.
    fn unmap_pages(&mut self, addr: u64, page_size: u64, pages: u64, stream: StreamId) -> Result<(), DeviceError>;
    /// Records an event on `stream` (for a block used on that stream).
    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError>;
    /// Whether the event has completed; a completed event is released by the backend.
    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError>;
    /// Waits for the event and releases it.
    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError>;
    /// Per-process device memory (NVML), for the out-of-memory message. Empty when unknown.
    fn process_memory(&mut self) -> Vec<ProcessMemory> {
        Vec::new()
    }
    /// The device's current stream-ordered pool (what cudarc's `CudaSlice` uses), when the
    /// device has one. `None` on the simulated device.
    fn pool_usage(&mut self) -> Option<PoolUsage> {
        None
    }
    /// Restarts the pool's high-water marks at the current values (a cell's own peak).
    fn reset_pool_high_water(&mut self) {}
    /// Where the backend reports its own driver allocations (the simulated device: all of
    /// them; a GPU: which of CUPTI's events were its own, as [`DriverCall::Claim`](crate::device::DriverCall::Claim)s). Backends
    /// that report nothing ignore it.
    fn set_driver_sink(&mut self, _sink: DriverSink) {}
    /// Waits until everything queued on the device so far has run (`cuCtxSynchronize`): where
    /// a fault of a kernel launched earlier is reported. Backends with nothing queued answer
    /// `Ok`.
    fn synchronize(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }
    /// The same wait, as a call that needs no `&mut self` (so that it can run outside the
    /// allocator's lock, on a thread of its own); `None` where [`Backend::synchronize`] does.
    fn synchronizer(&mut self) -> Option<Synchronizer> {
        None
    }
    /// A point where the device reports what the work queued before it did, for a backend that
    /// does no work of its own (the simulated device's copies): an injected fault fires here.
    /// `call` names the driver call it stands for.
    fn fault_point(&mut self, _call: &'static str) -> Result<(), DeviceError> {
        Ok(())
    }
    /// Creates a stream on the device and returns its handle (kept alive by the backend).
    /// Backends without streams answer `Err(Driver("streams not supported"))`.
    fn new_stream(&mut self) -> Result<StreamId, DeviceError> {
        Err(DeviceError::Driver("streams not supported".into()))
    }
}
