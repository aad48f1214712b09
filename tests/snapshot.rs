//! Snapshots from a scripted session on the simulated device, read back by Python's standard
//! `pickle` through tests/snapshot_check.py — the same checker that PyTorch's own snapshot
//! (tests/fixtures/snapshot_torch2.11_py3.12_protocol4.pickle) passes.

use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::{AllocatorConfig, CachingAllocator, HistoryOptions, RecordMode, StackContext, StreamId};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(name)
}

/// Runs the checker; returns its JSON summary.
fn check(pickle: &Path, json: Option<&Path>) -> Value {
    let mut cmd = Command::new("python3");
    cmd.arg(fixture("snapshot_check.py")).arg(pickle);
    if let Some(j) = json {
        cmd.arg(j);
    }
    let out = cmd.output().expect("python3 runs (the tests need Python 3)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "checker failed on {}: {text}{}",
        pickle.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(text.trim().strip_prefix("OK ").expect("OK line")).unwrap()
}

fn python(code: &str, arg: &Path) -> String {
    let out = Command::new("python3").arg("-c").arg(code).arg(arg).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

struct TmpDir(PathBuf);
impl TmpDir {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("gpumem-snapshot-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        TmpDir(d)
    }
}
impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The user's code: its name must be the top frame of its allocations in the snapshot.
#[inline(never)]
fn users_training_step(alloc: &CachingAllocator<SimBackend>) -> gpumem_nb::blocks::BlockId {
    alloc.malloc(3 << 20, StreamId::DEFAULT).unwrap().block.unwrap()
}

#[test]
fn scripted_snapshot_reads_like_pytorchs() {
    let alloc = CachingAllocator::new(SimBackend::new(0, 1 << 30), AllocatorConfig::default());
    alloc.record_memory_history_with(HistoryOptions::default());
    alloc.set_label(Some("cell 1"));
    let a = alloc.malloc(1000, StreamId::DEFAULT).unwrap().block.unwrap();
    let b = users_training_step(&alloc);
    let side = alloc.new_stream().unwrap();
    let c = alloc.malloc(12 << 20, side).unwrap().block.unwrap();
    alloc.set_label(Some("cell 2"));
    alloc.free(b).unwrap();
    // An out-of-memory error (its release path frees the cached segments).
    assert!(alloc.malloc(2 << 30, StreamId::DEFAULT).is_err());
    // A cross-stream free left pending (the other stream is busy).
    let d = alloc.malloc(4 << 20, StreamId::DEFAULT).unwrap().block.unwrap();
    alloc.with_backend(|dev| dev.set_stream_busy(side, true));
    alloc.record_stream(d, side).unwrap();
    alloc.free(d).unwrap();
    let snap = alloc.snapshot();
    alloc.check_invariants().unwrap();

    let tmp = TmpDir::new("scripted");
    let files = snap.save(&tmp.0).unwrap();
    let summary = check(&files.pickle, Some(&files.json));

    // The checker saw exactly what the allocator recorded.
    let mut counts = std::collections::BTreeMap::new();
    for e in &snap.device_traces[0] {
        *counts.entry(e.action.to_string()).or_insert(0u64) += 1;
    }
    assert_eq!(summary["actions"], serde_json::to_value(&counts).unwrap());
    for action in ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"] {
        assert!(counts.contains_key(action), "the script produces {action}: {counts:?}");
    }
    assert_eq!(summary["segments"], snap.segments.len());
    assert_eq!(summary["blocks"], snap.segments.iter().map(|s| s.blocks.len()).sum::<usize>());

    // Specific content, read by Python's pickle.
    let facts = python(
        r#"
import pickle, sys, json
s = pickle.load(open(sys.argv[1], "rb"))
blocks = [b for seg in s["segments"] for b in seg["blocks"]]
t = s["device_traces"][0]
oom = [e for e in t if e["action"] == "oom"][0]
alloc3 = [e for e in t if e["action"] == "alloc" and e["size"] == 3 << 20][0]
print(json.dumps({
  "states": sorted({b["state"] for b in blocks}),
  "pending": [b["size"] for b in blocks if b["state"] == "active_pending_free"],
  "oom_keys": sorted(oom), "oom_size": oom["size"],
  "labels": sorted({e["user_metadata"] for e in t}),
  "top_frame": alloc3["frames"][0]["name"] if alloc3.get("frames") else None,
  "live_3mib_top": [b["frames"][0]["name"] for b in blocks if b["state"] == "active_allocated" and b["requested_size"] == 1000],
  "streams": sorted({seg["stream"] != 0 for seg in s["segments"]}),
  "conf": s["allocator_settings"]["max_split_size"],
}))
"#,
        &files.pickle,
    );
    let f: Value = serde_json::from_str(&facts).unwrap();
    assert_eq!(f["states"], serde_json::json!(["active_allocated", "active_pending_free", "inactive"]));
    assert_eq!(f["pending"], serde_json::json!([4 << 20]));
    assert_eq!(
        f["oom_keys"],
        serde_json::json!([
            "action",
            "compile_context",
            "device_free",
            "frames",
            "size",
            "stream",
            "time_us",
            "user_metadata"
        ])
    );
    assert_eq!(f["oom_size"], 2u64 << 30);
    assert_eq!(f["labels"], serde_json::json!(["cell 1", "cell 2"]));
    let top = f["top_frame"].as_str().expect("the 3 MiB alloc event carries frames");
    assert!(top.contains("users_training_step"), "the user's function is on top, got {top}");
    assert!(f["live_3mib_top"][0].as_str().unwrap().contains("scripted_snapshot_reads_like_pytorchs"));
    assert_eq!(f["streams"], serde_json::json!([false, true]));
    assert_eq!(f["conf"], -1);
    let _ = (a, c);
}

#[test]
fn pytorchs_own_snapshot_passes_the_same_checker() {
    let s = check(&fixture("fixtures/snapshot_torch2.11_py3.12_protocol4.pickle"), None);
    assert_eq!(s["segments"], 4);
    assert_eq!(s["actions"]["alloc"], 8);
}

#[test]
fn state_mode_keeps_one_entry_and_stacks_on_live_blocks_only() {
    let alloc = CachingAllocator::new(SimBackend::new(0, 1 << 30), AllocatorConfig::default());
    alloc.record_memory_history_with(HistoryOptions {
        enabled: RecordMode::State,
        context: StackContext::State,
        max_entries: 1000,
    });
    let a = alloc.malloc(1000, StreamId::DEFAULT).unwrap();
    let b = alloc.malloc(2000, StreamId::DEFAULT).unwrap();
    alloc.free(b.block.unwrap()).unwrap();
    let snap = alloc.snapshot();
    // As measured on PyTorch 2.11: exactly the last event, and frames only on the live block.
    assert_eq!(snap.device_traces[0].len(), 1);
    assert_eq!(snap.device_traces[0][0].action, "free_completed");
    assert!(snap.device_traces[0][0].frames.is_none(), "context=state puts no stacks in trace entries");
    let blocks: Vec<_> = snap.segments.iter().flat_map(|s| &s.blocks).collect();
    assert_eq!(blocks.len(), 2);
    assert_eq!((blocks[0].state, blocks[0].size), ("active_allocated", 1024));
    assert!(!blocks[0].frames.is_empty());
    assert!(blocks[1].frames.is_empty());
    // A snapshot's own event appears in the next one.
    let again = alloc.snapshot();
    assert_eq!(again.device_traces[0][0].action, "snapshot");
    assert_eq!(again.device_traces[0][0].size, 1024, "size: bytes of active blocks");
    let _ = a;
}

#[test]
fn recording_without_stacks_records_no_frames_and_off_clears() {
    let alloc = CachingAllocator::new(SimBackend::new(0, 1 << 30), AllocatorConfig::default());
    alloc.record_memory_history(RecordMode::All, 3);
    for _ in 0..5 {
        let a = alloc.malloc(512, StreamId::DEFAULT).unwrap();
        alloc.free(a.block.unwrap()).unwrap();
    }
    let snap = alloc.snapshot();
    assert_eq!(snap.device_traces[0].len(), 3, "a ring of max_entries");
    assert!(snap.device_traces[0].iter().all(|e| e.frames.is_none()));
    alloc.record_memory_history(RecordMode::Off, 0);
    assert_eq!(alloc.snapshot().device_traces[0].len(), 0);
}

#[test]
fn replayed_trace_snapshot_is_written_and_readable() {
    let tmp = TmpDir::new("replay");
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem-replay"))
        .arg(fixture("fixtures/traces/two_streams.trace.tsv.gz"))
        .arg("--snapshot")
        .arg(&tmp.0)
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pickle = PathBuf::from(j["snapshot"]["pickle"].as_str().unwrap());
    let s = check(&pickle, Some(Path::new(j["snapshot"]["json"].as_str().unwrap())));
    // Every event of the trace is in the snapshot, and the end state's segments are there.
    assert_eq!(s["actions"]["alloc"], 401);
    assert_eq!(s["actions"]["free_requested"], 400);
    assert_eq!(s["actions"]["free_completed"], 399);
    assert_eq!(s["actions"]["segment_alloc"], 5);
    assert_eq!(s["segments"], 5);
    assert!(Path::new(j["snapshot"]["html"].as_str().unwrap()).exists());
}
