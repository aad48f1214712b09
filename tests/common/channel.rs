//! The kernel's end of the control channel, in one process: the crate serves the other end of
//! a socket pair on a thread, as it does in a notebook child, and `ask` sends one request and
//! reads its reply. Shared by the tests that speak to the crate as the kernel does (`tests/tracking.rs`, …) and by `examples/track_check.rs` and `examples/report_cost.rs`.

use gpumem_nb::device::nvml::NvmlSnapshot;
use gpumem_nb::kernel::control::serve;
use gpumem_nb::kernel::protocol::{Op, Reply, Request, to_line};
use gpumem_nb::kernel::report::{CellRecord, Readings, TrackedReadings, build_record, framework_parts};
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

    /// Runs `work` between `pre` and `post` as cell `n`, as the kernels do, and builds the
    /// cell's record from the two readings (without NVML); the record and the `post` reply.
    #[allow(dead_code)]
    pub(crate) fn cell(&mut self, n: u64, work: &mut dyn FnMut()) -> (CellRecord, Reply) {
        let mut pre = self.ask(Op::Pre { cell: n });
        assert!(pre.ok, "{pre:?}");
        let fw_before = pre.frameworks.take();
        let (dev_before, tracked_before) = TrackedReadings::of_reply(pre);
        work();
        let post = self.ask(Op::Post { cell: n });
        assert!(post.ok, "{post:?}");
        let mut kept = post.clone();
        let fw_after = kept.frameworks.take();
        let (dev_after, tracked_after) = TrackedReadings::of_reply(kept);
        let none = NvmlSnapshot::default();
        let mut rec = build_record(
            n,
            &Readings {
                crate_before: Some(&dev_before),
                crate_after: Some(&dev_after),
                tracked_before: tracked_before.as_ref(),
                tracked_after: tracked_after.as_ref(),
                slot_opened: true,
                nvml_before: &none,
                nvml_after: &none,
                pid_before: Some(1),
                pid_after: Some(1),
            },
        );
        rec.frameworks = framework_parts(fw_before.as_deref(), fw_after.as_deref());
        (rec, post)
    }
}
