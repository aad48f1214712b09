//! Per-rank files: a process with `RANK` (or `LOCAL_RANK`) writes `snapshot_rankN.*`, and
//! `gpumem-replay` takes several ranks' snapshots (or their directory), reports each and merges
//! them into one report: each rank's peaks, their least, most, mean and sum, the rank holding
//! the most.

use gpumem_nb::device::any::AnyBackend;
use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::{AllocatorConfig, CachingAllocator, DeviceBuffer, StreamId};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

const TRACE: &str = "tests/fixtures/traces/two_streams.trace.tsv.gz";

fn replay(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpumem-replay"));
    c.args(args).env_remove("RANK").env_remove("LOCAL_RANK");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn rank_files_are_written_and_replayed_rank_by_rank() {
    let dir = std::env::temp_dir().join(format!("gpumem-ranks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    // Two "ranks" write their snapshots into one directory, as torchrun's processes would.
    replay(&[TRACE, "--snapshot", d], &[("RANK", "0")]);
    replay(&[TRACE, "--snapshot", d], &[("LOCAL_RANK", "1")]);
    for f in ["snapshot_rank0.pickle", "snapshot_rank0.json", "trace_plot_rank0.html", "snapshot_rank1.pickle"] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    assert!(!dir.join("snapshot.pickle").exists(), "a rank's file never takes the plain name");

    let single: Value = serde_json::from_str(&replay(&[TRACE, "--json"], &[])).unwrap();
    assert!(single.is_object(), "one TRACE: one object, as before");
    // The directory is both ranks; so are the two files named.
    let r0 = dir.join("snapshot_rank0.pickle");
    let r1 = dir.join("snapshot_rank1.pickle");
    for args in [vec![d, "--json"], vec![r0.to_str().unwrap(), r1.to_str().unwrap(), "--json"]] {
        let merged: Value = serde_json::from_str(&replay(&args, &[])).unwrap();
        let all = merged["ranks"].as_array().expect("several ranks: their objects under `ranks`");
        assert_eq!(all.len(), 2);
        for (i, one) in all.iter().enumerate() {
            assert_eq!(one["rank"], i as u64);
            assert_eq!(one["input"], "snapshot pickle");
            // Each rank replays to the trace's own allocated peak.
            assert_eq!(one["allocated_peak"], single["allocated_peak"], "rank {i}");
        }
    }
    let text = replay(&[r1.to_str().unwrap(), r0.to_str().unwrap()], &[]);
    let at = |s: &str| text.find(s).unwrap_or_else(|| panic!("{s} missing:\n{text}"));
    assert!(at("== rank 1:") < at("== rank 0:") && at("== rank 0:") < at("== every rank"), "{text}");
    // One rank's directory read where two are: a clear error naming them.
    let snap = gpumem_nb::snapshot::read(Path::new(d));
    assert!(snap.unwrap_err().to_string().contains("2 ranks' snapshots"), "a directory of two ranks is ambiguous");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two ranks of a training program on the simulated device, each saving its snapshot with
/// `save_memory_snapshot` into one directory (rank from `RANK`: `snapshot_rank0.pickle`,
/// `snapshot_rank1.pickle`), with different peaks; `gpumem-replay DIR` merges them: each rank's
/// peaks as that rank's allocator counted them, their sums, and rank 1 named as holding the
/// most.
#[test]
#[cfg_attr(miri, ignore = "Miri cannot start processes")]
fn ranks_files_merge_into_one_report() {
    let dir = std::env::temp_dir().join(format!("gpumem-ranks-merge-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // (rank, MiB it allocates at its peak): rank 1 peaks higher.
    let mut peaks = Vec::new();
    for (rank, mib) in [(0, 48), (1, 80)] {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "rank_writer", "--nocapture", "--ignored"])
            .env("GPUMEM_RANKS_WRITER_DIR", &dir)
            .env("GPUMEM_RANKS_WRITER_MIB", mib.to_string())
            .env("RANK", rank.to_string())
            .env_remove("LOCAL_RANK")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "rank {rank}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        // The writer's own allocator's peaks: `peaks ALLOCATED RESERVED`.
        let line = stdout.lines().find_map(|l| l.strip_prefix("peaks ")).expect("the writer's peaks");
        let (a, r) = line.split_once(' ').unwrap();
        peaks.push((a.parse::<u64>().unwrap(), r.trim().parse::<u64>().unwrap()));
    }
    for f in ["snapshot_rank0.pickle", "snapshot_rank1.pickle", "snapshot_rank1.json"] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    assert!(peaks[1].0 > peaks[0].0 && peaks[1].1 > peaks[0].1, "rank 1 peaks higher: {peaks:?}");

    let d = dir.to_str().unwrap();
    let merged: Value = serde_json::from_str(&replay(&[d, "--json"], &[])).unwrap();
    let ranks = merged["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    for (i, r) in ranks.iter().enumerate() {
        assert_eq!(r["rank"], i as u64);
        assert_eq!((r["allocated_peak"].as_u64(), r["reserved_peak"].as_u64()), (Some(peaks[i].0), Some(peaks[i].1)));
    }
    let s = &merged["summary"];
    assert_eq!(s["ranks"], 2);
    for (key, i) in [("allocated_peak", 0), ("reserved_peak", 1)] {
        let pick = |r: usize| if i == 0 { peaks[r].0 } else { peaks[r].1 };
        let k = &s[key];
        assert_eq!(k["sum"].as_u64(), Some(pick(0) + pick(1)), "{key}: {s}");
        assert_eq!((k["min"].as_u64(), k["max"].as_u64()), (Some(pick(0)), Some(pick(1))), "{key}");
        assert_eq!(k["mean"].as_f64(), Some((pick(0) + pick(1)) as f64 / 2.0), "{key}");
        assert_eq!(k["highest"]["rank"], 1, "{key}: rank 1 holds the most");
        assert!(k["highest"]["trace"].as_str().unwrap().ends_with("snapshot_rank1.pickle"), "{key}");
    }

    // The text: one report, each rank and then every rank together, rank 1 named.
    let text = replay(&[d], &[]);
    let iec = gpumem_nb::units::iec;
    let every = &text[text.find("== every rank").unwrap_or_else(|| panic!("{text}"))..];
    let line = every.lines().find(|l| l.starts_with("reserved peak ")).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        line,
        format!(
            "reserved peak   min {}, max {} (rank 1), mean {}, sum {}",
            iec(peaks[0].1),
            iec(peaks[1].1),
            iec(((peaks[0].1 + peaks[1].1) as f64 / 2.0).round() as u64),
            iec(peaks[0].1 + peaks[1].1)
        )
    );
    assert!(
        text.contains("allocated peak  min ") && text.contains("need not have peaked at the same moment"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One rank of the test above (only when started by it): a training step on a simulated device
/// inside `save_memory_snapshot`, which names its files by `RANK`; prints its allocator's peaks.
#[test]
#[ignore = "a rank of ranks_files_merge_into_one_report"]
fn rank_writer() {
    let (Ok(dir), Ok(mib)) = (std::env::var("GPUMEM_RANKS_WRITER_DIR"), std::env::var("GPUMEM_RANKS_WRITER_MIB"))
    else {
        return;
    };
    let mib: usize = mib.parse().unwrap();
    let alloc =
        Arc::new(CachingAllocator::new(AnyBackend::Sim(SimBackend::new(0, 8 << 30)), AllocatorConfig::default()));
    let ((), files) = gpumem_nb::scope::save_memory_snapshot_on(&alloc, &dir, || {
        let weights = DeviceBuffer::<u8>::zeros(&alloc, 16 << 20, StreamId::DEFAULT).unwrap();
        let activations = DeviceBuffer::<u8>::zeros(&alloc, mib << 20, StreamId::DEFAULT).unwrap();
        drop(activations);
        let small = DeviceBuffer::<u8>::zeros(&alloc, 4096, StreamId::DEFAULT).unwrap();
        drop((weights, small));
    });
    files.unwrap();
    println!("peaks {} {}", alloc.max_memory_allocated(), alloc.max_memory_reserved());
}
