//! The thread-safe front: one [`CachingAllocator`] per device, a mutex around the policy
//! state and its backend, and PyTorch's `torch.cuda` memory API as methods.
//!
//! # Locking
//! Every public method takes the lock once and delegates to the policy's `DeviceState`;
//! helpers never re-lock. Stacks for history are captured before the lock is taken.
#![forbid(unsafe_code)]

use crate::device::{Backend, BackendKind, DeviceError, LostContext, PoolUsage, StreamId};
use crate::policy::config::AllocatorConfig;
use crate::policy::{AllocError, Allocation, BlockId, BlockView, DeviceState, InvariantViolation, SegmentView};
use crate::record::history::{HistoryOptions, RecordMode, StackContext, TraceEntry};
use crate::snapshot::{RawSnapshot, Snapshot};
use crate::stats::{DeviceStats, SlotId, SlotPeaks};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

struct Inner<B> {
    state: DeviceState,
    backend: B,
}

/// Called with the report when an allocation runs out of memory, on the allocating thread,
/// outside the allocator's lock and before the error is returned (see
/// [`CachingAllocator::set_oom_observer`]).
pub type OomObserver = Arc<dyn Fn(&crate::error::OomReport) + Send + Sync>;

/// A block handed out or taken back, told to the block observer
/// ([`CachingAllocator::set_block_observer`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockChange<'a> {
    /// Handed out (`true`) or freed.
    pub alloc: bool,
    /// The block's address.
    pub addr: u64,
    /// Its (rounded) size.
    pub size: u64,
    /// The allocating stack, when stacks are taken (an allocation only).
    pub frames: Option<&'a [usize]>,
}

/// Told of every block handed out or freed, on the calling thread, outside the allocator's
/// lock (the process's tracking keeps the cell's changes for components' peaks).
pub(crate) type BlockObserver = Arc<dyn Fn(i32, BlockChange<'_>) + Send + Sync>;

/// The allocator of a device picked at run time (CUDA or simulated): what [`crate::device()`] and
/// [`crate::current`] hand out, and what a [`crate::DeviceBuffer`] allocates from.
pub type Allocator = CachingAllocator<crate::device::any::AnyBackend>;

/// PyTorch's caching allocator for one device, over backend `B`.
pub struct CachingAllocator<B: Backend> {
    inner: Mutex<Inner<B>>,
    device: i32,
    kind: BackendKind,
    /// What makes an operation leave the fast path ([`STACKS`], [`OBSERVED`], [`LOST`]): read
    /// without the lock, one load on every malloc and free, which take the fast path when it
    /// is 0.
    flags: AtomicU8,
    /// How many frames each captured stack walks ([`Self::set_stack_depth`]): data of this
    /// allocator, so every cell of an evcxr session sees one setting.
    stack_depth: AtomicUsize,
    /// Told of every out-of-memory failure (data of this allocator, so every copy of the crate
    /// in an evcxr process reaches the same one).
    oom_observer: Mutex<Option<OomObserver>>,
    block_observer: Mutex<Option<BlockObserver>>,
    /// The device's lost context, once any call reported one: from then on the allocator
    /// touches the device no more (no frees into a dead context, no panics from drops).
    lost: Mutex<Option<LostContext>>,
}

/// A flag: operations capture their stack.
const STACKS: u8 = 1;
/// A flag: a block observer is set.
const OBSERVED: u8 = 2;
/// A flag: `lost` is set.
const LOST: u8 = 4;

impl<B: Backend> std::fmt::Debug for CachingAllocator<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator").field("device", &self.device).field("backend", &self.kind.name()).finish()
    }
}

