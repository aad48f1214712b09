//! How much of a long session the kernel keeps: the last `GPUMEM_NB_HISTORY_CELLS` cells'
//! records (default 2,000) and end times (for `%gpumem diff` of cells), and the code of at least
//! the last [`CODE_CELLS`] cells (for sites' cell lines: a function an early cell defined keeps
//! its lines for longer than the early cell's record). What is dropped is summarised
//! ([`Dropped`]: how many cells, which, their statuses and highest peak), shown in `%gpumem
//! history`'s caption and written by `%gpumem export` (JSON), never silently lost.
//!
//! A record takes a few KiB of the kernel's memory (1.2 KiB of its own and its strings): the
//! default keeps the history's part of the kernel's memory within about 10 MiB in a session of
//! any length (`scripts/soak.sh`, BENCHMARKS.md "Soak").

use gpumem_nb::kernel::report::{CellRecord, CellStatus};
use serde::Serialize;
use std::collections::BTreeMap;

/// The environment variable with the number of cells kept.
pub const HISTORY_VAR: &str = "GPUMEM_NB_HISTORY_CELLS";

/// Cells kept when the variable is not set.
pub const DEFAULT_KEEP: usize = 2_000;

/// The code of this many cells is kept at least (more when the history keeps more).
pub const CODE_CELLS: usize = 10_000;

/// Cells kept: `GPUMEM_NB_HISTORY_CELLS` (at least 1), else [`DEFAULT_KEEP`].
pub fn keep() -> usize {
    std::env::var(HISTORY_VAR).ok().and_then(|v| v.trim().parse::<usize>().ok()).map_or(DEFAULT_KEEP, |n| n.max(1))
}

/// The cells dropped from the history, summarised.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Dropped {
    /// How many.
    pub cells: u64,
    /// The first and the last of them (execution counts).
    pub first: Option<u64>,
    /// The last.
    pub last: Option<u64>,
    /// The highest peak among them (the record's total peak).
    pub peak_max: Option<u64>,
    /// How many by status.
    pub statuses: BTreeMap<CellStatus, u64>,
}

impl Dropped {
    /// Counts `rec` as dropped.
    pub fn add(&mut self, rec: &CellRecord) {
        self.cells += 1;
        self.first = Some(self.first.map_or(rec.cell, |f| f.min(rec.cell)));
        self.last = Some(self.last.map_or(rec.cell, |l| l.max(rec.cell)));
        if let Some(p) = rec.peak_total() {
            self.peak_max = Some(self.peak_max.map_or(p, |m| m.max(p)));
        }
        *self.statuses.entry(rec.status).or_default() += 1;
    }

    /// One line for the history's caption, when anything was dropped.
    pub fn line(&self) -> Option<String> {
        let (first, last) = (self.first?, self.last?);
        let statuses: Vec<String> = self.statuses.iter().map(|(s, n)| format!("{n} {s}")).collect();
        let peak = self.peak_max.map_or(String::new(), |p| format!(", highest peak {}", gpumem_nb::units::iec(p)));
        Some(format!(
            "{} not kept ([{first}]–[{last}]: {}{peak}; {HISTORY_VAR} keeps {})",
            gpumem_nb::units::count(self.cells as usize, "earlier cell"),
            statuses.join(", "),
            keep()
        ))
    }
}

/// Drops the oldest records beyond `keep` into `dropped`.
pub fn trim(cells: &mut Vec<CellRecord>, dropped: &mut Dropped, keep: usize) {
    if cells.len() > keep {
        for rec in cells.drain(..cells.len() - keep) {
            dropped.add(&rec);
        }
    }
}

/// Drops the entries of a per-cell map older than its newest `keep`.
pub fn trim_map<V>(map: &mut BTreeMap<u64, V>, keep: usize) {
    while map.len() > keep {
        map.pop_first();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_records_go_and_are_summarised() {
        let rec = |cell, status| CellRecord { cell, status, ..Default::default() };
        let mut cells: Vec<CellRecord> =
            (1..=5).map(|c| rec(c, if c == 2 { CellStatus::Panicked } else { CellStatus::Ok })).collect();
        let mut d = Dropped::default();
        trim(&mut cells, &mut d, 3);
        assert_eq!(cells.iter().map(|r| r.cell).collect::<Vec<_>>(), [3, 4, 5]);
        assert_eq!((d.cells, d.first, d.last), (2, Some(1), Some(2)));
        assert_eq!(d.statuses, BTreeMap::from([(CellStatus::Ok, 1), (CellStatus::Panicked, 1)]));
        assert!(d.line().unwrap().starts_with("2 earlier cells not kept ([1]–[2]: 1 ok, 1 panicked"), "{:?}", d.line());
        trim(&mut cells, &mut d, 3);
        assert_eq!(d.cells, 2, "nothing more to drop");
        assert_eq!(Dropped::default().line(), None);
        let mut m: BTreeMap<u64, ()> = (1..=5).map(|c| (c, ())).collect();
        trim_map(&mut m, 2);
        assert_eq!(m.keys().copied().collect::<Vec<_>>(), [4, 5]);
    }
}
