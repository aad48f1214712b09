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
//! library), and never computed in the callback: a stack seen for the first time is read in the
//! background ([`Owners::warm`]), a report names what is live.
#![forbid(unsafe_code)]

use super::Place;
use super::changes::{Change, Of, rises};
use super::stacks::StackId;
use crate::record::cells::{CellIndex, LineMap, run_number};
use crate::record::component::{Component, Rules, stamp_of};
use crate::record::frames::{Frames, Resolved, Symbolizer, is_path, source_crate, source_path};
use std::collections::HashMap;
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
    /// No notebook frame is on the stack: a thread of a framework (cubecl's device thread, a
    /// worker) did what the cell running then had queued, and `cell` is that cell.
    pub queued: bool,
}

impl Site {
    /// An unknown site, with the reason as its owner.
    pub(crate) fn unknown(why: &str) -> Site {
        Site { owner: why.to_string(), ..Default::default() }
    }
}

/// A cell library: its run number (`run_user_code_N`), the line map of the `lib.rs` it was
/// built from, and that file's path (what its line tables call the notebook's own source).
#[derive(Clone, Debug)]
struct Library {
    map: Option<Arc<LineMap>>,
    lib_rs: Option<Arc<str>>,
}

/// At most this many stacks' sites are cached: past it the cache starts again (sites are
/// recomputed on demand), so a long session's per-cell work on it stays bounded.
const MAX_CACHED_SITES: usize = 1 << 15;

/// The code of the newest this many cells is kept (gpumem-kernel's history keeps as many by
/// default): an allocation made in an older cell is still named by function and cell, without a
/// line.
const MAX_CELLS: usize = 10_000;

/// Names sites; keeps its caches between calls.
#[derive(Default)]
pub(crate) struct Owners {
    symbols: Symbolizer,
    exe: Option<String>,
    by_stack: HashMap<(Frames, u64), Site>,
    /// The notebook's cells (execution count → code), indexed by their lines.
    cells: CellIndex,
    /// Cell library path → what is known of it.
    libraries: HashMap<Arc<str>, Library>,
    /// Each stack's component by the rules, and the rules' generation they were found with.
    components: HashMap<Frames, Component>,
    components_generation: u64,
    /// Each stack's owning framework ([`Owners::framework`]).
    frameworks: HashMap<Frames, Arc<str>>,
}

