//! The kernel's metrics endpoint for Prometheus (`%gpumem metrics on [ADDR]`, or
//! `GPUMEM_NB_METRICS=ADDR` at start): every cell's record is counted and the latest one served
//! in the OpenMetrics text format (`gpumem_nb::metrics`), from the kernel process, so it
//! outlives restarts of the notebook child. Loopback (`127.0.0.1:9464`) unless an address is
//! given.

use gpumem_nb::kernel::report::CellRecord;
use gpumem_nb::metrics::{self as om, Exported, Identity, METRICS_VAR, Server};
use std::net::SocketAddr;
use std::sync::Arc;

/// The session's counters and latest record, and the endpoint serving them when it is on.
pub struct Endpoint {
    state: Arc<Exported>,
    who: Identity,
    server: Option<Server>,
}

impl Default for Endpoint {
    fn default() -> Self {
        Endpoint { state: Arc::default(), who: Identity::of_process(), server: None }
    }
}

impl Endpoint {
    /// Off, unless `GPUMEM_NB_METRICS` names an address: then on there; the error (a bad
    /// address, a port in use) as a notice for the first cell.
    pub fn from_env() -> (Endpoint, Option<String>) {
        let mut e = Endpoint::default();
        let notice = match std::env::var(METRICS_VAR) {
            Ok(addr) => match e.start(&addr) {
                Ok(at) => {
                    eprintln!("gpumem-kernel: metrics at http://{at}/metrics");
                    None
                }
                Err(why) => Some(format!("gpumem-kernel: {METRICS_VAR}={addr}: {why}")),
            },
            Err(_) => None,
        };
        (e, notice)
    }

    /// Serves on `addr` (`""`: loopback, the default port), replacing an endpoint already on.
    pub fn start(&mut self, addr: &str) -> Result<SocketAddr, String> {
        self.server = None;
        let state = self.state.clone();
        let who = self.who.clone();
        let server = om::serve_with(addr, move || state.render(&who)).map_err(|e| e.to_string())?;
        let at = server.addr();
        self.server = Some(server);
        Ok(at)
    }

    /// Stops serving; where it served, if it did.
    pub fn stop(&mut self) -> Option<SocketAddr> {
        self.server.take().map(|s| {
            let at = s.addr();
            s.stop();
            at
        })
    }

    /// Where it serves now.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(Server::addr)
    }

    /// Counts a cell's record and makes it the latest (whether or not the endpoint is on).
    pub fn observe(&self, rec: &CellRecord) {
        self.state.observe(rec);
    }

    /// The text a scrape gets now.
    pub fn text(&self) -> String {
        self.state.render(&self.who)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// What `%gpumem metrics on 127.0.0.1:0` then a cell do: the endpoint serves the cell's
    /// record; `off` stops it and says where it was.
    #[test]
    fn the_endpoint_serves_the_latest_record_and_stops() {
        let mut e = Endpoint::default();
        assert_eq!(e.addr(), None);
        let at = e.start("127.0.0.1:0").unwrap();
        let rec = CellRecord {
            cell: 4,
            status: gpumem_nb::kernel::report::CellStatus::Ok,
            allocator: Some(gpumem_nb::kernel::report::AllocatorPart {
                allocated: gpumem_nb::kernel::report::Span { before: Some(0), after: Some(3 << 20) },
                ..Default::default()
            }),
            child_pid: Some(77),
            ..Default::default()
        };
        e.observe(&rec);
        let mut c = std::net::TcpStream::connect(at).unwrap();
        write!(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut got = String::new();
        c.read_to_string(&mut got).unwrap();
        assert!(got.contains("source=\"allocator\"} 3145728\n"), "{got}");
        assert!(got.contains("gpumem_cell{") && got.contains("} 4\n"), "{got}");
        assert!(got.contains("gpumem_cells_total{") && got.ends_with("# EOF\n"), "{got}");
        assert_eq!(e.text(), got[got.find("# TYPE").unwrap()..]);
        assert_eq!(e.stop(), Some(at));
        assert_eq!(e.stop(), None, "already off");
        assert!(e.start("127.0.0.1:x").unwrap_err().contains("not an address"));
    }
}
