//! [`PinnedHostMemory`]: one page-locked host allocation with asynchronous copies to and from
//! allocator memory (see the parent module's "Pinned host memory" for why it is sound).

use super::{CudaView, CudaViewMut, driver, oom_or_driver};
use crate::device::{DeviceError, Element};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, result, sys};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
/// The base address of a page-locked host allocation: a one-field newtype, so that `Send` and
/// `Sync` are asserted for exactly this pointer and nothing else.
struct HostPtr(NonNull<u8>);

// SAFETY: the pointer is the base of a `cuMemHostAlloc` allocation owned by exactly one
// `PinnedHostMemory`, which gives access to it only through `&self` / `&mut self` methods (so
// Rust's borrow rules order every host access, whatever the thread). Page-locked memory is not
// tied to the thread that allocated it, and the context is bound before every driver call, so
// moving the owner to another thread is like moving a `Box<[u8]>`.
unsafe impl Send for HostPtr {}
// SAFETY: through `&PinnedHostMemory` the memory is only read (`as_slice`, and device reads
// queued by `copy_to_device_async`), after every device write into it has completed; the list
// of copies in flight is behind a mutex.
unsafe impl Sync for HostPtr {}

/// What a queued copy does to the host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeviceAccess {
    /// A host→device copy reads it.
    Reads,
    /// A device→host copy writes it.
    Writes,
}

/// One page-locked host allocation (`cuMemHostAlloc`, flags `CU_MEMHOSTALLOC_PORTABLE`), zeroed
/// when allocated, with asynchronous copies to and from allocator memory. See the module's
/// "Pinned host memory" section for the waits that keep it sound; [`crate::pinned`] caches these.
pub struct PinnedHostMemory {
    ptr: HostPtr,
    size: usize,
    ctx: Arc<CudaContext>,
    /// Copies queued on streams that touch the memory, each followed by an event.
    in_flight: Mutex<Vec<(CudaEvent, DeviceAccess)>>,
    /// A copy was queued whose completion can no longer be proven (event and stream
    /// synchronisation both failed): the memory is never handed out or freed again.
    poisoned: AtomicBool,
}

impl std::fmt::Debug for PinnedHostMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedHostMemory")
            .field("ptr", &self.ptr.0)
            .field("size", &self.size)
            .field("copies_in_flight", &self.in_flight().len())
            .finish()
    }
}

impl PinnedHostMemory {
    /// The `cuMemHostAlloc` flags used: portable (pinned for every context), never
    /// write-combined (uncached for host reads; only worth it for write-only staging buffers).
    pub const FLAGS: u32 = sys::CU_MEMHOSTALLOC_PORTABLE;

    /// Allocates `size` bytes (> 0) of page-locked host memory through `ctx`, zeroed.
    /// `Err(OutOfMemory)` when the host cannot pin that much.
    pub fn alloc(ctx: &Arc<CudaContext>, size: usize) -> Result<Self, DeviceError> {
        if size == 0 {
            return Err(DeviceError::Driver("CUDA_ERROR_INVALID_VALUE: pinned allocation of 0 bytes".into()));
        }
        ctx.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        // SAFETY: a context is bound to this thread; cudarc passes a valid out-pointer and returns
        // the new allocation's address; the flags are `PORTABLE` only.
        let raw = unsafe { result::malloc_host(size, Self::FLAGS) }.map_err(|e| oom_or_driver("cuMemHostAlloc", e))?;
        let Some(ptr) = NonNull::new(raw.cast::<u8>()) else {
            return Err(DeviceError::Driver("CUDA_ERROR_INVALID_VALUE: cuMemHostAlloc returned NULL".into()));
        };
        // SAFETY: `ptr` is the base of a fresh, writable host allocation of `size` bytes that
        // nothing else refers to yet. Zeroing it makes every byte initialised.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, size) };
        Ok(PinnedHostMemory {
            ptr: HostPtr(ptr),
            size,
            ctx: Arc::clone(ctx),
            in_flight: Mutex::new(Vec::new()),
            poisoned: AtomicBool::new(false),
        })
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The host address (for display and identity; access goes through the slices).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.0.as_ptr()
    }

