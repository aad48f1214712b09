//! Runs the scripted cases of PyTorch's allocator probe
//! (`shared/reference/pytorch_golden/probe.py`) on gpumem-nb, and writes the results in exactly
//! the probe's JSON shape, so that `scripts/gpu/compare_probe.py` can put them next to
//! PyTorch's own, measured in the same run on the same GPU (`scripts/gpu/probe_compare.sh`).
//!
//! ```text
//! gpu_probe [--out FILE] [--device SEL]   all cases, each in a fresh process (default: cuda)
//! gpu_probe --case NAME                   one case; prints `@@RESULT@@{json}`
//! ```
//!
//! Like probe.py, every case runs in a process of its own, because the allocator configuration
//! (`GPUMEM_NB_ALLOC_CONF`, PyTorch's `PYTORCH_CUDA_ALLOC_CONF`) is read once per process: the
//! example re-executes itself with `--case NAME` and the case's configuration. `--device` sets
//! `GPUMEM_NB_DEVICE` for the cases (`cuda` by default; `sim:150109880320` replays the probe on
//! the simulated device with the H200's capacity, which must reproduce the golden results).
//!
//! Where probe.py calls `torch.cuda.memory._snapshot()` (segment summaries, traces) this calls
//! [`gpumem_nb::Allocator::snapshot`], which records the same "snapshot" trace events.
//! `torch.cuda._sleep` on the side stream becomes a sleeping host function on that stream
//! (`CudaBackend::sleep_on_stream`); on the simulated device the stream is marked busy.

use gpumem_nb::blocks::BlockId;
use gpumem_nb::{AllocError, Allocator, HistoryOptions, RecordMode, StackContext, StreamId};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

/// The probe's cases with their configuration (probe.py's `TESTS`, less "snapshot": the pickle
/// and PyTorch's viewer are checked by `tests/snapshot.rs` and the GPU check).
const CASES: [(&str, &str); 11] = [
    ("basic", ""),
    ("sizes", ""),
    ("streams", ""),
    ("oom", ""),
    ("expandable", "expandable_segments:True"),
    ("roundup", "roundup_power2_divisions:4"),
    ("roundup_list", "roundup_power2_divisions:[256:1,512:2,>:8]"),
    ("maxsplit", "max_split_size_mb:64"),
    ("state_only", ""),
    ("gc", "garbage_collection_threshold:0.5"),
    // Not in probe.py: its PyTorch side is scripts/gpu/leave_free_torch.py.
    ("leave_free", ""),
];

include!("../tests/common/probe_key_stats.rs");

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A scripted session shaped like probe.py: named tensors on the current stream, checkpoints.
struct Probe {
    alloc: Arc<Allocator>,
    live: HashMap<String, BlockId>,
    stream: StreamId,
    checkpoints: Vec<Value>,
}

impl Probe {
    fn new() -> Res<Self> {
        let alloc = gpumem_nb::current()?;
        Ok(Probe { alloc, live: HashMap::new(), stream: StreamId::DEFAULT, checkpoints: Vec::new() })
    }

    fn check(&self, what: &str) -> Res<()> {
        self.alloc.check_invariants().map_err(|e| format!("invariant broken after {what}: {e}").into())
    }

    /// `name = torch.empty(n, dtype=torch.uint8, device="cuda")` on the current stream.
    fn empty(&mut self, name: &str, n: u64) -> Res<()> {
        let block = self.try_empty(n)?.map_err(|e| format!("malloc {n}: {e}"))?;
        self.live.insert(name.to_string(), block);
        Ok(())
    }

    /// A malloc whose failure (out of memory) is a result of the case, not an error.
    fn try_empty(&mut self, n: u64) -> Res<Result<BlockId, AllocError>> {
        let r = self.alloc.malloc(n, self.stream);
        self.check(&format!("malloc {n}"))?;
        match r {
            Ok(a) => Ok(Ok(a.block.ok_or("a zero-byte block")?)),
            Err(e @ AllocError::OutOfMemory(_)) => Ok(Err(e)),
            Err(e) => Err(e.into()),
        }
    }

