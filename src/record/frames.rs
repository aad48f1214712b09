//! Stack frames for allocator history: captured cheaply, symbolised late.
//!
//! [`capture`] walks the stack and keeps raw instruction pointers only (no symbol lookup),
//! so recording an event with frames costs a stack walk. [`Symbolizer`] turns them into
//! PyTorch's frame dicts (`name`, `filename`, `line`) when a snapshot is taken, caching each
//! address, and drops the frames of gpumem-nb itself and of the unwinder so the caller's code is
//! on top (innermost first, as PyTorch lists them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Raw return addresses of one stack, innermost first.
pub(crate) type Frames = Arc<[usize]>;

/// The most frames a stack may keep.
pub(crate) const MAX_FRAMES: usize = 64;

/// Frames walked per history stack unless the allocator is told otherwise
/// (`CachingAllocator::set_stack_depth`). Walking costs about 150 ns a frame (DWARF
/// unwinding), and the innermost few are gpumem-nb's own, so 12 keeps the caller's innermost
/// frames at about 1 µs per event (BENCHMARKS.md).
pub(crate) const DEFAULT_DEPTH: usize = 12;

/// Put after a stack's frames when it was walked on another thread than the one that runs the
/// notebook's cells ([`set_home_thread`]): not an address (no code lies at 1).
pub(crate) const OFF_HOME: usize = 1;

/// The thread that runs the notebook's cells: the one that opened the first device.
static HOME: std::sync::OnceLock<std::thread::ThreadId> = std::sync::OnceLock::new();

/// Marks the calling thread as the one that runs the cells (the first call wins). Stacks walked
/// on other threads (a framework's device thread, a worker) carry [`OFF_HOME`].
pub(crate) fn set_home_thread() {
    let _ = HOME.set(std::thread::current().id());
}

/// A stack's frames without its marks (the thread mark and a component's stamp,
/// [`super::component`]), and whether it was walked off the cells' thread.
pub(crate) fn thread_of(frames: &[usize]) -> (&[usize], bool) {
    let (rest, off_home) = match frames.split_last() {
        Some((&OFF_HOME, rest)) => (rest, true),
        _ => (frames, false),
    };
    match rest.split_last() {
        Some((&m, code)) if super::component::is_marker(m) => (code, off_home),
        _ => (rest, off_home),
    }
}

/// Puts the marks after a walk's frames: the stamp, then the thread mark.
fn mark(v: &mut Vec<usize>, stamp: Option<super::component::Component>) {
    if let Some(c) = stamp {
        v.push(c.marker());
    }
    if HOME.get().is_some_and(|home| *home != std::thread::current().id()) {
        v.push(OFF_HOME);
    }
}

/// Captures the current stack as raw instruction pointers, [`DEFAULT_DEPTH`] frames deep.
#[cfg(test)]
#[inline(never)]
pub(crate) fn capture() -> Frames {
    capture_depth(DEFAULT_DEPTH)
}

/// Captures at most `limit` frames (clamped to 1 ..= [`MAX_FRAMES`]) with the caching unwinder
/// ([`super::unwind`]), marked with this thread's stamp in this copy of the crate.
#[inline(never)]
pub(crate) fn capture_depth(limit: usize) -> Frames {
    let limit = limit.clamp(1, MAX_FRAMES);
    SCRATCH.with(|v| {
        let mut v = v.borrow_mut();
        super::unwind::capture(limit, &mut v);
        mark(&mut v, super::component::current());
        Arc::from(&v[..])
    })
}

/// Captures at most `limit` frames (clamped as [`capture_depth`] does) into this thread's buffer,
/// marked with `stamp`, and hands them to `f` with the walk's serial on this thread (equal
/// serials: equal frames; `super::unwind::capture`). `f` must not capture a stack itself.
#[inline(never)]
pub(crate) fn with_captured<R>(
    limit: usize,
    stamp: Option<super::component::Component>,
    f: impl FnOnce(&[usize], u64) -> R,
) -> R {
    let limit = limit.clamp(1, MAX_FRAMES);
    SCRATCH.with(|v| {
        let mut v = v.borrow_mut();
        let serial = super::unwind::capture(limit, &mut v);
        mark(&mut v, stamp);
        f(&v, serial)
    })
}

