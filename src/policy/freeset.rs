//! The free-block index: free mapped blocks ordered by (stream, size, address), so best fit is
//! one lower-bound lookup (PyTorch keeps a `std::set` with the same order), made cheap by
//! segregating sizes into classes.
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

/// Size classes: 16 exact ones up to 8 KiB (512 B steps), then 8 per power of two, each
/// closed at the top (2 MiB is the largest size of its class), so a segment of a round size
/// and that segment less a small split stay in one class: the hot path's remainder is then
/// replaced in place. The class never decreases with the size, so the classes in order, each
/// sorted, are the whole order.
const EXACT_CLASSES: u64 = 16;
/// Classes of a power of two above the exact ones (2^3).
const SUB_BITS: u32 = 3;
/// Words of the non-empty bitmap: enough for every `u64` size (424 classes).
const WORDS: usize = 7;

/// The size class of `size`.
#[inline]
fn class(size: u64) -> usize {
    let s = size.saturating_sub(1) >> 9;
    if s < EXACT_CLASSES {
        return s as usize;
    }
    let log = 63 - s.leading_zeros();
    let sub = (s >> (log - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    (EXACT_CLASSES as u32 + ((log - 4) << SUB_BITS) + sub as u32) as usize
}

/// One stream's free blocks by packed (size, address), segregated by size class: best fit is
/// a search in the request's class (a handful of blocks, usually) or else the first block of
/// the next non-empty class (a bitmap scan); an update touches one class. Same answers as one
/// sorted list, a fraction of the comparisons and moves.
#[derive(Clone, Debug, Default)]
pub(crate) struct SizeAddrSet {
    classes: Vec<Chunks>,
    /// Bit `c` is set when class `c` holds a block.
    nonempty: [u64; WORDS],
    len: usize,
}

impl SizeAddrSet {
    #[inline]
    fn size_class(key: u128) -> usize {
        class((key >> 64) as u64)
    }

    #[inline]
    fn mark(&mut self, c: usize, nonempty: bool) {
        let bit = 1u64 << (c & 63);
        if nonempty {
            self.nonempty[c >> 6] |= bit;
        } else {
            self.nonempty[c >> 6] &= !bit;
        }
    }

    /// The first non-empty class at or after `c`.
    #[inline]
    fn next_class(&self, c: usize) -> Option<usize> {
        let mut w = c >> 6;
        let mut bits = *self.nonempty.get(w)? & (u64::MAX << (c & 63));
        loop {
            if bits != 0 {
                return Some((w << 6) + bits.trailing_zeros() as usize);
            }
            w += 1;
            bits = *self.nonempty.get(w)?;
        }
    }

    #[inline]
    fn insert(&mut self, key: u128, id: u32) {
        self.insert_in(Self::size_class(key), key, id);
    }

    /// Inserts `key` of class `c`.
    #[inline]
    fn insert_in(&mut self, c: usize, key: u128, id: u32) {
        if c >= self.classes.len() {
            self.classes.resize_with(c + 1, Chunks::default);
        }
        self.classes[c].insert(key, id);
        self.mark(c, true);
        self.len += 1;
    }

    #[inline]
    fn remove(&mut self, key: u128) -> Option<u32> {
        self.remove_in(Self::size_class(key), key)
    }

    /// Removes `key` of class `c`.
    #[inline]
    fn remove_in(&mut self, c: usize, key: u128) -> Option<u32> {
        let chunks = self.classes.get_mut(c)?;
        let id = chunks.remove(key)?;
        if chunks.len == 0 {
            self.mark(c, false);
        }
        self.len -= 1;
        Some(id)
    }

    fn get(&self, key: u128) -> Option<&u32> {
        self.classes.get(Self::size_class(key))?.get(key)
    }

    /// Replaces `old` (if present) by `new`: within its class when `new` stays there (in place
    /// when the order allows), else a removal and an insertion.
    #[inline]
    fn replace(&mut self, old: u128, new: u128, id: u32) {
        let (c, to) = (Self::size_class(old), Self::size_class(new));
        if c == to && c < self.classes.len() {
            if !self.classes[c].replace(old, new, id) {
                self.mark(c, true);
                self.len += 1;
            }
            return;
        }
        self.remove_in(c, old);
        self.insert_in(to, new, id);
    }

    #[inline]
    fn lower_bound(&self, from: u128) -> Option<(u128, u32)> {
        let c = Self::size_class(from);
        if let Some(hit) = self.classes.get(c).and_then(|chunks| chunks.lower_bound(from)) {
            return Some(hit);
        }
        self.classes[self.next_class(c + 1)?].first()
    }

    fn iter(&self) -> impl Iterator<Item = (u128, u32)> + '_ {
        self.classes.iter().flat_map(Chunks::iter)
    }

    fn range_from(&self, from: u128) -> impl Iterator<Item = (u128, u32)> + '_ {
        let c = Self::size_class(from).min(self.classes.len());
        let head = self.classes.get(c).into_iter().flat_map(move |chunks| chunks.range_from(from));
        head.chain(self.classes.iter().skip(c + 1).flat_map(Chunks::iter))
    }

    fn range_below_rev(&self, to: u128) -> impl Iterator<Item = (u128, u32)> + '_ {
        let c = Self::size_class(to).min(self.classes.len());
        let head = self.classes.get(c).into_iter().flat_map(move |chunks| chunks.range_below_rev(to));
        head.chain(self.classes[..c].iter().rev().flat_map(Chunks::iter_rev))
    }

    fn check(&self) -> Result<(), String> {
        let mut n = 0;
        for (c, chunks) in self.classes.iter().enumerate() {
            chunks.check()?;
            if chunks.iter().any(|(k, _)| Self::size_class(k) != c) {
                return Err(format!("free-block index: a block in size class {c} belongs to another"));
            }
            if (chunks.len > 0) != (self.nonempty[c >> 6] >> (c & 63) & 1 == 1) {
                return Err(format!("free-block index: the non-empty bit of size class {c} is stale"));
            }
            n += chunks.len;
        }
        if n != self.len {
            return Err("free-block index: counts disagree".into());
        }
        Ok(())
    }
}

