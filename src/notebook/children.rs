//! The notebook's own worker processes on the device: every process below the notebook's
//! process in the process tree that holds device memory, by pid, with its name, its device and,
//! for the ranks of a distributed job, its rank. On a GPU the numbers are NVML's per-process
//! list; on the simulated device, the simulated process table (`device::sim_procs`); the tree,
//! each process's environment and command line are `/proc`'s ([`crate::procfs`]). They are not
//! the notebook process's own exact numbers, and not counted in them: a record shows them
//! beside.
//!
//! A child's rank is what its launcher told it ([`rank_of`]): `RANK` / `LOCAL_RANK` (torchrun
//! and most launchers), else `SLURM_PROCID` / `SLURM_LOCALID` (`srun`), else
//! `OMPI_COMM_WORLD_RANK` / `OMPI_COMM_WORLD_LOCAL_RANK` (Open MPI's `mpirun`), from the
//! environment it was started with; else `--rank N` / `--local-rank N` on its command line (as
//! candle's multi-process examples pass it). A variable the notebook's process has with the same
//! value was inherited, not given, and is not read as a rank.
//!
//! A kernel that reads the children several times while a cell runs ([`Sampled`]) keeps each
//! one's highest reading; without such readings a child's bytes are those at the end of the
//! cell, and said so.

use crate::device::nvml::NvmlSnapshot;
use crate::device::sim_procs;
use serde::{Deserialize, Serialize};

/// One process of the notebook's process tree holding device memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildProcess {
    /// Its pid.
    pub pid: u32,
    /// Its name (`/proc/<pid>/comm`).
    pub name: String,
    /// The device: NVML's UUID (`GPU-…`), or `sim-0` for the simulated device.
    pub device: String,
    /// Bytes it holds there at the end of the cell (0: seen during the cell, no longer on the
    /// device at its end).
    pub used: u64,
    /// `nvml` or `simulated`.
    pub source: String,
    /// Its rank in a distributed job (`RANK`, `SLURM_PROCID`, `OMPI_COMM_WORLD_RANK` or
    /// `--rank`), when it was given one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Its rank on this machine (`LOCAL_RANK`, `SLURM_LOCALID`, `OMPI_COMM_WORLD_LOCAL_RANK` or
    /// `--local-rank`), when it was given one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<u32>,
    /// Where the rank (else the local rank) was read: the environment variable's name, or
    /// `--rank` / `--local-rank` for its command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_from: Option<String>,
    /// The highest of the readings taken while the cell ran and at its end (`readings` of them):
    /// not an exact peak, a reading's figure. `None`: read at the end of the cell only, `used`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak: Option<u64>,
    /// How many readings `peak` is the highest of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readings: Option<u32>,
}

impl ChildProcess {
    /// The figure a summary compares: the highest reading where there were several, else the
    /// bytes at the end of the cell.
    pub fn highest(&self) -> u64 {
        self.peak.unwrap_or(self.used)
    }

    /// What [`ChildProcess::highest`] is, in words: `at the end of the cell`, or `highest of N
    /// readings`.
    pub fn figure(&self) -> String {
        match self.readings {
            Some(n) if self.peak.is_some() => format!("highest of {n} readings"),
            _ => "at the end of the cell".into(),
        }
    }

    /// Where its bytes come from, in words.
    pub fn source_words(&self) -> &str {
        match self.source.as_str() {
            "nvml" => "NVML",
            "simulated" => "the simulated process table",
            other => other,
        }
    }
}

