//! The caching policy: PyTorch's CUDA caching allocator, bit for bit, as pure code.
//!
//! Nothing here touches a device directly: operations that need one take `&mut impl Backend`
//! and the state holds no backend, so the policy is unit-tested on the simulated device and
//! replayed against recorded traces. No `unsafe` anywhere in this module.
//!
//! - [`config`]: `GPUMEM_NB_ALLOC_CONF` (PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax).
//! - [`constants`]: PyTorch's sizes (512 B blocks, 1 MiB small limit, 2/20 MiB segments).
//! - [`rounding`]: `round_size`, `roundup_power2_divisions`, segment size, pool choice.
//! - `block`: blocks in an index arena, the free-block index keyed by (stream, size, address).
//! - `state`: `DeviceState` — malloc with its fallback chain, free, events, release, GC,
//!   memory fraction, expandable segments; stats and trace updated in one place.
//! - `invariants`: the recount behind `DeviceState::check_invariants`.
//! - [`oom`]: how an allocation fails ([`AllocError`], [`OomReport`]).
//! - [`explain`]: every reserved byte in named parts ([`ReservedParts`]).
#![forbid(unsafe_code)]

pub(crate) mod config;
pub(crate) mod constants;
pub(crate) mod explain;
pub(crate) mod oom;
pub(crate) mod rounding;

mod block;
mod freeset;
mod invariants;
mod state;

pub use block::BlockId;
pub use explain::{CachedClass, ReservedParts};
pub use invariants::InvariantViolation;
pub(crate) use oom::AllocError;
pub use rounding::PoolKind;
pub(crate) use state::DeviceState;
pub use state::{Allocation, BlockView, SegmentView};
