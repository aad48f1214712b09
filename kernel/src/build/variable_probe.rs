//! What the notebook's variables hold, by the framework's own types, compiled into the session
//! library.
//!
//! burn's GPU backends allocate on a device thread of their own, inside cubecl's pools: no stack
//! and no driver call says which tensor a page holds, so tracking cannot tell burn's parameters
//! from its optimizer's moments. The variables can: at the end of every cell evcxr stores each
//! variable the cell ends with, and with our patch (vendor/evcxr/PATCHES.md §12) it first shows
//! each one, by reference, to a probe in the session library, whose type it knows there. When a
//! generation of the session library adds burn 0.21 with `autodiff` and CUDA or ndarray, it
//! also gets the module below, built against that burn. The probe picks what it knows by
//! autoref specialisation, most specific first:
//! 1. a `Tensor` (any backend, rank and kind), an `OptimizerAdaptor` of `Adam` or `AdamW` (its
//!    moments, read through `to_record`: handle clones, no copy);
//! 2. a type that is a `Module` of every backend (`usize`, `String`, `Vec<u8>`: burn implements
//!    `Module<B>` for them for every `B`), recognised as a module of a backend no notebook uses
//!    (`Autodiff<Autodiff<…>>`): nothing (without this level step 3 would be ambiguous for them);
//! 3. any other `Module`, its backend inferred: its parameters, visited (`ModuleVisitor`); one
//!    not yet initialised (burn's lazy `Param`) is counted as such, never initialised by this;
//! 4. anything else: nothing.
//!
//! Sizes are logical: elements × the dtype's size, as burn's `num_params` counts (cubecl rounds
//! each buffer up inside its pages; what the pools hold beyond is cubecl's own figure). A buffer
//! two variables share (`model.clone()`) counts for each. The notebook's process reads the
//! answer after the cell (`gpumem_nb`'s `notebook::probe`) through one C function:
//! `gpumem_probe_burn_v1(out, cap, len) -> u64` writes a line per variable holding tensors,
//! `name \t component \t bytes \t tensors \t lazy \t type` (at most `cap` bytes; the whole
//! answer's length into `len`) and returns the number of the cell's probe (0: none yet).

/// The probe's module for a generation adding `deps` (key, TOML spec), and the path cells call it
/// by within the generated crate; `None` when no dependency is a burn it knows.
pub fn for_deps(deps: &[(String, String)]) -> Option<String> {
    deps.iter().find_map(|(key, spec)| {
        let sentinel = sentinel_backend(key, spec)?;
        Some(
            MODULE
                .replace("__BURN__", &key.replace('-', "_"))
                .replace("__SENTINEL__", &format!("burn::backend::Autodiff<burn::backend::Autodiff<{sentinel}>>")),
        )
    })
}

/// The module's path under the generated crate's name.
pub const MODULE_NAME: &str = "__gpumem_probe";

/// For burn 0.21 with `autodiff`, the path of a backend its features turn on (`cuda`, else
/// `ndarray`: the two the probe is built and checked against), under which the probe tells
/// blanket types from modules; `None` for anything else (a probe that did not build would cost
/// the session library, so none is tried where it was not checked).
fn sentinel_backend(key: &str, spec: &str) -> Option<&'static str> {
    let doc = format!("d = {spec}").parse::<toml::Table>().ok()?;
    let toml::Value::Table(t) = &doc["d"] else { return None };
    let package = t.get("package").and_then(|p| p.as_str()).unwrap_or(key);
    let version = t.get("version").and_then(|v| v.as_str()).unwrap_or("");
    let features: Vec<&str> = t
        .get("features")
        .and_then(|f| f.as_array())
        .map(|a| a.iter().filter_map(|f| f.as_str()).collect())
        .unwrap_or_default();
    if package != "burn" || !super::books_shim::same_minor(version, "0.21") || !features.contains(&"autodiff") {
        return None;
    }
    [("cuda", "burn::backend::Cuda"), ("ndarray", "burn::backend::NdArray")]
        .into_iter()
        .find(|(f, _)| features.contains(f))
        .map(|(_, b)| b)
}