/// The report line's part for the children, its forms from richest to shortest: one or two by
/// name, pid and rank (`child processes 64.0 MiB (w 41 rank 0, w 42 rank 1)`), with the highest
/// reading where one was above what that child held at the end; then without it; then only the
/// ranks where every child has one (eight at most), else how many (`(ranks 0, 1)`, `(3
/// processes)`). Empty without children.
pub fn line_forms(children: &[ChildProcess]) -> Vec<String> {
    if children.is_empty() {
        return Vec::new();
    }
    let total = crate::units::iec3(children.iter().map(|c| c.used).sum());
    let named = |c: &ChildProcess| match c.rank {
        Some(r) => format!("{} {} rank {r}", c.name, c.pid),
        None => format!("{} {}", c.name, c.pid),
    };
    let mut ranks: Vec<u32> = children.iter().filter_map(|c| c.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let counted = if children.iter().all(|c| c.rank.is_some()) && ranks.len() <= 8 {
        format!("ranks {}", ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(", "))
    } else {
        format!("{} processes", children.len())
    };
    let who =
        if children.len() <= 2 { children.iter().map(named).collect::<Vec<_>>().join(", ") } else { counted.clone() };
    let named_line = format!("child processes {total} ({who})");
    // A reading's figure, not an exact peak.
    let mut forms = match children.iter().filter(|c| c.highest() > c.used).max_by_key(|c| c.highest()) {
        Some(c) => vec![format!("{named_line}, highest reading {} ({})", crate::units::iec3(c.highest()), named(c))],
        None => Vec::new(),
    };
    forms.push(named_line);
    let short = format!("child processes {total} ({counted})");
    if forms.last() != Some(&short) {
        forms.push(short);
    }
    forms
}

impl ChildProcess {
    /// Its row of a record's details table (what, before, after, Δ, peak in cell, source): the
    /// bytes at the end, the highest reading where there was one, where each comes from.
    pub fn details_row(&self) -> [String; 6] {
        let mut source = match self.source.as_str() {
            "nvml" => "NVML, a process below the notebook's in the process tree",
            "simulated" => "the simulated device's process table, a process below the notebook's",
            other => other,
        }
        .to_string();
        if let Some(from) = &self.rank_from {
            source.push_str(&format!("; rank from {from}"));
        }
        if self.peak.is_some() {
            source.push_str(&format!("; peak: the {} (not exact)", self.figure()));
        }
        let who = match (self.rank, self.local_rank) {
            (Some(r), Some(l)) => format!("pid {}, rank {r}, local rank {l}", self.pid),
            (Some(r), None) => format!("pid {}, rank {r}", self.pid),
            (None, Some(l)) => format!("pid {}, local rank {l}", self.pid),
            (None, None) => format!("pid {}", self.pid),
        };
        let iec = crate::units::iec;
        [
            format!("child process {} ({who}) on {}", self.name, self.device),
            "–".into(),
            iec(self.used),
            "–".into(),
            self.peak.map_or("–".into(), iec),
            source,
        ]
    }
}

/// The variables a launcher gives a process its rank and local rank in, asked in this order:
/// torchrun's (and most launchers'), Slurm's `srun`, Open MPI's `mpirun`.
pub const RANK_VARIABLES: [(&str, &str); 3] =
    [("RANK", "LOCAL_RANK"), ("SLURM_PROCID", "SLURM_LOCALID"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")];

/// A process's rank and local rank, and where they were read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rank {
    /// Its rank in the job.
    pub rank: Option<u32>,
    /// Its rank on this machine.
    pub local_rank: Option<u32>,
    /// The variable (or `--rank`, `--local-rank`) the rank, else the local rank, was read from.
    pub from: Option<String>,
}

/// The rank of a process started with environment `env` and arguments `args`, where the
/// notebook's process has environment `inherited`: the first of [`RANK_VARIABLES`]'s pairs that
/// sets either number (a variable `inherited` holds with the same value does not count: it
/// was passed down, not given), else `--rank N` / `--rank=N` and `--local-rank N` (or
/// `--local_rank`) among `args`.
pub fn rank_of(env: &[(String, String)], inherited: &[(String, String)], args: &[String]) -> Rank {
    let var = |name: &str| -> Option<u32> {
        let (_, value) = env.iter().rev().find(|(k, _)| k == name)?;
        if inherited.iter().any(|(k, v)| k == name && v == value) {
            return None;
        }
        value.trim().parse().ok()
    };
    for (rank, local) in RANK_VARIABLES {
        let (r, l) = (var(rank), var(local));
        if r.is_some() || l.is_some() {
            let from = if r.is_some() { rank } else { local };
            return Rank { rank: r, local_rank: l, from: Some(from.to_string()) };
        }
    }
    let arg = |names: &[&str]| -> Option<u32> {
        let mut it = args.iter().skip(1);
        while let Some(a) = it.next() {
            for n in names {
                if a == n {
                    return it.next()?.parse().ok();
                }
                if let Some(v) = a.strip_prefix(n).and_then(|r| r.strip_prefix('=')) {
                    return v.parse().ok();
                }
            }
        }
        None
    };
    let (r, l) = (arg(&["--rank"]), arg(&["--local-rank", "--local_rank"]));
    let from = match (r, l) {
        (Some(_), _) => Some("--rank".to_string()),
        (None, Some(_)) => Some("--local-rank".to_string()),
        (None, None) => None,
    };
    Rank { rank: r, local_rank: l, from }
}

/// The processes below `root` (the notebook's process) holding memory on any device NVML lists
/// in `nvml`, or on the simulated device, each with its rank where it has one.
pub fn of_tree(root: u32, nvml: &NvmlSnapshot) -> Vec<ChildProcess> {
    of_tree_in(root, nvml, &sim_procs::dir())
}

/// [`of_tree`] with the simulated process table in `sim_dir`.
pub fn of_tree_in(root: u32, nvml: &NvmlSnapshot, sim_dir: &std::path::Path) -> Vec<ChildProcess> {
    let below = crate::procfs::descendants(root);
    if below.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for d in &nvml.devices {
        for p in d.processes.iter().filter(|p| below.contains(&p.pid)) {
            out.push(ChildProcess {
                pid: p.pid,
                name: crate::procfs::process_name(p.pid),
                device: d.uuid.clone(),
                used: p.used.unwrap_or(0),
                source: "nvml".into(),
                ..Default::default()
            });
        }
    }
    for p in sim_procs::processes_in(sim_dir, 0).into_iter().filter(|p| below.contains(&p.pid) && p.used > 0) {
        out.push(ChildProcess {
            pid: p.pid,
            name: p.name,
            device: "sim-0".into(),
            used: p.used,
            source: "simulated".into(),
            ..Default::default()
        });
    }
    if !out.is_empty() {
        let inherited = crate::procfs::environ(root);
        let mut known: Vec<(u32, Rank)> = Vec::new();
        for c in &mut out {
            let rank = match known.iter().find(|(pid, _)| *pid == c.pid) {
                Some((_, r)) => r.clone(),
                None => {
                    let r = rank_of(&crate::procfs::environ(c.pid), &inherited, &crate::procfs::cmdline(c.pid));
                    known.push((c.pid, r.clone()));
                    r
                }
            };
            (c.rank, c.local_rank, c.rank_from) = (rank.rank, rank.local_rank, rank.from);
        }
    }
    out
}

/// The children read while a cell ran (the live line's readings), for its record: each one's
/// highest reading and how many readings there were. Feed each reading to [`Sampled::add`] and
/// the rows after the cell to [`Sampled::finish`].
#[derive(Clone, Debug, Default)]
pub struct Sampled {
    /// Every child seen, as last seen, with its highest reading.
    seen: Vec<(ChildProcess, u64)>,
    /// Readings taken.
    readings: u32,
}

impl Sampled {
    /// One reading of the children ([`of_tree`]'s rows).
    pub fn add(&mut self, rows: Vec<ChildProcess>) {
        self.readings += 1;
        for row in rows {
            match self.seen.iter_mut().find(|(s, _)| s.pid == row.pid && s.device == row.device) {
                Some((s, high)) => {
                    *high = (*high).max(row.used);
                    *s = row;
                }
                None => {
                    let high = row.used;
                    self.seen.push((row, high));
                }
            }
        }
    }

    /// Readings taken so far.
    pub fn readings(&self) -> u32 {
        self.readings
    }

    /// The rows after the cell (`end`, one more reading) with what the readings during it saw:
    /// each child's highest reading of them all (`peak`, over `readings`); a child seen during
    /// the cell but no longer on its device at the end (it ended, or freed its memory) with 0
    /// bytes at the end. Without readings during the cell, `end` as it is: its bytes are those
    /// at the end only.
    pub fn finish(self, mut end: Vec<ChildProcess>) -> Vec<ChildProcess> {
        if self.readings == 0 {
            return end;
        }
        let n = self.readings + 1;
        for c in &mut end {
            let during = self.seen.iter().find(|(s, _)| s.pid == c.pid && s.device == c.device).map_or(0, |(_, h)| *h);
            c.peak = Some(c.used.max(during));
            c.readings = Some(n);
        }
        for (s, high) in self.seen {
            if !end.iter().any(|c| c.pid == s.pid && c.device == s.device) {
                end.push(ChildProcess { used: 0, peak: Some(high), readings: Some(n), ..s });
            }
        }
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child process of this one on the simulated device: its row, by pid and name. The child
    /// is this test binary itself, run as a worker that opens the simulated device, allocates
    /// and waits (`worker` below).
    #[test]
    fn a_worker_on_the_simulated_device_is_listed() {
        let dir = std::env::temp_dir().join(format!("gpumem-children-{}", std::process::id()));
        let exe = std::env::current_exe().unwrap();
        let mut child = std::process::Command::new(exe)
            .args(["--exact", "notebook::children::tests::worker", "--nocapture", "--ignored"])
            .env("GPUMEM_NB_CHILD_WORKER", "1")
            .env("GPUMEM_NB_DEVICE", "sim:1GiB")
            .env("RANK", "3")
            .env("LOCAL_RANK", "1")
            .env(sim_procs::PROCS_VAR, &dir)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Wait for the worker's row (it allocates 96 MiB through the caching allocator).
        let t = std::time::Instant::now();
        let rows = loop {
            let rows = of_tree_in(std::process::id(), &NvmlSnapshot::default(), &dir);
            if !rows.is_empty() || t.elapsed().as_secs() > 60 {
                break rows;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        assert_eq!(rows.len(), 1, "the worker's table entry");
        let want = ChildProcess {
            pid: child.id(),
            name: crate::procfs::process_name(child.id()),
            device: "sim-0".into(),
            used: 96 << 20,
            source: "simulated".into(),
            rank: Some(3),
            local_rank: Some(1),
            rank_from: Some("RANK".into()),
            ..Default::default()
        };
        assert_eq!(rows, [want], "a 96 MiB buffer is one 96 MiB segment, rank 3 from the worker's environment");
        assert!(!rows[0].name.is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    /// The launchers' variables in order, each pair as a unit; what the notebook's process has
    /// with the same value is inherited, not a rank; `--rank` on the command line last.
    #[test]
    fn a_rank_is_read_from_the_launchers_variables_then_the_command_line() {
        let rank = |r: Option<u32>, l: Option<u32>, from: &str| Rank {
            rank: r,
            local_rank: l,
            from: (!from.is_empty()).then(|| from.to_string()),
        };
        let none: &[(String, String)] = &[];
        // (the child's environment, the notebook's, the child's arguments, its rank)
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [(&'a str, &'a str)], &'a [&'a str], Rank);
        let cases: &[Case<'_>] = &[
            (&[("RANK", "1"), ("LOCAL_RANK", "0")], &[], &[], rank(Some(1), Some(0), "RANK")),
            (&[("LOCAL_RANK", "2")], &[], &[], rank(None, Some(2), "LOCAL_RANK")),
            // torchrun's pair first, whole: Slurm's local id does not fill torchrun's gap.
            (&[("SLURM_PROCID", "5"), ("SLURM_LOCALID", "1"), ("RANK", "7")], &[], &[], rank(Some(7), None, "RANK")),
            (&[("SLURM_PROCID", "5"), ("SLURM_LOCALID", "1")], &[], &[], rank(Some(5), Some(1), "SLURM_PROCID")),
            (
                &[("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_LOCAL_RANK", "3")],
                &[],
                &[],
                rank(Some(3), Some(3), "OMPI_COMM_WORLD_RANK"),
            ),
            // A Jupyter server inside a Slurm job: every child inherits SLURM_PROCID=0.
            (
                &[("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0")],
                &[("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0")],
                &[],
                rank(None, None, ""),
            ),
            (&[("SLURM_PROCID", "0"), ("RANK", "1")], &[("SLURM_PROCID", "0")], &[], rank(Some(1), None, "RANK")),
            (&[("RANK", "one")], &[], &[], rank(None, None, "")),
            (&[], &[], &["worker", "--rank", "2", "--num-shards", "4"], rank(Some(2), None, "--rank")),
            (&[], &[], &["worker", "--rank=2", "--local-rank=0"], rank(Some(2), Some(0), "--rank")),
            (&[], &[], &["worker", "--local_rank", "1"], rank(None, Some(1), "--local-rank")),
            // The program's own name is no argument; a variable comes before the command line.
            (&[], &[], &["--rank"], rank(None, None, "")),
            (&[("RANK", "4")], &[], &["worker", "--rank", "2"], rank(Some(4), None, "RANK")),
        ];
        for (e, inherited, a, want) in cases {
            let got = rank_of(&env(e), &env(inherited), &args(a));
            assert_eq!(&got, want, "{e:?} (the notebook's: {inherited:?}) {a:?}");
        }
        assert_eq!(rank_of(&env(&[("RANK", " 9 ")]), none, &[]).rank, Some(9));
    }

    /// Readings during a cell: each child's highest of them and the count; one that left the
    /// device before the end keeps its highest reading, 0 at the end; none: the end's rows as
    /// they are.
    #[test]
    fn sampled_readings_keep_each_childs_highest() {
        let row = |pid: u32, device: &str, used: u64| ChildProcess {
            pid,
            name: "w".into(),
            device: device.into(),
            used,
            source: "simulated".into(),
            rank: Some(pid - 40),
            ..Default::default()
        };
        let end = vec![row(40, "sim-0", 10), row(41, "sim-0", 30)];
        assert_eq!(Sampled::default().finish(end.clone()), end, "no readings during the cell: nothing added");

        let mut s = Sampled::default();
        s.add(vec![row(40, "sim-0", 50), row(42, "sim-0", 70)]);
        s.add(vec![row(40, "sim-0", 20), row(41, "sim-0", 5), row(42, "sim-0", 60)]);
        s.add(vec![]);
        assert_eq!(s.readings(), 3);
        let got = s.finish(end);
        let want = vec![
            ChildProcess { peak: Some(50), readings: Some(4), ..row(40, "sim-0", 10) },
            ChildProcess { peak: Some(30), readings: Some(4), ..row(41, "sim-0", 30) },
            ChildProcess { used: 0, peak: Some(70), readings: Some(4), ..row(42, "sim-0", 60) },
        ];
        assert_eq!(got, want);
        assert_eq!(got[0].highest(), 50);
        assert_eq!(got[0].figure(), "highest of 4 readings");
        assert_eq!(row(40, "sim-0", 10).highest(), 10);
        assert_eq!(row(40, "sim-0", 10).figure(), "at the end of the cell");
        // The same pid on two devices is two rows.
        let mut s = Sampled::default();
        s.add(vec![row(40, "GPU-a", 8), row(40, "GPU-b", 9)]);
        let got = s.finish(vec![row(40, "GPU-b", 1)]);
        assert_eq!((got[0].device.as_str(), got[0].peak), ("GPU-b", Some(9)));
        assert_eq!((got[1].device.as_str(), got[1].used, got[1].peak), ("GPU-a", 0, Some(8)));
    }

    /// A record of an earlier version (no rank, no readings) reads, and a child without them
    /// writes none of the new fields.
    #[test]
    fn old_rows_read_and_new_fields_only_when_known() {
        let old = r#"{"pid":7,"name":"w","device":"sim-0","used":5,"source":"simulated"}"#;
        let c: ChildProcess = serde_json::from_str(old).unwrap();
        assert_eq!(
            c,
            ChildProcess {
                pid: 7,
                name: "w".into(),
                device: "sim-0".into(),
                used: 5,
                source: "simulated".into(),
                ..Default::default()
            }
        );
        assert_eq!(serde_json::to_string(&c).unwrap(), old);
        let ranked = ChildProcess {
            rank: Some(1),
            local_rank: Some(0),
            rank_from: Some("RANK".into()),
            peak: Some(9),
            readings: Some(3),
            ..c
        };
        let j = serde_json::to_value(&ranked).unwrap();
        assert_eq!(
            (j["rank"].as_u64(), j["local_rank"].as_u64(), j["peak"].as_u64(), j["readings"].as_u64()),
            (Some(1), Some(0), Some(9), Some(3))
        );
        assert_eq!(j["rank_from"], "RANK");
    }

    /// The worker of `a_worker_on_the_simulated_device_is_listed` (only when started by it).
    #[test]
    #[ignore = "a child process of a_worker_on_the_simulated_device_is_listed"]
    fn worker() {
        if std::env::var_os("GPUMEM_NB_CHILD_WORKER").is_none() {
            return;
        }
        let alloc = crate::notebook::session::current().unwrap();
        let _b = crate::buffer::DeviceBuffer::<u8>::zeros(&alloc, 96 << 20, crate::device::StreamId::DEFAULT).unwrap();
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}
