//! gpumem-kernel: a Jupyter kernel for Rust (evcxr inside) with a GPU memory report after
//! every cell, `%gpumem` magics, and headless notebook runs.
//!
//! ```text
//! gpumem-kernel install [--user | --prefix DIR] [--no-prebuild]
//! gpumem-kernel --connection-file FILE          (how Jupyter starts it)
//! gpumem-kernel run NOTEBOOK.ipynb [--output OUT.ipynb] [--html OUT.html] [--allow-errors]
//! ```
//!
//! One binary, six roles. A person or Jupyter starts it as the kernel; the kernel and its
//! cells' build start it again, each role told by its environment. `main` asks each role in
//! turn, in this order, and a role that is not asked returns at once:
//!
//! 1. evcxr's cargo wrapper (`EVCXR_CARGO_WRAPPER`): a cell built without cargo when only the
//!    cell changed (`build::quick_build`);
//! 2. the cell crate's timed linker (`GPUMEM_KERNEL_LINK_VIA`, the cell benchmark only:
//!    `build::timings`);
//! 3. the cell crate's rustc wrapper (`GPUMEM_KERNEL_CELL_RUSTC`): line tables in the cells'
//!    own code, the command kept for a build without cargo (`build::cell_lines`);
//! 4. evcxr's child, the notebook process that loads and runs the cells (`EVCXR_IS_RUNTIME`,
//!    in `evcxr::runtime_hook`), after gpumem-nb starts watching it (every device allocation
//!    tracked and the kernel's readings served from before the first cell:
//!    `gpumem_nb::kernel::watch_from_start`) and two threads of the kernel's are set up in it:
//!    the stderr barrier (`cell::stderr_sync`) and the mark of a returned `Err`
//!    (`cell::user_error`);
//! 5. evcxr's own rustc wrapper, its build cache (`EVCXR_RUSTC_WRAPPER`, in
//!    `evcxr::runtime_hook`);
//! 6. the kernel: Jupyter's (`--connection-file`), or a command (`install`, `run`, `--help`,
//!    `--version`).

use gpumem_kernel::build::{build_dir, toolchain};
use gpumem_kernel::jupyter::{install, kernel, run};
use std::path::PathBuf;

const HELP: &str = "\
gpumem-kernel — a Jupyter kernel for Rust (evcxr) with a GPU memory report after every cell

