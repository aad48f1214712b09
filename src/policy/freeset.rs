//! The free-block index: free mapped blocks ordered by (stream, size, address), so best fit is
//! one lower-bound lookup (PyTorch keeps a `std::set` with the same order).
#![forbid(unsafe_code)]

/// Key of a free block: (stream, size, address).
pub(crate) type FreeKey = (u64, u64, u64);

/// Free mapped blocks ordered by (stream, size, address): best fit is one lower-bound lookup.
///
/// Every search stays within one stream (PyTorch's key starts with the stream and a candidate
/// of another stream is no fit), so the set is one [`SizeAddrSet`] per stream, kept in stream
/// order; within a stream the key (size, address) packs into one `u128`, compared in one step.
#[derive(Clone, Debug, Default)]
pub(crate) struct FreeSet {
    streams: Vec<(u64, SizeAddrSet)>,
    len: usize,
}

#[inline]
fn pack(size: u64, addr: u64) -> u128 {
    ((size as u128) << 64) | addr as u128
}

#[inline]
fn unpack(stream: u64, k: u128) -> FreeKey {
    (stream, (k >> 64) as u64, k as u64)
}

impl FreeSet {
    #[inline]
    fn stream(&self, stream: u64) -> Option<&SizeAddrSet> {
        self.streams.iter().find(|(s, _)| *s == stream).map(|(_, set)| set)
    }
    #[inline]
    pub(crate) fn insert(&mut self, key: FreeKey, id: u32) {
        self.len += 1;
        let set = match self.streams.iter().position(|(s, _)| *s == key.0) {
            Some(i) => &mut self.streams[i].1,
            None => {
                let i = self.streams.partition_point(|(s, _)| *s < key.0);
                self.streams.insert(i, (key.0, SizeAddrSet::default()));
                &mut self.streams[i].1
            }
        };
        set.insert(pack(key.1, key.2), id);
    }
    #[inline]
    pub(crate) fn remove(&mut self, key: &FreeKey) -> Option<u32> {
        let i = self.streams.iter().position(|(s, _)| *s == key.0)?;
        let id = self.streams[i].1.remove(pack(key.1, key.2))?;
        self.len -= 1;
        Some(id)
    }
    pub(crate) fn get(&self, key: &FreeKey) -> Option<&u32> {
        self.stream(key.0)?.get(pack(key.1, key.2))
    }
    /// Replaces entry `old` by (`new`, `id`): the same as `remove(old)` then `insert(new, id)`,
    /// done in place when `new` sorts where `old` was (a split remainder or a merged block
    /// usually does). `old` must be present.
    #[inline]
    pub(crate) fn replace(&mut self, old: &FreeKey, new: FreeKey, id: u32) {
        if let Some((_, set)) = self.streams.iter_mut().find(|(s, _)| *s == old.0).filter(|_| old.0 == new.0) {
            set.replace(pack(old.1, old.2), pack(new.1, new.2), id);
            return;
        }
        self.remove(old);
        self.insert(new, id);
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    /// The first entry of `from`'s stream with key ≥ `from`.
    #[inline]
    pub(crate) fn lower_bound(&self, from: FreeKey) -> Option<(FreeKey, u32)> {
        let (k, id) = self.stream(from.0)?.lower_bound(pack(from.1, from.2))?;
        Some((unpack(from.0, k), id))
    }
    /// Entries of `from`'s stream with keys ≥ `from`, ascending.
    pub(crate) fn range_from(&self, from: FreeKey) -> impl Iterator<Item = (FreeKey, u32)> + '_ {
        let k = pack(from.1, from.2);
        self.stream(from.0)
            .into_iter()
            .flat_map(move |set| set.range_from(k).map(move |(k, id)| (unpack(from.0, k), id)))
    }
    /// Entries of `to`'s stream with keys < `to`, descending.
    pub(crate) fn range_below_rev(&self, to: FreeKey) -> impl Iterator<Item = (FreeKey, u32)> + '_ {
        let k = pack(to.1, to.2);
        self.stream(to.0)
            .into_iter()
            .flat_map(move |set| set.range_below_rev(k).map(move |(k, id)| (unpack(to.0, k), id)))
    }
    /// All block ids, in PyTorch's order: (stream, size, address).
    pub(crate) fn values(&self) -> Vec<u32> {
        self.streams.iter().flat_map(|(_, set)| set.iter().map(|(_, id)| id)).collect()
    }
    /// Checks the index's internal order and counts (for `check_invariants`).
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut n = 0;
        for w in self.streams.windows(2) {
            if w[0].0 >= w[1].0 {
                return Err("free-block index: streams out of order".into());
            }
        }
        for (_, set) in &self.streams {
            set.check()?;
            n += set.len;
        }
        if n != self.len {
            return Err("free-block index: counts disagree".into());
        }
        Ok(())
    }
}

