//! What a piece of memory is, in PyTorch's component vocabulary (pytorch/pytorch #182387:
//! `parameter`, `buffer`, `gradient`, `activation`, `temp`, `optimizer_state`, `other`), plus
//! `workspace`, which PyTorch cannot see: the CUDA libraries' own workspaces and handles.
//!
//! Two sources, in this order:
//! - a **stamp** the code sets on its thread ([`Stamp`]; the public guard and closure are in
//!   `crate::notebook::components`): it travels with the allocation's stack as a marker after
//!   the frames (not an address: no code lies below 16), so everything that keeps stacks
//!   (tracked allocations, the allocator's blocks, snapshots) keeps it;
//! - **rules** on the stack's function names ([`Rules`]): built-in ones for candle, burn and the
//!   CUDA libraries, and the user's own, first match from the outermost frame in, so that
//!   `AdamW::new` making its moments with `Var::zeros` is optimizer state, not a parameter (two
//!   exceptions: a CUDA library's frame anywhere makes workspace, and a backward pass run by an
//!   optimizer, `backward_step`, makes gradients). A
//!   function inlined into another is named from its source file (`candle_nn::optim::new`).
//!
//! What neither classifies is `other`.

use std::cell::{Cell, RefCell};

/// What a piece of memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Component {
    /// A model's weights (`Var`, `VarMap`, burn's `Param`).
    Parameter,
    /// State a model keeps that is not trained (BatchNorm's running statistics).
    Buffer,
    /// Gradients (what `backward` produces and its store keeps).
    Gradient,
    /// Outputs of a forward pass (kept alive by a graph or by the notebook).
    Activation,
    /// Short-lived intermediates.
    Temp,
    /// An optimizer's own state (Adam's moments).
    OptimizerState,
    /// The CUDA libraries' workspaces and handles (cuBLAS, cuBLASLt, cuDNN, cuFFT, cuRAND, NCCL's
    /// communicator buffers).
    Workspace,
    /// Everything no stamp or rule classified.
    Other,
}

impl Component {
    /// Every component, in report order.
    pub const ALL: [Component; 8] = [
        Component::Parameter,
        Component::Buffer,
        Component::Gradient,
        Component::Activation,
        Component::Temp,
        Component::OptimizerState,
        Component::Workspace,
        Component::Other,
    ];

    /// The name in data and on screen, as PyTorch's `component_bytes.{name}` keys spell it.
    pub fn key(self) -> &'static str {
        match self {
            Component::Parameter => "parameter",
            Component::Buffer => "buffer",
            Component::Gradient => "gradient",
            Component::Activation => "activation",
            Component::Temp => "temp",
            Component::OptimizerState => "optimizer_state",
            Component::Workspace => "workspace",
            Component::Other => "other",
        }
    }

    /// The component a name stands for (`optimizer_state`, also `optimizer-state`, any case).
    pub(crate) fn parse(name: &str) -> Option<Component> {
        let n = name.trim().to_ascii_lowercase().replace('-', "_");
        Component::ALL.into_iter().find(|c| c.key() == n)
    }

    /// Whether this component's allocations come in runs whose working memory is `temp`: what
    /// a backward pass, an optimizer step or a parameter initializer releases before its run of
    /// allocations ends (the next allocation of a component that is neither this one nor
    /// [`Component::beside_runs`]). The per-cell reports and gpumem-nb's snapshots both ask.
    pub(crate) fn has_runs(self) -> bool {
        matches!(self, Component::Gradient | Component::OptimizerState | Component::Parameter)
    }

    /// Whether this component's allocations neither continue nor end a run (library workspaces,
    /// unclassified buffers, stamped temporaries).
    pub(crate) fn beside_runs(self) -> bool {
        matches!(self, Component::Workspace | Component::Other | Component::Temp)
    }

    /// The marker a stamped stack carries after its frames.
    pub(crate) fn marker(self) -> usize {
        MARKER_BASE + self as usize
    }

    /// The component a marker stands for.
    fn of_marker(v: usize) -> Option<Component> {
        v.checked_sub(MARKER_BASE).and_then(|i| Component::ALL.get(i).copied())
    }
}

impl std::fmt::Display for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

/// The file name of the frame a snapshot adds to a stack to say what its memory is (the frame's
/// name is `component <key>`).
pub(crate) const COMPONENT_FILE: &str = "gpumem-nb component";

/// The first marker; markers stay below 16, where no code is mapped (and above the thread
/// mark, 1).
const MARKER_BASE: usize = 2;

/// A stack's stamp, if it carries one (the marker sits after the frames, before the thread mark).
pub(crate) fn stamp_of(frames: &[usize]) -> Option<Component> {
    frames.iter().rev().take(2).find_map(|&v| Component::of_marker(v))
}

