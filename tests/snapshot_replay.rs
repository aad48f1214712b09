//! PyTorch's snapshots as `gpumem-replay` input: the pickle reader against CPython's pickler
//! (every protocol), PyTorch's own snapshot replayed to its own end state block by block,
//! snapshots of PyTorch's structure built from the shipped real traces replayed to PyTorch's
//! peaks, every committed fixture snapshot (`tests/fixtures/snapshots/`, from
//! `scripts/gpu/record_snapshots.py` on a GPU, or `build_snapshot.py` from a trace) replayed to
//! the peaks written beside it, and the one-line refusals: a trace that does not start at the
//! first allocation, no trace at all.

use gpumem_nb::replay::{ReplayOptions, read_recording, replay};
use gpumem_nb::units::iec;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn python(args: &[&str]) -> String {
    let out = Command::new("python3").args(args).output().expect("python3 runs (the tests need Python 3)");
    assert!(out.status.success(), "python3 {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct TmpDir(PathBuf);
impl TmpDir {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("gpumem-snapreplay-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TmpDir(d)
    }
}
impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn replay_json(path: &Path, extra: &[&str]) -> Result<Value, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem-replay")).arg(path).arg("--json").args(extra).output().unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap())
}

/// Random plain data pickled by CPython at every protocol it has from 2 on, read back equal to
/// what `json.dumps` of the same object says (tuples as lists, as the reader maps them).
#[test]
fn the_reader_reads_what_cpython_pickles() {
    let dir = TmpDir::new("cpython");
    let script = r#"
import json, pickle, random, sys
out = sys.argv[1]
rnd = random.Random(20)
def value(depth):
    k = rnd.randrange(12 if depth < 4 else 7)
    if k == 0: return None
    if k == 1: return rnd.random() < 0.5
    if k == 2: return rnd.randrange(-300, 300)
    if k == 3: return rnd.choice([0, 255, 256, 65535, 65536, 2**31 - 1, 2**31, -2**31, 2**47 + 3, 2**63 - 1, 2**64 - 1, -2**63])
    if k == 4: return rnd.choice([0.0, 1.5, -2.25, 1e300, 3.141592653589793])
    if k == 5: return rnd.choice(["", "alloc", "ü ∑ 🎉", "x" * 300, "line\nbreak"])
    if k == 6: return rnd.choice(["segment_alloc", "free_requested", "frames"])
    if k in (7, 8): return [value(depth + 1) for _ in range(rnd.randrange(6 if depth else 1200))]
    if k == 9: return tuple(value(depth + 1) for _ in range(rnd.randrange(5)))
    d = {}
    for _ in range(rnd.randrange(6 if depth else 1100)):
        d[rnd.choice(["a", "addr", "size", "k" + str(rnd.randrange(50))])] = value(depth + 1)
    return d
shared = [{"name": "f", "filename": "t.py", "line": 3}]
cases = [value(0) for _ in range(30)] + [{"p": shared, "q": shared, "r": [shared, shared]}]
for i, v in enumerate(cases):
    for proto in range(2, pickle.HIGHEST_PROTOCOL + 1):
        with open(f"{out}/{i}.p{proto}.pickle", "wb") as f:
            pickle.dump(v, f, protocol=proto)
    with open(f"{out}/{i}.json", "w") as f:
        json.dump(v, f)
print(pickle.HIGHEST_PROTOCOL)
"#;
    let highest: u8 = python(&["-c", script, dir.0.to_str().unwrap()]).trim().parse().unwrap();
    assert!(highest >= 5, "CPython writes protocol 5");
    let mut read = 0;
    for i in 0..31 {
        let want: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.0.join(format!("{i}.json"))).unwrap()).unwrap();
        for proto in 2..=highest {
            let bytes = std::fs::read(dir.0.join(format!("{i}.p{proto}.pickle"))).unwrap();
            let got = gpumem_nb::snapshot::unpickle::from_bytes(&bytes)
                .unwrap_or_else(|e| panic!("case {i}, protocol {proto}: {e}"));
            assert_eq!(got, want, "case {i}, protocol {proto}");
            read += 1;
        }
    }
    assert!(read >= 31 * 4);
}

