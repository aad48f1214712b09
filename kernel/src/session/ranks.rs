//! `%gpumem ranks`: the worker processes the notebook started on the device (one per GPU, each
//! with its rank), as one view. Per cell: how many processes, their ranks, the least / most / mean /
//! sum of their bytes and the process holding the most (rank, pid, device); for one cell, its
//! processes one by one. Read from the records' `children` (one source for every view): bytes
//! are NVML's or the simulated process table's, each process's devices together.
//!
//! A process's figure is its highest reading in the cell where the live line took readings
//! (every 0.5 s from the first second on, and at the end), else its bytes at the end of the
//! cell; the table says which. Neither is an exact peak, and a sum adds figures that need not
//! be of the same moment.

use gpumem_nb::kernel::children::ChildProcess;
use gpumem_nb::kernel::report::CellRecord;
use gpumem_nb::render::Table;
use gpumem_nb::stats::spread::Spread;
use gpumem_nb::units::iec;
use serde_json::{Value, json};

/// The MIME type of `%gpumem ranks`'s figures for programs, beside its table.
pub const RANKS_MIME: &str = "application/vnd.gpumem.ranks+json";

/// One worker process of a cell, its devices together.
#[derive(Clone, Debug, PartialEq)]
pub struct Process {
    /// Its pid.
    pub pid: u32,
    /// Its name.
    pub name: String,
    /// Its rank, local rank, and where they were read (see `gpumem_nb::kernel::children`).
    pub rank: Option<u32>,
    /// Its rank on this machine.
    pub local_rank: Option<u32>,
    /// Where the rank was read.
    pub rank_from: Option<String>,
    /// The devices it holds memory on (NVML's UUID, or `sim-0`).
    pub devices: Vec<String>,
    /// Bytes at the end of the cell, every device.
    pub used: u64,
    /// Its figure: the highest reading (each device's), else `used`.
    pub highest: u64,
    /// What `highest` is: `highest of N readings` or `at the end of the cell`.
    pub figure: String,
    /// Where the bytes come from: `NVML`, `the simulated process table`.
    pub source: String,
}

impl Process {
    /// `rank 1 · pid 4242 · sim-0` (without a rank: `pid 4242 · sim-0`).
    pub fn who(&self) -> String {
        let rank = self.rank.map_or(String::new(), |r| format!("rank {r} · "));
        format!("{rank}pid {} · {}", self.pid, self.devices.join(", "))
    }

    fn to_json(&self) -> Value {
        json!({
            "pid": self.pid, "name": self.name, "rank": self.rank, "local_rank": self.local_rank,
            "rank_from": self.rank_from, "devices": self.devices, "used": self.used, "highest": self.highest,
            "figure": self.figure, "source": self.source,
        })
    }
}

/// A cell's worker processes and their spread.
#[derive(Clone, Debug, PartialEq)]
pub struct CellRanks {
    /// The cell.
    pub cell: u64,
    /// Its processes, by rank (those without one last, by pid).
    pub processes: Vec<Process>,
    /// Their figures' spread; `highest` is an index into `processes`.
    pub spread: Spread<usize>,
}

impl CellRanks {
    /// The cell's processes from its record's rows (`None`: it had none).
    pub fn of(rec: &CellRecord) -> Option<CellRanks> {
        let processes = processes(&rec.children);
        let spread = Spread::of(processes.iter().enumerate().map(|(i, p)| (i, p.highest)))?;
        Some(CellRanks { cell: rec.cell, processes, spread })
    }

    /// The process holding the most.
    pub fn highest(&self) -> &Process {
        &self.processes[self.spread.highest]
    }

    /// The ranks, as a list: `0, 1, 3`, a run as `0–7`; `–` where none has one.
    pub fn ranks(&self) -> String {
        let mut r: Vec<u32> = self.processes.iter().filter_map(|p| p.rank).collect();
        r.sort_unstable();
        r.dedup();
        match r.as_slice() {
            [] => "–".into(),
            [first, .., last] if r.len() > 2 && (*last - *first) as usize == r.len() - 1 => format!("{first}–{last}"),
            _ => r.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
        }
    }