USAGE:
    gpumem-kernel install [--user | --prefix DIR] [--no-prebuild]
        Write the kernelspec `gpumem` (display name \"Rust (gpumem)\"): with --user (the default)
        into the user's Jupyter data dir, with --prefix into DIR/share/jupyter/kernels/gpumem.
        Then build gpumem-nb and its dependencies where the kernel compiles cells
        (~/.cache/gpumem-kernel/evcxr), so a new session's first `:dep gpumem-nb` starts warm.
    gpumem-kernel --connection-file FILE
        Run as a Jupyter kernel (this is how Jupyter starts it).
    gpumem-kernel run NOTEBOOK.ipynb [--output OUT.ipynb] [--html OUT.html] [--allow-errors]
        Execute a notebook headlessly (working directory: the notebook's) and write the executed
        notebook and/or a standalone HTML page. Exit status 1 when a cell fails that is not
        tagged `raises-exception`. Without --output/--html: NOTEBOOK.executed.ipynb.
    gpumem-kernel --help | --version

In a notebook, `%gpumem help` lists the magics. GPUMEM_NB_DEVICE=auto|cuda|sim|sim:SIZE chooses
the device of the gpumem-nb crate (without a GPU: a simulated 80 GiB device).
";

fn main() {
    // Roles 1 to 5 (the module's documentation), each returning at once when not asked. As the
    // child (role 4), the stderr barrier and the `Err` mark start before evcxr's runtime takes
    // the main thread.
    gpumem_kernel::build::quick_build::run_if_asked();
    gpumem_kernel::build::timings::link_if_asked();
    gpumem_kernel::build::cell_lines::wrap_if_asked();
    // As the child: every device allocation of the notebook's process is tracked, and the
    // kernel's readings served, from before its first cell (no device opened, no CUDA context
    // made), before any thread of the kernel's is started there.
    gpumem_nb::kernel::watch_from_start();
    gpumem_kernel::cell::stderr_sync::serve_in_child();
    gpumem_kernel::cell::user_error::watch_in_child();
    evcxr::runtime_hook();
    // Role 6: the kernel.
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Where evcxr compiles cells: a directory kept between kernel starts, outside any cargo
    // workspace (see `build_dir`), held for the kernel's whole life. Set before any thread
    // exists.
    let kernel_role = matches!(
        args.first().map(String::as_str),
        Some("--connection-file" | "--control_file" | "-f" | "run" | "install")
    );
    if kernel_role {
        one_malloc_arena();
    }
    let choice = kernel_role.then(build_dir::choose);
    let _build_dir = choice.and_then(|c| {
        if let Some(notice) = &c.notice {
            eprintln!("gpumem-kernel: {notice}");
        }
        build_dir::keep_notice(c.notice);
        c.dir
    });
    if let Some(dir) = &_build_dir {
        // SAFETY: `set_var` races with concurrent readers of the environment; this is the
        // first thing `main` does after `runtime_hook` (which returns only in the kernel
        // process and starts no thread), so no other thread exists yet.
        unsafe { std::env::set_var("EVCXR_TMPDIR", &dir.path) };
        // evcxr runs cargo through this binary (`build::quick_build`).
        if let Some((key, value)) =
            std::env::current_exe().ok().and_then(|e| gpumem_kernel::build::quick_build::kernel_env(&e))
        {
            // SAFETY: as above: no other thread exists yet.
            unsafe { std::env::set_var(key, value) };
        }
    }
    // cargo and rustc, which compile every cell: on PATH, else in rustup's directory (put on
    // PATH then); the first cell says which, or what to install.
    if kernel_role {
        let found = toolchain::find();
        if let toolchain::Found::InRustup(bin) = &found {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let dirs = std::iter::once(bin.clone()).chain(std::env::split_paths(&path));
            if let Ok(joined) = std::env::join_paths(dirs) {
                // SAFETY: as above: no other thread exists yet.
                unsafe { std::env::set_var("PATH", joined) };
            }
        }
        toolchain::keep_notice(toolchain::found_notice(&found));
    }
    let code = match real_main(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpumem-kernel: {e:#}");
            2
        }
    };
    // `exit` runs no destructors: a private build directory goes now.
    drop(_build_dir);
    std::process::exit(code);
}

/// The kernel's heap in one glibc arena, not one per thread that allocates: type inference
/// builds its databases on several threads, and each thread's arena kept its own free pages
/// beside the others' live ones. After `:dep gpumem-nb` and a cell the kernel process held
/// 390-392 MiB with the default arenas and 376 MiB with one, its highest 438 against 395 MiB,
/// its cells no slower (BENCHMARKS.md, "The kernel's own memory"). The notebook process (role 4)
/// keeps glibc's default: the frameworks' threads allocate there.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers and changes how later allocations are placed; called
    // before the kernel starts any thread (as the `set_var`s below), so no allocation races it.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn real_main(args: &[String]) -> anyhow::Result<i32> {
    let first = args.first().map(String::as_str);
    // `install --help`, `run -h`: the help, not an error.
    if matches!(first, Some("install" | "run")) && args[1..].iter().any(|a| a == "--help" || a == "-h") {
        print!("{HELP}");
        return Ok(0);
    }
    match first {
        None | Some("-h" | "--help" | "help") => {
            print!("{HELP}");
            Ok(if first.is_none() { 2 } else { 0 })
        }
        Some("-V" | "--version") => {
            println!("gpumem-kernel {}", env!("CARGO_PKG_VERSION"));
            Ok(0)
        }
        Some("install") => {
            let mut rest: Vec<&str> = args[1..].iter().map(String::as_str).collect();
            let no_prebuild = rest.contains(&"--no-prebuild");
            rest.retain(|a| *a != "--no-prebuild");
            let target = match rest.as_slice() {
                [] | ["--user"] => install::Target::User,
                ["--prefix", dir] => install::Target::Prefix(PathBuf::from(dir)),
                other => anyhow::bail!("install: unexpected arguments {other:?}\n\n{HELP}"),
            };
            let dir = install::install(&target)?;
            println!("Installed kernelspec {} in {}", install::KERNEL_NAME, dir.display());
            if !no_prebuild {
                let cells = std::env::var_os("EVCXR_TMPDIR").map(PathBuf::from).unwrap_or_default();
                println!(
                    "Building gpumem-nb for notebook cells in {} (once: a new session's first `:dep gpumem-nb` then starts warm)…",
                    cells.display()
                );
                let took = run::prebuild()?;
                println!("Built in {:.0} s.", took.as_secs_f64());
            }
            Ok(0)
        }
        Some("--connection-file" | "--control_file" | "-f") => {
            let file = args.get(1).ok_or_else(|| anyhow::anyhow!("--connection-file needs a file"))?;
            kernel::run(std::path::Path::new(file))?;
            Ok(0)
        }
        Some("run") => {
            let mut opts = run::RunOptions::default();
            let mut it = args[1..].iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--output" | "-o" => {
                        opts.output =
                            Some(PathBuf::from(it.next().ok_or_else(|| anyhow::anyhow!("--output needs a file"))?))
                    }
                    "--html" => {
                        opts.html =
                            Some(PathBuf::from(it.next().ok_or_else(|| anyhow::anyhow!("--html needs a file"))?))
                    }
                    "--allow-errors" => opts.allow_errors = true,
                    s if s.starts_with('-') => anyhow::bail!("run: unknown option {s}\n\n{HELP}"),
                    s if opts.notebook.as_os_str().is_empty() => opts.notebook = PathBuf::from(s),
                    s => anyhow::bail!("run: unexpected argument {s}"),
                }
            }
            if opts.notebook.as_os_str().is_empty() {
                anyhow::bail!("run: which notebook?\n\n{HELP}");
            }
            run::run(&opts)
        }
        Some(other) => anyhow::bail!("unknown command {other:?}\n\n{HELP}"),
    }
}
