//! [`AnyBackend`]: a device backend chosen at run time (a real GPU or the simulated device).
//!
//! The per-process registry (behind [`crate::current`]) hands out allocators over this type, so code
//! written against [`crate::Allocator`] runs unchanged with or without a GPU.
#![forbid(unsafe_code)]

#[cfg(feature = "cuda")]
use super::cuda::CudaBackend;
use super::sim::SimBackend;
use super::{Backend, BackendKind, DeviceError, EventId, ProcessMemory, StreamId};

/// A real GPU (feature `cuda`) or the simulated device.
#[derive(Debug)]
pub enum AnyBackend {
    /// The simulated device.
    Sim(SimBackend),
    /// A CUDA device through cudarc.
    #[cfg(feature = "cuda")]
    Cuda(CudaBackend),
}

impl AnyBackend {
    /// The simulated backend, if that is what this is.
    pub fn as_sim(&self) -> Option<&SimBackend> {
        match self {
            AnyBackend::Sim(s) => Some(s),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(_) => None,
        }
    }

    /// The simulated backend, mutably (to mark streams busy, inject failures, …).
    pub fn as_sim_mut(&mut self) -> Option<&mut SimBackend> {
        match self {
            AnyBackend::Sim(s) => Some(s),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(_) => None,
        }
    }

    /// The CUDA backend, if that is what this is.
    #[cfg(feature = "cuda")]
    pub fn as_cuda(&self) -> Option<&CudaBackend> {
        match self {
            AnyBackend::Cuda(c) => Some(c),
            AnyBackend::Sim(_) => None,
        }
    }

    /// The CUDA backend, mutably (to adopt streams, …).
    #[cfg(feature = "cuda")]
    pub fn as_cuda_mut(&mut self) -> Option<&mut CudaBackend> {
        match self {
            AnyBackend::Cuda(c) => Some(c),
            AnyBackend::Sim(_) => None,
        }
    }
}

impl From<SimBackend> for AnyBackend {
    fn from(b: SimBackend) -> Self {
        AnyBackend::Sim(b)
    }
}

#[cfg(feature = "cuda")]
impl From<CudaBackend> for AnyBackend {
    fn from(b: CudaBackend) -> Self {
        AnyBackend::Cuda(b)
    }
}

/// Calls `$call` on whichever backend this is.
macro_rules! dispatch {
    ($self:ident, $b:ident => $call:expr) => {
        match $self {
            AnyBackend::Sim($b) => $call,
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda($b) => $call,
        }
    };
}

impl Backend for AnyBackend {
    fn kind(&self) -> BackendKind {
        dispatch!(self, b => b.kind())
    }
    fn device_index(&self) -> i32 {
        dispatch!(self, b => b.device_index())
    }
    fn total_memory(&self) -> u64 {
        dispatch!(self, b => b.total_memory())
    }
    fn mem_get_info(&mut self) -> Result<(u64, u64), DeviceError> {
        dispatch!(self, b => b.mem_get_info())
    }
    fn reserve(&mut self, size: u64, stream: StreamId) -> Result<u64, DeviceError> {
        dispatch!(self, b => b.reserve(size, stream))
    }
    fn release(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        dispatch!(self, b => b.release(addr, size))
    }
    fn reserve_address_range(&mut self, size: u64) -> Result<u64, DeviceError> {
        dispatch!(self, b => b.reserve_address_range(size))
    }
    fn release_address_range(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        dispatch!(self, b => b.release_address_range(addr, size))
    }
    fn map_pages(&mut self, addr: u64, page_size: u64, pages: u64) -> Result<(), DeviceError> {
        dispatch!(self, b => b.map_pages(addr, page_size, pages))
    }
    fn unmap_pages(&mut self, addr: u64, page_size: u64, pages: u64, stream: StreamId) -> Result<(), DeviceError> {
        dispatch!(self, b => b.unmap_pages(addr, page_size, pages, stream))
    }
    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        dispatch!(self, b => b.record_event(stream))
    }
    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        dispatch!(self, b => b.query_event(event))
    }
    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        dispatch!(self, b => b.synchronize_event(event))
    }
    fn process_memory(&mut self) -> Vec<ProcessMemory> {
        dispatch!(self, b => b.process_memory())
    }
    fn pool_usage(&mut self) -> Option<super::PoolUsage> {
        dispatch!(self, b => b.pool_usage())
    }
    fn reset_pool_high_water(&mut self) {
        dispatch!(self, b => b.reset_pool_high_water())
    }
    fn synchronize(&mut self) -> Result<(), DeviceError> {
        dispatch!(self, b => Backend::synchronize(b))
    }
    fn synchronizer(&mut self) -> Option<super::Synchronizer> {
        dispatch!(self, b => b.synchronizer())
    }
    fn fault_point(&mut self, call: &'static str) -> Result<(), DeviceError> {
        dispatch!(self, b => b.fault_point(call))
    }
    fn set_driver_sink(&mut self, sink: super::DriverSink) {
        dispatch!(self, b => b.set_driver_sink(sink))
    }
    fn new_stream(&mut self) -> Result<StreamId, DeviceError> {
        match self {
            // The simulated device's streams are plain handles (its inherent `new_stream`).
            AnyBackend::Sim(s) => Ok(s.new_stream()),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(c) => Backend::new_stream(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    #[test]
    fn delegates_to_the_simulated_device() {
        let mut b = AnyBackend::from(SimBackend::new(0, 8 * MIB));
        assert_eq!(b.kind(), BackendKind::Simulated);
        assert_eq!(b.device_index(), 0);
        assert_eq!(b.total_memory(), 8 * MIB);
        let a = b.reserve(4 * MIB, StreamId::DEFAULT).unwrap();
        assert_eq!(b.mem_get_info().unwrap(), (4 * MIB, 8 * MIB));
        assert_eq!(b.reserve(6 * MIB, StreamId::DEFAULT), Err(DeviceError::OutOfMemory));
        b.release(a, 4 * MIB).unwrap();
        let s1 = Backend::new_stream(&mut b).unwrap();
        let s2 = Backend::new_stream(&mut b).unwrap();
        assert_ne!(s1, s2);
        assert_ne!(s1, StreamId::DEFAULT);
        b.as_sim_mut().unwrap().set_stream_busy(s1, true);
        let e = b.record_event(s1).unwrap();
        assert!(!b.query_event(e).unwrap());
        b.as_sim_mut().unwrap().synchronize();
        assert!(b.query_event(e).unwrap());
        let va = b.reserve_address_range(64 * MIB).unwrap();
        b.map_pages(va, 2 * MIB, 2).unwrap();
        b.unmap_pages(va, 2 * MIB, 2, s2).unwrap();
        b.release_address_range(va, 64 * MIB).unwrap();
        assert!(b.process_memory().is_empty());
        assert!(b.as_sim().is_some());
    }
}
