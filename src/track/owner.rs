//! Who made an allocation, and where: its *site*, from its stack.
//!
//! A stack taken in a CUPTI callback starts with our own frames, then CUPTI's and the driver's
//! (`libcupti`, `libcuda`, maybe `libcudart`). The first frame after that run is the caller of
//! the CUDA API. If it lies in another shared library (`libcublasLt.so.13`, `libnccl.so.2`,
//! `libtorch_cuda.so`) that library is the owner and the site's function. Otherwise it is Rust
//! code of the program or of a notebook cell: the first symbol that is not a wrapper (cudarc,
//! gpumem-nb, the standard library) is the site's function (`candle_core::tensor::Tensor::zeros`)
//! and names the owner by its crate (`candle_core::…`), or the notebook cell for the cell's own
//! code. Stacks without CUDA frames (the simulated driver) start at the first frame outside
//! gpumem-nb.
//!
//! The notebook side of a site is the innermost frame in notebook code (evcxr's cell crate,
//! `ctx`): its cell and line through [`LineMap`] (the cell's library's `lib.rs`, read where
//! evcxr keeps it, against the cells' texts the kernel sent), and the function's name when it
//! is one the notebook defined. A frame of the running cell's own body without a line map still
//! names its cell (the allocation's label).
//!
//! Symbols through [`Symbolizer`]; every answer is cached (per address, per stack, per cell
//! library), and only computed when a report asks, never in the callback.
#![forbid(unsafe_code)]

use crate::record::cells::{LineMap, run_number};
use crate::record::frames::{Frames, Resolved, Symbolizer};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

/// The crate evcxr compiles every cell into.
const CELL_CRATE: &str = "ctx";

/// Where an allocation was made.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Site {
    /// The library or crate that made it (`libcublasLt.so.13`, `candle_core::…`,
    /// `notebook cell`), or why it is unknown.
    pub owner: String,
    /// Full path of the innermost function outside CUDA, cudarc, gpumem-nb and std (a library
    /// without symbols: its file name; a function the notebook defined: its name); `None` for
    /// the cell's own code.
    pub function: Option<String>,
    /// The cell of the innermost notebook frame.
    pub cell: Option<u64>,
    /// Its line (1 = the cell's first line).
    pub line: Option<u32>,
    /// The running cell's line that led there, when the innermost notebook frame is elsewhere
    /// (in a function an earlier cell defined).
    pub called_from: Option<(u64, u32)>,
}

impl Site {
    /// An unknown site, with the reason as its owner.
    pub(crate) fn unknown(why: &str) -> Site {
        Site { owner: why.to_string(), ..Default::default() }
    }
}

/// A cell library's run number (`run_user_code_N`) and the line map of its `lib.rs`.
type Library = (u64, Option<Arc<LineMap>>);

/// Names sites; keeps its caches between calls.
#[derive(Default)]
pub(crate) struct Owners {
    symbols: Symbolizer,
    exe: Option<String>,
    by_stack: HashMap<(Frames, u64), Site>,
    /// The notebook's cells (execution count → code).
    cells: BTreeMap<u64, String>,
    /// Cell library path → its run number and line map.
    libraries: HashMap<Arc<str>, Option<Library>>,
}

/// CUDA's own layers: never an owner.
fn is_cuda_layer(name: &str) -> bool {
    ["libcupti.so", "libcuda.so", "libcudart.so", "libnvidia-"].iter().any(|p| name.starts_with(p))
}

/// The C runtime under everything (a thread's start, `main`'s caller): never an owner.
fn is_system(name: &str) -> bool {
    ["libc.so", "libpthread.so", "libdl.so", "libm.so", "ld-linux", "libgcc_s.so", "libstdc++.so"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// Symbols that wrap the CUDA API for someone else: skipped to find who asked.
fn is_wrapper(sym: &str) -> bool {
    let s = sym.trim_start_matches('<');
    // A function named like a driver entry point (`cuMemAlloc_v2`) outside libcuda is a shim
    // that forwards to it (cudarc's dynamic loading defines them).
    let cuda_shim = s.strip_prefix("cu").is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_uppercase()));
    cuda_shim
        || ["cudarc::", "gpumem_nb::", "core::", "std::", "alloc::", "backtrace::", "framehop::", "__rust", "_Unwind"]
            .iter()
            .any(|p| s.starts_with(p))
}