thread_local! {
    /// One buffer per thread for the walk, so capturing allocates only the result.
    static SCRATCH: std::cell::RefCell<Vec<usize>> = std::cell::RefCell::new(Vec::with_capacity(MAX_FRAMES));
}

/// One symbolised frame, PyTorch's frame dict.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Frame {
    /// Function name (demangled, without the hash suffix).
    pub name: String,
    /// Source file, or "??" when unknown.
    pub filename: String,
    /// Line, or 0 when unknown.
    pub line: u32,
}

impl Frame {
    /// Whether the function has no name of its own a person would know: a closure
    /// (`{closure#0}`) or a notebook cell's body (`run_user_code_N`). Such a frame is named by
    /// where it is (`cell 22:2`), never by that symbol.
    pub fn is_anonymous(&self) -> bool {
        let name = self.name.strip_prefix("ctx::").unwrap_or(&self.name);
        name.starts_with("run_user_code_") || name.contains("{closure") || name.contains("{{closure")
    }
}

/// What one return address resolves to: its module and its frames (inlined ones expanded,
/// innermost first).
#[derive(Debug)]
pub(crate) struct Resolved {
    /// The module's file name (`libcuda.so.1`, `libcode_7.so`); empty when in none.
    pub module: Arc<str>,
    /// The module's path.
    pub path: Arc<str>,
    /// The frames.
    pub frames: Vec<Frame>,
}

/// Resolves raw frames to [`Frame`]s with each module's symbol table and line tables
/// (`addr2line`), caching per address and keeping each module's tables once read.
#[derive(Default)]
pub(crate) struct Symbolizer {
    cache: HashMap<usize, Arc<Resolved>>,
    modules: Vec<super::unwind::ModuleMap>,
    loaders: HashMap<Arc<str>, Tables>,
    /// Addresses that sent us to `/proc/self/maps` once already.
    looked_for: std::collections::HashSet<usize>,
}

impl std::fmt::Debug for Symbolizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Symbolizer").field("cached", &self.cache.len()).finish()
    }
}

/// Frames that belong to the allocator or the unwinder, never to the user.
fn is_internal(f: &Frame) -> bool {
    const PREFIXES: [&str; 4] = ["gpumem_nb::", "<gpumem_nb::", "backtrace::", "<backtrace::"];
    PREFIXES.iter().any(|p| f.name.starts_with(p)) || (short(f) && f.filename.starts_with(OWN_SOURCE))
}

/// Where gpumem-nb's own sources are (what its line tables name, in this build and in every
/// notebook cell that links this same copy).
const OWN_SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/");

/// A frame named by line tables alone: an inlined function's last path segment (`zeros`,
/// `try_with<core::cell::RefCell<…>, …>`).
fn short(f: &Frame) -> bool {
    !is_path(&f.name)
}

/// Whether a function name is a full path (`candle_core::tensor::Tensor::zeros`,
/// `<ctx::Model as ctx::Run>::go`), not a last segment whose generic arguments hold paths.
pub(crate) fn is_path(name: &str) -> bool {
    name.starts_with('<') || name.split('<').next().is_some_and(|head| head.contains("::"))
}

