//! Where a cell's time goes, for the cell benchmark (`scripts/cell_bench.sh`).
//!
//! With `GPUMEM_KERNEL_CELL_TIMES=FILE` set, the kernel appends one JSON line per step to FILE:
//! the cell crate's rustc run and, inside it, the link (this binary stands in for the linker of
//! that one crate and times it), and per cell what ran before its code (the session-dependency
//! load, the display trait), evcxr's phases
//! (`Final compile`: type inference and cargo; `Execution`: loading the cell's library and
//! running it) and the kernel's own hooks. Unset, nothing is timed or written: the cells are
//! built exactly as without it.

use std::ffi::OsString;
use std::io::Write;
use std::time::Instant;

/// The file the timings go to.
pub const VAR: &str = "GPUMEM_KERNEL_CELL_TIMES";

/// Set on the cell crate's rustc when this binary is its linker: the linker it stands in for.
const LINK_VIA: &str = "GPUMEM_KERNEL_LINK_VIA";

/// Whether timings are asked for.
pub fn enabled() -> bool {
    std::env::var_os(VAR).is_some()
}

/// Appends `line` (one JSON object) to the timings file, when one is set.
pub fn append(line: &serde_json::Value) {
    let Some(path) = std::env::var_os(VAR) else { return };
    // One write per line, in append mode: the wrapper, the linker and the kernel share the file.
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

/// The cell crate's rustc arguments with this binary (`exe`) as the linker, and the linker it
/// stands in for (the last `-C linker=` given, else `cc`, rustc's default on Linux).
pub fn timed_link(args: &mut Vec<OsString>, exe: &std::path::Path) -> OsString {
    let mut via = OsString::from("cc");
    for w in args.windows(2) {
        if w[0] == "-C"
            && let Some(l) = w[1].to_str().and_then(|a| a.strip_prefix("linker="))
        {
            via = l.into();
        }
    }
    let mut linker = OsString::from("linker=");
    linker.push(exe);
    args.extend([OsString::from("-C"), linker]);
    via
}

/// Runs `rustc args` for the cell crate, timing it and its link; exits with its status.
pub fn run_rustc(rustc: &OsString, mut args: Vec<OsString>, exe: &std::path::Path, clear: &str) -> ! {
    let via = timed_link(&mut args, exe);
    let mut cmd = std::process::Command::new(rustc);
    cmd.args(&args).env_remove(clear).env(LINK_VIA, via);
    run_timed(cmd, "rustc", &rustc.to_string_lossy())
}

/// When this process is the cell crate's timed linker: runs the real one, times it, exits.
pub fn link_if_asked() {
    let Some(via) = std::env::var_os(LINK_VIA) else { return };
    let mut cmd = std::process::Command::new(&via);
    cmd.args(std::env::args_os().skip(1)).env_remove(LINK_VIA);
    run_timed(cmd, "link", &format!("the linker {}", via.to_string_lossy()))
}

/// Runs `cmd`, appends its time as `step`, and exits with its status (`what` names it when it
/// cannot be run).
fn run_timed(mut cmd: std::process::Command, step: &str, what: &str) -> ! {
    let started = Instant::now();
    let status = cmd.status();
    append(&serde_json::json!({"step": step, "ms": started.elapsed().as_secs_f64() * 1e3}));
    match status {
        Ok(s) => std::process::exit(s.code().unwrap_or(1)),
        Err(e) => {
            eprintln!("gpumem-kernel: cannot run {what}: {e}");
            std::process::exit(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timed_link_stands_in_for_the_linker_asked_for() {
        let exe = std::path::Path::new("/k/gpumem-kernel");
        let mut args: Vec<OsString> = ["--crate-name", "ctx"].iter().map(OsString::from).collect();
        assert_eq!(timed_link(&mut args, exe), "cc");
        assert_eq!(args[2..], [OsString::from("-C"), OsString::from("linker=/k/gpumem-kernel")]);
        let mut args: Vec<OsString> = ["-C", "linker=clang", "x"].iter().map(OsString::from).collect();
        assert_eq!(timed_link(&mut args, exe), "clang");
        assert_eq!(args.last().unwrap(), "linker=/k/gpumem-kernel", "the last -C linker wins");
    }
}