/// One stream's free blocks by packed (size, address): a two-level sorted list — runs
/// ("chunks") of at most [`SizeAddrSet::CHUNK_MAX`] sorted entries plus the last key of each
/// chunk. A lookup is two binary searches; an update moves at most one chunk's entries. No
/// allocation per entry, no pointer chasing, logarithmic with a small constant at any size.
/// The last chunk's allocation is kept when the set empties (the hot path empties and refills
/// a pool on every pair).
#[derive(Clone, Debug, Default)]
pub(crate) struct SizeAddrSet {
    chunks: Vec<Vec<(u128, u32)>>,
    /// `lasts[i]` is the last (largest) key of `chunks[i]`; one entry per non-empty chunk.
    lasts: Vec<u128>,
    len: usize,
}

impl SizeAddrSet {
    /// Entries per chunk before it splits in two.
    pub(crate) const CHUNK_MAX: usize = 16;

    /// Chunk that holds, or would hold, `key`.
    #[inline]
    fn chunk_for(&self, key: u128) -> usize {
        match (self.len, self.chunks.len()) {
            (0, n) => n,
            // One chunk (the common case): it holds every key, or would.
            (_, 1) => usize::from(key > self.lasts[0]),
            _ => self.lasts.partition_point(|&l| l < key),
        }
    }

    #[inline]
    fn insert(&mut self, key: u128, id: u32) {
        self.len += 1;
        if self.len == 1 {
            match self.chunks.first_mut() {
                Some(c) => c.push((key, id)),
                None => self.chunks.push(vec![(key, id)]),
            }
            self.lasts.push(key);
            return;
        }
        let ci = self.chunk_for(key).min(self.chunks.len() - 1);
        let chunk = &mut self.chunks[ci];
        let i = chunk.partition_point(|&(k, _)| k < key);
        chunk.insert(i, (key, id));
        if i + 1 == chunk.len() {
            self.lasts[ci] = key;
        }
        if chunk.len() > Self::CHUNK_MAX {
            let upper = chunk.split_off(chunk.len() / 2);
            self.lasts[ci] = chunk[chunk.len() - 1].0;
            self.lasts.insert(ci + 1, upper[upper.len() - 1].0);
            self.chunks.insert(ci + 1, upper);
        }
    }

    #[inline]
    fn find(&self, key: u128) -> Option<(usize, usize)> {
        let ci = self.chunk_for(key);
        let chunk = self.chunks.get(ci)?;
        let i = chunk.partition_point(|&(k, _)| k < key);
        (chunk.get(i)?.0 == key).then_some((ci, i))
    }

    #[inline]
    fn remove(&mut self, key: u128) -> Option<u32> {
        let (ci, i) = self.find(key)?;
        Some(self.remove_at(ci, i))
    }

