//! Pinned (page-locked) host memory with PyTorch's caching host allocator policy, and
//! asynchronous copies between [`PinnedBuffer`] and [`DeviceBuffer`].
//!
//! # Policy (PyTorch's `CachingHostAllocator`)
//! - A request of `n` bytes gets a block of `n` rounded up to a power of two; blocks are never
//!   split or merged. Freed blocks wait in one free list per power of two (last freed, first
//!   reused).
//! - A block used by stream work (an asynchronous copy, or a stream named with
//!   [`PinnedBuffer::record_stream`]) carries an event recorded on that stream when it was used.
//!   When the buffer is dropped the block is reused only once every such event has completed;
//!   until then it is *pending*. Pending blocks are looked at (events queried) on every
//!   allocation and by [`HostAllocator::empty_cache`].
//! - [`HostAllocator::empty_cache`] returns every free block to the system
//!   (`cuMemFreeHost`); blocks in use or pending stay.
//! - Statistics have PyTorch 2.x's names and meaning ([`HostStats`],
//!   `torch.cuda.host_memory_stats()`): `allocation` / `allocated_bytes` count blocks handed
//!   out (from a request until the block is reusable again), `segment` / `reserved_bytes` count
//!   blocks held from the system (in use, pending or cached), `num_host_alloc` /
//!   `num_host_free` count system calls. One deliberate difference: PyTorch estimates the
//!   peaks of `allocation` and `allocated_bytes` by adding per-size-class peaks; here they are
//!   exact.
//!
//! # Memory
//! With a CUDA device ([`HostAllocator::for_device`] on a CUDA allocator) blocks are
//! page-locked with `cuMemHostAlloc` (flags `PORTABLE`, never write-combined: see
//! `backend::cuda::PinnedHostMemory`), and [`PinnedBuffer::copy_to_device_async`] /
//! [`PinnedBuffer::copy_from_device_async`] queue `cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` on
//! the stream given. On the simulated device blocks are plain heap memory (typed by the element
//! type of their latest use: a block reused with another element type gets fresh heap memory
//! of the same size class) and copies are synchronous, into the simulated buffer's host-side
//! contents; events are still recorded on the simulated stream, so a stream marked busy holds
//! the block exactly as unfinished GPU work would.
//!
//! # Locking
//! The host cache has its own lock. Event queries call into the device allocator (its lock)
//! while the host lock is held; the device allocator never calls back, so the order is always
//! host, then device. System allocation and release run outside the host lock.
#![forbid(unsafe_code)]

use crate::allocator::Allocator;
use crate::buffer::DeviceBuffer;
use crate::device::Element;
use crate::device::{Backend, EventId, StreamId};
use crate::error::{Error, Result};
use crate::render::{MimeBundle, Table};
use crate::stats::Stat;
use crate::units::iec;
use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

#[cfg(feature = "cuda")]
use crate::device::DeviceError;
#[cfg(feature = "cuda")]
use crate::device::cuda::PinnedHostMemory;
use crate::sync::lock;
#[cfg(feature = "cuda")]
use cudarc::driver::{CudaContext, CudaStream};

/// What backs a host allocator's blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostMemoryKind {
    /// Plain heap memory: the simulated device (no driver to pin it; copies are synchronous).
    Heap,
    /// Page-locked by the CUDA driver (`cuMemHostAlloc`, portable, not write-combined).
    Pinned,
}

impl HostMemoryKind {
    /// "heap (simulated)" / "pinned (cuMemHostAlloc)".
    pub fn name(self) -> &'static str {
        match self {
            HostMemoryKind::Heap => "heap (simulated)",
            HostMemoryKind::Pinned => "pinned (cuMemHostAlloc)",
        }
    }
}

