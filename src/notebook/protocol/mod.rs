//! The control channel's messages, as types: what gpumem-kernel asks the crate in the notebook
//! child and what it answers. Both ends use these types, so a field cannot drift apart.
//!
//! The wire is one JSON object per line each way. On connecting, the child sends a [`Hello`];
//! then every [`Request`] (`{"id": n, "op": "…", …}`) gets one [`Reply`] with the same id
//! (`{"id": n, "ok": true, …}` or `{"id": n, "ok": false, "error": "…"}`).
//!
//! Version skew (a kernel built from one release talking to a notebook that loaded another) is
//! tolerated both ways: unknown fields are ignored, missing optional fields take their
//! defaults, and an unknown `op` is answered with an error naming it. A line that is not a
//! request at all gets an error reply and changes nothing.
#![forbid(unsafe_code)]

use crate::record::history::RecordMode;
use serde::{Deserialize, Serialize};

mod readings;
pub use readings::{
    CACHED_FREE, ComponentReading, CudaDevice, DeviceReading, FrameworkPhase, FrameworkPool, FrameworkReading,
    GPUMEM_NB, Held, OomEvent, OwnerBytes, OwnerReading, PlaceReading, PlaceTop, Settled, SnapshotPaths, SourceReading,
    TopReport, Trimmed, VariableHeld, VariablesReading,
};

/// The environment variable naming the kernel's control socket.
pub const CONTROL_VAR: &str = "GPUMEM_NB_CONTROL";

/// The file beside the control socket where the kernel keeps the requests a child applies as
/// it connects (`record`, `on_oom`: one [`Op`] per line, JSON), read by the crate before its
/// first device is used: `%gpumem record on` in the cell of the first use records that use.
pub fn on_connect_path(socket: &std::path::Path) -> std::path::PathBuf {
    let mut name = socket.file_name().unwrap_or_default().to_os_string();
    name.push(".on-connect");
    socket.with_file_name(name)
}

/// The longest line either end accepts (a hostile or broken peer cannot make the other end
/// buffer without bound). Replies with an SVG chart stay far below it.
pub const MAX_LINE: usize = 16 << 20;

/// The child's first line: who it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always 1 (the protocol's version).
    pub hello: u32,
    /// The child's process id (the kernel checks it against the socket's peer credentials).
    pub pid: u32,
    /// The crate's version (`CARGO_PKG_VERSION`).
    #[serde(default)]
    pub version: String,
}

impl Hello {
    /// This process's hello.
    pub fn new() -> Self {
        Hello { hello: 1, pid: std::process::id(), version: env!("CARGO_PKG_VERSION").to_string() }
    }
}

impl Default for Hello {
    fn default() -> Self {
        Self::new()
    }
}

/// A request: its id and what is asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Echoed in the reply.
    pub id: u64,
    /// The operation.
    #[serde(flatten)]
    pub op: Op,
}

/// What the kernel asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Before a cell: label allocations "cell N", open a fresh peak slot per device, restart
    /// the CUDA pool's high-water marks; answered with the readings.
    Pre {
        /// The cell's execution count.
        cell: u64,
    },
    /// After a cell: the readings with the peaks since `pre`; closes the slots, clears the
    /// label.
    Post {
        /// The cell's execution count.
        cell: u64,
    },
    /// The readings now.
    Read,
    /// The readings now with the peaks since `pre`, leaving the cell's slots open, and without
    /// the top owners (no stack is symbolised): what gpumem-kernel's live line asks a few
    /// times a second while a cell runs.
    Live,
    /// Sets history recording on every open device.
    Record(RecordRequest),
    /// Writes snapshot.pickle/.json/trace_plot.html of device 0 into `dir`.
    Snapshot {
        /// Directory (created if missing).
        dir: String,
    },
    /// Watches every open device for out-of-memory: the first failure of a cell writes a
    /// snapshot into `dir/cell-N` at that moment, and the cell's `post` answers `oom`.
    OnOom {
        /// Directory (created when needed); `None` stops watching.
        #[serde(default)]
        dir: Option<String>,
    },
    /// The memory-over-time chart of device 0's recorded history.
    HistorySvg,
    /// Device 0's `memory_summary()`.
    Summary,
    /// The code of a cell as its user sees it (sent before the cell runs), so that sites in it
    /// get their lines.
    CellCode {
        /// The cell's execution count.
        cell: u64,
        /// Its code (magic lines replaced by comments, so lines keep their numbers).
        code: String,
    },
    /// The code of several cells at once (what a child is sent as it connects): as many
    /// [`Op::CellCode`]s in one round trip.
    CellCodes {
        /// (execution count, code) of each cell.
        codes: Vec<(u64, String)>,
    },
    /// The `n` sites holding the most memory now and at the session's peak.
    Top {
        /// How many per place.
        #[serde(default = "five")]
        n: usize,
    },
    /// Gives back what the process holds cached and unused (`%gpumem trim`): gpumem-nb's
    /// allocator's cache on each open device, each CUDA device's stream-ordered pool; answered
    /// with what each held before and after ([`Trimmed`]).
    Trim,
}

