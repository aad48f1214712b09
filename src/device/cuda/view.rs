//! [`CudaView`] / [`CudaViewMut`]: borrows of a [`crate::DeviceBuffer`] for cudarc's safe API
//! (see the parent module's "cudarc interop").

use super::driver;
use crate::device::{DeviceError, Element};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, LaunchArgs, PushKernelArg, SyncOnDrop, result};
use std::marker::PhantomData;
use std::sync::Arc;

/// A read-only borrow of a [`crate::DeviceBuffer`] for cudarc's safe API (from
/// [`crate::DeviceBuffer::cuda`]): implements [`DeviceSlice`], [`DevicePtr`] and
/// `PushKernelArg<&CudaView<T>>`.
///
/// Not to be confused with cudarc's own `CudaView`, which borrows a `CudaSlice`.
pub struct CudaView<'a, T> {
    pub(super) ptr: CUdeviceptr,
    pub(super) len: usize,
    stream: Arc<CudaStream>,
    _borrow: PhantomData<&'a [T]>,
}

/// A mutable borrow of a [`crate::DeviceBuffer`] for cudarc's safe API (from
/// [`crate::DeviceBuffer::cuda_mut`]): implements [`DeviceSlice`], [`DevicePtr`],
/// [`DevicePtrMut`] and `PushKernelArg<&CudaViewMut<T>>` / `PushKernelArg<&mut CudaViewMut<T>>`.
pub struct CudaViewMut<'a, T> {
    pub(super) ptr: CUdeviceptr,
    pub(super) len: usize,
    stream: Arc<CudaStream>,
    _borrow: PhantomData<&'a mut [T]>,
}

impl<T> std::fmt::Debug for CudaView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaView {{ ptr: {:#x}, len: {} }}", self.ptr, self.len)
    }
}

impl<T> std::fmt::Debug for CudaViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaViewMut {{ ptr: {:#x}, len: {} }}", self.ptr, self.len)
    }
}

impl<'a, T> CudaView<'a, T> {
    /// Invariant (relied on by the copies below): `ptr..ptr + len * size_of::<T>()` is a live
    /// block of the allocator that the returned view borrows for `'a` (only
    /// [`crate::DeviceBuffer`] constructs views), on `stream`'s device.
    pub(crate) fn new(ptr: u64, len: usize, stream: Arc<CudaStream>) -> Self {
        CudaView { ptr, len, stream, _borrow: PhantomData }
    }

    /// The raw device address (for `builder.arg(&ptr)` style launches).
    pub fn device_address(&self) -> u64 {
        self.ptr
    }
}

impl<T: Element> CudaView<'_, T> {
    /// Copies the whole view to a new host vector (on the view's stream, then waits for it).
    pub(crate) fn read_to_host(&self) -> Result<Vec<T>, DeviceError> {
        let mut out = vec![T::ZERO; self.len];
        if self.len == 0 {
            return Ok(out);
        }
        self.stream.context().bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        // SAFETY: by the view's invariant `ptr` is a live device block of `len * size_of::<T>()`
        // bytes, exactly `size_of_val(out)`; `out` is a valid, exclusively borrowed host slice
        // that outlives the copy (we synchronise the stream before returning); `T: Element`
        // admits every bit pattern, so whatever the device holds is a valid `T`.
        unsafe { result::memcpy_dtoh_async(&mut out, self.ptr, self.stream.cu_stream()) }
            .map_err(|e| driver("cuMemcpyDtoHAsync_v2", e))?;
        self.stream.synchronize().map_err(|e| driver("cuStreamSynchronize", e))?;
        Ok(out)
    }
}

impl<'a, T> CudaViewMut<'a, T> {
    /// Same invariant as [`CudaView::new`], with an exclusive borrow.
    pub(crate) fn new(ptr: u64, len: usize, stream: Arc<CudaStream>) -> Self {
        CudaViewMut { ptr, len, stream, _borrow: PhantomData }
    }

    /// The raw device address (for `builder.arg(&ptr)` style launches).
    pub fn device_address(&self) -> u64 {
        self.ptr
    }
}

impl<T: Element> CudaViewMut<'_, T> {
    /// Copies `src` (exactly `len` elements) into the view and waits for the copy.
    pub(crate) fn write_from_host(&mut self, src: &[T]) -> Result<(), DeviceError> {
        if src.len() != self.len {
            return Err(DeviceError::Driver(format!(
                "CUDA_ERROR_INVALID_VALUE: copy of {} elements into a buffer of {}",
                src.len(),
                self.len
            )));
        }
        if self.len == 0 {
            return Ok(());
        }
        self.stream.context().bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        // SAFETY: by the view's invariant `ptr` is a live device block of `len * size_of::<T>()`
        // bytes = `size_of_val(src)` (lengths checked above); `src` stays borrowed until the
        // stream is synchronised below; `T: Element` has no padding, so every byte read is
        // initialised.
        unsafe { result::memcpy_htod_async(self.ptr, src, self.stream.cu_stream()) }
            .map_err(|e| driver("cuMemcpyHtoDAsync_v2", e))?;
        self.stream.synchronize().map_err(|e| driver("cuStreamSynchronize", e))
    }

    /// Zeroes the view (stream-ordered on the view's stream; does not wait).
    pub(crate) fn write_zeros(&mut self) -> Result<(), DeviceError> {
        let bytes = self.len * std::mem::size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        self.stream.context().bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        // SAFETY: by the view's invariant `ptr..ptr + bytes` is a live device block borrowed
        // exclusively; the memset is ordered on the block's stream like every later use of it.
        unsafe { result::memset_d8_async(self.ptr, 0, bytes, self.stream.cu_stream()) }
            .map_err(|e| driver("cuMemsetD8Async", e))
    }
}

impl<T> DeviceSlice<T> for CudaView<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DeviceSlice<T> for CudaViewMut<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for CudaView<'_, T> {
    fn device_ptr<'b>(&'b self, _stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtr<T> for CudaViewMut<'_, T> {
    fn device_ptr<'b>(&'b self, _stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtrMut<T> for CudaViewMut<'_, T> {
    fn device_ptr_mut<'b>(&'b mut self, _stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

// SAFETY: the kernel argument is the view's device address, pushed through cudarc's own
// `PushKernelArg<&u64>` impl (a `CUdeviceptr` is what a pointer parameter expects); the `&u64`
// lives inside the view, which is borrowed for `'b`, and `'b` outlives the builder's `'a`.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b CudaView<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b CudaView<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as for `&CudaView` above: the address lives in the view, borrowed for `'b: 'a`.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b CudaViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b CudaViewMut<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as for `&CudaView` above: the address lives in the view, borrowed for `'b: 'a`.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut CudaViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut CudaViewMut<'c, T>) -> &mut Self {
        let ptr: &'b CUdeviceptr = &arg.ptr;
        self.arg(ptr)
    }
}
