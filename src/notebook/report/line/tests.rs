//! The line's tests: what it says, what it keeps within its width, and NVML explained.

use super::super::{AllAllocations, PlaceAll, PoolPart, Span};
use super::*;
use crate::record::component::Component;

/// A cell on a GPU where NVML grew by 128 MiB: tracked allocations +139.80 MiB, of which the
/// CUDA pool reused 11.80 MiB it had cached; and one where 9.37 MiB more than that is
/// NVML's alone (a kernel's first launch loads its module).
#[test]
fn nvml_s_change_is_explained_and_its_rest_named_only_when_not_nothing() {
    let mib = 1u64 << 20;
    let rec = |nvml_after: u64| CellRecord {
        cell: 9,
        device: "cuda:0 NVIDIA H200".into(),
        nvml: super::super::NvmlPart {
            process: Span { before: Some(1000 * mib), after: Some(nvml_after) },
            ..Default::default()
        },
        all_allocations: Some(AllAllocations {
            tracking: "cupti".into(),
            place: PlaceAll {
                before: Some(500 * mib),
                after: Some(500 * mib + 139 * mib + 4 * mib / 5),
                ..Default::default()
            },
            ..Default::default()
        }),
        pool: Some(PoolPart {
            used: Span { before: Some(100 * mib), after: Some(100 * mib + 139 * mib + 4 * mib / 5) },
            reserved: Span { before: Some(200 * mib), after: Some(328 * mib) },
            ..Default::default()
        }),
        ..Default::default()
    };
    let exact = rec(1128 * mib);
    let g = exact.nvml_gap().unwrap();
    assert_eq!((g.nvml, g.pool_cache, g.rest), (128 * mib as i64, -(11 * mib as i64 + 4 * mib as i64 / 5), 0));
    assert!(!exact.line().contains("CUDA context"), "{}", exact.line());
    let loaded = rec(1128 * mib + 9 * mib + 3 * mib / 8);
    assert_eq!(loaded.nvml_gap().unwrap().rest, 9 * mib as i64 + 3 * mib as i64 / 8);
    // Every part, with room for all of them; the line a person reads keeps what fits.
    let whole = loaded.line_within(usize::MAX, false);
    assert!(whole.contains(" · +9.38 MiB CUDA context and modules (NVML)"), "{whole}");
    // The pool's cache is on the line: the driver counts it, whatever was freed.
    // The pool reused 11.8 MiB of its cache: the change is said.
    assert!(whole.contains(" · CUDA pool 240 MiB (+140 MiB), cached 88.2 MiB (-11.8 MiB) · "), "{whole}");
    assert!(loaded.line().chars().count() <= LINE_WIDTH, "{}", loaded.line());
    let details = loaded.details().to_text();
    assert!(details.contains("= all allocations +139.80 MiB + CUDA pool cache -11.80 MiB"), "{details}");
    // The first cell that uses the GPU (NVML had nothing of the process before, the crate
    // was not loaded): the CUDA context is the rest, the pool empty before.
    let mut first = rec(0);
    first.nvml.process = Span { before: Some(0), after: Some(532 * mib) };
    first.all_allocations.as_mut().unwrap().place.before = Some(0);
    first.all_allocations.as_mut().unwrap().place.after = Some(2 * mib);
    first.pool = Some(PoolPart {
        used: Span { before: None, after: Some(0) },
        reserved: Span { before: None, after: Some(0) },
        ..Default::default()
    });
    assert_eq!(first.nvml_gap().unwrap().rest, 530 * mib as i64);
    assert!(
        first.line_within(usize::MAX, false).contains(" · +530 MiB CUDA context and modules (NVML)"),
        "{}",
        first.line()
    );
}

