//! The per-cell numbers for Prometheus: the OpenMetrics text of the latest cell record and the
//! session's counters, and (feature `metrics`) a small HTTP endpoint serving it.
//!
//! Every gauge is a field of the latest cell's record (`application/vnd.gpumem.cell+json`),
//! copied from the same reading, so a scrape and the notebook always agree. Names follow
//! OpenTelemetry's GPU conventions where one fits (`hw.gpu.memory.usage` and
//! `hw.gpu.memory.limit`, both in bytes, with `hw.id` and `hw.type="gpu"`), in Prometheus form
//! (`hw_gpu_memory_usage_bytes`); the rest are `gpumem_*`. Series carry:
//!
//! - `hw_id`: the device's UUID from NVML (`GPU-…`); on the simulated device the made-up id
//!   `sim-N` (N its index), never a real UUID; `cuda-N` when NVML gave none;
//! - `source`: what measured it (`allocator`, `pool`, `tracked`, `process`, as in the record);
//! - `host`, `pid` (the process the notebook code runs in) and, when set, `rank` (`RANK`, else
//!   Slurm's `SLURM_PROCID`), `local_rank` (`LOCAL_RANK`, else `SLURM_LOCALID`) and
//!   `slurm_job_id` (`SLURM_JOB_ID`).
//!
//! The counters are the session's: cells executed by status, child restarts, allocation
//! failures, the hooks' time.

use super::report::{CellRecord, CellStatus};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The address served when none is given: loopback, OpenTelemetry's Prometheus exporter port.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9464";

/// The environment variable that turns the endpoint on at start (`HOST:PORT` or `PORT`).
pub const METRICS_VAR: &str = "GPUMEM_NB_METRICS";

/// Where a process's rank is read, in order (the first set to a number counts): the launchers'
/// `RANK` (torchrun, most others), then `SLURM_PROCID`, which `srun` sets for every task.
pub const RANK_VARS: [&str; 2] = ["RANK", "SLURM_PROCID"];

/// Where its rank on this host is read: `LOCAL_RANK`, then Slurm's `SLURM_LOCALID`.
pub const LOCAL_RANK_VARS: [&str; 2] = ["LOCAL_RANK", "SLURM_LOCALID"];

/// Slurm's job id, set for every task of a job.
pub const SLURM_JOB_VAR: &str = "SLURM_JOB_ID";

/// The global rank of a distributed job: `RANK`, else `SLURM_PROCID` (see [`RANK_VARS`]).
pub fn rank() -> Option<u32> {
    first_number(&RANK_VARS, &env_var)
}

/// The rank on this host: `LOCAL_RANK`, else `SLURM_LOCALID`.
pub fn local_rank() -> Option<u32> {
    first_number(&LOCAL_RANK_VARS, &env_var)
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The first of `vars` set to a number (one set to anything else counts as unset).
fn first_number(vars: &[&str], var: &dyn Fn(&str) -> Option<String>) -> Option<u32> {
    vars.iter().find_map(|v| var(v)?.trim().parse().ok())
}

/// Who the series are about, beside the device: host, rank, job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// The host name.
    pub host: String,
    /// The global rank ([`rank`]), when set.
    pub rank: Option<u32>,
    /// The rank on this host ([`local_rank`]), when set.
    pub local_rank: Option<u32>,
    /// Slurm's job id (`SLURM_JOB_ID`), when set.
    pub slurm_job_id: Option<String>,
}

impl Identity {
    /// This process's: the kernel's host name, its rank, local rank and Slurm job.
    pub fn of_process() -> Identity {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "unknown".into());
        Identity::from_vars(host, &env_var)
    }

    /// The identity on `host` that the environment `var` describes (`var(name)`: the variable's
    /// value, if set): ranks from [`RANK_VARS`] and [`LOCAL_RANK_VARS`], the job from
    /// [`SLURM_JOB_VAR`].
    pub fn from_vars(host: String, var: &dyn Fn(&str) -> Option<String>) -> Identity {
        let slurm_job_id = var(SLURM_JOB_VAR).map(|j| j.trim().to_string()).filter(|j| !j.is_empty());
        Identity {
            host,
            rank: first_number(&RANK_VARS, var),
            local_rank: first_number(&LOCAL_RANK_VARS, var),
            slurm_job_id,
        }
    }
}

