//! What memory is: parameters, gradients, optimizer state, activations, temporaries and the
//! CUDA libraries' workspaces, in PyTorch's component vocabulary ([`Component`]).
//!
//! Each tracked allocation gets its component from, in this order:
//! 1. a **stamp** set on the allocating thread: [`component`] around a closure, or the guard of
//!    [`enter`]; stamps nest, and a panic drops them with everything else it unwinds;
//! 2. the **rules** on the allocation's stack ([`rules`]): built-in ones for candle (`VarMap`,
//!    `VarBuilder` and `Var` → parameter, `backprop` → gradient, `candle_nn::optim` →
//!    optimizer_state), burn (`Param` → parameter, `burn_autodiff` → gradient, `burn_optim` →
//!    optimizer_state), any `forward` (candle's, burn's or the notebook's own modules →
//!    activation) and the CUDA libraries (cuBLAS, cuBLASLt, cuDNN, cuFFT, cuRAND → workspace),
//!    and yours ([`add_rule`]), tried before the built-in ones; the outermost frame a rule
//!    matches decides, except that under a built-in rule a CUDA library's frame anywhere makes
//!    workspace and, under an optimizer's, a backward pass further in makes gradients
//!    (`backward_step`);
//! 3. `other`.
//!
//! The stamp travels with the allocation's stack, so it needs stacks (`GPUMEM_NB_TRACK=nostacks`
//! turns both off), and it is the allocating thread's: work a framework runs on a thread of its
//! own (cubecl's device thread for burn) is not stamped by the cell's stamp.
//!
//! Under evcxr each cell has its own copy of this crate; stamps and rules are one per process
//! (the anchor), so a stamp set through one copy is seen by the tracking another started.
//!
//! A framework that keeps its tensors in pools of its own (cubecl, for burn's GPU backends)
//! allocates inside pages tracking saw once, so no stack says what a tensor is. When such a
//! framework is watched (`gpumem_nb::frameworks`), each stamp is also a phase of it: its books
//! are settled and read when the stamp begins and ends, and the change of its in-use bytes is
//! the component's (less what nested stamps changed), shown beside its numbers in the cell's
//! report. That is a net change by the framework's own count, not a peak: a tensor made and
//! dropped inside the phase is not in it. The books are the process's: what another thread
//! changes while a stamp is open counts in it too. With no framework watched a stamp reads
//! nothing; with one, beginning or ending a stamp waits for its settle and reading (at most
//! their time limits, also when a panic ends the stamp).

use crate::record::component::Stamp;
use crate::sync::lock;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::ThreadId;

use crate::record::component::Rules;
pub use crate::record::component::{Component, Rule};

/// The process's stamps and rules.
struct State {
    /// Stamps set, all threads together: 0 lets an allocation skip the lookup.
    active: AtomicUsize,
    by_thread: Mutex<HashMap<ThreadId, Vec<Component>>>,
    rules: Mutex<Rules>,
    /// Bumped by every rule added: classifications cached before are stale.
    generation: AtomicU64,
}

fn state() -> &'static State {
    super::anchor::per_process!("components", State, || State {
        active: AtomicUsize::new(0),
        by_thread: Mutex::new(HashMap::new()),
        rules: Mutex::new(Rules::new()),
        generation: AtomicU64::new(0),
    })
}

/// A stamp on this thread until dropped ([`enter`]). Not `Send`: it ends on the thread it began.
#[must_use = "the stamp ends when the guard is dropped"]
#[derive(Debug)]
pub struct ComponentGuard {
    _local: Stamp,
    /// A phase of the watched frameworks began with the stamp.
    phase: bool,
    _not_send: PhantomData<*const ()>,
}