/// A cell whose kernel needs a larger stack frame than the context had (NCCL's all-reduce
/// kernels, 1,744 B): the driver raises each thread's stack and reserves it for every thread
/// the device holds (an H200: 132 SMs × 2,048), which NVML counts and no tracker sees. With
/// the stack read before and after, that growth is named and nothing is left unexplained;
/// without, it reads as the CUDA context's.
#[test]
fn kernel_stacks_grown_by_the_driver_are_named_apart_from_the_context() {
    let mib = 1u64 << 20;
    let threads = 132 * 2048;
    let grown = (1744 - 1024) * threads;
    let rec = |stacks: bool| CellRecord {
        cell: 4,
        device: "cuda:0 NVIDIA H200".into(),
        nvml: super::super::NvmlPart {
            uuid: Some("GPU-0".into()),
            process: Span { before: Some(1000 * mib), after: Some(1000 * mib + 64 * mib + grown) },
            ..Default::default()
        },
        all_allocations: Some(AllAllocations {
            tracking: "cupti".into(),
            place: PlaceAll { device: Some(0), before: Some(500 * mib), after: Some(564 * mib), ..Default::default() },
            ..Default::default()
        }),
        allocator: Some(super::super::AllocatorPart {
            reserved: Span { before: Some(2 * mib), after: Some(2 * mib) },
            allocated: Span { before: Some(0), after: Some(0) },
            ..Default::default()
        }),
        local_memory: if stacks {
            vec![super::super::LocalMemoryPart {
                device: 0,
                uuid: "GPU-0".into(),
                stack_bytes: Span { before: Some(1024), after: Some(1744) },
                resident_threads: threads,
            }]
        } else {
            Vec::new()
        },
        ..Default::default()
    };
    let named = rec(true);
    let g = named.nvml_gap().unwrap();
    assert_eq!((g.tracked, g.local_memory, g.rest), (64 * mib as i64, grown as i64, 0));
    let whole = named.line_within(usize::MAX, false);
    assert!(whole.contains(" · +186 MiB kernel stacks (driver)"), "{whole}");
    assert!(!whole.contains("CUDA context"), "{whole}");
    // A line too long by one character drops something else first: the cell's memory went to
    // the kernel stacks, not to allocations.
    let shorter = named.line_within(whole.chars().count() - 1, false);
    assert!(shorter.contains("+186 MiB kernel stacks (driver)"), "{shorter}");
    let details = named.details().to_text();
    for row in [
        "+ kernel stacks (driver: 1,024 → 1,744 B a thread × 270,336 threads) +185.62 MiB + CUDA context and modules (no tracker sees them) ±0 B",
        "kernel stacks ",
        "each thread's stack (1,744 B, cuCtxGetLimit) × 270,336 threads",
    ] {
        assert!(details.contains(row), "{row:?} not in\n{details}");
    }
    let unnamed = rec(false);
    assert_eq!(unnamed.nvml_gap().unwrap().rest, grown as i64);
    let whole = unnamed.line_within(usize::MAX, false);
    assert!(whole.contains(" · +186 MiB CUDA context and modules (NVML)") && !whole.contains("stacks"), "{whole}");
}

