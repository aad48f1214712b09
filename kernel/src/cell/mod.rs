//! Running a cell: evcxr's `CommandContext` with everything around it. Where and how the cells
//! are compiled (a build directory kept between kernel starts, the toolchain's parts, line
//! tables, `:dep gpumem-nb` resolved to the kernel's own crate, a build's progress), the
//! `%gpumem` magics and `is_complete`, the hooks that read memory before and after a cell, the
//! live line while it runs, and the engine that puts them together.
//!
//! ## Layers
//! 1. `build_dir`, `toolchain`, `cell_times`, `cell_lines`, `dep`, `session_deps`, `compile`,
//!    `magic`, `complete`, `stderr_sync` — where evcxr compiles the cells (outside any cargo
//!    workspace); what the kernel needs from the Rust toolchain; where a cell's time goes (for
//!    the cell benchmark); line tables in the cells' own code; `:dep
//!    gpumem-nb` is the crate the kernel was built with; one copy of every `:dep` crate for the
//!    session; how far a cell's build has come; the
//!    `%gpumem` / `%%gpumem` parser and the table its help comes from; `is_complete`; a barrier
//!    on the evcxr child's stderr (a cell's panic before its report).
//! 2. `user_error` — in the child, the mark that a cell's code returned `Err` (evcxr keeps it
//!    to itself), put on stderr in order for the stream pump.
//! 3. `hooks` — the per-cell readings: NVML and the crate's numbers around a cell.
//! 4. `live` — the live line while a long cell runs.
//! 5. `engine` — evcxr's `CommandContext`, the hooks, magics and reports, shared by the Jupyter
//!    kernel and headless runs.

pub mod build_dir;
pub mod cell_lines;
pub mod cell_times;
pub mod compile;
pub mod complete;
pub mod dep;
pub mod magic;
pub mod session_deps;
pub mod stderr_sync;
pub mod toolchain;
pub mod user_error;

pub mod hooks;

pub mod live;

pub mod engine;