/// Whether `module` is the program (`exe`) or a notebook cell's library: code named by symbol.
fn is_ours(exe: Option<&str>, module: &str) -> bool {
    Some(module) == exe
        || module.starts_with("libcode_")
        || module.strip_prefix("lib").is_some_and(|m| m.starts_with(crate::record::cells::SESSION_DEPS_PREFIX))
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

    /// Notes the code of cells (as their user sees it), for the lines of later sites.
    pub(crate) fn set_cell_codes<'a>(&mut self, codes: impl IntoIterator<Item = (u64, &'a str)>) {
        for (cell, code) in codes {
            self.cells.insert(cell, code);
        }
        while self.cells.len() > MAX_CELLS {
            self.cells.pop_oldest();
        }
        // Line maps built without these cells may miss their functions: build them again.
        self.libraries.retain(|_, v| v.map.is_some());
        self.by_stack.retain(|_, s| s.line.is_some() || s.cell.is_none());
    }

    /// Whether a module is the program or a notebook cell's library (code named by symbol).
    fn ours(&self, module: &str) -> bool {
        is_ours(self.exe.as_deref(), module)
    }

    /// What is known of a cell library (read once; the line map only while the library's
    /// `lib.rs` is still the one it was built from).
    fn library(&mut self, path: &Arc<str>) -> Library {
        if let Some(v) = self.libraries.get(path) {
            return v.clone();
        }
        let p = Path::new(&**path);
        let lib_rs = crate_dir(p).map(|d| d.join("src").join("lib.rs"));
        let map = exported_run(p).and_then(|run| {
            let lib = std::fs::read_to_string(lib_rs.as_ref()?).ok()?;
            (run_number(&lib) == Some(run) && !self.cells.is_empty())
                .then(|| Arc::new(LineMap::build_indexed(&lib, &self.cells)))
        });
        let v = Library { map, lib_rs: lib_rs.and_then(|l| l.to_str().map(Arc::from)) };
        self.libraries.insert(path.clone(), v.clone());
        v
    }

    /// Whether a frame is the notebook's own source: a line of the `lib.rs` evcxr generated for
    /// the cell library it lies in (not a `lib.rs` of a crate the notebook depends on, which is
    /// linked into the same library).
    fn in_cell_source(&mut self, r: &Resolved, f: &crate::record::frames::Frame) -> bool {
        if !r.module.starts_with("libcode_") || !f.filename.ends_with("lib.rs") {
            return false;
        }
        let Some(lib_rs) = self.library(&r.path).lib_rs else { return false };
        // The same file, also when the build directory was named through a symbolic link
        // (the library's path comes from `/proc/self/maps`, resolved; the line tables keep the
        // directory cargo ran in).
        *lib_rs == *f.filename
            || std::fs::canonicalize(&f.filename).is_ok_and(|a| std::fs::canonicalize(&*lib_rs).is_ok_and(|b| a == b))
    }

    /// The site of an allocation with this stack (innermost frame first), made while the
    /// notebook ran cell `label_cell` (0: none).
    pub(crate) fn site(&mut self, frames: &Frames, label_cell: u64) -> Site {
        if let Some(s) = self.by_stack.get(&(frames.clone(), label_cell)) {
            return s.clone();
        }
        let s = self.compute(frames, label_cell);
        if self.by_stack.len() >= MAX_CACHED_SITES {
            self.by_stack.clear();
        }
        self.by_stack.insert((frames.clone(), label_cell), s.clone());
        s
    }

    fn compute(&mut self, frames: &[usize], label_cell: u64) -> Site {
        let (frames, off_home) = crate::record::frames::thread_of(frames);
        // The module of every frame first, from the address alone: CUDA's layers, the C runtime
        // and other libraries are known by their file name, so only the frames of the program
        // and of the notebook's cells have their symbols read (a library's symbol table is read
        // once, and the driver's and cuBLAS's are large).
        let modules: Vec<Arc<str>> = frames.iter().map(|&ip| self.symbols.module_name(ip)).collect();
        let start = caller_of(&modules);
        let mut site = Site::default();
        let mut in_cell = false;
        // Owner and function: the first frame outside CUDA, the C runtime and the wrappers.
        for (&ip, module) in frames.iter().zip(&modules).skip(start) {
            let module = &**module;
            if is_cuda_layer(module) || is_system(module) {
                continue;
            }
            if !module.is_empty() && !self.ours(module) {
                site.owner = module.to_string();
                site.function = Some(module.to_string());
                break;
            }
            in_cell |= module.starts_with("libcode_");
            let r = &self.symbols.resolve(ip);
            // The function an address lies in carries its symbol's full path; the frames inlined
            // into it carry only their last segment (`zeros`, from line tables) and are known by
            // their source file: the notebook's own `lib.rs`, or a crate's sources.
            let mut named = None;
            for f in &r.frames {
                let n = f.name.as_str();
                if n.starts_with("{{closure") || n.starts_with("{closure") {
                    // A closure is its enclosing function's code: the next frame out names it.
                    continue;
                }
                if n.starts_with("run_user_code_") {
                    // A cell's body as the symbol table names it (an exported function, without
                    // its crate; cells built without line tables show nothing inlined into it).
                    named = Some(format!("{CELL_CRATE}::{n}"));
                    break;
                }
                if is_path(n) {
                    if !is_wrapper(n) && !n.starts_with("0x") {
                        named = Some(n.to_string());
                        break;
                    }
                } else if self.in_cell_source(r, f) {
                    named = Some(format!("{CELL_CRATE}::{n}"));
                    break;
                } else if let Some(krate) = source_crate(&f.filename).filter(|c| !is_wrapper(&format!("{c}::"))) {
                    // Its crate and name; the path between is not in the line tables.
                    named = Some(format!("{krate}::…::{n}"));
                    break;
                }
            }
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
        for (&ip, module) in frames.iter().zip(&modules).skip(start) {
            if !module.starts_with("libcode_") {
                continue;
            }
            let r = &self.symbols.resolve(ip);
            let map = self.library(&r.path).map;
            for f in &r.frames {
                let own_source = self.in_cell_source(r, f);
                if !is_cell_code(&f.name) && !is_cell_body(&f.name) && !own_source {
                    continue;
                }
                let mapped = map.as_ref().filter(|_| own_source).and_then(|m| m.lookup(f.line));
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
        } else if label_cell > 0 && off_home {
            // Another thread's stack (a framework's device thread, a worker): the cell is the
            // one that was running, whose queued work this was.
            site.cell = Some(label_cell);
            site.queued = true;
        }
        site
    }

    /// The frames of a stack the namer reads ahead: those in the cells' libraries, and those in
    /// the program when no cell is on the stack (in a notebook the program below the cell is
    /// evcxr's runner, which names no site: for gpumem-kernel's own binary on the development
    /// machine its tables took about 170 MiB of the notebook process and 0.1 s).
    fn frames_to_warm(&mut self, frames: &[usize]) -> Vec<usize> {
        let frames = crate::record::frames::thread_of(frames).0;
        let modules: Vec<Arc<str>> = frames.iter().map(|&ip| self.symbols.module_name(ip)).collect();
        let in_cell = modules.iter().any(|m| m.starts_with("libcode_"));
        let exe = self.exe.as_deref().filter(|_| !in_cell);
        frames.iter().zip(&modules).filter(|(_, m)| is_ours(exe, m)).map(|(&ip, _)| ip).collect()
    }

    /// The modules' tables [`Owners::warm`] will read for this stack: read them with
    /// `crate::record::frames::read_tables` first, without the lock that guards these caches.
    pub(crate) fn tables_to_read(&mut self, frames: &[usize]) -> crate::record::frames::TablesToRead {
        let frames = self.frames_to_warm(frames);
        self.symbols.tables_to_read(&frames)
    }

    /// Reads the costly part of naming this stack into the caches (the symbols and line tables
    /// of [`Owners::frames_to_warm`]), so that a report asking for its site later finds them:
    /// done off the report's path, as stacks appear. Line maps are left to the report, which has
    /// every cell's code by then. (With the tables read beforehand by `tables_to_read` and
    /// `read_tables`, this is lookups only.)
    pub(crate) fn warm(&mut self, frames: &[usize]) {
        for ip in self.frames_to_warm(frames) {
            let _ = self.symbols.resolve(ip);
        }
    }

    /// What the memory with this stack is: its stamp, else the first rule that matches from the
    /// outermost frame in (`rules` of `generation`: a newer one empties the cache), else
    /// `other`. The frames before the CUDA API's caller (ours, CUPTI's, the driver's) are not
    /// looked at; a library without symbols is known by its file name (`libcublasLt.so.13`).
    pub(crate) fn component(&mut self, frames: &[usize], rules: &Rules, generation: u64) -> Component {
        if let Some(c) = stamp_of(frames) {
            return c;
        }
        if generation != self.components_generation {
            self.components.clear();
            self.components_generation = generation;
        }
        if let Some(c) = self.components.get(frames) {
            return *c;
        }
        let named = self.named_frames(frames);
        let c = rules.classify(named.iter().map(|(f, m)| (f.as_str(), &**m))).unwrap_or(Component::Other);
        if self.components.len() >= MAX_CACHED_SITES {
            self.components.clear();
        }
        self.components.insert(Frames::from(frames), c);
        c
    }

    /// Who holds the memory with this stack, in the framework's own word: the library that
    /// called the CUDA API when it is one without Rust symbols (`cuBLAS`, `NCCL`, `cuDNN`,
    /// `libtorch`, else its file name), otherwise the framework among the stack's Rust crates
    /// ([`framework_of`]: candle or burn/cubecl before gpumem-nb, gpumem-nb before cudarc), else
    /// `notebook` for the cell's own code and `unknown` for a stack that says nothing.
    pub(crate) fn framework(&mut self, frames: &[usize]) -> Arc<str> {
        if let Some(w) = self.frameworks.get(frames) {
            return w.clone();
        }
        let named = self.named_frames(frames);
        let w: Arc<str> = framework_of(named.iter().map(|(f, m)| (f.as_str(), &**m))).into();
        if self.frameworks.len() >= MAX_CACHED_SITES {
            self.frameworks.clear();
        }
        self.frameworks.insert(Frames::from(frames), w.clone());
        w
    }

    /// The frames of a stack from the CUDA API's caller outwards, each a function's full path
    /// (empty for a library whose symbols are not read) and its module.
    fn named_frames(&mut self, frames: &[usize]) -> Vec<(String, Arc<str>)> {
        let code = crate::record::frames::thread_of(frames).0;
        let modules: Vec<Arc<str>> = code.iter().map(|&ip| self.symbols.module_name(ip)).collect();
        let mut named: Vec<(String, Arc<str>)> = Vec::new();
        for (&ip, module) in code.iter().zip(&modules).skip(caller_of(&modules)) {
            if self.ours(module) || module.is_empty() {
                let r = self.symbols.resolve(ip);
                for f in &r.frames {
                    // A function inlined into another is known by its last name only: its path
                    // comes from its source file (`candle_nn::optim::new`), or it is the
                    // notebook's own (`ctx::forward`).
                    let name = if is_path(&f.name) {
                        f.name.clone()
                    } else if let Some(p) = source_path(&f.filename, &f.name) {
                        p
                    } else if r.module.starts_with("libcode_") {
                        format!("{CELL_CRATE}::{}", f.name)
                    } else {
                        f.name.clone()
                    };
                    named.push((name, module.clone()));
                }
            } else {
                named.push((String::new(), module.clone()));
            }
        }
        named
    }

    /// Where the caller of the CUDA API starts in a stack (frames before it are ours, CUPTI's
    /// and the driver's): what a snapshot shows of the stack.
    pub(crate) fn caller_index(&mut self, frames: &[usize]) -> usize {
        let frames = crate::record::frames::thread_of(frames).0;
        let modules: Vec<Arc<str>> = frames.iter().map(|&ip| self.symbols.module_name(ip)).collect();
        caller_of(&modules)
    }

    /// The notebook's frames of a stack, for snapshots: each frame of a cell library mapped to
    /// `cell N` and its line where the line map knows it, the others as symbolised.
    pub(crate) fn frames(&mut self, frames: &[usize]) -> Vec<crate::record::frames::Frame> {
        let frames = crate::record::frames::thread_of(frames).0;
        let start = self.caller_index(frames);
        let mut out = Vec::new();
        for &ip in &frames[start..] {
            let r = self.symbols.resolve(ip);
            let map = if r.module.starts_with("libcode_") { self.library(&r.path).map } else { None };
            for f in &r.frames {
                let own_source = self.in_cell_source(&r, f);
                let mut f = f.clone();
                if let Some((cell, line)) = map.as_ref().filter(|_| own_source).and_then(|m| m.lookup(f.line)) {
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

/// The frameworks a stack can name, by their crates' prefixes, in the order they win when
/// several are on one stack: a framework calls the ones after it (candle and cubecl call
/// cudarc; a `gpumem_nb::component` stamp wraps a framework's call), so the first found holds
/// the memory.
const FRAMEWORKS: [(&str, &[&str]); 4] = [
    ("candle", &["candle_"]),
    ("burn/cubecl", &["burn_", "burn::", "cubecl_", "cubecl::"]),
    ("gpumem-nb", &["gpumem_nb::"]),
    ("cudarc", &["cudarc::"]),
];

/// A CUDA library's word for people (`libcublasLt.so.13` → `cuBLAS`), or its file name.
fn library_word(module: &str) -> std::borrow::Cow<'static, str> {
    const LIBRARIES: [(&str, &str); 10] = [
        ("libcublas", "cuBLAS"),
        ("libcudnn", "cuDNN"),
        ("libnccl", "NCCL"),
        ("libcufft", "cuFFT"),
        ("libcurand", "cuRAND"),
        ("libcusparse", "cuSPARSE"),
        ("libcusolver", "cuSOLVER"),
        ("libtorch", "libtorch"),
        ("libc10", "libtorch"),
        ("libnvrtc", "NVRTC"),
    ];
    match LIBRARIES.iter().find(|(prefix, _)| module.starts_with(prefix)) {
        Some((_, word)) => (*word).into(),
        None => module.to_string().into(),
    }
}

/// [`Owners::framework`]'s rule over a stack's frames from the CUDA API's caller outwards
/// (function path, or empty for a library read by its file name; module).
fn framework_of<'a>(frames: impl Iterator<Item = (&'a str, &'a str)>) -> std::borrow::Cow<'static, str> {
    let mut best: Option<usize> = None;
    let mut cell = false;
    let mut any = false;
    for (function, module) in frames {
        if is_cuda_layer(module) || is_system(module) {
            continue;
        }
        if function.is_empty() {
            if !any && !module.is_empty() {
                // The first code outside CUDA is a library's own: it made the call.
                return library_word(module);
            }
            continue;
        }
        any = true;
        let f = function.trim_start_matches('<');
        cell |= is_cell_code(f) || is_cell_body(f);
        if let Some(i) = FRAMEWORKS.iter().position(|(_, prefixes)| prefixes.iter().any(|p| f.starts_with(p))) {
            best = Some(best.map_or(i, |b| b.min(i)));
        }
    }
    match best {
        Some(i) => FRAMEWORKS[i].0.into(),
        None if cell => "notebook".into(),
        None => "unknown".into(),
    }
}

/// A slot's logged changes and the stacks they name.
pub(crate) type Logged<'a> = (&'a [Change], &'a HashMap<StackId, Option<Frames>>);

/// Live bytes by owner per place, each with its rise above its start while the changes were
/// logged (`None` without them): `live` gives each group of live bytes as (place, stack, bytes,
/// whether it is `ours`: gpumem-nb's allocator's blocks, owned by `ours_word`), `cached` the
/// allocator's cached free bytes per place (also `ours_word`'s); `counted` says which logged
/// changes count (a place's allocator shows its blocks or its segments, not both). Owners that
/// hold nothing and never rose are left out; each place's owners largest first.
pub(crate) fn held_by<'a>(
    owners: &mut Owners,
    live: impl Iterator<Item = (Place, Option<&'a Frames>, u64, bool)>,
    cached: impl Iterator<Item = (Place, u64)>,
    changes: Option<Logged<'_>>,
    counted: impl Fn(&Change) -> bool,
    ours_word: &str,
) -> HashMap<Place, Vec<(String, u64, Option<u64>)>> {
    // Owners by index into `names` (the rises' keys are `Copy`).
    let mut names: Vec<Arc<str>> = vec![Arc::from(ours_word)];
    let mut index = |w: Arc<str>| match names.iter().position(|n| *n == w) {
        Some(i) => i,
        None => {
            names.push(w);
            names.len() - 1
        }
    };
    let mut owner_of = |f: Option<&Frames>| f.map_or_else(|| Arc::from("unknown"), |f| owners.framework(f));
    let mut held: HashMap<Place, HashMap<usize, u64>> = HashMap::new();
    for (place, frames, bytes, ours) in live {
        let who = if ours { 0 } else { index(owner_of(frames)) };
        *held.entry(place).or_default().entry(who).or_default() += bytes;
    }
    for (place, bytes) in cached.filter(|(_, b)| *b > 0) {
        *held.entry(place).or_default().entry(0).or_default() += bytes;
    }
    let rose = changes.map(|(log, stacks)| {
        let of: HashMap<StackId, usize> = stacks.iter().map(|(id, f)| (*id, index(owner_of(f.as_ref())))).collect();
        rises(log, |_, c| {
            let who = match c.of {
                Of::Segment | Of::Block => 0,
                Of::Driver => of.get(&c.stack).copied().unwrap_or(0),
            };
            counted(c).then_some((c.place, who))
        })
    });
    for (place, who) in rose.iter().flat_map(|r| r.iter().filter(|(_, r)| **r > 0).map(|(k, _)| *k)) {
        held.entry(place).or_default().entry(who).or_default();
    }
    held.into_iter()
        .map(|(place, m)| {
            let mut rows: Vec<(String, u64, Option<u64>)> = m
                .into_iter()
                .map(|(who, live)| {
                    (names[who].to_string(), live, rose.as_ref().map(|r| r.get(&(place, who)).copied().unwrap_or(0)))
                })
                .filter(|(_, live, rise)| *live > 0 || rise.unwrap_or(0) > 0)
                .collect();
            rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            (place, rows)
        })
        .collect()
}

/// Index of the first frame after the first run of CUDA-layer frames (the API's caller), or 0
/// when the stack has none.
fn caller_of(modules: &[Arc<str>]) -> usize {
    match modules.iter().position(|m| is_cuda_layer(m)) {
        Some(first) => first + modules[first..].iter().take_while(|m| is_cuda_layer(m)).count(),
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
    fn a_stack_names_the_framework_that_holds_its_memory() {
        let of = |frames: &[(&'static str, &'static str)]| framework_of(frames.iter().copied());
        // candle over cudarc over CUDA's own layers: candle.
        let candle = [
            ("", "libcuda.so.1"),
            ("cudarc::driver::result::malloc_async", "libgpumem_deps_1.so"),
            ("candle_core::cuda_backend::device::CudaDevice::alloc_zeros", "libgpumem_deps_1.so"),
            ("ctx::run_user_code_3", "libcode_3.so"),
        ];
        assert_eq!(of(&candle), "candle");
        // cubecl on its device thread (no notebook frame), burn's crates around it.
        assert_eq!(
            of(&[("cubecl_cuda::compute::server::CudaServer::alloc", "x"), ("std::thread::spawn", "x")]),
            "burn/cubecl"
        );
        assert_eq!(of(&[("<burn_tensor::Tensor<B> as Clone>::clone", "x")]), "burn/cubecl");
        // A stamp of ours around a framework's call: still the framework's.
        assert_eq!(
            of(&[("candle_nn::var_map::VarMap::get", "x"), ("gpumem_nb::notebook::components::component", "x")]),
            "candle"
        );
        assert_eq!(
            of(&[("cudarc::driver::safe::CudaStream::alloc_zeros", "x"), ("ctx::run_user_code_1", "x")]),
            "cudarc"
        );
        assert_eq!(of(&[("cudarc::x", "x"), ("gpumem_nb::mem::driver_alloc_mib", "x")]), "gpumem-nb");
        // A CUDA library that made the call itself, whoever called it.
        assert_eq!(of(&[("", "libcuda.so.1"), ("", "libcublasLt.so.13"), ("candle_core::x", "x")]), "cuBLAS");
        assert_eq!(of(&[("", "libnccl.so.2")]), "NCCL");
        assert_eq!(of(&[("", "libsomething.so.2")]), "libsomething.so.2");
        assert_eq!(of(&[("ctx::run_user_code_2", "libcode_2.so")]), "notebook");
        assert_eq!(of(&[("", "libc.so.6")]), "unknown");
        assert_eq!(of(&[]), "unknown");
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

    #[test]
    fn a_warmed_stack_names_the_same_site_from_the_caches() {
        let frames = caller_of_capture();
        let mut warmed = Owners::new();
        warmed.warm(&frames);
        let read = frames.iter().filter(|&&ip| warmed.symbols.is_resolved(ip)).count();
        assert!(read > 0, "warming read the program's frames");
        assert_eq!(warmed.site(&frames, 3), Owners::new().site(&frames, 3));
    }
}