/// A cell on two GPUs (an all-reduce over NCCL): NVML is read on each device and matched to
/// the CUDA device by UUID; each device's change is explained by what was tracked there (NCCL's
/// buffers, as workspace, named NCCL) and the rest NVML alone sees.
#[test]
fn a_cell_on_two_gpus_explains_nvml_on_each_device() {
    use crate::device::nvml::{NvmlDevice, NvmlProcess, NvmlSnapshot};
    use crate::notebook::protocol::{ComponentReading, OwnerBytes, PlaceReading};
    let mib = 1u64 << 20;
    let place = |device: i32, live: u64| PlaceReading {
        device: Some(device),
        uuid: Some(format!("GPU-{device}")),
        live,
        peak: live,
        by_component: vec![ComponentReading { component: Held::Component(Component::Workspace), live, rise: None }],
        top: vec![OwnerBytes {
            owner: "libnccl.so.2".into(),
            bytes: live,
            function: Some("libnccl.so.2".into()),
            cell: Some(3),
            queued: true,
            component: Some(Component::Workspace),
            ..Default::default()
        }],
        ..Default::default()
    };
    let tracked = |live: u64| super::super::TrackedReadings {
        status: "cupti".into(),
        places: vec![place(0, live), place(1, live)],
        ..Default::default()
    };
    // NVML lists the GPUs in its own order: device 1 of the process is NVML's first.
    let nvml = |d0: u64, d1: u64| NvmlSnapshot {
        devices: [(1, d1), (0, d0)]
            .into_iter()
            .enumerate()
            .map(|(index, (cuda, used))| NvmlDevice {
                index: index as u32,
                uuid: format!("GPU-{cuda}"),
                name: "NVIDIA H200".into(),
                total: 141 << 30,
                free: 100 << 30,
                used: used + (1 << 30),
                processes: vec![NvmlProcess { pid: 42, used: Some(used) }, NvmlProcess { pid: 7, used: Some(1 << 30) }],
            })
            .collect(),
        error: None,
    };
    let (tb, ta) = (tracked(196 * mib), tracked(484 * mib));
    let (nb, na) = (nvml(700 * mib, 600 * mib), nvml(1000 * mib, 986 * mib));
    let rec = super::super::build_record(
        3,
        &super::super::Readings {
            crate_before: Some(&[]),
            crate_after: Some(&[]),
            tracked_before: Some(&tb),
            tracked_after: Some(&ta),
            slot_opened: true,
            nvml_before: &nb,
            nvml_after: &na,
            pid_before: Some(42),
            pid_after: Some(42),
        },
    );
    let devices: Vec<(Option<i32>, Option<i64>)> =
        rec.nvml_devices.iter().map(|n| (n.device, n.process.delta())).collect();
    assert_eq!(devices, [(Some(1), Some(386 * mib as i64)), (Some(0), Some(300 * mib as i64))]);
    let one = rec.nvml_devices.iter().find(|n| n.device == Some(1)).unwrap();
    let g = rec.nvml_gap_on(one).unwrap();
    assert_eq!((g.nvml, g.tracked, g.rest), (386 * mib as i64, 288 * mib as i64, 98 * mib as i64));
    let whole = rec.line_within(usize::MAX, false);
    assert!(whole.contains("device 1 all allocations 484 MiB (+288 MiB"), "{whole}");
    assert!(whole.contains("cuda:1 +98.0 MiB CUDA context and modules (NVML)"), "{whole}");
    assert!(whole.contains("top NCCL ← cell 3"), "{whole}");
    let line = rec.line();
    assert!(line.chars().count() <= LINE_WIDTH && line.contains("cuda:1 +288 MiB"), "{line}");
    let details = rec.details().to_text();
    for row in [
        "this process, device 1 (total)",
        "NVML's change on device 1, explained",
        "= all allocations +288.00 MiB (workspace +288.00 MiB, most by NCCL ← cell 3)",
        "CUDA context and modules (no tracker sees them) +98.00 MiB",
        "other processes on device 1",
    ] {
        assert!(details.contains(row), "{row:?} not in\n{details}");
    }
    // The same cell's JSON reads back with every device.
    let back: CellRecord = serde_json::from_value(serde_json::to_value(&rec).unwrap()).unwrap();
    assert_eq!(back.nvml_devices, rec.nvml_devices);
}

