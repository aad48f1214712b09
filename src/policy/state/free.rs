//! `free`, `record_stream` and stream events (Note [Cross-stream frees]), and merging a freed
//! block with its free neighbours.
use super::*;
use crate::device::{Backend, DeviceError};
use crate::policy::freeset::FreeKey;
use std::collections::VecDeque;

impl DeviceState {
    #[inline]
    pub(super) fn check_allocated(&self, id: BlockId) -> Result<u32, DeviceError> {
        match self.arena.slots.get(id.0 as usize) {
            Some(b) if b.live && b.allocated => Ok(id.0),
            _ => Err(not_allocated(id)),
        }
    }

    /// An allocated block's address and size (`None`: not an allocated block).
    pub(crate) fn allocated_block(&self, id: BlockId) -> Option<(u64, u64)> {
        let i = self.check_allocated(id).ok()?;
        let b = self.arena.get(i);
        Some((b.addr, b.size))
    }

    /// The caller releases a block. It returns to the pool now, or once events on every other
    /// stream that used it complete (Note [Cross-stream frees]).
    pub(crate) fn free<B: Backend>(&mut self, dev: &mut B, block: BlockId) -> Result<(), DeviceError> {
        let id = self.check_allocated(block)?;
        let b = self.arena.get_mut(id);
        let (addr, size, req, stream, pool) = (b.addr, b.size, b.requested_size, b.stream, b.pool);
        let (has_uses, component) = (b.has_uses, b.component);
        // Stored after the reads: the component byte may be read as part of a wider word, which
        // would then wait for this store to reach the cache (a failed store-to-load forward).
        b.allocated = false;
        dec(&mut self.stats.allocation, pool, 1);
        dec(&mut self.stats.allocated_bytes, pool, size);
        self.component_free(component, size);
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
    pub(crate) fn record_stream(&mut self, block: BlockId, stream: StreamId) -> Result<(), DeviceError> {
        let id = self.check_allocated(block)?;
        let b = self.arena.get_mut(id);
        if stream != b.stream {
            let uses = self.stream_uses.entry(id).or_default();
            if !uses.contains(&stream) {
                uses.push(stream);
                b.has_uses = true;
            }
        }
        Ok(())
    }

    pub(super) fn insert_events<B: Backend>(&mut self, dev: &mut B, id: u32) -> Result<(), DeviceError> {
        self.arena.get_mut(id).has_uses = false;
        let streams = self.stream_uses.remove(&id).unwrap_or_default();
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
    pub(crate) fn process_events<B: Backend>(&mut self, dev: &mut B) -> Result<(), DeviceError> {
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

    pub(super) fn event_done(&mut self, id: u32) {
        let b = self.arena.get_mut(id);
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(id);
        }
    }

    pub(super) fn synchronize_and_free_events<B: Backend>(&mut self, dev: &mut B) -> Result<(), DeviceError> {
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
    pub(super) fn free_block(&mut self, id: u32) {
        let b = self.arena.get(id);
        debug_assert!(!b.allocated && b.event_count == 0 && !b.has_uses);
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
        let b = self.arena.get_mut(id);
        b.tag = 0;
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
    pub(super) fn try_merge_blocks(&mut self, dst: u32, src: u32) -> Option<(u32, u64)> {
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
    pub(super) fn mergeable(&self, dst: u32, src: u32) -> bool {
        if src == NIL {
            return false;
        }
        let s = self.arena.get(src);
        !(s.allocated || s.event_count > 0 || s.has_uses || s.mapped != self.arena.get(dst).mapped)
    }

    /// As [`Self::try_merge_blocks`] for a block being freed (mapped, so only mapped neighbours
    /// merge), but leaves the neighbour's pool entry for the caller, returning its key.
    #[inline]
    pub(super) fn merge_free_neighbour(&mut self, dst: u32, src: u32) -> Option<(u32, u64, FreeKey)> {
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
    pub(super) fn link_merge(&mut self, dst: u32, src: u32) -> (u32, u64) {
        let ssize = self.arena.get(src).size;
        if self.arena.get(dst).prev == src {
            // [src dst]: keep src's slot (the lower address), give it dst's identity.
            let d = *self.arena.get(dst);
            let sb = self.arena.get_mut(src);
            sb.size += d.size;
            sb.next = d.next;
            sb.requested_size = d.requested_size;
            sb.tag = d.tag;
            sb.component = d.component;
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
}

/// [`DeviceState::check_allocated`]'s error, built out of line (a free's hot path inlines the
/// check).
#[cold]
fn not_allocated(id: BlockId) -> DeviceError {
    DeviceError::Driver(format!("block {} is not an allocated block of this device", id.0))
}
