//! Line tables in the cells' own code, and nowhere else.
//!
//! evcxr builds every cell as the crate `ctx` with `debug = false` and `strip = "debuginfo"`, so
//! by the time a report names a site, nothing says which line of the cell made it. The kernel
//! makes cargo run the cells' rustc through this same binary (`RUSTC_WORKSPACE_WRAPPER`, which
//! cargo applies to the workspace's own packages only: the cell crate, never a dependency),
//! and the wrapper adds `-C debuginfo=line-tables-only -C strip=none` to that one compilation.
//!
//! So the dependencies (gpumem-nb, candle, cudarc, …) are built exactly as evcxr builds them:
//! `gpumem-kernel install`'s prebuild, a first `:dep`, `GPUMEM_NB_CELL_LINES=off` and the stock
//! kernel all share one build of them (cargo's fingerprints of the dependencies do not change),
//! and a cell library carries line tables only for its own code and what was inlined into it,
//! so a report reads them quickly. `GPUMEM_NB_CELL_LINES=off` leaves cells as evcxr builds them
//! (sites then name functions and cells, no lines).

use std::ffi::OsString;

/// `GPUMEM_NB_CELL_LINES=off` builds cells without line tables.
pub const CELL_LINES_VAR: &str = "GPUMEM_NB_CELL_LINES";

/// Set (to 1) in cargo's environment when this binary is the cells' rustc wrapper.
pub const WRAP_VAR: &str = "GPUMEM_KERNEL_CELL_RUSTC";

/// What the wrapper adds to the cell crate's rustc command (the last `-C` of a kind wins over
/// the profile's).
pub const FLAGS: [&str; 4] = ["-C", "debuginfo=line-tables-only", "-C", "strip=none"];

/// Whether cells are built with line tables (unless `GPUMEM_NB_CELL_LINES=off`).
pub fn enabled() -> bool {
    !std::env::var(CELL_LINES_VAR).is_ok_and(|v| v.trim().eq_ignore_ascii_case("off"))
}

/// The build environment that makes this binary (`exe`) the cell crate's rustc wrapper.
pub fn build_envs(exe: &std::path::Path) -> [(String, String); 2] {
    [
        ("RUSTC_WORKSPACE_WRAPPER".to_string(), exe.to_string_lossy().into_owned()),
        (WRAP_VAR.to_string(), "1".to_string()),
    ]
}

/// The rustc command to run when this process was started as the cell crate's rustc wrapper
/// (`gpumem-kernel RUSTC ARGS…` with [`WRAP_VAR`] set): `RUSTC ARGS… FLAGS` for the cell crate,
/// `RUSTC ARGS…` for another crate of the workspace. `None` otherwise,
/// also when the first argument is this binary itself (evcxr's own rustc wrapper, which is this
/// binary too, runs first and then calls this one: `evcxr::runtime_hook` handles that step).
pub fn wrapped_command(args: &[OsString], exe: Option<&std::path::Path>) -> Option<(OsString, Vec<OsString>)> {
    let (rustc, rest) = args.split_first()?;
    let same = |a: &std::path::Path, b: &std::path::Path| {
        a == b || a.canonicalize().ok().zip(b.canonicalize().ok()).is_some_and(|(a, b)| a == b)
    };
    if exe.is_some_and(|exe| same(std::path::Path::new(rustc), exe)) {
        return None;
    }
    let mut all: Vec<OsString> = rest.to_vec();
    // Only the cell crate: a path dependency cargo counts as a workspace member (the session's
    // generated dependency crate, a crate beside the notebook) is built as it would be anyway.
    if is_cell_crate(rest) {
        all.extend(FLAGS.iter().map(OsString::from));
        all.extend([OsString::from("-C"), OsString::from(format!("opt-level={}", cell_opt_level()))]);
    }
    Some((rustc.clone(), all))
}

/// The cells' own optimisation level, from [`CELL_OPT_VAR`] in the build's environment (the
/// dependencies stay at evcxr's `opt-level = 2`).
pub const CELL_OPT_VAR: &str = "GPUMEM_KERNEL_CELL_OPT";