impl<B: Backend> CachingAllocator<B> {
    /// An allocator over `backend` with `config`.
    pub fn new(backend: B, config: AllocatorConfig) -> Self {
        let device = backend.device_index();
        let kind = backend.kind();
        CachingAllocator {
            inner: Mutex::new(Inner { state: DeviceState::new(device, config), backend }),
            device,
            kind,
            flags: AtomicU8::new(0),
            stack_depth: AtomicUsize::new(crate::record::frames::DEFAULT_DEPTH),
            oom_observer: Mutex::new(None),
            block_observer: Mutex::new(None),
            lost: Mutex::new(None),
        }
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, Inner<B>> {
        // A panic while holding the lock cannot leave the state half-updated in a way later
        // calls trip over (transitions complete before anything can panic), so recover.
        crate::sync::lock(&self.inner)
    }

    /// Device index.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// What backs this allocator (real GPU, simulated, replay).
    pub fn backend_kind(&self) -> BackendKind {
        self.kind
    }

    /// Runs `f` with the state and backend under the lock.
    #[inline]
    pub(crate) fn with_state<R>(&self, f: impl FnOnce(&mut DeviceState, &mut B) -> R) -> R {
        let mut g = self.lock();
        let Inner { state, backend } = &mut *g;
        f(state, backend)
    }

    /// Runs `f` with the backend under the allocator's lock: what the backend itself offers
    /// (on the simulated device: mark streams busy, refuse the next reservations; on a GPU: the
    /// cudarc context and streams). The allocator's own state is not reachable from here.
    pub fn with_backend<R>(&self, f: impl FnOnce(&mut B) -> R) -> R {
        self.with_state(|_, b| f(b))
    }

    /// The configuration this allocator runs with (`GPUMEM_NB_ALLOC_CONF`).
    pub fn config(&self) -> AllocatorConfig {
        self.with_state(|s, _| s.config().clone())
    }

    /// An allocated or cached block by id (`None` once it is merged away or released).
    pub fn block(&self, block: BlockId) -> Option<BlockView> {
        self.with_state(|s, _| s.block(block))
    }

    /// The per-process limit in bytes that a memory fraction set, if one is set.
    pub fn allowed_bytes(&self) -> Option<u64> {
        self.with_state(|s, _| s.allowed_bytes())
    }

    /// Where the reserved bytes are: what the program asked for, rounding, frees waiting for
    /// streams, free cached blocks by pool and size class, and what [`Self::empty_cache`] would
    /// return now; the parts add up to [`Self::memory_reserved`] ([`ReservedParts`](crate::blocks::ReservedParts)). Walks
    /// every block and copies the state once (without its history): for reports, not hot loops.
    pub fn reserved_parts(&self) -> crate::policy::ReservedParts {
        self.with_state(|s, _| s.reserved_parts())
    }

    /// The CUDA stream-ordered pool of this device (cudarc's `CudaSlice` and candle allocate
    /// there): used and reserved bytes with their high-water marks. `None` without one.
    pub fn pool_usage(&self) -> Option<PoolUsage> {
        if self.lost().is_some() {
            return None;
        }
        self.with_state(|_, b| b.pool_usage())
    }

    /// A new stream on this device (a CUDA stream, or a simulated one).
    pub fn new_stream(&self) -> Result<StreamId, DeviceError> {
        self.alive()?;
        self.note(self.with_state(|_, b| b.new_stream()))
    }

    /// The caller's stack when stacks are being recorded, captured before the lock is taken.
    #[inline]
    fn op_context(&self) -> Option<crate::record::frames::Frames> {
        if self.flags.load(Ordering::Relaxed) & STACKS != 0 {
            Some(crate::record::frames::capture_depth(self.stack_depth.load(Ordering::Relaxed)))
        } else {
            None
        }
    }

    /// Sets (`on`) or clears one of the bits of `flags`.
    fn set_flag(&self, flag: u8, on: bool) {
        if on {
            self.flags.fetch_or(flag, Ordering::Relaxed);
        } else {
            self.flags.fetch_and(!flag, Ordering::Relaxed);
        }
    }

    /// How many frames each stack of this allocator's history walks (1 ..= 64, clamped; 12 by
    /// default). Each frame costs about 150 ns per recorded event (BENCHMARKS.md). The
    /// tracked allocations of the whole process have their own depth
    /// (`gpumem_nb::tracking::set_stack_depth`).
    pub fn set_stack_depth(&self, frames: usize) {
        self.stack_depth.store(frames.clamp(1, crate::record::frames::MAX_FRAMES), Ordering::Relaxed);
    }

    /// How many frames each stack of this allocator's history walks.
    pub fn stack_depth(&self) -> usize {
        self.stack_depth.load(Ordering::Relaxed)
    }

    /// Runs `f` under the lock with the operation's stack (if recorded) made current.
    #[inline]
    fn with_context<R>(&self, f: impl FnOnce(&mut DeviceState, &mut B) -> R) -> R {
        let ctx = self.op_context();
        self.with_state(|s, b| Self::in_context(s, b, ctx, f))
    }

    /// A malloc's [`Self::with_context`]: the stack already captured (`ctx`), and the caller's
    /// component stamp (`gpumem_nb::component`) made current for `component_bytes`. Only an
    /// allocation reads the stamp (a block takes its component when it is handed out; a free,
    /// an `empty_cache` find theirs on the block), so only a malloc looks it up.
    #[inline]
    fn with_stamp<R>(
        &self,
        ctx: Option<crate::record::frames::Frames>,
        f: impl FnOnce(&mut DeviceState, &mut B) -> R,
    ) -> R {
        let component = crate::record::component::current();
        self.with_state(|s, b| {
            s.set_component(component);
            let r = Self::in_context(s, b, ctx, f);
            s.set_component(None);
            r
        })
    }

    /// Runs `f` on the locked state with `ctx` as the operation's stack.
    #[inline]
    fn in_context<R>(
        s: &mut DeviceState,
        b: &mut B,
        ctx: Option<crate::record::frames::Frames>,
        f: impl FnOnce(&mut DeviceState, &mut B) -> R,
    ) -> R {
        if ctx.is_some() {
            s.set_op_context(ctx);
            let r = f(s, b);
            s.set_op_context(None);
            r
        } else {
            f(s, b)
        }
    }

    /// The device's lost CUDA context, once a call on it reported one (a kernel's illegal address,
    /// a device-side assert, …): every later operation of this allocator then fails with
    /// [`DeviceError::ContextLost`] without touching the device, and frees are dropped.
    pub fn lost(&self) -> Option<LostContext> {
        if self.flags.load(Ordering::Acquire) & LOST != 0 { crate::sync::lock(&self.lost).clone() } else { None }
    }

    /// Notes what a device call returned: a lost context is kept (the first one wins).
    #[inline]
    pub(crate) fn note<T>(&self, r: Result<T, DeviceError>) -> Result<T, DeviceError> {
        if let Err(DeviceError::ContextLost(l)) = &r {
            self.keep_lost(l);
        }
        r
    }

    /// [`Self::note`]'s rare half: keeps the first lost context.
    #[cold]
    #[inline(never)]
    fn keep_lost(&self, l: &LostContext) {
        let mut lost = crate::sync::lock(&self.lost);
        if lost.is_none() {
            *lost = Some(l.clone());
            self.flags.fetch_or(LOST, Ordering::Release);
        }
    }

    /// `Err` once the context is lost: one atomic load on every operation, the error built out
    /// of line.
    #[inline]
    fn alive(&self) -> Result<(), DeviceError> {
        if self.flags.load(Ordering::Acquire) & LOST != 0 { self.dead() } else { Ok(()) }
    }

    /// [`Self::alive`]'s error.
    #[cold]
    #[inline(never)]
    fn dead(&self) -> Result<(), DeviceError> {
        match self.lost() {
            Some(l) => Err(DeviceError::ContextLost(l)),
            None => Ok(()),
        }
    }

    /// `torch.cuda.synchronize()`: waits until everything queued on the device so far has run.
    /// A kernel's fault launched earlier is reported here (CUDA reports faults asynchronously),
    /// and the context is noted as lost.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        self.alive()?;
        // The wait runs outside the allocator's lock where the backend allows it: a long
        // kernel then holds up no other call of the allocator.
        let r = match self.with_state(|_, b| b.synchronizer()) {
            Some(wait) => wait(),
            None => self.with_state(|_, b| b.synchronize()),
        };
        self.note(r)
    }