/// PyTorch's `DurationStat`: microseconds spent in system calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DurationStat {
    /// Sum of the durations since the last accumulated reset.
    pub total: i64,
    /// Longest duration since the last peak reset.
    pub max: i64,
    /// Shortest duration since the last peak reset (0 = none yet).
    pub min: i64,
    /// Number of calls since the last accumulated reset.
    pub count: i64,
}

impl DurationStat {
    /// Adds one call of `us` microseconds.
    pub(crate) fn increase(&mut self, us: i64) {
        self.total += us;
        self.count += 1;
        self.max = self.max.max(us);
        self.min = if self.min == 0 { us } else { self.min.min(us) };
    }
    /// `total / count` (integer), 0 without calls.
    pub fn avg(&self) -> i64 {
        if self.count == 0 { 0 } else { self.total / self.count }
    }
}

/// The host allocator's statistics with PyTorch's names (`torch.cuda.host_memory_stats()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostStats {
    /// What the blocks are (not a PyTorch key: says what the numbers cover).
    pub memory: HostMemoryKind,
    /// COUNT: blocks handed out and not yet reusable (in use, or freed with stream work pending).
    pub allocation: Stat,
    /// COUNT: blocks obtained from the system (in use, pending or cached).
    pub segment: Stat,
    /// SUM: bytes (rounded to powers of two) of the blocks counted by `allocation`.
    pub allocated_bytes: Stat,
    /// SUM: bytes of the blocks counted by `segment`.
    pub reserved_bytes: Stat,
    /// Microseconds in `cuMemHostAlloc` (heap allocation on the simulated device).
    pub host_alloc_time: DurationStat,
    /// Microseconds in `cuMemFreeHost` (heap release on the simulated device).
    pub host_free_time: DurationStat,
    /// COUNT: system allocations (= `segment.allocated`, as PyTorch derives it).
    pub num_host_alloc: i64,
    /// COUNT: system frees (= `segment.freed`).
    pub num_host_free: i64,
}

impl HostStats {
    fn new(memory: HostMemoryKind) -> Self {
        HostStats {
            memory,
            allocation: Stat::default(),
            segment: Stat::default(),
            allocated_bytes: Stat::default(),
            reserved_bytes: Stat::default(),
            host_alloc_time: DurationStat::default(),
            host_free_time: DurationStat::default(),
            num_host_alloc: 0,
            num_host_free: 0,
        }
    }

    /// `torch.cuda.host_memory_stats()`: 28 sorted keys (`allocation.current`, …,
    /// `host_alloc_time.avg`, …, `num_host_alloc`, `num_host_free`, …).
    pub fn host_memory_stats(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for (name, s) in [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
        ] {
            m.insert(format!("{name}.current"), s.current);
            m.insert(format!("{name}.peak"), s.peak);
            m.insert(format!("{name}.allocated"), s.allocated);
            m.insert(format!("{name}.freed"), s.freed);
        }
        for (name, d) in [("host_alloc_time", &self.host_alloc_time), ("host_free_time", &self.host_free_time)] {
            m.insert(format!("{name}.total"), d.total);
            m.insert(format!("{name}.max"), d.max);
            m.insert(format!("{name}.min"), d.min);
            m.insert(format!("{name}.count"), d.count);
            m.insert(format!("{name}.avg"), d.avg());
        }
        m.insert("num_host_alloc".into(), self.num_host_alloc);
        m.insert("num_host_free".into(), self.num_host_free);
        m
    }

    fn table(&self) -> Table {
        let mut t = Table::new(["host stat", "current", "peak", "allocated", "freed"]).right_align([1, 2, 3, 4]);
        let count = |s: &Stat| [s.current, s.peak, s.allocated, s.freed].map(|v| v.to_string());
        let bytes = |s: &Stat| [s.current, s.peak, s.allocated, s.freed].map(|v| iec(v.max(0) as u64));
        let row = |t: &mut Table, name: &str, cells: [String; 4]| {
            t.row(std::iter::once(name.to_string()).chain(cells));
        };
        row(&mut t, "allocation", count(&self.allocation));
        row(&mut t, "allocated_bytes", bytes(&self.allocated_bytes));
        row(&mut t, "segment", count(&self.segment));
        row(&mut t, "reserved_bytes", bytes(&self.reserved_bytes));
        t.caption(format!(
            "host memory cache, {}: {} system allocations ({} µs), {} system frees ({} µs)",
            self.memory.name(),
            self.num_host_alloc,
            self.host_alloc_time.total,
            self.num_host_free,
            self.host_free_time.total
        ))
    }