    /// The figures' words (the same for every process of a cell: readings are the cell's).
    pub fn figure(&self) -> &str {
        &self.highest().figure
    }

    /// The cell as JSON: its processes and the spread, the highest named.
    pub fn to_json(&self) -> Value {
        let s = &self.spread;
        let top = self.highest();
        json!({
            "cell": self.cell,
            "figure": self.figure(),
            "processes": self.processes.iter().map(Process::to_json).collect::<Vec<_>>(),
            "summary": {
                "count": s.count, "min": s.min, "max": s.max, "mean": s.mean, "sum": s.sum,
                "highest": {"rank": top.rank, "pid": top.pid, "devices": top.devices},
            },
        })
    }
}

/// A record's rows by process (a process on several devices is one, its bytes added), by rank.
pub fn processes(rows: &[ChildProcess]) -> Vec<Process> {
    let mut out: Vec<Process> = Vec::new();
    for c in rows {
        match out.iter_mut().find(|p| p.pid == c.pid) {
            Some(p) => {
                p.devices.push(c.device.clone());
                p.used += c.used;
                p.highest += c.highest();
            }
            None => out.push(Process {
                pid: c.pid,
                name: c.name.clone(),
                rank: c.rank,
                local_rank: c.local_rank,
                rank_from: c.rank_from.clone(),
                devices: vec![c.device.clone()],
                used: c.used,
                highest: c.highest(),
                figure: c.figure(),
                source: c.source_words().to_string(),
            }),
        }
    }
    out.sort_by_key(|p| (p.rank.is_none(), p.rank, p.pid));
    out
}

/// Every cell of `cells` that had worker processes on a device.
pub fn summary(cells: &[CellRecord]) -> Vec<CellRanks> {
    cells.iter().filter_map(CellRanks::of).collect()
}

/// The session's table: one row per cell with worker processes.
pub fn table(cells: &[CellRanks]) -> Table {
    let mut t = Table::new([
        "cell",
        "processes",
        "ranks",
        "min",
        "max",
        "mean",
        "sum",
        "holding the most",
        "bytes per process",
        "source",
    ])
    .right_align([1, 3, 4, 5, 6]);
    for c in cells {
        let s = &c.spread;
        t.row([
            format!("[{}]", c.cell),
            s.count.to_string(),
            c.ranks(),
            iec(s.min),
            iec(s.max),
            iec(s.mean.round() as u64),
            iec(s.sum),
            c.highest().who(),
            c.figure().to_string(),
            c.highest().source.clone(),
        ]);
    }
    t.title("the notebook's worker processes on the device in each cell, by rank").caption(CAPTION)
}

/// What every ranks table's numbers are.
const CAPTION: &str = "per process (its devices together): bytes on the device (NVML, or the simulated process \
                       table), beside the notebook's own numbers · a highest reading is the most of the readings \
                       taken every 0.5 s while the live line ran and at the end, not an exact peak · sum adds each \
                       process's figure, which need not be of the same moment";

