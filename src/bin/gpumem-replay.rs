//! `gpumem-replay TRACE... [--alloc-conf STR] [--device-total SIZE] [--sequence] [--json]
//! [--snapshot DIR] [--fit SIZE] [--explain]`
//!
//! TRACE is a recorded PyTorch allocator trace (`.tsv` / `.tsv.gz`, see `tests/fixtures/traces/README.md`), a
//! snapshot pickle written by `torch.cuda.memory._dump_snapshot` after
//! `_record_memory_history(enabled="all")`, or one of gpumem-nb's own snapshots (a directory
//! written by `Snapshot::save`, its `snapshot.pickle` or `snapshot.json`): the format is told by
//! the content. Every device of a snapshot is replayed.
//!
//! It replays the trace through gpumem-nb's caching policy on the replay device and prints the
//! peaks, device counters, the sizes of every new segment in order, and the full
//! `memory_stats()`. Under `compact:True` (our policy), or with `--sequence`, only the trace's
//! allocations and frees are replayed, on a simulated device of the trace's memory.
//!
//! `--fit SIZE` (bytes, or `24GiB`) replays the program on a device of SIZE under the policy
//! of `--alloc-conf` (default: the recorded one) with PyTorch's out-of-memory path, and says
//! whether it fits, which request fails first (with its site when a stack was recorded), the
//! smallest device it fits on under that policy and under each of default, expandable segments
//! and compact (`gpumem_nb::replay::fit`). `--explain` splits the reserved bytes at the
//! reserved peak and at the end into parts that add up (`gpumem_nb::blocks::ReservedParts`).
//!
//! The recorded allocator configuration is, in order: the trace's sidecar `<name>.json`
//! (`alloc_conf`), a snapshot's `allocator_settings`, `GPUMEM_NB_ALLOC_CONF`, the default;
//! `--alloc-conf` replaces it (for `--fit`: it is the policy planned under).
//! `--snapshot DIR` also writes `snapshot.pickle`, `snapshot.json` and `trace_plot.html`.
//! A snapshot with stacks gets `components` (what its memory was, from the frames:
//! `gpumem_nb::replay::components`); `--fit` then adds the table at the peak and the smallest
//! card.
//!
//! Several TRACEs (one per rank of a job: `snapshot_rank0.pickle snapshot_rank1.pickle`, or a
//! directory holding them, as `save_memory_snapshot` writes them in processes with `RANK` set)
//! are replayed one after another, each under its own header, then merged into one report: one
//! line per rank with its allocated and reserved peaks, and across the ranks each peak's least,
//! most, mean and sum with the rank holding the most. With `--json`, an object: `ranks` (each
//! rank's object, with its `rank` from the file name) and `summary`. `--snapshot DIR` then
//! writes into `DIR/rankN`.
//!
//! Bad input is one line on stderr naming the file (and line or event), and exit status 2.

use gpumem_nb::AllocatorConfig;
use gpumem_nb::blocks::ReservedParts;
use gpumem_nb::replay::fit::{self, Program, RunOptions};
use gpumem_nb::replay::{
    DeviceTrace, Recording, ReplayOptions, TraceError, read_recording, replay, replay_sequence, trace_reserved_peak,
};
use gpumem_nb::units::iec;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "usage: gpumem-replay TRACE... [--alloc-conf STR] [--device-total SIZE] [--sequence] [--json] \
                     [--snapshot DIR] [--fit SIZE] [--explain]";

#[derive(Clone)]
struct Args {
    /// The trace being replayed now.
    trace: PathBuf,
    /// Every trace given (one per rank of a job, say), in order.
    traces: Vec<PathBuf>,
    alloc_conf: Option<String>,
    device_total: Option<u64>,
    json: bool,
    sequence: bool,
    snapshot: Option<PathBuf>,
    fit: Option<u64>,
    explain: bool,
}

