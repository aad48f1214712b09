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
        self.reserve_range(dev, kind, stream, page, 0)
    }

    /// A new address range for `stream` with nothing mapped: 1.125 × the device's memory (as
    /// PyTorch reserves), or `at_least` bytes if more, in whole pages. Returns its one
    /// unmapped block (in `kind`'s unmapped set).
    pub(super) fn reserve_range<B: Backend>(
        &mut self,
        dev: &mut B,
        kind: PoolKind,
        stream: StreamId,
        page: u64,
        at_least: u64,
    ) -> Result<u32, DeviceError> {
        let total = dev.total_memory();
        let address_space = (total + total / 8).max(at_least);
        let pages = address_space.div_ceil(page);
        let va_size = pages * page;
        let base = dev.reserve_address_range(va_size)?;
        let es = ExpandableSegment { base, size: va_size, page, pages: vec![None; pages as usize], live: true };
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
        let (addr, kind) = (b.addr, b.pool);
        let es = &self.expandable[b.expandable as usize];
        let begin = (addr - es.base) / es.page;
        let end = (addr + size - es.base).div_ceil(es.page);
        let page = es.page;
        let (map_addr, map_size) = (es.base + begin * page, (end - begin) * page);
        if end <= begin {
            return Ok(None);
        }
        match dev.map_pages(map_addr, page, end - begin) {
            Ok(()) => {}
            Err(DeviceError::OutOfMemory) => return Ok(None),
            Err(e) => return Err(e),
        }
        Ok(Some(self.mark_mapped(id, map_addr, map_addr + map_size, kind)))
    }

    /// Pages `[from, to)` of unmapped block `id` were just mapped, counted for `owner`: they
    /// become a free block, merged with free neighbours, in the pool; the rest of `id` stays
    /// unmapped. Returns the free block.
    pub(super) fn mark_mapped(&mut self, id: u32, from: u64, to: u64, owner: PoolKind) -> u32 {
        let b = self.arena.get(id);
        let (addr, end, stream, kind, es_idx) = (b.addr, b.addr + b.size, b.stream, b.pool, b.expandable);
        debug_assert!(!b.mapped && addr <= from && from < to && to <= end);
        self.pool(kind).unmapped.remove(&(stream.0, addr));
        let mut cur = id;
        if from > addr {
            // The slot keeps the unmapped range below; a new slot takes the rest.
            let mut rest = Block::new(from, end - from, stream, kind);
            rest.mapped = false;
            rest.expandable = es_idx;
            cur = self.arena.insert_after(id, rest);
            self.arena.get_mut(id).size = from - addr;
            self.pool(kind).unmapped.insert((stream.0, addr), id);
        }
        self.arena.get_mut(cur).mapped = true;
        if to < end {
            let mut rem = Block::new(to, end - to, stream, kind);
            rem.mapped = false;
            rem.expandable = es_idx;
            let rid = self.arena.insert_after(cur, rem);
            self.arena.get_mut(cur).size = to - from;
            self.pool(kind).unmapped.insert((stream.0, to), rid);
        }
        let es = &mut self.expandable[es_idx as usize];
        let (first, last) = (es.page_of(from), es.page_of(to - 1));
        es.pages[first..=last].fill(Some(owner));
        let prev = self.arena.get(cur).prev;
        if let Some((s, _)) = self.try_merge_blocks(cur, prev) {
            cur = s;
        }
        let next = self.arena.get(cur).next;
        if let Some((s, _)) = self.try_merge_blocks(cur, next) {
            cur = s;
        }
        self.insert_into_pool(cur);
        let bytes = to - from;
        self.total_reserved += bytes;
        inc(&mut self.stats.reserved_bytes, owner, bytes);
        self.stats.num_device_alloc += 1;
        let frames = self.ctx_for_alloc_event();
        self.trace(TraceAction::SegmentMap, from, bytes, stream, frames);
        let now = self.now_peaks();
        self.slots.observe(now);
        cur
    }

    /// Unmaps every fully free page inside free block `id`. Returns the slot now holding the
    /// unmapped range (or `id` when nothing could be unmapped).
    pub(super) fn unmap_block<B: Backend>(&mut self, dev: &mut B, id: u32) -> Result<u32, DeviceError> {
        match self.whole_pages(id) {
            Some((un_addr, un_size)) => self.unmap_range(dev, id, un_addr, un_size),
            None => Ok(id),
        }
    }

    /// The fully free pages inside free block `id`, as (address, bytes), if any.
    pub(super) fn whole_pages(&self, id: u32) -> Option<(u64, u64)> {
        let b = self.arena.get(id);
        let es = &self.expandable[b.expandable as usize];
        let begin = (b.addr - es.base).div_ceil(es.page);
        let end = (b.addr + b.size - es.base) / es.page;
        (begin < end).then(|| (es.base + begin * es.page, (end - begin) * es.page))
    }

    /// Unmaps the whole pages `[un_addr, un_addr + un_size)` inside free block `id` (after the
    /// block's stream finishes its work). Returns the slot now holding the unmapped range.
    pub(super) fn unmap_range<B: Backend>(
        &mut self,
        dev: &mut B,
        id: u32,
        un_addr: u64,
        un_size: u64,
    ) -> Result<u32, DeviceError> {
        let b = self.arena.get(id);
        let es_idx = b.expandable as usize;
        let (addr, size, stream, kind, key) = (b.addr, b.size, b.stream, b.pool, b.free_key());
        let page = self.expandable[es_idx].page;
        let result = dev.unmap_pages(un_addr, page, un_size / page, stream);
        let es = &mut self.expandable[es_idx];
        let mut owned = [0u64; 2];
        let (first, end) = (es.page_of(un_addr), es.page_of(un_addr + un_size));
        for p in &mut es.pages[first..end] {
            owned[usize::from(*p == Some(PoolKind::Large))] += page;
            *p = None;
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
        for (owner, bytes) in [(PoolKind::Small, owned[0]), (PoolKind::Large, owned[1])] {
            if bytes > 0 {
                dec(&mut self.stats.reserved_bytes, owner, bytes);
            }
        }
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
