//! Conformance with PyTorch 2.11, measured on an H200 (`tests/fixtures/probe_results_*.json`,
//! produced by `scripts/gpu/probe.py`). Each test replays one of the
//! probe's scripted sequences on the simulated device and compares, at every checkpoint the
//! probe recorded, the same statistics and the same segment/block layout (the probe's cases
//! A–I and K). Invariants are recounted after every step.

use gpumem_nb::blocks::BlockId;
use gpumem_nb::device::sim::SimBackend;
use gpumem_nb::units::MIB;
use gpumem_nb::{AllocError, AllocatorConfig, CachingAllocator, RecordMode, StreamId, TraceAction};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

fn golden() -> &'static Value {
    static G: OnceLock<Value> = OnceLock::new();
    G.get_or_init(|| {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/probe_results_torch2.11_h200.json");
        serde_json::from_str(&std::fs::read_to_string(p).expect("golden probe results")).expect("json")
    })
}

/// The H200's total memory in the probe run.
fn h200_total() -> u64 {
    golden()["info"]["total_memory"].as_u64().unwrap()
}

include!("common/probe_key_stats.rs");

/// A scripted session, shaped like probe.py: named tensors and checkpoints.
struct Probe {
    alloc: Arc<CachingAllocator<SimBackend>>,
    live: HashMap<String, BlockId>,
    checkpoints: Vec<Value>,
}

impl Probe {
    fn new(conf: &str) -> Self {
        let config = AllocatorConfig::parse(conf).unwrap();
        let alloc = Arc::new(CachingAllocator::new(SimBackend::new(0, h200_total()), config));
        Probe { alloc, live: HashMap::new(), checkpoints: Vec::new() }
    }
    fn empty(&mut self, name: &str, n: u64) {
        self.empty_on(name, n, StreamId::DEFAULT);
    }
    fn empty_on(&mut self, name: &str, n: u64, stream: StreamId) {
        let a = self.alloc.malloc(n, stream).unwrap_or_else(|e| panic!("malloc {n}: {e}"));
        self.alloc.check_invariants().unwrap();
        self.live.insert(name.to_string(), a.block.unwrap());
    }
    fn del(&mut self, name: &str) {
        let b = self.live.remove(name).unwrap();
        self.alloc.free(b).unwrap();
        self.alloc.check_invariants().unwrap();
    }
    fn key_stats(&self) -> Value {
        let s = self.alloc.memory_stats();
        Value::Object(KEY_STATS.iter().map(|k| (k.to_string(), json!(s[*k]))).collect())
    }
    fn seg_summary(&self) -> Vec<Value> {
        self.alloc
            .segments()
            .iter()
            .map(|s| {
                json!({
                    "total_size": s.total_size, "type": s.pool.name(), "alloc": s.allocated_size(),
                    "active": s.active_size(), "req": s.requested_size(), "stream": s.stream != StreamId::DEFAULT,
                    "exp": s.is_expandable,
                    "blocks": s.blocks.iter().map(|b| json!([b.size, b.requested_size, b.state(), b.addr - s.address])).collect::<Vec<_>>(),
                })
            })
            .collect()
    }
    fn c(&mut self, label: &str) {
        let cp = json!({"label": label, "stats": self.key_stats(), "segs": self.seg_summary()});
        self.checkpoints.push(cp);
    }
}

/// Segment lists are compared as multisets: PyTorch's order follows real device addresses.
fn norm_segs(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let mut s = s.clone();
            s.as_object_mut().unwrap().remove("off");
            s.to_string()
        })
        .collect();
    out.sort();
    out
}

fn compare_checkpoints(test: &str, ours: &[Value]) {
    let want = golden()[test]["checkpoints"].as_array().unwrap();
    assert_eq!(ours.len(), want.len(), "{test}: number of checkpoints");
    for (o, w) in ours.iter().zip(want) {
        let label = w["label"].as_str().unwrap();
        assert_eq!(o["label"], w["label"]);
        assert_eq!(o["stats"], w["stats"], "{test} @ {label}: stats");
        assert_eq!(norm_segs(&o["segs"]), norm_segs(&w["segs"]), "{test} @ {label}: segments");
    }
}

