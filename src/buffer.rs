//! [`DeviceBuffer`]: an owned, typed buffer from the caching allocator, the safe way to use it.
//!
//! A buffer holds its block until it is dropped, then hands it back to the cache (never to the
//! driver: that is [`crate::CachingAllocator::empty_cache`]'s job). It is not `Clone` and its
//! block never leaves it, so a block is freed exactly once and only blocks that `malloc` handed
//! out are ever freed.
//!
//! On a real GPU the contents live on the device: [`DeviceBuffer::from_host`],
//! [`DeviceBuffer::to_host`] and [`DeviceBuffer::zeros`] copy and clear on the buffer's stream,
//! and `DeviceBuffer::cuda` / `DeviceBuffer::cuda_mut` (feature `cuda`) lend it to cudarc (copies, kernel
//! launches, cuBLAS). On the simulated device there is no device memory, so the buffer keeps its
//! contents on the host, lazily: a zeroed (or never written) buffer stores nothing and reads back
//! as zeros, and only [`DeviceBuffer::from_host`] / [`DeviceBuffer::copy_from_host`] store data.
#![forbid(unsafe_code)]

use crate::allocator::Allocator;
use crate::device::Element;
use crate::device::{BackendKind, StreamId};
use crate::error::{Error, Result};
use crate::policy::BlockId;
use std::fmt;
use std::sync::Arc;

#[cfg(feature = "cuda")]
pub(crate) use crate::device::cuda::{CudaView, CudaViewMut};

/// An owned buffer of `len` values of `T` in device memory from a caching allocator.
pub struct DeviceBuffer<T: Copy> {
    alloc: Arc<Allocator>,
    /// `None` exactly when the buffer is empty (no allocation).
    block: Option<BlockId>,
    addr: u64,
    len: usize,
    stream: StreamId,
    /// Simulated device only: the contents, `None` = all zeros.
    sim: Option<Vec<T>>,
}

impl<T: Copy> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("stream", &self.stream.0)
            .field("device", &self.alloc.device())
            .field("backend", &self.alloc.backend_kind().name())
            .finish()
    }
}

impl<T: Copy> DeviceBuffer<T> {
    /// Allocates room for `len` values on `stream`; the contents are unspecified (on the
    /// simulated device they read as zeros). `len == 0` allocates nothing.
    pub fn alloc(alloc: &Arc<Allocator>, len: usize, stream: StreamId) -> Result<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "DeviceBuffer of {len} × {} ({} bytes each) overflows",
                std::any::type_name::<T>(),
                std::mem::size_of::<T>()
            ))
        })?;
        let (block, addr) = if bytes == 0 {
            (None, 0)
        } else {
            let a = alloc.malloc(bytes as u64, stream)?;
            (a.block, a.addr)
        };
        Ok(DeviceBuffer { alloc: Arc::clone(alloc), block, addr, len, stream, sim: None })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements (and so no allocation).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes (`len × size_of::<T>()`; the block itself is rounded up).
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Device address of the first element (0 for an empty buffer).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The stream the buffer was allocated on (its copies run there).
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The allocator the buffer came from.
    pub fn allocator(&self) -> &Arc<Allocator> {
        &self.alloc
    }

    /// `Tensor.record_stream`: the buffer is also used on `stream`, so its block is not reused
    /// before the work queued there up to its free has finished.
    pub fn record_stream(&self, stream: StreamId) -> Result<()> {
        match self.block {
            Some(b) => Ok(self.alloc.record_stream(b, stream)?),
            None => Ok(()),
        }
    }

    fn simulated(&self) -> bool {
        self.alloc.backend_kind() == BackendKind::Simulated
    }

    /// A read-only cudarc view of the buffer (CUDA device only; an error value on the
    /// simulated device).
    #[cfg(feature = "cuda")]
    pub fn cuda(&self) -> Result<CudaView<'_, T>> {
        let stream = self.cuda_stream()?;
        Ok(CudaView::new(self.addr, self.len, stream))
    }

    /// A mutable cudarc view of the buffer (CUDA device only; an error value on the
    /// simulated device).
    #[cfg(feature = "cuda")]
    pub fn cuda_mut(&mut self) -> Result<CudaViewMut<'_, T>> {
        let stream = self.cuda_stream()?;
        Ok(CudaViewMut::new(self.addr, self.len, stream))
    }

    /// The cudarc stream of this buffer (taken under the allocator's lock; copies then run
    /// outside it).
    #[cfg(feature = "cuda")]
    fn cuda_stream(&self) -> Result<Arc<cudarc::driver::CudaStream>> {
        let stream = self.stream;
        self.alloc
            .with_state(|_, b| b.as_cuda().map(|c| c.stream(stream)))
            .ok_or_else(|| {
                Error::Unsupported(format!(
                    "this DeviceBuffer lives on the {} device: cudarc views need a CUDA device",
                    self.alloc.backend_kind().name()
                ))
            })?
            .ok_or_else(|| {
                Error::Device(crate::device::DeviceError::Driver(format!(
                    "CUDA_ERROR_INVALID_HANDLE: stream {:#x} is unknown to the allocator",
                    stream.0
                )))
            })
    }
}