fn five() -> usize {
    5
}

impl Op {
    /// The operation's name on the wire (`"pre"`, `"history_svg"`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Pre { .. } => "pre",
            Op::Post { .. } => "post",
            Op::Read => "read",
            Op::Live => "live",
            Op::Record(_) => "record",
            Op::Snapshot { .. } => "snapshot",
            Op::OnOom { .. } => "on_oom",
            Op::HistorySvg => "history_svg",
            Op::Summary => "summary",
            Op::CellCode { .. } => "cell_code",
            Op::CellCodes { .. } => "cell_codes",
            Op::Top { .. } => "top",
            Op::Trim => "trim",
        }
    }
}

/// What `record` sets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordRequest {
    /// `all`, `state` or `off`.
    #[serde(default = "record_all", with = "record_mode")]
    pub enabled: RecordMode,
    /// Ring size (`None`: unbounded).
    #[serde(default)]
    pub max_entries: Option<u64>,
    /// Whether to capture stacks.
    #[serde(default)]
    pub stacks: bool,
}

fn record_all() -> RecordMode {
    RecordMode::All
}

/// `RecordMode` as PyTorch's strings (`"all"`, `"state"`, `"off"`).
mod record_mode {
    use crate::record::history::RecordMode;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(m: &RecordMode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match m {
            RecordMode::All => "all",
            RecordMode::State => "state",
            RecordMode::Off => "off",
        })
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<RecordMode, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "all" => Ok(RecordMode::All),
            "state" => Ok(RecordMode::State),
            "off" => Ok(RecordMode::Off),
            other => Err(serde::de::Error::custom(format!("unknown record mode {other:?} (all, state or off)"))),
        }
    }
}

/// A reply. Which fields are set depends on the request: `devices` for `pre`/`post`/`read`/`live`
/// (and `oom` for `post`, `frameworks` for `pre`/`post`/`read` when one is watched), `files` for
/// `snapshot`, `svg` and `text` for `history_svg`, `text` for `summary`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    /// The request's id (`None` when the request could not be read at all).
    pub id: Option<u64>,
    /// Whether the request succeeded.
    pub ok: bool,
    /// Why it failed, in one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Every open device's numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<DeviceReading>>,
    /// The files a snapshot wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<SnapshotPaths>,
    /// A chart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    /// A text (a chart's text form, the memory summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Whether every allocation of the process is tracked: `cupti`, `simulated`,
    /// `unavailable: <why>`, `off (…)`, `not started`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<String>,
    /// Every allocation of the process, per device touched (and the host's pinned memory), with
    /// peaks since `pre` (or since tracking began): what `pre`, `post` and `read` answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracked: Option<Vec<PlaceReading>>,
    /// Every CUDA device the process sees, by ordinal, with its UUID, when CUPTI tracks (`pre`,
    /// `post`, `read`): how the kernel gives NVML's devices their ordinals, also one where the
    /// cell made only a context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_devices: Option<Vec<CudaDevice>>,
    /// The cell's first out-of-memory failure, when `on_oom` watches (`post`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<OomEvent>,
    /// The top sites (`top`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top: Option<TopReport>,
    /// What `trim` gave back, per owner and device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trim: Option<Vec<Trimmed>>,
    /// The frameworks a notebook watches (`gpumem_nb::frameworks`), their own numbers: what
    /// `pre`, `post` and `read` answer (not `live`, which must not wait on a framework's
    /// queue), absent when none is watched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frameworks: Option<Vec<FrameworkReading>>,
    /// What the notebook's variables hold by a framework's own types, as the session library's
    /// probe last saw them at a cell's end (`pre`, `post`, `read`; absent without a probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variables: Option<VariablesReading>,
    /// What did not settle before the reading (`pre`, `post`, `read`, `top`, `snapshot`): a
    /// device or framework still busy after the settle time, read as it was. Absent when all
    /// settled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsettled: Option<Vec<Settled>>,
}