/// The module, against burn 0.21 (`__BURN__`: the notebook's key for burn; `__SENTINEL__`: a
/// backend no notebook uses).
const MODULE: &str = r#"
/// gpumem-kernel's probe of the variables a cell ends with (burn 0.21): evcxr shows it each
/// variable before storing it. Not for the notebook's code.
#[doc(hidden)]
pub mod __gpumem_probe {
    use ::__BURN__ as burn;
    use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
    use burn::optim::adaptor::OptimizerAdaptor;
    use burn::optim::record::{AdaptorRecord, AdaptorRecordV1};
    use burn::optim::{Adam, AdamW, AdaptiveMomentumState, Optimizer};
    use burn::tensor::backend::{AutodiffBackend, Backend};
    use burn::tensor::{BasicOps, Bool, Element, Int, Tensor};
    use std::sync::Mutex;

    type Sentinel = __SENTINEL__;

    /// The cell's probe number and a line per variable holding tensors.
    static BOOK: Mutex<(u64, String)> = Mutex::new((0, String::new()));

    fn book() -> std::sync::MutexGuard<'static, (u64, String)> {
        BOOK.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A cell's variables are about to be shown: the last cell's answer is dropped.
    pub fn begin() {
        let mut b = book();
        b.0 += 1;
        b.1.clear();
    }

    #[derive(Default)]
    struct Count {
        bytes: u64,
        tensors: u64,
        lazy: u64,
    }