fn size_arg(it: &mut impl Iterator<Item = String>, opt: &str) -> Result<u64, String> {
    let v = it.next().ok_or(format!("{opt} needs a size (bytes, or e.g. 24GiB)"))?;
    gpumem_nb::units::parse_size(&v).ok_or(format!("{opt}: bad size '{v}' (bytes, or e.g. 24GiB, 512MiB)"))
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        trace: PathBuf::new(),
        traces: Vec::new(),
        alloc_conf: None,
        device_total: None,
        json: false,
        sequence: false,
        snapshot: None,
        fit: None,
        explain: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--json" => a.json = true,
            "--sequence" => a.sequence = true,
            "--explain" => a.explain = true,
            "--snapshot" => a.snapshot = Some(PathBuf::from(it.next().ok_or("--snapshot needs a directory")?)),
            "--alloc-conf" => a.alloc_conf = Some(it.next().ok_or("--alloc-conf needs a value")?),
            "--device-total" => a.device_total = Some(size_arg(&mut it, "--device-total")?),
            "--fit" => a.fit = Some(size_arg(&mut it, "--fit")?),
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with('-') => return Err(format!("unknown option '{s}'")),
            s => {
                // A directory of several ranks' snapshots (and no plain one) is each of them.
                let path = PathBuf::from(s);
                let ranks = gpumem_nb::snapshot::files::rank_files(&path, "snapshot", "pickle");
                if path.is_dir() && !path.join("snapshot.pickle").is_file() && ranks.len() > 1 {
                    a.traces.extend(ranks);
                } else {
                    a.traces.push(path);
                }
            }
        }
    }
    a.trace = a.traces.first().cloned().ok_or("missing TRACE")?;
    Ok(a)
}