/// Whether a symbol is the notebook's own code (evcxr's cell crate).
fn is_cell_code(sym: &str) -> bool {
    let s = sym.trim_start_matches('<');
    s.strip_prefix(CELL_CRATE).is_some_and(|r| r.starts_with("::"))
}

/// Whether a notebook symbol is a cell's body (`run_user_code_N`, its closures), not a
/// function the notebook defined.
fn is_cell_body(sym: &str) -> bool {
    sym.contains("run_user_code_")
}

/// A notebook function's name as the notebook wrote it (`alloc48`, `<Model as Forward>::run`).
fn notebook_name(sym: &str) -> String {
    sym.replacen(&format!("{CELL_CRATE}::"), "", usize::MAX)
}

/// The owner's name from a symbol: `candle_core::…`, or `notebook cell` for the cell's code.
fn owner_of_symbol(sym: &str) -> String {
    let s = sym.trim_start_matches('<');
    if is_cell_code(s) || s.contains("run_user_code_") {
        return "notebook cell".to_string();
    }
    match s.split_once("::") {
        Some((krate, _)) => format!("{krate}::…"),
        None => s.to_string(),
    }
}

/// The directory of evcxr's cell crate a cell library was built in (`…/target/<triple>/debug/
/// libcode_N.so` → `…`).
fn crate_dir(library: &Path) -> Option<&Path> {
    library.ancestors().skip(1).find(|d| d.join("src").join("lib.rs").is_file() && d.join("Cargo.toml").is_file())
}

/// The `run_user_code_N` a cell library exports.
fn exported_run(library: &Path) -> Option<u64> {
    use object::{Object, ObjectSymbol};
    let file = std::fs::File::open(library).ok()?;
    let cache = object::ReadCache::new(file);
    let obj = object::File::parse(&cache).ok()?;
    obj.dynamic_symbols().find_map(|s| s.name().ok()?.strip_prefix("run_user_code_")?.parse().ok())
}

impl Owners {
    /// Empty caches.
    pub(crate) fn new() -> Self {
        Owners { exe: std::env::current_exe().ok().and_then(|p| file_name(&p)), ..Default::default() }
    }

    /// Notes the code of a cell (as its user sees it), for the lines of later sites.
    pub(crate) fn set_cell_code(&mut self, cell: u64, code: &str) {
        self.cells.insert(cell, code.to_string());
        // Line maps built without this cell may miss its functions: build them again.
        self.libraries.retain(|_, v| v.as_ref().is_some_and(|(_, m)| m.is_some()));
        self.by_stack.retain(|_, s| s.line.is_some() || s.cell.is_none());
    }

    /// Whether a module is the program or a notebook cell's library (code named by symbol).
    fn ours(&self, module: &str) -> bool {
        Some(module) == self.exe.as_deref() || module.starts_with("libcode_")
    }

    /// The run number and line map of a cell library (read once; the map only while the
    /// library's `lib.rs` is still the one it was built from).
    fn library(&mut self, path: &Arc<str>) -> Option<Library> {
        if let Some(v) = self.libraries.get(path) {
            return v.clone();
        }
        let p = Path::new(&**path);
        let v = exported_run(p).map(|run| {
            let map = crate_dir(p)
                .and_then(|d| std::fs::read_to_string(d.join("src").join("lib.rs")).ok())
                .filter(|lib| run_number(lib) == Some(run) && !self.cells.is_empty())
                .map(|lib| {
                    let cells: Vec<(u64, &str)> = self.cells.iter().map(|(n, c)| (*n, c.as_str())).collect();
                    Arc::new(LineMap::build(&lib, &cells))
                });
            (run, map)
        });
        self.libraries.insert(path.clone(), v.clone());
        v
    }

