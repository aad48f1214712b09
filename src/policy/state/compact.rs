//! `compact:True`: our own policy (not PyTorch's) that keeps PyTorch's API and statistics but
//! reserves less device memory (issue 13; the evidence is in BENCHMARKS.md, "Replay").
//!
//! Memory is 2 MiB physical pages mapped into one address range ("arena") per stream and pool:
//! small requests (≤ 1 MiB) and large ones keep apart, as PyTorch keeps its pools, so a small block
//! never pins a page in the middle of a large free run: large free space stays in whole pages,
//! which move between arenas of any pool and stream. Blocks never move, so the fast path and `free`
//! are PyTorch's own: best fit over the stream's free mapped blocks of the request's pool, split at
//! any 512 B, merge on free, no device call. The difference is the slow path, when no free block
//! fits: the request goes where it needs the fewest new pages (an unmapped hole, with the free
//! blocks beside it), and those pages are either created (reserved grows) or taken from whole free
//! pages elsewhere (unmapped there, mapped here: reserved unchanged). A request that sets a new
//! peak of active bytes takes pages first; any other grows while reserved stays within
//! `compact_slack_bp` over that peak, so a warm training loop maps nothing per iteration.
//!
//! Blocks of an arena: allocated (or pending stream events), free and mapped (in the arena's
//! pool's free set, whatever their size), or unmapped (page aligned at both ends, in that pool's
//! unmapped set). Every block of an arena has the arena's pool, and so do its pages
//! (`ExpandableSegment::pages`).
//! As with expandable segments, `reserved` is mapped bytes, `segment` and `inactive_split` stay
//! 0, and `num_device_alloc` / `num_device_free` count map and unmap calls.
//!
//! Moving a page (Stage 1 of the design): `unmap_pages` synchronises the source block's stream,
//! unmaps and releases the page; `map_pages` creates and maps a new one. A block is free only
//! once its cross-stream events completed, so its own stream is the only work that can still
//! touch it.
use super::*;
use crate::device::{Backend, DeviceError};
use crate::policy::constants::{MIN_BLOCK_SIZE, SMALL_BUFFER};
use crate::policy::oom::AllocError;

/// The page of compact arenas: CUDA's mapping granularity.
pub(crate) const PAGE: u64 = SMALL_BUFFER;

/// Where a request that no free block fits goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Placement {
    /// Pages to map (the first criterion), the size of the free run around the hole, and the
    /// address: the least of these wins.
    pages: u64,
    run: u64,
    pos: u64,
    /// The unmapped block (hole) and the free mapped blocks just before and after it, or NIL.
    hole: u32,
    before: u32,
    after: u32,
}

impl DeviceState {
    /// `malloc` under `compact` for a rounded `size`: best fit, else the slow path; on failure
    /// wait for every stream event and retry once; then out-of-memory.
    pub(super) fn compact_malloc<B: Backend>(
        &mut self,
        dev: &mut B,
        orig_size: u64,
        size: u64,
        stream: StreamId,
    ) -> Result<Allocation, AllocError> {
        let kind = PoolKind::for_size(size);
        for is_retry in [false, true] {
            if is_retry {
                self.synchronize_and_free_events(dev)?;
                self.stats.num_alloc_retries += 1;
            }
            let found = match self.compact_free_block(kind, stream, size) {
                Some(id) => Some(id),
                None => self.compact_alloc_block(dev, kind, stream, size)?,
            };
            if let Some(id) = found {
                let split = self.arena.get(id).size - size >= MIN_BLOCK_SIZE;
                return Ok(self.alloc_found_block(id, orig_size, size, split, true));
            }
        }
        Err(self.out_of_memory(dev, size, size.div_ceil(PAGE) * PAGE, orig_size, stream))
    }

    /// Best fit among the stream's free mapped blocks of pool `kind` (left in the pool).
    #[inline]
    fn compact_free_block(&self, kind: PoolKind, stream: StreamId, size: u64) -> Option<u32> {
        let (key, id) = self.pool_ref(kind).blocks.lower_bound((stream.0, size, 0))?;
        (key.0 == stream.0).then_some(id)
    }

    /// A free mapped block or a free run of pages around an unmapped hole.
    #[inline]
    fn free_mapped(&self, i: u32) -> bool {
        i != NIL && self.arena.get(i).mapped && self.allocatable(i)
    }

