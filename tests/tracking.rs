//! Every allocation of the process on the simulated device, through the control channel as the
//! kernel reads it around cells: driver allocations past the caching allocator (what candle or
//! cuBLAS do on a GPU) and the allocator's own segments, with exact per-cell deltas and peaks,
//! owners, and snapshots that show them.

use gpumem_nb::kernel::protocol::{Op, PlaceReading, Reply};
use gpumem_nb::tracking::{self, TrackingStatus};
use gpumem_nb::units::MIB;
use gpumem_nb::{DeviceBuffer, StreamId};

#[path = "common/channel.rs"]
mod channel;
use channel::Channel;

/// Sends `op`; the reply, which must be a success.
fn ask(ch: &mut Channel, op: Op) -> Reply {
    let reply = ch.ask(op);
    assert!(reply.ok, "{reply:?}");
    reply
}

/// Device 0's tracked reading in a reply.
fn dev0(reply: &Reply) -> PlaceReading {
    reply.tracked.as_ref().unwrap().iter().find(|p| p.device == Some(0)).cloned().unwrap_or_default()
}

/// Runs `cell` between `pre` and `post`; the two readings of device 0.
fn cell(ch: &mut Channel, n: u64, cell: impl FnOnce()) -> (PlaceReading, PlaceReading) {
    let before = dev0(&ask(ch, Op::Pre { cell: n }));
    cell();
    let after = ask(ch, Op::Post { cell: n });
    assert_eq!(after.tracking.as_deref(), Some("simulated"));
    tracking::check().unwrap();
    (before, dev0(&after))
}

fn source(p: &PlaceReading, key: &str) -> (u64, u64) {
    p.by_source.iter().find(|s| s.source == key).map_or((0, 0), |s| (s.live, s.peak))
}

#[inline(never)]
fn a_foreign_library_allocates(mib: u64) -> gpumem_nb::mem::DriverBuffer {
    gpumem_nb::mem::driver_alloc_mib(mib).unwrap()
}

#[inline(never)]
fn a_big_buffer(alloc: &std::sync::Arc<gpumem_nb::Allocator>) -> DeviceBuffer<u8> {
    DeviceBuffer::<u8>::zeros(alloc, 64 << 20, StreamId::DEFAULT).unwrap()
}

#[inline(never)]
fn a_small_buffer(alloc: &std::sync::Arc<gpumem_nb::Allocator>) -> DeviceBuffer<u8> {
    DeviceBuffer::<u8>::zeros(alloc, 4 << 20, StreamId::DEFAULT).unwrap()
}