    /// The site of an allocation with this stack (innermost frame first), made while the
    /// notebook ran cell `label_cell` (0: none).
    pub(crate) fn site(&mut self, frames: &Frames, label_cell: u64) -> Site {
        if let Some(s) = self.by_stack.get(&(frames.clone(), label_cell)) {
            return s.clone();
        }
        let s = self.compute(frames, label_cell);
        self.by_stack.insert((frames.clone(), label_cell), s.clone());
        s
    }

    fn compute(&mut self, frames: &[usize], label_cell: u64) -> Site {
        let resolved: Vec<Arc<Resolved>> = frames.iter().map(|&ip| self.symbols.resolve(ip)).collect();
        let start = caller_of(&resolved);
        let mut site = Site::default();
        let mut in_cell = false;
        // Owner and function: the first frame outside CUDA, the C runtime and the wrappers.
        for r in &resolved[start..] {
            let module = &*r.module;
            if is_cuda_layer(module) || is_system(module) {
                continue;
            }
            if !module.is_empty() && !self.ours(module) {
                site.owner = module.to_string();
                site.function = Some(module.to_string());
                break;
            }
            in_cell |= module.starts_with("libcode_");
            // Inlined frames carry only their short name (`zeros`): one is only trusted when it
            // is the notebook's own code (a cell library's `lib.rs`), and named as the notebook.
            let named = r.frames.iter().find_map(|f| {
                let n = f.name.as_str();
                if n.contains("::") {
                    (!is_wrapper(n) && !n.starts_with("0x")).then(|| n.to_string())
                } else {
                    notebook_short(r, f).then(|| format!("{CELL_CRATE}::{n}"))
                }
            });
            if let Some(name) = named.as_deref() {
                site.owner = owner_of_symbol(name);
                site.function = if is_cell_code(name) {
                    (!is_cell_body(name)).then(|| notebook_name(name))
                } else {
                    Some(name.to_string())
                };
                break;
            }
        }
        if site.owner.is_empty() {
            // evcxr's cell libraries without readable symbols: still the notebook's code.
            site.owner = if in_cell { "notebook cell".into() } else { "unknown (stack too short)".into() };
        }
        // Cell and line: the innermost notebook frame; the outermost one too, for `called_from`.
        let mut innermost: Option<(Option<u64>, Option<u32>)> = None;
        let mut outermost: Option<(u64, u32)> = None;
        for r in &resolved[start..] {
            if !r.module.starts_with("libcode_") {
                continue;
            }
            let map = self.library(&r.path).and_then(|(_, m)| m);
            for f in &r.frames {
                if !is_cell_code(&f.name) && !notebook_short(r, f) {
                    continue;
                }
                let mapped = map.as_ref().filter(|_| f.filename.ends_with("lib.rs")).and_then(|m| m.lookup(f.line));
                let place = match mapped {
                    Some((c, l)) => (Some(c), Some(l)),
                    None if is_cell_body(&f.name) && label_cell > 0 => (Some(label_cell), None),
                    None => (None, None),
                };
                if innermost.is_none() {
                    innermost = Some(place);
                }
                if let (Some(c), Some(l)) = place {
                    outermost = Some((c, l));
                }
            }
        }
        if let Some((cell, line)) = innermost {
            site.cell = cell;
            site.line = line;
            site.called_from = outermost.filter(|o| Some(*o) != cell.zip(line));
        }
        site
    }

    /// Where the caller of the CUDA API starts in a stack (frames before it are ours, CUPTI's
    /// and the driver's): what a snapshot shows of the stack.
    pub(crate) fn caller_index(&mut self, frames: &[usize]) -> usize {
        let resolved: Vec<Arc<Resolved>> = frames.iter().map(|&ip| self.symbols.resolve(ip)).collect();
        caller_of(&resolved)
    }

    /// The notebook's frames of a stack, for snapshots: each frame of a cell library mapped to
    /// `cell N` and its line where the line map knows it, the others as symbolised.
    pub(crate) fn frames(&mut self, frames: &[usize]) -> Vec<crate::record::frames::Frame> {
        let start = self.caller_index(frames);
        let mut out = Vec::new();
        for &ip in &frames[start..] {
            let r = self.symbols.resolve(ip);
            let map = if r.module.starts_with("libcode_") { self.library(&r.path).and_then(|(_, m)| m) } else { None };
            for f in &r.frames {
                let mut f = f.clone();
                if let Some((cell, line)) =
                    map.as_ref().filter(|_| f.filename.ends_with("lib.rs")).and_then(|m| m.lookup(f.line))
                {
                    f.filename = format!("cell {cell}");
                    f.line = line;
                }
                if is_cell_code(&f.name) {
                    f.name = notebook_name(&f.name);
                }
                out.push(f);
            }
        }
        crate::record::frames::keep_user(out)
    }

