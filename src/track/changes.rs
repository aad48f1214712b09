//! The order in which live bytes changed while a cell ran: what a component's peak is read from.
//!
//! A component is known only when a report classifies the stacks (their symbols are read
//! then, not at allocation time), so a component's highest point during a cell cannot be kept
//! as a running maximum. Instead, while a peak slot is open, every change of live bytes is
//! logged as (place, stack, ±bytes, what it is of): driver-level allocations, the allocator's
//! segments among them, and the gpumem-nb allocator's blocks (told by the allocator's block
//! observer). A report classifies the stacks the log names and replays it: a component's rise
//! is the highest its running sum went above where it started. The log is cleared when the
//! last slot closes; past [`CAP`] changes it stops, and the rises are not known (never guessed).
#![forbid(unsafe_code)]

use super::Place;
use super::stacks::{Fast, StackId};
use std::collections::HashMap;

/// What a logged change is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Of {
    /// A driver-level allocation of anyone but gpumem-nb's allocator.
    Driver,
    /// A segment of gpumem-nb's allocator (its blocks are logged too).
    Segment,
    /// A block of gpumem-nb's allocator.
    Block,
}

/// One change of live bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Change {
    pub place: Place,
    /// The allocation's address (a VMM handle's creation: 0), pairing a release with it.
    pub addr: u64,
    pub stack: StackId,
    pub delta: i64,
    pub of: Of,
}

/// Changes logged at most while slots are open (2 Mi changes: 48 MiB).
pub(crate) const CAP: usize = 1 << 21;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct ChangeLog {
    log: Vec<Change>,
    /// Per slot (by index): where its changes begin.
    from: Vec<Option<usize>>,
    /// The cap was reached since the oldest open slot began.
    full: bool,
    /// Live blocks of gpumem-nb's allocators: (place, address) → (stack, size), so a free is
    /// logged against the stack that allocated it.
    blocks: HashMap<(Place, u64), (StackId, u64), Fast>,
}

impl ChangeLog {
    /// Slot `i` opened: its changes begin now.
    pub(crate) fn open(&mut self, i: usize) {
        if self.from.len() <= i {
            self.from.resize(i + 1, None);
        }
        self.from[i] = Some(self.log.len());
    }

    /// Slot `i` closed; with no slot open the log is emptied.
    pub(crate) fn close(&mut self, i: usize) {
        if let Some(f) = self.from.get_mut(i) {
            *f = None;
        }
        if self.from.iter().all(Option::is_none) {
            self.log.clear();
            self.full = false;
            if self.log.capacity() > 1 << 16 {
                self.log = Vec::new();
            }
        }
    }

    /// Logs a change (only while a slot is open).
    #[inline]
    pub(crate) fn push(&mut self, place: Place, addr: u64, stack: StackId, delta: i64, of: Of) {
        if delta == 0 || self.from.iter().all(Option::is_none) {
            return;
        }
        if self.log.len() >= CAP {
            self.full = true;
            return;
        }
        self.log.push(Change { place, addr, stack, delta, of });
    }

    /// A block of gpumem-nb's allocator handed out (its stack interned as `stack`).
    pub(crate) fn block_alloc(&mut self, place: Place, addr: u64, size: u64, stack: StackId) {
        self.blocks.insert((place, addr), (stack, size));
        self.push(place, addr, stack, size as i64, Of::Block);
    }

    /// A block freed (unknown blocks, handed out before tracking watched, are not logged).
    pub(crate) fn block_free(&mut self, place: Place, addr: u64) {
        if let Some((stack, size)) = self.blocks.remove(&(place, addr)) {
            self.push(place, addr, stack, -(size as i64), Of::Block);
        }
    }

    /// The changes since slot `i` opened; `None` when it is not open or the log was full.
    pub(crate) fn since(&self, i: usize) -> Option<&[Change]> {
        let from = (*self.from.get(i)?)?;
        (!self.full).then(|| &self.log[from.min(self.log.len())..])
    }
}

/// What an allocation is to a phase's run (see [`released_within_phase`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step<K> {
    /// Made by phase `K`.
    In(K),
    /// Made by no phase that runs: it neither continues nor ends a run (library workspace,
    /// unclassified buffers, stamped temporaries).
    Aside,
    /// Made by another part of the program: the run ends.
    Other,
}