    /// A point where the device reports what the work queued before it did (`call` names the
    /// copy it stands for): on the simulated device, where an injected fault fires.
    pub(crate) fn fault_point(&self, call: &'static str) -> Result<(), DeviceError> {
        self.alive()?;
        self.note(self.with_state(|_, b| b.fault_point(call)))
    }

    /// Allocates `size` bytes on `stream` (the raw API; [`crate::DeviceBuffer`] is the safe one).
    #[inline]
    pub fn malloc(&self, size: u64, stream: StreamId) -> Result<Allocation, AllocError> {
        // One load decides. With no flag set (alive, no stack to capture, no observer) the
        // allocation goes straight to the lock; otherwise one function does the rest, so a
        // captured stack holds as many of this crate's frames as it always did.
        let flags = self.flags.load(Ordering::Acquire);
        if flags != 0 {
            return if flags & OBSERVED != 0 {
                self.malloc_observed(size, stream)
            } else {
                self.malloc_flagged(size, stream)
            };
        }
        let r = self.with_stamp(None, |s, b| s.malloc(b, size, stream));
        if r.is_err() {
            self.after_malloc(&r);
        }
        r
    }

    /// [`Self::malloc`] with a flag set but no observer: a lost context, a stack to capture.
    #[inline(never)]
    fn malloc_flagged(&self, size: u64, stream: StreamId) -> Result<Allocation, AllocError> {
        self.alive()?;
        let r = self.with_stamp(self.op_context(), |s, b| s.malloc(b, size, stream));
        if r.is_err() {
            self.after_malloc(&r);
        }
        r
    }

