//! Looking at the state from outside: blocks and segments as snapshots report them, pending
//! frees, and the parts the invariant checker recounts.
use super::*;

/// The recorded stacks of a state: the operation's, the live blocks', the segments'.
pub(crate) type Contexts = (Option<Frames>, HashMap<u32, Frames>, HashMap<u64, Frames>);

impl DeviceState {
    /// Information about an allocated block.
    pub(crate) fn block(&self, id: BlockId) -> Option<BlockView> {
        let b = self.arena.slots.get(id.0 as usize).filter(|b| b.live)?;
        Some(self.view(id.0, b))
    }

    pub(super) fn view(&self, id: u32, b: &Block) -> BlockView {
        BlockView {
            addr: b.addr,
            size: b.size,
            requested_size: b.requested_size,
            allocated: b.allocated,
            active: b.is_active(),
            tag: b.tag,
            frames: self.block_ctx.get(&id).cloned(),
        }
    }

    /// Segments as PyTorch's snapshot reports them, sorted by address.
    pub(crate) fn segments(&self) -> Vec<SegmentView> {
        let mut out = Vec::new();
        for (head_id, head) in self.arena.live() {
            if !head.mapped {
                continue;
            }
            if head.prev != NIL && self.arena.get(head.prev).mapped {
                continue;
            }
            let mut seg = SegmentView {
                address: head.addr,
                total_size: 0,
                stream: head.stream,
                pool: head.pool,
                is_expandable: head.is_expandable(),
                blocks: Vec::new(),
                frames: self.seg_ctx.get(&head.addr).cloned(),
            };
            let mut cur = Some(head_id);
            while let Some(id) = cur {
                let blk = self.arena.get(id);
                if !blk.mapped {
                    break;
                }
                seg.total_size += blk.size;
                seg.blocks.push(self.view(id, blk));
                cur = (blk.next != NIL).then_some(blk.next);
            }
            out.push(seg);
        }
        out.sort_by_key(|s| s.address);
        out
    }

    /// Orders the streams with pending events so that blocks whose addresses come first in
    /// `addrs` are checked first (others keep their order, after them). PyTorch visits streams
    /// in hash-map order; a replay uses this to follow the order a trace recorded.
    pub(crate) fn prioritize_pending(&mut self, addrs: &[u64]) {
        let arena = &self.arena;
        self.pending.sort_by_key(|(_, q)| {
            q.front().and_then(|&(_, id)| addrs.iter().position(|&a| a == arena.get(id).addr)).unwrap_or(usize::MAX)
        });
    }

    /// Number of blocks waiting on stream events.
    #[cfg(test)]
    pub(crate) fn pending_frees(&self) -> usize {
        self.pending.iter().map(|(_, q)| q.len()).sum()
    }

    /// Takes the recorded stacks out (to copy the state cheaply); see `restore_contexts`.
    pub(crate) fn take_contexts(&mut self) -> Contexts {
        (self.op_ctx.take(), std::mem::take(&mut self.block_ctx), std::mem::take(&mut self.seg_ctx))
    }

    /// Puts back what `take_contexts` took.
    pub(crate) fn restore_contexts(&mut self, (op, blocks, segs): Contexts) {
        (self.op_ctx, self.block_ctx, self.seg_ctx) = (op, blocks, segs);
    }

    // Accessors for the invariant checker.
    pub(crate) fn parts(&self) -> (&Arena, &BlockPool, &BlockPool, &[ExpandableSegment], &DeviceStats, u64) {
        (&self.arena, &self.small, &self.large, &self.expandable, &self.stats, self.total_reserved)
    }
}
