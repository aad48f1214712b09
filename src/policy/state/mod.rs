//! One device's caching state and every transition of PyTorch's policy: `malloc` with its
//! fallback chain, `free`, `record_stream`, event processing, `empty_cache`, garbage
//! collection, the memory fraction, and expandable segments; and our own `compact` policy
//! (`compact.rs`), which shares all but the slow path of `malloc`.
//!
//! The state holds no backend: every operation that needs the device takes `&mut impl Backend`.
//! Stats and trace entries are updated in the same few transition functions
//! (`alloc_block`, `alloc_found_block`, `free`, `free_block`, `release_block`, `map_block`,
//! `unmap_block`), so `check_invariants` can recount everything from the block graph.
//!
//! Note [Block identity]: PyTorch allocates a *new* Block for the front of a split and keeps the
//! old object as the remainder; merging keeps the freed block's object. Only one observable
//! depends on that identity: the stale `requested_size` of inactive blocks in snapshots. We keep
//! the slot of the lowest address instead (so a segment's first slot never changes) and move
//! the identity-carried field (`requested_size`) with the data, which is observably the same.
//!
//! Note [Oversize blocks]: with `max_split_size` set, blocks at least that big are never split,
//! smaller requests never take them, and a big request takes one only if it is less than
//! `max_non_split_rounding` larger (PyTorch 1.4, 1.12).
//!
//! Note [Cross-stream frees]: a block used on other streams (`record_stream`) is not reusable
//! when freed; an event is recorded on each such stream and the block returns to the pool when
//! all complete (checked at the start of every malloc, or waited for by empty_cache and OOM).
#![forbid(unsafe_code)]

use crate::device::{EventId, StreamId};
use crate::policy::block::{Arena, Block, BlockId, BlockPool, ExpandableSegment, NIL};
use crate::policy::config::AllocatorConfig;
use crate::policy::rounding::PoolKind;
use crate::record::component::Component;
use crate::record::frames::Frames;
use crate::record::history::{History, StackContext, TraceAction};
use crate::record::labels::Labels;
use crate::stats::{DeviceStats, PeakSlots, SlotId, SlotPeaks, Stat, StatArray, StatType};
use std::collections::{HashMap, VecDeque};

/// What `malloc` hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The block (pass it back to `free`); `None` for a zero-byte request.
    pub block: Option<BlockId>,
    /// Device address (0 for a zero-byte request).
    pub addr: u64,
    /// The block's (rounded) size.
    pub size: u64,
}

/// A block as seen from outside (snapshots, tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockView {
    /// Address.
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// Requested size (stale for inactive blocks, as in PyTorch).
    pub requested_size: u64,
    /// Allocated to a caller.
    pub allocated: bool,
    /// Allocated, or freed but waiting on stream events.
    pub active: bool,
    /// Label id the block was allocated under (e.g. a notebook cell), 0 when none.
    pub tag: u32,
    /// Stack of the allocation, when stacks were recorded.
    pub frames: Option<Frames>,
}

impl BlockView {
    /// PyTorch's snapshot state string.
    pub fn state(&self) -> &'static str {
        if self.allocated {
            "active_allocated"
        } else if self.active {
            "active_pending_free"
        } else {
            "inactive"
        }
    }
}

/// A segment as a snapshot reports it (for expandable segments: one contiguous mapped run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentView {
    /// First byte.
    pub address: u64,
    /// Sum of block sizes.
    pub total_size: u64,
    /// Stream the segment was allocated for.
    pub stream: StreamId,
    /// Pool.
    pub pool: PoolKind,
    /// Part of an expandable segment.
    pub is_expandable: bool,
    /// Blocks in address order, tiling the segment.
    pub blocks: Vec<BlockView>,
    /// Stack of the call that created the segment, when stacks were recorded.
    pub frames: Option<Frames>,
}

impl SegmentView {
    /// Bytes of allocated blocks.
    pub fn allocated_size(&self) -> u64 {
        self.blocks.iter().filter(|b| b.allocated).map(|b| b.size).sum()
    }
    /// Bytes of active blocks.
    pub fn active_size(&self) -> u64 {
        self.blocks.iter().filter(|b| b.active).map(|b| b.size).sum()
    }
    /// Requested bytes of active blocks.
    pub fn requested_size(&self) -> u64 {
        self.blocks.iter().filter(|b| b.active).map(|b| b.requested_size).sum()
    }
}

