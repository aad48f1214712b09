//! One device's caching state and every transition of PyTorch's policy: `malloc` with its
//! fallback chain, `free`, `record_stream`, event processing, `empty_cache`, garbage
//! collection, the memory fraction, and expandable segments.
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

use super::block::{Arena, Block, BlockId, BlockPool, ExpandableSegment, FreeKey, NIL};
use super::constants::{MIN_BLOCK_SIZE, ONE_EXA_BYTE, SMALL_BUFFER, SMALL_SIZE};
use super::rounding::{PoolKind, allocation_size, round_size};
use crate::backend::{Backend, DeviceError, EventId, StreamId};
use crate::config::AllocatorConfig;
use crate::error::{AllocError, OomReport};
use crate::frames::Frames;
use crate::history::{History, StackContext, TraceAction};
use crate::stats::{DeviceStats, PeakSlots, SlotId, SlotPeaks, StatArray, StatType};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

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
pub struct DeviceState {
    config: AllocatorConfig,
    device: i32,
    arena: Arena,
    small: BlockPool,
    large: BlockPool,
    expandable: Vec<ExpandableSegment>,
    stats: DeviceStats,
    /// Bytes obtained from the device (PyTorch's `total_allocated_memory`).
    total_reserved: u64,
    /// Per-process limit in bytes, when a memory fraction is set.
    allowed: Option<u64>,
    /// Pending stream events per stream, FIFO, in first-use order of the streams.
    pending: Vec<(StreamId, VecDeque<(EventId, u32)>)>,
    /// Recorded events.
    pub history: History,
    slots: PeakSlots,
    /// Label id given to blocks and events from now on.
    current_tag: u32,
    /// Interned labels; index 0 is the empty label.
    labels: Vec<Arc<str>>,
    /// Stack of the caller operation in progress (set by the front, outside the lock).
    op_ctx: Option<Frames>,
    /// Allocation stacks of active blocks, by slot.
    block_ctx: HashMap<u32, Frames>,
    /// Stacks of segment creation, by segment address.
    seg_ctx: HashMap<u64, Frames>,
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
    pub fn new(device: i32, config: AllocatorConfig) -> Self {
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
            allowed: None,
            pending: Vec::new(),
            history: History::default(),
            slots: PeakSlots::default(),
            current_tag: 0,
            labels: vec![Arc::from("")],
            op_ctx: None,
            block_ctx: HashMap::new(),
            seg_ctx: HashMap::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// The statistics.
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    /// `reset_peak_memory_stats`.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    /// `reset_accumulated_memory_stats`.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// Bytes currently obtained from the device.
    pub fn total_reserved(&self) -> u64 {
        self.total_reserved
    }

    /// Labels blocks allocated and events recorded from now on (e.g. "cell 3"); `None`
    /// clears the label. Returns the label's id.
    pub fn set_label(&mut self, label: Option<&str>) -> u32 {
        self.current_tag = match label {
            None | Some("") => 0,
            Some(l) => match self.labels.iter().position(|x| &**x == l) {
                Some(i) => i as u32,
                None => {
                    self.labels.push(Arc::from(l));
                    (self.labels.len() - 1) as u32
                }
            },
        };
        self.current_tag
    }

    /// Every label text, indexed by id (id 0 is "").
    pub fn labels(&self) -> Vec<String> {
        self.labels.iter().map(|l| l.to_string()).collect()
    }

    /// The text of a label id ("" for 0 or an unknown id).
    pub fn label_name(&self, id: u32) -> &str {
        self.labels.get(id as usize).map_or("", |l| l)
    }

    /// The stack of the operation about to run (captured by the caller outside the lock);
    /// kept until the next call.
    pub fn set_op_context(&mut self, frames: Option<Frames>) {
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
    pub fn record_snapshot_event(&mut self) {
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
    pub fn open_slot(&mut self) -> SlotId {
        let now = self.now_peaks();
        self.slots.open(now)
    }
    /// Peaks seen by a slot since it was opened or reset.
    pub fn slot_peaks(&self, id: SlotId) -> Option<SlotPeaks> {
        self.slots.get(id)
    }
    /// Restarts a slot at the current values; other slots and global peaks are untouched.
    pub fn reset_slot(&mut self, id: SlotId) -> bool {
        let now = self.now_peaks();
        self.slots.reset(id, now)
    }
    /// Closes a slot, returning its peaks.
    pub fn close_slot(&mut self, id: SlotId) -> Option<SlotPeaks> {
        self.slots.close(id)
    }

    // ----------------------------------------------------------------------------------------
    // Memory fraction

    /// `set_per_process_memory_fraction`: limit reserved memory to `fraction · total`.
    pub fn set_memory_fraction(&mut self, fraction: f64, total: u64) -> Result<(), String> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(format!("invalid fraction {fraction}: must be between 0 and 1"));
        }
        self.allowed = Some((fraction * total as f64) as u64);
        Ok(())
    }
    /// The limit as a fraction of `total` (1.0 when none is set).
    pub fn memory_fraction(&self, total: u64) -> f64 {
        match self.allowed {
            Some(a) if total > 0 => a as f64 / total as f64,
            _ => 1.0,
        }
    }
    /// The per-process limit in bytes, if set.
    pub fn allowed_bytes(&self) -> Option<u64> {
        self.allowed
    }

    // ----------------------------------------------------------------------------------------
    // malloc

    /// Allocates `orig_size` bytes for `stream`, PyTorch's sequence: process completed events,
    /// best fit from the pool, else a new segment; on failure free oversize cached blocks (with
    /// `max_split_size`), then every cached block, and retry; then out-of-memory.
    pub fn malloc<B: Backend>(
        &mut self,
        dev: &mut B,
        orig_size: u64,
        stream: StreamId,
    ) -> Result<Allocation, AllocError> {
        if orig_size == 0 {
            return Ok(Allocation { block: None, addr: 0, size: 0 });
        }
        if orig_size >= ONE_EXA_BYTE {
            return Err(AllocError::TooLarge(orig_size));
        }
        self.process_events(dev)?;
        let size = round_size(orig_size, &self.config);
        let pool = PoolKind::for_size(size);
        let alloc_size = allocation_size(size, &self.config);

        let mut found = self.get_free_block(pool, stream, size);
        let in_pool = found.is_some();
        if found.is_none() {
            if self.gc_active() {
                self.garbage_collect_cached_blocks(dev)?;
            }
            found = self.alloc_block(dev, pool, stream, size, alloc_size, false)?;
            if found.is_none() && self.release_available_cached_blocks(dev, pool, stream, size)? {
                found = self.alloc_block(dev, pool, stream, size, alloc_size, false)?;
            }
            if found.is_none() {
                self.release_cached_blocks(dev)?;
                found = self.alloc_block(dev, pool, stream, size, alloc_size, true)?;
            }
        }
        let Some(id) = found else {
            return Err(self.out_of_memory(dev, size, alloc_size, orig_size, stream));
        };
        let split = self.should_split(id, size);
        Ok(self.alloc_found_block(id, orig_size, size, split, in_pool))
    }

    fn out_of_memory<B: Backend>(
        &mut self,
        dev: &mut B,
        size: u64,
        alloc_size: u64,
        orig_size: u64,
        stream: StreamId,
    ) -> AllocError {
        let (free, total) = match dev.mem_get_info() {
            Ok(v) => v,
            Err(e) => return AllocError::Device(e),
        };
        let frames = self.ctx_for_alloc_event();
        self.trace(TraceAction::Oom, free, size, stream, frames);
        self.stats.num_ooms += 1;
        AllocError::OutOfMemory(Box::new(OomReport {
            device: self.device,
            backend: dev.kind(),
            requested: orig_size,
            alloc_size,
            total,
            free,
            allowed: self.allowed,
            allocated: self.stats.allocated_bytes[0].current as u64,
            reserved: self.stats.reserved_bytes[0].current as u64,
            processes: dev.process_memory(),
        }))
    }

    fn get_free_block(&mut self, kind: PoolKind, stream: StreamId, size: u64) -> Option<u32> {
        let max_split = self.config.max_split_size;
        let non_split = self.config.max_non_split_rounding;
        let expandable_on = self.config.expandable_segments;
        let gc = self.gc_active();
        let arena = &self.arena;
        let pool = match kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        };
        if gc {
            pool.get_free_blocks_call_count += 1;
        }
        let (mut key, mut id) = pool.blocks.lower_bound((stream.0, size, 0))?;
        if key.0 != stream.0 {
            return None;
        }
        if arena.get(id).is_expandable() {
            let mut iter = pool.blocks.range_from(key).skip(1);
            if expandable_on {
                // Best fit counts an expandable block at the size it can grow to.
                let exp_size = |i: u32| {
                    let b = arena.get(i);
                    b.size + if b.next != NIL && !arena.get(b.next).mapped { arena.get(b.next).size } else { 0 }
                };
                for (k, v) in iter {
                    if !(arena.get(id).is_expandable() && k.0 == stream.0 && exp_size(v) < exp_size(id)) {
                        break;
                    }
                    key = k;
                    id = v;
                }
            } else {
                // Expandable segments were switched off: skip expandable blocks.
                match iter.find(|(k, v)| !(arena.get(*v).is_expandable() && k.0 == stream.0)) {
                    Some((k, v)) if k.0 == stream.0 => {
                        key = k;
                        id = v;
                    }
                    _ => return None,
                }
            }
        }
        let bsize = key.1;
        if size < max_split && bsize >= max_split {
            return None;
        }
        if size >= max_split && bsize >= size.saturating_add(non_split) {
            return None;
        }
        // The block stays in the pool: `alloc_found_block` removes it, or replaces it with the
        // split remainder in place.
        let _ = key;
        Some(id)
    }

