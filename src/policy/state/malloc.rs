//! `malloc`: PyTorch's sequence — completed events first, best fit from the pool, else a new
//! segment; on failure free oversize cached blocks, then everything cached, and retry; then
//! out-of-memory with PyTorch's numbers.
use super::*;
use crate::device::{Backend, DeviceError};
use crate::policy::constants::{MIN_BLOCK_SIZE, ONE_EXA_BYTE, SMALL_SIZE};
use crate::policy::oom::{AllocError, OomReport};
use crate::policy::rounding::{allocation_size, round_size};

impl DeviceState {
    /// Allocates `orig_size` bytes for `stream`, PyTorch's sequence: process completed events,
    /// best fit from the pool, else a new segment; on failure free oversize cached blocks (with
    /// `max_split_size`), then every cached block, and retry; then out-of-memory.
    pub(crate) fn malloc<B: Backend>(
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
        if self.config.compact {
            return self.compact_malloc(dev, orig_size, size, stream);
        }
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

    pub(super) fn out_of_memory<B: Backend>(
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
        let parts = self.explain_ooms.then(|| self.reserved_parts());
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
            parts,
        }))
    }

    pub(super) fn get_free_block(&mut self, kind: PoolKind, stream: StreamId, size: u64) -> Option<u32> {
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

    pub(super) fn should_split(&self, id: u32, size: u64) -> bool {
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
    pub(super) fn alloc_block<B: Backend>(
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

    pub(super) fn insert_into_pool(&mut self, id: u32) {
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
    pub(super) fn alloc_found_block(
        &mut self,
        id: u32,
        orig_size: u64,
        size: u64,
        split: bool,
        in_pool: bool,
    ) -> Allocation {
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
            let rem_size = rem.size;
            let rid = self.arena.insert_after(id, rem);
            self.arena.get_mut(id).size = size;
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
        let bsize = self.arena.get(id).size;
        let component = self.component_alloc(bsize);
        let b = self.arena.get_mut(id);
        b.allocated = true;
        b.requested_size = orig_size;
        b.tag = tag;
        b.component = component;
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
}
