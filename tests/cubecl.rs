//! cubecl's books next to tracking, on the simulated device (feature `cubecl010`): a real cubecl
//! memory manager (cubecl-runtime 0.10's pools, the ones burn 0.21 allocates tensors from) whose
//! storage takes its pages from gpumem-nb's simulated driver, watched through the public API;
//! cells driven through the control channel as gpumem-kernel drives them; each cell's record
//! built by the library as both kernels build it. What is checked: cubecl's in-use bytes are the
//! bytes the cell's tensors asked for, its reserved bytes are the pages its storage holds, the
//! tracked driver bytes are those pages as the driver gave them, in use + padding + cached =
//! reserved, and a re-run that keeps tensors is growth of live tensors while re-runs that only
//! reuse cached pages are not.

use cubecl_common_010::backtrace::BackTrace;
use cubecl_ir_010::MemoryDeviceProperties;
use cubecl_runtime_010::logging::ServerLogger;
use cubecl_runtime_010::memory_management::{
    ManagedMemoryHandle, MemoryConfiguration, MemoryManagement, MemoryManagementOptions,
};
use cubecl_runtime_010::server::IoError;
use cubecl_runtime_010::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use gpumem_nb::frameworks::cubecl010;
use gpumem_nb::kernel::protocol::{Op, Reply};
use gpumem_nb::kernel::report::CellRecord;
use gpumem_nb::mem::DriverBuffer;
use gpumem_nb::units::{MIB, iec_delta};
use gpumem_nb::{Allocator, tracking};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[path = "common/channel.rs"]
mod channel;
use channel::Channel;

/// cubecl's storage over the simulated driver: each page is a driver allocation of whole MiB
/// (the driver's granularity here), freed when cubecl deallocates it.
struct SimStorage {
    alloc: Arc<Allocator>,
    pages: HashMap<StorageId, DriverBuffer>,
    /// Bytes cubecl asked for, page by page (what its books call reserved).
    asked: HashMap<StorageId, u64>,
}

impl SimStorage {
    fn asked(&self) -> u64 {
        self.asked.values().sum()
    }
    fn driver_bytes(&self) -> u64 {
        self.pages.values().map(|b| b.size()).sum()
    }
}

impl ComputeStorage for SimStorage {
    type Resource = u64;

    fn alignment(&self) -> usize {
        256
    }

    fn get(&mut self, handle: &StorageHandle) -> u64 {
        self.pages[&handle.id].addr() + handle.offset()
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let buf = gpumem_nb::mem::driver_alloc_mib_on(&self.alloc, size.div_ceil(MIB))
            .map_err(|_| IoError::BufferTooBig { size, backtrace: BackTrace::capture() })?;
        let id = StorageId::new();
        self.pages.insert(id, buf);
        self.asked.insert(id, size);
        Ok(StorageHandle::new(id, StorageUtilization { offset: 0, size }))
    }

    fn dealloc(&mut self, id: StorageId) {
        self.pages.remove(&id);
        self.asked.remove(&id);
    }

    fn flush(&mut self) {}
}

type Memory = Arc<Mutex<MemoryManagement<SimStorage>>>;

/// One cell's readings, built into its record as the kernels build it.
struct Cells {
    ch: Channel,
}

impl Cells {
    fn ask(&mut self, op: Op) -> Reply {
        let r = self.ch.ask(op);
        assert!(r.ok, "{r:?}");
        r
    }

    /// Runs `work` as cell `n` with the source `code`; its record.
    fn run(&mut self, n: u64, code: &str, work: &mut dyn FnMut()) -> CellRecord {
        let (mut rec, _) = self.ch.cell(n, work);
        tracking::check().unwrap();
        rec.source_hash = code.into();
        rec
    }
}

fn driver_delta(rec: &CellRecord) -> i64 {
    let all = rec.all_allocations.as_ref().unwrap();
    all.place.by_source.iter().find(|s| s.source == "driver").map_or(0, |s| s.delta)
}