/// A cell that only makes a context on each of two GPUs: nothing is tracked, NVML lists the
/// process on both; the devices the process sees (ordinal and UUID, from the crate's reply)
/// give each NVML device its ordinal. Without them, neither would have one.
#[test]
fn a_contexts_only_cell_gives_each_nvml_device_its_ordinal() {
    use crate::device::nvml::{NvmlDevice, NvmlProcess, NvmlSnapshot};
    use crate::notebook::protocol::CudaDevice;
    let mib = 1u64 << 20;
    // NVML's devices in its own order (device 1 of the process first), the process's bytes on
    // device 0 and on device 1.
    let nvml = |on0: u64, on1: u64| NvmlSnapshot {
        devices: [(1, on1), (0, on0)]
            .into_iter()
            .enumerate()
            .map(|(index, (cuda, used))| NvmlDevice {
                index: index as u32,
                uuid: format!("GPU-{cuda}"),
                name: "NVIDIA H200".into(),
                total: 141 << 30,
                free: 100 << 30,
                used,
                processes: if used > 0 { vec![NvmlProcess { pid: 42, used: Some(used) }] } else { Vec::new() },
            })
            .collect(),
        error: None,
    };
    let (nb, na, na_one) = (nvml(0, 0), nvml(500 * mib, 500 * mib), nvml(500 * mib, 0));
    let record_on = |before: Vec<CudaDevice>, after: Vec<CudaDevice>, na: &NvmlSnapshot| {
        let reading = |visible: Vec<CudaDevice>| super::super::TrackedReadings {
            status: "cupti".into(),
            cuda_devices: visible,
            ..Default::default()
        };
        let (tb, ta) = (reading(before), reading(after));
        super::super::build_record(
            2,
            &super::super::Readings {
                crate_before: None,
                crate_after: None,
                tracked_before: Some(&tb),
                tracked_after: Some(&ta),
                slot_opened: true,
                nvml_before: &nb,
                nvml_after: na,
                pid_before: Some(42),
                pid_after: Some(42),
            },
        )
    };
    let record = |before, after| record_on(before, after, &na);
    let ordinals = |visible: Vec<CudaDevice>| {
        let rec = record(visible.clone(), visible);
        rec.nvml_devices.iter().map(|n| (n.device, n.process.delta())).collect::<Vec<_>>()
    };
    let seen = |stack: Option<u64>| -> Vec<CudaDevice> {
        (0..2)
            .map(|o| CudaDevice {
                ordinal: o,
                uuid: format!("GPU-{o}"),
                stack_bytes: stack.filter(|_| o == 1),
                resident_threads: Some(270_336),
                ..Default::default()
            })
            .collect()
    };
    assert_eq!(ordinals(seen(None)), [(Some(1), Some(500 * mib as i64)), (Some(0), Some(500 * mib as i64))]);
    assert_eq!(ordinals(Vec::new()), [(None, Some(500 * mib as i64)), (None, Some(500 * mib as i64))]);
    // Device 1's context was active at both ends: its kernel stacks before and after; device
    // 0's was not (no reading), so it has none.
    let rec = record(seen(Some(1024)), seen(Some(1744)));
    assert_eq!(rec.local_memory.len(), 1);
    let l = &rec.local_memory[0];
    assert_eq!((l.device, l.uuid.as_str(), l.delta()), (1, "GPU-1", Some(720 * 270_336)));
    // After a restart the stack before belongs to another process: not compared.
    let rec = record(Vec::new(), seen(Some(1744)));
    assert_eq!(rec.local_memory[0].delta(), None);
    // One GPU in use of two the process sees (device 1 has no context: no stack read): NVML's
    // figures are the notebook device's alone, not one row per visible device.
    let mut one = seen(None);
    one[0].stack_bytes = Some(1024);
    assert!(record_on(one.clone(), one, &na_one).nvml_devices.is_empty());
}