    /// The context the memory was allocated through.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn in_flight(&self) -> MutexGuard<'_, Vec<(CudaEvent, DeviceAccess)>> {
        // Every update of the list is one push or remove: a panic cannot leave it half-done.
        crate::sync::lock(&self.in_flight)
    }

    /// Waits for the queued copies that write into the memory (`writes_only`), or for all of
    /// them, and forgets them.
    fn wait(&self, writes_only: bool) -> Result<(), DeviceError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(DeviceError::Driver(
                "CUDA_ERROR_ILLEGAL_STATE: a copy into this pinned memory could not be waited for".into(),
            ));
        }
        let mut list = self.in_flight();
        while let Some(i) = list.iter().position(|(_, a)| !writes_only || *a == DeviceAccess::Writes) {
            list[i].0.synchronize().map_err(|e| driver("cuEventSynchronize", e))?;
            list.swap_remove(i);
        }
        Ok(())
    }

    /// Whether every copy queued on this memory has completed (completed ones are forgotten).
    pub fn is_idle(&self) -> Result<bool, DeviceError> {
        let mut list = self.in_flight();
        let mut i = 0;
        while i < list.len() {
            let ev = &list[i].0;
            ev.context().bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
            if ev.try_is_complete().map_err(|e| driver("cuEventQuery", e))? {
                list.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(list.is_empty() && !self.poisoned.load(Ordering::Acquire))
    }

    /// Bytes of `len` values of `T`, checked against the size and `T`'s alignment.
    fn span<T>(&self, len: usize) -> Result<usize, DeviceError> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).filter(|&b| b <= self.size).ok_or_else(|| {
            DeviceError::Driver(format!(
                "CUDA_ERROR_INVALID_VALUE: {len} × {} bytes exceed the pinned allocation of {} bytes",
                std::mem::size_of::<T>(),
                self.size
            ))
        })?;
        if !(self.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(DeviceError::Driver("CUDA_ERROR_INVALID_VALUE: misaligned pinned memory".into()));
        }
        Ok(bytes)
    }

    /// The first `len` values of `T`, once every queued copy into the memory has completed.
    pub fn as_slice<T: Element>(&self, len: usize) -> Result<&[T], DeviceError> {
        self.span::<T>(len)?;
        self.wait(true)?;
        // SAFETY: `ptr` is the live base of `size` bytes, aligned for `T`, and `len` values of `T`
        // fit in them (both checked by `span`). Every byte is initialised (zeroed at allocation,
        // later written only by host code through `&mut self` or by device copies) and
        // `T: Element` admits every bit pattern. No device copy writes into the memory any more
        // (waited for just above) and none can be queued while the returned borrow of `self`
        // lives: `copy_from_device_async` and host writes take `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.0.as_ptr().cast::<T>(), len) })
    }

    /// The first `len` values of `T`, mutably, once every queued copy (reads too) has completed.
    pub fn as_mut_slice<T: Element>(&mut self, len: usize) -> Result<&mut [T], DeviceError> {
        self.span::<T>(len)?;
        self.wait(false)?;
        // SAFETY: as in `as_slice` (bounds, alignment, initialised bytes, `T: Element`), and no
        // copy touches the memory any more: all were waited for above, and none can be queued
        // while the returned exclusive borrow of `self` lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.0.as_ptr().cast::<T>(), len) })
    }

    /// Remembers a copy just queued on `stream` (an event after it), or waits for it when no
    /// event can be recorded.
    fn track(&self, stream: &CudaStream, access: DeviceAccess) -> Result<(), DeviceError> {
        match stream.record_event(None) {
            Ok(ev) => {
                self.in_flight().push((ev, access));
                Ok(())
            }
            Err(record) => match stream.synchronize() {
                // The copy has completed; nothing to remember.
                Ok(()) => Ok(()),
                Err(_) => {
                    self.poisoned.store(true, Ordering::Release);
                    Err(driver("cuEventRecord", record))
                }
            },
        }
    }

    /// Queues a copy of the first `dst.len()` values into the device buffer behind `dst`, on
    /// `stream` (not waited for). The memory stays alive and unwritten until the copy completes.
    pub fn copy_to_device_async<T: Element>(
        &self,
        dst: &mut CudaViewMut<'_, T>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), DeviceError> {
        let bytes = self.span::<T>(dst.len)?;
        if bytes == 0 {
            return Ok(());
        }
        // Host writes need `&mut self`, so none is under way; device writes must finish first.
        self.wait(true)?;
        stream.context().bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        // SAFETY: source: `bytes` ≤ `size` initialised bytes at `ptr` (checked by `span`), which
        // stay alive and unwritten until the event recorded by `track` completes (`as_mut_slice`,
        // new device writes and the drop all wait for it first). Destination: by the view's
        // invariant a live device block of `dst.len × size_of::<T>()` = `bytes` bytes, exclusively
        // borrowed. The copy is ordered on `stream`, whose context is bound.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst.ptr, self.as_ptr().cast(), bytes, stream.cu_stream()).result() }
            .map_err(|e| driver("cuMemcpyHtoDAsync_v2", e))?;
        self.track(stream, DeviceAccess::Reads)
    }

    /// Queues a copy of the device buffer behind `src` into the first `src.len()` values, on
    /// `stream` (not waited for: the slices wait for it).
    pub fn copy_from_device_async<T: Element>(
        &mut self,
        src: &CudaView<'_, T>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), DeviceError> {
        let bytes = self.span::<T>(src.len)?;
        if bytes == 0 {
            return Ok(());
        }
        // Copies still reading or writing the memory must finish before it is overwritten.
        self.wait(false)?;
        stream.context().bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        // SAFETY: destination: `bytes` ≤ `size` bytes at `ptr` (checked), exclusively borrowed
        // through `&mut self`, and no Rust slice of it can be made before the event recorded by
        // `track` completes (the slices and the drop wait for it); any bit pattern is a valid
        // `Element`. Source: by the view's invariant a live device block of `bytes` bytes. The
        // copy is ordered on `stream`, whose context is bound.
        unsafe { sys::cuMemcpyDtoHAsync_v2(self.ptr.0.as_ptr().cast(), src.ptr, bytes, stream.cu_stream()).result() }
            .map_err(|e| driver("cuMemcpyDtoHAsync_v2", e))?;
        self.track(stream, DeviceAccess::Writes)
    }
}

impl Drop for PinnedHostMemory {
    /// Waits for every queued copy, then frees the memory. When completion cannot be proven
    /// (driver failure) the memory is leaked rather than freed under a copy. Never panics.
    fn drop(&mut self) {
        if self.poisoned.load(Ordering::Acquire) {
            return;
        }
        if self.wait(false).is_err() {
            // Some event could not be waited for: only synchronising the contexts the copies ran
            // in proves that none is still running.
            let contexts: Vec<Arc<CudaContext>> =
                self.in_flight().iter().map(|(e, _)| Arc::clone(e.context())).collect();
            if contexts.iter().any(|c| c.synchronize().is_err()) {
                return;
            }
        }
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed exactly once, here; no copy uses it
        // any more (all were waited for above, or we returned and leaked it), and no Rust borrow
        // of it outlives `self`.
        self.ctx.record_err(unsafe { result::free_host(self.ptr.0.as_ptr().cast()) });
    }
}
