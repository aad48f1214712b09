//! The notebook side: what makes the crate work as one per-process state inside evcxr, and the
//! helpers a notebook user calls.
//!
//! Under evcxr every cell links its own copy of this crate, statics included; each room below
//! that must be one per process keeps its state in its own slot of the [`anchor`]
//! (`anchor::per_process!`), and no room reaches into another's state.
//!
//! ## Layers
//! Each file uses only those on earlier lines (`tests/layers.rs` checks it, as it checks the
//! crate's list in `lib.rs`).
//!
//! 1. `anchor`, `protocol`, `children` — one value per name per process, however many copies
//!    of the crate are loaded; the control channel's typed messages, shared with
//!    gpumem-kernel; the notebook's worker processes on the device (NVML, or the simulated
//!    process table), shown beside its own numbers.
//! 2. `registry`, `watched`, `report` — `GPUMEM_NB_DEVICE`, and one allocator per device per
//!    process (selecting and opening devices, nothing more); frameworks with their own books
//!    of device memory (cubecl's pools), read with every cell's numbers and at each component
//!    stamp's ends; the per-cell record and its one-line report, shared by both kernels.
//! 3. `components`, `shims`, `probe` — what memory is: the stamps a thread sets (each a phase of
//!    the watched frameworks) and the rules on stacks; cubecl's own books watched with no call of
//!    the notebook's, through gpumem-kernel's session library, once cubecl holds memory; what
//!    the notebook's variables hold by burn's types, from the session library's probe.
//! 4. `tracking`, `metrics` — every device allocation of the process (CUPTI, or the simulated
//!    driver); the per-cell numbers in the OpenMetrics text format, for Prometheus, and
//!    (feature `metrics`) the endpoint serving them.
//! 5. `gpus` — the CUDA devices the process sees: their UUIDs, and what no tracker sees there
//!    (kernels' stacks, the stream-ordered pool's cache, free memory), read without making a
//!    context.
//! 6. `oom`, `trim` — out-of-memory failures caught as they happen: gpumem-nb's allocator's (a
//!    snapshot then, and why) and any allocation the driver refused; cached memory given back
//!    (`%gpumem trim`).
//! 7. `control` — the child end of gpumem-kernel's control channel (serves its per-cell
//!    readings).
//! 8. `steps` — a cell's record around each step a program marks (a training loop), served by
//!    the metrics endpoint as a cell's is.
//! 9. `stock` — the same reports in the stock evcxr kernel, from hooks in the child
//!    (`set_reports`), each cell a step.
//! 10. `session` — what watches the process: tracking and the control channel from the start
//!     of gpumem-kernel's notebook process, `watch()` (the stock kernel's one call), and what
//!     opening the process's first device starts ([`crate::current`], [`crate::device()`]).
//! 11. `scope`, `mem` — `measure` / `save_memory_snapshot` scopes; the ipyexperiments helpers
//!     (free/used/total, allocate, leave free, preload).

#[allow(unsafe_code)]
pub(crate) mod anchor;
pub mod children;
pub mod protocol;

pub(crate) mod registry;
pub mod report;
pub(crate) mod watched;

pub mod components;
pub(crate) mod probe;
pub(crate) mod shims;

pub mod metrics;
pub mod tracking;

pub(crate) mod gpus;
pub mod oom;
pub(crate) mod trim;

pub mod control;

pub mod steps;

pub(crate) mod stock;

pub(crate) mod session;

pub mod mem;
pub mod scope;