/// A cell's workers: one or two by name and pid on the line, more by count; each in the
/// details with its bytes and where the figure comes from.
#[test]
fn child_processes_are_named_on_the_line_and_listed_in_the_details() {
    let child = |pid: u32, used: u64| crate::notebook::children::ChildProcess {
        pid,
        name: "gpumem-demo".into(),
        device: "sim-0".into(),
        used,
        source: "simulated".into(),
        ..Default::default()
    };
    let mut rec = CellRecord { cell: 2, children: vec![child(41, 48 << 20)], ..Default::default() };
    assert!(rec.line().contains(" · child processes 48.0 MiB (gpumem-demo 41)"), "{}", rec.line());
    rec.children.push(child(42, 16 << 20));
    assert!(rec.line().contains(" · child processes 64.0 MiB (gpumem-demo 41, gpumem-demo 42)"), "{}", rec.line());
    rec.children.push(child(43, 1 << 20));
    assert!(rec.line().contains(" · child processes 65.0 MiB (3 processes)"), "{}", rec.line());
    let details = rec.details().to_text();
    for pid in [41, 42, 43] {
        assert!(details.contains(&format!("child process gpumem-demo (pid {pid}) on sim-0")), "{details}");
    }
    assert!(details.contains("the simulated device's process table"), "{details}");
    // Ranks, and a highest reading above what a child held at the end.
    rec.children = vec![
        crate::notebook::children::ChildProcess {
            rank: Some(0),
            rank_from: Some("RANK".into()),
            ..child(41, 48 << 20)
        },
        crate::notebook::children::ChildProcess {
            rank: Some(1),
            local_rank: Some(1),
            rank_from: Some("RANK".into()),
            peak: Some(96 << 20),
            readings: Some(5),
            ..child(42, 16 << 20)
        },
    ];
    // (Within any width: at 120 characters the line keeps the parts before it.)
    let line = rec.line_within(usize::MAX, false);
    assert!(
        line.contains(
            " · child processes 64.0 MiB (gpumem-demo 41 rank 0, gpumem-demo 42 rank 1), highest reading 96.0 MiB \
             (gpumem-demo 42 rank 1)"
        ),
        "{line}"
    );
    // Where the line is full: the ranks, then nothing of it.
    let line = rec.line_within(80, false);
    assert!(line.ends_with(" · child processes 64.0 MiB (ranks 0, 1)"), "{line}");
    let details = rec.details().to_text();
    assert!(details.contains("child process gpumem-demo (pid 42, rank 1, local rank 1) on sim-0"), "{details}");
    assert!(details.contains("rank from RANK; peak: the highest of 5 readings (not exact)"), "{details}");
}

/// A lost context: the line names it and shows NVML's last reading instead of numbers the
/// allocator can no longer read; a cell an earlier version refused for it says it did not run.
#[test]
fn a_lost_context_is_named_instead_of_numbers() {
    let lost =
        crate::device::LostContext { fault: crate::device::Fault::IllegalAddress, call: "cuMemcpyDtoHAsync_v2".into() };
    let mut rec = CellRecord {
        cell: 3,
        device: "cuda:0 NVIDIA H200".into(),
        wall_ms: 12.0,
        lost: Some(lost.clone()),
        status: CellStatus::Lost,
        allocator: Some(Default::default()),
        nvml: super::super::NvmlPart { process: Span { before: None, after: Some(788 << 20) }, ..Default::default() },
        ..Default::default()
    };
    let line = rec.line();
    assert!(
        line.contains("✗ CUDA context lost (illegal address): host code runs · restart the process to go on"),
        "{line}"
    );
    assert!(!line.contains("allocated"), "{line}");
    rec.status = CellStatus::Refused;
    let line = rec.line();
    assert!(line.starts_with("[3] cuda:0 · ✗ not run: the CUDA context is lost (illegal address)"), "{line}");
    assert!(
        lost_message(&lost, 3).contains("lost (illegal address), first reported by cuMemcpyDtoHAsync_v2 in cell 3")
    );
}