/// The crate an inlined frame's source file belongs to, by its path: the standard library
/// (`/rustc/<hash>/library/core/src/…`), gpumem-nb itself, or the directory holding `src/`
/// (`…/registry/src/…/candle-core-0.9.1/src/tensor.rs` → `candle_core`; a version suffix is
/// dropped). `None` when the path says nothing.
pub(crate) fn source_crate(file: &str) -> Option<String> {
    if file.starts_with(OWN_SOURCE) {
        return Some("gpumem_nb".into());
    }
    if let Some(rest) = file.split("/library/").nth(1).filter(|_| file.starts_with("/rustc/")) {
        return rest.split('/').next().filter(|c| !c.is_empty()).map(str::to_string);
    }
    let (dir, _) = file.rsplit_once("/src/")?;
    let name = dir.rsplit('/').next().filter(|n| !n.is_empty())?;
    // `candle-core-0.9.1`, `foo-1.0.0-alpha.2`: the name before the first `-<digit>`.
    let cut = name.match_indices('-').find(|(i, _)| name[i + 1..].starts_with(|c: char| c.is_ascii_digit()));
    let name = cut.map_or(name, |(i, _)| &name[..i]);
    Some(name.replace('-', "_"))
}

/// An inlined frame's function as a path, from its source file (line tables give only its last
/// name): `…/candle-nn-0.11.1/src/optim.rs` and `new` → `candle_nn::optim::new`; a `lib.rs`
/// or `mod.rs` names its folder's module. `None` when the file says nothing of a crate.
pub(crate) fn source_path(file: &str, name: &str) -> Option<String> {
    let krate = source_crate(file)?;
    let module = file.rsplit_once("/src/").map_or("", |(_, m)| m).trim_end_matches(".rs");
    let module = match module {
        "lib" | "main" => "",
        m => m.strip_suffix("/mod").unwrap_or(m),
    };
    let module = module.replace('/', "::");
    Some(if module.is_empty() { format!("{krate}::{name}") } else { format!("{krate}::{module}::{name}") })
}

/// The name people know a CUDA library by, from its file (`libnccl.so.2` → `NCCL`,
/// `libcublasLt.so.13` → `cuBLASLt`); `None` for any other file.
pub(crate) fn cuda_library(file: &str) -> Option<&'static str> {
    // Longer prefixes first: `libcublasLt` before `libcublas`.
    const KNOWN: [(&str, &str); 10] = [
        ("libnccl", "NCCL"),
        ("libcublasLt", "cuBLASLt"),
        ("libcublas", "cuBLAS"),
        ("libcudnn", "cuDNN"),
        ("libcufft", "cuFFT"),
        ("libcurand", "cuRAND"),
        ("libcusparse", "cuSPARSE"),
        ("libcusolver", "cuSOLVER"),
        ("libnvrtc", "NVRTC"),
        ("libtorch_cuda", "libtorch"),
    ];
    let stem = file.split(".so").next()?;
    // `libcudnn_ops` and `libcudnn_cnn` are cuDNN; `libcublasLt` is not cuBLAS.
    KNOWN.iter().find(|(p, _)| stem == *p || stem.strip_prefix(p).is_some_and(|r| r.starts_with('_'))).map(|(_, n)| *n)
}

/// Runtime frames below `main` (or below a test harness or a thread's start) that say nothing
/// about the user's code.
fn is_runtime(name: &str) -> bool {
    const PREFIXES: [&str; 13] = [
        "std::rt::",
        "std::sys::",
        "std::thread::",
        "std::panicking::",
        "std::panic::",
        "core::ops::function::",
        "core::panic::",
        "alloc::boxed::",
        "__libc_start",
        "_start",
        "start_thread",
        "clone",
        "test::",
    ];
    let n = name.trim_start_matches('<');
    PREFIXES.iter().any(|p| n.starts_with(p)) || name == "main" || name.starts_with("0x")
}

/// One module's symbol table and line tables (`addr2line` reads them as they are first asked
/// for), behind a lock of their own: another thread can read them ([`read_tables`]) while the
/// symbolizer's owner goes on with other modules.
#[derive(Clone, Default)]
pub(crate) struct Tables(Arc<Mutex<TablesState>>);

#[derive(Default)]
enum TablesState {
    #[default]
    Unopened,
    Open(Box<addr2line::Loader>),
    Unreadable,
}

