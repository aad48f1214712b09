//! gpumem-kernel as a library: the pieces of the Jupyter kernel, for the binary and the tests.
//!
//! ## Layers
//! Each room uses only those on earlier lines (`tests/layers.rs` checks it, and each room's
//! own list inside it).
//!
//! 1. `session` — what the kernel keeps about a session: the control channel to the crate in
//!    the notebook process, the per-cell records' history, the metrics endpoint.
//! 2. `output` — what the engine emits (a cell's outputs, its error, its build's progress) and
//!    the `Sink` a front end gives it.
//! 3. `build` — the cell crate's build: the build directory, the toolchain, `:dep` lines and
//!    the session's dependencies, the display trait, a build without cargo, line tables, a
//!    build's progress and timings. Runs no cell.
//! 4. `cell` — running a cell and answering the user: evcxr's engine with the magics, hooks,
//!    the live line, the child's streams and errors.
//! 5. `jupyter` — the kernel as Jupyter meets it: the wire protocol and the kernel loop,
//!    `usage_request`, the kernelspec, headless runs.

#![forbid(unsafe_code)]

pub mod session;

pub mod output;

pub mod build;

pub mod cell;

pub mod jupyter;