/// Whether a stack entry is a marker (a stamp or the thread mark), not a frame.
pub(crate) fn is_marker(v: usize) -> bool {
    v < MARKER_BASE + Component::ALL.len()
}

thread_local! {
    /// This copy of the crate's stamps on this thread, innermost last.
    static STAMPS: RefCell<Stack> = const { RefCell::new(Stack(Vec::new())) };
    /// The innermost of `STAMPS`, set with it on every push and pop, so that [`current`] (asked
    /// by every malloc) reads one byte: plain data, no borrow, no destructor to register or
    /// check for.
    static TOP: Cell<Option<Component>> = const { Cell::new(None) };
}

/// The stamps of one thread. Once the thread's destructors have dropped them no stamp is
/// current, as `STAMPS` itself then answers.
struct Stack(Vec<Component>);

impl Drop for Stack {
    fn drop(&mut self) {
        TOP.set(None);
    }
}

/// This thread's stamp in this copy of the crate (the innermost one set).
#[inline]
pub(crate) fn current() -> Option<Component> {
    TOP.get()
}

/// A stamp on this thread for as long as it lives (this copy of the crate only; the process-wide
/// side is `crate::notebook::components`).
#[derive(Debug)]
pub(crate) struct Stamp(());

impl Stamp {
    /// Stamps `c` until the value is dropped; stamps nest.
    pub(crate) fn push(c: Component) -> Stamp {
        let _ = STAMPS.try_with(|s| {
            s.borrow_mut().0.push(c);
            TOP.set(Some(c));
        });
        Stamp(())
    }
}

impl Drop for Stamp {
    fn drop(&mut self) {
        let _ = STAMPS.try_with(|s| {
            let mut s = s.borrow_mut();
            s.0.pop();
            TOP.set(s.0.last().copied());
        });
    }
}

/// One rule: a function name containing `pattern` makes the memory `component`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Rule {
    /// A part of a demangled function name (`candle_nn::optim::`), or of a library's file name
    /// when it starts with `lib` (`libcublas`).
    pub pattern: String,
    /// What the memory is.
    pub component: Component,
    /// Who wrote the rule: `built-in` or `user`.
    pub origin: &'static str,
}

/// The rules, the user's first (they win over the built-in ones at the same frame).
#[derive(Clone, Debug)]
pub(crate) struct Rules {
    rules: Vec<Rule>,
}

/// The built-in rules: candle, burn, the CUDA libraries.
const BUILT_IN: &[(&str, Component)] = &[
    // Optimizers: the state they make and the step's work.
    ("candle_nn::optim::", Component::OptimizerState),
    ("burn_optim::", Component::OptimizerState),
    ("burn::optim::", Component::OptimizerState),
    ("burn_core::optim::", Component::OptimizerState),
    // Backward passes.
    ("candle_core::backprop::", Component::Gradient),
    ("burn_autodiff::", Component::Gradient),
    // Parameters: candle's variables and their map and builder, burn's `Param`.
    ("candle_nn::var_map::", Component::Parameter),
    ("candle_nn::var_builder::", Component::Parameter),
    ("candle_core::variable::", Component::Parameter),
    ("burn_core::module::param::", Component::Parameter),
    // Forward passes: any `forward` (candle's and burn's modules, the notebook's own, and
    // `forward_t`), whatever it is called through.
    ("::forward", Component::Activation),
    // The CUDA libraries' own memory.
    ("libcublas", Component::Workspace),
    ("libcudnn", Component::Workspace),
    ("libcufft", Component::Workspace),
    ("libcurand", Component::Workspace),
    ("libcusparse", Component::Workspace),
    ("libcusolver", Component::Workspace),
    ("libnccl", Component::Workspace),
    ("cublasCreate", Component::Workspace),
    ("cublasLt", Component::Workspace),
];

impl Default for Rules {
    fn default() -> Self {
        Rules {
            rules: BUILT_IN
                .iter()
                .map(|&(p, c)| Rule { pattern: p.to_string(), component: c, origin: "built-in" })
                .collect(),
        }
    }
}

impl Rules {
    /// The built-in rules.
    pub(crate) fn new() -> Self {
        Rules::default()
    }

    /// Adds a user rule (before every built-in one); an empty pattern is refused.
    pub(crate) fn add(&mut self, pattern: &str, component: Component) -> Result<(), String> {
        if pattern.trim().is_empty() {
            return Err("a component rule needs a non-empty pattern (a part of a function name)".into());
        }
        let at = self.rules.iter().position(|r| r.origin == "built-in").unwrap_or(self.rules.len());
        self.rules.insert(at, Rule { pattern: pattern.to_string(), component, origin: "user" });
        Ok(())
    }

