//! Size rounding and segment-size choice: `round_size`, `get_allocation_size` and the pool
//! choice, exactly as PyTorch computes them.
#![forbid(unsafe_code)]

use super::constants::{MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE};
use crate::policy::config::AllocatorConfig;

/// Which of a device's two pools a rounded size belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    /// Rounded sizes ≤ 1 MiB, 2 MiB segments.
    Small,
    /// Everything larger.
    Large,
}

impl PoolKind {
    /// The pool for a rounded size.
    pub(crate) fn for_size(rounded: u64) -> PoolKind {
        if rounded <= SMALL_SIZE { PoolKind::Small } else { PoolKind::Large }
    }
    /// "small" / "large", as in snapshots' `segment_type`.
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
        }
    }
}

/// PyTorch's `round_size`: at least 512 bytes; power-of-two divisions when configured for the
/// size's interval and the size exceeds `512 · divisions`; otherwise a multiple of 512.
#[inline]
pub(crate) fn round_size(size: u64, config: &AllocatorConfig) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let divisions = config.roundup_divisions(size);
    if divisions > 1 && size > MIN_BLOCK_SIZE.saturating_mul(divisions) {
        roundup_power2_next_division(size, divisions)
    } else {
        size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    }
}

/// Rounds up to the next of `divisions` equal steps between two powers of two.
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let power2_floor = 1u64 << (63 - size.leading_zeros());
    let power2_division = power2_floor >> (63 - divisions.leading_zeros());
    if power2_division == 0 {
        return power2_floor << 1;
    }
    let floor = size & !(power2_division - 1);
    if floor == size { size } else { floor + power2_division }
}

/// PyTorch's `get_allocation_size`: the size of a new segment for a rounded request.
/// ≤ 1 MiB → 2 MiB; < 10 MiB → `large_segment_size` (20 MiB); else rounded up to 2 MiB.
pub(crate) fn allocation_size(rounded: u64, config: &AllocatorConfig) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        config.large_segment_size
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    fn cfg(s: &str) -> AllocatorConfig {
        AllocatorConfig::parse(s).unwrap()
    }

    #[test]
    fn default_rounding_table() {
        let c = AllocatorConfig::default();
        for (n, want) in [
            (1, 512),
            (511, 512),
            (512, 512),
            (513, 1024),
            (1000, 1024),
            (4096, 4096),
            (1_048_575, 1_048_576),
            (1_048_577, 1_049_088),
            (10 * MIB + 1, 10_486_272),
            (11_000_000, 11_000_320),
            (100 * MIB + 7, 104_858_112),
        ] {
            assert_eq!(round_size(n, &c), want, "round_size({n})");
        }
    }

    #[test]
    fn power2_divisions_measured() {
        let c = cfg("roundup_power2_divisions:4");
        for (n, want) in [
            (1200, 1536),
            (2048, 2048),
            (2049, 2560),
            (3000, 3072),
            (1_000_000, 1_048_576),
            (1_500_000, 1_572_864),
            (5_000_000, 5_242_880),
            (70_000_000, 83_886_080),
        ] {
            assert_eq!(round_size(n, &c), want, "round_size({n}) with divisions 4");
        }
        let c = cfg("roundup_power2_divisions:[256:1,512:2,>:8]");
        assert_eq!(round_size(1_000_000, &c), 1_000_448);
        assert_eq!(round_size(70_000_000, &c), 70_000_128);
    }

    #[test]
    fn pools_and_segment_sizes() {
        let c = AllocatorConfig::default();
        assert_eq!(PoolKind::for_size(MIB), PoolKind::Small);
        assert_eq!(PoolKind::for_size(MIB + 512), PoolKind::Large);
        assert_eq!(allocation_size(512, &c), 2 * MIB);
        assert_eq!(allocation_size(MIB, &c), 2 * MIB);
        assert_eq!(allocation_size(MIB + 512, &c), 20 * MIB);
        assert_eq!(allocation_size(10 * MIB - 512, &c), 20 * MIB);
        assert_eq!(allocation_size(10 * MIB, &c), 10 * MIB);
        assert_eq!(allocation_size(10 * MIB + 512, &c), 12 * MIB);
        assert_eq!(allocation_size(21 * MIB, &c), 22 * MIB);
    }
}