    /// `del name`.
    fn del(&mut self, name: &str) -> Res<()> {
        let b = self.live.remove(name).ok_or_else(|| format!("no tensor {name}"))?;
        self.alloc.free(b)?;
        self.check(&format!("del {name}"))
    }

    fn key_stats(&self) -> Value {
        let s = self.alloc.memory_stats();
        Value::Object(KEY_STATS.iter().map(|k| (k.to_string(), json!(s.get(*k)))).collect())
    }

    fn full_stats(&self) -> Value {
        Value::Object(self.alloc.memory_stats().into_iter().map(|(k, v)| (k, json!(v))).collect())
    }

    fn stats_nz(&self) -> Value {
        Value::Object(
            self.alloc.memory_stats().into_iter().filter(|(_, v)| *v != 0).map(|(k, v)| (k, json!(v))).collect(),
        )
    }

    /// probe.py's `seg_summary`, from a snapshot (which records a "snapshot" event, as
    /// `torch.cuda.memory._snapshot()` does).
    fn seg_summary(&self) -> Value {
        let snap = self.alloc.snapshot();
        Value::Array(
            snap.segments
                .iter()
                .map(|s| {
                    json!({
                        "off": null, "total_size": s.total_size, "type": s.segment_type, "alloc": s.allocated_size,
                        "active": s.active_size, "req": s.requested_size, "stream": s.stream != 0,
                        "exp": s.is_expandable,
                        "blocks": s.blocks.iter()
                            .map(|b| json!([b.size, b.requested_size, b.state, b.address - s.address]))
                            .collect::<Vec<_>>(),
                    })
                })
                .collect(),
        )
    }

    /// `c(label)`.
    fn c(&mut self, label: &str) {
        let cp = json!({"label": label, "stats": self.key_stats(), "segs": self.seg_summary()});
        self.checkpoints.push(cp);
    }

    /// A snapshot's trace and allocator settings (one `_snapshot()` call).
    fn trace_and_settings(&self) -> Res<(Value, Value)> {
        let snap = self.alloc.snapshot();
        Ok((trace_of(&snap)?, serde_json::to_value(&snap.allocator_settings)?))
    }

    fn trace(&self) -> Res<Value> {
        Ok(self.trace_and_settings()?.0)
    }

    /// `torch.cuda.memory._record_memory_history(max_entries=1000, context=None)`.
    fn record_history(&self) {
        self.alloc.record_memory_history(RecordMode::All, 1000);
    }

    /// `with torch.cuda.stream(s): torch.cuda._sleep(...)`: keeps `s` busy for about a second.
    fn keep_busy(&self, s: StreamId) -> Res<()> {
        self.alloc.with_backend(|b| -> Res<()> {
            if let Some(sim) = b.as_sim_mut() {
                sim.set_stream_busy(s, true);
                return Ok(());
            }
            #[cfg(feature = "cuda")]
            if let Some(cuda) = b.as_cuda_mut() {
                cuda.sleep_on_stream(s, std::time::Duration::from_secs(1))?;
                return Ok(());
            }
            Err("no way to keep a stream busy on this backend".into())
        })
    }

    /// `torch.cuda.synchronize()`.
    fn synchronize(&self) -> Res<()> {
        self.alloc.with_backend(|b| -> Res<()> {
            if let Some(sim) = b.as_sim_mut() {
                sim.synchronize();
                return Ok(());
            }
            #[cfg(feature = "cuda")]
            if let Some(cuda) = b.as_cuda() {
                return cuda.context().synchronize().map_err(|e| format!("cuCtxSynchronize: {:?}", e.0).into());
            }
            Err("no way to synchronize this backend".into())
        })
    }
}

type R = Map<String, Value>;

