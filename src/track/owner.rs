//! Who made an allocation, from its stack: the library or the code that called the driver.
//!
//! A stack taken in a CUPTI callback starts with our own frames, then CUPTI's and the driver's
//! (`libcupti`, `libcuda`, maybe `libcudart`). The first frame after that run is the caller of
//! the CUDA API. If it lies in another shared library (`libcublasLt.so.13`, `libnccl.so.2`,
//! `libtorch_cuda.so`) that library is the owner. Otherwise it is Rust code of the program or of
//! a notebook cell: the first symbol that is not a wrapper (cudarc, gpumem-nb, the standard
//! library) names the owner by its crate (`candle_core::…`), or the notebook cell when it is
//! the cell's own code. Stacks without CUDA frames (the simulated driver) start at the first
//! frame outside gpumem-nb.
//!
//! Shared objects are found from `/proc/self/maps` (re-read when an address falls outside what
//! is known: evcxr loads a library per cell); symbols through [`Symbolizer`], both cached, and
//! only when a report asks, never in the callback.
#![forbid(unsafe_code)]

use crate::record::frames::Symbolizer;
use std::collections::HashMap;
use std::path::Path;

/// An executable mapping of a file.
#[derive(Clone, Debug)]
struct Mapping {
    start: usize,
    end: usize,
    /// File name only (`libcuda.so.1`).
    name: String,
    /// Whether it is the program or a notebook cell's library (code named by symbol, not file).
    ours: bool,
}

/// Names owners; keeps its caches between calls.
#[derive(Default)]
pub(crate) struct Owners {
    maps: Vec<Mapping>,
    symbols: Symbolizer,
    by_ip: HashMap<usize, Option<String>>,
    exe: Option<String>,
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
        || ["cudarc::", "gpumem_nb::", "core::", "std::", "alloc::", "backtrace::", "__rust", "_Unwind"]
            .iter()
            .any(|p| s.starts_with(p))
}

/// The owner's name from a symbol: `candle_core::…`, or `notebook cell` for evcxr's cell code.
fn owner_of_symbol(sym: &str) -> String {
    let s = sym.trim_start_matches('<');
    if s.contains("run_user_code_") {
        return "notebook cell".to_string();
    }
    match s.split_once("::") {
        Some((krate, _)) => format!("{krate}::…"),
        None => s.to_string(),
    }
}

impl Owners {
    /// Empty caches.
    pub(crate) fn new() -> Self {
        Owners { exe: std::env::current_exe().ok().and_then(|p| file_name(&p)), ..Default::default() }
    }