    /// Text and HTML tables.
    pub fn bundle(&self) -> MimeBundle {
        self.table().bundle()
    }
}

impl fmt::Display for HostStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.table().to_text())
    }
}

/// A block's memory while it sits in the cache.
enum BlockMemory {
    /// Heap memory: a `Vec<T>` for the `T` of the block's latest use.
    Heap(Box<dyn Any + Send + Sync>),
    /// Page-locked memory.
    #[cfg(feature = "cuda")]
    Pinned(PinnedHostMemory),
}

/// A block's memory while a [`PinnedBuffer<T>`] owns it.
enum Mem<T> {
    Heap(Vec<T>),
    #[cfg(feature = "cuda")]
    Pinned(PinnedHostMemory),
}

/// One cached block.
struct HostBlock {
    /// Power-of-two size in bytes.
    size: u64,
    memory: BlockMemory,
}

/// Stream work that used a block: an event recorded on `alloc`'s device.
struct Use {
    alloc: Arc<Allocator>,
    event: EventId,
}

/// Where new blocks come from.
enum Source {
    Heap,
    #[cfg(feature = "cuda")]
    Cuda(Arc<CudaContext>),
}

struct HostInner {
    /// Free blocks by size index (log2 of the size), last freed at the end.
    free: BTreeMap<u32, Vec<HostBlock>>,
    /// Freed blocks waiting for stream work, with the events still outstanding.
    pending: Vec<(HostBlock, Vec<Use>)>,
    stats: HostStats,
}

impl HostInner {
    /// Blocks whose events have all completed go to the free list. The first query error is
    /// returned; its block stays pending.
    fn process_events(&mut self) -> Result<()> {
        let mut first_err = None;
        let mut i = 0;
        while i < self.pending.len() {
            let uses = &mut self.pending[i].1;
            let mut j = 0;
            while j < uses.len() {
                let u = &uses[j];
                match u.alloc.with_state(|_, b| b.query_event(u.event)) {
                    Ok(true) => {
                        uses.swap_remove(j);
                    }
                    Ok(false) => j += 1,
                    Err(e) => {
                        first_err.get_or_insert(e);
                        j += 1;
                    }
                }
            }
            if uses.is_empty() {
                let (block, _) = self.pending.swap_remove(i);
                self.make_reusable(block);
            } else {
                i += 1;
            }
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// A handed-out block becomes reusable: back on its free list.
    fn make_reusable(&mut self, block: HostBlock) {
        self.stats.allocation.decrease(1);
        self.stats.allocated_bytes.decrease(block.size as i64);
        self.free.entry(size_index(block.size)).or_default().push(block);
    }
}

/// log2 of a power of two.
fn size_index(size: u64) -> u32 {
    size.trailing_zeros()
}

/// A caching allocator of host memory for transfers (PyTorch's `CachingHostAllocator`). See
/// the module documentation for the policy.
pub struct HostAllocator {
    inner: Mutex<HostInner>,
    source: Source,
}

impl fmt::Debug for HostAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.stats();
        f.debug_struct("HostAllocator")
            .field("memory", &s.memory.name())
            .field("allocated_bytes", &s.allocated_bytes.current)
            .field("reserved_bytes", &s.reserved_bytes.current)
            .finish()
    }
}