    /// Who made the allocation with this stack (innermost frame first); `None` when the stack
    /// says nothing (empty, or it ends inside CUDA's libraries).
    #[cfg(test)]
    pub(crate) fn owner(&mut self, frames: &[usize]) -> Option<String> {
        let s = self.compute(frames, 0);
        (!s.owner.starts_with("unknown")).then_some(s.owner)
    }
}

/// An inlined frame of the notebook's own code: a short name in a cell library's `lib.rs`.
fn notebook_short(r: &Resolved, f: &crate::record::frames::Frame) -> bool {
    !f.name.contains("::") && r.module.starts_with("libcode_") && f.filename.ends_with("lib.rs")
}

/// Index of the first frame after the first run of CUDA-layer frames (the API's caller), or 0
/// when the stack has none.
fn caller_of(resolved: &[Arc<Resolved>]) -> usize {
    match resolved.iter().position(|r| is_cuda_layer(&r.module)) {
        Some(first) => first + resolved[first..].iter().take_while(|r| is_cuda_layer(&r.module)).count(),
        None => 0,
    }
}

fn file_name(p: &Path) -> Option<String> {
    p.file_name().and_then(|n| n.to_str()).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn caller_of_capture() -> Frames {
        crate::record::frames::capture()
    }

    #[test]
    fn names_come_from_crates_libraries_and_cells() {
        assert_eq!(owner_of_symbol("candle_core::tensor::Tensor::zeros"), "candle_core::…");
        assert_eq!(owner_of_symbol("<candle_core::Foo as Bar>::baz"), "candle_core::…");
        assert_eq!(owner_of_symbol("ctx::run_user_code_5"), "notebook cell");
        assert_eq!(owner_of_symbol("ctx::alloc48"), "notebook cell");
        assert!(is_wrapper("cudarc::driver::safe::core::CudaStream::alloc_zeros"));
        assert!(is_wrapper("<alloc::vec::Vec<T>>::push"));
        assert!(!is_wrapper("candle_core::storage::Storage::zeros"));
        assert!(is_wrapper("cuMemAlloc_v2") && is_wrapper("cuMemAllocAsync") && !is_wrapper("cublas_helper"));
        assert!(is_cuda_layer("libcuda.so.1") && is_cuda_layer("libcupti.so.13") && !is_cuda_layer("libcublas.so.13"));
        assert!(is_system("libc.so.6") && is_system("ld-linux-x86-64.so.2") && !is_system("libcublasLt.so.13"));
        assert!(
            is_cell_code("ctx::alloc48") && is_cell_code("<ctx::Model as ctx::Run>::go") && !is_cell_code("ctxx::a")
        );
        assert!(is_cell_body("ctx::run_user_code_12::{{closure}}") && !is_cell_body("ctx::alloc48"));
        assert_eq!(notebook_name("<ctx::Model as ctx::Run>::go"), "<Model as Run>::go");
    }

    #[test]
    fn a_stack_of_this_test_is_owned_by_the_test_and_cached() {
        // No CUDA frames: the first frame outside the wrappers is the test harness's or the
        // thread's entry (gpumem_nb's own functions are wrappers): anything but a CUDA layer.
        let frames = caller_of_capture();
        let mut o = Owners::new();
        let owner = o.owner(&frames);
        assert!(owner.as_deref().is_some_and(|s| !s.is_empty() && !is_cuda_layer(s)), "{owner:?}");
        let site = o.site(&frames, 0);
        assert_eq!(o.site(&frames, 0), site, "cached");
        assert_eq!((site.cell, site.line), (None, None), "no notebook here");
        assert_eq!(o.owner(&[]), None);
    }
}
