//! Blocks, their arena, and the free-block pools.
//!
//! A block is a contiguous piece of a segment: allocated, free (cached), or unmapped address
//! space of an expandable segment. Blocks of one segment form a doubly linked list in address
//! order (`prev`/`next` are arena indices, [`NIL`] for none). Free, mapped blocks sit in their
//! pool's `blocks` map keyed by (stream, size, address): best fit is one range lookup.
//! Unmapped ranges of expandable segments sit in `unmapped`, keyed by (stream, address).
//!
//! See Note [Block identity] in `state.rs` for why the slot that keeps a segment's lowest
//! address never changes while PyTorch's object identity is still reproduced.
#![forbid(unsafe_code)]

use super::freeset::FreeSet;
use super::rounding::PoolKind;
use crate::device::StreamId;

/// "No block".
pub(crate) const NIL: u32 = u32::MAX;

/// A handle to an allocated block, as handed out by `malloc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub(crate) u32);

/// A block: 72 bytes, plain data (streams named by `record_stream` live beside the arena, in
/// `DeviceState::stream_uses`, so the hot path copies no vector).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    /// The unrounded request this block last served (stale on inactive blocks, as in PyTorch).
    pub(crate) requested_size: u64,
    pub(crate) stream: StreamId,
    pub(crate) prev: u32,
    pub(crate) next: u32,
    /// Outstanding stream events that must complete before the block is free.
    pub(crate) event_count: u32,
    pub(crate) pool: PoolKind,
    pub(crate) allocated: bool,
    pub(crate) mapped: bool,
    /// Index of the expandable segment this block lies in, or [`NIL`].
    pub(crate) expandable: u32,
    /// The pool's free-search counter when the block was last inserted (GC age).
    pub(crate) gc_count_base: u64,
    /// Other streams used the block (`record_stream`; they are in `DeviceState::stream_uses`
    /// until the block is freed).
    pub(crate) has_uses: bool,
    /// Caller-chosen tag carried by the block while allocated (e.g. the notebook cell).
    pub(crate) tag: u32,
    /// What the block holds while allocated (`Component as u8`).
    pub(crate) component: u8,
    pub(crate) live: bool,
}

// The component byte sits in what was padding: a block stays 72 bytes.
const _: () = assert!(std::mem::size_of::<Block>() == 72);

impl Block {
    pub(crate) fn new(addr: u64, size: u64, stream: StreamId, pool: PoolKind) -> Self {
        Block {
            addr,
            size,
            requested_size: 0,
            stream,
            prev: NIL,
            next: NIL,
            event_count: 0,
            pool,
            allocated: false,
            mapped: true,
            expandable: NIL,
            gc_count_base: 0,
            has_uses: false,
            tag: 0,
            component: 0,
            live: true,
        }
    }
    #[inline]
    pub(crate) fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }
    #[inline]
    pub(crate) fn is_expandable(&self) -> bool {
        self.expandable != NIL
    }
    /// Active: allocated, or freed but still waiting for stream events.
    #[inline]
    pub(crate) fn is_active(&self) -> bool {
        self.allocated || self.event_count > 0 || self.has_uses
    }
    #[inline]
    pub(crate) fn free_key(&self) -> (u64, u64, u64) {
        (self.stream.0, self.size, self.addr)
    }
}

/// Slab of blocks addressed by index.
#[derive(Clone, Debug, Default)]
pub(crate) struct Arena {
    pub(crate) slots: Vec<Block>,
    free: Vec<u32>,
}

impl Arena {
    pub(crate) fn insert(&mut self, b: Block) -> u32 {
        if let Some(i) = self.free.pop() {
            self.slots[i as usize] = b;
            i
        } else {
            self.slots.push(b);
            (self.slots.len() - 1) as u32
        }
    }
    /// Inserts `b` into the segment's list right after block `id` (the one splice of the doubly
    /// linked list: a split remainder, an unmapped range, the rest after it); returns its slot.
    // Always inlined: LLVM stopped inlining it into `alloc_found_block` once that grew, and the
    // call showed on the split of every malloc that cuts a cached block (the hot pairs).
    #[inline(always)]
    pub(crate) fn insert_after(&mut self, id: u32, mut b: Block) -> u32 {
        let next = self.get(id).next;
        b.prev = id;
        b.next = next;
        let new = self.insert(b);
        if next != NIL {
            self.get_mut(next).prev = new;
        }
        self.get_mut(id).next = new;
        new
    }
    pub(crate) fn remove(&mut self, i: u32) {
        let b = &mut self.slots[i as usize];
        debug_assert!(b.live && !b.has_uses);
        b.live = false;
        self.free.push(i);
    }
    #[inline]
    pub(crate) fn get(&self, i: u32) -> &Block {
        &self.slots[i as usize]
    }
    #[inline]
    pub(crate) fn get_mut(&mut self, i: u32) -> &mut Block {
        &mut self.slots[i as usize]
    }
    pub(crate) fn live(&self) -> impl Iterator<Item = (u32, &Block)> {
        self.slots.iter().enumerate().filter(|(_, b)| b.live).map(|(i, b)| (i as u32, b))
    }
}

/// One pool's free blocks.
#[derive(Clone, Debug, Default)]
pub(crate) struct BlockPool {
    /// Free mapped blocks by (stream, size, address).
    pub(crate) blocks: FreeSet,
    /// Unmapped ranges of expandable segments by (stream, address).
    pub(crate) unmapped: std::collections::BTreeMap<(u64, u64), u32>,
    /// Free-block searches so far (drives the GC age; counted only while GC is active).
    pub(crate) get_free_blocks_call_count: u64,
}

/// An expandable segment (or a `compact` arena): one reserved address range that grows by
/// mapping pages.
#[derive(Clone, Debug)]
pub(crate) struct ExpandableSegment {
    pub(crate) base: u64,
    pub(crate) size: u64,
    pub(crate) page: u64,
    /// Per page: the pool whose reserved bytes count it (the segment's or arena's own pool),
    /// `None` while unmapped.
    pub(crate) pages: Vec<Option<PoolKind>>,
    pub(crate) live: bool,
}

impl ExpandableSegment {
    /// Index of the page holding `addr`.
    #[inline]
    pub(crate) fn page_of(&self, addr: u64) -> usize {
        ((addr - self.base) / self.page) as usize
    }
}