/// A segment's address, size and blocks (address, size, state, request of allocated blocks).
type Layout<'a> = (u64, u64, Vec<(u64, u64, &'a str, u64)>);

/// PyTorch 2.11's own snapshot (recorded on an H200): its trace replayed from an empty device
/// ends in exactly the state PyTorch dumped, segment by segment and block by block.
#[test]
fn pytorchs_snapshot_replays_to_its_own_end_state() {
    let path = root().join("tests/fixtures/snapshot_torch2.11_py3.12_protocol4.pickle");
    let snap = gpumem_nb::snapshot::read(&path).unwrap();
    let rec = read_recording(&path).unwrap();
    assert_eq!(rec.kind.name(), "snapshot pickle");
    assert_eq!(rec.alloc_conf.as_deref(), Some(""), "allocator_settings: PyTorch's defaults");
    let r = replay(&rec.devices[0].events, &ReplayOptions::default(), "t").unwrap();
    assert_eq!(r.divergences, 0, "{:?}", r.first_divergence);
    r.check_invariants().unwrap();
    let ours: Vec<Layout<'_>> = r
        .segments()
        .iter()
        .map(|s| {
            let blocks = s
                .blocks
                .iter()
                .map(|b| (b.addr, b.size, b.state(), if b.allocated { b.requested_size } else { 0 }))
                .collect();
            (s.address, s.total_size, blocks)
        })
        .collect();
    let theirs: Vec<Layout<'_>> = snap
        .segments
        .iter()
        .map(|s| {
            let blocks = s
                .blocks
                .iter()
                .map(|b| (b.address, b.size, b.state, if b.state == "active_allocated" { b.requested_size } else { 0 }))
                .collect();
            (s.address, s.total_size, blocks)
        })
        .collect();
    assert_eq!(ours, theirs);
    // Its stacks are kept with the events: the sites of the allocations.
    let info = rec.devices[0].info.iter().flatten().next().expect("frames recorded");
    assert_eq!(info.site().map(|f| f.filename.as_str()), Some("probe.py"));
}

fn sidecars() -> Vec<(PathBuf, PathBuf)> {
    ["gpt2_train", "resnet50_train", "two_streams"]
        .iter()
        .map(|n| {
            let d = root().join("tests/fixtures/traces");
            (d.join(format!("{n}.trace.tsv.gz")), d.join(format!("{n}.json")))
        })
        .collect()
}

/// Snapshots with PyTorch's exact structure (built by CPython from the shipped traces, every
/// pickle protocol) replay to PyTorch's own peaks of those runs.
#[test]
fn snapshots_of_pytorchs_structure_replay_to_pytorchs_peaks() {
    let dir = TmpDir::new("built");
    let builder = root().join("tests/fixtures/snapshots/build_snapshot.py");
    for (trace, side) in sidecars() {
        for proto in [2, 3, 4, 5] {
            let name = format!("{}-p{proto}.pickle", trace.file_name().unwrap().to_str().unwrap());
            let out = dir.0.join(&name);
            python(&[
                builder.to_str().unwrap(),
                trace.to_str().unwrap(),
                out.to_str().unwrap(),
                "--sidecar",
                side.to_str().unwrap(),
                "--protocol",
                &proto.to_string(),
            ]);
            let want: Value =
                serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).unwrap()).unwrap();
            let got = replay_json(&out, &[]).unwrap();
            assert_eq!(got["input"], "snapshot pickle", "{name}");
            assert_eq!(got["allocated_peak"], want["stats"]["allocated_bytes.all.peak"], "{name}");
            assert_eq!(got["reserved_peak"], want["stats"]["reserved_bytes.all.peak"], "{name}");
            assert_eq!(got["divergences"], 0, "{name}");
        }
    }
}

