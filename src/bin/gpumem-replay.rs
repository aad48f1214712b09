//! `gpumem-replay TRACE [--alloc-conf STR] [--device-total BYTES] [--sequence] [--json] [--snapshot DIR]`
//!
//! Replays a recorded PyTorch allocator trace (`.tsv` / `.tsv.gz`, see `shared/traces`)
//! through gpumem-nb's caching policy on the replay device, and prints the peaks, device
//! counters, the sizes of every new segment in order, and the full `memory_stats()`.
//!
//! Under `compact:True` (our policy) only the trace's allocations and frees are replayed, on a
//! simulated device of the trace's memory (`total_memory` in the sidecar, else
//! `--device-total`, else 80 GiB): PyTorch's segment events do not apply. The output adds the
//! requested peak, PyTorch's reserved peak in the trace and the ratio of ours to it.
//! `--sequence` replays that way under any policy (e.g. PyTorch's expandable segments for a
//! trace recorded without them).
//!
//! The allocator configuration is, in order: `--alloc-conf`, the trace's sidecar
//! `<name>.json` (`alloc_conf`), `GPUMEM_NB_ALLOC_CONF`, the default.
//! `--snapshot DIR` also writes `snapshot.pickle` (for pytorch.org/memory_viz and
//! `python -m torch.cuda._memory_viz`), `snapshot.json` and `trace_plot.html` (offline) for the
//! replayed trace.
//!
//! Bad input is one line on stderr naming the file and line, and exit status 2.

use gpumem_nb::AllocatorConfig;
use gpumem_nb::replay::{ReplayOptions, read_trace, replay, replay_sequence, trace_reserved_peak};
use gpumem_nb::units::iec;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str =
    "usage: gpumem-replay TRACE [--alloc-conf STR] [--device-total BYTES] [--sequence] [--json] [--snapshot DIR]";

struct Args {
    trace: PathBuf,
    alloc_conf: Option<String>,
    device_total: Option<u64>,
    json: bool,
    sequence: bool,
    snapshot: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut trace = None;
    let mut alloc_conf = None;
    let mut device_total = None;
    let mut json = false;
    let mut sequence = false;
    let mut snapshot = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => json = true,
            "--sequence" => sequence = true,
            "--snapshot" => snapshot = Some(PathBuf::from(it.next().ok_or("--snapshot needs a directory")?)),
            "--alloc-conf" => alloc_conf = Some(it.next().ok_or("--alloc-conf needs a value")?),
            "--device-total" => {
                let v = it.next().ok_or("--device-total needs a value")?;
                device_total = Some(gpumem_nb::units::parse_size(&v).ok_or(format!("--device-total: bad size '{v}'"))?);
            }
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with('-') => return Err(format!("unknown option '{s}'")),
            s => {
                if trace.replace(PathBuf::from(s)).is_some() {
                    return Err("only one TRACE may be given".into());
                }
            }
        }
    }
    let trace = trace.ok_or("missing TRACE")?;
    Ok(Args { trace, alloc_conf, device_total, json, sequence, snapshot })
}

/// The `<name>.json` beside `<name>.trace.tsv[.gz]`, if any.
fn sidecar(trace: &Path) -> Option<serde_json::Value> {
    let name = trace.file_name()?.to_str()?;
    let stem = name.split(".trace.").next().filter(|s| *s != name).or_else(|| name.split('.').next())?;
    let text = std::fs::read_to_string(trace.with_file_name(format!("{stem}.json"))).ok()?;
    serde_json::from_str(&text).ok()
}

fn run(args: Args) -> Result<(), String> {
    let side = sidecar(&args.trace);
    let (conf, source) = if let Some(c) = args.alloc_conf.clone() {
        (c, "--alloc-conf")
    } else if let Some(c) = side.as_ref().and_then(|s| s["alloc_conf"].as_str()) {
        (c.to_string(), "trace sidecar .json")
    } else if let Ok(c) = std::env::var(gpumem_nb::AllocatorConfig::ENV_VAR) {
        (c, "GPUMEM_NB_ALLOC_CONF")
    } else {
        (String::new(), "default")
    };
    let config = AllocatorConfig::parse(&conf).map_err(|e| format!("{source}: {e}"))?;
    let device_total = args
        .device_total
        .or_else(|| side.as_ref().and_then(|s| s["total_memory"].as_u64()))
        .unwrap_or(ReplayOptions::default().device_total);
    let events = read_trace(&args.trace).map_err(|e| e.to_string())?;
    let path = args.trace.display().to_string();
    let keep_history = args.snapshot.is_some();
    let opts = ReplayOptions { config, device_total, keep_history };
    if opts.config.compact || args.sequence {
        return run_sequence(&args, &events, &opts, &path, &conf, source);
    }
    let r = replay(&events, &opts, &path).map_err(|e| e.to_string())?;
    let files = write_snapshot(&args, || r.snapshot())?;
    let pytorch_peak = trace_reserved_peak(&events);
    if args.json {
        let out = serde_json::json!({
            "trace": path, "alloc_conf": conf, "alloc_conf_source": source,
            "device": "replay",
            "events": r.events,
            "allocated_peak": r.allocated_peak,
            "reserved_peak": r.reserved_peak,
            "requested_peak": r.stats["requested_bytes.all.peak"],
            "pytorch_reserved_peak": pytorch_peak,
            "reserved_ratio": r.reserved_peak as f64 / pytorch_peak.max(1) as f64,
            "num_device_alloc": r.num_device_alloc,
            "num_device_free": r.num_device_free,
            "segment_sizes": r.segment_sizes,
            "segment_sizes_match_trace": r.segment_sizes == r.trace_segment_sizes,
            "divergences": r.divergences,
            "first_divergence": r.first_divergence,
            "address_mismatches": r.address_mismatches,
            "releases_explained_by": {"malloc": r.strategies[0], "oom_path": r.strategies[1], "empty_cache": r.strategies[2]},
            "stats": r.stats,
            "snapshot": files_json(files.as_ref()),
        });
        println!("{out}");
    } else {
        println!("trace           {path} ({} events)", r.events);
        println!("alloc conf      {:?} ({source})", conf);
        println!("allocated peak  {} ({} bytes)", iec(r.allocated_peak as u64), r.allocated_peak);
        println!("reserved peak   {} ({} bytes)", iec(r.reserved_peak as u64), r.reserved_peak);
        println!("device allocs   {}   device frees {}", r.num_device_alloc, r.num_device_free);
        println!(
            "segments        {} new, {} the trace's sizes in order",
            r.segment_sizes.len(),
            if r.segment_sizes == r.trace_segment_sizes { "matching" } else { "NOT matching" }
        );
        match &r.first_divergence {
            None => println!("divergences     none: every device event matches the trace"),
            Some(d) => println!("divergences     {} (first: {d})", r.divergences),
        }
        if let Some(f) = &files {
            println!("snapshot        {}", f.pickle.display());
            println!("                {}", f.json.display());
            println!("                {}", f.html.display());
        }
    }
    Ok(())
}

