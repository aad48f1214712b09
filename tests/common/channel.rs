//! The kernel's end of the control channel, in one process: the crate serves the other end of
//! a socket pair on a thread, as it does in a notebook child, and `ask` sends one request and
//! reads its reply. Shared by the tests that speak to the crate as the kernel does (`tests/tracking.rs`, …) and by `examples/track_check.rs` and `examples/report_cost.rs`.

use gpumem_nb::kernel::control::serve;
use gpumem_nb::kernel::protocol::{Op, Reply, Request, to_line};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

pub(crate) struct Channel {
    out: UnixStream,
    replies: BufReader<UnixStream>,
    next: u64,
}

impl Channel {
    /// A channel with the crate serving its far end.
    pub(crate) fn new() -> Channel {
        let (kernel, child) = UnixStream::pair().expect("socketpair");
        let w = child.try_clone().expect("clone");
        std::thread::spawn(move || serve(BufReader::new(child), w));
        Channel { out: kernel.try_clone().expect("clone"), replies: BufReader::new(kernel), next: 1 }
    }

    /// Sends `op` and returns the crate's reply (an error reply too: `ok` says which).
    pub(crate) fn ask(&mut self, op: Op) -> Reply {
        let id = self.next;
        self.next += 1;
        writeln!(self.out, "{}", to_line(&Request { id, op })).expect("write");
        let mut line = String::new();
        self.replies.read_line(&mut line).expect("read");
        serde_json::from_str(&line).expect("a reply")
    }
}
