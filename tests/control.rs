//! The control channel end to end in one process: a listener plays the kernel, the crate
//! connects on first use of a device (because `GPUMEM_NB_CONTROL` names the socket), says
//! hello, and answers per-cell requests with exact numbers from the one process-wide state.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;

#[test]
fn kernel_requests_get_exact_cell_numbers() {
    let dir = std::env::temp_dir().join(format!("gpumem-control-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("control.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    // SAFETY: this test binary has a single test, and no other thread reads the environment
    // while it is set (the crate reads it on first device use, below, on this thread).
    unsafe {
        std::env::set_var("GPUMEM_NB_CONTROL", &sock);
        std::env::set_var("GPUMEM_NB_DEVICE", "sim:1GiB");
    }

    // "Cell 1" loads the crate and allocates: the crate connects.
    let alloc = gpumem_nb::current().unwrap();
    let keep = alloc.malloc(3 << 20, gpumem_nb::StreamId::DEFAULT).unwrap();
    let (conn, _) = listener.accept().unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut writer = conn;
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let hello: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(hello["hello"], 1);
    assert_eq!(hello["pid"], std::process::id());

    let mut ask = |req: Value| -> Value {
        writeln!(writer, "{req}").unwrap();
        let mut l = String::new();
        reader.read_line(&mut l).unwrap();
        serde_json::from_str(&l).unwrap()
    };

    // "Cell 2": allocate 64 MiB and free it inside the cell: the cell's own peak sees it, the
    // numbers after the cell do not.
    let pre = ask(json!({"id": 1, "op": "pre", "cell": 2}));
    assert_eq!((pre["id"].as_u64(), pre["ok"].as_bool()), (Some(1), Some(true)));
    let d0 = &pre["devices"][0];
    assert_eq!(d0["backend"], "simulated");
    assert_eq!(d0["allocated"], 3 << 20);
    assert_eq!(d0["device_total"], 1u64 << 30);
    assert!(d0["pool_used"].is_null(), "no CUDA pool on the simulated device");
    assert!(d0["uuid"].is_null(), "no UUID on the simulated device");
    let tmp = alloc.malloc(64 << 20, gpumem_nb::StreamId::DEFAULT).unwrap();
    alloc.free(tmp.block.unwrap()).unwrap();
    let post = ask(json!({"id": 2, "op": "post", "cell": 2}));
    let d = &post["devices"][0];
    assert_eq!(d["allocated"], 3 << 20);
    assert_eq!(d["peak_allocated"], (3 << 20) + (64 << 20));
    assert_eq!(d["reserved"], (20 << 20) + (64 << 20));
    assert_eq!(d["device_free"], (1u64 << 30) - (84 << 20));

    // A later cell's peak starts again from its own start (the slot is fresh), while the global
    // peak keeps the 67 MiB.
    ask(json!({"id": 3, "op": "pre", "cell": 3}));
    let post = ask(json!({"id": 4, "op": "post", "cell": 3}));
    assert_eq!(post["devices"][0]["peak_allocated"], 3 << 20);
    assert_eq!(alloc.max_memory_allocated(), (3 << 20) + (64 << 20));

    // Allocations made during a cell carry its label; snapshots and the summary over the channel.
    ask(json!({"id": 5, "op": "record", "enabled": "all", "stacks": false}));
    ask(json!({"id": 6, "op": "pre", "cell": 4}));
    let x = alloc.malloc(1 << 20, gpumem_nb::StreamId::DEFAULT).unwrap();
    ask(json!({"id": 7, "op": "post", "cell": 4}));
    let snap = ask(json!({"id": 8, "op": "snapshot", "dir": dir.join("snap")}));
    assert_eq!(snap["ok"], true, "{snap}");
    let pickle = snap["files"]["pickle"].as_str().unwrap();
    assert!(std::path::Path::new(pickle).exists());
    let s = alloc.snapshot();
    let labelled: Vec<_> =
        s.device_traces[0].iter().filter(|e| e.action == "alloc").map(|e| e.user_metadata.clone()).collect();
    assert_eq!(labelled, ["cell 4"]);
    let summary = ask(json!({"id": 9, "op": "summary"}));
    assert_eq!(summary["text"], alloc.memory_summary(false));
    let svg = ask(json!({"id": 10, "op": "history_svg"}));
    assert!(svg["svg"].as_str().unwrap().starts_with("<svg"));
    let bad = ask(json!({"id": 11, "op": "record", "enabled": "sometimes"}));
    assert_eq!(bad["ok"], false);

    // `%gpumem trim`: the allocator's cache given back (cell 2's freed 64 MiB segment among it),
    // what is in use untouched; the figures are the allocator's own, before and after.
    let (reserved, allocated) = (alloc.memory_reserved(), alloc.memory_allocated());
    assert!(reserved >= allocated + (64 << 20), "cell 2's segment is cached: {reserved}");
    let trim = ask(json!({"id": 12, "op": "trim"}));
    assert_eq!(trim["ok"], true, "{trim}");
    let t = trim["trim"].as_array().unwrap();
    assert_eq!(t.len(), 1, "one allocator, and no CUDA pool on the simulated device: {trim}");
    assert_eq!((t[0]["owner"].as_str(), t[0]["device"].as_str()), (Some("gpumem-nb"), Some("simulated:0")));
    assert_eq!(t[0]["reserved_before"], reserved);
    assert_eq!(t[0]["reserved_after"], alloc.memory_reserved());
    assert!(alloc.memory_reserved() <= reserved - (64 << 20), "the freed segment went back: {trim}");
    assert_eq!((t[0]["in_use"].as_u64(), alloc.memory_allocated()), (Some(allocated), allocated));

    // Every copy of the crate in this process reaches the same state: the anchor resolves to it.
    assert!(std::env::var("GPUMEM_NB_ANCHOR").unwrap().contains(&format!("@{}@", std::process::id())));
    let _ = (keep, x);
    let _ = std::fs::remove_dir_all(&dir);
}
