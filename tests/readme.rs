//! The README's examples, run: the numbers and the message it shows are the ones the code
//! produces (on the simulated device, as on a machine without a GPU).

use gpumem_nb::device::any::AnyBackend;
use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::{AllocatorConfig, CachingAllocator, DeviceBuffer, StreamId};
use std::sync::Arc;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap()
}

fn sim(capacity: u64) -> Arc<gpumem_nb::Allocator> {
    Arc::new(CachingAllocator::new(AnyBackend::Sim(SimBackend::new(0, capacity)), AllocatorConfig::default()))
}

#[test]
fn tour_numbers_are_what_the_allocator_reports() {
    let alloc = sim(80 << 30);
    let x = DeviceBuffer::<f32>::zeros(&alloc, 1 << 20, StreamId::DEFAULT).unwrap();
    let y = DeviceBuffer::from_host(&alloc, &[1.0f32, 2.0, 3.0], StreamId::DEFAULT).unwrap();
    assert_eq!(y.to_host().unwrap(), vec![1.0, 2.0, 3.0]);
    let text = readme();
    assert_eq!(alloc.memory_allocated(), 4_194_816);
    assert!(text.contains("alloc.memory_allocated();    // 4,194,816 bytes"));
    assert_eq!(alloc.memory_reserved(), 23_068_672);
    assert!(text.contains("alloc.memory_reserved();     // 23,068,672 bytes"));
    drop(x);
    assert_eq!(alloc.memory_reserved(), 23_068_672);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.memory_reserved(), 2 << 20, "y's small segment stays");
    let slot = alloc.peak_slot();
    drop(DeviceBuffer::<u8>::zeros(&alloc, 64 << 20, StreamId::DEFAULT).unwrap());
    assert_eq!(slot.peaks().allocated, (64 << 20) + 512);
}

#[test]
fn oom_message_in_readme_is_the_real_one() {
    // The conformance case D on a simulated card of the H200's size.
    let alloc = sim(150_109_880_320);
    let _keep = alloc.malloc(3 << 20, StreamId::DEFAULT).unwrap();
    let tmp = alloc.malloc(50 << 20, StreamId::DEFAULT).unwrap();
    alloc.free(tmp.block.unwrap()).unwrap();
    let msg = alloc.malloc(1 << 40, StreamId::DEFAULT).unwrap_err().to_string();
    let shown: String = readme()
        .split("CUDA out of memory. Tried to allocate 1024.00 GiB")
        .nth(1)
        .and_then(|rest| rest.split('…').next())
        .map(|s| format!("CUDA out of memory. Tried to allocate 1024.00 GiB{}", s.replace('\n', " ")))
        .expect("README shows the message");
    assert!(msg.starts_with(shown.trim_end()), "README:\n{shown}\nreal:\n{msg}");
}