fn reserve(mem: &Memory, bytes: u64) -> ManagedMemoryHandle {
    mem.lock().unwrap().reserve(bytes).unwrap()
}

#[test]
fn cubecls_books_sit_beside_its_pages_cell_by_cell() {
    // SAFETY: this test binary has a single test, and nothing reads the environment before
    // this line on another thread.
    unsafe { std::env::set_var("GPUMEM_NB_DEVICE", "sim:8GiB") };
    let alloc = gpumem_nb::current().unwrap();
    let storage = SimStorage { alloc: Arc::clone(&alloc), pages: HashMap::new(), asked: HashMap::new() };
    // CUDA's page limits in cubecl 0.10 are device-derived; these are an H100's order.
    let props = MemoryDeviceProperties { max_page_size: 512 * MIB, alignment: 256 };
    let mem: Memory = Arc::new(Mutex::new(MemoryManagement::from_configuration(
        storage,
        &props,
        MemoryConfiguration::SubSlices,
        Arc::new(ServerLogger::default()),
        MemoryManagementOptions::new("sim"),
    )));
    let m = Arc::clone(&mem);
    cubecl010::watch_usage("sim stream 0", move || Ok(m.lock().unwrap().memory_usage())).unwrap();
    let mut cells = Cells { ch: Channel::new() };
    // The storage's pages: (bytes cubecl asked for, bytes the driver gave).
    let pages = |mem: &Memory| {
        let mut g = mem.lock().unwrap();
        let s = g.storage();
        (s.asked(), s.driver_bytes())
    };
    // Each cell's record and how the storage's pages moved during it.
    let run = |cells: &mut Cells, n: u64, code: &str, work: &mut dyn FnMut()| {
        let (a0, d0) = pages(&mem);
        let rec = cells.run(n, code, work);
        let (a1, d1) = pages(&mem);
        let f = &rec.frameworks[0];
        assert_eq!(f.error, None);
        assert_eq!(f.reserved.after, Some(a1), "cell {n}: cubecl's reserved bytes are its storage's pages");
        assert_eq!(f.reserved.delta(), Some(a1 as i64 - a0 as i64));
        assert_eq!(driver_delta(&rec), d1 as i64 - d0 as i64, "cell {n}: tracking saw the pages come and go");
        let sum = f.in_use.after.unwrap() + f.padding.after.unwrap() + f.cached.after.unwrap();
        assert_eq!(sum, a1, "cell {n}: in use + padding + cached = reserved");
        rec
    };

    // Weights: three tensors kept. cubecl's in-use bytes are what they asked for.
    let mut weights = Vec::new();
    let sizes = [24 * MIB, 8 * MIB, 3 * MIB + 4096];
    let rec = run(&mut cells, 1, "weights", &mut || weights.extend(sizes.iter().map(|&s| reserve(&mem, s))));
    let f = &rec.frameworks[0];
    assert_eq!((f.framework.as_str(), f.device.as_str()), ("cubecl", "sim stream 0"));
    assert_eq!(f.in_use.delta(), Some(sizes.iter().sum::<u64>() as i64));
    assert!(f.reserved.delta().unwrap() > 0 && driver_delta(&rec) > 0, "{f:?}");
    assert_eq!(f.kinds.len(), 1);
    assert_eq!(f.kinds[0].kind, cubecl010::KIND);
    let line = rec.line();
    assert!(line.contains("cubecl in use 35.00 MiB (+35.00 MiB, cached "), "{line}");
    println!("{line}");
    // The README shows this line (up to the device's free memory, which moves with the test
    // order) and the warning below.
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let readme = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let shown = line.split(" · free ").next().unwrap();
    assert!(readme.contains(shown), "README lacks {shown:?}");
    let details = rec.details().to_text();
    assert!(details.contains("cubecl sim stream 0: in use (live tensors)"), "{details}");
    // What the cell left, split as the re-run warning splits it (a first run is not warned of).
    let g = rec.growth().unwrap();
    let cached = f.cached.delta().unwrap();
    assert_eq!(g.bytes, f.reserved.delta().unwrap(), "{g:?}");
    assert_eq!(g.detail.unwrap(), format!("cubecl: live tensors +35.00 MiB, pool reserve {}", iec_delta(cached)));

    // An epoch: activations made and dropped in the cell. The first run may grow the pool; the
    // re-runs find its cached pages and leave nothing behind.
    let mut epoch = || {
        let acts: Vec<_> = [64 * MIB, 32 * MIB, 2 * MIB].iter().map(|&s| reserve(&mem, s)).collect();
        drop(acts);
    };
    let first = run(&mut cells, 2, "epoch", &mut epoch);
    assert_eq!(first.frameworks[0].in_use.delta(), Some(0), "the activations were dropped");
    for n in [3, 4] {
        let again = run(&mut cells, n, "epoch", &mut epoch);
        let f = &again.frameworks[0];
        assert_eq!((f.in_use.delta(), f.reserved.delta()), (Some(0), Some(0)), "cell {n}: {f:?}");
        assert_eq!(again.growth(), None, "an epoch that reuses cached pages is no leak");
    }

    // The mistake: each run keeps its 16 MiB output. Its re-run grew live tensors, and says so.
    let mut kept = Vec::new();
    run(&mut cells, 5, "kept.push(out)", &mut || kept.push(reserve(&mem, 16 * MIB)));
    let rerun = run(&mut cells, 6, "kept.push(out)", &mut || kept.push(reserve(&mem, 16 * MIB)));
    let f = &rerun.frameworks[0];
    assert_eq!(f.in_use.delta(), Some(16 * MIB as i64));
    let g = rerun.growth().expect("a leak of live tensors");
    assert_eq!(g.bytes, f.live_delta().unwrap().max(f.reserved.delta().unwrap()));
    let detail = g.detail.clone().unwrap();
    assert!(detail.starts_with("cubecl: live tensors +16.00 MiB, pool reserve "), "{detail}");
    println!("{}", g.warning(5));
    assert!(readme.contains(&g.warning(5)), "README lacks {:?}", g.warning(5));

    // Everything dropped: cubecl keeps the pages cached.
    let rec = run(&mut cells, 7, "drop", &mut || {
        weights.clear();
        kept.clear();
    });
    let f = &rec.frameworks[0];
    assert_eq!(f.in_use.after, Some(0));
    let (asked, driver) = pages(&mem);
    assert!(asked > 0 && f.cached.after.unwrap() > 0, "the dropped tensors' pages are cached: {f:?}");

    // `%gpumem trim`: cubecl's own cleanup gives its pages back to the driver, and the trim
    // says so in cubecl's own numbers, read before and after.
    let m = Arc::clone(&mem);
    assert!(cubecl010::trim_with("sim stream 0", move || {
        m.lock().unwrap().cleanup(true);
        Ok(())
    }));
    assert!(!cubecl010::trim_with("sim stream 9", || Ok(())), "no watch of that device to give it to");
    let trimmed = cells.ask(Op::Trim).trim.expect("the trim's figures");
    let t = trimmed.iter().find(|t| t.owner == "cubecl").expect("cubecl trimmed");
    let (asked_after, driver_after) = pages(&mem);
    assert_eq!(t.device, "sim stream 0");
    assert_eq!((t.reserved_before, t.reserved_after, t.in_use, &t.error), (asked, asked_after, 0, &None), "{t:?}");
    assert!(t.given_back() > 0 && driver_after < driver, "pages went back: {t:?}, driver {driver} -> {driver_after}");
    let read = cells.ask(Op::Read).frameworks.unwrap();
    assert_eq!(read[0].pools.iter().map(|p| p.reserved).sum::<u64>(), asked_after, "its books agree");
    tracking::check().unwrap();

    assert!(cubecl010::unwatch("sim stream 0"));
    assert_eq!(cells.ask(Op::Read).frameworks, None, "nothing watched: no numbers, no field");
}
