//! Per-rank files: a process with `RANK` (or `LOCAL_RANK`) writes `snapshot_rankN.*`, and
//! `gpumem-replay` takes several ranks' snapshots (or their directory) and reports each.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

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
        let all: Value = serde_json::from_str(&replay(&args, &[])).unwrap();
        let all = all.as_array().expect("several ranks: an array");
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
