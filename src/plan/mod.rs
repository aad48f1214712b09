//! Will it fit, and why is memory reserved but not allocated: the two questions asked of a
//! notebook session, answered from what it recorded.
//!
//! - [`fit`]: the session's recorded allocations of every source (record with `%gpumem record
//!   on`, or [`crate::CachingAllocator::record_memory_history`], from the first cell) replayed on
//!   a device of a given size under PyTorch's default policy, expandable segments and compact:
//!   whether each fits, each cell's first request that would fail (with its site when stacks
//!   were recorded), and the smallest device per policy ([`FitPlan`]). The replay itself is
//!   [`crate::replay::fit`]; `gpumem-replay --fit` does the same for a PyTorch snapshot.
//!   The CUDA stream-ordered pool (cudarc, candle) is read, not replayed ([`PoolFit`]): what it
//!   reserved at most, cell by cell, and where a pool capped at the plan's size would refuse.
//! - [`explain`]: every byte a device's allocator reserved, in parts that add up
//!   ([`crate::blocks::ReservedParts`]), with the CUDA pool beside it.
//! - [`Sweep`]: which value of a swept variable (a batch size) fits: measured runs' peaks, each
//!   component fitted as constant or linear in the value, solved against each card.
#![forbid(unsafe_code)]

mod pool;
mod session;
mod sweep;

pub use pool::{POOL_CHUNK, PoolCell, PoolFit, pool_holds};

pub use sweep::{Largest, Shape, Sweep, SweepRun, Target, fit_shape, tolerance};

pub use session::{CARDS_GB, CellFit, FitPlan, PolicyFit, component_table, fit_snapshot, plan, smallest_card};

use crate::allocator::Allocator;
use crate::error::Error;
use crate::error::Result;
use crate::record::history::RecordMode;
use crate::render::explain::ReservedView;

/// Will this session fit on a device of `device_bytes`? Device 0's recorded history (its
/// allocator's events and every other tracked allocation), replayed under each policy.
pub fn fit(device_bytes: u64) -> Result<FitPlan> {
    fit_on(&*crate::notebook::session::current()?, device_bytes)
}

/// [`fit`] for one device's allocator.
pub fn fit_on(alloc: &Allocator, device_bytes: u64) -> Result<FitPlan> {
    if device_bytes == 0 {
        return Err(Error::InvalidArgument("a device of 0 bytes holds nothing: give a size such as 24GiB".into()));
    }
    // A notebook's process keeps tracked events without being asked (`tracking::keep_by_default`).
    if alloc.history_options().enabled != RecordMode::All
        && crate::notebook::tracking::recording() == crate::track::Recording::Off
    {
        return Err(Error::Plan(
            "nothing recorded to plan from: record the session's allocations first (`%gpumem record on`, or \
             alloc.record_memory_history(RecordMode::All, usize::MAX)), from the first cell"
                .into(),
        ));
    }
    fit_snapshot(&crate::notebook::tracking::snapshot(alloc), device_bytes)
}

/// Where a device's reserved bytes are now, with the CUDA pool's held bytes beside them.
pub fn explain(alloc: &Allocator) -> ReservedView {
    ReservedView {
        device: alloc.device(),
        backend: alloc.backend_kind(),
        when: "now".into(),
        parts: alloc.reserved_parts(),
        pool: alloc.pool_usage(),
    }
}