/// One size class's free blocks by packed (size, address): a two-level sorted list — runs
/// ("chunks") of at most [`Chunks::CHUNK_MAX`] sorted entries plus the last key of each
/// chunk. A lookup is two binary searches; an update moves at most one chunk's entries. No
/// allocation per entry, no pointer chasing, logarithmic with a small constant at any size
/// (a class can hold thousands of blocks of one size). The last chunk's allocation is kept
/// when the class empties (the hot path empties and refills a class on every pair).
#[derive(Clone, Debug, Default)]
struct Chunks {
    chunks: Vec<Vec<(u128, u32)>>,
    /// `lasts[i]` is the last (largest) key of `chunks[i]`; one entry per non-empty chunk.
    lasts: Vec<u128>,
    len: usize,
}

impl Chunks {
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
        if self.len == 1 {
            // A class of one block (the common case): no search.
            let chunk = &mut self.chunks[0];
            if chunk[0].0 != key {
                return None;
            }
            let id = chunk[0].1;
            chunk.clear();
            self.lasts.clear();
            self.len = 0;
            return Some(id);
        }
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
    /// else a removal at the position already found and an insertion. Returns whether `old`
    /// was there.
    #[inline]
    fn replace(&mut self, old: u128, new: u128, id: u32) -> bool {
        if self.len == 1 && self.lasts[0] == old {
            // A class of one block (the common case): no search, no order to keep.
            self.chunks[0][0] = (new, id);
            self.lasts[0] = new;
            return true;
        }
        let Some((ci, i)) = self.find(old) else {
            self.insert(new, id);
            return false;
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
            return true;
        }
        let last = i + 1 == chunk.len();
        self.chunks[ci][i] = (new, id);
        if last {
            self.lasts[ci] = new;
        }
        true
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

    fn first(&self) -> Option<(u128, u32)> {
        self.live().first().map(|c| c[0])
    }

    fn iter(&self) -> impl Iterator<Item = (u128, u32)> + '_ {
        self.live().iter().flatten().copied()
    }

    fn iter_rev(&self) -> impl Iterator<Item = (u128, u32)> + '_ {
        self.live().iter().rev().flat_map(|c| c.iter().rev().copied())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn classes_never_decrease_with_the_size() {
        let mut prev = 0;
        for size in (0..1u64 << 20).step_by(512).chain((20..64).flat_map(|l| [(1u64 << l) - 1, 1 << l, 3 << (l - 1)])) {
            let c = class(size);
            assert!(c >= prev, "class({size}) = {c} < {prev}");
            assert!(c < WORDS * 64);
            prev = c;
        }
        assert_eq!(class(u64::MAX), 423);
        assert_eq!(class(2 << 20), class((2 << 20) - 512), "a round segment and its split share a class");
        assert_eq!(class(20 << 20), class((20 << 20) - 512));
    }

    /// Random inserts, removals, replacements and lookups agree with a `BTreeMap` (sizes drawn
    /// so that many share a class, and some a size).
    #[test]
    fn agrees_with_a_sorted_map() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut set = FreeSet::default();
        let mut model: BTreeMap<FreeKey, u32> = BTreeMap::new();
        for step in 0..40_000u32 {
            let stream = rnd(2);
            let size = match rnd(3) {
                0 => (1 + rnd(20)) * 512,
                1 => 512 << rnd(30),
                _ => rnd(1 << 34) / 512 * 512 + 512,
            };
            let key = (stream, size, rnd(64) * 4096);
            match rnd(4) {
                0 | 1 if !model.contains_key(&key) => {
                    set.insert(key, step);
                    model.insert(key, step);
                }
                2 => {
                    let victim = model.range(key..).next().map(|(k, _)| *k);
                    if let Some(k) = victim {
                        assert_eq!(set.remove(&k), model.remove(&k));
                    }
                }
                _ => {
                    let old = model.range(key..).next().map(|(k, _)| *k);
                    let new = (key.0, size / 2 / 512 * 512 + 512, key.2 + 512);
                    if let Some(old) = old.filter(|o| o.0 == new.0 && !model.contains_key(&new)) {
                        set.replace(&old, new, step);
                        model.remove(&old);
                        model.insert(new, step);
                    }
                }
            }
            let probe = (rnd(2), (1 + rnd(1 << 20)) * 512, 0);
            let want = model.range(probe..).next().filter(|(k, _)| k.0 == probe.0).map(|(k, v)| (*k, *v));
            assert_eq!(set.lower_bound(probe), want, "step {step}");
            if step % 997 == 0 {
                set.check().unwrap();
                assert_eq!(set.len(), model.len());
                let s = probe.0;
                let all: Vec<u32> = model.values().copied().collect();
                assert_eq!(set.values(), all);
                let from: Vec<_> = set.range_from(probe).collect();
                let want: Vec<_> = model.range(probe..).filter(|(k, _)| k.0 == s).map(|(k, v)| (*k, *v)).collect();
                assert_eq!(from, want);
                let below: Vec<_> = set.range_below_rev(probe).collect();
                let want: Vec<_> =
                    model.range(..probe).rev().filter(|(k, _)| k.0 == s).map(|(k, v)| (*k, *v)).collect();
                assert_eq!(below, want);
            }
        }
    }
}