/// Writes `--snapshot DIR`'s files, when asked for.
fn write_snapshot(
    args: &Args,
    snapshot: impl FnOnce() -> gpumem_nb::Snapshot,
) -> Result<Option<gpumem_nb::SnapshotFiles>, String> {
    args.snapshot.as_ref().map(|dir| snapshot().save(dir).map_err(|e| e.to_string())).transpose()
}

/// The snapshot's files as JSON, if one was written.
fn files_json(files: Option<&gpumem_nb::SnapshotFiles>) -> serde_json::Value {
    files.map_or(serde_json::Value::Null, |f| serde_json::json!({"pickle": f.pickle, "json": f.json, "html": f.html}))
}

/// Under `compact:True` or with `--sequence`: the trace's allocations and frees on a simulated
/// device.
fn run_sequence(
    args: &Args,
    events: &[gpumem_nb::replay::TraceLine],
    opts: &ReplayOptions,
    path: &str,
    conf: &str,
    source: &str,
) -> Result<(), String> {
    let r = replay_sequence(events, opts, path).map_err(|e| e.to_string())?;
    let files = write_snapshot(args, || r.snapshot())?;
    if args.json {
        let out = serde_json::json!({
            "trace": path, "alloc_conf": conf, "alloc_conf_source": source,
            "device": "simulated",
            "device_total": opts.device_total,
            "replay": "sequence",
            "events": r.events,
            "allocated_peak": r.allocated_peak,
            "reserved_peak": r.reserved_peak,
            "requested_peak": r.requested_peak,
            "pytorch_reserved_peak": r.pytorch_reserved_peak,
            "reserved_ratio": r.reserved_ratio(),
            "num_device_alloc": r.num_device_alloc,
            "num_device_free": r.num_device_free,
            "segment_sizes": r.segment_sizes,
            "failed_allocs": r.failed_allocs,
            "skipped_ooms": r.skipped_ooms,
            "stats": r.stats,
            "snapshot": files_json(files.as_ref()),
        });
        println!("{out}");
    } else {
        let pct = |x: i64, of: u64| 100.0 * (x as f64 / of.max(1) as f64 - 1.0);
        println!("trace           {path} ({} events, allocations and frees only)", r.events);
        println!("alloc conf      {conf:?} ({source}), simulated device of {}", iec(opts.device_total));
        println!("requested peak  {} ({} bytes)", iec(r.requested_peak as u64), r.requested_peak);
        println!("allocated peak  {} ({} bytes)", iec(r.allocated_peak as u64), r.allocated_peak);
        println!(
            "reserved peak   {} ({} bytes, {:+.2} % over requested)",
            iec(r.reserved_peak as u64),
            r.reserved_peak,
            pct(r.reserved_peak, r.requested_peak as u64)
        );
        println!(
            "PyTorch         {} reserved in the trace; ours is {:.4} of it",
            iec(r.pytorch_reserved_peak),
            r.reserved_ratio()
        );
        println!("device maps     {}   unmaps {}", r.num_device_alloc, r.num_device_free);
        if r.failed_allocs + r.skipped_ooms > 0 {
            println!("not placed      {} (and {} oom lines skipped)", r.failed_allocs, r.skipped_ooms);
        }
        if let Some(f) = &files {
            println!("snapshot        {}", f.pickle.display());
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match parse_args() {
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpumem-replay: {e}\n{USAGE}");
            ExitCode::from(2)
        }
        Ok(args) => match run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gpumem-replay: {e}");
                ExitCode::from(2)
            }
        },
    }
}