/// How many blocks and bytes the host cache holds, by state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCacheState {
    /// Free blocks, reusable now.
    pub cached_blocks: usize,
    /// Their bytes.
    pub cached_bytes: u64,
    /// Freed blocks still waiting for stream work.
    pub pending_blocks: usize,
    /// Their bytes.
    pub pending_bytes: u64,
}

impl HostAllocator {
    fn with_source(source: Source) -> Arc<Self> {
        let kind = match source {
            Source::Heap => HostMemoryKind::Heap,
            #[cfg(feature = "cuda")]
            Source::Cuda(_) => HostMemoryKind::Pinned,
        };
        Arc::new(HostAllocator {
            inner: Mutex::new(HostInner { free: BTreeMap::new(), pending: Vec::new(), stats: HostStats::new(kind) }),
            source,
        })
    }

    /// A host allocator of plain heap memory (for the simulated device).
    pub fn simulated() -> Arc<Self> {
        Self::with_source(Source::Heap)
    }

    /// A host allocator of page-locked memory through `ctx` (portable: usable with every
    /// device).
    #[cfg(feature = "cuda")]
    pub fn pinned(ctx: Arc<CudaContext>) -> Arc<Self> {
        Self::with_source(Source::Cuda(ctx))
    }

    /// The host allocator that fits `alloc`'s device: page-locked memory through its context on
    /// a CUDA device, heap memory on the simulated device.
    pub fn for_device(alloc: &Arc<Allocator>) -> Arc<Self> {
        #[cfg(feature = "cuda")]
        if let Some(ctx) = alloc.with_state(|_, b| b.as_cuda().map(|c| Arc::clone(c.context()))) {
            return Self::pinned(ctx);
        }
        let _ = alloc;
        Self::simulated()
    }

