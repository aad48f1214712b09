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
//!   autograd engine's threads make; with C++ frames, those under `torch::autograd::Engine`) is a
//!   gradient where the allocation became one (still live at the end, or freed by an optimizer's
//!   `zero_grad`), a temporary otherwise;
//! - the rest is `other`.
//!
//! gpumem-nb's own snapshots carry each stack's component as a frame of its own
//! (`component parameter`, file `gpumem-nb component`), which is read first.
//!
//! Bytes are the sizes the trace's events carry: what the program asked for (PyTorch's
//! `requested_bytes`, before the allocator's rounding). PyTorch takes cuBLAS's workspaces from its
//! caching allocator, when a forward or backward first needs them, and keeps them: with C++
//! frames in the snapshot (`stacks="all"`) they are `workspace` (a frame of
//! `getCurrentCUDABlasHandle`, `getCUDABlasLtWorkspace` or cuBLAS: on an H200 a handle's 32 MiB
//! for each thread that multiplies, the forward's and the autograd engine's, and cuBLASLt's
//! 1 MiB, all that `torch._C._cuda_clearCublasWorkspaces()` gives back); with Python frames alone
//! they count under the phase that made them (an activation, or a gradient for the backward
//! thread's), as PyTorch's own thread-local stamp would count them.

use super::input::{DeviceTrace, EventInfo, Ordered};
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
    /// Allocations made before the recording began (its prologue), still live, and at the peak.
    before: u64,
    before_at_peak: u64,
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
            self.before_at_peak = self.before;
            for (c, b) in self.out.iter_mut() {
                b.at_peak = self.live.get(c).copied().unwrap_or(0);
            }
        }
    }

    fn sub(&mut self, c: Option<Component>, size: u64) {
        match c {
            Some(c) => {
                let l = self.live.entry(c).or_default();
                *l = l.saturating_sub(size);
            }
            None => self.before = self.before.saturating_sub(size),
        }
        self.total = self.total.saturating_sub(size);
    }
}

/// What a recording's memory was by component ([`components`]), and what was live at its peak
/// of the allocations made before the recording began (its prologue: they are no component).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeakParts {
    /// Per component.
    pub components: BTreeMap<Component, ComponentBytes>,
    /// Bytes made before the recording began, live at the peak of everything together.
    pub before_recording_at_peak: u64,
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
    // The backward pass: from Python, or on the autograd engine's threads (their C++ frames).
    if frames.iter().any(|f| is_torch(&f.filename, "autograd/") || f.name.starts_with("torch::autograd::Engine::")) {
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

/// One step of the merged timeline: the allocator's events and the other sources', in order.
struct Step<'a> {
    kind: StepKind,
    /// The source and the address.
    key: (&'a str, u64),
    size: u64,
    info: Option<&'a EventInfo>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum StepKind {
    Alloc,
    /// A free asked for (the allocator's `free_requested`): what classifies.
    Request,
    /// A free done (the allocator's `free_completed`): what releases the bytes.
    Release,
    /// Another source's free: both.
    Free,
}

/// The allocator's events and the other sources' allocations (a gpumem-nb snapshot's CUDA pool,
/// driver and VMM ones) in the order they happened.
fn timeline(trace: &DeviceTrace) -> Vec<Step<'_>> {
    trace
        .in_order()
        .filter_map(|step| match step {
            Ordered::Foreign(f) => {
                let kind = if f.alloc { StepKind::Alloc } else { StepKind::Free };
                Some(Step { kind, key: (f.source, f.addr), size: f.size, info: f.info.as_deref() })
            }
            Ordered::Event(i, e) => {
                let kind = match e.action {
                    TraceAction::Alloc => StepKind::Alloc,
                    TraceAction::FreeRequested => StepKind::Request,
                    TraceAction::FreeCompleted => StepKind::Release,
                    _ => return None,
                };
                Some(Step { kind, key: ("allocator", e.addr), size: e.size, info: trace.info_of(i) })
            }
        })
        .collect()
}

/// Each component's bytes at the trace's end, at the requested peak (every source together), and
/// at its own peak.
///
/// In gpumem-nb's own snapshots (no Python frames) a backward pass's, an optimizer step's and a
/// parameter initializer's allocations are their component only when they outlive their run, as
/// the notebook's per-cell reports count them: one released before the run ends (the next
/// allocation of another component; workspaces, `other` and `temp` do not end it) is `temp`.
pub fn components(trace: &DeviceTrace) -> BTreeMap<Component, ComponentBytes> {
    peak_parts(trace).components
}