    /// [`Self::malloc`] with the block observer told.
    #[inline(never)]
    fn malloc_observed(&self, size: u64, stream: StreamId) -> Result<Allocation, AllocError> {
        self.alive()?;
        let frames = self.op_context();
        let r = self.with_stamp(frames.clone(), |s, b| s.malloc(b, size, stream));
        if let Ok(a) = &r
            && a.size > 0
            && let Some(observe) = crate::sync::lock(&self.block_observer).clone()
        {
            observe(self.device, BlockChange { alloc: true, addr: a.addr, size: a.size, frames: frames.as_deref() });
        }
        if r.is_err() {
            self.after_malloc(&r);
        }
        r
    }

    /// What a failed malloc tells: a lost context noted, an out-of-memory observed.
    #[cold]
    #[inline(never)]
    fn after_malloc(&self, r: &Result<Allocation, AllocError>) {
        if let Err(AllocError::Device(e)) = &r {
            let _ = self.note(Err::<(), _>(e.clone()));
        }
        if let Err(AllocError::OutOfMemory(report)) = &r {
            let observer = crate::sync::lock(&self.oom_observer).clone();
            if let Some(observe) = observer {
                observe(report);
            }
        }
    }

    /// Sets what is told of every block handed out or freed (`None`: nothing).
    pub(crate) fn set_block_observer(&self, observer: Option<BlockObserver>) {
        let on = observer.is_some();
        *crate::sync::lock(&self.block_observer) = observer;
        self.set_flag(OBSERVED, on);
    }

    /// Sets what is told of every out-of-memory failure of [`CachingAllocator::malloc`], at the
    /// moment it happens (`None`: nothing). It may take a snapshot (the state still holds what
    /// the failing code held); it must not allocate from this allocator.
    pub fn set_oom_observer(&self, observer: Option<OomObserver>) {
        *crate::sync::lock(&self.oom_observer) = observer;
    }

    /// Frees a block from [`CachingAllocator::malloc`]. Freeing a block twice is an error value.
    #[inline]
    pub fn free(&self, block: BlockId) -> Result<(), DeviceError> {
        // As in `malloc`: one load, and with a flag set one function for the rest.
        if self.flags.load(Ordering::Acquire) != 0 {
            return self.free_flagged(block);
        }
        self.note(self.with_state(|s, b| s.free(b, block)))
    }

