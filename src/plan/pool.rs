//! The CUDA stream-ordered pool (`cuMemAllocAsync`: cudarc's `CudaSlice`, candle) in a fit plan,
//! as its driver counted it cell by cell. The replay gives the pool's allocations their sizes; the
//! pool itself reserves more (in chunks, 32 MiB on an H200 with driver 580, and it keeps freed
//! memory until a stream synchronizes), by rules the driver does not publish. So the plan does not
//! model the pool: it reads what the pool reserved at most in each cell
//! (`CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`, restarted at every cell) and says where a pool capped at
//! the plan's size ([`crate::mem::cap_cuda_pool`]) would first refuse: in the first cell whose
//! reservation went above what the cap holds (the cap in whole chunks, [`POOL_CHUNK`]). That
//! holds while a capped pool places allocations as the uncapped one did, which it does until it
//! would have to grow past the cap (`scripts/gpu/pool_probe.py`, `scripts/gpu/pool_cap_check.py`,
//! GPU_VALIDATION.md §20).

use crate::render::Table;
use crate::units::{MIB, iec};
use serde::Serialize;

/// What the driver's stream-ordered pool reserves in, measured (H200, driver 580,
/// `scripts/gpu/pool_probe.py`): every reservation is a whole number of these, and a pool's
/// `maxSize` between two of them holds up to the next (1,000 MiB held 1,024 MiB).
pub const POOL_CHUNK: u64 = 32 * MIB;

/// What a pool with `maxSize = cap` can reserve: the cap rounded up to [`POOL_CHUNK`].
pub fn pool_holds(cap: u64) -> u64 {
    cap.div_ceil(POOL_CHUNK).saturating_mul(POOL_CHUNK)
}

/// One cell's reading of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PoolCell {
    /// The cell's number.
    pub cell: u64,
    /// The most the pool reserved during the cell.
    pub reserved_high: u64,
}

/// The pool in a fit plan ([`PoolFit::new`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolFit {
    /// The cap asked about: the plan's device size.
    pub cap: u64,
    /// What a pool capped there can reserve ([`pool_holds`]: the cap in whole chunks).
    pub holds: u64,
    /// Every cell that read the pool, in the order they ran.
    pub cells: Vec<PoolCell>,
    /// The most the pool reserved in the session, and the first cell that reached it.
    pub reserved_high: u64,
    /// That cell.
    pub high_cell: u64,
    /// With the pool capped at `cap`: the first cell whose reservation went above what it holds
    /// (where a capped run refuses), or `None` when every cell stayed within it.
    pub first_over: Option<PoolCell>,
}

impl PoolFit {
    /// The pool under a cap of `cap` bytes, from each cell's reading in the order the cells ran;
    /// `None` when no cell's pool reserved anything (a session without cudarc or candle).
    pub fn new(cells: impl IntoIterator<Item = PoolCell>, cap: u64) -> Option<PoolFit> {
        let cells: Vec<PoolCell> = cells.into_iter().collect();
        // The first cell at the session's highest (max_by_key keeps the last of equals).
        let high = cells.iter().rev().max_by_key(|c| c.reserved_high).filter(|c| c.reserved_high > 0)?;
        let holds = pool_holds(cap);
        let first_over = cells.iter().find(|c| c.reserved_high > holds).copied();
        let (reserved_high, high_cell) = (high.reserved_high, high.cell);
        Some(PoolFit { cap, holds, reserved_high, high_cell, first_over, cells })
    }

    /// The pool's rows: what it reserved at most, and the cap's verdict.
    pub fn table(&self) -> Table {
        let mut t = Table::new(["CUDA pool", "bytes", "cell", "source"]).right_align([1]);
        t.row([
            "reserved at most".to_string(),
            iec(self.reserved_high),
            format!("cell {}", self.high_cell),
            "the driver's count (CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), per cell".to_string(),
        ]);
        let capped = if self.holds == self.cap {
            format!("capped at {}", iec(self.cap))
        } else {
            format!("capped at {} (holds {})", iec(self.cap), iec(self.holds))
        };
        t.row(match self.first_over {
            Some(c) => [
                capped,
                format!("refuses: {} reserved there", iec(c.reserved_high)),
                format!("cell {}", c.cell),
                "the first cell whose reservation went above what the cap holds".to_string(),
            ],
            None => [capped, "holds every cell".to_string(), "–".to_string(), "no cell reserved more".to_string()],
        });
        t.caption(
            "the CUDA stream-ordered pool (cuMemAllocAsync: cudarc, candle) as its driver counted it, not replayed; \
             gpumem_nb::mem::cap_cuda_pool(BYTES) caps it before candle's first allocation",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    fn cells(highs: &[(u64, u64)]) -> Vec<PoolCell> {
        highs.iter().map(|&(cell, mib)| PoolCell { cell, reserved_high: mib * MIB }).collect()
    }

    #[test]
    fn a_cap_refuses_first_in_the_first_cell_that_reserved_more() {
        let c = cells(&[(3, 32), (4, 64), (5, 160), (6, 96), (7, 160), (8, 224)]);
        let p = PoolFit::new(c.clone(), 224 * MIB).unwrap();
        assert_eq!((p.reserved_high, p.high_cell, p.first_over), (224 * MIB, 8, None));
        // Under the highest: the first cell above the cap, not the highest one.
        let p = PoolFit::new(c.clone(), 128 * MIB).unwrap();
        assert_eq!(p.first_over, Some(PoolCell { cell: 5, reserved_high: 160 * MIB }));
        // At a cell's reservation exactly: it holds (the pool refuses only beyond its maxSize).
        assert_eq!(PoolFit::new(c.clone(), 160 * MIB).unwrap().first_over.map(|c| c.cell), Some(8));
        // A cap between chunks holds up to the next chunk: 1 B or 16 MiB under the highest
        // reservation still holds it; a whole chunk under does not.
        for under in [1, 16 * MIB] {
            let p = PoolFit::new(c.clone(), 224 * MIB - under).unwrap();
            assert_eq!((p.holds, p.first_over), (224 * MIB, None), "{under}");
        }
        assert_eq!(PoolFit::new(c.clone(), 192 * MIB).unwrap().first_over.map(|c| c.cell), Some(8));
        assert_eq!(pool_holds(1000 * MIB), 1024 * MIB, "the probe's 1,000 MiB pool held 1,024 x 1 MiB");
        // The highest reached twice: the first cell that reached it.
        let p = PoolFit::new(cells(&[(1, 32), (2, 96), (3, 96)]), 64 * MIB).unwrap();
        assert_eq!((p.high_cell, p.first_over.map(|c| c.cell)), (2, Some(2)));
        // No pool: nothing to say.
        assert_eq!(PoolFit::new(cells(&[(1, 0), (2, 0)]), MIB), None);
        assert_eq!(PoolFit::new(Vec::new(), MIB), None);
    }

    #[test]
    fn the_table_names_its_source_and_the_cell() {
        let c = cells(&[(3, 32), (5, 160), (8, 224)]);
        let text = PoolFit::new(c.clone(), 128 * MIB).unwrap().table().to_text();
        assert!(text.contains("224.00 MiB") && text.contains("cell 8"), "{text}");
        assert!(text.contains("refuses: 160.00 MiB reserved there") && text.contains("cell 5"), "{text}");
        assert!(text.contains("CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH") && text.contains("cap_cuda_pool"), "{text}");
        let text = PoolFit::new(c, 250 * MIB).unwrap().table().to_text();
        assert!(
            text.contains("holds every cell") && text.contains("capped at 250.00 MiB (holds 256.00 MiB)"),
            "{text}"
        );
    }
}