/// The cell the issue saw at 233 characters: parameters, gradients and optimizer state made
/// in one cell, with a 512 MiB activation that made its 1.50 GiB peak and was freed, a top
/// site and the device's free memory. The line stays within [`LINE_WIDTH`], leads with the
/// components' largest changes and names the peak's; the details keep all of it.
#[test]
fn a_line_with_components_stays_within_its_width_and_names_the_peak() {
    use super::super::ComponentDelta;
    let mib = 1u64 << 20;
    let part = |c: Component, before: u64, after: u64, peak: u64| ComponentDelta {
        component: Held::Component(c),
        before: Some(before),
        after,
        peak: Some(peak),
    };
    let by_component = vec![
        part(Component::Parameter, 0, 256 * mib, 256 * mib),
        part(Component::Gradient, 0, 256 * mib, 256 * mib),
        part(Component::OptimizerState, 0, 512 * mib, 512 * mib),
        part(Component::Activation, 0, 0, 512 * mib),
    ];
    let rec = CellRecord {
        cell: 14,
        device: "sim:0 (simulated)".into(),
        wall_ms: 2310.0,
        allocator: Some(super::super::AllocatorPart {
            allocated: Span { before: Some(0), after: Some(1024 * mib) },
            reserved: Span { before: Some(0), after: Some(1536 * mib) },
            peak_allocated: 1536 * mib,
            peak_reserved: 1536 * mib,
            peak_is_cell: true,
            ..Default::default()
        }),
        all_allocations: Some(AllAllocations {
            tracking: "simulated".into(),
            place: PlaceAll {
                device: Some(0),
                before: Some(0),
                after: Some(1536 * mib),
                peak: Some(1536 * mib),
                by_component: by_component.clone(),
                top: vec![crate::notebook::protocol::OwnerBytes {
                    function: Some("cell 14".into()),
                    bytes: 512 * mib,
                    ..Default::default()
                }],
                ..Default::default()
            },
            devices: vec![PlaceAll {
                device: Some(0),
                before: Some(0),
                after: 1536 * mib,
                peak: 1536 * mib,
                by_component,
                ..Default::default()
            }],
        }),
        crate_device_free: Some(78 << 30),
        crate_device_total: Some(80 << 30),
        ..Default::default()
    };
    let line = rec.line();
    assert!(line.chars().count() <= LINE_WIDTH, "{} characters: {line}", line.chars().count());
    assert!(line.contains("what: optimizer_state +512 MiB"), "the largest change first: {line}");
    assert!(line.contains("peak 1.50 GiB by activation)"), "the peak's component: {line}");
    let details = rec.details().to_text();
    for c in ["parameter", "gradient", "optimizer_state", "activation"] {
        assert!(details.contains(c), "the details keep {c}: {details}");
    }
    // Out of memory on top: the flag stays, the rest makes room.
    let mut oom = rec.clone();
    oom.oom = Some(crate::notebook::protocol::OomEvent { requested: 1 << 42, count: 1, ..Default::default() });
    oom.warnings = vec!["over budget: peak 1.50 GiB > 1.00 GiB".into()];
    let line = oom.line();
    assert!(line.chars().count() <= LINE_WIDTH, "{} characters: {line}", line.chars().count());
    assert!(line.contains("✗ out of memory: asked for 4096.00 GiB"), "the error's own unit: {line}");
}

