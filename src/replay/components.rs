//! What a PyTorch program's memory was, by component, from the Python stacks of its snapshot
//! (`_record_memory_history(stacks="python")`): PyTorch's vocabulary (`parameter`, `buffer`,
//! `gradient`, `activation`, `temp`, `optimizer_state`, `other`), the same rules PyTorch's own
//! component stamps follow (pytorch/pytorch #182387), read off each allocation's frames:
//!
//! - anything `torch/optim/` allocates (the state it makes, its step's work) is optimizer state;
//! - a module's `forward` (through `Module._call_impl`) makes activations;
//! - `Module._apply` (`.to()`, `.cuda()`) copies parameters, then their gradients, then buffers,
//!   each from its own line of `_apply`: the lines this snapshot's `_apply` allocated from, in
//!   order, are parameters, (gradients,) buffers (one line: parameters; two: parameters and
//!   buffers; three: all of them); a module's `__init__` or `torch/nn/parameter.py` made on the
//!   device is a parameter;
//! - the backward pass (`torch/autograd/`, and the allocations with no Python frame, which the
//!   autograd engine's threads make) is a gradient where the allocation became one (still live at
//!   the end, or freed by an optimizer's `zero_grad`), a temporary otherwise;
//! - the rest is `other`.
//!
//! gpumem-nb's own snapshots carry each stack's component as a frame of its own
//! (`component parameter`, file `gpumem-nb component`), which is read first.
//!
//! Bytes are the sizes the trace's events carry: what the program asked for (PyTorch's
//! `requested_bytes`, before the allocator's rounding). PyTorch takes cuBLAS's workspaces from its
//! caching allocator, when a forward or backward first needs them, and keeps them: with C++
//! frames in the snapshot (`stacks="all"`) they are `workspace` (a frame of
//! `getCurrentCUDABlasHandle`, `getCUDABlasLtWorkspace` or cuBLAS); with Python frames alone
//! they count under the phase that made them (an activation, or a gradient for the backward
//! thread's), as PyTorch's own thread-local stamp would count them.

use super::input::{DeviceTrace, EventInfo};
use crate::record::component::Component;
use crate::record::history::TraceAction;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One component's bytes (requested) over a trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ComponentBytes {
    /// Live at the trace's end.
    pub end: u64,
    /// Live when all components together were at their peak (the requested peak).
    pub at_peak: u64,
    /// The component's own peak.
    pub peak: u64,
}

/// Live bytes per component, each one's peak, and what they held at the total's peak.
#[derive(Default)]
struct Tally {
    live: BTreeMap<Component, u64>,
    out: BTreeMap<Component, ComponentBytes>,
    total: u64,
    peak: u64,
}

impl Tally {
    fn add(&mut self, c: Component, size: u64) {
        let l = self.live.entry(c).or_default();
        *l += size;
        let o = self.out.entry(c).or_default();
        o.peak = o.peak.max(*l);
        self.total += size;
        if self.total > self.peak {
            self.peak = self.total;
            for (c, b) in self.out.iter_mut() {
                b.at_peak = self.live.get(c).copied().unwrap_or(0);
            }
        }
    }

    fn sub(&mut self, c: Component, size: u64) {
        let l = self.live.entry(c).or_default();
        *l = l.saturating_sub(size);
        self.total = self.total.saturating_sub(size);
    }
}

/// What the frames say before lifetimes are known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Known(Component),
    /// The backward pass: a gradient if it became one, a temporary otherwise.
    Backward,
}

fn is_torch(file: &str, part: &str) -> bool {
    file.replace('\\', "/").contains(&format!("torch/{part}"))
}

/// The line of the innermost `Module._apply` frame, if any.
fn apply_line(info: &EventInfo) -> Option<u32> {
    info.frames.iter().find(|f| f.name == "_apply" && is_torch(&f.filename, "nn/modules/module.py")).map(|f| f.line)
}