/// Which allocations of a phase outlived it: for every change, whether it belongs to an
/// allocation that a phase made and released before that phase's run ended. A phase's run is
/// a stretch of the log in which the allocations are of that phase (or aside: library
/// workspaces, unclassified buffers), up to the next allocation of anything else; what it
/// allocated and released within the run was its working memory, what was still live at the
/// run's end is what it made (the gradients a store holds, an optimizer's moments). Releases
/// pair with their allocation by place and address.
pub(crate) fn released_within_phase<K: PartialEq + Copy>(
    changes: &[Change],
    mut step: impl FnMut(&Change) -> Step<K>,
) -> Vec<bool> {
    let mut out = vec![false; changes.len()];
    // The run each allocation of a phase is in; where each run ends: the next allocation of
    // another part of the program (releases up to it are the phase's own tail: a backward pass
    // drops its last intermediates after its last allocation), or the log's end.
    let mut run_of: Vec<Option<usize>> = vec![None; changes.len()];
    let mut runs: Vec<usize> = Vec::new();
    let mut current: Option<K> = None;
    for (i, c) in changes.iter().enumerate().filter(|(_, c)| c.delta > 0) {
        match step(c) {
            Step::In(k) => {
                if current != Some(k) {
                    if current.is_some() {
                        *runs.last_mut().expect("a run is open") = i;
                    }
                    current = Some(k);
                    runs.push(changes.len());
                }
                run_of[i] = Some(runs.len() - 1);
            }
            Step::Aside => {}
            Step::Other => {
                if current.take().is_some() {
                    *runs.last_mut().expect("a run is open") = i;
                }
            }
        }
    }
    let mut open: HashMap<(Place, u64), usize> = HashMap::new();
    for (i, c) in changes.iter().enumerate() {
        if c.delta > 0 {
            if run_of[i].is_some() {
                open.insert((c.place, c.addr), i);
            }
        } else if let Some(a) = open.remove(&(c.place, c.addr))
            && let Some(r) = run_of[a]
            && i < runs[r]
        {
            out[a] = true;
            out[i] = true;
        }
    }
    out
}

/// The highest each key's running sum went above zero over `changes` (keys from `key`, given
/// each change and its index; a change whose key is `None` is left out).
pub(crate) fn rises<K: std::hash::Hash + Eq + Copy>(
    changes: &[Change],
    mut key: impl FnMut(usize, &Change) -> Option<K>,
) -> HashMap<K, u64> {
    let mut run: HashMap<K, (i64, i64)> = HashMap::new();
    for (i, c) in changes.iter().enumerate() {
        let Some(k) = key(i, c) else { continue };
        let (now, top) = run.entry(k).or_default();
        *now += c.delta;
        *top = (*top).max(*now);
    }
    run.into_iter().map(|(k, (_, top))| (k, top.max(0) as u64)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rise_is_the_highest_point_above_the_start() {
        let mut log = ChangeLog::default();
        log.push(Some(0), 0x10, 1, 100, Of::Driver);
        assert!(log.since(0).is_none(), "nothing is logged with no slot open");
        log.open(0);
        log.push(Some(0), 0x10, 1, 64, Of::Driver);
        log.push(Some(0), 0x10, 1, -64, Of::Driver);
        log.push(Some(0), 0x10, 1, 16, Of::Driver);
        log.push(Some(0), 0x20, 2, -8, Of::Driver);
        log.block_alloc(Some(0), 0x1000, 32, 3);
        log.block_free(Some(0), 0x1000);
        log.block_free(Some(0), 0x2000);
        let changes = log.since(0).unwrap();
        assert_eq!(changes.len(), 6, "the unknown block's free is not logged");
        let r = rises(changes, |_, c| Some(c.stack));
        assert_eq!(r[&1], 64);
        assert_eq!(r[&2], 0, "only fell");
        assert_eq!(r[&3], 32);
        let blocks_only = rises(changes, |_, c| (c.of == Of::Block).then_some(c.stack));
        assert_eq!(blocks_only.len(), 1);
        // A slot opened later sees only its own changes; closing the last one empties the log.
        log.open(1);
        log.push(Some(0), 0x30, 1, 8, Of::Driver);
        assert_eq!(log.since(1).unwrap().len(), 1);
        log.close(0);
        assert_eq!(log.since(1).unwrap().len(), 1);
        log.close(1);
        assert!(log.since(1).is_none());
        log.open(0);
        assert_eq!(log.since(0).unwrap().len(), 0);
    }

    #[test]
    fn what_a_phase_released_before_its_run_ended_was_working_memory() {
        let c = |addr: u64, stack: StackId, delta: i64| Change { place: Some(0), addr, stack, delta, of: Of::Driver };
        // Stack 7 is the backward pass, 1 the forward before it and 2 the step after it.
        let log = [
            c(0xa, 1, 10), // forward
            c(0xb, 7, 4),  // backward: an intermediate …
            c(0xc, 7, 8),  // … a gradient …
            c(0xb, 7, -4), // … the intermediate released within the pass
            c(0xd, 7, 8),  // another gradient, the pass's last allocation
            c(0x5, 7, 2),  // an intermediate released after it, before anything else allocates
            c(0x5, 7, -2),
            c(0xe, 2, 3),  // the step
            c(0xc, 7, -8), // gradients dropped after the pass
            c(0xd, 7, -8),
            c(0xf, 7, 5), // a second pass: released only after it ended
            c(0x1, 1, 1),
            c(0xf, 7, -5),
            c(0x2, 7, 6), // a third, with a library's workspace made inside it: one run still
            c(0x3, 9, 1),
            c(0x2, 7, -6),
            c(0x4, 7, 2),
        ];
        let within = released_within_phase(&log, |ch| match ch.stack {
            7 => Step::In(7),
            9 => Step::Aside,
            _ => Step::Other,
        });
        let want = [
            false, true, false, true, false, true, true, false, false, false, false, false, false, true, false, true,
            false,
        ];
        assert_eq!(within, want);
        let r = rises(&log, |i, ch| Some(if within[i] { 0 } else { ch.stack }));
        assert_eq!(r[&7], 16, "the gradients alone at their highest");
        assert_eq!(r[&0], 6, "the working memory");
    }
}
