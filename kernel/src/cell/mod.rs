//! Running a cell: evcxr's `CommandContext` with everything around it. Where and how the cells
//! are compiled (a build directory kept between kernel starts, the toolchain's parts, line
//! tables, `:dep gpumem-nb` resolved to the kernel's own crate, a build's progress), the
//! `%gpumem` magics and `is_complete`, the hooks that read memory before and after a cell, the
//! live line while it runs, and the engine that puts them together.
//!
//! ## Layers
//! 1. `build_dir`, `toolchain`, `cell_times`, `dep`, `display`, `compile`, `magic`,
//!    `complete`, `stderr_sync` — where evcxr compiles the cells (outside any cargo workspace);
//!    what the kernel needs from the Rust toolchain; where a cell's time goes (for the cell
//!    benchmark); a cell's value shown in one compile; `:dep gpumem-nb` is the crate the kernel
//!    was built with; how far a cell's build has come; the `%gpumem` / `%%gpumem` parser and the
//!    table its help comes from; `is_complete`; a barrier on the evcxr child's stderr (a cell's
//!    panic before its report).
//! 2. `quick_build` — a cell built without cargo when only the cell changed (evcxr's cargo
//!    wrapper).
//! 3. `cell_lines`, `session_deps` — line tables in the cells' own code (the cell crate's rustc,
//!    timed when asked, its command kept for a build without cargo); one copy of every `:dep`
//!    crate for the session, beside the build directory.
//! 4. `user_error` — in the child, the mark that a cell's code returned `Err` (evcxr keeps it
//!    to itself), put on stderr in order for the stream pump.
//! 5. `hooks` — the per-cell readings: NVML and the crate's numbers around a cell.
//! 6. `live` — the live line while a long cell runs.
//! 7. `engine` — evcxr's `CommandContext`, the hooks, magics and reports, shared by the Jupyter
//!    kernel and headless runs.

pub mod build_dir;
pub mod cell_times;
pub mod compile;
pub mod complete;
pub mod dep;
pub mod display;
pub mod magic;
pub mod stderr_sync;
pub mod toolchain;

pub mod quick_build;

pub mod cell_lines;
pub mod session_deps;

pub mod user_error;

pub mod hooks;

pub mod live;

pub mod engine;