    /// Counts what `f` finds for variable `name` as `component`; a panic in it counts nothing.
    fn note<T>(name: &str, component: &str, f: impl FnOnce(&mut Count)) {
        let mut c = Count::default();
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut c))).is_err() || c.tensors + c.lazy == 0 {
            return;
        }
        let line = format!(
            "{name}\t{component}\t{}\t{}\t{}\t{}\n",
            c.bytes,
            c.tensors,
            c.lazy,
            std::any::type_name::<T>()
        );
        book().1.push_str(&line);
    }

    impl Count {
        fn tensor<B: Backend, const D: usize, K: BasicOps<B>>(&mut self, t: &Tensor<B, D, K>)
        where
            K::Elem: Element,
        {
            self.bytes += t.shape().num_elements() as u64 * t.dtype().size() as u64;
            self.tensors += 1;
        }

        fn param<B: Backend, const D: usize, K: BasicOps<B>>(&mut self, p: &Param<Tensor<B, D, K>>)
        where
            K::Elem: Element,
            Tensor<B, D, K>: burn::module::Parameter,
        {
            if p.is_initialized() {
                self.tensor(&p.val());
            } else {
                self.lazy += 1;
            }
        }

        fn moments<B: Backend, const D: usize>(&mut self, m: &AdaptiveMomentumState<B, D>) {
            self.tensor(&m.moment_1);
            self.tensor(&m.moment_2);
            if let Some(t) = &m.max_moment_2 {
                self.tensor(t);
            }
        }
    }

    impl<B: Backend> ModuleVisitor<B> for Count {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            self.param(p)
        }
        fn visit_int<const D: usize>(&mut self, p: &Param<Tensor<B, D, Int>>) {
            self.param(p)
        }
        fn visit_bool<const D: usize>(&mut self, p: &Param<Tensor<B, D, Bool>>) {
            self.param(p)
        }
    }

    /// `$body` for the state of each rank an adaptor's record holds.
    macro_rules! each_rank {
        ($record:expr, $state:ident => $body:expr) => {
            match $record {
                AdaptorRecord::V1(v) => match v {
                    AdaptorRecordV1::Rank0($state) => $body,
                    AdaptorRecordV1::Rank1($state) => $body,
                    AdaptorRecordV1::Rank2($state) => $body,
                    AdaptorRecordV1::Rank3($state) => $body,
                    AdaptorRecordV1::Rank4($state) => $body,
                    AdaptorRecordV1::Rank5($state) => $body,
                    AdaptorRecordV1::Rank6($state) => $body,
                    AdaptorRecordV1::Rank7($state) => $body,
                    AdaptorRecordV1::Rank8($state) => $body,
                },
            }
        };
    }

    /// A variable shown to the probe.
    pub struct Wrap<'a, T>(pub &'a T);

    /// 1: the types the probe knows by name.
    pub trait ProbeTyped {
        fn gpumem_probe(&self, name: &str);
    }
    impl<B: Backend, const D: usize, K: BasicOps<B>> ProbeTyped for &&&Wrap<'_, Tensor<B, D, K>>
    where
        K::Elem: Element,
    {
        fn gpumem_probe(&self, name: &str) {
            note::<Tensor<B, D, K>>(name, "tensor", |c| c.tensor(self.0));
        }
    }
    impl<B: AutodiffBackend, M: AutodiffModule<B>> ProbeTyped for &&&Wrap<'_, OptimizerAdaptor<Adam, M, B>> {
        fn gpumem_probe(&self, name: &str) {
            note::<OptimizerAdaptor<Adam, M, B>>(name, "optimizer_state", |c| {
                for r in self.0.to_record().values() {
                    each_rank!(r, s => c.moments(&s.momentum));
                }
            });
        }
    }
    impl<B: AutodiffBackend, M: AutodiffModule<B>> ProbeTyped for &&&Wrap<'_, OptimizerAdaptor<AdamW, M, B>> {
        fn gpumem_probe(&self, name: &str) {
            note::<OptimizerAdaptor<AdamW, M, B>>(name, "optimizer_state", |c| {
                for r in self.0.to_record().values() {
                    each_rank!(r, s => c.moments(&s.momentum));
                }
            });
        }
    }

    /// 2: modules of every backend (`usize`, `String`, `Vec<u8>`, …): nothing.
    pub trait ProbeBlanket {
        fn gpumem_probe(&self, _name: &str) {}
    }
    impl<T: Module<Sentinel>> ProbeBlanket for &&Wrap<'_, T> {}

    /// 3: any other module, its backend inferred: its parameters.
    pub trait ProbeModule<B> {
        fn gpumem_probe(&self, name: &str);
    }
    impl<B: Backend, T: Module<B>> ProbeModule<B> for &Wrap<'_, T> {
        fn gpumem_probe(&self, name: &str) {
            note::<T>(name, "parameter", |c| self.0.visit(c));
        }
    }

    /// 4: anything else: nothing.
    pub trait ProbeOther {
        fn gpumem_probe(&self, _name: &str) {}
    }
    impl<T> ProbeOther for Wrap<'_, T> {}

    /// The last cell's answer (see gpumem-kernel's `build::variable_probe`).
    #[no_mangle]
    pub extern "C" fn gpumem_probe_burn_v1(out: *mut u8, cap: usize, len: *mut usize) -> u64 {
        let b = book();
        let n = b.1.len().min(cap);
        if !out.is_null() && !len.is_null() {
            // SAFETY: the caller gives `cap` writable bytes at `out` and a writable `len`.
            unsafe {
                std::ptr::copy_nonoverlapping(b.1.as_ptr(), out, n);
                *len = b.1.len();
            }
        }
        b.0
    }
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn dep(k: &str, s: &str) -> Vec<(String, String)> {
        vec![(k.to_string(), s.to_string())]
    }

    #[test]
    fn burn_0_21_with_autodiff_and_a_backend_gets_the_probe_and_nothing_else_does() {
        for (k, s, backend) in [
            ("burn", r#"{ version = "0.21", features = ["ndarray", "autodiff"] }"#, "NdArray"),
            (
                "burn",
                r#"{ version = "0.21", default-features = false, features = ["std", "cuda", "autodiff", "cubecl"] }"#,
                "Cuda",
            ),
            ("b", r#"{ package = "burn", version = "=0.21.0", features = ["autodiff", "ndarray"] }"#, "NdArray"),
        ] {
            let module = for_deps(&dep(k, s)).unwrap_or_else(|| panic!("{k} = {s}: no probe"));
            assert!(module.contains(&format!("use ::{k} as burn;")), "{module}");
            assert!(
                module.contains(&format!(
                    "type Sentinel = burn::backend::Autodiff<burn::backend::Autodiff<burn::backend::{backend}>>;"
                )),
                "{module}"
            );
            assert!(module.contains(&format!("pub mod {MODULE_NAME}")) && module.contains("fn gpumem_probe_burn_v1"));
            assert!(!module.contains("__BURN__") && !module.contains("__SENTINEL__"));
        }
        for (k, s) in [
            ("burn", r#"{ version = "0.21", features = ["ndarray"] }"#),
            ("burn", r#"{ version = "0.21", features = ["autodiff"] }"#),
            ("burn", r#"{ version = "0.21", features = ["autodiff", "wgpu"] }"#),
            ("burn", r#""0.21""#),
            ("burn", r#"{ version = "0.22", features = ["ndarray", "autodiff"] }"#),
            ("candle-core", r#"{ version = "0.9", features = ["autodiff", "cuda"] }"#),
            ("burn", "not toml ["),
        ] {
            assert!(for_deps(&dep(k, s)).is_none(), "{k} = {s}: a probe for a spec it does not know");
        }
    }
}
