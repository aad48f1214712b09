//! Scoped measurement (`MemoryScope`, `measure_with_on`) and `save_memory_snapshot` on the
//! simulated device, with exact byte numbers.

use gpumem_nb::device::any::AnyBackend;
use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::scope::{
    Capture, MemoryScope, SnapshotError, SnapshotScope, measure, measure_with_on, save_memory_snapshot_on,
};
use gpumem_nb::units::{GIB, MIB};
use gpumem_nb::{
    Allocator, AllocatorConfig, BackendKind, CachingAllocator, DeviceBuffer, HistoryOptions, RecordMode, StackContext,
    StreamId,
};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;

fn sim(cap: u64) -> Arc<Allocator> {
    Arc::new(CachingAllocator::new(AnyBackend::Sim(SimBackend::new(0, cap)), AllocatorConfig::default()))
}

fn buf(a: &Arc<Allocator>, bytes: u64) -> DeviceBuffer<u8> {
    DeviceBuffer::alloc(a, bytes as usize, StreamId::DEFAULT).unwrap()
}

/// A scratch directory unique to this test process and `name`, removed first.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpumem-nb-scope-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn scope_line_has_exact_deltas_and_peaks() {
    let a = sim(GIB);
    let _before = buf(&a, MIB); // 1 MiB block in a 2 MiB small-pool segment
    let cap = Capture::new();
    let scope = MemoryScope::new(&a, "forward").with_sink(cap.clone());
    let big = buf(&a, 12 * MIB); // own 12 MiB segment
    let keep = buf(&a, 4 * MIB); // 20 MiB large-buffer segment
    drop(big); // stays cached: reserved unchanged
    let r = scope.finish();

    assert_eq!(r.name, "forward");
    assert_eq!((r.device, r.backend), (0, BackendKind::Simulated));
    assert_eq!((r.start_allocated, r.end_allocated, r.peak_allocated), (MIB, 5 * MIB, 17 * MIB));
    assert_eq!((r.start_reserved, r.end_reserved, r.peak_reserved), (2 * MIB, 34 * MIB, 34 * MIB));
    assert_eq!((r.allocated_delta, r.reserved_delta), (4 * MIB as i64, 32 * MIB as i64));
    assert_eq!(r.peak_allocated_over_start(), 16 * MIB);
    assert!(!r.panicked);
    let out = cap.contents();
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.starts_with(
            "gpumem scope \"forward\": allocated +4.00 MiB (peak 17.00 MiB, +16.00 MiB over start), \
             reserved +32.00 MiB (peak 34.00 MiB) [allocator, device 0, simulated] in "
        ),
        "{out}"
    );
    assert_eq!(out.trim_end(), r.to_string());
    drop(keep);
    a.check_invariants().unwrap();
}

#[test]
fn drop_prints_and_quiet_does_not() {
    let a = sim(GIB);
    let cap = Capture::new();
    {
        let _s = MemoryScope::new(&a, "dropped").with_sink(cap.clone());
        let _b = buf(&a, 3 * MIB);
    }
    let out = cap.contents();
    assert!(out.starts_with("gpumem scope \"dropped\": allocated ±0 B (peak 3.00 MiB, +3.00 MiB over start)"), "{out}");
    assert!(!out.contains("panicked"));

    let quiet = Capture::new();
    let s = MemoryScope::new(&a, "quiet").with_sink(quiet.clone()).quiet();
    let r = s.finish();
    assert_eq!(quiet.contents(), "");
    assert_eq!(r.allocated_delta, 0);
}

#[test]
fn closure_form_returns_value_and_report() {
    let a = sim(GIB);
    let (v, r) = measure_with_on(&a, "closure", || {
        let b = buf(&a, 30 * MIB);
        drop(b);
        let kept = buf(&a, 512);
        (42, kept)
    });
    assert_eq!(v.0, 42);
    assert_eq!(r.peak_allocated, 30 * MIB);
    assert_eq!(r.end_allocated, 512);
    assert_eq!(r.allocated_delta, 512);
    // 30 MiB segment (cached) + 2 MiB small segment.
    assert_eq!(r.reserved_delta, 32 * MIB as i64);
    drop(v);
}

