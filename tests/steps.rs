//! `gpumem_nb::steps`: a program's steps recorded as notebook cells are, with exact numbers, and
//! (feature `metrics`) the endpoint serving the latest step. One test: every step reads the
//! process's devices, so nothing else may allocate on them meanwhile.

use gpumem_nb::steps::Steps;
use gpumem_nb::units::MIB;
use gpumem_nb::{Component, DeviceBuffer, StreamId, component};

fn buf(bytes: u64) -> DeviceBuffer<u8> {
    DeviceBuffer::zeros(&gpumem_nb::current().unwrap(), bytes as usize, StreamId::DEFAULT).unwrap()
}

#[test]
fn each_step_has_its_own_exact_peak_and_components() {
    // 4 MiB of parameters: a 20 MiB segment of the large pool.
    let _params = component(Component::Parameter, || buf(4 * MIB));
    let mut steps = Steps::new();
    // Step 1: a 64 MiB temporary (a segment of its own, cached once freed).
    steps.begin(1);
    component(Component::Temp, || drop(buf(64 * MIB)));
    let one = steps.end().unwrap();
    // Step 2: a 32 MiB temporary, split off the cached 64 MiB block.
    steps.begin(2);
    component(Component::Temp, || drop(buf(32 * MIB)));
    let two = steps.end().unwrap();

    let a1 = one.allocator.as_ref().unwrap();
    assert_eq!((one.cell, one.label.as_str()), (1, "cell 1"));
    assert_eq!((a1.allocated.before, a1.allocated.after), (Some(4 * MIB), Some(4 * MIB)));
    assert_eq!((a1.reserved.before, a1.reserved.after), (Some(20 * MIB), Some(84 * MIB)));
    assert_eq!((a1.peak_allocated, a1.peak_reserved, a1.peak_is_cell), (68 * MIB, 84 * MIB, true));
    let a2 = two.allocator.as_ref().unwrap();
    assert_eq!((a2.allocated.after, a2.reserved.after), (Some(4 * MIB), Some(84 * MIB)));
    assert_eq!((a2.peak_allocated, a2.peak_reserved), (36 * MIB, 84 * MIB), "step 2's own peak, not step 1's");
    assert_eq!(two.child_pid, Some(std::process::id()));

    // What memory is, when tracking has stacks (the default): parameters kept, the temporary's peak.
    if let Some(all) = two.all_allocations.as_ref().filter(|a| !a.place.by_component.is_empty()) {
        let part = |key: &str| all.place.by_component.iter().find(|c| c.component.to_string() == key).cloned();
        assert_eq!(part("parameter").map(|c| c.after), Some(4 * MIB), "{all:?}");
        let temp = part("temp").unwrap();
        assert_eq!((temp.after, temp.peak), (0, Some(32 * MIB)), "{all:?}");
    }

    #[cfg(feature = "metrics")]
    {
        use std::io::{Read, Write};
        let server = gpumem_nb::metrics::serve("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(server.addr()).unwrap();
        write!(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut text = String::new();
        c.read_to_string(&mut text).unwrap();
        let value = |name: &str, source: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("source=\"{source}\"")))
                .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        };
        assert_eq!(value("gpumem_cell_peak_bytes", "allocator"), Some(36 * MIB), "{text}");
        assert_eq!(value("gpumem_reserved_bytes", "allocator"), Some(84 * MIB), "{text}");
        assert!(text.lines().any(|l| l.starts_with("gpumem_cell{") && l.ends_with(" 2")), "{text}");
        assert!(text.lines().any(|l| l.starts_with("gpumem_cells_total{") && l.ends_with(" 2")), "{text}");
    }
}