/// What the endpoint shows: the latest record and the session's counters.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// The latest cell's record.
    pub last: Option<CellRecord>,
    /// Cells executed, by the record's status.
    pub cells: BTreeMap<CellStatus, u64>,
    /// Cells after which the notebook process was another one.
    pub restarts: u64,
    /// Allocation failures the allocator counted, over all cells.
    pub ooms: u64,
    /// Time the per-cell hooks took, over all cells, microseconds.
    pub hook_us: u64,
}

impl State {
    /// Counts a cell and keeps its record as the latest.
    pub fn observe(&mut self, rec: &CellRecord) {
        *self.cells.entry(rec.status).or_default() += 1;
        self.restarts += u64::from(rec.restarted);
        self.ooms += rec.allocator.as_ref().map_or(0, |a| a.ooms);
        self.hook_us += rec.hook_us;
        self.last = Some(rec.clone());
    }
}

/// A [`State`] shared between the code that runs cells and the endpoint's thread.
#[derive(Debug, Default)]
pub struct Exported(Mutex<State>);

impl Exported {
    /// Counts a cell (see [`State::observe`]).
    pub fn observe(&self, rec: &CellRecord) {
        crate::sync::lock(&self.0).observe(rec);
    }

    /// The OpenMetrics text now.
    pub fn render(&self, who: &Identity) -> String {
        render(&crate::sync::lock(&self.0), who)
    }
}

/// The records this process's stock-kernel hooks made (one per process, in the anchor).
pub(crate) fn exported() -> &'static Exported {
    super::anchor::per_process!("metrics", Exported, Exported::default)
}

/// The device id of a record: NVML's UUID, else `sim-N` on the simulated device, else `cuda-N`.
pub fn hw_id(rec: &CellRecord) -> String {
    let index = rec.allocator.as_ref().map(|a| a.device).or(rec.all_allocations.as_ref().and_then(|a| a.place.device));
    let index = index.unwrap_or(0);
    // A cell tracked before gpumem-nb's allocator opened a device (every notebook is tracked
    // from its first cell) says it through its tracking or its device's name.
    let simulated = rec.allocator.as_ref().is_some_and(|a| a.backend == crate::device::BackendKind::Simulated)
        || rec.sources.device.contains("simulated")
        || rec.all_allocations.as_ref().is_some_and(|a| a.tracking == "simulated")
        || rec.device.ends_with("(simulated)");
    match &rec.nvml.uuid {
        Some(uuid) if !simulated => uuid.clone(),
        _ if simulated => format!("sim-{index}"),
        _ => format!("cuda-{index}"),
    }
}

/// One metric family being written.
struct Family<'a> {
    out: &'a mut String,
    name: &'static str,
}