    /// Removes the entry at chunk `ci`, index `i`.
    #[inline]
    fn remove_at(&mut self, ci: usize, i: usize) -> u32 {
        self.len -= 1;
        let chunk = &mut self.chunks[ci];
        let (_, id) = chunk.remove(i);
        if chunk.is_empty() {
            if self.len > 0 {
                self.chunks.remove(ci);
            }
            self.lasts.remove(ci);
        } else if i == chunk.len() {
            self.lasts[ci] = chunk[i - 1].0;
        }
        id
    }

    fn get(&self, key: u128) -> Option<&u32> {
        self.find(key).map(|(ci, i)| &self.chunks[ci][i].1)
    }

    /// Replaces `old` (if present) by `new`: in place when `new` sorts into the same position,
    /// else a removal at the position already found and an insertion.
    #[inline]
    fn replace(&mut self, old: u128, new: u128, id: u32) {
        let Some((ci, i)) = self.find(old) else {
            self.insert(new, id);
            return;
        };
        let chunk = &self.chunks[ci];
        let above_prev = match i.checked_sub(1) {
            Some(p) => chunk[p].0 < new,
            None => ci == 0 || self.lasts[ci - 1] < new,
        };
        let below_next = match chunk.get(i + 1) {
            Some(n) => new < n.0,
            None => self.chunks.get(ci + 1).is_none_or(|c| new < c[0].0),
        };
        if !(above_prev && below_next) {
            self.remove_at(ci, i);
            self.insert(new, id);
            return;
        }
        let last = i + 1 == chunk.len();
        self.chunks[ci][i] = (new, id);
        if last {
            self.lasts[ci] = new;
        }
    }

    /// Position of the first entry with key ≥ `from`, as (chunk, index).
    #[inline]
    fn lower_position(&self, from: u128) -> (usize, usize) {
        let ci = self.chunk_for(from);
        match self.chunks.get(ci) {
            Some(chunk) => (ci, chunk.partition_point(|&(k, _)| k < from)),
            None => (ci, 0),
        }
    }

    #[inline]
    fn lower_bound(&self, from: u128) -> Option<(u128, u32)> {
        let (ci, i) = self.lower_position(from);
        self.chunks.get(ci).map(|c| c[i])
    }

    fn live(&self) -> &[Vec<(u128, u32)>] {
        if self.len == 0 { &[] } else { &self.chunks }
    }

    fn iter(&self) -> impl Iterator<Item = (u128, u32)> + '_ {
        self.live().iter().flatten().copied()
    }

    fn range_from(&self, from: u128) -> impl Iterator<Item = (u128, u32)> + '_ {
        let (ci, i) = self.lower_position(from);
        self.live().iter().skip(ci).enumerate().flat_map(move |(n, c)| c[if n == 0 { i } else { 0 }..].iter().copied())
    }

    fn range_below_rev(&self, to: u128) -> impl Iterator<Item = (u128, u32)> + '_ {
        let live = self.live();
        let (ci, i) = self.lower_position(to);
        let head = live.get(ci).map_or(&[][..], |c| &c[..i]);
        head.iter().rev().copied().chain(live[..ci.min(live.len())].iter().rev().flat_map(|c| c.iter().rev().copied()))
    }

    fn check(&self) -> Result<(), String> {
        let live = self.live();
        if live.len() != self.lasts.len() || live.iter().map(Vec::len).sum::<usize>() != self.len {
            return Err("free-block index: counts disagree".into());
        }
        let mut prev: Option<u128> = None;
        for (c, last) in live.iter().zip(&self.lasts) {
            if c.is_empty() || c.len() > Self::CHUNK_MAX || c[c.len() - 1].0 != *last {
                return Err("free-block index: a chunk is empty, oversized, or its last key is stale".into());
            }
            for &(k, _) in c {
                if prev.is_some_and(|p| p >= k) {
                    return Err(format!("free-block index out of order at {:?}", unpack(0, k)));
                }
                prev = Some(k);
            }
        }
        Ok(())
    }
}