/// A record of a cell on a GPU whose memory is held by the owners given (before, after), with
/// no allocator of gpumem-nb's in use.
fn owned(owners: &[(&str, u64, u64)]) -> CellRecord {
    let place = |at: fn(&(&str, u64, u64)) -> u64| owners.iter().map(at).sum::<u64>();
    CellRecord {
        cell: 2,
        device: "cuda:0 NVIDIA H100 80GB HBM3".into(),
        wall_ms: 715.0,
        all_allocations: Some(AllAllocations {
            tracking: "cupti".into(),
            place: PlaceAll {
                device: Some(0),
                before: Some(place(|o| o.1)),
                after: Some(place(|o| o.2)),
                peak: Some(place(|o| o.2)),
                by_owner: owners
                    .iter()
                    .map(|(owner, before, after)| super::super::OwnerDelta {
                        owner: owner.to_string(),
                        before: Some(*before),
                        after: *after,
                        peak: None,
                    })
                    .collect(),
                ..Default::default()
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The line leads with who holds the memory (the framework's word, its change), never with an
/// allocator the notebook did not use; several owners keep the one that changed most and leave
/// the others out smallest change first.
#[test]
fn the_line_leads_with_the_framework_that_holds_the_memory() {
    let (gib, mib) = (1u64 << 30, 1u64 << 20);
    let rec = owned(&[("candle", 0, gib)]);
    assert_eq!(rec.line(), "[2] cuda:0 · 715 ms · candle 1.00 GiB (+1.00 GiB)");
    // gpumem-nb loaded (a `:dep` and no call, or a call that allocated nothing): still candle.
    let mut with_crate = rec.clone();
    with_crate.allocator = Some(super::super::AllocatorPart {
        allocated: Span { before: Some(0), after: Some(0) },
        reserved: Span { before: Some(0), after: Some(0) },
        ..Default::default()
    });
    assert_eq!(with_crate.line(), rec.line(), "no `allocated 0 B` of an allocator the notebook never used");
    // Three owners, the largest change first; all of them fit.
    let three = owned(&[("cudarc", 0, 8 * mib), ("candle", 2 * gib, 3 * gib), ("cuBLAS", 0, 32 * mib)]);
    let line = three.line();
    assert!(
        line.starts_with(
            "[2] cuda:0 · 715 ms · candle 3.00 GiB (+1.00 GiB) · cuBLAS 32.0 MiB (+32.0 MiB) · cudarc 8.00 MiB (+8.00 MiB)"
        ),
        "{line}"
    );
    let whole = three.line_within(usize::MAX, false);
    assert!(whole.ends_with(" · all allocations 3.04 GiB (+1.04 GiB)"), "several owners: their sum, {whole}");
    assert!(!line.contains("all allocations"), "the sum goes before any owner: {line}");
    // Narrower: the smallest change goes first, the one that changed most stays.
    let narrow = three.line_within(90, false);
    assert!(narrow.contains("candle") && narrow.contains("cuBLAS") && !narrow.contains("cudarc"), "{narrow}");
    let narrowest = three.line_within(40, false);
    assert!(narrowest.contains("candle") && !narrowest.contains("cuBLAS"), "{narrowest}");
    // Nothing of the process on the device: said in one phrase.
    assert_eq!(owned(&[]).line(), "[2] cuda:0 · 715 ms · no device memory");
}

/// Where gpumem-nb's allocator holds memory its own figures stand for it, in the order of its
/// change among the owners.
#[test]
fn gpumem_nb_s_allocator_is_an_owner_among_the_others() {
    let mib = 1u64 << 20;
    let mut rec = owned(&[("gpumem-nb", 0, 64 * mib), ("candle", 0, 512 * mib)]);
    rec.allocator = Some(super::super::AllocatorPart {
        allocated: Span { before: Some(0), after: Some(48 * mib) },
        reserved: Span { before: Some(0), after: Some(64 * mib) },
        peak_allocated: 48 * mib,
        peak_reserved: 64 * mib,
        peak_is_cell: true,
        ..Default::default()
    });
    let line = rec.line_within(usize::MAX, false);
    assert!(
        line.starts_with(
            "[2] cuda:0 · 715 ms · candle 512 MiB (+512 MiB) · allocated 48.0 MiB (+48.0 MiB) · reserved 64.0 MiB (+64.0 MiB)"
        ),
        "{line}"
    );
    assert!(!line.contains("gpumem-nb 64"), "the allocator's figures stand for its owner: {line}");
}

/// `%gpumem trim` after a dropped 1 GiB tensor: nothing tracked changed, the CUDA pool's cache
/// fell by 1 GiB (NVML with it). The line says so within its width; a cell whose cache did not
/// change keeps the pool's usual form.
#[test]
fn a_change_of_the_pool_s_cache_is_on_the_line_when_nothing_else_changed() {
    let mib = 1u64 << 20;
    let rec = |reserved_before: u64| CellRecord {
        cell: 5,
        device: "cuda:0 NVIDIA H100 80GB HBM3".into(),
        all_allocations: Some(AllAllocations {
            tracking: "cupti".into(),
            place: PlaceAll { before: Some(72 * mib), after: Some(72 * mib), ..Default::default() },
            ..Default::default()
        }),
        pool: Some(PoolPart {
            used: Span { before: Some(4 * mib), after: Some(4 * mib) },
            reserved: Span { before: Some(reserved_before), after: Some(32 * mib) },
            ..Default::default()
        }),
        ..Default::default()
    };
    let whole = rec(1056 * mib).line_within(usize::MAX, false);
    assert!(whole.contains(" · CUDA pool 4.00 MiB (±0 B), cached 28.0 MiB (-1.00 GiB)"), "{whole}");
    let trimmed = rec(1056 * mib).line();
    assert!(trimmed.contains("cached 28.0 MiB (-1.00 GiB)"), "{trimmed}");
    assert!(trimmed.chars().count() <= LINE_WIDTH, "{trimmed}");
    let same = rec(32 * mib).line_within(usize::MAX, false);
    assert!(same.contains("CUDA pool 4.00 MiB (±0 B, cached 28.0 MiB)"), "{same}");
}

/// burn's variables by their types (the session library's probe) stay on a line that also has
/// cubecl's own books: cubecl's figures are shortened first.
#[test]
fn burn_s_variables_stay_beside_cubecl_s_books() {
    use crate::notebook::protocol::{FrameworkPool, FrameworkReading, VariableHeld, VariablesReading};
    let mut rec = owned(&[("burn/cubecl", 0, 20_756_992)]);
    rec.cell = 5;
    rec.wall_ms = 13_300.0;
    let books = |in_use: u64| FrameworkReading {
        framework: "cubecl".into(),
        device: "cuda:0 stream 0".into(),
        pools: vec![FrameworkPool { in_use, reserved: 20_756_992, ..Default::default() }],
        ..Default::default()
    };
    rec.frameworks = super::super::framework_parts(
        Some(&[FrameworkReading { from_empty: true, ..books(0) }]),
        Some(&[books(2_255_360)]),
    );
    let probe = VariablesReading {
        framework: "burn".into(),
        probe: 1,
        source: "probe".into(),
        variables: vec![VariableHeld {
            name: "model".into(),
            component: "parameter".into(),
            bytes: 2_140_160,
            tensors: 8,
            ..Default::default()
        }],
    };
    rec.variables = super::super::variables_part(None, Some(&probe));
    let line = rec.line();
    assert_eq!(
        line,
        "[5] cuda:0 · 13.3 s · burn/cubecl 19.8 MiB (+19.8 MiB) · cubecl in use 2.15 MiB (+2.15 MiB) · parameter \
         2.04 MiB"
    );
    // With room, cubecl's cache is said too.
    assert!(rec.line_within(usize::MAX, false).contains("cached 17.64 MiB"));
    // The H100's gpu_nocall_burn (2026-12-08): the model's cell also kept its inputs (the full
    // form, 134 characters, did not fit), and the Adam step's; each keeps its largest part.
    let tensor = VariableHeld {
        name: "images".into(),
        component: "tensor".into(),
        bytes: 100_480,
        tensors: 2,
        ..Default::default()
    };
    let model = VariableHeld { bytes: 2_124_712, ..probe.variables[0].clone() };
    let first = VariablesReading { variables: vec![model.clone(), tensor.clone()], ..probe.clone() };
    rec.variables = super::super::variables_part(None, Some(&first));
    rec.wall_ms = 17_800.0;
    let line = rec.line();
    assert!(line.ends_with("cubecl in use 2.15 MiB (+2.15 MiB) · parameter 2.03 MiB"), "{line}");
    let adam = VariableHeld {
        name: "optim".into(),
        component: "optimizer_state".into(),
        bytes: 4_249_424,
        tensors: 16,
        ..Default::default()
    };
    let step = VariablesReading { probe: 2, variables: vec![model, adam, tensor], ..probe };
    rec.variables = super::super::variables_part(Some(&first), Some(&step));
    rec.cell = 6;
    rec.wall_ms = 23_600.0;
    rec.all_allocations.as_mut().unwrap().place.by_owner[0].before = Some(106 << 20);
    rec.frameworks = super::super::framework_parts(Some(&[books(8_060_000)]), Some(&[books(14_870_000)]));
    let line = rec.line();
    assert!(line.contains("cubecl in use") && line.ends_with(" · optimizer_state +4.05 MiB"), "{line}");
    assert!(line.chars().count() <= 120, "{line}");
}