fn nonzero(m: &std::collections::BTreeMap<String, i64>) -> Value {
    Value::Object(m.iter().filter(|(_, v)| **v != 0).map(|(k, v)| (k.clone(), json!(v))).collect())
}

// ---------------------------------------------------------------------------------------------
// A. single requests

#[test]
fn case_a_single_requests_block_and_segment_sizes() {
    let want = golden()["sizes"]["sizes"].as_array().unwrap();
    assert_eq!(want.len(), 18);
    for w in want {
        let n = w["n"].as_u64().unwrap();
        let mut p = Probe::new("");
        p.empty("x", n);
        let s = p.alloc.memory_stats();
        assert_eq!(s["allocated_bytes.all.current"], w["allocated"].as_i64().unwrap(), "block size for {n}");
        assert_eq!(s["reserved_bytes.all.current"], w["reserved"].as_i64().unwrap(), "reserved for {n}");
        assert_eq!(s["inactive_split_bytes.all.current"], w["inactive_split_bytes"].as_i64().unwrap(), "isb for {n}");
        assert_eq!(norm_segs(&json!(p.seg_summary())), norm_segs(&w["segs"]), "segments for {n}");
        p.del("x");
        p.alloc.empty_cache().unwrap();
        assert_eq!(p.alloc.memory_reserved(), 0);
    }
}

// ---------------------------------------------------------------------------------------------
// B + K. the basic sequence, memory_summary, empty_cache and the resets

#[test]
fn case_b_sequence_checkpoints_summary_and_resets() {
    let g = &golden()["basic"];
    let mut p = Probe::new("");
    assert_eq!(p.alloc.memory_stats().len(), g["full_stats_after_1B"].as_object().unwrap().len());
    p.empty("a", 1);
    p.c("a=1B");
    let full: Value = Value::Object(p.alloc.memory_stats().into_iter().map(|(k, v)| (k, json!(v))).collect());
    assert_eq!(full, g["full_stats_after_1B"], "all 122 keys after 1 B");
    p.empty("b", MIB);
    p.c("b=1MiB");
    p.empty("cc", MIB + 1);
    p.c("c=1MiB+1");
    p.empty("d", 10 * MIB);
    p.c("d=10MiB");
    p.empty("e", 11_000_000);
    p.c("e=11000000");
    p.del("cc");
    p.c("del c");
    p.empty("f", 1_000_000);
    p.c("f=1000000");
    p.empty("g", 3 * MIB);
    p.c("g=3MiB");
    for t in ["a", "b", "d", "e", "f", "g"] {
        p.del(t);
    }
    p.c("del all");

    // K: memory_summary, byte for byte
    assert_eq!(p.alloc.memory_summary(false), g["summary_full"].as_str().unwrap());
    assert_eq!(p.alloc.memory_summary(true), g["summary_abbrev"].as_str().unwrap());
    let before: Value = Value::Object(p.alloc.memory_stats().into_iter().map(|(k, v)| (k, json!(v))).collect());
    assert_eq!(before, g["stats_before_empty"]);

    p.alloc.empty_cache().unwrap();
    p.alloc.check_invariants().unwrap();
    p.c("empty_cache");
    compare_checkpoints("basic", &p.checkpoints);
    assert_eq!(nonzero(&p.alloc.memory_stats()), g["stats_after_empty"]);
    p.alloc.reset_peak_memory_stats();
    assert_eq!(nonzero(&p.alloc.memory_stats()), g["after_reset_peak"]);
    p.alloc.reset_accumulated_memory_stats();
    assert_eq!(nonzero(&p.alloc.memory_stats()), g["after_reset_accum"]);
}

// ---------------------------------------------------------------------------------------------
// C. streams and record_stream

