//! Kernels' stacks: the local memory the driver reserves for them in a context, read without
//! making a context (NVML counts it; no allocation tracker sees it); with them, in the same
//! visit to the context, its stream-ordered pool and the device's free memory. The same visit
//! trims the pool ([`trim_primary_pool`]: `%gpumem trim`).

use super::{device_handle, driver};
use crate::device::DeviceError;
use cudarc::driver::{result, sys};

/// The local memory the driver holds for kernels' stacks in device `ordinal`'s primary context:
/// each thread's stack size (`CU_LIMIT_STACK_SIZE`, which the driver raises, and keeps raised,
/// when a kernel needs a larger frame) and how many threads the device holds at once (SMs ×
/// threads per SM); the driver reserves their product (checked on an H200 against NVML:
/// `scripts/gpu/lmem_probe.py`, GPU_VALIDATION.md §23). `Ok(None)` where the primary context
/// is not active: none is made to read it (but for one race no caller can close: another thread
/// releasing the context's last reference between the state query and the retain below, which
/// then makes a context and destroys it again at the release). Never panics.
pub fn primary_local_memory(ordinal: usize) -> Result<Option<LocalMemory>, DeviceError> {
    let dev = device_handle(ordinal)?;
    let unavailable = DeviceError::Unavailable;
    let attribute = |a: sys::CUdevice_attribute, name: &str| {
        // SAFETY: `dev` comes from cuDeviceGet (above).
        unsafe { result::device::get_attribute(dev, a) }.map_err(|e| driver(name, e))
    };
    let visit = in_primary(dev, || {
        let limit = result::ctx::get_limit(sys::CUlimit::CU_LIMIT_STACK_SIZE);
        let current = current_pool(dev);
        let pool = current.and_then(pool_in_use);
        let high = current.and_then(|p| pool_attribute(p, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH));
        let free_total = result::mem_get_info().ok().map(|(f, t)| (f as u64, t as u64));
        limit.map(|l| (l, pool, high, free_total)).map_err(|e| driver("cuCtxGetLimit(STACK_SIZE)", e))
    })?;
    let Some((stack, pool, pool_reserved_high, free_total)) = visit.transpose()? else { return Ok(None) };
    let sms = attribute(
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)",
    )?;
    let per_sm = attribute(
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
        "cuDeviceGetAttribute(MAX_THREADS_PER_MULTIPROCESSOR)",
    )?;
    let count = |v: i32, what: &str| {
        u64::try_from(v).ok().filter(|&n| n > 0).ok_or_else(|| unavailable(format!("the driver gave {what} = {v}")))
    };
    Ok(Some(LocalMemory {
        stack_bytes: stack as u64,
        resident_threads: count(sms, "MULTIPROCESSOR_COUNT")? * count(per_sm, "MAX_THREADS_PER_MULTIPROCESSOR")?,
        pool,
        pool_reserved_high,
        free_total,
    }))
}

/// Starts device `ordinal`'s current stream-ordered pool's reservation high-water mark again
/// from what it reserves now (`CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH` set to 0), so that a later
/// [`primary_local_memory`] reads the most it reserved since: before each cell, what the pool
/// held during it even where a synchronize gave memory back before its end. Nothing where the
/// primary context is not active (none is made) or the device has no pool.
pub fn reset_primary_pool_high(ordinal: usize) -> Result<(), DeviceError> {
    let dev = device_handle(ordinal)?;
    let visit = in_primary(dev, || {
        let Some(pool) = current_pool(dev) else { return Ok(()) };
        reset_pool_mark(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
            .map_err(|e| driver("cuMemPoolSetAttribute(RESERVED_MEM_HIGH)", e))
    })?;
    visit.transpose().map(|_| ())
}

/// Gives back what device `ordinal`'s current stream-ordered pool holds unused (where
/// `cuMemAllocAsync` allocates: cudarc's `CudaSlice`, candle): the context's work is waited for
/// first (`cuCtxSynchronize`: a stream-ordered free returns its memory to the pool only when the
/// stream reaches it), then `cuMemPoolTrimTo(pool, 0)`, which keeps what is in use. The pool's
/// bytes in use and reserved before and after, by the driver's own counters. `Ok(None)` where the
/// primary context is not active (nothing to trim: none is made) or the device has no pool.
pub fn trim_primary_pool(ordinal: usize) -> Result<Option<PoolTrim>, DeviceError> {
    let dev = device_handle(ordinal)?;
    let visit = in_primary(dev, || {
        let Some(pool) = current_pool(dev) else { return Ok(None) };
        let Some(before) = pool_in_use(pool) else { return Ok(None) };
        result::ctx::synchronize().map_err(|e| driver("cuCtxSynchronize", e))?;
        // SAFETY: `pool` is the device's live current pool (read above, in this context); the
        // driver keeps every byte in use and releases only unused reserved memory.
        unsafe { result::mem_pool::trim_to(pool, 0) }.map_err(|e| driver("cuMemPoolTrimTo", e))?;
        let after =
            pool_in_use(pool).ok_or_else(|| DeviceError::Unavailable("the pool's counters after the trim".into()))?;
        Ok(Some(PoolTrim { before, after }))
    })?;
    Ok(visit.transpose()?.flatten())
}

/// Runs `f` with device `dev`'s primary context current on this thread, if that context is
/// active; `Ok(None)` where it is not (none is made to run `f`: but for one race no caller can
/// close, another thread releasing the context's last reference between the state query and the
/// retain below, which then makes a context and destroys it again at the release). The thread's
/// current context is what it was before on return.
fn in_primary<T>(dev: sys::CUdevice, f: impl FnOnce() -> T) -> Result<Option<T>, DeviceError> {
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: `dev` comes from cuDeviceGet after a successful probe (cuInit); both out-pointers
    // are locals of the types the driver writes.
    unsafe { sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) }
        .result()
        .map_err(|e| driver("cuDevicePrimaryCtxGetState", e))?;
    if active == 0 {
        return Ok(None);
    }
    // SAFETY: `dev` is valid; the reference this takes on the (active) primary context is
    // given back by the release below on every path after it.
    let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(|e| driver("cuDevicePrimaryCtxRetain", e))?;
    // SAFETY: `ctx` is a live context (retained above); pushing it makes it current on this
    // thread only, and the pop below restores the thread's previous current context.
    let ran = match unsafe { sys::cuCtxPushCurrent_v2(ctx) }.result() {
        Ok(()) => {
            let out = f();
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: this thread pushed `ctx` just above and `f` pushes nothing it does not
            // pop; `popped` is a local out-pointer.
            match unsafe { sys::cuCtxPopCurrent_v2(&mut popped) }.result() {
                Ok(()) if popped == ctx => Ok(out),
                Ok(()) => {
                    Err(DeviceError::Unavailable("cuCtxPopCurrent gave back another context than was pushed".into()))
                }
                Err(e) => Err(driver("cuCtxPopCurrent", e)),
            }
        }
        Err(e) => Err(driver("cuCtxPushCurrent", e)),
    };
    // SAFETY: releases the reference retained above, exactly once.
    let _ = unsafe { result::primary_ctx::release(dev) };
    ran.map(Some)
}

