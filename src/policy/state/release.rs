//! Giving cached memory back to the device: `empty_cache`, the release steps of the OOM
//! sequence (`release_available_cached_blocks`, `release_cached_blocks`) and the garbage
//! collection threshold.
use super::*;
use crate::device::{Backend, DeviceError};

impl DeviceState {
    /// `empty_cache`: wait for pending stream events, then return every fully free segment
    /// (and every fully free page of expandable segments) to the device.
    pub(crate) fn empty_cache<B: Backend>(&mut self, dev: &mut B) -> Result<(), DeviceError> {
        self.release_cached_blocks(dev)
    }

    pub(super) fn release_cached_blocks<B: Backend>(&mut self, dev: &mut B) -> Result<(), DeviceError> {
        self.synchronize_and_free_events(dev)?;
        self.release_blocks(dev, PoolKind::Large)?;
        self.release_blocks(dev, PoolKind::Small)
    }

    pub(super) fn release_blocks<B: Backend>(&mut self, dev: &mut B, kind: PoolKind) -> Result<(), DeviceError> {
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
    pub(super) fn release_block<B: Backend>(&mut self, dev: &mut B, id: u32) -> Result<(), DeviceError> {
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
    pub(super) fn release_available_cached_blocks<B: Backend>(
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
        let pool = self.pool_ref(kind);
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
    pub(super) fn garbage_collect_cached_blocks<B: Backend>(&mut self, dev: &mut B) -> Result<(), DeviceError> {
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
}