/// The trace of device 0 as probe.py keeps it: PyTorch's keys, without frames.
fn trace_of(snap: &gpumem_nb::snapshot::Snapshot) -> Res<Value> {
    let mut out = Vec::new();
    for e in snap.device_traces.first().into_iter().flatten() {
        let mut v = serde_json::to_value(e)?;
        if let Some(o) = v.as_object_mut() {
            o.remove("frames");
        }
        out.push(v);
    }
    Ok(Value::Array(out))
}

fn t_basic(p: &mut Probe, r: &mut R) -> Res<()> {
    r.insert("full_keys_initial".into(), json!(p.alloc.memory_stats().keys().collect::<Vec<_>>()));
    p.empty("a", 1)?;
    p.c("a=1B");
    r.insert("full_stats_after_1B".into(), p.full_stats());
    p.empty("b", MIB)?;
    p.c("b=1MiB");
    p.empty("cc", MIB + 1)?;
    p.c("c=1MiB+1");
    p.empty("d", 10 * MIB)?;
    p.c("d=10MiB");
    p.empty("e", 11_000_000)?;
    p.c("e=11000000");
    p.del("cc")?;
    p.c("del c");
    p.empty("f", 1_000_000)?;
    p.c("f=1000000");
    p.empty("g", 3 * MIB)?;
    p.c("g=3MiB");
    for t in ["a", "b", "d", "e", "f", "g"] {
        p.del(t)?;
    }
    p.c("del all");
    r.insert("summary_full".into(), json!(p.alloc.memory_summary(false)));
    r.insert("summary_abbrev".into(), json!(p.alloc.memory_summary(true)));
    r.insert("stats_before_empty".into(), p.full_stats());
    p.alloc.empty_cache()?;
    p.check("empty_cache")?;
    p.c("empty_cache");
    r.insert("stats_after_empty".into(), p.stats_nz());
    p.alloc.reset_peak_memory_stats();
    r.insert("after_reset_peak".into(), p.stats_nz());
    p.alloc.reset_accumulated_memory_stats();
    r.insert("after_reset_accum".into(), p.stats_nz());
    r.insert("checkpoints".into(), Value::Array(std::mem::take(&mut p.checkpoints)));
    Ok(())
}

fn t_sizes(p: &mut Probe, r: &mut R) -> Res<()> {
    let mut res = Vec::new();
    for n in [
        1,
        511,
        512,
        513,
        1000,
        4096,
        1048575,
        1048576,
        1048577,
        2 * MIB,
        5 * MIB,
        10 * MIB - 1,
        10 * MIB,
        10 * MIB + 1,
        11_000_000,
        20 * MIB,
        21 * MIB,
        100 * MIB + 7,
    ] {
        p.empty("x", n)?;
        let s = p.key_stats();
        res.push(json!({
            "n": n, "allocated": s["allocated_bytes.all.current"], "reserved": s["reserved_bytes.all.current"],
            "inactive_split_bytes": s["inactive_split_bytes.all.current"], "segs": p.seg_summary(),
        }));
        p.del("x")?;
        p.alloc.empty_cache()?;
        p.check("empty_cache")?;
    }
    r.insert("sizes".into(), Value::Array(res));
    Ok(())
}

fn t_streams(p: &mut Probe, r: &mut R) -> Res<()> {
    let s1 = p.alloc.new_stream()?;
    p.empty("a", 4 * MIB)?;
    p.del("a")?;
    p.stream = s1;
    p.empty("b", 4 * MIB)?;
    p.stream = StreamId::DEFAULT;
    r.insert("after_two_streams".into(), p.key_stats());
    r.insert("segs_two_streams".into(), p.seg_summary());
    p.del("b")?;
    p.record_history();
    p.empty("c", 4 * MIB)?;
    p.keep_busy(s1)?;
    p.alloc.record_stream(p.live["c"], s1)?;
    p.del("c")?;
    r.insert("after_record_stream_free".into(), p.key_stats());
    r.insert("segs_pending".into(), p.seg_summary());
    p.synchronize()?;
    p.empty("d", 1)?;
    r.insert("after_sync_and_malloc".into(), p.key_stats());
    r.insert("segs_after".into(), p.seg_summary());
    r.insert("trace".into(), p.trace()?);
    Ok(())
}

