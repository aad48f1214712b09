//! The kernel's metrics endpoint for Prometheus (`%gpumem metrics on [ADDR]`, or
//! `GPUMEM_NB_METRICS=ADDR` at start): every cell's record is counted and the latest one served
//! in the OpenMetrics text format (`gpumem_nb::metrics`), from the kernel process, so it
//! outlives restarts of the notebook child. Loopback (`127.0.0.1:9464`) unless an address is
//! given.

use gpumem_nb::metrics::{self as om, Exported, Identity, METRICS_VAR, Server};
use gpumem_nb::notebook::report::CellRecord;
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
        let server = om::serve_with(addr, move || state.render(&who))?;
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