/// The caching state of one device.
#[derive(Clone, Debug)]
pub(crate) struct DeviceState {
    config: AllocatorConfig,
    device: i32,
    arena: Arena,
    small: BlockPool,
    large: BlockPool,
    expandable: Vec<ExpandableSegment>,
    stats: DeviceStats,
    /// Bytes obtained from the device (PyTorch's `total_allocated_memory`).
    total_reserved: u64,
    /// Under `compact`: the highest active bytes seen (not reset with the peak statistics:
    /// the growth budget follows the workload, not the caller's measurements).
    compact_high: u64,
    /// Per-process limit in bytes, when a memory fraction is set.
    allowed: Option<u64>,
    /// Pending stream events per stream, FIFO, in first-use order of the streams.
    pending: Vec<(StreamId, VecDeque<(EventId, u32)>)>,
    /// Streams other than its own that used an allocated block (`record_stream`), by slot;
    /// taken when the block is freed.
    stream_uses: HashMap<u32, Vec<StreamId>>,
    /// Recorded events.
    pub history: History,
    slots: PeakSlots,
    /// Label id given to blocks and events from now on.
    current_tag: u32,
    /// Interned labels; id 0 is the empty label.
    labels: Labels,
    /// Stack of the caller operation in progress (set by the front, outside the lock).
    op_ctx: Option<Frames>,
    /// Allocation stacks of active blocks, by slot.
    block_ctx: HashMap<u32, Frames>,
    /// Stacks of segment creation, by segment address.
    seg_ctx: HashMap<u64, Frames>,
    /// Whether an out-of-memory report carries the reserved bytes' parts (a copy of the state
    /// per failure; fit planning, which fails often on purpose, turns it off).
    explain_ooms: bool,
    /// The component stamped on the caller's thread for the operation in progress (set by the
    /// front, like `op_ctx`).
    current_component: Option<Component>,
    /// Allocated bytes by component ([`Component::ALL`] order; unstamped blocks are `other`).
    component_bytes: [Stat; 8],
    /// Whether any block was ever stamped: only then does `memory_stats()` list the components.
    components_seen: bool,
}

#[inline]
fn pool_stat(pool: PoolKind) -> usize {
    match pool {
        PoolKind::Small => StatType::SmallPool as usize,
        PoolKind::Large => StatType::LargePool as usize,
    }
}

#[inline]
fn inc(arr: &mut StatArray, pool: PoolKind, n: u64) {
    arr[0].increase(n as i64);
    arr[pool_stat(pool)].increase(n as i64);
}

#[inline]
fn dec(arr: &mut StatArray, pool: PoolKind, n: u64) {
    arr[0].decrease(n as i64);
    arr[pool_stat(pool)].decrease(n as i64);
}

impl DeviceState {
    /// A fresh state for device `device` with the given configuration.
    pub(crate) fn new(device: i32, config: AllocatorConfig) -> Self {
        let stats = DeviceStats::new(config.max_split_size_reported());
        DeviceState {
            config,
            device,
            arena: Arena::default(),
            small: BlockPool::default(),
            large: BlockPool::default(),
            expandable: Vec::new(),
            stats,
            total_reserved: 0,
            compact_high: 0,
            allowed: None,
            pending: Vec::new(),
            stream_uses: HashMap::new(),
            history: History::default(),
            slots: PeakSlots::default(),
            current_tag: 0,
            labels: Labels::default(),
            op_ctx: None,
            block_ctx: HashMap::new(),
            seg_ctx: HashMap::new(),
            explain_ooms: true,
            current_component: None,
            component_bytes: Default::default(),
            components_seen: false,
        }
    }

    /// Whether out-of-memory reports carry [`crate::ReservedParts`] (on by default).
    pub(crate) fn set_explain_ooms(&mut self, on: bool) {
        self.explain_ooms = on;
    }