#[test]
fn panic_inside_a_scope_still_reports_and_leaves_a_consistent_allocator() {
    let a = sim(GIB);
    let cap = Capture::new();
    let result = catch_unwind(AssertUnwindSafe(|| {
        let _scope = MemoryScope::new(&a, "boom").with_sink(cap.clone());
        let _b = buf(&a, 8 * MIB);
        panic!("user code failed");
    }));
    assert!(result.is_err());
    let out = cap.contents();
    assert_eq!(out.lines().count(), 1, "{out}");
    // The buffer was dropped during unwinding before the scope (reverse declaration order).
    assert!(out.starts_with("gpumem scope \"boom\": allocated ±0 B (peak 8.00 MiB, +8.00 MiB over start)"), "{out}");
    assert!(out.trim_end().ends_with("(panicked)"), "{out}");
    a.check_invariants().unwrap();
    assert_eq!(a.memory_allocated(), 0);
    // The peak slot was closed: a new scope starts from scratch.
    let r = MemoryScope::new(&a, "after").quiet().finish();
    assert_eq!(r.peak_allocated, 0);
}

#[test]
fn nested_scopes_have_independent_exact_peaks() {
    let a = sim(GIB);
    let outer = MemoryScope::new(&a, "outer").quiet();
    let x = buf(&a, 40 * MIB);
    let inner = MemoryScope::new(&a, "inner").quiet();
    let y = buf(&a, 20 * MIB);
    drop(y);
    assert_eq!(inner.peaks().allocated, 60 * MIB as i64);
    inner.reset_peak(); // restarts the inner scope only
    assert_eq!(inner.peaks().allocated, 40 * MIB as i64);
    assert_eq!(outer.peaks().allocated, 60 * MIB as i64, "the inner reset must not touch the outer peak");
    let z = buf(&a, 10 * MIB);
    drop(z);
    let global_before = (a.max_memory_allocated(), a.max_memory_reserved());
    let ri = inner.finish();
    assert_eq!(ri.peak_allocated, 50 * MIB);
    assert_eq!((a.max_memory_allocated(), a.max_memory_reserved()), global_before);

    // The global reset does not disturb an open scope either.
    a.reset_peak_memory_stats();
    assert_eq!(a.max_memory_allocated(), 40 * MIB);
    let ro = outer.finish();
    assert_eq!(ro.peak_allocated, 60 * MIB);
    assert!(ro.peak_allocated >= ri.peak_allocated);
    assert_eq!(ro.allocated_delta, 40 * MIB as i64);
    assert_eq!(a.max_memory_allocated(), 40 * MIB, "scope exits leave the global peak alone");
    drop(x);
    a.check_invariants().unwrap();
}

#[test]
fn report_renders_for_notebooks() {
    let a = sim(GIB);
    let s = MemoryScope::new(&a, "<render>").quiet();
    let _b = buf(&a, 2 * MIB);
    let r = s.report();
    assert_eq!(r.end_allocated, 2 * MIB);
    let b = r.bundle();
    assert!(b.text.contains("allocated") && b.text.contains("2.00 MiB"), "{}", b.text);
    assert!(b.text.contains("allocator, device 0, simulated"), "{}", b.text);
    let html = b.html.unwrap();
    assert!(html.starts_with("<div class=\"gpumem-table\"") && html.contains("&lt;render&gt;"), "{html}");
}

#[test]
fn measure_on_the_current_device() {
    // The process-wide device (whatever GPUMEM_NB_DEVICE says): a scope that allocates nothing.
    // Only a malformed value, or `cuda` without a GPU, fails to open, and that is a failure here.
    let s = measure("global").unwrap_or_else(|e| {
        panic!("the current device (GPUMEM_NB_DEVICE={:?}) did not open: {e}", std::env::var("GPUMEM_NB_DEVICE"))
    });
    let r = s.quiet().finish();
    assert_eq!(r.name, "global");
    assert!(r.peak_allocated >= r.end_allocated);
}