/// [`components`], with the allocations made before the recording began counted in the peak
/// (live from the start until the recording frees them) and said apart.
pub fn peak_parts(trace: &DeviceTrace) -> PeakParts {
    let roles = apply_roles(trace);
    let python = trace.info.iter().flatten().any(|i| i.frames.iter().any(|f| f.filename.ends_with(".py")));
    let steps = timeline(trace);
    // First pass: what each allocation is (a backward or optimizer allocation's fate decides).
    let mut class: Vec<Option<Component>> = vec![None; steps.len()];
    let mut open: HashMap<(&str, u64), (usize, Class)> = HashMap::new();
    // The run of backward, optimizer or parameter allocations going on (gpumem-nb's snapshots), and the
    // allocations it made that are still live.
    let mut run: Option<Component> = None;
    let mut in_run: std::collections::HashSet<(&str, u64)> = std::collections::HashSet::new();
    let runs = |c: Component| !python && c.has_runs();
    for (i, st) in steps.iter().enumerate() {
        match st.kind {
            StepKind::Alloc => {
                let c = classify(st.info, &roles, python);
                if let Class::Known(k) = c {
                    // As the per-cell reports count them (`Component::beside_runs`).
                    if !k.beside_runs() && run.is_some_and(|r| r != k) {
                        run = None;
                        in_run.clear();
                    }
                    if runs(k) {
                        run = Some(k);
                        in_run.insert(st.key);
                    }
                }
                open.insert(st.key, (i, c));
            }
            StepKind::Request | StepKind::Free => {
                let Some((at, c)) = open.remove(&st.key) else { continue };
                let zero_grad = |info: Option<&EventInfo>| {
                    info.is_some_and(|f| {
                        f.frames.iter().any(|f| f.name == "zero_grad" || is_torch(&f.filename, "optim/"))
                    })
                };
                class[at] = Some(match c {
                    Class::Known(k) if runs(k) && in_run.contains(&st.key) => Component::Temp,
                    Class::Known(c) => c,
                    Class::Backward if zero_grad(st.info) => Component::Gradient,
                    Class::Backward => Component::Temp,
                });
                in_run.remove(&st.key);
            }
            StepKind::Release => {}
        }
    }
    for (at, c) in open.into_values() {
        class[at] = Some(match c {
            Class::Known(c) => c,
            Class::Backward => Component::Gradient,
        });
    }
    // Second pass: bytes, released when the allocator completed the free.
    let mut tally = Tally::default();
    let mut live: HashMap<(&str, u64), (u64, Option<Component>)> = HashMap::new();
    for p in &trace.prologue {
        live.insert(("allocator", p.addr), (p.size, None));
        tally.before += p.size;
        tally.total += p.size;
    }
    tally.peak = tally.total;
    tally.before_at_peak = tally.before;
    for (st, c) in steps.iter().zip(&class) {
        match st.kind {
            StepKind::Alloc => {
                let c = c.unwrap_or(Component::Other);
                live.insert(st.key, (st.size, Some(c)));
                tally.add(c, st.size);
            }
            StepKind::Release | StepKind::Free => {
                if let Some((size, c)) = live.remove(&st.key) {
                    tally.sub(c, size);
                }
            }
            StepKind::Request => {}
        }
    }
    let Tally { live, mut out, before_at_peak, .. } = tally;
    for (c, b) in out.iter_mut() {
        b.end = live.get(c).copied().unwrap_or(0);
    }
    PeakParts { components: out, before_recording_at_peak: before_at_peak }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StreamId;
    use crate::record::frames::Frame;
    use crate::replay::TraceLine;
    use crate::replay::input::Foreign;
    use std::sync::Arc;

    fn said(c: Option<Component>) -> Option<Arc<EventInfo>> {
        let mut frames = vec![Frame { name: "step".into(), filename: "cell 3".into(), line: 2 }];
        if let Some(c) = c {
            frames.push(Frame {
                name: format!("component {}", c.key()),
                filename: crate::record::component::COMPONENT_FILE.into(),
                line: 0,
            });
        }
        Some(Arc::new(EventInfo { label: "cell 3".into(), frames }))
    }

    /// A gpumem-nb snapshot: a backward run's allocations released before the run ends are
    /// `temp`, those that outlive it `gradient`, and the same for an optimizer step and a
    /// parameter initializer; a workspace
    /// in the middle does not end a run; tracked (driver) allocations count beside the
    /// allocator's blocks.
    #[test]
    fn backward_and_optimizer_runs_keep_their_component_only_for_what_outlives_them() {
        use Component::*;
        let mib = 1u64 << 20;
        let mut trace = DeviceTrace::default();
        let ev = |trace: &mut DeviceTrace, action, addr, size, c: Option<Component>| {
            trace.events.push(TraceLine {
                line: trace.events.len(),
                action,
                addr,
                size,
                stream: StreamId::DEFAULT,
                time_us: 0,
            });
            trace.info.push(said(c));
        };
        let alloc = TraceAction::Alloc;
        let (req, done) = (TraceAction::FreeRequested, TraceAction::FreeCompleted);
        // A parameter initializer: the parameter (1) and a tensor it scaled into it (8); a
        // stamped temporary (9) in between neither continues nor ends its run.
        ev(&mut trace, alloc, 8, mib, Some(Parameter));
        ev(&mut trace, alloc, 9, mib, Some(Temp));
        ev(&mut trace, alloc, 1, 10 * mib, Some(Parameter));
        ev(&mut trace, req, 8, mib, Some(Parameter));
        ev(&mut trace, done, 8, mib, Some(Parameter));
        ev(&mut trace, req, 9, mib, Some(Temp));
        ev(&mut trace, done, 9, mib, Some(Temp));
        // Backward: a temporary (2), a workspace (3) that does not end the run, a gradient (4).
        ev(&mut trace, alloc, 2, 8 * mib, Some(Gradient));
        ev(&mut trace, alloc, 3, mib, Some(Workspace));
        ev(&mut trace, req, 2, 8 * mib, Some(Gradient));
        ev(&mut trace, done, 2, 8 * mib, Some(Gradient));
        ev(&mut trace, alloc, 4, 10 * mib, Some(Gradient));
        // The step: state that stays (5), a temporary (6); the run ended the backward's.
        ev(&mut trace, alloc, 5, 20 * mib, Some(OptimizerState));
        ev(&mut trace, alloc, 6, 4 * mib, Some(OptimizerState));
        ev(&mut trace, req, 6, 4 * mib, Some(OptimizerState));
        ev(&mut trace, done, 6, 4 * mib, Some(OptimizerState));
        // The gradient freed after its run: still a gradient.
        ev(&mut trace, alloc, 7, mib, Some(Activation));
        ev(&mut trace, req, 4, 10 * mib, Some(Gradient));
        ev(&mut trace, done, 4, 10 * mib, Some(Gradient));
        // A driver allocation of a stamped activation, after the initializer's run (events 0 to
        // 6) and before the backward's.
        trace.foreign.push(Foreign {
            before: 7,
            alloc: true,
            addr: 100,
            size: 6 * mib,
            source: "driver",
            info: said(Some(Activation)),
            event: 0,
        });
        let c = components(&trace);
        let get = |k: Component| c.get(&k).copied().unwrap_or_default();
        assert_eq!(get(Temp).peak, 8 * mib, "{c:?}");
        assert_eq!(get(Parameter).peak, 10 * mib, "the initializer's own tensor is temp: {c:?}");
        assert_eq!((get(Gradient).peak, get(Gradient).end), (10 * mib, 0), "{c:?}");
        assert_eq!((get(OptimizerState).peak, get(Temp).end), (20 * mib, 0), "{c:?}");
        assert_eq!(get(Activation).end, 7 * mib, "the driver's 6 and the block's 1: {c:?}");
        // The peak: parameter, workspace, gradient, the state and its temporary, the activation.
        let at_peak: u64 = c.values().map(|b| b.at_peak).sum();
        assert_eq!(at_peak, (10 + 6 + 1 + 10 + 20 + 4) * mib, "{c:?}");
        assert_eq!(get(Temp).at_peak, 4 * mib, "the step's temporary is live at the peak: {c:?}");
    }
}
