//! The caching policy's constants, PyTorch's values (`c10/core/AllocatorConfig.h`).

/// Every request is rounded up to at least 512 bytes, and to a multiple of 512 by default.
pub(crate) const MIN_BLOCK_SIZE: u64 = 512;
/// Rounded requests of at most 1 MiB are served from the small pool.
pub(crate) const SMALL_SIZE: u64 = 1 << 20;
/// Size of every small-pool segment: 2 MiB.
pub(crate) const SMALL_BUFFER: u64 = 2 << 20;
/// Segment size for large requests under 10 MiB (the default `large_segment_size`): 20 MiB.
/// Also the default `max_non_split_rounding` and the large-pool page of expandable segments.
pub(crate) const LARGE_BUFFER: u64 = 20 << 20;
/// Rounded large requests below 10 MiB share a 20 MiB segment.
pub(crate) const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Rounded large requests of 10 MiB or more get a segment rounded up to a multiple of 2 MiB.
pub(crate) const ROUND_LARGE: u64 = 2 << 20;
/// Number of power-of-two intervals of `roundup_power2_divisions` (1 MiB … 32 GiB and above).
pub(crate) const ROUNDUP_POWER2_INTERVALS: usize = 16;
/// Requests of 2^60 bytes or more fail at once ("more than 1EB").
pub(crate) const ONE_EXA_BYTE: u64 = 1 << 60;
