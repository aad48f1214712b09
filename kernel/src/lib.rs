//! gpumem-kernel as a library: the pieces of the Jupyter kernel, for the binary and the tests.
//!
//! ## Layers
//! Each room uses only those on earlier lines (`tests/layers.rs` checks it, and each room's
//! own list inside it).
//!
//! 1. `session` — what the kernel keeps about a session: the control channel to the crate in
//!    the notebook process, NVML, the per-cell records and their history, the metrics endpoint.
//! 2. `output` — what the engine emits (a cell's outputs, its error, its build's progress) and
//!    the `Sink` a front end gives it.
//! 3. `cell` — running a cell: evcxr with the build directory, magics, hooks, the live line and
//!    the engine.
//! 4. `jupyter` — the kernel as Jupyter meets it: the wire protocol and the kernel loop,
//!    `usage_request`, the kernelspec, headless runs.

#![forbid(unsafe_code)]

pub mod session;

pub mod output;

pub mod cell;

pub mod jupyter;