fn t_oom(p: &mut Probe, r: &mut R) -> Res<()> {
    p.record_history();
    p.empty("keep", 3 * MIB)?;
    p.empty("tmp", 50 * MIB)?;
    p.del("tmp")?;
    if let Err(e) = p.try_empty(1 << 40)? {
        r.insert("oom_msg".into(), json!(e.to_string()));
    }
    r.insert("stats_after_oom".into(), p.key_stats());
    r.insert("trace".into(), p.trace()?);
    let (free, total) = p.alloc.mem_get_info()?;
    r.insert("mem_get_info".into(), json!([free, total]));
    r.insert("total_memory".into(), json!(p.alloc.with_backend(|b| gpumem_nb::Backend::total_memory(b))));
    p.alloc.empty_cache()?;
    p.alloc.set_per_process_memory_fraction(0.0)?;
    if let Err(e) = p.try_empty(1)? {
        r.insert("oom_msg_fraction0_1byte".into(), json!(e.to_string()));
    }
    p.alloc.set_per_process_memory_fraction(0.01)?;
    // `torch.empty(5 * MiB, ...)` unassigned: freed at once; then 4 GiB, over the 1.4 GiB allowed.
    match p.try_empty(5 * MIB)? {
        Ok(b) => {
            p.alloc.free(b)?;
            p.check("free of the 5 MiB temporary")?;
            r.insert("frac001_5MiB".into(), json!("ok"));
            if let Err(e) = p.try_empty(4 << 30)? {
                r.insert("oom_msg_fraction001".into(), json!(e.to_string()));
            }
        }
        Err(e) => {
            r.insert("oom_msg_fraction001".into(), json!(e.to_string()));
        }
    }
    r.insert("stats_end".into(), p.key_stats());
    r.insert("get_fraction".into(), json!(p.alloc.get_per_process_memory_fraction()));
    Ok(())
}

fn t_expandable(p: &mut Probe, r: &mut R) -> Res<()> {
    p.record_history();
    p.empty("a", 1)?;
    p.c("a=1B");
    p.empty("b", 5 * MIB)?;
    p.c("b=5MiB");
    p.empty("cc", 30 * MIB)?;
    p.c("c=30MiB");
    p.empty("d", 3 * MIB)?;
    p.c("d=3MiB");
    p.del("b")?;
    p.c("del b");
    for t in ["a", "cc", "d"] {
        p.del(t)?;
    }
    p.c("del all");
    p.alloc.empty_cache()?;
    p.check("empty_cache")?;
    p.c("empty_cache");
    let (trace, settings) = p.trace_and_settings()?;
    r.insert("trace".into(), trace);
    r.insert("checkpoints".into(), Value::Array(std::mem::take(&mut p.checkpoints)));
    r.insert("allocator_settings".into(), settings);
    Ok(())
}

fn t_roundup(p: &mut Probe, r: &mut R) -> Res<()> {
    let mut res = Vec::new();
    for n in [1200, 2048, 2049, 3000, 1_000_000, 1_500_000, 5_000_000, 70_000_000] {
        p.empty("x", n)?;
        let s = p.key_stats();
        res.push(
            json!({"n": n, "allocated": s["allocated_bytes.all.current"], "reserved": s["reserved_bytes.all.current"]}),
        );
        p.del("x")?;
        p.alloc.empty_cache()?;
    }
    r.insert("roundup".into(), Value::Array(res));
    Ok(())
}