#[test]
fn case_c_streams_and_cross_stream_free() {
    let g = &golden()["streams"];
    let mut p = Probe::new("");
    let s1 = p.alloc.with_backend(|b| b.new_stream());
    p.empty("a", 4 * MIB);
    p.del("a");
    p.empty_on("b", 4 * MIB, s1);
    assert_eq!(p.key_stats(), g["after_two_streams"]);
    assert_eq!(norm_segs(&json!(p.seg_summary())), norm_segs(&g["segs_two_streams"]));
    p.del("b");

    p.alloc.record_memory_history(RecordMode::All, 1000);
    p.empty("c", 4 * MIB);
    p.alloc.with_backend(|b| b.set_stream_busy(s1, true));
    p.alloc.record_stream(p.live["c"], s1).unwrap();
    p.del("c");
    assert_eq!(p.key_stats(), g["after_record_stream_free"]);
    assert_eq!(norm_segs(&json!(p.seg_summary())), norm_segs(&g["segs_pending"]));
    let states: Vec<_> = p.alloc.segments().iter().flat_map(|s| s.blocks.iter().map(|b| b.state())).collect();
    assert!(states.contains(&"active_pending_free"));
    p.alloc.with_backend(|b| b.synchronize());
    p.empty("d", 1);
    assert_eq!(p.key_stats(), g["after_sync_and_malloc"]);
    assert_eq!(norm_segs(&json!(p.seg_summary())), norm_segs(&g["segs_after"]));

    // The trace (without PyTorch's own "snapshot" entries): same actions and sizes, in order.
    let want: Vec<(String, u64)> = g["trace"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] != "snapshot")
        .map(|e| (e["action"].as_str().unwrap().to_string(), e["size"].as_u64().unwrap()))
        .collect();
    let ours: Vec<(String, u64)> = p.alloc.history().iter().map(|e| (e.action.name().to_string(), e.size)).collect();
    assert_eq!(ours, want);
}

// ---------------------------------------------------------------------------------------------
// D + E. out of memory

#[test]
fn case_d_oom_releases_cache_retries_and_reports_pytorch_numbers() {
    let g = &golden()["oom"];
    let mut p = Probe::new("");
    p.alloc.record_memory_history(RecordMode::All, 1000);
    p.empty("keep", 3 * MIB);
    p.empty("tmp", 50 * MIB);
    p.del("tmp");
    let err = p.alloc.malloc(1 << 40, StreamId::DEFAULT).unwrap_err();
    p.alloc.check_invariants().unwrap();
    let AllocError::OutOfMemory(report) = &err else { panic!("expected OOM, got {err}") };
    assert_eq!(report.alloc_size, 1 << 40);
    assert_eq!(report.allocated, 3 * MIB);
    assert_eq!(report.reserved, 20 * MIB);
    let text = err.to_string();
    let want_text = g["oom_msg"].as_str().unwrap();
    for fragment in ["Tried to allocate 1024.00 GiB", "3.00 MiB is allocated by", "17.00 MiB is reserved by"] {
        assert!(want_text.contains(fragment), "golden text lost {fragment:?}");
        assert!(text.contains(fragment), "{text}");
    }
    assert!(
        text.starts_with(
            "CUDA out of memory. Tried to allocate 1024.00 GiB. GPU 0 (simulated) has a total capacity of 139.80 GiB"
        ),
        "{text}"
    );
    assert_eq!(p.key_stats(), g["stats_after_oom"]);
    let want: Vec<(String, u64)> = g["trace"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["action"].as_str().unwrap().to_string(), e["size"].as_u64().unwrap()))
        .collect();
    let hist = p.alloc.history();
    let ours: Vec<(String, u64)> = hist.iter().map(|e| (e.action.name().to_string(), e.size)).collect();
    assert_eq!(ours, want);
    let oom = hist.last().unwrap();
    assert_eq!(oom.action, TraceAction::Oom);
    assert_eq!(oom.addr, p.alloc.mem_get_info().unwrap().0, "oom entry carries device_free");

    // E: fraction 0, then 0.01 (the probe continues in the same process)
    p.alloc.empty_cache().unwrap();
    p.alloc.set_per_process_memory_fraction(0.0).unwrap();
    let e = p.alloc.malloc(1, StreamId::DEFAULT).unwrap_err().to_string();
    assert!(e.contains("Tried to allocate 2.00 MiB") && e.contains("0 bytes allowed; "), "{e}");
    assert!(g["oom_msg_fraction0_1byte"].as_str().unwrap().contains("Tried to allocate 2.00 MiB"));
    p.alloc.set_per_process_memory_fraction(0.01).unwrap();
    p.empty("x", 5 * MIB); // a temporary in the probe: freed at once
    p.del("x");
    let e = p.alloc.malloc(4 << 30, StreamId::DEFAULT).unwrap_err().to_string();
    assert!(e.contains("Tried to allocate 4.00 GiB") && e.contains("1.40 GiB allowed; "), "{e}");
    assert_eq!(p.key_stats(), g["stats_end"]);
    assert_eq!(p.alloc.get_per_process_memory_fraction(), g["get_fraction"].as_f64().unwrap());
    p.alloc.check_invariants().unwrap();
}