impl<T: Element> DeviceBuffer<T> {
    /// A buffer of `len` zeros on `stream` (on the simulated device nothing is stored).
    pub fn zeros(alloc: &Arc<Allocator>, len: usize, stream: StreamId) -> Result<Self> {
        #[allow(unused_mut)]
        let mut buf = Self::alloc(alloc, len, stream)?;
        if buf.simulated() {
            alloc.fault_point("cuMemsetD8Async")?;
        } else {
            #[cfg(feature = "cuda")]
            {
                let r = buf.cuda_mut()?.write_zeros();
                alloc.note(r)?;
            }
        }
        Ok(buf)
    }

    /// A buffer holding a copy of `src`, on `stream`. The copy has finished when this returns.
    pub fn from_host(alloc: &Arc<Allocator>, src: &[T], stream: StreamId) -> Result<Self> {
        let mut buf = Self::alloc(alloc, src.len(), stream)?;
        buf.copy_from_host(src)?;
        Ok(buf)
    }

    /// Overwrites the contents with `src` (which must have exactly [`DeviceBuffer::len`]
    /// elements). The copy has finished when this returns.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        if src.len() != self.len {
            return Err(Error::InvalidArgument(format!(
                "copy of {} elements into a DeviceBuffer of {}",
                src.len(),
                self.len
            )));
        }
        if self.simulated() {
            self.alloc.fault_point("cuMemcpyHtoDAsync_v2")?;
            self.sim = (!src.is_empty()).then(|| src.to_vec());
            return Ok(());
        }
        #[cfg(feature = "cuda")]
        {
            let r = self.cuda_mut()?.write_from_host(src);
            self.alloc.note(r)?;
        }
        Ok(())
    }

    /// Copies the contents to a new `Vec` (waits for the buffer's stream).
    pub fn to_host(&self) -> Result<Vec<T>> {
        if self.simulated() {
            self.alloc.fault_point("cuMemcpyDtoHAsync_v2")?;
            return Ok(match &self.sim {
                Some(v) => v.clone(),
                None => vec![T::ZERO; self.len],
            });
        }
        #[cfg(feature = "cuda")]
        return Ok(self.alloc.note(self.cuda()?.read_to_host())?);
        #[cfg(not(feature = "cuda"))]
        Err(Error::Unsupported(format!(
            "to_host on the {} device needs the `cuda` feature",
            self.alloc.backend_kind().name()
        )))
    }
}