fn t_maxsplit(p: &mut Probe, r: &mut R) -> Res<()> {
    p.empty("a", 100 * MIB)?;
    p.c("a=100MiB");
    p.del("a")?;
    p.c("del a");
    p.empty("b", 85 * MIB)?;
    p.c("b=85MiB (reuse 100MiB?)");
    p.empty("d", 30 * MIB)?;
    p.c("d=30MiB");
    p.del("b")?;
    p.empty("e", 70 * MIB)?;
    p.c("e=70MiB (100MiB cached; 100>=70+20 so no)");
    r.insert("checkpoints".into(), Value::Array(std::mem::take(&mut p.checkpoints)));
    Ok(())
}

fn t_state_only(p: &mut Probe, r: &mut R) -> Res<()> {
    // enabled="state", context="state": one trace entry, stacks on live blocks.
    p.alloc.record_memory_history_with(HistoryOptions {
        enabled: RecordMode::State,
        context: StackContext::State,
        max_entries: usize::MAX,
    });
    p.empty("a", 1000)?;
    p.empty("b", 2000)?;
    p.del("b")?;
    let s = p.alloc.snapshot();
    r.insert("n_trace".into(), json!(s.device_traces.iter().map(|t| t.len()).collect::<Vec<_>>()));
    r.insert("trace".into(), trace_of(&s)?);
    let states: Vec<Value> =
        s.segments.iter().flat_map(|seg| seg.blocks.iter().map(|b| json!([b.size, b.state, b.frames.len()]))).collect();
    r.insert("block_states".into(), Value::Array(states));
    r.insert("seg_frames".into(), json!(s.segments.iter().map(|seg| seg.frames.len()).collect::<Vec<_>>()));
    Ok(())
}

fn t_gc(p: &mut Probe, r: &mut R) -> Res<()> {
    p.alloc.set_per_process_memory_fraction(0.04)?;
    r.insert("allowed".into(), json!(p.alloc.allowed_bytes()));
    for i in 0..3 {
        p.empty(&format!("x{i}"), 1 << 30)?;
    }
    for i in 0..3 {
        p.del(&format!("x{i}"))?;
    }
    r.insert("before".into(), p.key_stats());
    p.empty("y", 3 << 29)?;
    r.insert("after".into(), p.key_stats());
    r.insert("segs".into(), p.seg_summary());
    Ok(())
}

/// ipyexperiments' `gpu_mem_leave_free_mbs(2048)` on a real card, then an OOM just over what
/// is left, an allocation that fits, and the release (scripts/gpu/leave_free_torch.py is
/// PyTorch's side).
fn t_leave_free(p: &mut Probe, r: &mut R) -> Res<()> {
    let n: u64 = 2048;
    let free = |p: &Probe| -> Res<u64> { Ok(p.alloc.mem_get_info()?.0) };
    r.insert("n_mib".into(), json!(n));
    r.insert("free_before".into(), json!(free(p)?));
    let filler = gpumem_nb::mem::leave_free_mib_on(&p.alloc, n)?;
    p.check("leave_free_mib")?;
    r.insert("filler_bytes".into(), json!(filler.filled));
    r.insert("free_after_fill".into(), json!(free(p)?));
    r.insert("after_fill".into(), p.key_stats());
    r.insert("segs_fill".into(), p.seg_summary());
    match p.try_empty((n + 2) * MIB)? {
        Err(e) => r.insert("oom_msg".into(), json!(e.to_string())),
        Ok(b) => {
            p.alloc.free(b)?;
            r.insert("oom_msg".into(), Value::Null)
        }
    };
    r.insert("after_oom".into(), p.key_stats());
    p.empty("half", n / 2 * MIB)?;
    r.insert("after_half".into(), p.key_stats());
    r.insert("free_after_half".into(), json!(free(p)?));
    p.del("half")?;
    drop(filler);
    p.alloc.empty_cache()?;
    p.check("release")?;
    r.insert("after_release".into(), p.key_stats());
    r.insert("free_end".into(), json!(free(p)?));
    Ok(())
}