impl Tables {
    /// Runs `f` with the module's loader (opened from `path` the first time), `None` when the
    /// file cannot be read.
    fn with<R>(&self, path: &str, f: impl FnOnce(Option<&addr2line::Loader>) -> R) -> R {
        let mut state = crate::sync::lock(&self.0);
        if matches!(*state, TablesState::Unopened) {
            *state = addr2line::Loader::new(path).map_or(TablesState::Unreadable, |l| TablesState::Open(Box::new(l)));
        }
        match &*state {
            TablesState::Open(l) => f(Some(l)),
            _ => f(None),
        }
    }
}

/// Modules' tables to read, with the addresses to read them for (the address looked up and the
/// module's load address): what [`Symbolizer::tables_to_read`] returns.
pub(crate) type TablesToRead = Vec<(Tables, Arc<str>, Vec<(u64, u64)>)>;

/// Reads the tables that looking up these addresses needs (the symbol table, the line program of
/// each address's unit), so that a later [`Symbolizer::resolve`] of them finds them read.
pub(crate) fn read_tables(todo: &TablesToRead) {
    for (tables, path, addrs) in todo {
        tables.with(path, |loader| {
            let Some(loader) = loader else { return };
            for &(lookup, base) in addrs {
                let probe = lookup.wrapping_sub(base).wrapping_add(loader.relative_address_base());
                if let Ok(mut it) = loader.find_frames(probe) {
                    while let Ok(Some(_)) = it.next() {}
                }
                let _ = loader.find_symbol(probe);
            }
        });
    }
}

impl Symbolizer {
    /// A new, empty cache.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The module holding `addr` (re-reading the process's modules once for an address in
    /// none: evcxr loads a library per cell).
    fn module(&mut self, addr: usize) -> Option<super::unwind::ModuleMap> {
        let find = |mods: &[super::unwind::ModuleMap]| {
            let i = mods.partition_point(|m| m.start <= addr as u64);
            i.checked_sub(1).map(|i| &mods[i]).filter(|m| (addr as u64) < m.end).cloned()
        };
        if let Some(m) = find(&self.modules) {
            return Some(m);
        }
        if self.looked_for.insert(addr) {
            self.modules = super::unwind::module_maps(&self.modules);
        }
        find(&self.modules)
    }

    /// The file name of the module a return address lies in (empty when in none), without
    /// reading its symbols.
    pub(crate) fn module_name(&mut self, ip: usize) -> Arc<str> {
        if let Some(r) = self.cache.get(&ip) {
            return r.module.clone();
        }
        self.module(ip.saturating_sub(1)).map_or_else(|| Arc::from(""), |m| m.name)
    }

    /// Everything known of one return address (the call instruction before it is looked up).
    pub(crate) fn resolve(&mut self, ip: usize) -> Arc<Resolved> {
        if let Some(r) = self.cache.get(&ip) {
            return r.clone();
        }
        let lookup = ip.saturating_sub(1);
        let module = self.module(lookup);
        let mut frames = Vec::new();
        if let Some(m) = &module {
            let tables = self.loaders.entry(m.path.clone()).or_default().clone();
            tables.with(&m.path, |loader| {
                let Some(loader) = loader else { return };
                let probe = (lookup as u64).wrapping_sub(m.base).wrapping_add(loader.relative_address_base());
                if let Ok(mut it) = loader.find_frames(probe) {
                    while let Ok(Some(f)) = it.next() {
                        let name = f.function.as_ref().and_then(|n| n.demangle().ok()).map(|n| n.into_owned());
                        let (filename, line) = match &f.location {
                            Some(l) => (l.file.unwrap_or("??").to_string(), l.line.unwrap_or(0)),
                            None => ("??".to_string(), 0),
                        };
                        frames.push(Frame { name: name.unwrap_or_default(), filename, line });
                    }
                }
                // The function the address lies in (the outermost frame) is named by the symbol
                // table, with its full path: line tables alone (`debug = "line-tables-only"`,
                // how notebook cells and release builds are made) name every function by its
                // last segment (`zeros`). Inlined frames keep the names the line tables give.
                if let Some(sym) = loader.find_symbol(probe) {
                    let name = addr2line::demangle_auto(sym.into(), None).into_owned();
                    match frames.last_mut() {
                        Some(f) => f.name = name,
                        None => frames.push(Frame { name, filename: "??".into(), line: 0 }),
                    }
                }
            });
        }
        for f in &mut frames {
            if f.name.is_empty() {
                f.name = format!("{ip:#x}");
            }
        }
        if frames.is_empty() {
            frames.push(Frame { name: format!("{ip:#x}"), filename: "??".into(), line: 0 });
        }
        let (name, path) = module.map_or_else(|| (Arc::from(""), Arc::from("")), |m| (m.name.clone(), m.path.clone()));
        let r = Arc::new(Resolved { module: name, path, frames });
        self.cache.insert(ip, r.clone());
        r
    }

