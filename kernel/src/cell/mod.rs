//! Running a cell and answering the user: evcxr's `CommandContext` with everything around it.
//! The `%gpumem` magics and `is_complete`, the barrier and the marks on the child's stderr, the
//! hooks that read memory before and after a cell, the live line while it runs, and the engine
//! that puts them together with the cell crate's build (`crate::build`).
//!
//! ## Layers
//! 1. `magic`, `complete`, `stderr_sync` — the `%gpumem` / `%%gpumem` parser and the table its
//!    help comes from; `is_complete`; a barrier on the evcxr child's stderr (a cell's panic
//!    before its report).
//! 2. `user_error` — in the child, the mark that a cell's code returned `Err` (evcxr keeps it
//!    to itself), put on stderr in order for the stream pump.
//! 3. `hooks` — the per-cell readings: NVML and the crate's numbers around a cell.
//! 4. `live` — the live line while a long cell runs.
//! 5. `engine` — evcxr's `CommandContext`, the hooks, magics and reports, shared by the Jupyter
//!    kernel and headless runs.

pub mod complete;
pub mod magic;
pub mod stderr_sync;

pub mod user_error;

pub mod hooks;

pub mod live;

pub mod engine;
