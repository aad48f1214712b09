//! gpumem-nb's own snapshots as `gpumem-replay` input: a session on the simulated device,
//! recorded from its first allocation, with driver allocations beside the allocator's, saved
//! with `tracking::snapshot(..).save(dir)` and replayed from the directory, its pickle and its
//! JSON: the allocator's peaks are the session's own, every device event matches, the driver's
//! allocations are accounted as their source, and `--fit` counts them.

use gpumem_nb::kernel::protocol::{Op, RecordRequest};
use gpumem_nb::units::MIB;
use gpumem_nb::{DeviceBuffer, RecordMode, StreamId};
use serde_json::Value;
use std::process::Command;

#[path = "common/channel.rs"]
mod channel;
use channel::Channel;

fn replay(path: &std::path::Path, args: &[&str]) -> Result<Value, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem-replay")).arg(path).arg("--json").args(args).output().unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn a_recorded_session_replays_with_every_source() {
    // SAFETY: this test binary has a single test, and nothing reads the environment before
    // this line on another thread.
    unsafe { std::env::set_var("GPUMEM_NB_DEVICE", "sim:8GiB") };
    let alloc = gpumem_nb::current().unwrap();
    let mut ch = Channel::new();
    assert!(ch.ask(Op::Record(RecordRequest { enabled: RecordMode::All, max_entries: None, stacks: false })).ok);
    let zeros = |mib: u64| DeviceBuffer::<u8>::zeros(&alloc, (mib * MIB) as usize, StreamId::DEFAULT).unwrap();
    assert!(ch.ask(Op::Pre { cell: 1 }).ok);
    let weights = zeros(300);
    let workspace = gpumem_nb::mem::driver_alloc_mib(100).unwrap();
    assert!(ch.ask(Op::Post { cell: 1 }).ok);
    assert!(ch.ask(Op::Pre { cell: 2 }).ok);
    for mib in [40, 8, 120, 3] {
        drop(zeros(mib));
    }
    let keep = zeros(64);
    drop(workspace);
    alloc.empty_cache().unwrap();
    assert!(ch.ask(Op::Post { cell: 2 }).ok);

    let dir = std::env::temp_dir().join(format!("gpumem-own-snapshot-{}", std::process::id()));
    let files = gpumem_nb::tracking::snapshot(&alloc).save(&dir).unwrap();
    let (allocated, reserved) = (alloc.max_memory_allocated(), alloc.max_memory_reserved());
    for (path, input) in [(&dir, "snapshot pickle"), (&files.pickle, "snapshot pickle"), (&files.json, "snapshot json")]
    {
        let got = replay(path, &[]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(got["input"], input);
        assert_eq!((got["allocated_peak"].as_u64(), got["reserved_peak"].as_u64()), (Some(allocated), Some(reserved)));
        assert_eq!(got["divergences"], 0, "{}", got["first_divergence"]);
        assert_eq!(got["releases_explained_by"]["empty_cache"], 1, "the session's empty_cache()");
        assert_eq!(got["sources"]["others_peak"]["driver"], 100 * MIB, "{}", got["sources"]);
        assert_eq!(got["sources"]["allocator_reserved_peak"], reserved);
        assert!(got["sources"]["all_peak"].as_u64().unwrap() >= reserved + 100 * MIB);
    }
    // The driver's 100 MiB take room on the planned device: 300 MiB of weights and it do not fit
    // in 400 MiB with the allocator's segments, and the failure names the cell.
    let fit = replay(&dir, &["--fit", "400MiB"]).unwrap();
    let min = fit["min_device_bytes"].as_u64().unwrap();
    assert!(min >= (300 + 100 + 120) * MIB, "{fit}");
    assert_eq!(fit["fits"], min <= 400 * MIB);
    let f = replay(&dir, &["--fit", "350MiB"]).unwrap();
    assert_eq!(f["fits"], false);
    assert_eq!(f["first_failure"]["source"], "driver", "{}", f["first_failure"]);
    assert_eq!(f["first_failure"]["label"], "cell 1");
    drop((weights, keep));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Expandable segments: the allocator maps pages as a segment grows and unmaps them as
/// `empty_cache` shrinks it (`segment_map` / `segment_unmap`, PyTorch's events), one unmap over
/// pages that several maps made; the snapshot replays to the session's peaks, event for event.
#[test]
fn an_expandable_segments_session_replays_to_its_peaks() {
    use gpumem_nb::device::sim::SimBackend;
    use gpumem_nb::{AllocatorConfig, CachingAllocator};
    let alloc =
        CachingAllocator::new(SimBackend::new(0, 8 << 30), AllocatorConfig::parse("expandable_segments:True").unwrap());
    alloc.record_memory_history(RecordMode::All, 100_000);
    let mut live = Vec::new();
    for (i, mib) in [3u64, 40, 8, 120, 1, 64, 20, 2].into_iter().enumerate() {
        let a = alloc.malloc(mib * MIB + 512 * i as u64, StreamId::DEFAULT).unwrap();
        live.push(a.block.unwrap());
    }
    // Everything but the 40 MiB block goes; the pages of the rest are unmapped.
    let kept = live.remove(1);
    for b in live.drain(..) {
        alloc.free(b).unwrap();
    }
    alloc.empty_cache().unwrap();
    for mib in [200u64, 30] {
        live.push(alloc.malloc(mib * MIB, StreamId::DEFAULT).unwrap().block.unwrap());
    }
    alloc.free(kept).unwrap();
    alloc.empty_cache().unwrap();
    live.push(alloc.malloc(100 * MIB, StreamId::DEFAULT).unwrap().block.unwrap());
    let snap = alloc.snapshot();
    let actions: Vec<&str> = snap.device_traces.iter().flatten().map(|e| e.action).collect();
    assert!(actions.contains(&"segment_map") && actions.contains(&"segment_unmap"), "{actions:?}");
    let dir = std::env::temp_dir().join(format!("gpumem-own-snapshot-expandable-{}", std::process::id()));
    let files = snap.save(&dir).unwrap();
    let got = replay(&files.pickle, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (got["allocated_peak"].as_u64(), got["reserved_peak"].as_u64()),
        (Some(alloc.max_memory_allocated()), Some(alloc.max_memory_reserved())),
        "{got}"
    );
    assert_eq!(got["divergences"], 0, "{}", got["first_divergence"]);
    let _ = std::fs::remove_dir_all(&dir);
}
