//! Expandable segments: one reserved address range per pool and stream that grows by mapping
//! pages and shrinks by unmapping fully free ones (`expandable_segments:True`).
use super::*;
use crate::device::{Backend, DeviceError};
use crate::policy::constants::SMALL_BUFFER;

impl DeviceState {
    pub(super) fn try_allocate_expandable_block<B: Backend>(
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

    pub(super) fn allocatable(&self, i: u32) -> bool {
        if i == NIL {
            return false;
        }
        let b = self.arena.get(i);
        !b.allocated && b.event_count == 0 && !b.has_uses
    }

    pub(super) fn find_expandable_block<B: Backend>(
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
    pub(super) fn map_block<B: Backend>(
        &mut self,
        dev: &mut B,
        id: u32,
        size: u64,
    ) -> Result<Option<u32>, DeviceError> {
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
            let rid = self.arena.insert_after(id, rem);
            self.arena.get_mut(id).size = map_size;
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
    pub(super) fn unmap_block<B: Backend>(&mut self, dev: &mut B, id: u32) -> Result<u32, DeviceError> {
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
            let uid = self.arena.insert_after(id, u);
            let b = self.arena.get_mut(id);
            b.size = before;
            b.requested_size = 0;
            self.insert_into_pool(id);
            cur = uid;
        }
        if after > 0 {
            let mut a = Block::new(un_addr + un_size, after, stream, kind);
            a.expandable = es_idx as u32;
            let aid = self.arena.insert_after(cur, a);
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

    pub(super) fn release_expandable_segment<B: Backend>(&mut self, dev: &mut B, id: u32) -> Result<(), DeviceError> {
        let b = self.arena.get(id);
        let (es_idx, stream, addr, kind) = (b.expandable as usize, b.stream, b.addr, b.pool);
        self.pool(kind).unmapped.remove(&(stream.0, addr));
        self.arena.remove(id);
        let es = &mut self.expandable[es_idx];
        es.live = false;
        dev.release_address_range(es.base, es.size)
    }
}