impl<T: Copy> Drop for DeviceBuffer<T> {
    /// Returns the block to the allocator's cache. Never panics: a failure (a driver error
    /// while processing stream events) is dropped here; the allocator's state stays consistent
    /// and the next call on the device reports the driver's condition.
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            let _ = self.alloc.free(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::CachingAllocator;
    use crate::device::any::AnyBackend;
    use crate::device::sim::SimBackend;
    use crate::error::AllocError;
    use crate::policy::config::AllocatorConfig;
    use crate::units::{GIB, MIB};

    fn sim(cap: u64) -> Arc<Allocator> {
        Arc::new(CachingAllocator::new(AnyBackend::Sim(SimBackend::new(0, cap)), AllocatorConfig::default()))
    }

    #[test]
    fn round_trip_from_host_to_host() {
        let a = sim(GIB);
        let data: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
        let buf = DeviceBuffer::from_host(&a, &data, StreamId::DEFAULT).unwrap();
        assert_eq!(buf.len(), 1000);
        assert_eq!(buf.num_bytes(), 4000);
        assert!(!buf.is_empty());
        assert_ne!(buf.addr(), 0);
        assert_eq!(buf.stream(), StreamId::DEFAULT);
        assert_eq!(buf.to_host().unwrap(), data);
        assert_eq!(a.memory_allocated(), 4096, "rounded to 512-byte blocks");

        let mut z = DeviceBuffer::<[u16; 3]>::zeros(&a, 10, StreamId::DEFAULT).unwrap();
        assert_eq!(z.to_host().unwrap(), vec![[0u16; 3]; 10]);
        let v: Vec<[u16; 3]> = (0..10).map(|i| [i, i + 1, i + 2]).collect();
        z.copy_from_host(&v).unwrap();
        assert_eq!(z.to_host().unwrap(), v);
        assert!(matches!(z.copy_from_host(&v[..3]), Err(Error::InvalidArgument(_))));

        let u = DeviceBuffer::<i64>::alloc(&a, 7, StreamId::DEFAULT).unwrap();
        assert_eq!(u.to_host().unwrap(), vec![0; 7], "never written reads as zeros on the sim");
    }

    #[test]
    fn drop_returns_memory_to_the_cache() {
        let a = sim(GIB);
        {
            let _b1 = DeviceBuffer::<u8>::zeros(&a, 3 * MIB as usize, StreamId::DEFAULT).unwrap();
            let _b2 = DeviceBuffer::<f64>::from_host(&a, &[1.0; 100], StreamId::DEFAULT).unwrap();
            assert!(a.memory_allocated() > 0);
        }
        assert_eq!(a.memory_allocated(), 0);
        let reserved = a.memory_reserved();
        assert!(reserved >= 3 * MIB + 2 * MIB, "segments stay cached: {reserved}");
        a.check_invariants().unwrap();
        a.empty_cache().unwrap();
        assert_eq!(a.memory_reserved(), 0);
    }

    #[test]
    fn zero_length_buffers_allocate_nothing() {
        let a = sim(GIB);
        let b = DeviceBuffer::<u32>::alloc(&a, 0, StreamId::DEFAULT).unwrap();
        let z = DeviceBuffer::<u32>::zeros(&a, 0, StreamId::DEFAULT).unwrap();
        let h = DeviceBuffer::<u32>::from_host(&a, &[], StreamId::DEFAULT).unwrap();
        let zst = DeviceBuffer::<()>::alloc(&a, 1000, StreamId::DEFAULT).unwrap();
        for x in [&b, &z, &h] {
            assert!(x.is_empty());
            assert_eq!(x.addr(), 0);
            assert_eq!(x.num_bytes(), 0);
            assert_eq!(x.to_host().unwrap(), Vec::<u32>::new());
            x.record_stream(StreamId(0x77)).unwrap();
        }
        assert_eq!(zst.len(), 1000);
        assert_eq!(zst.num_bytes(), 0);
        assert_eq!(a.memory_allocated(), 0);
        assert_eq!(a.memory_reserved(), 0);
        assert_eq!(a.stats().num_alloc_retries, 0);
        drop((b, z, h, zst));
        a.check_invariants().unwrap();
    }

    #[test]
    fn overflowing_length_is_an_error_value() {
        let a = sim(GIB);
        let e = DeviceBuffer::<u64>::alloc(&a, usize::MAX / 2, StreamId::DEFAULT).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }

    #[test]
    fn full_device_gives_an_oom_error_value() {
        let a = sim(64 * MIB);
        let keep = DeviceBuffer::<u8>::alloc(&a, 40 * MIB as usize, StreamId::DEFAULT).unwrap();
        let err = DeviceBuffer::<u8>::alloc(&a, 40 * MIB as usize, StreamId::DEFAULT).unwrap_err();
        match &err {
            Error::Alloc(AllocError::OutOfMemory(report)) => {
                assert_eq!(report.requested, 40 * MIB);
                assert_eq!(report.total, 64 * MIB);
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.starts_with("CUDA out of memory. Tried to allocate 40.00 MiB."), "{msg}");
        assert!(msg.contains("(simulated)"), "{msg}");
        drop(keep);
        // With the first buffer gone the same request fits.
        let again = DeviceBuffer::<u8>::alloc(&a, 40 * MIB as usize, StreamId::DEFAULT).unwrap();
        drop(again);
        assert_eq!(a.memory_allocated(), 0);
        a.check_invariants().unwrap();
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn cudarc_views_are_refused_on_the_simulated_device() {
        let a = sim(GIB);
        let mut b = DeviceBuffer::<f32>::zeros(&a, 16, StreamId::DEFAULT).unwrap();
        assert!(matches!(b.cuda(), Err(Error::Unsupported(_))));
        assert!(matches!(b.cuda_mut(), Err(Error::Unsupported(_))));
    }

    #[test]
    fn record_stream_keeps_the_block_until_the_stream_is_done() {
        let a = sim(GIB);
        let side = a.with_state(|_, b| crate::device::Backend::new_stream(b)).unwrap();
        a.with_state(|_, b| b.as_sim_mut().unwrap().set_stream_busy(side, true));
        let buf = DeviceBuffer::<u8>::alloc(&a, 1024, StreamId::DEFAULT).unwrap();
        let addr = buf.addr();
        buf.record_stream(side).unwrap();
        drop(buf);
        // Still pending on `side`: a new buffer must not get the same block.
        let other = DeviceBuffer::<u8>::alloc(&a, 1024, StreamId::DEFAULT).unwrap();
        assert_ne!(other.addr(), addr);
        a.with_state(|_, b| b.as_sim_mut().unwrap().set_stream_busy(side, false));
        drop(other);
        a.check_invariants().unwrap();
    }

    #[test]
    fn concurrent_alloc_and_free_through_one_allocator() {
        let a = sim(8 * GIB);
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let a = Arc::clone(&a);
                std::thread::spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                    let mut next = move || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    let mut live: Vec<DeviceBuffer<u8>> = Vec::new();
                    for _ in 0..400 {
                        let r = next();
                        if live.len() > 16 || (r % 3 == 0 && !live.is_empty()) {
                            let i = (next() as usize) % live.len();
                            drop(live.swap_remove(i));
                        } else {
                            // Mix of small-pool and large-pool sizes, up to 24 MiB.
                            let len = match r % 4 {
                                0 => (next() % 4096) as usize,
                                1 => (next() % MIB) as usize,
                                2 => (next() % (8 * MIB)) as usize,
                                _ => (next() % (24 * MIB)) as usize,
                            };
                            let stream = if r % 5 == 0 { StreamId(0x5100) } else { StreamId::DEFAULT };
                            live.push(DeviceBuffer::alloc(&a, len, stream).unwrap());
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        a.check_invariants().unwrap();
        assert_eq!(a.memory_allocated(), 0);
        let st = a.stats();
        assert_eq!(st.allocation[0].current, 0);
        assert_eq!(st.allocation[0].allocated, st.allocation[0].freed);
        assert!(st.allocation[0].allocated > 0);
        assert_eq!(st.num_ooms, 0);
    }
}
