//! gpumem-kernel: a Jupyter kernel for Rust (evcxr inside) with a GPU memory report after
//! every cell, `%gpumem` magics, and headless notebook runs.
//!
//! ```text
//! gpumem-kernel install [--user | --prefix DIR] [--no-prebuild]
//! gpumem-kernel --connection-file FILE          (how Jupyter starts it)
//! gpumem-kernel run NOTEBOOK.ipynb [--output OUT.ipynb] [--html OUT.html] [--allow-errors]
//! ```

use gpumem_kernel::cell::build_dir;
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
    // First: the same binary is also evcxr's cargo wrapper (a cell built without cargo), the
    // cell crate's rustc wrapper (line tables), evcxr's child process and evcxr's rustc
    // wrapper. As the child, it answers the kernel's stderr sync requests on a thread of its
    // own (`stderr_sync`).
    gpumem_kernel::cell::quick_build::run_if_asked();
    gpumem_kernel::cell::cell_lines::wrap_if_asked();
    gpumem_kernel::cell::stderr_sync::serve_in_child();
    gpumem_kernel::cell::user_error::watch_in_child();
    evcxr::runtime_hook();
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Where evcxr compiles cells: a directory kept between kernel starts, outside any cargo
    // workspace (see `build_dir`), held for the kernel's whole life. Set before any thread
    // exists.
    let choice = match args.first().map(String::as_str) {
        Some("--connection-file" | "--control_file" | "-f" | "run" | "install") => Some(build_dir::choose()),
        _ => None,
    };
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
        // evcxr runs cargo through this binary (`cell::quick_build`).
        if let Some((key, value)) =
            std::env::current_exe().ok().and_then(|e| gpumem_kernel::cell::quick_build::kernel_env(&e))
        {
            // SAFETY: as above: no other thread exists yet.
            unsafe { std::env::set_var(key, value) };
        }
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