impl Reply {
    /// A success for request `id`, with nothing in it yet.
    pub fn ok(id: u64) -> Self {
        Reply { id: Some(id), ok: true, ..Default::default() }
    }

    /// A failure for request `id` (or an unreadable one), with its reason.
    pub fn error(id: Option<u64>, why: impl Into<String>) -> Self {
        Reply { id, ok: false, error: Some(why.into()), ..Default::default() }
    }
}

/// Reads a request line. A line that is not a request is an error naming what was wrong, with
/// the id when one could still be read from it (so the sender can match the failure).
pub fn parse_request(line: &str) -> Result<Request, (Option<u64>, String)> {
    serde_json::from_str::<Request>(line).map_err(|e| {
        let id = serde_json::from_str::<serde_json::Value>(line).ok().and_then(|v| v.get("id")?.as_u64());
        (id, format!("malformed request: {e}"))
    })
}

/// One line of JSON (without the newline) for a message.
pub fn to_line<T: Serialize>(msg: &T) -> String {
    // Serialising these types cannot fail: no maps with non-string keys, no custom errors.
    serde_json::to_string(msg).unwrap_or_else(|e| format!("{{\"ok\":false,\"error\":\"unserialisable: {e}\"}}"))
}

#[cfg(test)]
mod tests {
    /// A site in words: the function and the cell line that led there; memory a framework's own
    /// thread made, by the framework and the cell that queued it.
    #[test]
    fn sites_in_words() {
        let b = |owner: &str, function: Option<&str>, cell: Option<u64>, line: Option<u32>, queued: bool| OwnerBytes {
            owner: owner.into(),
            function: function.map(str::to_string),
            cell,
            line,
            queued,
            ..Default::default()
        };
        assert_eq!(b("notebook cell", None, Some(4), Some(1), false).site(), "cell 4:1");
        assert_eq!(
            b("candle_core::…", Some("candle_core::Tensor::zeros"), Some(3), Some(2), false).site(),
            "candle_core::Tensor::zeros ← cell 3:2"
        );
        let cubecl =
            b("cubecl_cuda::…", Some("<cubecl_cuda::GpuStorage as ComputeStorage>::alloc"), Some(4), None, true);
        assert_eq!(cubecl.site(), "cubecl ← cell 4");
        assert_eq!(b("libstd-d1237ef7159db0a2.so", None, Some(17), None, true).site(), "a thread ← cell 17");
        // NCCL's proxy thread at the first collective, and its communicator made by the cell.
        assert_eq!(b("libnccl.so.2", Some("libnccl.so.2"), Some(3), None, true).site(), "NCCL ← cell 3");
        assert_eq!(b("libnccl.so.2", Some("libnccl.so.2"), Some(3), Some(4), false).site(), "NCCL ← cell 3:4");
        assert_eq!(b("libcublasLt.so.13", Some("libcublasLt.so.13"), None, None, false).site(), "cuBLASLt");
        // A library we do not know keeps its file name.
        assert_eq!(b("libfoo.so.1", Some("libfoo.so.1"), Some(2), Some(1), false).site(), "libfoo.so.1 ← cell 2:1");
    }

