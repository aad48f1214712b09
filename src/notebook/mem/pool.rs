//! Capping the CUDA stream-ordered pool that candle and cudarc allocate from
//! ([`cap_cuda_pool`]): what `torch.cuda.set_per_process_memory_fraction` is to PyTorch's
//! allocator, for the memory gpumem-nb's allocator does not hand out.

use crate::allocator::Allocator;
use crate::device::BackendKind;
use crate::error::{Error, Result};
use crate::units::iec;
use std::fmt;
use std::sync::Arc;

/// The CUDA stream-ordered pool of a device, capped ([`cap_cuda_pool`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolCap {
    /// Device index.
    pub device: i32,
    /// The pool's `maxSize`, as asked for (the driver reserves in chunks, 32 MiB on an H200
    /// with driver 580: a cap between two chunks holds up to the next one).
    pub max_bytes: u64,
}

impl fmt::Display for PoolCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the CUDA pool of device {} is capped at {}: cuMemAllocAsync (cudarc, candle) fails with out of memory once \
             the pool would reserve more",
            self.device,
            iec(self.max_bytes)
        )
    }
}

/// Caps the CUDA stream-ordered pool that `cuMemAllocAsync` draws from (cudarc's `CudaSlice`,
/// candle; not this crate's allocator, which `alloc.set_per_process_memory_fraction` caps): a
/// pool with `maxSize = bytes` becomes the device's current pool, so a candle program runs as it
/// would on a card whose pool can reserve that much. Call it before anything allocates from the
/// pool (before candle's `Device::new_cuda`); an error says why not (no CUDA device, a pool that
/// already holds memory or was capped already, a size of 0).
pub fn cap_cuda_pool(bytes: u64) -> Result<PoolCap> {
    cap_cuda_pool_on(&crate::notebook::session::current()?, bytes)
}

/// [`cap_cuda_pool`] on a given allocator's device.
pub fn cap_cuda_pool_on(alloc: &Arc<Allocator>, bytes: u64) -> Result<PoolCap> {
    let bad = |why: String| Error::InvalidArgument(format!("cap_cuda_pool: {why}"));
    if bytes == 0 {
        return Err(bad("a cap of 0 bytes leaves no pool to allocate from".into()));
    }
    let device = alloc.device();
    if alloc.backend_kind() != BackendKind::Cuda {
        return Err(bad(format!(
            "device {device} ({}) has no CUDA stream-ordered pool; the cap is for cudarc and candle on a GPU",
            alloc.backend_kind().name()
        )));
    }
    if let Some(p) = alloc.with_backend(crate::device::Backend::pool_usage).filter(|p| p.used > 0) {
        return Err(bad(format!(
            "the CUDA pool of device {device} already holds {} (cudarc or candle allocated before the cap): cap it \
             before the first allocation, before candle's Device::new_cuda",
            iec(p.used)
        )));
    }
    cap_pool_backend(alloc, bytes).map_err(|e| bad(format!("device {device}: {e}")))?;
    Ok(PoolCap { device, max_bytes: bytes })
}

#[cfg(feature = "cuda")]
fn cap_pool_backend(alloc: &Arc<Allocator>, bytes: u64) -> std::result::Result<(), crate::device::DeviceError> {
    let ctx = alloc.with_backend(|b| b.as_cuda().map(|c| c.context().clone()));
    let ctx = ctx.ok_or_else(|| crate::device::DeviceError::Driver("not a CUDA device".into()))?;
    crate::device::cuda::cap_stream_ordered_pool(&ctx, bytes).map(|_| ())
}

#[cfg(not(feature = "cuda"))]
fn cap_pool_backend(_: &Arc<Allocator>, _: u64) -> std::result::Result<(), crate::device::DeviceError> {
    Err(crate::device::DeviceError::Driver("built without the `cuda` feature".into()))
}