/// The cells' own code unoptimised unless asked otherwise: a cell compiles in about half the
/// time (a burn training cell several times quicker), and the work it calls runs in the
/// optimised dependencies (BENCHMARKS.md, "Small cells").
const DEFAULT_CELL_OPT: &str = "0";

/// The cell crate's opt-level: the one asked for when rustc knows it, else [`DEFAULT_CELL_OPT`].
fn cell_opt_level() -> String {
    let asked = std::env::var(CELL_OPT_VAR).ok();
    let v = asked.as_deref().map(str::trim).filter(|v| matches!(*v, "0" | "1" | "2" | "3" | "s" | "z"));
    v.unwrap_or(DEFAULT_CELL_OPT).to_string()
}

/// Whether rustc's `args` build the cell crate.
fn is_cell_crate(args: &[OsString]) -> bool {
    args.windows(2).any(|w| w[0] == "--crate-name" && w[1] == super::build_dir::CELL_CRATE)
}

/// Runs the wrapped rustc in place of this process when this process is the cells' rustc
/// wrapper (see [`wrapped_command`]); returns otherwise. Call first thing in `main`.
pub fn wrap_if_asked() {
    if std::env::var_os(WRAP_VAR).is_none() {
        return;
    }
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let exe = std::env::current_exe().ok();
    let Some((rustc, args)) = wrapped_command(&args, exe.as_deref()) else { return };
    let cell = is_cell_crate(&args);
    if cell {
        // As cargo gave it (the flags above are added again on a build without cargo).
        let given: Vec<OsString> = std::env::args_os().skip(2).collect();
        super::quick_build::record_if_asked(&rustc, &given);
    }
    if let Some(exe) = exe.as_deref().filter(|_| cell && super::timings::enabled()) {
        super::timings::run_rustc(&rustc, args, exe, WRAP_VAR);
    }
    let mut cmd = std::process::Command::new(&rustc);
    cmd.args(&args).env_remove(WRAP_VAR);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let e = cmd.exec();
        eprintln!("gpumem-kernel: cannot run {}: {e}", rustc.to_string_lossy());
        std::process::exit(1);
    }
    #[cfg(not(unix))]
    match cmd.status() {
        Ok(s) => std::process::exit(s.code().unwrap_or(1)),
        Err(e) => {
            eprintln!("gpumem-kernel: cannot run {}: {e}", rustc.to_string_lossy());
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cell_crates_rustc_gets_line_tables_and_evcxrs_wrapper_is_left_alone() {
        let exe = std::path::Path::new("/opt/k/gpumem-kernel");
        let args: Vec<OsString> = ["/t/bin/rustc", "--crate-name", "ctx", "src/lib.rs", "-C", "strip=debuginfo"]
            .iter()
            .map(OsString::from)
            .collect();
        let (rustc, rest) = wrapped_command(&args, Some(exe)).unwrap();
        assert_eq!(rustc, "/t/bin/rustc");
        let rest: Vec<&str> = rest.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(rest[..5], ["--crate-name", "ctx", "src/lib.rs", "-C", "strip=debuginfo"]);
        assert_eq!(rest[5..9], FLAGS, "after the profile's flags, so they win");
        if std::env::var_os(CELL_OPT_VAR).is_none() {
            assert_eq!(rest[9..], ["-C", "opt-level=0"], "the cells' own code unoptimised by default");
        }
        // Another crate of the workspace: run as it is.
        let other: Vec<OsString> =
            ["/t/bin/rustc", "--crate-name", "gpumem_deps_1", "lib.rs"].iter().map(OsString::from).collect();
        assert_eq!(wrapped_command(&other, Some(exe)), Some(("/t/bin/rustc".into(), other[1..].to_vec())));
        // evcxr's wrapper calling this binary: not ours to run.
        let chained: Vec<OsString> = ["/opt/k/gpumem-kernel", "/t/bin/rustc"].iter().map(OsString::from).collect();
        assert_eq!(wrapped_command(&chained, Some(exe)), None);
        assert_eq!(wrapped_command(&[], Some(exe)), None);
        let envs = build_envs(exe);
        assert_eq!(envs[0], ("RUSTC_WORKSPACE_WRAPPER".into(), "/opt/k/gpumem-kernel".into()));
    }
}