fn classify(info: Option<&EventInfo>, apply_roles: &HashMap<u32, Component>, python: bool) -> Class {
    // PyTorch's autograd threads have no Python frame; in a snapshot without Python frames
    // (gpumem-nb's own) no frame says nothing.
    let unknown = if python { Class::Backward } else { Class::Known(Component::Other) };
    let Some(info) = info.filter(|i| !i.frames.is_empty()) else { return unknown };
    let frames = &info.frames;
    // gpumem-nb's own snapshots say it in a frame of their own.
    let said = frames.iter().filter(|f| f.filename == crate::record::component::COMPONENT_FILE);
    if let Some(c) = said.filter_map(|f| f.name.strip_prefix("component ")).find_map(Component::parse) {
        return Class::Known(c);
    }
    let workspace =
        |n: &str| n.contains("getCurrentCUDABlasHandle") || n.contains("BlasLtWorkspace") || n.contains("cublas");
    if frames.iter().any(|f| workspace(&f.name)) {
        return Class::Known(Component::Workspace);
    }
    if frames.iter().any(|f| is_torch(&f.filename, "optim/")) {
        return Class::Known(Component::OptimizerState);
    }
    if frames.iter().any(|f| is_torch(&f.filename, "autograd/")) {
        return Class::Backward;
    }
    if let Some(line) = apply_line(info) {
        return Class::Known(apply_roles.get(&line).copied().unwrap_or(Component::Parameter));
    }
    let in_modules = |f: &crate::record::frames::Frame| is_torch(&f.filename, "nn/modules/");
    if frames.iter().any(|f| in_modules(f) && (f.name == "forward" || f.name == "_call_impl")) {
        return Class::Known(Component::Activation);
    }
    if frames.iter().any(|f| is_torch(&f.filename, "nn/parameter.py") || (in_modules(f) && f.name == "__init__")) {
        return Class::Known(Component::Parameter);
    }
    Class::Known(Component::Other)
}

/// The roles of the lines `Module._apply` allocated from, in source order (see the module docs).
fn apply_roles(trace: &DeviceTrace) -> HashMap<u32, Component> {
    let lines: BTreeSet<u32> = trace
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == TraceAction::Alloc)
        .filter_map(|(i, _)| trace.info_of(i).and_then(apply_line))
        .collect();
    let roles: &[Component] = match lines.len() {
        0 | 1 => &[Component::Parameter],
        2 => &[Component::Parameter, Component::Buffer],
        _ => &[Component::Parameter, Component::Gradient, Component::Buffer],
    };
    lines.into_iter().zip(roles.iter().copied().chain(std::iter::repeat(Component::Buffer))).collect()
}

/// Each component's bytes at the trace's end, at the requested peak (every source together), and
/// at its own peak.
pub fn components(trace: &DeviceTrace) -> BTreeMap<Component, ComponentBytes> {
    let roles = apply_roles(trace);
    let python = trace.info.iter().flatten().any(|i| i.frames.iter().any(|f| f.filename.ends_with(".py")));
    // First pass: what each allocation is (a backward allocation's fate decides).
    let mut class: Vec<Option<Component>> = vec![None; trace.events.len()];
    let mut open: HashMap<u64, (usize, Class)> = HashMap::new();
    for (i, e) in trace.events.iter().enumerate() {
        match e.action {
            TraceAction::Alloc => {
                open.insert(e.addr, (i, classify(trace.info_of(i), &roles, python)));
            }
            TraceAction::FreeRequested => {
                if let Some((at, c)) = open.remove(&e.addr) {
                    let zero_grad = trace.info_of(i).is_some_and(|f| {
                        f.frames.iter().any(|f| f.name == "zero_grad" || is_torch(&f.filename, "optim/"))
                    });
                    class[at] = Some(match c {
                        Class::Known(c) => c,
                        Class::Backward if zero_grad => Component::Gradient,
                        Class::Backward => Component::Temp,
                    });
                }
            }
            _ => {}
        }
    }
    for (at, c) in open.into_values() {
        class[at] = Some(match c {
            Class::Known(c) => c,
            Class::Backward => Component::Gradient,
        });
    }
    // Second pass: bytes, released when the allocator completed the free; the other sources'
    // allocations (a gpumem-nb snapshot's CUDA pool, driver and VMM ones) where they happened,
    // each by the component its stack says (none said: other).
    let mut tally = Tally::default();
    let mut blocks: HashMap<u64, (u64, Component)> = HashMap::new();
    let mut foreign_live: HashMap<(&str, u64), (u64, Component)> = HashMap::new();
    let mut fi = trace.foreign.iter().peekable();
    for (i, c) in class.iter().map(Some).chain([None]).enumerate() {
        while let Some(f) = fi.next_if(|f| f.before <= i) {
            if f.alloc {
                let c = match classify(f.info.as_deref(), &roles, python) {
                    Class::Known(c) => c,
                    Class::Backward => Component::Other,
                };
                foreign_live.insert((f.source, f.addr), (f.size, c));
                tally.add(c, f.size);
            } else if let Some((size, c)) = foreign_live.remove(&(f.source, f.addr)) {
                tally.sub(c, size);
            }
        }
        let (Some(e), Some(c)) = (trace.events.get(i), c) else { break };
        match e.action {
            TraceAction::Alloc => {
                let c = c.unwrap_or(Component::Other);
                blocks.insert(e.addr, (e.size, c));
                tally.add(c, e.size);
            }
            TraceAction::FreeCompleted => {
                if let Some((size, c)) = blocks.remove(&e.addr) {
                    tally.sub(c, size);
                }
            }
            _ => {}
        }
    }
    let Tally { live, mut out, .. } = tally;
    for (c, b) in out.iter_mut() {
        b.end = live.get(c).copied().unwrap_or(0);
    }
    out
}