impl Family<'_> {
    fn sample(&mut self, suffix: &str, labels: &[(&str, String)], value: u64) {
        let _ = write!(self.out, "{}{suffix}", self.name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

fn family<'a>(out: &'a mut String, name: &'static str, kind: &str, unit: Option<&str>, help: &str) -> Family<'a> {
    let _ = writeln!(out, "# TYPE {name} {kind}");
    if let Some(unit) = unit {
        let _ = writeln!(out, "# UNIT {name} {unit}");
    }
    let _ = writeln!(out, "# HELP {name} {help}");
    Family { out, name }
}

/// A label value as OpenMetrics writes it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The OpenMetrics text of `state`, ending with `# EOF`.
pub fn render(state: &State, who: &Identity) -> String {
    let mut out = String::new();
    let mut base: Vec<(&str, String)> = vec![("host", who.host.clone())];
    if let Some(r) = who.rank {
        base.push(("rank", r.to_string()));
    }
    if let Some(r) = who.local_rank {
        base.push(("local_rank", r.to_string()));
    }
    if let Some(j) = &who.slurm_job_id {
        base.push(("slurm_job_id", j.clone()));
    }
    if let Some(rec) = &state.last {
        let mut dev = vec![("hw_id", hw_id(rec)), ("hw_type", "gpu".to_string())];
        dev.extend(base.iter().cloned());
        if let Some(pid) = rec.child_pid {
            dev.push(("pid", pid.to_string()));
        }
        let with = |source: &str| {
            let mut l = dev.clone();
            l.push(("source", source.to_string()));
            l
        };
        let alloc = rec.allocator.as_ref();
        let pool = rec.pool.as_ref();
        let all = rec.all_allocations.as_ref().filter(|a| a.is_tracked());
        let usage = [
            ("allocator", alloc.and_then(|a| a.allocated.after)),
            ("pool", pool.and_then(|p| p.used.after)),
            ("tracked", all.and_then(|a| a.place.after)),
            ("process", rec.nvml.process.after),
        ];
        let mut f = family(
            &mut out,
            "hw_gpu_memory_usage_bytes",
            "gauge",
            Some("bytes"),
            "Device memory in use after the latest cell, by source (the cell record's `after`).",
        );
        for (source, v) in usage {
            if let Some(v) = v {
                f.sample("", &with(source), v);
            }
        }
        if let Some(parts) = all.map(|a| &a.place.by_component).filter(|p| !p.is_empty()) {
            let mut f = family(
                &mut out,
                "gpumem_component_bytes",
                "gauge",
                Some("bytes"),
                "Tracked device memory after the latest cell by what it is (PyTorch's components; `cached`: \
                 the allocator's cached free memory).",
            );
            for c in parts {
                let mut l = dev.clone();
                l.push(("component", c.component.to_string()));
                f.sample("", &l, c.after);
            }
        }
        if let Some(total) = rec.crate_device_total.or(rec.nvml.device_total) {
            let mut f = family(
                &mut out,
                "hw_gpu_memory_limit_bytes",
                "gauge",
                Some("bytes"),
                "Size of the device's memory (simulated: the simulated capacity).",
            );
            f.sample("", &dev, total);
        }
        let reserved =
            [("allocator", alloc.and_then(|a| a.reserved.after)), ("pool", pool.and_then(|p| p.reserved.after))];
        if reserved.iter().any(|(_, v)| v.is_some()) {
            let mut f = family(
                &mut out,
                "gpumem_reserved_bytes",
                "gauge",
                Some("bytes"),
                "Device memory reserved after the latest cell (allocator segments, CUDA pool).",
            );
            for (source, v) in reserved {
                if let Some(v) = v {
                    f.sample("", &with(source), v);
                }
            }
        }
        let peak = [
            ("allocator", alloc.map(|a| a.peak_allocated)),
            ("pool", pool.and_then(|p| p.used_high)),
            ("tracked", all.and_then(|a| a.place.peak)),
        ];
        if peak.iter().any(|(_, v)| v.is_some()) {
            let mut f = family(
                &mut out,
                "gpumem_cell_peak_bytes",
                "gauge",
                Some("bytes"),
                "The highest use during the latest cell, by source (the record's peaks).",
            );
            for (source, v) in peak {
                if let Some(v) = v {
                    f.sample("", &with(source), v);
                }
            }
        }
        let peak_reserved =
            [("allocator", alloc.map(|a| a.peak_reserved)), ("pool", pool.and_then(|p| p.reserved_high))];
        if peak_reserved.iter().any(|(_, v)| v.is_some()) {
            let mut f = family(
                &mut out,
                "gpumem_cell_peak_reserved_bytes",
                "gauge",
                Some("bytes"),
                "The highest reservation during the latest cell, by source.",
            );
            for (source, v) in peak_reserved {
                if let Some(v) = v {
                    f.sample("", &with(source), v);
                }
            }
        }
        let mut f = family(&mut out, "gpumem_cell", "gauge", None, "The execution count of the latest cell's record.");
        f.sample("", &base, rec.cell);
    }
    let mut f = family(&mut out, "gpumem_cells", "counter", None, "Cells that ran code, by status.");
    for (status, n) in &state.cells {
        let mut l = base.clone();
        l.push(("status", status.to_string()));
        f.sample("_total", &l, *n);
    }
    let mut f =
        family(&mut out, "gpumem_restarts", "counter", None, "Cells after which the notebook process was another one.");
    f.sample("_total", &base, state.restarts);
    let mut f = family(&mut out, "gpumem_ooms", "counter", None, "Allocation failures the allocator counted.");
    f.sample("_total", &base, state.ooms);
    let mut f =
        family(&mut out, "gpumem_hook_microseconds", "counter", None, "Time the per-cell hooks took, microseconds.");
    f.sample("_total", &base, state.hook_us);
    out.push_str("# EOF\n");
    out
}

/// The address in `spec`: `HOST:PORT`, or `PORT` alone (loopback); empty: [`DEFAULT_ADDR`].
pub fn parse_addr(spec: &str) -> crate::error::Result<std::net::SocketAddr> {
    let spec = spec.trim();
    let full = if spec.is_empty() {
        DEFAULT_ADDR.to_string()
    } else if spec.parse::<u16>().is_ok() {
        format!("127.0.0.1:{spec}")
    } else {
        spec.to_string()
    };
    full.parse().map_err(|_| {
        crate::error::Error::Setting(format!(
            "not an address: `{spec}` (expected PORT or HOST:PORT, e.g. 127.0.0.1:9464)"
        ))
    })
}

#[cfg(feature = "metrics")]
pub use server::{Server, serve, serve_with};

#[cfg(feature = "metrics")]
mod server {
    use super::*;
    use std::sync::Arc;

    /// A running endpoint; it stops when dropped (or with [`Server::stop`]).
    pub struct Server {
        addr: std::net::SocketAddr,
        http: Arc<tiny_http::Server>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl Server {
        /// The address it listens on (the port chosen when 0 was asked).
        pub fn addr(&self) -> std::net::SocketAddr {
            self.addr
        }

        /// Stops serving.
        pub fn stop(mut self) {
            self.halt();
        }

        fn halt(&mut self) {
            self.http.unblock();
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.halt();
        }
    }

    impl std::fmt::Debug for Server {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Server").field("addr", &self.addr).finish()
        }
    }

    /// Serves `text()` at `/metrics` on `addr` (see [`parse_addr`]) from a thread of its own.
    pub fn serve_with(addr: &str, text: impl Fn() -> String + Send + 'static) -> crate::error::Result<Server> {
        let want = parse_addr(addr)?;
        let http = tiny_http::Server::http(want)
            .map_err(|e| crate::error::Error::Endpoint(format!("cannot listen on {want}: {e}")))?;
        let addr = http.server_addr().to_ip().unwrap_or(want);
        let http = Arc::new(http);
        let h = http.clone();
        let thread = std::thread::Builder::new()
            .name("gpumem-metrics".into())
            .spawn(move || {
                for req in h.incoming_requests() {
                    let path = req.url().split('?').next().unwrap_or("");
                    let resp = if path == "/metrics" || path == "/" {
                        let header =
                            tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE).expect("a fixed, valid header");
                        tiny_http::Response::from_string(text()).with_header(header).boxed()
                    } else {
                        tiny_http::Response::from_string("not found: the metrics are at /metrics\n")
                            .with_status_code(404)
                            .boxed()
                    };
                    let _ = req.respond(resp);
                }
            })
            .map_err(|e| crate::error::Error::Endpoint(format!("no thread: {e}")))?;
        Ok(Server { addr, http, thread: Some(thread) })
    }

    /// The stock evcxr kernel's endpoint: serves the per-cell records this process's hooks made
    /// (`notebook::stock`), on `addr` (`""`: [`DEFAULT_ADDR`], loopback). Keep the returned
    /// [`Server`] (in a variable of the notebook): dropping it stops the endpoint.
    pub fn serve(addr: &str) -> crate::error::Result<Server> {
        let who = Identity::of_process();
        serve_with(addr, move || crate::notebook::metrics::exported().render(&who))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notebook::protocol::Held;
    use crate::notebook::report::{AllAllocations, AllocatorPart, ComponentDelta, PlaceAll, PoolPart, Span};
    use crate::record::component::Component;

    fn record() -> CellRecord {
        CellRecord {
            cell: 7,
            status: CellStatus::Ok,
            allocator: Some(AllocatorPart {
                device: 0,
                backend: crate::device::BackendKind::Simulated,
                allocated: Span { before: Some(0), after: Some(512 << 20) },
                reserved: Span { before: Some(0), after: Some(514 << 20) },
                peak_allocated: 1 << 30,
                peak_reserved: 1026 << 20,
                peak_is_cell: true,
                ooms: 1,
                explain: None,
            }),
            pool: Some(PoolPart {
                used: Span { before: Some(0), after: Some(4096) },
                reserved: Span { before: Some(0), after: Some(2 << 20) },
                used_high: Some(8192),
                reserved_high: Some(2 << 20),
            }),
            all_allocations: Some(AllAllocations {
                tracking: "simulated".into(),
                place: PlaceAll {
                    device: Some(0),
                    before: Some(0),
                    after: Some((514 << 20) + (2 << 20)),
                    peak: Some((1026 << 20) + (2 << 20)),
                    by_component: [
                        (Component::Parameter.into(), 512 << 20),
                        (Component::Other.into(), 2 << 20),
                        (Held::Cached, 2 << 20),
                    ]
                    .into_iter()
                    .map(|(component, after)| ComponentDelta { component, before: Some(0), after, peak: None })
                    .collect(),
                    ..Default::default()
                },
                ..Default::default()
            }),
            crate_device_total: Some(80 << 30),
            child_pid: Some(4242),
            hook_us: 250,
            ..Default::default()
        }
    }

    /// The whole text against a golden file: names, units, labels, escaping, order, `# EOF`.
    #[test]
    fn exposition_matches_the_golden_file() {
        let mut s = State::default();
        let mut failed = record();
        failed.cell = 6;
        failed.status = CellStatus::Panicked;
        failed.restarted = true;
        s.observe(&failed);
        s.observe(&record());
        let who = Identity { host: "node\"1".into(), rank: Some(1), local_rank: Some(0), slurm_job_id: None };
        let text = render(&s, &who);
        let golden = include_str!("../../tests/fixtures/metrics/cell.openmetrics");
        assert_eq!(text, golden, "update tests/fixtures/metrics/cell.openmetrics if the change is meant:\n{text}");
    }

    #[test]
    fn every_family_is_typed_once_and_the_text_ends_with_eof() {
        let mut s = State::default();
        s.observe(&record());
        let text = render(&s, &Identity::default());
        assert!(text.ends_with("# EOF\n"));
        let types: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).collect();
        let mut names: Vec<&str> = types.iter().map(|t| t.split(' ').next().unwrap()).collect();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "{types:?}");
        for l in text.lines().filter(|l| l.starts_with("# UNIT ")) {
            let name = l.split(' ').nth(2).unwrap();
            assert!(name.ends_with("_bytes"), "a unit's name ends with it: {l}");
        }
        // Nothing recorded yet: only the counters, all zero.
        let empty = render(&State::default(), &Identity::default());
        assert!(!empty.contains("hw_gpu"), "{empty}");
        assert!(empty.contains("gpumem_restarts_total{host=\"\"} 0"), "{empty}");
    }

    /// A real HTTP request to the endpoint: status, content type, body; a wrong path is a 404.
    #[cfg(feature = "metrics")]
    #[test]
    fn the_endpoint_serves_the_text_with_its_content_type() {
        use std::io::{Read, Write};
        let get = |addr: std::net::SocketAddr, path: &str| {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
            let mut s = String::new();
            c.read_to_string(&mut s).unwrap();
            s
        };
        let server = serve_with("127.0.0.1:0", || "a 1\n# EOF\n".to_string()).unwrap();
        assert!(server.addr().ip().is_loopback() && server.addr().port() != 0);
        let ok = get(server.addr(), "/metrics");
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains(&format!("Content-Type: {CONTENT_TYPE}")), "{ok}");
        assert!(ok.ends_with("a 1\n# EOF\n"), "{ok}");
        assert!(get(server.addr(), "/other").starts_with("HTTP/1.1 404"));
        let addr = server.addr();
        server.stop();
        // tiny_http's accept thread closes the socket as it winds down: soon, not at once.
        let t = std::time::Instant::now();
        while std::net::TcpStream::connect(addr).is_ok() {
            assert!(t.elapsed() < std::time::Duration::from_secs(5), "still listening after stop");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(serve_with("nowhere", String::new).unwrap_err().to_string().contains("not an address"));
    }

    /// torchrun's variables win; Slurm's (what `srun` sets for each task) stand in for them;
    /// the job is Slurm's, and it labels every series beside host and rank.
    #[test]
    fn ranks_and_the_job_come_from_the_launcher_or_from_slurm() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        let slurm = Identity::from_vars(
            "gn07".into(),
            &env(&[("SLURM_PROCID", "5"), ("SLURM_LOCALID", "1"), ("SLURM_JOB_ID", " 81234\n")]),
        );
        assert_eq!(
            slurm,
            Identity { host: "gn07".into(), rank: Some(5), local_rank: Some(1), slurm_job_id: Some("81234".into()) }
        );
        let both = Identity::from_vars(
            "h".into(),
            &env(&[("RANK", "2"), ("LOCAL_RANK", "0"), ("SLURM_PROCID", "5"), ("SLURM_LOCALID", "1")]),
        );
        assert_eq!((both.rank, both.local_rank, both.slurm_job_id), (Some(2), Some(0), None));
        let odd = Identity::from_vars("h".into(), &env(&[("RANK", "x"), ("SLURM_PROCID", "3"), ("SLURM_JOB_ID", "")]));
        assert_eq!((odd.rank, odd.local_rank, odd.slurm_job_id), (Some(3), None, None), "not a number: unset");
        assert_eq!(Identity::from_vars("h".into(), &env(&[])), Identity { host: "h".into(), ..Identity::default() });

        let mut s = State::default();
        s.observe(&record());
        let text = render(&s, &slurm);
        let labels = "host=\"gn07\",rank=\"5\",local_rank=\"1\",slurm_job_id=\"81234\"";
        assert!(text.contains(&format!("gpumem_cell{{{labels}}} 7\n")), "{text}");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.contains(labels), "every series names the job and the rank: {line}");
        }
    }

    #[test]
    fn ids_and_addresses() {
        let mut r = record();
        assert_eq!(hw_id(&r), "sim-0");
        r.allocator.as_mut().unwrap().backend = crate::device::BackendKind::Cuda;
        if let Some(a) = r.all_allocations.as_mut() {
            a.tracking = "cupti".into();
        }
        r.device = "cuda:0".into();
        r.nvml.uuid = Some("GPU-abc".into());
        assert_eq!(hw_id(&r), "GPU-abc");
        r.nvml.uuid = None;
        assert_eq!(hw_id(&r), "cuda-0");
        // Tracked before the allocator opened a device, on the simulated one.
        let tracked = CellRecord {
            all_allocations: Some(crate::notebook::report::AllAllocations {
                tracking: "simulated".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(hw_id(&tracked), "sim-0");
        assert_eq!(parse_addr("").unwrap().to_string(), DEFAULT_ADDR);
        assert_eq!(parse_addr("9000").unwrap().to_string(), "127.0.0.1:9000");
        assert_eq!(parse_addr("0.0.0.0:9000").unwrap().to_string(), "0.0.0.0:9000");
        assert!(parse_addr("localhost:x").unwrap_err().to_string().contains("not an address"));
    }
}