/// Stamps what this thread allocates as `c` until the guard is dropped (stamps nest: the
/// innermost wins).
///
/// ```
/// use gpumem_nb::{components, Component};
/// let _g = components::enter(Component::OptimizerState);
/// assert_eq!(components::current(), Some(Component::OptimizerState));
/// ```
pub fn enter(c: Component) -> ComponentGuard {
    let s = state();
    lock(&s.by_thread).entry(std::thread::current().id()).or_default().push(c);
    s.active.fetch_add(1, Ordering::AcqRel);
    let phase = super::watched::phase_begin(c);
    ComponentGuard { _local: Stamp::push(c), phase, _not_send: PhantomData }
}

impl Drop for ComponentGuard {
    fn drop(&mut self) {
        let s = state();
        let id = std::thread::current().id();
        let mut map = lock(&s.by_thread);
        if let Some(v) = map.get_mut(&id) {
            v.pop();
            if v.is_empty() {
                map.remove(&id);
            }
        }
        s.active.fetch_sub(1, Ordering::AcqRel);
        drop(map);
        if self.phase {
            super::watched::phase_end();
        }
    }
}

/// Runs `f` with what this thread allocates in it stamped as `c`, PyTorch's component stamp:
/// `gpumem_nb::component(Component::OptimizerState, || opt.step(&grads))`.
pub fn component<R>(c: Component, f: impl FnOnce() -> R) -> R {
    let _g = enter(c);
    f()
}

/// This thread's stamp (the innermost set), through any copy of the crate.
pub fn current() -> Option<Component> {
    let s = state();
    if s.active.load(Ordering::Acquire) == 0 {
        return None;
    }
    lock(&s.by_thread).get(&std::thread::current().id()).and_then(|v| v.last().copied())
}

/// Adds a rule: memory allocated under a function whose name contains `pattern` (or in a
/// library whose file name contains it, for a pattern starting with `lib`) is `c`. Your rules
/// are tried before the built-in ones.
///
/// ```
/// use gpumem_nb::{components, Component};
/// components::add_rule("my_model::norm::", Component::Buffer).unwrap();
/// assert!(components::rules().iter().any(|r| r.pattern == "my_model::norm::"));
/// ```
pub fn add_rule(pattern: &str, c: Component) -> crate::error::Result<()> {
    let s = state();
    lock(&s.rules).add(pattern, c).map_err(crate::error::Error::InvalidArgument)?;
    s.generation.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// Every rule, yours first, in the order they are tried at each frame.
pub fn rules() -> Vec<Rule> {
    lock(&state().rules).rules().to_vec()
}

/// The rules with their generation (changes when one is added), for classifying.
pub(crate) fn with_rules<R>(f: impl FnOnce(&Rules, u64) -> R) -> R {
    let s = state();
    let rules = lock(&s.rules);
    f(&rules, s.generation.load(Ordering::Acquire))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_nest_per_thread_and_end_with_a_panic() {
        let _one = crate::sync::lock(&crate::notebook::watched::ONE_AT_A_TIME);
        assert_eq!(current(), None);
        let out = component(Component::Parameter, || {
            assert_eq!(current(), Some(Component::Parameter));
            let r = std::panic::catch_unwind(|| {
                let _g = enter(Component::Gradient);
                assert_eq!(crate::record::component::current(), Some(Component::Gradient));
                panic!("in backward");
            });
            assert!(r.is_err());
            // Another thread sees none of this thread's stamps, and has its own.
            let other = std::thread::spawn(|| (current(), component(Component::Temp, current))).join().unwrap();
            assert_eq!(other, (None, Some(Component::Temp)));
            current()
        });
        assert_eq!(out, Some(Component::Parameter));
        assert_eq!(current(), None);
        assert_eq!(crate::record::component::current(), None);
    }

    #[test]
    fn a_rule_needs_a_pattern_and_bumps_the_generation() {
        let g0 = with_rules(|_, g| g);
        let e = add_rule("", Component::Buffer).unwrap_err().to_string();
        assert!(e.contains("non-empty pattern"), "{e}");
        assert_eq!(with_rules(|_, g| g), g0);
        add_rule("components_test::norm::", Component::Buffer).unwrap();
        assert!(with_rules(|_, g| g) > g0);
        assert_eq!(rules()[0].pattern, "components_test::norm::");
    }
}