/// Every snapshot committed in `tests/fixtures/snapshots/` with its `.json` (PyTorch's
/// `memory_stats()` peaks of the run, per device) replays to exactly those peaks.
#[test]
fn every_fixture_snapshot_reproduces_pytorchs_peaks() {
    let dir = root().join("tests/fixtures/snapshots");
    let mut seen = 0;
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
        .collect();
    paths.sort();
    for p in paths {
        let side: Value = serde_json::from_str(&std::fs::read_to_string(p.with_extension("json")).unwrap()).unwrap();
        let got = replay_json(&p, &[]).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let devices = got["devices"].as_array().unwrap();
        // `stats` for one device, or `devices: [{device, stats}]`.
        let wanted: Vec<(i64, &Value)> = match side.get("devices").and_then(Value::as_array) {
            Some(d) => d.iter().map(|x| (x["device"].as_i64().unwrap(), &x["stats"])).collect(),
            None => vec![(side["device"].as_i64().unwrap_or(0), &side["stats"])],
        };
        for (d, stats) in wanted {
            let dev = devices
                .iter()
                .find(|x| x["device_index"] == d)
                .unwrap_or_else(|| panic!("{}: device {d}", p.display()));
            for (ours, theirs) in
                [("allocated_peak", "allocated_bytes.all.peak"), ("reserved_peak", "reserved_bytes.all.peak")]
            {
                assert_eq!(dev[ours], stats[theirs], "{}: device {d}: {ours}", p.display());
            }
            assert_eq!(dev["divergences"], 0, "{}: {:?}", p.display(), dev["first_divergence"]);
        }
        seen += 1;
    }
    assert!(seen >= 1, "at least the snapshot built from two_streams is committed");
}

/// Fit planning on the snapshots PyTorch recorded on a GPU (`h100_*`): on a device of PyTorch's
/// reserved peak the run fits under PyTorch's policy and under compact; 256 MiB under its
/// allocated peak (half of it, for a peak below 512 MiB) it fails, with the failing request;
/// compact's smallest device is within 5 % of the allocated peak.
#[test]
fn the_gpu_snapshots_fit_at_pytorchs_reserved_peak_under_default_and_compact() {
    let dir = root().join("tests/fixtures/snapshots");
    let mut seen = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let p = e.path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if !(name.starts_with("h100_") && name.ends_with(".pickle")) {
            continue;
        }
        let side: Value = serde_json::from_str(&std::fs::read_to_string(p.with_extension("json")).unwrap()).unwrap();
        let reserved = side["stats"]["reserved_bytes.all.peak"].as_u64().unwrap();
        let allocated = side["stats"]["allocated_bytes.all.peak"].as_u64().unwrap();
        let under = allocated.saturating_sub(256 << 20).max(allocated / 2);
        for policy in ["", "compact:True"] {
            let yes = replay_json(&p, &["--fit", &reserved.to_string(), "--alloc-conf", policy]).unwrap();
            assert_eq!(yes["fits"], true, "{name} {policy:?}: {}", yes["first_failure"]);
            let no = replay_json(&p, &["--fit", &under.to_string(), "--alloc-conf", policy]).unwrap();
            assert_eq!(no["fits"], false, "{name} {policy:?}");
            assert!(no["first_failure"]["size"].as_u64() > Some(0), "{name} {policy:?}");
            let min = no["min_device_bytes"].as_u64().unwrap();
            assert!(min <= reserved, "{name} {policy:?}: {min} > PyTorch's reserved peak {reserved}");
            if policy == "compact:True" {
                assert!(min as f64 <= 1.05 * allocated as f64, "{name}: compact needs {min} for {allocated}");
            }
        }
        seen += 1;
    }
    assert!(seen >= 2, "the snapshots recorded on the GPU are committed");
}