    /// The tables that resolving these return addresses will read, for [`read_tables`] to read
    /// outside whatever lock guards this symbolizer.
    pub(crate) fn tables_to_read(&mut self, frames: &[usize]) -> TablesToRead {
        let mut out: TablesToRead = Vec::new();
        for &ip in thread_of(frames).0 {
            if self.cache.contains_key(&ip) {
                continue;
            }
            let lookup = ip.saturating_sub(1);
            let Some(m) = self.module(lookup) else { continue };
            let tables = self.loaders.entry(m.path.clone()).or_default().clone();
            match out.iter_mut().find(|(_, p, _)| *p == m.path) {
                Some((_, _, addrs)) => addrs.push((lookup as u64, m.base)),
                None => out.push((tables, m.path.clone(), vec![(lookup as u64, m.base)])),
            }
        }
        out
    }

    /// Whether an address has been resolved (and cached).
    #[cfg(test)]
    pub(crate) fn is_resolved(&self, ip: usize) -> bool {
        self.cache.contains_key(&ip)
    }

    fn resolve_ip(&mut self, ip: usize) -> Vec<Frame> {
        self.resolve(ip).frames.clone()
    }

    /// Every frame of a captured stack, innermost first (inlined frames expanded).
    pub(crate) fn symbolize_all(&mut self, frames: &[usize]) -> Vec<Frame> {
        thread_of(frames).0.iter().flat_map(|&ip| self.resolve_ip(ip)).collect()
    }

    /// The user's frames of a captured stack, innermost first.
    pub(crate) fn symbolize(&mut self, frames: &[usize]) -> Vec<Frame> {
        keep_user(self.symbolize_all(frames))
    }
}

/// Standard-library frames (closure shims, iterator adapters) that can sit between our own.
fn is_std(f: &Frame) -> bool {
    const PREFIXES: [&str; 6] = ["core::", "<core::", "std::", "<std::", "alloc::", "<alloc::"];
    PREFIXES.iter().any(|p| f.name.starts_with(p))
        || (short(f) && source_crate(&f.filename).is_some_and(|c| matches!(c.as_str(), "core" | "std" | "alloc")))
}