    fn refresh(&mut self) {
        let Ok(text) = std::fs::read_to_string("/proc/self/maps") else { return };
        let mut maps = Vec::new();
        for line in text.lines() {
            let mut f = line.split_whitespace();
            let (Some(range), Some(perms)) = (f.next(), f.next()) else { continue };
            let Some(path) = f.nth(3) else { continue };
            if !perms.contains('x') || !path.starts_with('/') {
                continue;
            }
            let Some((a, b)) = range.split_once('-') else { continue };
            let (Ok(start), Ok(end)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else { continue };
            let name = file_name(Path::new(path)).unwrap_or_default();
            let ours = Some(&name) == self.exe.as_ref() || name.starts_with("libcode_");
            maps.push(Mapping { start, end, name, ours });
        }
        maps.sort_by_key(|m| m.start);
        self.maps = maps;
    }

    fn mapping(&mut self, ip: usize) -> Option<&Mapping> {
        let find = |maps: &[Mapping]| {
            let i = maps.partition_point(|m| m.start <= ip);
            i.checked_sub(1).filter(|&i| ip < maps[i].end)
        };
        let i = match find(&self.maps) {
            Some(i) => i,
            None => {
                self.refresh();
                find(&self.maps)?
            }
        };
        self.maps.get(i)
    }

    /// The owner of a frame that lies in the program or a cell: its first non-wrapper symbol.
    fn symbol_owner(&mut self, ip: usize) -> Option<String> {
        if let Some(o) = self.by_ip.get(&ip) {
            return o.clone();
        }
        let frames = self.symbols.symbolize_all(&[ip]);
        // An address without a symbol (`0x…`) names nobody: the next frame may.
        let o = frames
            .iter()
            .map(|f| f.name.as_str())
            .find(|n| !is_wrapper(n) && !n.starts_with("0x"))
            .map(owner_of_symbol);
        self.by_ip.insert(ip, o.clone());
        o
    }

    /// For each frame: (in a CUDA layer, in the program or a cell, file name).
    fn layers(&mut self, frames: &[usize]) -> Vec<(bool, bool, String)> {
        frames
            .iter()
            .map(|&ip| match self.mapping(ip.saturating_sub(1)) {
                Some(m) => (is_cuda_layer(&m.name), m.ours, m.name.clone()),
                None => (false, true, String::new()),
            })
            .collect()
    }

    /// Index of the first frame after the first run of CUDA-layer frames (the API's caller), or
    /// 0 when the stack has none.
    fn caller_of(layer: &[(bool, bool, String)]) -> usize {
        match layer.iter().position(|l| l.0) {
            Some(first) => first + layer[first..].iter().take_while(|l| l.0).count(),
            None => 0,
        }
    }

    /// Where the caller of the CUDA API starts in a stack (frames before it are ours, CUPTI's
    /// and the driver's): what a snapshot shows of the stack.
    pub(crate) fn caller_index(&mut self, frames: &[usize]) -> usize {
        let layer = self.layers(frames);
        Self::caller_of(&layer)
    }

    /// Who made the allocation with this stack (innermost frame first); `None` when the stack
    /// says nothing (empty, or it ends inside CUDA's libraries).
    pub(crate) fn owner(&mut self, frames: &[usize]) -> Option<String> {
        let layer = self.layers(frames);
        let start = Self::caller_of(&layer);
        let mut in_cell = false;
        for (i, (cuda, ours, name)) in layer.iter().enumerate().skip(start) {
            if *cuda || is_system(name) {
                continue;
            }
            if !ours {
                return Some(name.clone());
            }
            if let Some(o) = self.symbol_owner(frames[i]) {
                return Some(o);
            }
            in_cell |= name.starts_with("libcode_");
        }
        // evcxr's cell libraries can be gone from disk by the time a report asks (their
        // symbols with them): code in one is still the notebook's.
        in_cell.then(|| "notebook cell".to_string())
    }
}

fn file_name(p: &Path) -> Option<String> {
    p.file_name().and_then(|n| n.to_str()).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn caller_of_capture() -> crate::record::frames::Frames {
        crate::record::frames::capture()
    }

    #[test]
    fn names_come_from_crates_libraries_and_cells() {
        assert_eq!(owner_of_symbol("candle_core::tensor::Tensor::zeros"), "candle_core::…");
        assert_eq!(owner_of_symbol("<candle_core::Foo as Bar>::baz"), "candle_core::…");
        assert_eq!(owner_of_symbol("ctx::run_user_code_5"), "notebook cell");
        assert!(is_wrapper("cudarc::driver::safe::core::CudaStream::alloc_zeros"));
        assert!(is_wrapper("<alloc::vec::Vec<T>>::push"));
        assert!(!is_wrapper("candle_core::storage::Storage::zeros"));
        assert!(is_wrapper("cuMemAlloc_v2") && is_wrapper("cuMemAllocAsync") && !is_wrapper("cublas_helper"));
        assert!(is_cuda_layer("libcuda.so.1") && is_cuda_layer("libcupti.so.13") && !is_cuda_layer("libcublas.so.13"));
        assert!(is_system("libc.so.6") && is_system("ld-linux-x86-64.so.2") && !is_system("libcublasLt.so.13"));
    }

    #[test]
    fn a_cell_library_without_symbols_is_the_notebook_cell() {
        let mapping = |start, name: &str, ours| Mapping { start, end: start + 0x1000, name: name.into(), ours };
        let mut o = Owners {
            maps: vec![mapping(0x1000, "libcuda.so.1", false), mapping(0x10000, "libcode_7.so", true)],
            ..Owners::new()
        };
        // The driver's frame, then two frames of a cell library whose symbols cannot be read.
        assert_eq!(o.owner(&[0x1100, 0x10100, 0x10200]).as_deref(), Some("notebook cell"));
        // A library of its own is named by its file, even with no symbols.
        o.maps.push(mapping(0x20000, "libcublasLt.so.13", false));
        assert_eq!(o.owner(&[0x1100, 0x20100, 0x10100]).as_deref(), Some("libcublasLt.so.13"));
        // The C runtime at the bottom of the stack (a thread's start) is nobody's.
        o.maps.push(mapping(0x30000, "libc.so.6", false));
        assert_eq!(o.owner(&[0x1100, 0x10100, 0x30100]).as_deref(), Some("notebook cell"));
    }

    #[test]
    fn a_stack_of_this_test_is_owned_by_this_crate() {
        // No CUDA frames: the first frame outside the wrappers is this test module's function,
        // in this crate (gpumem_nb's own tests are named `gpumem_nb::…`, a wrapper, so the owner
        // is the test harness or the thread's entry: anything but None and not a CUDA layer).
        let frames = caller_of_capture();
        let mut o = Owners::new();
        let owner = o.owner(&frames);
        assert!(owner.as_deref().is_some_and(|s| !s.is_empty() && !is_cuda_layer(s)), "{owner:?}");
        // Cached: asking again gives the same answer.
        assert_eq!(o.owner(&frames), owner);
        assert_eq!(o.owner(&[]), None);
    }
}