    /// The slow path: places the request, maps the pages it needs (created, or taken from
    /// free pages elsewhere), and returns a free block starting where the request goes.
    /// `Ok(None)` when the pages cannot be had.
    fn compact_alloc_block<B: Backend>(
        &mut self,
        dev: &mut B,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Result<Option<u32>, DeviceError> {
        if size > dev.total_memory() {
            return Ok(None); // No device of this size could map it: fail without trying.
        }
        let active = self.stats.active_bytes[0].current as u64 + size;
        let high = self.compact_high.max(self.stats.active_bytes[0].peak as u64);
        let new_peak = active > high;
        self.compact_high = high.max(active);
        let place = match self.placement(kind, stream, size) {
            Some(p) => p,
            None => {
                match self.reserve_range(dev, kind, stream, PAGE, size) {
                    Ok(_) => {}
                    Err(DeviceError::OutOfMemory) => return Ok(None),
                    Err(e) => return Err(e),
                }
                self.placement(kind, stream, size).expect("a new arena holds the request")
            }
        };
        let (from, to) = self.pages_in_hole(place.hole, place.pos, size);
        let pages = (to - from) / PAGE;
        // Grow within the slack over the active peak, except at a new peak: take pages first.
        let peak_pages = self.compact_high.div_ceil(PAGE);
        let budget = peak_pages + peak_pages * self.config.compact_slack_bp / 10_000;
        let grow = if new_peak { 0 } else { pages.min(budget.saturating_sub(self.total_reserved / PAGE)) };
        let keep = [place.before, place.after];
        self.reclaim(dev, pages - grow, stream, keep)?;
        loop {
            let over = self.allowed.map_or(0, |a| (self.total_reserved + pages * PAGE).saturating_sub(a));
            if over == 0 {
                match dev.map_pages(from, PAGE, pages) {
                    Ok(()) => break,
                    Err(DeviceError::OutOfMemory) => {}
                    Err(e) => return Err(e),
                }
            }
            // No room for new pages (the device, or the memory fraction): take more instead.
            let want = if over > 0 { over.div_ceil(PAGE) } else { pages };
            if self.reclaim(dev, want, stream, keep)? == 0 {
                return Ok(None);
            }
        }
        let run = self.mark_mapped(place.hole, from, to, kind);
        Ok(Some(self.split_front(run, place.pos)))
    }

    /// The placement needing the fewest new pages among the unmapped holes of the stream's
    /// arenas of pool `kind`: at the start of the free run around a hole, or at its end (except
    /// in an arena's growing top, kept whole). `None` when no hole is large enough.
    fn placement(&self, kind: PoolKind, stream: StreamId, size: u64) -> Option<Placement> {
        let mut best: Option<Placement> = None;
        let pool = self.pool_ref(kind);
        for (_, &hole) in pool.unmapped.range((stream.0, 0)..).take_while(|(k, _)| k.0 == stream.0) {
            let h = self.arena.get(hole);
            let (h0, h1) = (h.addr, h.addr + h.size);
            let before = if self.free_mapped(h.prev) { h.prev } else { NIL };
            let after = if self.free_mapped(h.next) { h.next } else { NIL };
            let r0 = if before == NIL { h0 } else { self.arena.get(before).addr };
            let r1 = if after == NIL { h1 } else { h1 + self.arena.get(after).size };
            if r1 - r0 < size {
                continue;
            }
            let top = h.next == NIL;
            for pos in [Some(r0), (!top).then_some(r1 - size)].into_iter().flatten() {
                let (from, to) = self.pages_in_hole(hole, pos, size);
                let cand = Placement { pages: (to - from) / PAGE, run: r1 - r0, pos, hole, before, after };
                if cand.pages > 0 && best.is_none_or(|b| cand < b) {
                    best = Some(cand);
                }
            }
        }
        best
    }

    /// The pages of unmapped block `hole` (page aligned) that `[pos, pos + size)` touches, as
    /// an address range; empty when it touches none.
    fn pages_in_hole(&self, hole: u32, pos: u64, size: u64) -> (u64, u64) {
        let h = self.arena.get(hole);
        let (lo, hi) = (h.addr.max(pos), (h.addr + h.size).min(pos + size));
        if lo >= hi {
            return (lo, lo);
        }
        (h.addr + (lo - h.addr) / PAGE * PAGE, h.addr + (hi - h.addr).div_ceil(PAGE) * PAGE)
    }

    /// Unmaps up to `pages` whole free pages of any stream's and pool's arenas, largest free
    /// blocks first (the requesting stream's first among equals, then the lowest address), the
    /// highest pages of each, never from the blocks in `keep`. Returns the pages unmapped.
    fn reclaim<B: Backend>(
        &mut self,
        dev: &mut B,
        pages: u64,
        stream: StreamId,
        keep: [u32; 2],
    ) -> Result<u64, DeviceError> {
        if pages == 0 {
            return Ok(0);
        }
        let mut free = self.large.blocks.values();
        free.extend(self.small.blocks.values());
        let mut sources: Vec<(std::cmp::Reverse<u64>, bool, u64, u32, u64, u64)> = free
            .into_iter()
            .filter(|id| !keep.contains(id))
            .filter_map(|id| {
                let b = self.arena.get(id);
                let (addr, bytes) = self.whole_pages(id)?;
                Some((std::cmp::Reverse(b.size), b.stream != stream, b.addr, id, addr + bytes, bytes / PAGE))
            })
            .collect();
        sources.sort_unstable();
        let mut got = 0;
        for (_, _, _, id, end, whole) in sources {
            if got == pages {
                break;
            }
            let take = whole.min(pages - got);
            self.unmap_range(dev, id, end - take * PAGE, take * PAGE)?;
            got += take;
        }
        Ok(got)
    }

    /// Splits free block `id` at `pos` (inside it) and returns the block starting there; both
    /// stay in the pool.
    fn split_front(&mut self, id: u32, pos: u64) -> u32 {
        let b = *self.arena.get(id);
        if b.addr == pos {
            return id;
        }
        let mut rest = Block::new(pos, b.addr + b.size - pos, b.stream, b.pool);
        rest.expandable = b.expandable;
        let rid = self.arena.insert_after(id, rest);
        self.arena.get_mut(id).size = pos - b.addr;
        let front = self.arena.get(id).free_key();
        self.pool(b.pool).blocks.replace(&b.free_key(), front, id);
        self.insert_into_pool(rid);
        rid
    }
}
