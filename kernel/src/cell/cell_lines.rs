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
/// (`gpumem-kernel RUSTC ARGS…` with [`WRAP_VAR`] set): `RUSTC ARGS… FLAGS`. `None` otherwise,
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
    all.extend(FLAGS.iter().map(OsString::from));
    Some((rustc.clone(), all))
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
        assert_eq!(rest[5..], FLAGS, "after the profile's flags, so they win");
        // evcxr's wrapper calling this binary: not ours to run.
        let chained: Vec<OsString> = ["/opt/k/gpumem-kernel", "/t/bin/rustc"].iter().map(OsString::from).collect();
        assert_eq!(wrapped_command(&chained, Some(exe)), None);
        assert_eq!(wrapped_command(&[], Some(exe)), None);
        let envs = build_envs(exe);
        assert_eq!(envs[0], ("RUSTC_WORKSPACE_WRAPPER".into(), "/opt/k/gpumem-kernel".into()));
    }
}