/// The README's scope, snapshot, mem and pinned snippets, run on a simulated device.
#[test]
fn seed_capability_examples_run() {
    use gpumem_nb::{HistoryOptions, RecordMode, StackContext};
    let alloc = sim(4 << 30);
    // Scope: the printed line has the README's shape.
    let sink = gpumem_nb::scope::Capture::new();
    let s = gpumem_nb::scope::MemoryScope::new(&alloc, "forward").with_sink(sink.clone());
    let x = DeviceBuffer::<u8>::zeros(&alloc, 16 << 20, StreamId::DEFAULT).unwrap();
    drop(x);
    let y = DeviceBuffer::<u8>::zeros(&alloc, 4 << 20, StreamId::DEFAULT).unwrap();
    drop(s);
    let line = sink.contents();
    let shown = line.split(" in ").next().unwrap();
    assert!(readme().contains(shown), "README shows the real line: {line}");
    // Snapshot scope.
    let dir = std::env::temp_dir().join(format!("gpumem-readme-{}", std::process::id()));
    let (v, files) = gpumem_nb::scope::save_memory_snapshot_on(&alloc, &dir, || 7);
    let files = files.unwrap();
    assert_eq!(v, 7);
    assert!(files.pickle.exists() && files.json.exists() && files.html.exists());
    alloc.record_memory_history_with(HistoryOptions {
        enabled: RecordMode::All,
        context: StackContext::All,
        max_entries: 100_000,
    });
    let snap = alloc.snapshot();
    snap.save(&dir).unwrap();
    // mem helpers and pinned memory.
    let buf = gpumem_nb::mem::allocate_mib_on(&alloc, 512).expect("512 MiB fit on 4 GiB");
    assert_eq!(buf.len(), 512 << 20);
    let filler = gpumem_nb::mem::leave_free_mib_on(&alloc, 2048).unwrap();
    assert_eq!(gpumem_nb::mem::free_on(&alloc).unwrap().bytes, 2048 << 20);
    drop(filler);
    let host = gpumem_nb::pinned::HostAllocator::for_device(&alloc);
    let staging = gpumem_nb::pinned::PinnedBuffer::from_slice(&host, &[1u32, 2, 3]).unwrap();
    let on_gpu = staging.to_device(&alloc, StreamId::DEFAULT).unwrap();
    assert_eq!(on_gpu.to_host().unwrap(), vec![1, 2, 3]);
    assert!(
        host.host_memory_stats().contains_key("allocated_bytes.current"),
        "{:?}",
        host.host_memory_stats().keys().collect::<Vec<_>>()
    );
    let _ = (y, std::fs::remove_dir_all(&dir));
}

/// The README's two commands, found as `.ci/run` finds them (the first ```sh block after "## Two
/// commands", one line marked `# the main job`, one `# every check`), and `.ci/run` running
/// exactly those: CI cannot drift from what a new user types.
#[test]
fn ci_runs_the_readmes_two_commands() {
    let text = readme();
    let section = text.split("\n## Two commands\n").nth(1).expect("a '## Two commands' section");
    let block = section.split("```sh\n").nth(1).and_then(|b| b.split("```").next()).expect("a sh block");
    let marked = |mark: &str| -> String {
        let lines: Vec<&str> = block
            .lines()
            .filter(|l| l.split_once('#').is_some_and(|(_, c)| c.trim_start().starts_with(mark)))
            .collect();
        assert_eq!(lines.len(), 1, "one line marked '# {mark}': {block}");
        lines[0].split('#').next().unwrap().trim().to_string()
    };
    let main = marked("the main job");
    let test = marked("every check");
    assert_eq!(main, "cargo run --release -p gpumem-kernel -- run notebooks/tour.ipynb --html tour.html");
    assert_eq!(test, "scripts/test.sh");
    let ci = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/run")).unwrap();
    for needle in [
        "main_cmd=$(readme_command \"the main job\")",
        "test_cmd=$(readme_command \"every check\")",
        "bash -c \"$test_cmd\"",
        "env -i HOME=\"$HOME\" PATH=\"$PATH\" bash -c \"$main_cmd\"",
    ] {
        assert!(ci.contains(needle), ".ci/run must contain {needle:?}");
    }
    // What CI expects the main command to print matches the tour it runs.
    let tour: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/notebooks/tour.ipynb")).unwrap(),
    )
    .unwrap();
    let code_cells = tour["cells"].as_array().unwrap().iter().filter(|c| c["cell_type"] == "code").count();
    assert!(ci.contains(&format!("run: {code_cells} code cells in")), "the tour has {code_cells} code cells");
}

#[test]
fn the_readme_is_one_page_with_no_dated_figure() {
    // Issue 56: a newcomer's page. Dated figures live in BENCHMARKS.md with their machine.
    let text = readme();
    let lines = text.lines().count();
    let words = text.split_whitespace().count();
    assert!(lines <= 250, "README.md has {lines} lines; at most 250");
    assert!(words <= 2500, "README.md has {words} words; at most 2,500");
    let dated: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.as_bytes().windows(10).any(|w| {
                w.iter().enumerate().all(|(i, c)| if i == 4 || i == 7 { *c == b'-' } else { c.is_ascii_digit() })
                    && w.starts_with(b"20")
            })
        })
        .collect();
    assert!(dated.is_empty(), "README.md has dated lines (move them to BENCHMARKS.md): {dated:?}");
}