    fn should_split(&self, id: u32, size: u64) -> bool {
        let b = self.arena.get(id);
        let remaining = b.size - size;
        if b.pool == PoolKind::Small || self.config.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.config.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// A new segment (or mapped pages) for a request that found no cached block.
    /// `Ok(None)` when the device or the memory fraction has no room.
    fn alloc_block<B: Backend>(
        &mut self,
        dev: &mut B,
        pool: PoolKind,
        stream: StreamId,
        size: u64,
        alloc_size: u64,
        is_retry: bool,
    ) -> Result<Option<u32>, DeviceError> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if self.allowed.is_some_and(|allowed| self.total_reserved + alloc_size > allowed) {
            return Ok(None);
        }
        if self.config.expandable_segments {
            return self.try_allocate_expandable_block(dev, pool, stream, size);
        }
        let addr = match dev.reserve(alloc_size, stream) {
            Ok(a) => a,
            Err(DeviceError::OutOfMemory) => return Ok(None),
            Err(e) => return Err(e),
        };
        self.total_reserved += alloc_size;
        let id = self.arena.insert(Block::new(addr, alloc_size, stream, pool));
        inc(&mut self.stats.segment, pool, 1);
        inc(&mut self.stats.reserved_bytes, pool, alloc_size);
        if alloc_size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        let frames = self.ctx_for_alloc_event();
        if let Some(f) = self.op_ctx.as_ref().filter(|_| self.history.context() >= StackContext::State) {
            self.seg_ctx.insert(addr, f.clone());
        }
        self.trace(TraceAction::SegmentAlloc, addr, alloc_size, stream, frames);
        let now = self.now_peaks();
        self.slots.observe(now);
        Ok(Some(id))
    }