#[test]
fn case_e_fraction_zero_rejects_without_touching_the_device() {
    let p = Probe::new("");
    p.alloc.set_per_process_memory_fraction(0.0).unwrap();
    let e = p.alloc.malloc(1, StreamId::DEFAULT).unwrap_err().to_string();
    assert!(e.contains("Tried to allocate 2.00 MiB"), "{e}");
    assert!(e.contains("0 bytes allowed; "), "{e}");
    let s = p.alloc.memory_stats();
    assert_eq!((s["num_device_alloc"], s["num_ooms"], s["num_alloc_retries"]), (0, 1, 1));
    assert!(p.alloc.set_per_process_memory_fraction(1.5).is_err());
}

// ---------------------------------------------------------------------------------------------
// F. expandable segments

#[test]
fn case_f_expandable_segments() {
    let g = &golden()["expandable"];
    let mut p = Probe::new(g["conf"].as_str().unwrap());
    p.alloc.record_memory_history(RecordMode::All, 1000);
    p.empty("a", 1);
    p.c("a=1B");
    p.empty("b", 5 * MIB);
    p.c("b=5MiB");
    p.empty("cc", 30 * MIB);
    p.c("c=30MiB");
    p.empty("d", 3 * MIB);
    p.c("d=3MiB");
    p.del("b");
    p.c("del b");
    for t in ["a", "cc", "d"] {
        p.del(t);
    }
    p.c("del all");
    p.alloc.empty_cache().unwrap();
    p.alloc.check_invariants().unwrap();
    p.c("empty_cache");
    compare_checkpoints("expandable", &p.checkpoints);
    let want: Vec<(String, u64)> = g["trace"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] != "snapshot")
        .map(|e| (e["action"].as_str().unwrap().to_string(), e["size"].as_u64().unwrap()))
        .collect();
    let ours: Vec<(String, u64)> = p.alloc.history().iter().map(|e| (e.action.name().to_string(), e.size)).collect();
    assert_eq!(ours, want);
    // Every simulated page went back to the device.
    assert_eq!(p.alloc.with_backend(|b| b.used()), 0);
}

// ---------------------------------------------------------------------------------------------
// G. roundup_power2_divisions