    fn lock(&self) -> MutexGuard<'_, HostInner> {
        // Every transition completes before anything can panic; a poisoned lock is recovered.
        lock(&self.inner)
    }

    /// What the blocks are.
    pub fn memory_kind(&self) -> HostMemoryKind {
        self.lock().stats.memory
    }

    /// `torch.cuda.host_memory_stats()` as a struct.
    pub fn stats(&self) -> HostStats {
        let mut s = self.lock().stats;
        s.num_host_alloc = s.segment.allocated;
        s.num_host_free = s.segment.freed;
        s
    }

    /// `torch.cuda.host_memory_stats()`: the flat, sorted key map.
    pub fn host_memory_stats(&self) -> BTreeMap<String, i64> {
        self.stats().host_memory_stats()
    }

    /// `torch.cuda.reset_peak_host_memory_stats()`.
    pub fn reset_peak_host_memory_stats(&self) {
        let mut g = self.lock();
        let s = &mut g.stats;
        for st in [&mut s.allocation, &mut s.segment, &mut s.allocated_bytes, &mut s.reserved_bytes] {
            st.peak = st.current;
        }
        for d in [&mut s.host_alloc_time, &mut s.host_free_time] {
            d.max = 0;
            d.min = 0;
        }
    }

    /// `torch.cuda.reset_accumulated_host_memory_stats()`.
    pub fn reset_accumulated_host_memory_stats(&self) {
        let mut g = self.lock();
        let s = &mut g.stats;
        for st in [&mut s.allocation, &mut s.segment, &mut s.allocated_bytes, &mut s.reserved_bytes] {
            st.allocated = 0;
            st.freed = 0;
        }
        for d in [&mut s.host_alloc_time, &mut s.host_free_time] {
            d.total = 0;
            d.count = 0;
        }
    }

    /// Cached and pending blocks now (pending events are not queried here).
    pub fn cache_state(&self) -> HostCacheState {
        let g = self.lock();
        let mut st = HostCacheState::default();
        for b in g.free.values().flatten() {
            st.cached_blocks += 1;
            st.cached_bytes += b.size;
        }
        for (b, _) in &g.pending {
            st.pending_blocks += 1;
            st.pending_bytes += b.size;
        }
        st
    }

    /// `torch.cuda.empty_cache()` for host memory (PyTorch's `CachingHostAllocator_emptyCache`):
    /// pending blocks whose stream work has completed become free, then every free block goes
    /// back to the system. Blocks in use or still pending stay.
    pub fn empty_cache(&self) -> Result<()> {
        let (blocks, events) = {
            let mut g = self.lock();
            let events = g.process_events();
            let blocks: Vec<HostBlock> = std::mem::take(&mut g.free).into_values().flatten().collect();
            for b in &blocks {
                g.stats.segment.decrease(1);
                g.stats.reserved_bytes.decrease(b.size as i64);
            }
            (blocks, events)
        };
        let mut times = Vec::with_capacity(blocks.len());
        for b in blocks {
            let t = Instant::now();
            drop(b.memory);
            times.push(t.elapsed().as_micros() as i64);
        }
        let mut g = self.lock();
        for us in times {
            g.stats.host_free_time.increase(us);
        }
        events
    }

    /// Hands out a block of at least `bytes` (> 0) bytes, typed for `T`.
    fn allocate<T: Element>(&self, bytes: u64) -> Result<(u64, Mem<T>)> {
        let size = bytes.checked_next_power_of_two().filter(|&s| s <= 1 << 62).ok_or_else(|| {
            Error::InvalidArgument(format!("a host block of {bytes} bytes is larger than the host can hold"))
        })?;
        {
            let mut g = self.lock();
            g.process_events()?;
            if let Some(block) = g.free.get_mut(&size_index(size)).and_then(Vec::pop) {
                g.stats.allocation.increase(1);
                g.stats.allocated_bytes.increase(size as i64);
                return Ok((size, typed::<T>(block)));
            }
        }
        // A new block, allocated outside the lock.
        let t = Instant::now();
        let mem = match &self.source {
            Source::Heap => Mem::Heap(vec![T::ZERO; heap_len::<T>(size)]),
            #[cfg(feature = "cuda")]
            Source::Cuda(ctx) => {
                let n = usize::try_from(size).map_err(|_| DeviceError::Driver(format!("{size} bytes")))?;
                Mem::Pinned(PinnedHostMemory::alloc(ctx, n).map_err(|e| match e {
                    DeviceError::OutOfMemory => Error::Device(DeviceError::Driver(format!(
                        "CUDA_ERROR_OUT_OF_MEMORY in cuMemHostAlloc: the host could not pin {} (a block of {})",
                        iec(bytes),
                        iec(size)
                    ))),
                    e => Error::Device(e),
                })?)
            }
        };
        let us = t.elapsed().as_micros() as i64;
        let mut g = self.lock();
        let s = &mut g.stats;
        s.host_alloc_time.increase(us);
        s.segment.increase(1);
        s.reserved_bytes.increase(size as i64);
        s.allocation.increase(1);
        s.allocated_bytes.increase(size as i64);
        Ok((size, mem))
    }

    /// Takes back a block from a dropped buffer: reusable at once without outstanding uses,
    /// pending otherwise.
    fn release(&self, block: HostBlock, uses: Vec<Use>) {
        let mut g = self.lock();
        if uses.is_empty() {
            g.make_reusable(block);
        } else {
            g.pending.push((block, uses));
        }
    }
}

impl Drop for HostAllocator {
    /// Waits for the stream work of pending blocks (releasing their events), then lets every
    /// block go. Never panics.
    fn drop(&mut self) {
        let g = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, uses) in g.pending.drain(..) {
            for u in uses {
                let _ = u.alloc.with_state(|_, b| b.synchronize_event(u.event));
            }
        }
    }
}

/// Elements of `T` in a heap block of `size` bytes (all of them, so a reused block fits any
/// request of its size class).
fn heap_len<T>(size: u64) -> usize {
    (size as usize) / std::mem::size_of::<T>().max(1)
}