    fn insert_into_pool(&mut self, id: u32) {
        let b = self.arena.get(id);
        let (key, kind) = (b.free_key(), b.pool);
        let pool = match kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        };
        let count = pool.get_free_blocks_call_count;
        pool.blocks.insert(key, id);
        self.arena.get_mut(id).gc_count_base = count;
    }

    /// Hands out block `id` (`in_pool`: it is still in its pool's free set, from
    /// `get_free_block`), splitting off the remainder when `split`.
    fn alloc_found_block(&mut self, id: u32, orig_size: u64, size: u64, split: bool, in_pool: bool) -> Allocation {
        let (already_split, expandable, pool, old_key) = {
            let b = self.arena.get(id);
            (b.is_split(), b.is_expandable(), b.pool, b.free_key())
        };
        if split {
            // The front keeps the slot; the remainder takes over the stale requested_size
            // (Note [Block identity]).
            let b = self.arena.get(id);
            let mut rem = Block::new(b.addr + size, b.size - size, b.stream, pool);
            rem.requested_size = b.requested_size;
            rem.expandable = b.expandable;
            rem.prev = id;
            rem.next = b.next;
            let old_next = b.next;
            let rem_size = rem.size;
            let rid = self.arena.insert(rem);
            if old_next != NIL {
                self.arena.get_mut(old_next).prev = rid;
            }
            let b = self.arena.get_mut(id);
            b.next = rid;
            b.size = size;
            if in_pool {
                let (key, count) = (self.arena.get(rid).free_key(), self.pool(pool).get_free_blocks_call_count);
                self.pool(pool).blocks.replace(&old_key, key, rid);
                self.arena.get_mut(rid).gc_count_base = count;
            } else {
                self.insert_into_pool(rid);
            }
            if !expandable {
                if already_split {
                    dec(&mut self.stats.inactive_split_bytes, pool, size);
                } else {
                    inc(&mut self.stats.inactive_split_bytes, pool, rem_size);
                    inc(&mut self.stats.inactive_split, pool, 1);
                }
            }
        } else {
            if in_pool {
                self.pool(pool).blocks.remove(&old_key);
            }
            if already_split && !expandable {
                let bsize = self.arena.get(id).size;
                dec(&mut self.stats.inactive_split_bytes, pool, bsize);
                dec(&mut self.stats.inactive_split, pool, 1);
            }
        }
        let tag = self.current_tag;
        let b = self.arena.get_mut(id);
        b.allocated = true;
        b.requested_size = orig_size;
        b.tag = tag;
        let (addr, bsize, stream) = (b.addr, b.size, b.stream);
        if let Some(f) = self.op_ctx.as_ref().filter(|_| self.history.context() >= StackContext::State) {
            self.block_ctx.insert(id, f.clone());
        }
        let frames = self.ctx_for_alloc_event();
        self.trace(TraceAction::Alloc, addr, orig_size, stream, frames);
        inc(&mut self.stats.allocation, pool, 1);
        inc(&mut self.stats.allocated_bytes, pool, bsize);
        inc(&mut self.stats.active, pool, 1);
        inc(&mut self.stats.active_bytes, pool, bsize);
        inc(&mut self.stats.requested_bytes, pool, orig_size);
        if bsize >= self.config.max_split_size {
            self.stats.oversize_allocations.increase(1);
        }
        let now = self.now_peaks();
        self.slots.observe(now);
        Allocation { block: Some(BlockId(id)), addr, size: bsize }
    }

    // ----------------------------------------------------------------------------------------
    // free and streams

    fn check_allocated(&self, id: BlockId) -> Result<u32, DeviceError> {
        match self.arena.slots.get(id.0 as usize) {
            Some(b) if b.live && b.allocated => Ok(id.0),
            _ => Err(DeviceError::Driver(format!("block {} is not an allocated block of this device", id.0))),
        }
    }

    /// The caller releases a block. It returns to the pool now, or once events on every other
    /// stream that used it complete (Note [Cross-stream frees]).
    pub fn free<B: Backend>(&mut self, dev: &mut B, block: BlockId) -> Result<(), DeviceError> {
        let id = self.check_allocated(block)?;
        let b = self.arena.get_mut(id);
        b.allocated = false;
        let (addr, size, req, stream, pool) = (b.addr, b.size, b.requested_size, b.stream, b.pool);
        let has_uses = !b.stream_uses.is_empty();
        dec(&mut self.stats.allocation, pool, 1);
        dec(&mut self.stats.allocated_bytes, pool, size);
        let frames = if self.block_ctx.is_empty() && self.op_ctx.is_none() {
            None
        } else {
            self.ctx_for_free_event(self.block_ctx.get(&id))
        };
        self.trace(TraceAction::FreeRequested, addr, req, stream, frames);
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        if has_uses {
            self.insert_events(dev, id)
        } else {
            self.free_block(id);
            Ok(())
        }
    }

    /// `record_stream`: the block is also used on `stream`.
    pub fn record_stream(&mut self, block: BlockId, stream: StreamId) -> Result<(), DeviceError> {
        let id = self.check_allocated(block)?;
        let b = self.arena.get_mut(id);
        if stream != b.stream && !b.stream_uses.contains(&stream) {
            b.stream_uses.push(stream);
        }
        Ok(())
    }

    fn insert_events<B: Backend>(&mut self, dev: &mut B, id: u32) -> Result<(), DeviceError> {
        let streams = std::mem::take(&mut self.arena.get_mut(id).stream_uses);
        for s in streams {
            let ev = dev.record_event(s)?;
            self.arena.get_mut(id).event_count += 1;
            match self.pending.iter_mut().find(|(ps, _)| *ps == s) {
                Some((_, q)) => q.push_back((ev, id)),
                None => self.pending.push((s, VecDeque::from([(ev, id)]))),
            }
        }
        Ok(())
    }

    /// Returns blocks whose stream events have all completed (runs at every malloc).
    pub fn process_events<B: Backend>(&mut self, dev: &mut B) -> Result<(), DeviceError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut pending = std::mem::take(&mut self.pending);
        let mut result = Ok(());
        for (_, q) in pending.iter_mut() {
            while let Some(&(ev, id)) = q.front() {
                match dev.query_event(ev) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
                q.pop_front();
                self.event_done(id);
            }
        }
        pending.retain(|(_, q)| !q.is_empty());
        self.pending = pending;
        result
    }

    fn event_done(&mut self, id: u32) {
        let b = self.arena.get_mut(id);
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(id);
        }
    }

    fn synchronize_and_free_events<B: Backend>(&mut self, dev: &mut B) -> Result<(), DeviceError> {
        self.stats.num_sync_all_streams += 1;
        let pending = std::mem::take(&mut self.pending);
        let mut result = Ok(());
        for (_, q) in pending {
            for (ev, id) in q {
                if let Err(e) = dev.synchronize_event(ev) {
                    result = result.and(Err(e));
                }
                self.event_done(id);
            }
        }
        result
    }

    /// A block that is no longer in use returns to its pool, merged with free neighbours.
    fn free_block(&mut self, id: u32) {
        let b = self.arena.get(id);
        debug_assert!(!b.allocated && b.event_count == 0 && b.stream_uses.is_empty());
        let (addr, req, stream, pool, orig_size, expandable) =
            (b.addr, b.requested_size, b.stream, b.pool, b.size, b.is_expandable());
        // Stacks are kept only while recording with stacks: skip the lookups otherwise.
        let frames = if self.block_ctx.is_empty() && self.op_ctx.is_none() {
            None
        } else {
            let saved = self.block_ctx.remove(&id);
            self.ctx_for_free_event(saved.as_ref())
        };
        self.trace(TraceAction::FreeCompleted, addr, req, stream, frames);
        self.arena.get_mut(id).tag = 0;
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        let mut cur = id;
        // A merged neighbour's pool entry is replaced by the merged block's (in place when the
        // order allows), instead of a removal and an insertion.
        let mut vacated: Option<FreeKey> = None;
        for prev in [true, false] {
            let cand = if prev { self.arena.get(cur).prev } else { self.arena.get(cur).next };
            if let Some((survivor, sub, key)) = self.merge_free_neighbour(cur, cand) {
                if let Some(k) = vacated.replace(key) {
                    self.pool(pool).blocks.remove(&k);
                }
                cur = survivor;
                net_blocks -= 1;
                net_bytes -= sub as i64;
            }
        }
        match vacated {
            Some(k) => {
                let (key, count) = (self.arena.get(cur).free_key(), self.pool(pool).get_free_blocks_call_count);
                self.pool(pool).blocks.replace(&k, key, cur);
                self.arena.get_mut(cur).gc_count_base = count;
            }
            None => self.insert_into_pool(cur),
        }
        let b = self.arena.get(cur);
        if b.is_split() {
            net_blocks += 1;
            net_bytes += b.size as i64;
        }
        if !expandable {
            let s = pool_stat(pool);
            for t in [0, s] {
                if net_blocks > 0 {
                    self.stats.inactive_split[t].increase(net_blocks);
                } else if net_blocks < 0 {
                    self.stats.inactive_split[t].decrease(-net_blocks);
                }
                if net_bytes > 0 {
                    self.stats.inactive_split_bytes[t].increase(net_bytes);
                } else if net_bytes < 0 {
                    self.stats.inactive_split_bytes[t].decrease(-net_bytes);
                }
            }
        }
        dec(&mut self.stats.active, pool, 1);
        dec(&mut self.stats.active_bytes, pool, orig_size);
        dec(&mut self.stats.requested_bytes, pool, req);
    }

    /// Merges free neighbour `src` into `dst`. Returns the surviving slot and the bytes merged.
    /// The survivor carries `dst`'s identity (Note [Block identity]).
    fn try_merge_blocks(&mut self, dst: u32, src: u32) -> Option<(u32, u64)> {
        if !self.mergeable(dst, src) {
            return None;
        }
        let s = self.arena.get(src);
        let (skey, spool, smapped) = (s.free_key(), s.pool, s.mapped);
        let pool = self.pool(spool);
        if smapped {
            pool.blocks.remove(&skey);
        } else {
            pool.unmapped.remove(&(skey.0, skey.2));
        }
        Some(self.link_merge(dst, src))
    }

    /// Whether free neighbour `src` can merge into `dst` (PyTorch's `try_merge_blocks` test).
    #[inline]
    fn mergeable(&self, dst: u32, src: u32) -> bool {
        if src == NIL {
            return false;
        }
        let s = self.arena.get(src);
        !(s.allocated || s.event_count > 0 || !s.stream_uses.is_empty() || s.mapped != self.arena.get(dst).mapped)
    }

    /// As [`Self::try_merge_blocks`] for a block being freed (mapped, so only mapped neighbours
    /// merge), but leaves the neighbour's pool entry for the caller, returning its key.
    #[inline]
    fn merge_free_neighbour(&mut self, dst: u32, src: u32) -> Option<(u32, u64, FreeKey)> {
        if !self.mergeable(dst, src) {
            return None;
        }
        debug_assert!(self.arena.get(src).mapped);
        let key = self.arena.get(src).free_key();
        let (survivor, sub) = self.link_merge(dst, src);
        Some((survivor, sub, key))
    }

    /// Links `src` into `dst` (neighbours in one segment); returns the surviving slot and the
    /// bytes merged. The survivor carries `dst`'s identity (Note [Block identity]).
    fn link_merge(&mut self, dst: u32, src: u32) -> (u32, u64) {
        let ssize = self.arena.get(src).size;
        if self.arena.get(dst).prev == src {
            // [src dst]: keep src's slot (the lower address), give it dst's identity.
            let d = self.arena.get(dst).clone();
            let sb = self.arena.get_mut(src);
            sb.size += d.size;
            sb.next = d.next;
            sb.requested_size = d.requested_size;
            sb.tag = d.tag;
            if d.next != NIL {
                self.arena.get_mut(d.next).prev = src;
            }
            self.arena.remove(dst);
            (src, ssize)
        } else {
            // [dst src]
            let snext = self.arena.get(src).next;
            let db = self.arena.get_mut(dst);
            db.size += ssize;
            db.next = snext;
            if snext != NIL {
                self.arena.get_mut(snext).prev = dst;
            }
            self.arena.remove(src);
            (dst, ssize)
        }
    }

    // ----------------------------------------------------------------------------------------
    // releasing cached memory

    /// `empty_cache`: wait for pending stream events, then return every fully free segment
    /// (and every fully free page of expandable segments) to the device.
    pub fn empty_cache<B: Backend>(&mut self, dev: &mut B) -> Result<(), DeviceError> {
        self.release_cached_blocks(dev)
    }

    fn release_cached_blocks<B: Backend>(&mut self, dev: &mut B) -> Result<(), DeviceError> {
        self.synchronize_and_free_events(dev)?;
        self.release_blocks(dev, PoolKind::Large)?;
        self.release_blocks(dev, PoolKind::Small)
    }

    fn release_blocks<B: Backend>(&mut self, dev: &mut B, kind: PoolKind) -> Result<(), DeviceError> {
        let ids = self.pool(kind).blocks.values();
        let mut to_unmap = Vec::new();
        for id in ids {
            let b = self.arena.get(id);
            if b.is_expandable() {
                to_unmap.push(id);
            } else if !b.is_split() {
                self.release_block(dev, id)?;
            }
        }
        for id in to_unmap {
            let id = self.unmap_block(dev, id)?;
            let b = self.arena.get(id);
            if !b.mapped && !b.is_split() {
                self.release_expandable_segment(dev, id)?;
            }
        }
        Ok(())
    }

    /// Returns a whole free segment to the device.
    fn release_block<B: Backend>(&mut self, dev: &mut B, id: u32) -> Result<(), DeviceError> {
        let b = self.arena.get(id);
        debug_assert!(!b.is_expandable() && !b.is_split() && !b.allocated);
        let (addr, size, stream, pool, key) = (b.addr, b.size, b.stream, b.pool, b.free_key());
        self.stats.num_device_free += 1;
        let frames = if self.seg_ctx.is_empty() && self.op_ctx.is_none() {
            None
        } else {
            let saved = self.seg_ctx.remove(&addr);
            self.ctx_for_free_event(saved.as_ref())
        };
        self.trace(TraceAction::SegmentFree, addr, size, stream, frames);
        let result = dev.release(addr, size);
        self.total_reserved -= size;
        dec(&mut self.stats.segment, pool, 1);
        dec(&mut self.stats.reserved_bytes, pool, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.pool(pool).blocks.remove(&key);
        self.arena.remove(id);
        result
    }

    /// With `max_split_size` set: free the smallest cached oversize block that covers the
    /// request, or else oversize blocks from the largest down until enough is freed.
    fn release_available_cached_blocks<B: Backend>(
        &mut self,
        dev: &mut B,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Result<bool, DeviceError> {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let key_size = size.max(max_split);
        let key = (stream.0, key_size, 0);
        let arena = &self.arena;
        let pool = match kind {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        };
        let first = pool.blocks.lower_bound(key);
        match first {
            Some((k, id)) if k.0 == stream.0 && !arena.get(id).is_expandable() => {
                self.release_block(dev, id)?;
                Ok(true)
            }
            _ => {
                let mut victims = Vec::new();
                let mut total = 0u64;
                for (k, v) in pool.blocks.range_below_rev(key) {
                    if !(total < key_size && k.1 >= max_split && k.0 == stream.0) {
                        break;
                    }
                    if !arena.get(v).is_expandable() {
                        victims.push(v);
                        total += k.1;
                    }
                }
                if victims.is_empty() && pool.blocks.range_below_rev(key).next().is_none() {
                    return Ok(false);
                }
                for id in victims {
                    self.release_block(dev, id)?;
                }
                Ok(total >= key_size)
            }
        }
    }

    /// `garbage_collection_threshold`: free the oldest unsplit cached large blocks until the
    /// reserved bytes drop below `threshold · allowed`.
    fn garbage_collect_cached_blocks<B: Backend>(&mut self, dev: &mut B) -> Result<(), DeviceError> {
        let Some(allowed) = self.allowed else { return Ok(()) };
        let gc_threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_reserved <= gc_threshold {
            return Ok(());
        }
        let target = self.total_reserved - gc_threshold;
        let count_now = self.large.get_free_blocks_call_count;
        let age = |b: &Block| count_now - b.gc_count_base;
        let mut total_age: u64 = 0;
        let mut freeable: u64 = 0;
        for id in self.large.blocks.values() {
            let b = self.arena.get(id);
            if !b.is_split() {
                total_age += age(b);
                freeable += 1;
            }
        }
        if freeable == 0 {
            return Ok(());
        }
        let mut reclaimed = 0u64;
        let mut block_freed = true;
        while reclaimed < target && block_freed && freeable > 0 {
            let age_threshold = total_age as f64 / freeable as f64;
            block_freed = false;
            let ids = self.large.blocks.values();
            for id in ids {
                let b = self.arena.get(id);
                if !b.is_split() && !b.is_expandable() && age(b) as f64 >= age_threshold {
                    block_freed = true;
                    reclaimed += b.size;
                    total_age -= age(b);
                    freeable -= 1;
                    self.release_block(dev, id)?;
                }
            }
        }
        Ok(())
    }

    // ----------------------------------------------------------------------------------------
    // expandable segments

    fn try_allocate_expandable_block<B: Backend>(
        &mut self,
        dev: &mut B,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Result<Option<u32>, DeviceError> {
        let mut cand = self.find_expandable_block(dev, kind, stream, size)?;
        if !self.arena.get(cand).mapped {
            let want = self.arena.get(cand).size.min(size);
            match self.map_block(dev, cand, want)? {
                Some(c) => cand = c,
                None => return Ok(None),
            }
        }
        while self.arena.get(cand).size < size {
            let remaining = size - self.arena.get(cand).size;
            let next = self.arena.get(cand).next;
            let want = remaining.min(self.arena.get(next).size);
            match self.map_block(dev, next, want)? {
                Some(c) => cand = c,
                None => return Ok(None),
            }
        }
        let key = self.arena.get(cand).free_key();
        self.pool(kind).blocks.remove(&key);
        Ok(Some(cand))
    }

    fn allocatable(&self, i: u32) -> bool {
        if i == NIL {
            return false;
        }
        let b = self.arena.get(i);
        !b.allocated && b.event_count == 0 && b.stream_uses.is_empty()
    }

    fn find_expandable_block<B: Backend>(
        &mut self,
        dev: &mut B,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Result<u32, DeviceError> {
        let unmapped: Vec<u32> = self
            .pool(kind)
            .unmapped
            .range((stream.0, 0)..)
            .take_while(|(k, _)| k.0 == stream.0)
            .map(|(_, v)| *v)
            .collect();
        for mut c in unmapped {
            let prev = self.arena.get(c).prev;
            if self.allocatable(prev) {
                c = prev;
            }
            let mut bytes = 0;
            let mut b = c;
            while bytes < size && self.allocatable(b) {
                bytes += self.arena.get(b).size;
                b = self.arena.get(b).next;
            }
            if bytes >= size {
                return Ok(c);
            }
        }
        let page = match kind {
            PoolKind::Small => SMALL_BUFFER,
            PoolKind::Large => self.config.large_segment_size,
        };
        let total = dev.total_memory();
        let address_space = total + total / 8;
        let pages = address_space.div_ceil(page);
        let va_size = pages * page;
        let base = dev.reserve_address_range(va_size)?;
        let es = ExpandableSegment { base, size: va_size, page, mapped: vec![false; pages as usize], live: true };
        self.expandable.push(es);
        let mut b = Block::new(base, va_size, stream, kind);
        b.mapped = false;
        b.expandable = (self.expandable.len() - 1) as u32;
        let id = self.arena.insert(b);
        self.pool(kind).unmapped.insert((stream.0, base), id);
        Ok(id)
    }

    /// Maps the pages covering the first `size` bytes of unmapped block `id`. Returns the
    /// (possibly merged) mapped free block, `None` when the device has no room.
    fn map_block<B: Backend>(&mut self, dev: &mut B, id: u32, size: u64) -> Result<Option<u32>, DeviceError> {
        let b = self.arena.get(id);
        debug_assert!(!b.mapped && size <= b.size);
        let es_idx = b.expandable as usize;
        let (addr, stream, kind) = (b.addr, b.stream, b.pool);
        let es = &self.expandable[es_idx];
        let begin = (addr - es.base) / es.page;
        let end = (addr + size - es.base).div_ceil(es.page);
        let page = es.page;
        let (map_addr, map_size) = (es.base + begin * page, (end - begin) * page);
        if end > begin {
            match dev.map_pages(map_addr, page, end - begin) {
                Ok(()) => {}
                Err(DeviceError::OutOfMemory) => return Ok(None),
                Err(e) => return Err(e),
            }
            let es = &mut self.expandable[es_idx];
            for p in begin..end {
                es.mapped[p as usize] = true;
            }
        } else {
            return Ok(None);
        }
        self.pool(kind).unmapped.remove(&(stream.0, addr));
        self.arena.get_mut(id).mapped = true;
        let bsize = self.arena.get(id).size;
        if map_size < bsize {
            let mut rem = Block::new(addr + map_size, bsize - map_size, stream, kind);
            rem.mapped = false;
            rem.expandable = es_idx as u32;
            rem.prev = id;
            rem.next = self.arena.get(id).next;
            let old_next = rem.next;
            let rid = self.arena.insert(rem);
            if old_next != NIL {
                self.arena.get_mut(old_next).prev = rid;
            }
            let b = self.arena.get_mut(id);
            b.next = rid;
            b.size = map_size;
            self.pool(kind).unmapped.insert((stream.0, addr + map_size), rid);
        }
        let mut cur = id;
        let prev = self.arena.get(cur).prev;
        if let Some((s, _)) = self.try_merge_blocks(cur, prev) {
            cur = s;
        }
        let next = self.arena.get(cur).next;
        if let Some((s, _)) = self.try_merge_blocks(cur, next) {
            cur = s;
        }
        self.insert_into_pool(cur);
        self.total_reserved += map_size;
        inc(&mut self.stats.reserved_bytes, kind, map_size);
        self.stats.num_device_alloc += 1;
        let frames = self.ctx_for_alloc_event();
        self.trace(TraceAction::SegmentMap, map_addr, map_size, stream, frames);
        let now = self.now_peaks();
        self.slots.observe(now);
        Ok(Some(cur))
    }

    /// Unmaps every fully free page inside free block `id`. Returns the slot now holding the
    /// unmapped range (or `id` when nothing could be unmapped).
    fn unmap_block<B: Backend>(&mut self, dev: &mut B, id: u32) -> Result<u32, DeviceError> {
        let b = self.arena.get(id);
        let es_idx = b.expandable as usize;
        let (addr, size, stream, kind, key) = (b.addr, b.size, b.stream, b.pool, b.free_key());
        let es = &self.expandable[es_idx];
        let page = es.page;
        let begin = (addr - es.base).div_ceil(page);
        let end = (addr + size - es.base) / page;
        if begin >= end {
            return Ok(id);
        }
        let (un_addr, un_size) = (es.base + begin * page, (end - begin) * page);
        let result = dev.unmap_pages(un_addr, page, end - begin, stream);
        let es = &mut self.expandable[es_idx];
        for p in begin..end {
            es.mapped[p as usize] = false;
        }
        self.pool(kind).blocks.remove(&key);
        // Free space before and after the unmapped pages stays as free mapped blocks.
        let before = un_addr - addr;
        let after = size - before - un_size;
        let mut cur = id;
        if before > 0 {
            // The slot keeps the low part (free, mapped); a new slot takes the unmapped range.
            let mut u = Block::new(un_addr, un_size, stream, kind);
            u.expandable = es_idx as u32;
            u.prev = id;
            u.next = self.arena.get(id).next;
            let old_next = u.next;
            let uid = self.arena.insert(u);
            if old_next != NIL {
                self.arena.get_mut(old_next).prev = uid;
            }
            let b = self.arena.get_mut(id);
            b.next = uid;
            b.size = before;
            b.requested_size = 0;
            self.insert_into_pool(id);
            cur = uid;
        }
        if after > 0 {
            let c = self.arena.get(cur);
            let mut a = Block::new(un_addr + un_size, after, stream, kind);
            a.expandable = es_idx as u32;
            a.prev = cur;
            a.next = c.next;
            let old_next = a.next;
            let aid = self.arena.insert(a);
            if old_next != NIL {
                self.arena.get_mut(old_next).prev = aid;
            }
            let c = self.arena.get_mut(cur);
            c.next = aid;
            self.insert_into_pool(aid);
        }
        let c = self.arena.get_mut(cur);
        c.addr = un_addr;
        c.size = un_size;
        c.mapped = false;
        let prev = c.prev;
        if let Some((s, _)) = self.try_merge_blocks(cur, prev) {
            cur = s;
        }
        let next = self.arena.get(cur).next;
        if let Some((s, _)) = self.try_merge_blocks(cur, next) {
            cur = s;
        }
        let cur_addr = self.arena.get(cur).addr;
        self.pool(kind).unmapped.insert((stream.0, cur_addr), cur);
        self.total_reserved -= un_size;
        dec(&mut self.stats.reserved_bytes, kind, un_size);
        self.stats.num_device_free += 1;
        let frames = self.ctx_for_free_event(None);
        self.trace(TraceAction::SegmentUnmap, un_addr, un_size, stream, frames);
        result.map(|()| cur)
    }

    fn release_expandable_segment<B: Backend>(&mut self, dev: &mut B, id: u32) -> Result<(), DeviceError> {
        let b = self.arena.get(id);
        let (es_idx, stream, addr, kind) = (b.expandable as usize, b.stream, b.addr, b.pool);
        self.pool(kind).unmapped.remove(&(stream.0, addr));
        self.arena.remove(id);
        let es = &mut self.expandable[es_idx];
        es.live = false;
        dev.release_address_range(es.base, es.size)
    }

    // ----------------------------------------------------------------------------------------
    // inspection

    /// Information about an allocated block.
    pub fn block(&self, id: BlockId) -> Option<BlockView> {
        let b = self.arena.slots.get(id.0 as usize).filter(|b| b.live)?;
        Some(self.view(id.0, b))
    }

    fn view(&self, id: u32, b: &Block) -> BlockView {
        BlockView {
            addr: b.addr,
            size: b.size,
            requested_size: b.requested_size,
            allocated: b.allocated,
            active: b.is_active(),
            tag: b.tag,
            frames: self.block_ctx.get(&id).cloned(),
        }
    }

    /// Segments as PyTorch's snapshot reports them, sorted by address.
    pub fn segments(&self) -> Vec<SegmentView> {
        let mut out = Vec::new();
        for (head_id, head) in self.arena.live() {
            if !head.mapped {
                continue;
            }
            if head.prev != NIL && self.arena.get(head.prev).mapped {
                continue;
            }
            let mut seg = SegmentView {
                address: head.addr,
                total_size: 0,
                stream: head.stream,
                pool: head.pool,
                is_expandable: head.is_expandable(),
                blocks: Vec::new(),
                frames: self.seg_ctx.get(&head.addr).cloned(),
            };
            let mut cur = Some(head_id);
            while let Some(id) = cur {
                let blk = self.arena.get(id);
                if !blk.mapped {
                    break;
                }
                seg.total_size += blk.size;
                seg.blocks.push(self.view(id, blk));
                cur = (blk.next != NIL).then_some(blk.next);
            }
            out.push(seg);
        }
        out.sort_by_key(|s| s.address);
        out
    }

    /// Orders the streams with pending events so that blocks whose addresses come first in
    /// `addrs` are checked first (others keep their order, after them). PyTorch visits streams
    /// in hash-map order; a replay uses this to follow the order a trace recorded.
    pub fn prioritize_pending(&mut self, addrs: &[u64]) {
        let arena = &self.arena;
        self.pending.sort_by_key(|(_, q)| {
            q.front().and_then(|&(_, id)| addrs.iter().position(|&a| a == arena.get(id).addr)).unwrap_or(usize::MAX)
        });
    }

    /// Number of blocks waiting on stream events.
    pub fn pending_frees(&self) -> usize {
        self.pending.iter().map(|(_, q)| q.len()).sum()
    }

    /// Checks every structural and statistical invariant; `Err` names the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        super::invariants::check(self)
    }

    // Accessors for the invariant checker.
    pub(crate) fn parts(&self) -> (&Arena, &BlockPool, &BlockPool, &[ExpandableSegment], &DeviceStats, u64) {
        (&self.arena, &self.small, &self.large, &self.expandable, &self.stats, self.total_reserved)
    }
}

#[cfg(test)]
mod tests {
    //! Policy behaviour on the simulated device, one behaviour per test, invariants recounted
    //! after every step. These also run under Miri (see README, "Testing").
    use super::*;
    use crate::backend::sim::SimBackend;
    use crate::units::{GIB, MIB};

    fn setup(conf: &str) -> (DeviceState, SimBackend) {
        (DeviceState::new(0, AllocatorConfig::parse(conf).unwrap()), SimBackend::new(0, 8 * GIB))
    }

    fn alloc(s: &mut DeviceState, d: &mut SimBackend, n: u64) -> BlockId {
        let a = s.malloc(d, n, StreamId::DEFAULT).unwrap();
        s.check_invariants().unwrap();
        a.block.unwrap()
    }

    fn free(s: &mut DeviceState, d: &mut SimBackend, b: BlockId) {
        s.free(d, b).unwrap();
        s.check_invariants().unwrap();
    }

    #[test]
    fn small_requests_share_a_2mib_segment_and_merge_back() {
        let (mut s, mut d) = setup("");
        let a = alloc(&mut s, &mut d, 1);
        let b = alloc(&mut s, &mut d, 1000);
        assert_eq!(s.segments().len(), 1);
        assert_eq!(s.block(b).unwrap().addr - s.block(a).unwrap().addr, 512);
        free(&mut s, &mut d, a);
        free(&mut s, &mut d, b);
        let segs = s.segments();
        assert_eq!(segs[0].blocks.len(), 1, "all blocks merged back into one");
        assert_eq!(s.stats().inactive_split[0].current, 0);
    }

    #[test]
    fn best_fit_takes_smallest_then_lowest_address() {
        let (mut s, mut d) = setup("");
        // Three 2 MiB-ish large holes of different sizes inside one 20 MiB segment.
        let x: Vec<BlockId> =
            [3 * MIB, 2 * MIB, 4 * MIB, 2 * MIB, 2 * MIB].iter().map(|&n| alloc(&mut s, &mut d, n)).collect();
        let addr = |s: &DeviceState, b| s.block(b).unwrap().addr;
        let (a0, a2) = (addr(&s, x[0]), addr(&s, x[2]));
        free(&mut s, &mut d, x[0]);
        free(&mut s, &mut d, x[2]);
        let y = alloc(&mut s, &mut d, 3 * MIB);
        assert_eq!(addr(&s, y), a0, "3 MiB hole fits exactly and is smaller than the 4 MiB one");
        let z = alloc(&mut s, &mut d, 2 * MIB);
        assert_eq!(addr(&s, z), a2, "the 4 MiB hole is the smallest left");
    }

    #[test]
    fn large_remainder_of_one_mib_or_less_is_not_split() {
        let (mut s, mut d) = setup("");
        let a = alloc(&mut s, &mut d, 21 * MIB);
        assert_eq!(s.block(a).unwrap().size, 22 * MIB);
        assert_eq!(s.stats().inactive_split_bytes[0].current, 0);
    }

    #[test]
    fn streams_never_share_free_blocks() {
        let (mut s, mut d) = setup("");
        let a = alloc(&mut s, &mut d, 4 * MIB);
        free(&mut s, &mut d, a);
        let side = d.new_stream();
        s.malloc(&mut d, 4 * MIB, side).unwrap();
        assert_eq!(s.stats().reserved_bytes[0].current as u64, 40 * MIB);
    }

    #[test]
    fn cross_stream_free_waits_for_the_event() {
        let (mut s, mut d) = setup("");
        let side = d.new_stream();
        let a = alloc(&mut s, &mut d, 4 * MIB);
        d.set_stream_busy(side, true);
        s.record_stream(a, side).unwrap();
        free(&mut s, &mut d, a);
        assert_eq!(s.pending_frees(), 1);
        assert_eq!(s.stats().active_bytes[0].current as u64, 4 * MIB);
        // Not complete yet: a new request cannot reuse it.
        let b = alloc(&mut s, &mut d, 4 * MIB);
        assert_ne!(s.block(b).unwrap().addr, s.block(a).map_or(0, |v| v.addr));
        assert_eq!(s.stats().reserved_bytes[0].current as u64, 20 * MIB, "the pending block's segment still has room");
        assert_eq!(s.pending_frees(), 1);
        d.synchronize();
        s.process_events(&mut d).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(s.pending_frees(), 0);
        assert_eq!(s.stats().active_bytes[0].current as u64, 4 * MIB);
    }

    #[test]
    fn oom_injection_releases_cache_and_retries() {
        let (mut s, mut d) = setup("");
        let a = alloc(&mut s, &mut d, 50 * MIB);
        free(&mut s, &mut d, a);
        d.fail_next_reserves(1);
        // 60 MiB does not fit the cached 50 MiB block: the device refuses once, the cache is
        // released, the retry succeeds.
        let b = alloc(&mut s, &mut d, 60 * MIB);
        assert_eq!(s.stats().num_alloc_retries, 1);
        assert_eq!(s.stats().num_device_free, 1, "the cached 50 MiB segment was released");
        assert!(s.block(b).is_some());
    }

    #[test]
    fn slots_see_peaks_inside_their_own_window() {
        let (mut s, mut d) = setup("");
        let outer = s.open_slot();
        let a = alloc(&mut s, &mut d, 8 * MIB);
        free(&mut s, &mut d, a);
        let inner = s.open_slot();
        let b = alloc(&mut s, &mut d, 2 * MIB);
        assert_eq!(s.slot_peaks(inner).unwrap().allocated as u64, 2 * MIB);
        assert_eq!(s.slot_peaks(outer).unwrap().allocated as u64, 8 * MIB);
        s.reset_slot(inner);
        assert_eq!(s.slot_peaks(outer).unwrap().allocated as u64, 8 * MIB);
        s.reset_peak_stats();
        assert_eq!(s.slot_peaks(outer).unwrap().allocated as u64, 8 * MIB, "global reset leaves slots alone");
        free(&mut s, &mut d, b);
        s.close_slot(inner);
        assert!(s.slot_peaks(inner).is_none());
    }

    /// A deterministic pseudo-random walk (small enough for Miri) over every operation.
    #[test]
    fn random_walk_keeps_invariants() {
        for conf in ["", "max_split_size_mb:20", "expandable_segments:True"] {
            let mut s = DeviceState::new(0, AllocatorConfig::parse(conf).unwrap());
            let mut d = SimBackend::new(0, 256 * MIB);
            let side = d.new_stream();
            let mut live: Vec<BlockId> = Vec::new();
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            let steps = if cfg!(miri) { 120 } else { 2000 };
            for _ in 0..steps {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                match x % 10 {
                    0..=4 => {
                        let size = 1 + (x >> 8) % [4096, 2 * MIB, 40 * MIB][(x >> 4) as usize % 3];
                        let stream = if x & 0x100 == 0 { StreamId::DEFAULT } else { side };
                        if let Ok(a) = s.malloc(&mut d, size, stream) {
                            live.push(a.block.unwrap());
                        }
                    }
                    5..=7 if !live.is_empty() => {
                        let b = live.swap_remove((x >> 16) as usize % live.len());
                        if x & 0x200 != 0 {
                            d.set_stream_busy(StreamId(7), true);
                            s.record_stream(b, StreamId(7)).unwrap();
                        }
                        s.free(&mut d, b).unwrap();
                    }
                    8 => d.set_stream_busy(StreamId(7), false),
                    9 => s.empty_cache(&mut d).unwrap(),
                    _ => {}
                }
                s.check_invariants().unwrap_or_else(|e| panic!("{conf}: {e}"));
            }
            for b in live {
                s.free(&mut d, b).unwrap();
            }
            d.synchronize();
            s.empty_cache(&mut d).unwrap();
            s.check_invariants().unwrap();
            assert_eq!(s.stats().reserved_bytes[0].current, 0, "{conf}");
            assert_eq!(d.used(), 0, "{conf}: every byte returned to the device");
        }
    }
}