    /// [`Self::free`] with a flag set: a lost context, a stack to capture, an observer.
    #[inline(never)]
    fn free_flagged(&self, block: BlockId) -> Result<(), DeviceError> {
        self.alive()?;
        let ctx = self.op_context();
        if self.flags.load(Ordering::Relaxed) & OBSERVED == 0 {
            return self.note(self.with_state(|s, b| Self::in_context(s, b, ctx, |s, b| s.free(b, block))));
        }
        let r = self.note(self.with_state(|s, b| {
            Self::in_context(s, b, ctx, |s, b| {
                let freed = s.allocated_block(block);
                s.free(b, block).map(|()| freed)
            })
        }));
        if let Ok(Some((addr, size))) = r
            && let Some(observe) = crate::sync::lock(&self.block_observer).clone()
        {
            observe(self.device, BlockChange { alloc: false, addr, size, frames: None });
        }
        r.map(|_| ())
    }

    /// `record_stream`: the block is used on `stream` too; its reuse waits for that stream.
    pub fn record_stream(&self, block: BlockId, stream: StreamId) -> Result<(), DeviceError> {
        self.with_state(|s, _| s.record_stream(block, stream))
    }

    /// `torch.cuda.empty_cache()`.
    pub fn empty_cache(&self) -> Result<(), DeviceError> {
        self.alive()?;
        self.note(self.with_context(|s, b| s.empty_cache(b)))
    }

    /// A copy of the statistics.
    pub fn stats(&self) -> DeviceStats {
        self.with_state(|s, _| s.stats().clone())
    }