/// A cached block's memory, typed for `T` (heap memory of another element type is replaced by
/// fresh memory of the same size class).
fn typed<T: Element>(block: HostBlock) -> Mem<T> {
    match block.memory {
        BlockMemory::Heap(any) => match any.downcast::<Vec<T>>() {
            Ok(v) => Mem::Heap(*v),
            Err(_) => Mem::Heap(vec![T::ZERO; heap_len::<T>(block.size)]),
        },
        #[cfg(feature = "cuda")]
        BlockMemory::Pinned(m) => Mem::Pinned(m),
    }
}

fn untyped<T: Element>(mem: Mem<T>) -> BlockMemory {
    match mem {
        Mem::Heap(v) => BlockMemory::Heap(Box::new(v)),
        #[cfg(feature = "cuda")]
        Mem::Pinned(m) => BlockMemory::Pinned(m),
    }
}

/// The cudarc stream `stream` of a CUDA allocator.
#[cfg(feature = "cuda")]
fn cuda_stream(alloc: &Arc<Allocator>, stream: StreamId) -> Result<Arc<CudaStream>> {
    alloc.with_state(|_, b| b.as_cuda().and_then(|c| c.stream(stream))).ok_or_else(|| {
        Error::Device(DeviceError::Driver(format!(
            "CUDA_ERROR_INVALID_HANDLE: stream {:#x} is unknown to the allocator",
            stream.0
        )))
    })
}

/// `len` values of `T` in one block of the host cache (page-locked on a CUDA device). Dropping
/// the buffer returns the block to the cache; the block is reused only after the stream work
/// that used it has completed.
pub struct PinnedBuffer<T: Element> {
    host: Arc<HostAllocator>,
    /// The block's size, `None` when the buffer takes no bytes.
    block: Option<u64>,
    mem: Mem<T>,
    len: usize,
    /// Events recorded after each use by stream work.
    uses: Mutex<Vec<Use>>,
    /// Streams named by `record_stream`: an event is recorded on each when the buffer drops.
    streams: Mutex<Vec<(Arc<Allocator>, StreamId)>>,
}

impl<T: Element> fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("block_size", &self.block_size())
            .field("memory", &self.memory_kind().name())
            .finish()
    }
}

