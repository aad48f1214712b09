//! Live bytes by stack, and what held the memory at the peak: the books sites are named from.
//!
//! Every allocation's stack is interned once (a stack id: an allocation loop has one stack,
//! whatever its length), and each place keeps its live bytes per (stack, label). When a place
//! reaches a new peak and then releases memory for the first time, the composition it had at
//! that peak is kept: so "what held the memory at the session's peak" costs one copy of a
//! small map per peak passed, not per allocation. Nothing is symbolised here: a new stack's symbols
//! are read in the background (`notebook::tracking`), and sites are named when a report asks.
#![forbid(unsafe_code)]

use super::Place;
use crate::record::frames::Frames;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// A fast hasher for stacks and small keys (a multiply-rotate per word, as rustc's FxHasher):
/// a 32-frame stack hashes in a few dozen nanoseconds where SipHash takes hundreds.
#[derive(Default, Clone, Copy)]
pub(crate) struct WordHasher(u64);

impl Hasher for WordHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    #[inline]
    fn finish(&self) -> u64 {
        // The product's best-mixed bits are its high ones; hash tables index by the low ones
        // (2 MiB-aligned addresses would otherwise all land in one bucket).
        self.0.rotate_left(26)
    }
}

pub(crate) type Fast = BuildHasherDefault<WordHasher>;

/// A stack's id (0: no stack).
pub(crate) type StackId = u32;

/// (stack, label) of a group of allocations.
pub(crate) type Key = (StackId, u32);

#[derive(Debug, Default, Clone)]
struct PlaceBooks {
    live: HashMap<Key, u64, Fast>,
    /// The composition at the last peak passed (taken at the first release after it).
    at_peak: HashMap<Key, u64, Fast>,
    /// No release since the last new peak: the peak's composition is `live`.
    rising: bool,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct StackBooks {
    ids: HashMap<Frames, StackId, Fast>,
    stacks: Vec<Frames>,
    places: HashMap<Place, PlaceBooks, Fast>,
}

impl StackBooks {
    /// The id of a stack and its shared copy (interned on first sight: a stack seen before
    /// costs a hash and a comparison, no allocation).
    #[inline]
    pub(crate) fn intern(&mut self, frames: Option<&[usize]>) -> (StackId, Option<Frames>) {
        let Some(f) = frames else { return (0, None) };
        if let Some(&id) = self.ids.get(f) {
            return (id, self.stack(id).cloned());
        }
        let shared: Frames = Arc::from(f);
        self.stacks.push(shared.clone());
        let id = self.stacks.len() as StackId;
        self.ids.insert(shared.clone(), id);
        (id, Some(shared))
    }

    /// How many stacks the books hold (ids run from 1 to this).
    pub(crate) fn count(&self) -> usize {
        self.stacks.len()
    }

    /// The stack of an id.
    pub(crate) fn stack(&self, id: StackId) -> Option<&Frames> {
        id.checked_sub(1).and_then(|i| self.stacks.get(i as usize))
    }

    /// `n` bytes allocated at `key` on `place`; `new_peak`: the place's total passed its peak.
    #[inline]
    pub(crate) fn add(&mut self, place: Place, key: Key, n: u64, new_peak: bool) {
        let b = self.places.entry(place).or_default();
        *b.live.entry(key).or_default() += n;
        if new_peak {
            b.rising = true;
        }
    }

    /// `n` bytes released at `key` on `place`.
    #[inline]
    pub(crate) fn sub(&mut self, place: Place, key: Key, n: u64) {
        let b = self.places.entry(place).or_default();
        if b.rising {
            b.at_peak = b.live.clone();
            b.rising = false;
        }
        if let Some(v) = b.live.get_mut(&key) {
            *v = v.saturating_sub(n);
            if *v == 0 {
                b.live.remove(&key);
            }
        }
    }

    /// Live bytes per key on each place.
    #[cfg(test)]
    pub(crate) fn live(&self) -> impl Iterator<Item = (Place, Key, u64)> + '_ {
        self.places.iter().flat_map(|(p, b)| b.live.iter().map(|(k, v)| (*p, *k, *v)))
    }

    /// Bytes per key on each place at its peak.
    pub(crate) fn at_peak(&self) -> impl Iterator<Item = (Place, Key, u64)> + '_ {
        self.places.iter().flat_map(|(p, b)| {
            let m = if b.rising { &b.live } else { &b.at_peak };
            m.iter().map(|(k, v)| (*p, *k, *v))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn aligned_addresses_spread_over_the_low_bits() {
        use std::hash::BuildHasher;
        let low: std::collections::HashSet<u64> = (1..=64u64).map(|k| Fast::default().hash_one(k << 21) & 63).collect();
        assert!(low.len() > 32, "64 addresses 2 MiB apart fill {} of 64 buckets", low.len());
    }

    #[test]
    fn stacks_are_interned_and_the_peak_composition_is_kept() {
        let mut b = StackBooks::default();
        let (s1, s2): (Frames, Frames) = (Arc::from(&[1usize, 2][..]), Arc::from(&[3usize][..]));
        let (a, c) = (b.intern(Some(&s1)).0, b.intern(Some(&s2)).0);
        let (again, shared) = b.intern(Some(&[1usize, 2][..]));
        assert_eq!(again, a, "same content, same id");
        assert!(Arc::ptr_eq(&shared.unwrap(), b.stack(a).unwrap()), "the interned copy is shared, not made again");
        assert_eq!((b.intern(None).0, b.stack(a).map(|f| &f[..])), (0, Some(&s1[..])));
        let d = Some(0);
        b.add(d, (a, 1), 100, true);
        b.add(d, (c, 1), 50, true);
        // Still rising: the peak is what is live.
        assert_eq!(b.at_peak().map(|x| x.2).sum::<u64>(), 150);
        b.sub(d, (a, 1), 100);
        b.add(d, (c, 1), 20, false);
        let peak: HashMap<Key, u64> = b.at_peak().map(|(_, k, v)| (k, v)).collect();
        assert_eq!(peak[&(a, 1)], 100, "the 150 bytes at the peak, not the 70 live now");
        assert_eq!(peak[&(c, 1)], 50);
        let live: u64 = b.live().map(|x| x.2).sum();
        assert_eq!(live, 70);
    }
}