    use super::*;
    use crate::device::BackendKind;

    #[test]
    fn requests_have_the_documented_wire_form() {
        let r = Request { id: 7, op: Op::Pre { cell: 3 } };
        assert_eq!(to_line(&r), r#"{"id":7,"op":"pre","cell":3}"#);
        let r = Request {
            id: 8,
            op: Op::Record(RecordRequest { enabled: RecordMode::State, max_entries: Some(10), stacks: true }),
        };
        assert_eq!(to_line(&r), r#"{"id":8,"op":"record","enabled":"state","max_entries":10,"stacks":true}"#);
        assert_eq!(to_line(&Request { id: 9, op: Op::HistorySvg }), r#"{"id":9,"op":"history_svg"}"#);
        for op in [
            Op::Pre { cell: 1 },
            Op::Post { cell: 1 },
            Op::Read,
            Op::Live,
            Op::Summary,
            Op::Snapshot { dir: "d".into() },
        ] {
            assert!(to_line(&Request { id: 1, op: op.clone() }).contains(&format!("\"op\":\"{}\"", op.name())));
        }
        for line in [
            r#"{"id":7,"op":"pre","cell":3}"#,
            r#"{"id":8,"op":"record","enabled":"state","max_entries":10,"stacks":true}"#,
            r#"{"id":9,"op":"history_svg"}"#,
            r#"{"id":10,"op":"snapshot","dir":"/tmp/x"}"#,
            r#"{"id":11,"op":"on_oom","dir":"/tmp/oom"}"#,
            r#"{"id":12,"op":"on_oom","dir":null}"#,
        ] {
            assert_eq!(to_line(&parse_request(line).unwrap()), line);
        }
    }

    #[test]
    fn skew_is_tolerated_and_garbage_is_named() {
        // An older kernel's `record` without fields: the defaults.
        let r = parse_request(r#"{"id":1,"op":"record","future_field":true}"#).unwrap();
        assert_eq!(r.op, Op::Record(RecordRequest { enabled: RecordMode::All, max_entries: None, stacks: false }));
        let (id, why) = parse_request(r#"{"id":4,"op":"frobnicate"}"#).unwrap_err();
        assert_eq!(id, Some(4));
        assert!(why.starts_with("malformed request") && why.contains("frobnicate"), "{why}");
        let (id, why) = parse_request("not json").unwrap_err();
        assert_eq!(id, None);
        assert!(!why.contains('\n'), "{why}");
        assert!(parse_request(r#"{"id":1,"op":"record","enabled":"sometimes"}"#).unwrap_err().1.contains("sometimes"));
        assert!(parse_request(r#"{"id":1,"op":"pre"}"#).unwrap_err().1.contains("cell"));
        // A reply with fields from a newer crate still reads.
        let reply: Reply = serde_json::from_str(
            r#"{"id":2,"ok":true,"devices":[{"device":0,"backend":"simulated","allocated":1,"reserved":2,
                "peak_allocated":1,"peak_reserved":2,"from_the_future":[1,2]}],"extra":{}}"#,
        )
        .unwrap();
        let d = &reply.devices.unwrap()[0];
        assert_eq!((d.allocated, d.reserved, d.device_free, d.backend), (1, 2, None, BackendKind::Simulated));
        assert_eq!(reply.frameworks, None, "no framework watched: no field");
        // A framework's pool from an older or newer crate: missing counts are 0, unknown
        // fields are ignored; the field is left out when nothing is watched.
        let reply: Reply = serde_json::from_str(
            r#"{"id":3,"ok":true,"frameworks":[{"framework":"cubecl","device":"cuda:0",
                "pools":[{"kind":"sliced","in_use":5,"reserved":8,"future":1}]}]}"#,
        )
        .unwrap();
        let f = &reply.frameworks.as_ref().unwrap()[0];
        assert_eq!((f.framework.as_str(), f.error.as_ref(), f.pools[0].pages), ("cubecl", None, 0));
        assert_eq!(f.pools[0].cached(), 3);
        assert!(!to_line(&Reply::ok(1)).contains("frameworks"));
    }
}