impl<T: Element> PinnedBuffer<T> {
    /// A buffer of `len` values from `host`'s cache. The contents are whatever the block held
    /// (zeros for a new block). `len × size_of::<T>() == 0` takes no block.
    pub fn alloc(host: &Arc<HostAllocator>, len: usize) -> Result<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!("PinnedBuffer of {len} × {} overflows", std::any::type_name::<T>()))
        })?;
        let (block, mem) = if bytes == 0 {
            (None, Mem::Heap(vec![T::ZERO; len]))
        } else {
            let (size, mem) = host.allocate::<T>(bytes as u64)?;
            (Some(size), mem)
        };
        Ok(PinnedBuffer {
            host: Arc::clone(host),
            block,
            mem,
            len,
            uses: Mutex::new(Vec::new()),
            streams: Mutex::new(Vec::new()),
        })
    }

    /// A buffer holding a copy of `src`.
    pub fn from_slice(host: &Arc<HostAllocator>, src: &[T]) -> Result<Self> {
        let mut b = Self::alloc(host, src.len())?;
        b.copy_from_slice(src)?;
        Ok(b)
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the values (`len × size_of::<T>()`).
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Bytes of the block (a power of two; 0 without a block).
    pub fn block_size(&self) -> u64 {
        self.block.unwrap_or(0)
    }

    /// What the memory is.
    pub fn memory_kind(&self) -> HostMemoryKind {
        match self.mem {
            Mem::Heap(_) => HostMemoryKind::Heap,
            #[cfg(feature = "cuda")]
            Mem::Pinned(_) => HostMemoryKind::Pinned,
        }
    }

    /// The host address of the first value (identity of the block: a reused block has the same
    /// address).
    pub fn as_ptr(&self) -> *const T {
        match &self.mem {
            Mem::Heap(v) => v.as_ptr(),
            #[cfg(feature = "cuda")]
            Mem::Pinned(m) => m.as_ptr().cast(),
        }
    }

    /// The values, once every queued copy into the buffer has completed.
    pub fn as_slice(&self) -> Result<&[T]> {
        match &self.mem {
            Mem::Heap(v) => Ok(&v[..self.len]),
            #[cfg(feature = "cuda")]
            Mem::Pinned(m) => Ok(m.as_slice(self.len)?),
        }
    }

    /// The values, mutably, once every queued copy from or into the buffer has completed.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        let len = self.len;
        match &mut self.mem {
            Mem::Heap(v) => Ok(&mut v[..len]),
            #[cfg(feature = "cuda")]
            Mem::Pinned(m) => Ok(m.as_mut_slice(len)?),
        }
    }

    /// Overwrites the values with `src` (exactly [`PinnedBuffer::len`] of them).
    pub fn copy_from_slice(&mut self, src: &[T]) -> Result<()> {
        self.check_len(src.len(), "slice")?;
        self.as_mut_slice()?.copy_from_slice(src);
        Ok(())
    }

    /// The values in a new `Vec` (after every queued copy into the buffer has completed).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        Ok(self.as_slice()?.to_vec())
    }

    fn check_len(&self, other: usize, what: &str) -> Result<()> {
        if other == self.len {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "copy between a PinnedBuffer of {} values and a {what} of {other}",
                self.len
            )))
        }
    }

    /// The block was used by work on `stream` of `alloc`'s device: an event marks the point.
    fn note_use(&self, alloc: &Arc<Allocator>, stream: StreamId) -> Result<()> {
        if self.block.is_none() {
            return Ok(());
        }
        let event = alloc.with_state(|_, b| b.record_event(stream))?;
        lock(&self.uses).push(Use { alloc: Arc::clone(alloc), event });
        Ok(())
    }

    /// `record_stream` for host memory: the block is used by work on `stream` of `alloc`'s
    /// device that this buffer does not know about; when the buffer is dropped an event is
    /// recorded there, and the block is reused only after it completes.
    pub fn record_stream(&self, alloc: &Arc<Allocator>, stream: StreamId) {
        let mut s = lock(&self.streams);
        if !s.iter().any(|(a, st)| Arc::ptr_eq(a, alloc) && *st == stream) {
            s.push((Arc::clone(alloc), stream));
        }
    }

    /// Copies the buffer into `dst` on `stream` of `dst`'s device: queued without waiting
    /// (`cuMemcpyHtoDAsync`) for page-locked memory and a CUDA buffer; otherwise done at once
    /// (the simulated device, or heap memory). `dst` must hold exactly as many values. When
    /// `stream` is not `dst`'s own stream, `dst` is marked used there (`record_stream`), so its
    /// block is not reused before the copy.
    pub fn copy_to_device_async(&self, dst: &mut DeviceBuffer<T>, stream: StreamId) -> Result<()> {
        self.check_len(dst.len(), "DeviceBuffer")?;
        let alloc = Arc::clone(dst.allocator());
        if !self.queue_upload(dst, stream)? {
            dst.copy_from_host(self.as_slice()?)?;
        }
        if stream != dst.stream() {
            dst.record_stream(stream)?;
        }
        self.note_use(&alloc, stream)
    }

    /// Copies `src` into the buffer on `stream` of `src`'s device: queued without waiting
    /// (`cuMemcpyDtoHAsync`) for page-locked memory and a CUDA buffer (the slices wait for it);
    /// otherwise done at once. `src` must hold exactly as many values.
    pub fn copy_from_device_async(&mut self, src: &DeviceBuffer<T>, stream: StreamId) -> Result<()> {
        self.check_len(src.len(), "DeviceBuffer")?;
        let alloc = Arc::clone(src.allocator());
        if !self.queue_download(src, stream)? {
            let v = src.to_host()?;
            self.as_mut_slice()?.copy_from_slice(&v);
        }
        if stream != src.stream() {
            src.record_stream(stream)?;
        }
        self.note_use(&alloc, stream)
    }

    /// Queues `cuMemcpyHtoDAsync` when the buffer is page-locked and `dst` is on a CUDA device;
    /// `false` when the copy must be done otherwise.
    #[cfg(feature = "cuda")]
    fn queue_upload(&self, dst: &mut DeviceBuffer<T>, stream: StreamId) -> Result<bool> {
        match &self.mem {
            Mem::Pinned(m) if dst.allocator().backend_kind() == crate::device::BackendKind::Cuda => {
                let s = cuda_stream(dst.allocator(), stream)?;
                m.copy_to_device_async(&mut dst.cuda_mut()?, &s)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    #[cfg(not(feature = "cuda"))]
    fn queue_upload(&self, _dst: &mut DeviceBuffer<T>, _stream: StreamId) -> Result<bool> {
        Ok(false)
    }

    /// Queues `cuMemcpyDtoHAsync` when the buffer is page-locked and `src` is on a CUDA device;
    /// `false` when the copy must be done otherwise.
    #[cfg(feature = "cuda")]
    fn queue_download(&mut self, src: &DeviceBuffer<T>, stream: StreamId) -> Result<bool> {
        match &mut self.mem {
            Mem::Pinned(m) if src.allocator().backend_kind() == crate::device::BackendKind::Cuda => {
                let s = cuda_stream(src.allocator(), stream)?;
                m.copy_from_device_async(&src.cuda()?, &s)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    #[cfg(not(feature = "cuda"))]
    fn queue_download(&mut self, _src: &DeviceBuffer<T>, _stream: StreamId) -> Result<bool> {
        Ok(false)
    }

    /// A new device buffer on `stream` of `alloc`'s device holding a copy of this buffer
    /// (queued, as [`PinnedBuffer::copy_to_device_async`]).
    pub fn to_device(&self, alloc: &Arc<Allocator>, stream: StreamId) -> Result<DeviceBuffer<T>> {
        let mut d = DeviceBuffer::alloc(alloc, self.len, stream)?;
        self.copy_to_device_async(&mut d, stream)?;
        Ok(d)
    }
}

impl<T: Element> Drop for PinnedBuffer<T> {
    /// Returns the block to the cache, with the events of its uses (and one recorded now on each
    /// stream named by `record_stream`). Never panics; an event that cannot be recorded is left
    /// out (the memory itself stays safe: page-locked memory waits for its own copies).
    fn drop(&mut self) {
        let Some(size) = self.block.take() else { return };
        let mut uses = std::mem::take(&mut *lock(&self.uses));
        for (alloc, stream) in std::mem::take(&mut *lock(&self.streams)) {
            if let Ok(event) = alloc.with_state(|_, b| b.record_event(stream)) {
                uses.push(Use { alloc, event });
            }
        }
        let mem = std::mem::replace(&mut self.mem, Mem::Heap(Vec::new()));
        self.host.release(HostBlock { size, memory: untyped(mem) }, uses);
    }
}

crate::render::evcxr_display!(HostStats);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_stat_matches_c10() {
        let mut d = DurationStat::default();
        assert_eq!(d.avg(), 0);
        d.increase(10);
        d.increase(4);
        d.increase(7);
        assert_eq!(d, DurationStat { total: 21, max: 10, min: 4, count: 3 });
        assert_eq!(d.avg(), 7);
    }

    #[test]
    fn size_classes_are_powers_of_two() {
        assert_eq!(size_index(1), 0);
        assert_eq!(size_index(4096), 12);
        assert_eq!(heap_len::<u32>(4096), 1024);
        assert_eq!(heap_len::<[u16; 3]>(8), 1);
    }
}