    /// Every rule, in the order they are tried at each frame.
    pub(crate) fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The component of a stack given as `(function, library file)` per frame, innermost
    /// first: the first frame from the outermost in that a rule matches. Where that rule is a
    /// built-in one, two built-in rules further in know better:
    /// - a CUDA library's frame anywhere makes `workspace`: what cuRAND or cuBLAS allocates for
    ///   itself is its own, whoever called it (candle's first `Var::randn` creates cuRAND's
    ///   generator state under `VarMap::get`);
    /// - a backward pass inside an optimizer (candle's `Optimizer::backward_step` runs
    ///   `backward`, then the step) makes gradients: under an optimizer's frame, a gradient rule
    ///   further in wins.
    ///
    /// A user's rule at the outermost match decides alone: it says what the user meant.
    pub(crate) fn classify<'a>(
        &self,
        frames: impl DoubleEndedIterator<Item = (&'a str, &'a str)>,
    ) -> Option<Component> {
        let matched: Vec<&Rule> =
            frames.rev().filter_map(|(function, library)| self.matching(function, library)).collect();
        let outer = *matched.first()?;
        let built_in = |c: Component| matched.iter().any(|r| r.origin == "built-in" && r.component == c);
        if outer.origin == "user" {
            return Some(outer.component);
        }
        if built_in(Component::Workspace) {
            return Some(Component::Workspace);
        }
        if outer.component == Component::OptimizerState && built_in(Component::Gradient) {
            return Some(Component::Gradient);
        }
        Some(outer.component)
    }

    /// The first rule that matches one frame.
    fn matching(&self, function: &str, library: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| {
            if r.pattern.starts_with("lib") && !r.pattern.contains("::") {
                library.contains(&r.pattern) || function.contains(&r.pattern)
            } else {
                function.contains(&r.pattern)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_markers_are_not_code() {
        for c in Component::ALL {
            assert_eq!(Component::parse(c.key()), Some(c));
            assert_eq!(Component::of_marker(c.marker()), Some(c));
            assert!(c.marker() < 16 && is_marker(c.marker()));
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{}\"", c.key()));
        }
        assert_eq!(Component::parse("Optimizer-State"), Some(Component::OptimizerState));
        assert_eq!(Component::parse("weights"), None);
        assert!(!is_marker(0x5555_0000_1000));
        assert_eq!(stamp_of(&[0x1000, 0x2000, Component::Gradient.marker()]), Some(Component::Gradient));
        assert_eq!(stamp_of(&[0x1000, Component::Temp.marker(), 1]), Some(Component::Temp));
        assert_eq!(stamp_of(&[0x1000, 0x2000, 1]), None);
    }

    #[test]
    fn stamps_nest_and_unwind_with_panics() {
        assert_eq!(current(), None);
        {
            let _p = Stamp::push(Component::Parameter);
            assert_eq!(current(), Some(Component::Parameter));
            let r = std::panic::catch_unwind(|| {
                let _o = Stamp::push(Component::OptimizerState);
                assert_eq!(current(), Some(Component::OptimizerState));
                panic!("inside the optimizer");
            });
            assert!(r.is_err());
            assert_eq!(current(), Some(Component::Parameter), "the panic dropped the inner stamp");
        }
        assert_eq!(current(), None);
        // Another thread has its own.
        let _p = Stamp::push(Component::Temp);
        assert_eq!(std::thread::spawn(current).join().unwrap(), None);
    }

    #[test]
    fn current_is_the_stacks_last_whatever_order_stamps_end_in() {
        // Guards dropped out of order pop the innermost, as the stack always did: `current` is
        // read from the one-byte mirror, which must say the same.
        let outer = Stamp::push(Component::Gradient);
        let inner = Stamp::push(Component::Temp);
        drop(outer);
        assert_eq!(current(), Some(Component::Gradient));
        drop(inner);
        assert_eq!(current(), None);
    }

    fn stack<'a>(names: &'a [&'a str]) -> impl DoubleEndedIterator<Item = (&'a str, &'a str)> {
        names.iter().map(|n| (*n, "libnotebook.so"))
    }

    #[test]
    fn the_outermost_matching_frame_decides() {
        let rules = Rules::new();
        // AdamW::new makes its moments with Var::zeros: optimizer state.
        let adam = ["cudarc::driver::safe::alloc", "candle_core::variable::Var::zeros", "candle_nn::optim::AdamW::new"];
        assert_eq!(rules.classify(stack(&adam)), Some(Component::OptimizerState));
        let var =
            ["cudarc::driver::safe::alloc", "candle_core::variable::Var::randn", "candle_nn::var_map::VarMap::get"];
        assert_eq!(rules.classify(stack(&var)), Some(Component::Parameter));
        let grad = ["candle_core::tensor::Tensor::matmul", "candle_core::backprop::<impl Tensor>::backward"];
        assert_eq!(rules.classify(stack(&grad)), Some(Component::Gradient));
        // `opt.backward_step(&loss)`: the backward inside the optimizer makes gradients, the
        // step after it (no backward frame) works on optimizer state.
        let in_step = [
            "candle_core::tensor::Tensor::add",
            "candle_core::backprop::<impl Tensor>::backward",
            "candle_nn::optim::Optimizer::backward_step",
        ];
        assert_eq!(rules.classify(stack(&in_step)), Some(Component::Gradient));
        let step = ["candle_core::tensor::Tensor::mul", "<candle_nn::optim::AdamW as Optimizer>::step"];
        assert_eq!(rules.classify(stack(&step)), Some(Component::OptimizerState));
        // A forward inside a backward pass (a recomputing checkpoint) stays the backward's: the
        // outermost frame decides everywhere else.
        let recompute =
            ["<my::Block as candle_core::Module>::forward", "candle_core::backprop::<impl Tensor>::backward"];
        assert_eq!(rules.classify(stack(&recompute)), Some(Component::Gradient));
        let fwd =
            ["candle_core::tensor::Tensor::matmul", "<candle_nn::linear::Linear as candle_core::Module>::forward"];
        assert_eq!(rules.classify(stack(&fwd)), Some(Component::Activation));
        assert_eq!(rules.classify(stack(&["user::f", "candle_core::tensor::Tensor::zeros"])), None);
        // A library's frames by its file.
        let cublas = [("cuMemAlloc_v2", "libcuda.so.1"), ("??", "libcublasLt.so.13"), ("user::f", "libx.so")];
        assert_eq!(rules.classify(cublas.iter().copied()), Some(Component::Workspace));
        // A library's own memory wherever its caller is: cuRAND's generator state, made by the
        // first `Var::randn` under `VarMap::get`, is cuRAND's, not a parameter.
        let curand = [
            ("cuMemAlloc_v2", "libcuda.so.1"),
            ("??", "libcurand.so.10"),
            ("candle_core::variable::Var::randn", "libdeps.so"),
            ("candle_nn::var_map::VarMap::get", "libdeps.so"),
        ];
        assert_eq!(rules.classify(curand.iter().copied()), Some(Component::Workspace));
        // NCCL's buffers, on its proxy thread (no caller of ours) or under the cell's
        // `Comm::from_devices`.
        let nccl = [("cuMemCreate", "libcuda.so.1"), ("??", "libnccl.so.2"), ("start_thread", "libc.so.6")];
        assert_eq!(rules.classify(nccl.iter().copied()), Some(Component::Workspace));
        let comm = [("??", "libnccl.so.2"), ("cudarc::nccl::safe::Comm::from_devices", "libdeps.so")];
        assert_eq!(rules.classify(comm.iter().copied()), Some(Component::Workspace));
    }

    #[test]
    fn user_rules_come_first_and_need_a_pattern() {
        let mut rules = Rules::new();
        assert!(rules.add("  ", Component::Buffer).unwrap_err().contains("non-empty pattern"));
        rules.add("my_model::norm::running_", Component::Buffer).unwrap();
        assert_eq!(rules.rules()[0].origin, "user");
        let s = ["candle_core::variable::Var::zeros", "my_model::norm::running_stats"];
        assert_eq!(rules.classify(stack(&s)), Some(Component::Buffer));
        // At one frame, the user's rule wins over a built-in one.
        rules.add("candle_nn::optim::AdamW::new", Component::Other).unwrap();
        assert_eq!(rules.classify(stack(&["candle_nn::optim::AdamW::new"])), Some(Component::Other));
        // A user's rule at the outermost match decides alone: a library or a backward inside it
        // does not overrule it, nor does a user's workspace rule further in overrule an outer rule.
        rules.add("my_model::load", Component::Parameter).unwrap();
        let load = [
            ("??", "libcurand.so.10"),
            ("candle_core::backprop::<impl Tensor>::backward", "l"),
            ("my_model::load", "l"),
        ];
        assert_eq!(rules.classify(load.iter().copied()), Some(Component::Parameter));
        rules.add("my_helper::scratch", Component::Workspace).unwrap();
        let fwd = ["my_helper::scratch", "<my::Block as candle_core::Module>::forward"];
        assert_eq!(rules.classify(stack(&fwd)), Some(Component::Activation));
    }
}
