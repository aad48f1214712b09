//! `gpumem-demo`: a short tour of the allocator, printed as text.
//!
//! Uses the device `GPUMEM_NB_DEVICE` selects (default: the GPU if there is one, otherwise a
//! simulated 80 GiB device) and shows: PyTorch's numbers as a workload allocates and frees,
//! a peak slot (a scope's own peak), `memory_summary()`, `empty_cache`, an out-of-memory error
//! explained, and a recorded PyTorch trace replayed.
//!
//! `gpumem-demo hold SIZE SECONDS` is a worker instead: it allocates SIZE (`48MiB`) through the
//! caching allocator on that device, prints `holding SIZE on DEVICE (pid PID)` and waits SECONDS
//! (or until killed). A notebook that starts it sees it as a child process on the device (on the
//! simulated device, through the simulated process table).

use gpumem_nb::units::{GIB, MIB, iec};
use gpumem_nb::{DeviceBuffer, StreamId};
use std::process::ExitCode;

fn line(alloc: &gpumem_nb::Allocator, what: &str) {
    println!(
        "  {what:<40} allocated {:>11}   reserved {:>11}   peak allocated {:>11}",
        iec(alloc.memory_allocated()),
        iec(alloc.memory_reserved()),
        iec(alloc.max_memory_allocated())
    );
}

fn run() -> gpumem_nb::Result<()> {
    let alloc = gpumem_nb::current()?;
    let (free, total) = alloc.mem_get_info()?;
    let source = match alloc.backend_kind() {
        gpumem_nb::BackendKind::Cuda => "CUDA device",
        _ => "simulated device (no usable GPU, or GPUMEM_NB_DEVICE=sim)",
    };
    println!("gpumem-nb demo on device {} — {source}", alloc.device());
    println!("  device memory: {} total, {} free (cuMemGetInfo{})\n", iec(total), iec(free), sim_note(&alloc));

    println!("1. Allocations through the caching allocator (numbers: allocator)");
    let a = DeviceBuffer::<f32>::zeros(&alloc, 1_000, StreamId::DEFAULT)?;
    line(&alloc, "4 KB of f32 (small pool, 2 MiB segment)");
    let b = DeviceBuffer::<u8>::zeros(&alloc, 3 * MIB as usize, StreamId::DEFAULT)?;
    line(&alloc, "+3 MiB (large pool, 20 MiB segment)");
    let c = DeviceBuffer::<u8>::zeros(&alloc, 100 * MIB as usize + 7, StreamId::DEFAULT)?;
    line(&alloc, "+100 MiB + 7 B (rounded to 512 B)");
    let roundtrip = DeviceBuffer::from_host(&alloc, &[1.5f32, 2.5, 3.5], StreamId::DEFAULT)?.to_host()?;
    println!("  from_host/to_host round trip: {roundtrip:?}");

    println!("\n2. A scope's own peak (a peak slot), independent of the global peak");
    let slot = alloc.peak_slot();
    {
        let _tmp = DeviceBuffer::<u8>::zeros(&alloc, 64 * MIB as usize, StreamId::DEFAULT)?;
    }
    let p = slot.peaks();
    println!(
        "  inside the scope: allocated peak {}, reserved peak {}",
        iec(p.allocated as u64),
        iec(p.reserved as u64)
    );
    drop(slot);

    drop((a, b, c));
    line(&alloc, "after dropping everything");
    println!("  (freed blocks stay cached: reserved does not go down until empty_cache)\n");

    println!("3. torch.cuda.memory_summary(), same text as PyTorch's");
    print!("{}", alloc.memory_summary(true));

    alloc.empty_cache()?;
    println!();
    line(&alloc, "after empty_cache()");

    println!("\n4. Out of memory, with PyTorch's numbers");
    match DeviceBuffer::<u8>::zeros(&alloc, (total + GIB) as usize, StreamId::DEFAULT) {
        Err(e) => println!("  {e}"),
        Ok(_) => println!("  (unexpectedly fit)"),
    }

    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/traces/gpt2_train.trace.tsv.gz");
    if let Ok(events) = gpumem_nb::replay::read_trace(std::path::Path::new(trace)) {
        println!("\n5. A PyTorch trace (GPT-2 training, recorded on an H200) replayed through the policy");
        let r = gpumem_nb::replay::replay(&events, &Default::default(), trace)
            .map_err(|e| gpumem_nb::Error::Setting(e.to_string()))?;
        println!(
            "  {} events: allocated peak {}, reserved peak {}, {} segments; {} divergences from PyTorch",
            r.events,
            iec(r.allocated_peak as u64),
            iec(r.reserved_peak as u64),
            r.num_device_alloc,
            r.divergences
        );
    }
    Ok(())
}

fn sim_note(alloc: &gpumem_nb::Allocator) -> &'static str {
    if alloc.backend_kind() == gpumem_nb::BackendKind::Cuda { "" } else { ", simulated" }
}

fn hold(size: &str, seconds: &str) -> gpumem_nb::Result<()> {
    let bad = |what: &str| gpumem_nb::Error::Setting(format!("gpumem-demo hold SIZE SECONDS: bad {what}"));
    let bytes = gpumem_nb::units::parse_size(size).ok_or_else(|| bad("SIZE (e.g. 48MiB)"))?;
    let secs: u64 = seconds.parse().map_err(|_| bad("SECONDS"))?;
    let alloc = gpumem_nb::current()?;
    let _held = DeviceBuffer::<u8>::zeros(&alloc, bytes as usize, StreamId::DEFAULT)?;
    println!("holding {} on device {}{} (pid {})", iec(bytes), alloc.device(), sim_note(&alloc), std::process::id());
    std::thread::sleep(std::time::Duration::from_secs(secs));
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [] => run(),
        [cmd, size, secs] if cmd == "hold" => hold(size, secs),
        _ => {
            eprintln!("usage: gpumem-demo [hold SIZE SECONDS]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpumem-demo: {e}");
            ExitCode::FAILURE
        }
    }
}
