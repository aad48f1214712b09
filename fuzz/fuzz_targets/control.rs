//! The control channel's child end: whatever the peer sends, every answer is a protocol
//! `Reply`, at most one per line, and lines that are not requests change nothing.
#![no_main]

use gpumem_nb::kernel::control::serve;
use gpumem_nb::kernel::protocol::{Op, Reply, Request, parse_request, to_line};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// A simulated device opened once, so requests act on a real allocator.
fn device() -> std::sync::Arc<gpumem_nb::Allocator> {
    static DEV: OnceLock<std::sync::Arc<gpumem_nb::Allocator>> = OnceLock::new();
    DEV.get_or_init(|| {
        // SAFETY: set once, before any other thread of this process reads the environment.
        unsafe { std::env::set_var("GPUMEM_NB_DEVICE", "sim:1GiB") };
        let a = gpumem_nb::current().expect("the simulated device");
        let _keep = Box::leak(Box::new(a.malloc(3 << 20, gpumem_nb::StreamId::DEFAULT).expect("a block")));
        a
    })
    .clone()
}

fuzz_target!(|data: &[u8]| {
    let alloc = device();
    // Snapshots (also those on out-of-memory) go to a scratch directory, never where the input
    // says.
    let scratch = std::env::temp_dir().join("gpumem-fuzz-control");
    let mut input = Vec::new();
    let mut requests = 0;
    for line in data.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        match std::str::from_utf8(line).ok().map(parse_request) {
            Some(Ok(mut req)) => {
                requests += 1;
                match &mut req.op {
                    Op::Snapshot { dir } | Op::OnOom { dir: Some(dir) } => *dir = scratch.display().to_string(),
                    _ => {}
                }
                input.extend_from_slice(to_line(&Request { id: req.id, op: req.op }).as_bytes());
            }
            _ => input.extend_from_slice(line),
        }
        input.push(b'\n');
    }
    let (stats, history) = (alloc.memory_stats(), alloc.history_options());
    let mut out = Vec::new();
    serve(&input[..], &mut out);
    // Lines with more than JSON's whitespace (space, tab, CR) get an answer each.
    let lines = input.split(|&b| b == b'\n').filter(|l| !l.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r'))).count();
    let mut replies = 0;
    for l in out.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let reply: Reply = serde_json::from_slice(l).expect("every answer is a Reply");
        assert!(reply.ok || reply.error.as_deref().is_some_and(|e| !e.contains('\n')), "{reply:?}");
        replies += 1;
    }
    assert!(replies <= lines, "{replies} replies to {lines} lines");
    if requests == 0 {
        assert_eq!(alloc.memory_stats(), stats, "a line that is no request changed the allocator");
        assert_eq!(alloc.history_options(), history);
    }
});