/// One cell's processes one by one.
pub fn cell_table(c: &CellRanks) -> Table {
    let mut t = Table::new(["rank", "local rank", "pid", "name", "device", "at the end", "highest reading", "source"])
        .right_align([0, 1, 2, 5, 6]);
    let opt = |v: Option<u32>| v.map_or("–".into(), |v| v.to_string());
    for p in &c.processes {
        let high = if p.figure.starts_with("highest") { iec(p.highest) } else { "–".into() };
        let source = match &p.rank_from {
            Some(from) => format!("{}; rank from {from}", p.source),
            None => p.source.clone(),
        };
        t.row([
            opt(p.rank),
            opt(p.local_rank),
            p.pid.to_string(),
            p.name.clone(),
            p.devices.join(", "),
            iec(p.used),
            high,
            source,
        ]);
    }
    let s = &c.spread;
    t.title(format!(
        "cell [{}]: {} · {} · min {} · max {} ({}) · mean {} · sum {}",
        c.cell,
        if s.count == 1 { "1 process".to_string() } else { format!("{} processes", s.count) },
        c.figure(),
        iec(s.min),
        iec(s.max),
        c.highest().who(),
        iec(s.mean.round() as u64),
        iec(s.sum)
    ))
    .caption(CAPTION)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn child(pid: u32, rank: Option<u32>, device: &str, used: u64) -> ChildProcess {
        ChildProcess {
            pid,
            name: "gpumem-demo".into(),
            device: device.into(),
            used,
            source: "simulated".into(),
            rank,
            rank_from: rank.map(|_| "RANK".into()),
            ..Default::default()
        }
    }

    fn rec(cell: u64, children: Vec<ChildProcess>) -> CellRecord {
        CellRecord { cell, children, ..Default::default() }
    }

    #[test]
    fn one_row_per_cell_with_the_spread_and_the_rank_holding_the_most() {
        let cells = vec![
            rec(1, vec![]),
            rec(2, vec![child(41, Some(1), "sim-0", 80 * MIB), child(40, Some(0), "sim-0", 48 * MIB)]),
            rec(
                3,
                vec![
                    child(50, None, "GPU-a", 10 * MIB),
                    child(50, None, "GPU-b", 6 * MIB),
                    child(51, None, "GPU-a", 1),
                ],
            ),
        ];
        let s = summary(&cells);
        assert_eq!(s.len(), 2, "a cell without processes has no row");
        let two = &s[0];
        assert_eq!(two.processes.iter().map(|p| p.rank).collect::<Vec<_>>(), [Some(0), Some(1)], "by rank");
        let sp = &two.spread;
        assert_eq!((sp.count, sp.min, sp.max, sp.sum, sp.mean), (2, 48 * MIB, 80 * MIB, 128 * MIB, 64.0 * MIB as f64));
        assert_eq!(two.highest().who(), "rank 1 · pid 41 · sim-0");
        assert_eq!(two.ranks(), "0, 1");
        assert_eq!(two.figure(), "at the end of the cell");
        // A process on two devices is one, its bytes added.
        let three = &s[1];
        assert_eq!(three.processes.len(), 2);
        assert_eq!(three.highest().who(), "pid 50 · GPU-a, GPU-b");
        assert_eq!(three.spread.max, 16 * MIB);
        assert_eq!(three.ranks(), "–");

        let t = table(&s).to_text();
        for want in ["[2]", "48.00 MiB", "80.00 MiB", "64.00 MiB", "128.00 MiB", "rank 1 · pid 41 · sim-0", "0, 1"] {
            assert!(t.contains(want), "{want}:\n{t}");
        }
        assert!(t.contains("at the end of the cell") && t.contains("the simulated process table"), "{t}");
        let j = two.to_json();
        assert_eq!(j["summary"]["highest"], json!({"rank": 1, "pid": 41, "devices": ["sim-0"]}));
        assert_eq!((j["summary"]["sum"].as_u64(), j["summary"]["min"].as_u64()), (Some(128 * MIB), Some(48 * MIB)));
        assert_eq!(j["processes"][0]["rank_from"], "RANK");
    }

    #[test]
    fn one_cell_lists_each_process_and_says_which_figure() {
        let sampled = |c: ChildProcess, peak: u64| ChildProcess { peak: Some(peak), readings: Some(6), ..c };
        let r = rec(
            4,
            vec![
                sampled(child(40, Some(0), "sim-0", 0), 96 * MIB),
                sampled(child(41, Some(1), "sim-0", 8 * MIB), 8 * MIB),
            ],
        );
        let c = CellRanks::of(&r).unwrap();
        assert_eq!(c.figure(), "highest of 6 readings");
        assert_eq!(c.highest().pid, 40, "the highest reading counts, not the bytes at the end");
        let t = cell_table(&c).to_text();
        assert!(
            t.starts_with("cell [4]: 2 processes · highest of 6 readings · min 8.00 MiB · max 96.00 MiB (rank 0"),
            "{t}"
        );
        assert!(t.contains("sum 104.00 MiB") && t.contains("rank from RANK"), "{t}");
        let ranks: Vec<u32> = (0..8).collect();
        let run = rec(5, ranks.iter().map(|&r| child(100 + r, Some(r), "sim-0", MIB)).collect());
        assert_eq!(CellRanks::of(&run).unwrap().ranks(), "0–7");
    }
}