#[test]
fn every_allocation_of_the_process_is_counted_per_cell() {
    // SAFETY: this test binary has a single test, and nothing reads the environment before
    // this line on another thread.
    unsafe { std::env::set_var("GPUMEM_NB_DEVICE", "sim:8GiB") };
    let alloc = gpumem_nb::current().unwrap();
    assert_eq!(tracking::status(), TrackingStatus::Simulated);
    let mut ch = Channel::new();

    // A cell keeps 100 MiB from the driver: +100 MiB, peak at least that.
    let mut keep = None;
    let (b, a) = cell(&mut ch, 1, || keep = Some(a_foreign_library_allocates(100)));
    assert_eq!(a.live - b.live, 100 * MIB);
    assert!(a.peak >= a.live);
    assert_eq!(source(&a, "driver").0 - source(&b, "driver").0, 100 * MIB);
    assert_eq!(alloc.memory_reserved(), 0, "the allocator itself holds nothing");
    let d = keep.as_ref().unwrap();
    // Who made it: this test's function, named by its crate.
    let top = &a.top[0];
    assert_eq!(top.bytes, 100 * MIB);
    assert!(top.owner.starts_with("tracking::"), "{top:?}");
    // Its stack was new to the books: the namer thread read its symbols while the cell ran.
    let threads: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .collect();
    assert!(threads.iter().any(|n| n.trim() == "gpumem-namer"), "{threads:?}");

    // A cell makes and drops 300 MiB: no change, and a peak exactly 300 MiB above its start.
    let (b, a) = cell(&mut ch, 2, || drop(a_foreign_library_allocates(300)));
    assert_eq!(a.live, b.live);
    assert_eq!(a.peak - b.live, 300 * MIB);
    assert_eq!(source(&a, "driver").1 - source(&b, "driver").0, 300 * MIB);

    // The allocator's own blocks count too: a 64 MiB buffer is a 64 MiB segment.
    let mut buf = None;
    let (b, a) =
        cell(&mut ch, 3, || buf = Some(DeviceBuffer::<u8>::zeros(&alloc, 64 << 20, StreamId::DEFAULT).unwrap()));
    assert_eq!(a.live - b.live, alloc.memory_reserved());
    assert_eq!(source(&a, "allocator").0, 64 * MIB);
    assert_eq!(source(&a, "driver").0, 100 * MIB, "the earlier driver buffer is still there");

    // The whole device is one number: tracked bytes = driver + allocator = what the simulated
    // device has given out.
    let (free, total) = alloc.mem_get_info().unwrap();
    assert_eq!(a.live, total - free);

    // A snapshot shows the driver allocation beside the allocator's segment, labelled.
    ask(
        &mut ch,
        Op::Record(gpumem_nb::kernel::protocol::RecordRequest {
            enabled: gpumem_nb::RecordMode::All,
            max_entries: Some(1000),
            stacks: false,
        }),
    );
    let (_, _) = cell(&mut ch, 4, || drop(a_foreign_library_allocates(10)));
    let snap = tracking::snapshot(&alloc);
    let seg = snap.segments.iter().find(|s| s.address == d.addr()).expect("the driver allocation as a segment");
    assert_eq!((seg.total_size, seg.blocks.len(), seg.blocks[0].state), (100 * MIB, 1, "active_allocated"));
    assert!(snap.segments.iter().any(|s| s.total_size == 64 * MIB), "the allocator's segment");
    let trace = &snap.device_traces[0];
    let tracked: Vec<&str> =
        trace.iter().filter(|t| t.user_metadata.contains("driver (cuMemAlloc)")).map(|t| t.action).collect();
    assert_eq!(
        tracked,
        ["segment_alloc", "alloc", "free_requested", "free_completed", "segment_free"],
        "cell 4's 10 MiB driver allocation and its release in the trace"
    );
    assert!(trace.iter().any(|t| t.user_metadata == "cell 4 · driver (cuMemAlloc)"));
    // PyTorch's pickle still writes, with the extra segments.
    assert!(!gpumem_nb::snapshot::pickle::to_bytes(&snap).is_empty());

    // A snapshot scope records the other allocations of its time too.
    let dir = std::env::temp_dir().join(format!("gpumem-tracking-scope-{}", std::process::id()));
    let (_, files) = gpumem_nb::scope::save_memory_snapshot(&dir, || drop(a_foreign_library_allocates(7)));
    let json = std::fs::read_to_string(files.unwrap().json).unwrap();
    let snap: serde_json::Value = serde_json::from_str(&json).unwrap();
    let scoped: Vec<&str> = snap["device_traces"][0]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["size"] == 7 * MIB && e["user_metadata"].as_str().unwrap_or("").contains("driver (cuMemAlloc)"))
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(scoped, ["segment_alloc", "alloc", "free_requested", "free_completed", "segment_free"]);
    // Stacks start at the caller and end above the thread's start.
    let frames = snap["device_traces"][0][0]["frames"].as_array().unwrap();
    assert!(frames[0]["name"].as_str().unwrap().contains("a_foreign_library_allocates"), "{frames:?}");
    assert!(!frames.iter().any(|f| f["name"].as_str().unwrap().contains("start_thread")), "{frames:?}");
    let _ = std::fs::remove_dir_all(&dir);

    // The stack's depth is the caller's choice: none at all, or a few frames that still reach
    // the caller; the default again afterwards.
    let stacked_frames = |depth: usize| {
        tracking::set_stack_depth(depth);
        let dir = std::env::temp_dir().join(format!("gpumem-tracking-depth-{}-{depth}", std::process::id()));
        let (_, files) = gpumem_nb::scope::save_memory_snapshot(&dir, || drop(a_foreign_library_allocates(3)));
        let snap: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(files.unwrap().json).unwrap()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let ours = |e: &&serde_json::Value| e["size"] == 3 * MIB && e["action"] == "alloc";
        // The newest: the trace also holds the earlier calls' allocations.
        let e = snap["device_traces"][0].as_array().unwrap().iter().rfind(ours).cloned().expect("the 3 MiB allocation");
        let frames = e["frames"].as_array().cloned().unwrap_or_default();
        frames.iter().map(|f| f["name"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(stacked_frames(0), Vec::<String>::new(), "depth 0: no stack");
    let full = stacked_frames(64);
    assert!(full[0].contains("a_foreign_library_allocates"), "{full:?}");
    // Fewer frames walked: the same stack cut short (our own frames count toward the depth).
    let mut lengths = Vec::new();
    for depth in [8, 16, 20, 24, 32] {
        let few = stacked_frames(depth);
        assert!(few.len() < depth && full.starts_with(&few), "depth {depth}: {few:?} is not a start of {full:?}");
        lengths.push(few.len());
    }
    assert!(lengths.windows(2).all(|w| w[0] <= w[1]) && lengths[4] > lengths[0], "{lengths:?}");
    tracking::set_stacks(true);
    assert_eq!(tracking::stack_depth(), tracking::STACK_DEPTH);

    drop(buf);
    drop(keep);
    alloc.empty_cache().unwrap();

    // Sites name the code holding memory: a buffer of the allocator by its own stack and cell,
    // not by the code that made the segment it sits in; a dropped buffer is not live; the
    // allocator's cached free bytes are a row of their own.
    let (_, _) = cell(&mut ch, 5, || drop(a_big_buffer(&alloc)));
    let mut small = None;
    let (_, after) = cell(&mut ch, 6, || small = Some(a_small_buffer(&alloc)));
    assert_eq!(alloc.memory_reserved(), 64 * MIB, "the 4 MiB buffer sits in the cached 64 MiB segment");
    let held = after.top.iter().find(|t| t.function.as_deref() != Some(gpumem_nb::kernel::protocol::CACHED_FREE));
    let held = held.expect("a site holding memory");
    assert_eq!(held.bytes, 4 * MIB, "{:?}", after.top);
    assert!(held.site().contains("a_small_buffer"), "{held:?}");
    assert!(held.segment.as_deref().is_some_and(|s| s.contains("a_big_buffer")), "made its segment: {held:?}");
    let top = tracking::top(5);
    let now = &top.places.iter().find(|p| p.device == Some(0)).unwrap().now;
    assert!(!now.iter().any(|s| s.site().contains("a_big_buffer")), "the dropped buffer holds nothing: {now:?}");
    let cached = now.iter().find(|s| s.function.as_deref() == Some(gpumem_nb::kernel::protocol::CACHED_FREE));
    assert_eq!(cached.map(|c| c.bytes), Some(60 * MIB), "{now:?}");
    let table = top.table().to_text();
    assert!(table.contains("in a segment made at") && table.contains("cached by the allocator, free"), "{table}");
    drop(small);
    alloc.empty_cache().unwrap();
    let r = ask(&mut ch, Op::Read);
    assert_eq!(dev0(&r).live, 0, "everything returned");
    tracking::check().unwrap();
}