/// Drops the leading (innermost) frames of gpumem-nb, the unwinder and the standard library
/// glue between them, and the trailing runtime frames below the program's own code.
pub(crate) fn keep_user(mut all: Vec<Frame>) -> Vec<Frame> {
    let start = all.iter().position(|f| !is_internal(f) && !is_std(f)).unwrap_or(all.len());
    let mut user = all.split_off(start);
    while user.last().is_some_and(|f| is_runtime(&f.name)) {
        user.pop();
    }
    user
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str) -> Frame {
        Frame { name: name.into(), filename: "x.rs".into(), line: 1 }
    }

    #[test]
    fn cuda_libraries_by_the_names_people_know() {
        assert_eq!(cuda_library("libnccl.so.2"), Some("NCCL"));
        assert_eq!(cuda_library("libcublasLt.so.13"), Some("cuBLASLt"));
        assert_eq!(cuda_library("libcublas.so.13"), Some("cuBLAS"));
        assert_eq!(cuda_library("libcudnn_ops.so.9"), Some("cuDNN"));
        assert_eq!(cuda_library("libcudart.so.13"), None);
        assert_eq!(cuda_library("libncclx.so"), None);
        assert_eq!(cuda_library("candle_core::…"), None);
    }

    #[test]
    fn user_code_ends_up_on_top() {
        let all = vec![
            f("backtrace::backtrace::trace"),
            f("gpumem_nb::frames::capture"),
            f("core::ops::function::FnOnce::call_once"),
            f("gpumem_nb::allocator::CachingAllocator<B>::malloc"),
            f("my_notebook::train_step"),
            f("gpumem_nb::scope::scope"), // the user's closure ran inside our scope: kept
            f("my_notebook::main"),
            f("std::rt::lang_start_internal"),
            f("main"),
        ];
        let names: Vec<String> = keep_user(all).into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["my_notebook::train_step", "gpumem_nb::scope::scope", "my_notebook::main"]);
    }

    #[test]
    fn inlined_frames_are_named_by_their_source_file() {
        let reg = "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f";
        let p = |f: String, n: &str| source_path(&f, n);
        assert_eq!(p(format!("{reg}/candle-nn-0.11.1/src/optim.rs"), "new").as_deref(), Some("candle_nn::optim::new"));
        assert_eq!(p(format!("{reg}/candle-core-0.11.1/src/lib.rs"), "f").as_deref(), Some("candle_core::f"));
        assert_eq!(p(format!("{reg}/foo-1.0.0/src/a/b/mod.rs"), "g").as_deref(), Some("foo::a::b::g"));
        assert_eq!(p(format!("{reg}/foo-1.0.0/src/calib.rs"), "g").as_deref(), Some("foo::calib::g"));
        assert_eq!(p("??".into(), "g"), None);
    }

    #[test]
    fn inlined_frames_belong_to_the_crate_of_their_source() {
        let c = |p: &str| source_crate(p);
        assert_eq!(
            c("/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/candle-core-0.9.1/src/tensor.rs").as_deref(),
            Some("candle_core")
        );
        assert_eq!(
            c("/home/u/.cargo/git/checkouts/candle-0a1b/4c5d/candle-nn/src/ops.rs").as_deref(),
            Some("candle_nn")
        );
        assert_eq!(c("/r/registry/src/x/foo-bar-1.0.0-alpha.2/src/a/b.rs").as_deref(), Some("foo_bar"));
        assert_eq!(c("/rustc/59807616e1fa/library/core/src/ops/function.rs").as_deref(), Some("core"));
        assert_eq!(c(&format!("{OWN_SOURCE}record/unwind/machine.rs")).as_deref(), Some("gpumem_nb"));
        assert_eq!(c("??"), None);
        assert_eq!(
            c("/root/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/lib/rustlib/src/rust/library/std/src/thread/local.rs")
                .as_deref(),
            Some("std")
        );
        assert!(is_path("candle_core::tensor::Tensor::zeros") && is_path("<ctx::M as ctx::R>::go"));
        assert!(!is_path("try_with<core::cell::RefCell<u8>, gpumem_nb::F>") && !is_path("zeros"));
        // gpumem-nb's own inlined frames (`registers`, the unwinder's) are never the user's.
        let own =
            Frame { name: "registers".into(), filename: format!("{OWN_SOURCE}record/unwind/machine.rs"), line: 30 };
        let user = Frame { name: "step".into(), filename: "/w/nb/src/lib.rs".into(), line: 3 };
        assert_eq!(keep_user(vec![own, user.clone()]), vec![user]);
    }

    #[test]
    fn capture_walks_the_stack_and_symbolizes() {
        let raw = capture();
        assert!(raw.len() >= 3, "a test runs several frames deep, got {}", raw.len());
        let mut s = Symbolizer::new();
        let all: Vec<Frame> = s.symbolize_all(&raw);
        assert!(all.iter().any(|fr| fr.name.contains("capture_walks_the_stack")), "{all:?}");
    }
}