    /// The configuration.
    pub(crate) fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// The statistics.
    pub(crate) fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    /// `reset_peak_memory_stats`.
    pub(crate) fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
        self.component_bytes.iter_mut().for_each(Stat::reset_peak);
    }

    /// `reset_accumulated_memory_stats`.
    pub(crate) fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
        self.component_bytes.iter_mut().for_each(Stat::reset_accumulated);
    }

    /// The component stamped for the operation about to run (read by the front from the
    /// caller's thread); kept until the next call.
    #[inline]
    pub(crate) fn set_component(&mut self, c: Option<Component>) {
        self.current_component = c;
    }

    /// Allocated bytes by component, once any block was stamped (PyTorch #182387's
    /// `component_bytes.{component}.{current,peak,allocated,freed}`); `None` before.
    pub(crate) fn component_bytes(&self) -> Option<Vec<(Component, Stat)>> {
        self.components_seen.then(|| Component::ALL.iter().zip(self.component_bytes).map(|(c, s)| (*c, s)).collect())
    }

    /// The components' statistics as they are, stamped or not (for the invariants).
    pub(crate) fn component_stats(&self) -> &[Stat; 8] {
        &self.component_bytes
    }

    /// Counts a block's bytes under the current component (`other` without a stamp).
    #[inline]
    fn component_alloc(&mut self, bytes: u64) -> u8 {
        let c = self.current_component.unwrap_or(Component::Other);
        self.components_seen |= self.current_component.is_some();
        self.component_bytes[c as usize].increase(bytes as i64);
        c as u8
    }

    /// Takes a block's bytes out of its component.
    #[inline]
    fn component_free(&mut self, c: u8, bytes: u64) {
        self.component_bytes[usize::from(c).min(Component::ALL.len() - 1)].decrease(bytes as i64);
    }

    /// Bytes currently obtained from the device.
    pub(crate) fn total_reserved(&self) -> u64 {
        self.total_reserved
    }

    /// Labels blocks allocated and events recorded from now on (e.g. "cell 3"); `None`
    /// clears the label. Returns the label's id.
    pub(crate) fn set_label(&mut self, label: Option<&str>) -> u32 {
        self.current_tag = self.labels.intern(label);
        self.current_tag
    }

    /// Every label text, indexed by id (id 0 is "").
    pub(crate) fn labels(&self) -> Vec<String> {
        self.labels.all()
    }

    /// The stack of the operation about to run (captured by the caller outside the lock);
    /// kept until the next call.
    pub(crate) fn set_op_context(&mut self, frames: Option<Frames>) {
        self.op_ctx = frames;
    }

    /// Records an event with the current label and `frames`.
    #[inline(always)]
    fn trace(&mut self, action: TraceAction, addr: u64, size: u64, stream: StreamId, frames: Option<Frames>) {
        let label = self.current_tag;
        self.history.record_with(action, addr, size, stream, frames, label);
    }

    /// The operation's own stack, when events of this kind carry stacks.
    #[inline(always)]
    fn ctx_for_alloc_event(&self) -> Option<Frames> {
        if self.op_ctx.is_some() && self.history.context() >= StackContext::Alloc { self.op_ctx.clone() } else { None }
    }

    /// A free event's stack: its own with context `All`, else the allocation's.
    #[inline]
    fn ctx_for_free_event(&self, saved: Option<&Frames>) -> Option<Frames> {
        match self.history.context() {
            StackContext::All if self.op_ctx.is_some() => self.op_ctx.clone(),
            StackContext::All | StackContext::Alloc => saved.cloned(),
            _ => None,
        }
    }

    /// Records PyTorch's "snapshot" event (size: bytes of active blocks).
    pub(crate) fn record_snapshot_event(&mut self) {
        let active = self.stats.active_bytes[0].current as u64;
        let frames = self.ctx_for_alloc_event();
        self.trace(TraceAction::Snapshot, 0, active, StreamId::DEFAULT, frames);
    }

    fn pool(&mut self, kind: PoolKind) -> &mut BlockPool {
        match kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }

    fn pool_ref(&self, kind: PoolKind) -> &BlockPool {
        match kind {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        }
    }

    fn gc_active(&self) -> bool {
        self.allowed.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    fn now_peaks(&self) -> SlotPeaks {
        SlotPeaks {
            allocated: self.stats.allocated_bytes[0].current,
            reserved: self.stats.reserved_bytes[0].current,
            active: self.stats.active_bytes[0].current,
            requested: self.stats.requested_bytes[0].current,
        }
    }

    // ----------------------------------------------------------------------------------------
    // Peak slots

    /// Opens an independent peak tracker starting at the current values.
    pub(crate) fn open_slot(&mut self) -> SlotId {
        let now = self.now_peaks();
        self.slots.open(now)
    }
    /// Peaks seen by a slot since it was opened or reset.
    pub(crate) fn slot_peaks(&self, id: SlotId) -> Option<SlotPeaks> {
        self.slots.get(id)
    }
    /// Restarts a slot at the current values; other slots and global peaks are untouched.
    pub(crate) fn reset_slot(&mut self, id: SlotId) -> bool {
        let now = self.now_peaks();
        self.slots.reset(id, now)
    }
    /// Closes a slot, returning its peaks.
    pub(crate) fn close_slot(&mut self, id: SlotId) -> Option<SlotPeaks> {
        self.slots.close(id)
    }

    // ----------------------------------------------------------------------------------------
    // Memory fraction

    /// `set_per_process_memory_fraction`: limit reserved memory to `fraction · total`.
    pub(crate) fn set_memory_fraction(&mut self, fraction: f64, total: u64) -> Result<(), String> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(format!("invalid fraction {fraction}: must be between 0 and 1"));
        }
        self.allowed = Some((fraction * total as f64) as u64);
        Ok(())
    }
    /// The limit as a fraction of `total` (1.0 when none is set).
    pub(crate) fn memory_fraction(&self, total: u64) -> f64 {
        match self.allowed {
            Some(a) if total > 0 => a as f64 / total as f64,
            _ => 1.0,
        }
    }
    /// The per-process limit in bytes, if set.
    pub(crate) fn allowed_bytes(&self) -> Option<u64> {
        self.allowed
    }
}

mod compact;
mod expandable;
pub(crate) use compact::PAGE;
mod free;
mod malloc;
mod release;
mod views;

#[cfg(test)]
mod tests;