    /// `torch.cuda.memory_stats()`: PyTorch 2.11's 122 sorted keys; once a block was allocated
    /// under a component stamp (`gpumem_nb::component`), also
    /// `component_bytes.{component}.{allocated,current,freed,peak}` for every component, as
    /// pytorch/pytorch #182387 keys them (an unstamped block is `other`).
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.with_state(|s, _| {
            let mut m = s.stats().memory_stats();
            for (c, stat) in s.component_bytes().unwrap_or_default() {
                for (k, v) in [
                    ("allocated", stat.allocated),
                    ("current", stat.current),
                    ("freed", stat.freed),
                    ("peak", stat.peak),
                ] {
                    m.insert(format!("component_bytes.{}.{k}", c.key()), v);
                }
            }
            m
        })
    }

    /// `torch.cuda.memory_allocated()`: bytes in allocated blocks.
    pub fn memory_allocated(&self) -> u64 {
        self.with_state(|s, _| s.stats().allocated_bytes[0].current as u64)
    }

    /// `torch.cuda.max_memory_allocated()`.
    pub fn max_memory_allocated(&self) -> u64 {
        self.with_state(|s, _| s.stats().allocated_bytes[0].peak as u64)
    }

    /// `torch.cuda.memory_reserved()`: bytes obtained from the device.
    pub fn memory_reserved(&self) -> u64 {
        self.with_state(|s, _| s.stats().reserved_bytes[0].current as u64)
    }

    /// `torch.cuda.max_memory_reserved()`.
    pub fn max_memory_reserved(&self) -> u64 {
        self.with_state(|s, _| s.stats().reserved_bytes[0].peak as u64)
    }

    /// `torch.cuda.reset_peak_memory_stats()`. Peak slots are not touched.
    pub fn reset_peak_memory_stats(&self) {
        self.with_state(|s, _| s.reset_peak_stats())
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated_memory_stats(&self) {
        self.with_state(|s, _| s.reset_accumulated_stats())
    }

    /// `torch.cuda.mem_get_info()`: `(free, total)` bytes of the whole device.
    pub fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        self.alive()?;
        self.note(self.with_state(|_, b| b.mem_get_info()))
    }

    /// `torch.cuda.memory_summary()`, PyTorch's text.
    pub fn memory_summary(&self, abbreviated: bool) -> String {
        crate::stats::summary::memory_summary(&self.memory_stats(), self.device, abbreviated)
    }

    /// `torch.cuda.set_per_process_memory_fraction()`.
    pub fn set_per_process_memory_fraction(&self, fraction: f64) -> Result<(), crate::error::Error> {
        self.with_state(|s, b| s.set_memory_fraction(fraction, b.total_memory()))
            .map_err(crate::error::Error::InvalidArgument)
    }

    /// `torch.cuda.get_per_process_memory_fraction()`.
    pub fn get_per_process_memory_fraction(&self) -> f64 {
        self.with_state(|s, b| s.memory_fraction(b.total_memory()))
    }

    /// Starts (or stops, with `Off`) recording allocator events, without stacks.
    pub fn record_memory_history(&self, mode: RecordMode, max_entries: usize) {
        self.record_memory_history_with(HistoryOptions { enabled: mode, context: StackContext::None, max_entries });
    }

    /// `torch.cuda.memory._record_memory_history(enabled, context, max_entries)`: what to record
    /// and where to keep stacks (captured cheaply, symbolised when a snapshot is taken).
    pub fn record_memory_history_with(&self, opts: HistoryOptions) {
        self.with_state(|s, _| {
            s.history.set_mode(opts.enabled, opts.max_entries);
            s.history.set_context(opts.context);
        });
        let on = opts.enabled != RecordMode::Off && opts.context != StackContext::None;
        self.set_flag(STACKS, on);
    }

    /// The current recording settings.
    pub fn history_options(&self) -> HistoryOptions {
        self.with_state(|s, _| HistoryOptions {
            enabled: s.history.mode(),
            context: s.history.context(),
            max_entries: s.history.max_entries(),
        })
    }

    /// Labels blocks allocated and events recorded from now on (`None` clears it).
    pub fn set_label(&self, label: Option<&str>) {
        self.with_state(|s, _| {
            s.set_label(label);
        })
    }

    /// `torch.cuda.memory._snapshot()`: segments, blocks, this device's trace and the
    /// settings. State is copied under the lock; stacks are symbolised after it is released.
    pub fn snapshot(&self) -> Snapshot {
        let mut raw = self.with_state(|s, _| RawSnapshot::take(s, self.device));
        raw.backend = Some(self.kind);
        Snapshot::from_raw(&raw)
    }

    /// [`Self::snapshot`] with stacks named by `symbolize`.
    pub(crate) fn snapshot_with(
        &self,
        symbolize: &mut dyn FnMut(&[usize]) -> Vec<crate::record::frames::Frame>,
    ) -> Snapshot {
        let mut raw = self.with_state(|s, _| RawSnapshot::take(s, self.device));
        raw.backend = Some(self.kind);
        Snapshot::from_raw_with(&raw, symbolize)
    }

    /// The recorded events, oldest first.
    pub fn history(&self) -> Vec<TraceEntry> {
        self.with_state(|s, _| s.history.entries().iter().cloned().collect())
    }

    /// Segments and blocks, as a snapshot reports them.
    pub fn segments(&self) -> Vec<SegmentView> {
        self.with_state(|s, _| s.segments())
    }

    /// Recounts every invariant (tests call this after every step).
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.with_state(|s, _| s.check_invariants())
    }

    /// Opens an independent peak tracker; see [`PeakSlot`].
    pub fn peak_slot(self: &Arc<Self>) -> PeakSlot<B> {
        let id = self.with_state(|s, _| s.open_slot());
        PeakSlot { alloc: Arc::clone(self), id }
    }
}

/// An independent peak tracker, closed on drop. Several can be open at once (a notebook cell
/// and the scopes inside it); resetting one never disturbs another or the global peaks.
pub struct PeakSlot<B: Backend> {
    alloc: Arc<CachingAllocator<B>>,
    id: SlotId,
}

impl<B: Backend> PeakSlot<B> {
    /// The highest allocated / reserved / active / requested bytes since open or reset.
    pub fn peaks(&self) -> SlotPeaks {
        self.alloc.with_state(|s, _| s.slot_peaks(self.id)).unwrap_or_default()
    }
    /// Restarts this slot at the current values.
    pub fn reset(&self) {
        self.alloc.with_state(|s, _| s.reset_slot(self.id));
    }
}

impl<B: Backend> Drop for PeakSlot<B> {
    fn drop(&mut self) {
        let id = self.id;
        self.alloc.with_state(|s, _| s.close_slot(id));
    }
}