/// A trace whose beginning is lost (the ring buffer wrapped) is refused in one line naming the
/// device and the event, whatever was lost; so is a snapshot without a trace.
#[test]
fn a_trace_that_does_not_start_at_the_first_allocation_is_refused() {
    let dir = TmpDir::new("wrapped");
    let builder = root().join("tests/fixtures/snapshots/build_snapshot.py");
    let (trace, _) = &sidecars()[2];
    for drop in [1, 2, 7, 100, 600, 1200] {
        let out = dir.0.join(format!("d{drop}.pickle"));
        python(&[
            builder.to_str().unwrap(),
            trace.to_str().unwrap(),
            out.to_str().unwrap(),
            "--drop-first",
            &drop.to_string(),
        ]);
        let Err(e) = replay_json(&out, &[]) else { panic!("a trace without its first {drop} events was replayed") };
        assert_eq!(e.trim().lines().count(), 1, "{e}");
        assert!(e.contains("device 0, event "), "{e}");
        assert!(e.contains("does not start at the first allocation"), "drop {drop}: {e}");
        assert!(e.contains("ring buffer wrapped"), "{e}");
    }
    // No trace (recorded without history), an empty one, and `enabled="state"` (one entry).
    let script = r#"
import pickle, sys
d = sys.argv[1]
seg = {"device": 0, "address": 1 << 40, "total_size": 2097152, "allocated_size": 512, "active_size": 512,
       "requested_size": 8, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0), "is_expandable": False,
       "frames": [], "blocks": [{"address": 1 << 40, "size": 512, "requested_size": 8, "state": "active_allocated", "frames": []},
                                {"address": (1 << 40) + 512, "size": 2096640, "requested_size": 0, "state": "inactive", "frames": []}]}
entry = {"action": "alloc", "addr": 1 << 40, "size": 8, "stream": 0, "time_us": 1, "compile_context": "N/A", "user_metadata": ""}
pickle.dump({"segments": [seg], "device_traces": [], "allocator_settings": {}}, open(d + "/none.pickle", "wb"))
pickle.dump({"segments": [seg], "device_traces": [[]]}, open(d + "/empty.pickle", "wb"))
pickle.dump({"segments": [seg], "device_traces": [[entry]]}, open(d + "/state.pickle", "wb"))
pickle.dump([seg], open(d + "/segments_only.pickle", "wb"))
open(d + "/garbage.pickle", "wb").write(b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments")
"#;
    python(&["-c", script, dir.0.to_str().unwrap()]);
    for (name, needle) in [
        ("none", "has no trace"),
        ("empty", "trace is empty"),
        ("segments_only", "has no trace"),
        ("state", "does not start at the first allocation"),
        ("garbage", "unreadable pickle at byte"),
    ] {
        let Err(e) = replay_json(&dir.0.join(format!("{name}.pickle")), &[]) else { panic!("{name} was replayed") };
        assert_eq!(e.trim().lines().count(), 1, "{name}: {e}");
        assert!(e.contains(needle), "{name}: {e}");
        assert!(e.contains(&format!("{name}.pickle")), "{name}: the file is named: {e}");
    }
}