/// The `<name>.json` beside `<name>.trace.tsv[.gz]` (or `<name>.pickle`), if any.
fn sidecar(trace: &Path) -> Option<Value> {
    let name = trace.file_name()?.to_str()?;
    let stem = name.split(".trace.").next().filter(|s| *s != name).or_else(|| name.split('.').next())?;
    let path = trace.with_file_name(format!("{stem}.json"));
    if path == trace {
        return None;
    }
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Everything read before replaying.
struct Input {
    rec: Recording,
    path: String,
    /// The configuration the program was recorded under, and where it came from.
    recorded: (String, &'static str),
    /// The configuration to replay (or plan) under, and where it came from.
    conf: (String, &'static str),
    device_total: u64,
}

fn load(args: &Args) -> Result<Input, String> {
    let rec = read_recording(&args.trace).map_err(|e| e.to_string())?;
    let side =
        if rec.kind == gpumem_nb::replay::InputKind::Tsv || args.trace.is_file() { sidecar(&args.trace) } else { None };
    let recorded = if let Some(c) = side.as_ref().and_then(|s| s["alloc_conf"].as_str()) {
        (c.to_string(), "trace sidecar .json")
    } else if let Some(c) = &rec.alloc_conf {
        (c.clone(), "snapshot allocator_settings")
    } else if let Ok(c) = std::env::var(AllocatorConfig::ENV_VAR) {
        (c, "GPUMEM_NB_ALLOC_CONF")
    } else {
        (String::new(), "default")
    };
    let conf = match &args.alloc_conf {
        Some(c) => (c.clone(), "--alloc-conf"),
        None => recorded.clone(),
    };
    let device_total = args
        .device_total
        .or_else(|| side.as_ref().and_then(|s| s["total_memory"].as_u64()))
        .unwrap_or(ReplayOptions::default().device_total);
    Ok(Input { path: args.trace.display().to_string(), rec, recorded, conf, device_total })
}

fn config(conf: &(String, &'static str)) -> Result<AllocatorConfig, String> {
    AllocatorConfig::parse(&conf.0).map_err(|e| format!("{}: {e}", conf.1))
}

/// Replays every trace given: one as before; several (one per rank) each under a header, then
/// one report of them all (text): a line per rank with its peaks, and across the ranks the
/// least, most, mean and sum of each peak and the rank holding the most. With `--json`, an
/// object: `ranks` (each trace's object, as one TRACE gives it, with its `rank` from the file's
/// name, `snapshot_rank3.pickle`, null when it has none) and `summary` ([`summary`]).
fn run_all(args: Args) -> Result<(), String> {
    if args.traces.len() == 1 {
        let (json, text) = run(&args)?;
        if args.json {
            println!("{json}");
        } else {
            print!("{text}");
        }
        return Ok(());
    }
    let mut objects = Vec::new();
    let mut table = String::from("rank  allocated peak   reserved peak   trace\n");
    for (i, trace) in args.traces.iter().enumerate() {
        let rank = gpumem_nb::snapshot::files::rank_of(trace);
        let mut one = args.clone();
        one.trace = trace.clone();
        one.snapshot =
            args.snapshot.as_ref().map(|d| d.join(rank.map_or(format!("trace-{i}"), |r| format!("rank{r}"))));
        let (mut json, text) = run(&one)?;
        json["rank"] = json!(rank);
        if !args.json {
            println!("== rank {}: {}", rank.map_or("?".into(), |r| r.to_string()), trace.display());
            print!("{text}");
        }
        let peak = |k: &str| json[k].as_u64().map_or("?".into(), iec);
        table += &format!(
            "{:<5} {:<16} {:<15} {}\n",
            rank.map_or("?".into(), |r| r.to_string()),
            peak("allocated_peak"),
            peak("reserved_peak"),
            trace.display()
        );
        objects.push(json);
    }
    let (summary, summary_text) = summary(&objects);
    if args.json {
        println!("{}", json!({"ranks": objects, "summary": summary}));
    } else {
        println!("== every rank (device 0 of each)");
        print!("{table}{summary_text}");
    }
    Ok(())
}

/// Across the ranks' objects: for `allocated_peak` and `reserved_peak` (device 0 of each), the
/// least, the most, the mean and the sum, and which rank (its `rank` and `trace`) holds the
/// most; as JSON and as text. The sum adds each rank's own peak: the ranks need not have peaked
/// at the same moment.
fn summary(objects: &[Value]) -> (Value, String) {
    let mut json = json!({"ranks": objects.len()});
    let mut text = String::new();
    for (key, name) in [("allocated_peak", "allocated peak"), ("reserved_peak", "reserved peak")] {
        let figures = objects.iter().enumerate().filter_map(|(i, o)| Some((i, o[key].as_u64()?)));
        let Some(s) = gpumem_nb::stats::spread::Spread::of(figures) else { continue };
        let top = &objects[s.highest];
        let who = top["rank"]
            .as_u64()
            .map_or_else(|| format!("trace {}", top["trace"].as_str().unwrap_or("?")), |r| format!("rank {r}"));
        json[key] = json!({
            "min": s.min, "max": s.max, "mean": s.mean, "sum": s.sum,
            "highest": {"rank": top["rank"], "trace": top["trace"]},
        });
        text += &format!(
            "{name:<15} min {}, max {} ({who}), mean {}, sum {}\n",
            iec(s.min),
            iec(s.max),
            iec(s.mean.round() as u64),
            iec(s.sum)
        );
    }
    json["sum_is"] = json!("each rank's own peak added: the ranks need not have peaked at the same moment");
    text += "                (the sum adds each rank's own peak: they need not have peaked at the same moment)\n";
    (json, text)
}

fn run(args: &Args) -> Result<(Value, String), String> {
    let input = load(args)?;
    let mut devices = Vec::new();
    let mut text = Vec::new();
    for trace in &input.rec.devices {
        let (j, t) = device(args, &input, trace)?;
        devices.push(j);
        text.push(t);
    }
    // The first device's numbers at the top (the fixed interface), every device in `devices`.
    let mut json = json!({
        "trace": input.path,
        "input": input.rec.kind.name(),
        "alloc_conf": input.conf.0,
        "alloc_conf_source": input.conf.1,
    });
    if let (Value::Object(top), Some(Value::Object(first))) = (&mut json, devices.first()) {
        for (k, v) in first {
            top.insert(k.clone(), v.clone());
        }
    }
    json["devices"] = Value::Array(devices);
    let mut out =
        format!("trace           {} ({}, {} device(s))\n", input.path, input.rec.kind.name(), input.rec.devices.len());
    out += &format!("alloc conf      {:?} ({})\n", input.conf.0, input.conf.1);
    for (trace, t) in input.rec.devices.iter().zip(text) {
        if input.rec.devices.len() > 1 {
            out += &format!("-- device {}\n", trace.device);
        }
        out += &t;
    }
    Ok((json, out))
}

/// Replays (and plans, explains) one device; its JSON object and its text.
fn device(args: &Args, input: &Input, trace: &DeviceTrace) -> Result<(Value, String), String> {
    let recorded = config(&input.recorded)?;
    let conf = config(&input.conf)?;
    let events = &trace.events;
    let opts =
        ReplayOptions { config: conf.clone(), device_total: input.device_total, keep_history: args.snapshot.is_some() };
    let mut out = json!({"device_index": trace.device});
    let snap_input = input.rec.kind != gpumem_nb::replay::InputKind::Tsv;
    let err = |e: gpumem_nb::replay::TraceError| {
        let e = gpumem_nb::replay::TraceError { path: input.path.clone(), ..e };
        if snap_input { e.on_device(trace.device).to_string() } else { e.to_string() }
    };
    let mut text = String::new();
    let sequence = conf.compact || args.sequence;
    // The exact replay, under the recorded policy (unless that is not PyTorch's): it says where
    // the program called empty_cache().
    let exact = if recorded.compact || (sequence && !args.explain && args.fit.is_none()) {
        None
    } else {
        let o =
            ReplayOptions { config: recorded.clone(), keep_history: opts.keep_history && !sequence, ..opts.clone() };
        Some(replay(events, &o, &input.path).map_err(err)?)
    };
    if sequence {
        let r = replay_sequence(events, &opts, &input.path).map_err(err)?;
        let files = write_snapshot(args, trace.device, || r.snapshot())?;
        merge(
            &mut out,
            json!({
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
            }),
        );
        let pct = |x: i64, of: u64| 100.0 * (x as f64 / of.max(1) as f64 - 1.0);
        text += &format!("events          {} (allocations and frees only)\n", r.events);
        text += &format!("device          simulated, {}\n", iec(opts.device_total));
        text += &format!("requested peak  {} ({} bytes)\n", iec(r.requested_peak as u64), r.requested_peak);
        text += &format!("allocated peak  {} ({} bytes)\n", iec(r.allocated_peak as u64), r.allocated_peak);
        text += &format!(
            "reserved peak   {} ({} bytes, {:+.2} % over requested)\n",
            iec(r.reserved_peak as u64),
            r.reserved_peak,
            pct(r.reserved_peak, r.requested_peak as u64)
        );
        text += &format!(
            "PyTorch         {} reserved in the trace; ours is {:.4} of it\n",
            iec(r.pytorch_reserved_peak),
            r.reserved_ratio()
        );
        text += &format!("device maps     {}   unmaps {}\n", r.num_device_alloc, r.num_device_free);
        if r.failed_allocs + r.skipped_ooms > 0 {
            text += &format!("not placed      {} (and {} oom lines skipped)\n", r.failed_allocs, r.skipped_ooms);
        }
        if let Some(f) = &files {
            text += &format!("snapshot        {}\n", f.pickle.display());
        }
    } else if let Some(r) = &exact {
        let files = write_snapshot(args, trace.device, || r.snapshot())?;
        let pytorch_peak = trace_reserved_peak(events);
        merge(
            &mut out,
            json!({
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
            }),
        );
        text += &format!("events          {}\n", r.events);
        text += &format!("allocated peak  {} ({} bytes)\n", iec(r.allocated_peak as u64), r.allocated_peak);
        text += &format!("reserved peak   {} ({} bytes)\n", iec(r.reserved_peak as u64), r.reserved_peak);
        text += &format!("device allocs   {}   device frees {}\n", r.num_device_alloc, r.num_device_free);
        text += &format!(
            "segments        {} new, {} the trace's sizes in order\n",
            r.segment_sizes.len(),
            if r.segment_sizes == r.trace_segment_sizes { "matching" } else { "NOT matching" }
        );
        match &r.first_divergence {
            None => text += "divergences     none: every device event matches the trace\n",
            Some(d) => text += &format!("divergences     {} (first: {d})\n", r.divergences),
        }
        if let Some(f) = &files {
            text += &format!(
                "snapshot        {}\n                {}\n                {}\n",
                f.pickle.display(),
                f.json.display(),
                f.html.display()
            );
        }
    }
    if !trace.foreign.is_empty() {
        let p = trace.source_peaks();
        out["sources"] = json!({"allocator_reserved_peak": p.allocator, "others_peak": p.others, "all_peak": p.all});
        let others: Vec<String> = p.others.iter().map(|(k, v)| format!("{k} {}", iec(*v))).collect();
        text += &format!(
            "other sources   {} (peaks, as recorded); all sources together peaked at {}\n",
            others.join(", "),
            iec(p.all)
        );
    }
    if trace.skipped > 0 {
        out["skipped_entries"] = json!(trace.skipped);
    }
    // What the memory was, by component, where the snapshot has Python stacks to tell.
    let peak = gpumem_nb::replay::components::peak_parts(trace);
    let parts = &peak.components;
    if snap_input && trace.info.iter().any(|i| i.as_ref().is_some_and(|i| !i.frames.is_empty())) {
        out["components"] = Value::Object(parts.iter().map(|(c, b)| (c.key().to_string(), json!(b))).collect());
        text += "components      at the end / at the peak / own peak (bytes requested, from the stacks)\n";
        for (c, b) in parts {
            text += &format!("  {:<14}{:>12} {:>12} {:>12}\n", c.key(), iec(b.end), iec(b.at_peak), iec(b.peak));
        }
    }
    let program = Program::new(
        trace,
        exact.as_ref().map(|r| r.empty_cache_before.clone()).unwrap_or_default(),
        input.device_total,
    );
    if args.explain {
        let (j, t) = explain(&program, &conf).map_err(err)?;
        out["explain"] = j;
        text += &t;
    }
    if let Some(size) = args.fit {
        let stacks = out.get("components").is_some();
        let (j, t) =
            plan(&program, &conf, &input.conf.0, size, if snap_input { "event" } else { "line" }).map_err(err)?;
        merge(&mut out, j);
        text += &t;
        let (j, t) = by_card(
            parts,
            stacks,
            peak.before_recording_at_peak,
            &input.conf,
            out["min_device_bytes"].as_u64().unwrap_or(0),
        );
        merge(&mut out, j);
        text += &t;
    }
    Ok((out, text))
}

/// `--fit`'s table of what the peak is made of (the same as `%gpumem fit`'s: by component where
/// the snapshot's stacks tell, rounding and cache, the CUDA context a snapshot does not have) and
/// the smallest card of `CARDS_GB` that holds the smallest device the program fits on.
fn by_card(
    parts: &std::collections::BTreeMap<gpumem_nb::Component, gpumem_nb::replay::components::ComponentBytes>,
    stacks: bool,
    before: u64,
    (conf, from): &(String, &str),
    min_device: u64,
) -> (Value, String) {
    let none = std::collections::BTreeMap::new();
    let policy = if conf.is_empty() {
        "PyTorch's default policy".to_string()
    } else {
        format!("the policy {conf:?} (from {from})")
    };
    let context = Err("not in the recording: NVML shows it on the card (300-600 MiB)");
    let table =
        gpumem_nb::plan::component_table(if stacks { parts } else { &none }, before, &policy, min_device, context);
    let caption =
        if stacks { "what the peak is made of" } else { "what the peak is made of (no Python stacks: no components)" };
    let text = format!("{}\n", table.caption(caption).to_text());
    let card = gpumem_nb::plan::smallest_card(min_device);
    (json!({"smallest_card_gb": card.map(|c| c.0), "cards_gb": gpumem_nb::plan::CARDS_GB}), text)
}

fn merge(out: &mut Value, add: Value) {
    if let (Value::Object(o), Value::Object(a)) = (out, add) {
        o.extend(a);
    }
}

/// `--explain`: the reserved bytes' parts at the reserved peak and at the end.
fn explain(program: &Program<'_>, conf: &AllocatorConfig) -> Result<(Value, String), TraceError> {
    let events = &program.trace().events;
    let first = fit::run(program, conf, None)?;
    let peak = first.reserved_peak_event.unwrap_or(0);
    let r = fit::run_with(program, conf, &RunOptions { capacity: None, explain_at: vec![peak, events.len()] })?;
    // The next large (> 1 MiB) request after the peak: can the cache serve it?
    let next = events[peak + 1..].iter().find(|e| e.action == gpumem_nb::TraceAction::Alloc && e.size > 1 << 20);
    let mut j = json!({});
    let mut text = String::new();
    for (at, parts) in &r.explained {
        let (key, title) = if *at == peak {
            ("at_reserved_peak", format!("at the reserved peak (after event {})", events[*at].line))
        } else {
            ("at_end", "at the end".to_string())
        };
        let mut o =
            json!({"event": events.get(*at).map(|e| e.line), "parts": parts, "kept_by_live_segments": parts.kept()});
        text += &format!("explained       {title}\n{}", parts_text(parts));
        if *at == peak
            && let Some(n) = next
        {
            o["next_large_request"] =
                json!({"event": n.line, "size": n.size, "served_from_cache": parts.serves(n.size)});
            text += &format!(
                "                next large request: {} (event {}), {} from the cache (largest free block {})\n",
                iec(n.size),
                n.line,
                if parts.serves(n.size) { "can be served" } else { "cannot be served" },
                iec(parts.largest_free_large)
            );
        }
        j[key] = o;
    }
    j["policy"] = json!(if conf.compact {
        "compact"
    } else if conf.expandable_segments {
        "expandable"
    } else {
        "default"
    });
    Ok((j, text))
}

fn parts_text(p: &ReservedParts) -> String {
    let mut t = format!(
        "                reserved {} = requested {} + rounding {} + pending frees {} + cached free {}\n",
        iec(p.reserved),
        iec(p.requested),
        iec(p.rounding),
        iec(p.pending_free),
        iec(p.cached_bytes())
    );
    for c in &p.cached {
        t += &format!(
            "                  cached {} pool {:<22} {:>6} blocks {:>12}\n",
            c.pool,
            c.label(),
            c.blocks,
            iec(c.bytes)
        );
    }
    t += &format!(
        "                empty_cache() would return {}; {} stays (free space in segments with live blocks)\n",
        iec(p.releasable),
        iec(p.kept())
    );
    t
}

/// `--fit SIZE`: the run on SIZE, the smallest device under the chosen policy, and the smallest
/// under each of the three policies.
fn plan(
    program: &Program<'_>,
    conf: &AllocatorConfig,
    conf_text: &str,
    size: u64,
    event_word: &str,
) -> Result<(Value, String), TraceError> {
    let r = fit::run(program, conf, Some(size))?;
    let search = fit::min_device(program, conf)?;
    let mut by_policy = serde_json::Map::new();
    let mut table = String::new();
    for (name, c) in fit::POLICIES {
        let pc = AllocatorConfig::parse(c).map_err(|e| TraceError::file("", e.to_string()))?;
        let s = if c == conf_text { search.clone() } else { fit::min_device(program, &pc)? };
        table += &format!(
            "                {name:<11} {:>12} smallest device   (on a larger device it reserves {} at its peak)\n",
            iec(s.min_device_bytes),
            iec(s.unconstrained.reserved_peak)
        );
        by_policy.insert(
            name.to_string(),
            json!({"alloc_conf": c, "min_device_bytes": s.min_device_bytes, "unconstrained_reserved_peak": s.unconstrained.reserved_peak}),
        );
    }
    let j = json!({
        "fit": {"device_bytes": size, "policy": conf_text, "device_peak": r.device_peak, "allocated_peak": r.allocated_peak,
                "requested_peak": r.requested_peak, "failures": r.failures, "num_alloc_retries": r.num_alloc_retries,
                "skipped_ooms": r.skipped_ooms, "search": {"does_not_fit": search.does_not_fit, "live_peak": search.live_peak,
                "granularity": gpumem_nb::device::sim::GRANULARITY, "probes": search.probes, "assumes": "fitting is monotone in the device size"},
                "min_device_by_policy": by_policy,
                "modelled": "the program's allocations and frees, its empty_cache() calls, other sources' tracked allocations at 2 MiB granularity, PyTorch's out-of-memory path",
                "not_modelled": "the CUDA context, other processes, NCCL and other untracked library memory, the CUDA pool's own caching, CUDA graphs"},
        "fits": r.fits,
        "first_failure": r.first_failure,
        "min_device_bytes": search.min_device_bytes,
        "reserved_peak": r.reserved_peak,
    });
    let mut text = format!(
        "fit             on {}: {} (reserved peak {}, device peak {})\n",
        iec(size),
        if r.fits { "fits".to_string() } else { format!("does NOT fit, {} request(s) fail", r.failures) },
        iec(r.reserved_peak),
        iec(r.device_peak)
    );
    if let Some(f) = &r.first_failure {
        text += &format!(
            "first failure   {event_word} {}: {} on stream {} ({}){}\n",
            f.event,
            iec(f.size),
            f.stream,
            f.source,
            f.site.as_ref().or(f.label.as_ref()).map_or(String::new(), |s| format!(" at {s}"))
        );
    }
    text += &format!(
        "smallest device {} under {:?} (2 MiB less does not fit; {} sizes replayed)\n",
        iec(search.min_device_bytes),
        conf_text,
        search.probes.len()
    );
    text += "by policy\n";
    text += &table;
    text += "                not modelled: the CUDA context, other processes, NCCL and untracked library memory\n";
    Ok((j, text))
}

/// Writes `--snapshot DIR`'s files (`DIR/device-N` for devices other than 0), when asked for.
fn write_snapshot(
    args: &Args,
    device: i32,
    snapshot: impl FnOnce() -> gpumem_nb::snapshot::Snapshot,
) -> Result<Option<gpumem_nb::render::SnapshotFiles>, String> {
    let dir = args.snapshot.as_ref().map(|d| if device == 0 { d.clone() } else { d.join(format!("device-{device}")) });
    dir.map(|dir| snapshot().save(&dir).map_err(|e| e.to_string())).transpose()
}

/// The snapshot's files as JSON, if one was written.
fn files_json(files: Option<&gpumem_nb::render::SnapshotFiles>) -> Value {
    files.map_or(Value::Null, |f| json!({"pickle": f.pickle, "json": f.json, "html": f.html}))
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
        Ok(args) => match run_all(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gpumem-replay: {e}");
                ExitCode::from(2)
            }
        },
    }
}