/// The device's current stream-ordered pool (where `cuMemAllocAsync` allocates: cudarc's
/// `CudaSlice`, candle); `None` where the driver has none (no async allocation on the device).
pub(super) fn current_pool(dev: sys::CUdevice) -> Option<sys::CUmemoryPool> {
    // SAFETY: `dev` comes from cuDeviceGet after a successful probe (or is a live context's
    // device); the call only writes the pool handle.
    unsafe { result::device::get_mem_pool(dev) }.ok()
}

/// `pool`'s bytes in use and reserved, by the driver's own counters.
fn pool_in_use(pool: sys::CUmemoryPool) -> Option<(u64, u64)> {
    use sys::CUmemPool_attribute as A;
    Some((
        pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
        pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
    ))
}

/// One of the four `*_MEM_*` byte counters of `pool`, a pool [`current_pool`] gave.
pub(super) fn pool_attribute(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> Option<u64> {
    let mut v: u64 = 0;
    // SAFETY: `pool` is a device's live current pool (from `current_pool`); the `*_MEM_CURRENT`
    // and `*_MEM_HIGH` attributes are `cuuint64_t`, so the driver writes 8 bytes into `v`.
    unsafe { result::mem_pool::get_attribute(pool, attr, (&mut v as *mut u64).cast()) }.ok()?;
    Some(v)
}

/// Starts `attr`, one of `pool`'s `*_MEM_HIGH` marks, again from the pool's current figure.
pub(super) fn reset_pool_mark(
    pool: sys::CUmemoryPool,
    attr: sys::CUmemPool_attribute,
) -> Result<(), cudarc::driver::DriverError> {
    let mut zero: u64 = 0;
    // SAFETY: `pool` is a device's live current pool (from `current_pool`); the `*_HIGH`
    // attributes are `cuuint64_t` and are reset by setting them to 0 (the driver reads 8 bytes
    // from `zero`).
    unsafe { result::mem_pool::set_attribute(pool, attr, (&mut zero as *mut u64).cast()) }
}

/// What [`trim_primary_pool`] did to a device's stream-ordered pool: (bytes in use, bytes
/// reserved) by the driver's counters, before and after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolTrim {
    /// In use and reserved before the trim (pending frees still in use).
    pub before: (u64, u64),
    /// In use and reserved after it.
    pub after: (u64, u64),
}

/// A context's local memory for kernels' stacks ([`primary_local_memory`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalMemory {
    /// Each thread's stack, bytes (the context's `CU_LIMIT_STACK_SIZE`).
    pub stack_bytes: u64,
    /// Threads the device holds at once: SMs × threads per SM.
    pub resident_threads: u64,
    /// The device's stream-ordered pool in that context: bytes in use and reserved.
    pub pool: Option<(u64, u64)>,
    /// The most that pool reserved since [`reset_primary_pool_high`] (or since it was made).
    pub pool_reserved_high: Option<u64>,
    /// The device's free and total memory (`cuMemGetInfo` in that context).
    pub free_total: Option<(u64, u64)>,
}