/// What a PyTorch program's memory was, by component, from its snapshot's Python stacks
/// (issue 33): an MLP with BatchNorm trained three steps with AdamW on an H200
/// (`scripts/gpu/record_components.py`, whose `.json` holds the model's own counts). At the end
/// the parameters are the model's parameter bytes, the optimizer state (Adam's two moments) twice
/// that, and BatchNorm's running mean, variance and batch counter the buffers; the gradients
/// hold at least the last step's (with Python stacks alone, the cuBLAS workspace the backward
/// thread took counts there too); `--fit` prints the table and the smallest card.
#[test]
fn a_pytorch_snapshot_by_component() {
    let p = root().join("tests/fixtures/snapshots/h200_components_adamw_bn.pickle");
    let side: Value = serde_json::from_str(&std::fs::read_to_string(p.with_extension("json")).unwrap()).unwrap();
    let got = replay_json(&p, &["--fit", "1GiB"]).unwrap();
    let dev = &got["devices"][0];
    let c = &dev["components"];
    let model = |k: &str| side["components"][k].as_u64().unwrap();
    let end = |k: &str| c[k]["end"].as_u64().unwrap_or_else(|| panic!("no {k} in {c}"));
    assert!(model("parameter") > 4 << 20, "{side}");
    assert_eq!(end("parameter"), model("parameter"), "{c}");
    assert_eq!(model("optimizer_state"), 2 * model("parameter"));
    assert_eq!(end("optimizer_state"), model("optimizer_state"), "{c}");
    assert!(end("gradient") >= model("gradient"), "{c}");
    assert_eq!(end("buffer"), model("buffer"), "{c}");
    // Every byte the program holds at the end is some component's.
    let all: u64 = c.as_object().unwrap().values().map(|b| b["end"].as_u64().unwrap()).sum();
    assert_eq!(all, side["stats"]["requested_bytes.all.current"].as_u64().unwrap(), "{c}");
    assert_eq!(dev["smallest_card_gb"], 16, "{dev}");
    let text = Command::new(env!("CARGO_BIN_EXE_gpumem-replay")).arg(&p).args(["--fit", "1GiB"]).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    // The fit table's rows (its cells are split by `┆`; the components section above has none).
    let row = |name: &str| {
        text.lines().find(|l| l.contains(name) && l.contains('┆')).unwrap_or_else(|| panic!("no {name}: {text}"))
    };
    let at_peak_of = |k: &str| c[k]["at_peak"].as_u64().unwrap();
    assert!(row("optimizer_state").contains(&iec(at_peak_of("optimizer_state"))), "{text}");
    assert!(row("smallest card").contains("16 GB (margin"), "{text}");
    // `%gpumem fit`'s table, with its one definition: the smallest device less the components
    // at the peak, which add up to it.
    let at_peak: u64 = c.as_object().unwrap().values().map(|b| b["at_peak"].as_u64().unwrap()).sum();
    let min = dev["min_device_bytes"].as_u64().unwrap();
    assert!(row("rounding and cache").contains(&iec(min - at_peak)), "{text}");
}

/// The same workload recorded with C++ frames too (`stacks="all"`): the cuBLAS workspaces have
/// frames of their own, so `workspace` is exactly what PyTorch gives back when asked to clear
/// them (two handles' 32 MiB, the forward thread's and the autograd engine's, and cuBLASLt's
/// 1 MiB on an H200), and the gradients at the end are exactly the model's, the backward
/// thread's allocations being known by the autograd engine's frames.
#[test]
fn a_pytorch_snapshot_with_cpp_frames_tells_workspaces_from_gradients() {
    let p = root().join("tests/fixtures/snapshots/h200_components_adamw_bn_all.pickle");
    let side: Value = serde_json::from_str(&std::fs::read_to_string(p.with_extension("json")).unwrap()).unwrap();
    assert_eq!(side["stacks"], "all");
    let got = replay_json(&p, &[]).unwrap();
    let c = &got["devices"][0]["components"];
    let model = |k: &str| side["components"][k].as_u64().unwrap();
    let end = |k: &str| c[k]["end"].as_u64().unwrap_or_else(|| panic!("no {k} in {c}"));
    for k in ["parameter", "buffer", "gradient", "optimizer_state", "workspace"] {
        assert_eq!(end(k), model(k), "{k}: {c}");
    }
    assert!(model("workspace") > 32 << 20, "{side}");
    let all: u64 = c.as_object().unwrap().values().map(|b| b["end"].as_u64().unwrap()).sum();
    assert_eq!(all, side["stats"]["requested_bytes.all.current"].as_u64().unwrap(), "{c}");
    // What is left is the last step's input batch and loss: nothing of the model's.
    let named: u64 = ["parameter", "buffer", "gradient", "optimizer_state", "workspace"].iter().map(|k| end(k)).sum();
    assert!(all - named <= (2 << 20) + 4096, "{}: {c}", all - named);
}