#[test]
fn snapshot_scope_writes_three_files_and_restores_recording() {
    let a = sim(GIB);
    assert_eq!(a.history_options().enabled, RecordMode::Off);
    let dir = scratch("ok");
    let (v, files) = save_memory_snapshot_on(&a, &dir, || {
        let b = buf(&a, 3 * MIB);
        drop(b);
        7
    });
    assert_eq!(v, 7);
    let files = files.unwrap();
    assert_eq!(files.pickle, dir.join("snapshot.pickle"));
    for p in [&files.pickle, &files.json, &files.html] {
        assert!(std::fs::metadata(p).unwrap().len() > 0, "{}", p.display());
    }
    let json = std::fs::read_to_string(&files.json).unwrap();
    assert!(json.contains("\"alloc\"") && json.contains("\"free_requested\""), "events recorded");
    // Recording is off again, as before (and "off" keeps no events).
    assert_eq!(a.history_options().enabled, RecordMode::Off);
    assert!(a.history().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

fn unusual_settings() -> HistoryOptions {
    HistoryOptions { enabled: RecordMode::All, context: StackContext::Alloc, max_entries: 123 }
}

#[test]
fn unwritable_directory_is_an_error_value_and_the_code_still_runs() {
    let a = sim(GIB);
    a.record_memory_history_with(unusual_settings());
    // A path below a regular file cannot be created, even by root.
    let base = scratch("blocked");
    std::fs::create_dir_all(&base).unwrap();
    let file = base.join("plain-file");
    std::fs::write(&file, b"not a directory").unwrap();
    for dir in [file.join("snap"), PathBuf::from("/proc/gpumem-nb-test/snap")] {
        let mut ran = false;
        let (v, files) = save_memory_snapshot_on(&a, &dir, || {
            ran = true;
            drop(buf(&a, MIB));
            "value"
        });
        assert!(ran);
        assert_eq!(v, "value");
        let err = files.unwrap_err();
        assert!(matches!(err, SnapshotError::Io(_)), "{err:?}");
        let msg = err.to_string();
        assert!(msg.starts_with("save_memory_snapshot: cannot create directory"), "{msg}");
        assert!(msg.contains(&*dir.to_string_lossy()), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
        assert_eq!(a.history_options(), unusual_settings(), "recording settings restored exactly");
    }
    // The guard form prints the same error when dropped.
    let cap = Capture::new();
    drop(SnapshotScope::new(&a, file.join("guard")).with_sink(cap.clone()));
    let out = cap.contents();
    assert!(out.starts_with("save_memory_snapshot: cannot create directory"), "{out}");
    assert_eq!(a.history_options(), unusual_settings());
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn panic_inside_save_memory_snapshot_restores_and_still_writes() {
    let a = sim(GIB);
    a.record_memory_history(RecordMode::State, 1000);
    let before = a.history_options();
    let dir = scratch("panic");
    let cap = Capture::new();
    let r = catch_unwind(AssertUnwindSafe(|| {
        let _snap = SnapshotScope::new(&a, &dir).with_sink(cap.clone());
        assert_eq!(_snap.previous_options(), before);
        assert_eq!(a.history_options(), HistoryOptions::default(), "recording on inside the scope");
        let _b = buf(&a, 5 * MIB);
        panic!("training step failed");
    }));
    assert!(r.is_err());
    assert_eq!(a.history_options(), before);
    assert!(dir.join("snapshot.pickle").exists() && dir.join("trace_plot.html").exists());
    let out = cap.contents();
    assert!(out.starts_with("gpumem snapshot (panicked): wrote "), "{out}");
    a.check_invariants().unwrap();

    // The closure form, panicking: settings restored too.
    let dir2 = scratch("panic2");
    let r = catch_unwind(AssertUnwindSafe(|| save_memory_snapshot_on(&a, &dir2, || panic!("again"))));
    assert!(r.is_err());
    assert_eq!(a.history_options(), before);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
}

#[test]
fn nested_snapshot_scopes_restore_in_order() {
    let a = sim(GIB);
    let d1 = scratch("outer");
    let d2 = scratch("inner");
    let outer = SnapshotScope::new(&a, &d1);
    let inner = SnapshotScope::new(&a, &d2);
    assert_eq!(inner.previous_options(), HistoryOptions::default());
    inner.finish().unwrap();
    assert_eq!(a.history_options(), HistoryOptions::default(), "the outer scope is still recording");
    outer.finish().unwrap();
    assert_eq!(a.history_options().enabled, RecordMode::Off);
    let _ = std::fs::remove_dir_all(&d1);
    let _ = std::fs::remove_dir_all(&d2);
}
