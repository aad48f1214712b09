//! The caching policy: PyTorch's CUDA caching allocator, bit for bit, as pure code.
//!
//! Nothing here touches a device directly: operations that need one take `&mut impl Backend`
//! and the state holds no backend, so the policy is unit-tested on the simulated device and
//! replayed against recorded traces. No `unsafe` anywhere in this module.
//!
//! - [`constants`]: PyTorch's sizes (512 B blocks, 1 MiB small limit, 2/20 MiB segments).
//! - [`rounding`]: `round_size`, `roundup_power2_divisions`, segment size, pool choice.
//! - `block`: blocks in an index arena, pools keyed by (stream, size, address).
//! - [`state`]: `DeviceState` — malloc with its fallback chain, free, events, release, GC,
//!   memory fraction, expandable segments; stats and trace updated in one place.
//! - `invariants`: the recount behind `DeviceState::check_invariants`.

pub mod constants;
pub mod rounding;
pub mod state;

mod block;
mod invariants;

pub use block::BlockId;
pub use rounding::{PoolKind, allocation_size, round_size};
pub use state::{Allocation, BlockView, DeviceState, SegmentView};