/// The device, for the results' `info`.
fn info(r: &mut R) -> Res<()> {
    let alloc = gpumem_nb::current()?;
    r.insert("gpumem_nb".into(), json!(env!("CARGO_PKG_VERSION")));
    r.insert("backend".into(), json!(alloc.backend_kind().name()));
    r.insert("total_memory".into(), json!(alloc.with_backend(|b| gpumem_nb::Backend::total_memory(b))));
    #[cfg(feature = "cuda")]
    {
        let name = alloc.with_backend(|b| b.as_cuda().map(|c| c.context().name().map_err(|e| format!("{:?}", e.0))));
        if let Some(name) = name {
            r.insert("device".into(), json!(name?));
        }
    }
    r.entry("device").or_insert_with(|| json!(format!("{} device", alloc.backend_kind().name())));
    Ok(())
}

/// One case in this process: prints `@@RESULT@@{json}` like probe.py's child.
fn child(name: &str) {
    let mut r = R::new();
    r.insert("test".into(), json!(name));
    r.insert("conf".into(), json!(std::env::var("GPUMEM_NB_ALLOC_CONF").unwrap_or_default()));
    let run = |r: &mut R| -> Res<()> {
        if name == "info" {
            return info(r);
        }
        let mut p = Probe::new()?;
        match name {
            "basic" => t_basic(&mut p, r),
            "sizes" => t_sizes(&mut p, r),
            "streams" => t_streams(&mut p, r),
            "oom" => t_oom(&mut p, r),
            "expandable" => t_expandable(&mut p, r),
            "roundup" | "roundup_list" => t_roundup(&mut p, r),
            "maxsplit" => t_maxsplit(&mut p, r),
            "state_only" => t_state_only(&mut p, r),
            "gc" => t_gc(&mut p, r),
            "leave_free" => t_leave_free(&mut p, r),
            other => Err(format!("unknown case {other:?}").into()),
        }
    };
    if let Err(e) = run(&mut r) {
        r.insert("error".into(), json!(e.to_string()));
    }
    println!("@@RESULT@@{}", Value::Object(r));
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    if let Some(name) = opt("--case") {
        child(&name);
        return Ok(());
    }
    let out = opt("--out").unwrap_or_else(|| "gpu_probe_results.json".into());
    let device = opt("--device").unwrap_or_else(|| "cuda".into());
    let exe = std::env::current_exe()?;
    let mut results = R::new();
    for (name, conf) in std::iter::once(("info", "")).chain(CASES) {
        let mut cmd = Command::new(&exe);
        cmd.args(["--case", name]).env("GPUMEM_NB_DEVICE", &device).env_remove("GPUMEM_NB_ALLOC_CONF");
        if !conf.is_empty() {
            cmd.env("GPUMEM_NB_ALLOC_CONF", conf);
        }
        let o = cmd.output()?;
        let stdout = String::from_utf8_lossy(&o.stdout);
        let v = match stdout.lines().find_map(|l| l.strip_prefix("@@RESULT@@")) {
            Some(line) => serde_json::from_str(line)?,
            None => {
                let tail = |s: &[u8]| {
                    let s = String::from_utf8_lossy(s);
                    s.chars().rev().take(3000).collect::<Vec<_>>().into_iter().rev().collect::<String>()
                };
                json!({"rc": o.status.code(), "stdout": tail(&o.stdout), "stderr": tail(&o.stderr)})
            }
        };
        let failed = v.get("error").is_some() || v.get("rc").is_some();
        println!("{name} done {}", if failed { "True" } else { "False" });
        if failed {
            eprintln!("{name}: {}", v.get("error").unwrap_or(&v));
        }
        results.insert(name.to_string(), v);
    }
    std::fs::write(&out, serde_json::to_string_pretty(&Value::Object(results))?)?;
    println!("wrote {out}");
    Ok(())
}