#[test]
fn case_g_roundup_power2_divisions() {
    for test in ["roundup", "roundup_list"] {
        let g = &golden()[test];
        for w in g["roundup"].as_array().unwrap() {
            let mut p = Probe::new(g["conf"].as_str().unwrap());
            let n = w["n"].as_u64().unwrap();
            p.empty("x", n);
            assert_eq!(p.alloc.memory_allocated(), w["allocated"].as_u64().unwrap(), "{test}: {n}");
            assert_eq!(p.alloc.memory_reserved(), w["reserved"].as_u64().unwrap(), "{test}: {n}");
            p.del("x");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// H. max_split_size_mb

#[test]
fn case_h_max_split_size() {
    let g = &golden()["maxsplit"];
    let mut p = Probe::new(g["conf"].as_str().unwrap());
    p.empty("a", 100 * MIB);
    p.c("a=100MiB");
    p.del("a");
    p.c("del a");
    p.empty("b", 85 * MIB);
    p.c("b=85MiB (reuse 100MiB?)");
    p.empty("d", 30 * MIB);
    p.c("d=30MiB");
    p.del("b");
    p.empty("e", 70 * MIB);
    p.c("e=70MiB (100MiB cached; 100>=70+20 so no)");
    compare_checkpoints("maxsplit", &p.checkpoints);
    let s = p.alloc.memory_stats();
    assert_eq!(s["oversize_allocations.allocated"], 3);
    assert_eq!(s["oversize_segments.current"], 2, "100 MiB and 70 MiB; the 30 MiB segment is below 64 MiB");
}

// ---------------------------------------------------------------------------------------------
// I. garbage collection threshold

#[test]
fn case_i_garbage_collection() {
    let g = &golden()["gc"];
    let mut p = Probe::new(g["conf"].as_str().unwrap());
    p.alloc.set_per_process_memory_fraction(0.04).unwrap();
    assert_eq!(p.alloc.allowed_bytes(), g["allowed"].as_u64());
    for i in 0..3 {
        p.empty(&format!("x{i}"), 1 << 30);
    }
    for i in 0..3 {
        p.del(&format!("x{i}"));
    }
    assert_eq!(p.key_stats(), g["before"]);
    p.empty("y", 3 << 29);
    assert_eq!(p.key_stats(), g["after"]);
    assert_eq!(norm_segs(&json!(p.seg_summary())), norm_segs(&g["segs"]));
}

// ---------------------------------------------------------------------------------------------
// J (state part). enabled="state" keeps exactly one trace entry.

#[test]
fn record_state_keeps_last_entry_only() {
    let g = &golden()["state_only"];
    let mut p = Probe::new("");
    p.alloc.record_memory_history(RecordMode::State, usize::MAX);
    p.empty("a", 1000);
    p.empty("b", 2000);
    p.del("b");
    let h = p.alloc.history();
    assert_eq!(h.len(), g["n_trace"][0].as_u64().unwrap() as usize);
    assert_eq!(h[0].action.name(), g["trace"][0]["action"].as_str().unwrap());
    assert_eq!(h[0].size, g["trace"][0]["size"].as_u64().unwrap());
    let states: Vec<Value> = p
        .alloc
        .segments()
        .iter()
        .flat_map(|s| s.blocks.iter().map(|b| json!([b.size, b.state()])).collect::<Vec<_>>())
        .collect();
    let want: Vec<Value> = g["block_states"].as_array().unwrap().iter().map(|b| json!([b[0], b[1]])).collect();
    assert_eq!(states, want);
}

#[test]
fn size_zero_and_one_exabyte() {
    let p = Probe::new("");
    let a = p.alloc.malloc(0, StreamId::DEFAULT).unwrap();
    assert_eq!((a.block, a.addr), (None, 0));
    assert_eq!(p.alloc.memory_stats()["num_device_alloc"], 0);
    let e = p.alloc.malloc(1 << 60, StreamId::DEFAULT).unwrap_err();
    assert!(e.to_string().contains("more than 1EB"), "{e}");
    assert_eq!(p.alloc.memory_stats()["num_ooms"], 0);
}

#[test]
fn double_free_is_an_error_value_and_state_stays_consistent() {
    let p = Probe::new("");
    let a = p.alloc.malloc(4096, StreamId::DEFAULT).unwrap();
    p.alloc.free(a.block.unwrap()).unwrap();
    assert!(p.alloc.free(a.block.unwrap()).is_err());
    p.alloc.check_invariants().unwrap();
    assert_eq!(p.alloc.memory_allocated(), 0);
}
