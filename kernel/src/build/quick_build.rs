//! A cell's build without cargo, when only the cell changed.
//!
//! evcxr builds every cell with `cargo build`. Between two cells nothing but `src/lib.rs`
//! changes, yet cargo reads the manifests and checks the fingerprints of every dependency each
//! time: ~60 ms with gpumem-nb, more with candle, paid by every cell and by each of evcxr's
//! retries. evcxr runs cargo through this binary (`EVCXR_CARGO_WRAPPER`, our patch of evcxr:
//! `vendor/evcxr/PATCHES.md`); [`run_if_asked`] then either runs cargo as asked, or, when the
//! inputs of the last cargo build are unchanged, runs the cell crate's rustc command that
//! build ran, directly, and answers evcxr in cargo's words.
//!
//! - **What is recorded.** During a real `cargo build` the cell crate's rustc wrapper (this
//!   binary, `cell_lines`) writes the command cargo gave it: rustc, its arguments, its
//!   environment and directory ([`record_if_asked`]). After the build, if that record is new,
//!   the state is kept: a key over the build's inputs and the files whose change would make
//!   cargo rebuild a dependency.
//! - **The key**: cargo's arguments, `Cargo.toml`, `Cargo.lock`, `.cargo/config.toml`, and the
//!   environment but the kernel's own `GPUMEM_*` settings (which the wrapper reads again on
//!   each run, so `:opt` still applies).
//! - **The files watched** (length and modification time): every `--extern` library, and the
//!   sources of every path package (those in `Cargo.lock` without a source), read from the
//!   dep-info rustc wrote for them, with their manifests and build scripts. Registry sources
//!   do not change under a version.
//! - **The quick run** runs the recorded command through the wrapper (line tables, the cell
//!   opt-level and the timings as before), turns rustc's JSON diagnostics into cargo's
//!   `compiler-message`s, puts the library where cargo would (`debug/libctx.so`) and reports it
//!   as a `compiler-artifact`. Anything else (`cargo check`, `clean`, a changed input, no
//!   record) runs cargo itself.
//!
//! Timings (`GPUMEM_KERNEL_CELL_TIMES`) get a `cargo` step: the wrapper's time, and whether
//! cargo ran (`quick: false`) or not.

use super::stable_hash::StableHash;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, UNIX_EPOCH};

/// `GPUMEM_KERNEL_QUICK_BUILD=off` in the kernel's environment: cargo for every build.
pub const SWITCH_VAR: &str = "GPUMEM_KERNEL_QUICK_BUILD";

/// Set on a real cargo build: where the cell crate's rustc wrapper writes its command.
const RECORD_VAR: &str = "GPUMEM_KERNEL_QUICK_RECORD";

/// What evcxr runs cargo through (our patch of evcxr reads it).
const WRAPPER_VAR: &str = "EVCXR_CARGO_WRAPPER";

fn enabled() -> bool {
    !std::env::var(SWITCH_VAR).is_ok_and(|v| v.trim().eq_ignore_ascii_case("off"))
}

/// For the kernel's own environment, set in `main` before any thread: evcxr runs cargo through
/// this binary (`exe`); `None` when turned off.
pub fn kernel_env(exe: &Path) -> Option<(&'static str, OsString)> {
    enabled().then(|| (WRAPPER_VAR, exe.as_os_str().to_owned()))
}

/// The cell crate's rustc command, as cargo ran it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Record {
    rustc: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    cwd: String,
}

/// One watched file: its length and modification time (ns since the epoch).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Watched {
    path: String,
    len: u64,
    mtime_ns: u128,
}

/// What a quick build needs: the key of the inputs, the command, the files to watch.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct State {
    key: String,
    record: Record,
    watch: Vec<Watched>,
}

fn state_dir(crate_dir: &Path) -> PathBuf {
    crate_dir.join("target").join("gpumem-quick-build")
}

/// In the cell crate's rustc wrapper: writes the command cargo gave it, when a cargo build
/// run by [`run_if_asked`] asked for it.
pub fn record_if_asked(rustc: &OsString, args: &[OsString]) {
    let Some(path) = std::env::var_os(RECORD_VAR) else { return };
    let text = |o: &OsString| o.to_str().map(str::to_string);
    let (Some(rustc), Some(args), Ok(cwd)) =
        (text(rustc), args.iter().map(text).collect::<Option<Vec<_>>>(), std::env::current_dir())
    else {
        return;
    };
    let env = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        // cargo's jobserver lives as long as that build: a later run has no such descriptors.
        .filter(|(k, _)| k != RECORD_VAR && !matches!(k.as_str(), "CARGO_MAKEFLAGS" | "MAKEFLAGS" | "MFLAGS"))
        .collect();
    let rec = Record { rustc, args, env, cwd: cwd.to_string_lossy().into_owned() };
    if let Ok(json) = serde_json::to_vec(&rec) {
        let _ = std::fs::write(path, json);
    }
}

/// First thing in `main`: when this process is evcxr's cargo wrapper (evcxr was told to run
/// cargo through this binary, and the first argument is a cargo: the kernel has no command of
/// that name), builds and exits; returns otherwise.
pub fn run_if_asked() {
    if std::env::var_os(WRAPPER_VAR).is_none() {
        return;
    }
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let Some((cargo, rest)) = args.split_first() else { return };
    if !Path::new(cargo).file_name().is_some_and(|n| n.to_string_lossy().starts_with("cargo")) {
        return;
    }
    let started = Instant::now();
    let crate_dir = std::env::current_dir().unwrap_or_default();
    let build = rest.first().is_some_and(|a| a == "build");
    let (code, quick) = match build.then(|| quick(&crate_dir, rest)).flatten() {
        Some(code) => (code, true),
        None => (real_cargo(cargo, rest, &crate_dir, build), false),
    };
    if build {
        super::timings::append(&serde_json::json!({
            "step": "cargo", "ms": started.elapsed().as_secs_f64() * 1e3, "quick": quick,
        }));
    }
    std::process::exit(code);
}

/// The key of a build's inputs (see the module docs).
fn key(crate_dir: &Path, cargo_args: &[OsString], env: impl Iterator<Item = (OsString, OsString)>) -> String {
    let mut h = StableHash::default();
    h.write(&(cargo_args.len() as u64).to_le_bytes());
    for a in cargo_args {
        h.blob(Some(a.as_encoded_bytes()));
    }
    for f in ["Cargo.toml", "Cargo.lock", ".cargo/config.toml"] {
        h.blob(std::fs::read(crate_dir.join(f)).ok().as_deref());
    }
    let mut env: Vec<(OsString, OsString)> = env.filter(|(k, _)| !k.to_string_lossy().starts_with("GPUMEM_")).collect();
    env.sort();
    for (k, v) in &env {
        h.blob(Some(k.as_encoded_bytes())).blob(Some(v.as_encoded_bytes()));
    }
    h.hex()
}

/// Runs cargo as asked; after a build, keeps the state for the next one (or drops it).
fn real_cargo(cargo: &OsString, args: &[OsString], crate_dir: &Path, build: bool) -> i32 {
    let dir = state_dir(crate_dir);
    let record = dir.join("rustc.json");
    let mut cmd = Command::new(cargo);
    cmd.args(args);
    if build && std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::remove_file(&record);
        let _ = std::fs::remove_file(dir.join("state.json"));
        cmd.env(RECORD_VAR, &record);
    }
    let code = match cmd.status() {
        Ok(s) => s.code().unwrap_or(101),
        Err(e) => {
            eprintln!("gpumem-kernel: cannot run {}: {e}", cargo.to_string_lossy());
            101
        }
    };
    if build && let Some(state) = new_state(crate_dir, args, &record) {
        let _ = serde_json::to_vec(&state).map(|j| std::fs::write(dir.join("state.json"), j));
    }
    code
}

fn new_state(crate_dir: &Path, cargo_args: &[OsString], record: &Path) -> Option<State> {
    let record: Record = serde_json::from_slice(&std::fs::read(record).ok()?).ok()?;
    // The libraries the cell links must all be there; a file a stale dep-info names (a build
    // from a checkout since deleted) is not watched.
    let mut paths = externs(&record.args);
    if !paths.iter().all(|p| p.exists()) {
        return None;
    }
    let packages = path_packages(&crate_dir.join("Cargo.lock"));
    for dir in dependency_dirs(&record.args) {
        for package in &packages {
            paths.extend(package_files(&dir, package));
        }
    }
    paths.sort();
    paths.dedup();
    let watch = paths.iter().filter_map(|p| watched(p)).collect();
    let key = key(crate_dir, cargo_args, std::env::vars_os());
    Some(State { key, record, watch })
}

fn watched(path: &Path) -> Option<Watched> {
    let m = std::fs::metadata(path).ok()?;
    let mtime_ns = m.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_nanos();
    Some(Watched { path: path.to_string_lossy().into_owned(), len: m.len(), mtime_ns })
}

/// The libraries of `--extern NAME=PATH` arguments.
fn externs(args: &[String]) -> Vec<PathBuf> {
    args.windows(2)
        .filter(|w| w[0] == "--extern")
        .filter_map(|w| w[1].split_once('=').map(|(_, p)| PathBuf::from(p)))
        .collect()
}

/// The directories of `-L dependency=DIR` arguments.
fn dependency_dirs(args: &[String]) -> Vec<PathBuf> {
    args.windows(2)
        .filter(|w| w[0] == "-L")
        .filter_map(|w| w[1].strip_prefix("dependency=").map(PathBuf::from))
        .collect()
}

/// The crate names of `Cargo.lock`'s path packages (no `source`), the cell crate's left out.
fn path_packages(lock: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(lock) else { return Vec::new() };
    let Ok(lock) = text.parse::<toml::Table>() else { return Vec::new() };
    lock.get("package")
        .and_then(|p| p.as_array())
        .into_iter()
        .flatten()
        .filter(|p| p.get("source").is_none())
        .filter_map(|p| p.get("name")?.as_str())
        .map(|n| n.replace('-', "_"))
        .filter(|n| n != super::build_dir::CELL_CRATE)
        .collect()
}

/// A path package's sources as its dep-info files in `dir` list them (`NAME-HASH.d`), with the
/// manifest and build script of the package they are in.
fn package_files(dir: &Path, name: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let prefix = format!("{name}-");
    let mut out = Vec::new();
    for e in entries.flatten() {
        let file = e.file_name();
        let file = file.to_string_lossy();
        if !(file.starts_with(&prefix) && file.ends_with(".d")) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path()) else { continue };
        let sources = dep_info_sources(&text);
        if let Some(root) = sources.first().and_then(|s| package_root(s)) {
            out.push(root.join("Cargo.toml"));
            let build = root.join("build.rs");
            if build.exists() {
                out.push(build);
            }
        }
        out.extend(sources);
    }
    out
}

/// The files a makefile-style dep-info says its first target depends on (`\ ` is a space).
fn dep_info_sources(text: &str) -> Vec<PathBuf> {
    let Some(line) = text.lines().find(|l| !l.trim().is_empty()) else { return Vec::new() };
    let Some((_, deps)) = line.split_once(": ") else { return Vec::new() };
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = deps.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => {
                cur.push(' ');
                chars.next();
            }
            ' ' => {
                if !cur.is_empty() {
                    out.push(PathBuf::from(std::mem::take(&mut cur)));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(PathBuf::from(cur));
    }
    out
}

/// The nearest directory above `source` with a `Cargo.toml`.
fn package_root(source: &Path) -> Option<PathBuf> {
    source.ancestors().skip(1).find(|d| d.join("Cargo.toml").is_file()).map(Path::to_path_buf)
}

/// A build without cargo, when the state says nothing but the cell changed: the exit code,
/// or `None` to run cargo.
fn quick(crate_dir: &Path, cargo_args: &[OsString]) -> Option<i32> {
    let state: State = serde_json::from_slice(&std::fs::read(state_dir(crate_dir).join("state.json")).ok()?).ok()?;
    if state.key != key(crate_dir, cargo_args, std::env::vars_os())
        || state.watch.iter().any(|w| watched(Path::new(&w.path)).as_ref() != Some(w))
    {
        return None;
    }
    let exe = std::env::current_exe().ok()?;
    let rec = &state.record;
    let mut cmd = Command::new(&exe);
    cmd.arg(&rec.rustc).args(&rec.args).current_dir(&rec.cwd).env_clear();
    cmd.envs(rec.env.iter().filter(|(k, _)| !k.starts_with("GPUMEM_")).map(|(k, v)| (k, v)));
    cmd.envs(std::env::vars_os().filter(|(k, _)| {
        let k = k.to_string_lossy();
        k.starts_with("GPUMEM_") && k != RECORD_VAR
    }));
    let out = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).output().ok()?;
    let (messages, rest) = cargo_messages(&String::from_utf8_lossy(&out.stderr), &rec.cwd);
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(&out.stdout);
    for m in &messages {
        let _ = writeln!(stdout, "{m}");
    }
    let _ = std::io::stderr().write_all(rest.as_bytes());
    let ok = out.status.success();
    if ok {
        let Some(so) = uplift(&rec.args) else {
            // Where the library went is not known: let cargo do it.
            return None;
        };
        let artifact = serde_json::json!({
            "reason": "compiler-artifact",
            "target": {"name": super::build_dir::CELL_CRATE, "kind": ["cdylib"]},
            "filenames": [so],
            "fresh": false,
        });
        let _ = writeln!(stdout, "{artifact}");
    }
    let _ = writeln!(stdout, "{}", serde_json::json!({"reason": "build-finished", "success": ok}));
    Some(if ok { 0 } else { 101 })
}

/// rustc's JSON diagnostics on its stderr as cargo's `compiler-message`s (for stdout), and the
/// lines that are not JSON (for stderr); artifact notices are dropped.
fn cargo_messages(stderr: &str, cwd: &str) -> (Vec<String>, String) {
    let mut messages = Vec::new();
    let mut rest = String::new();
    for line in stderr.lines() {
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(v) if v.get("$message_type").and_then(|t| t.as_str()) == Some("diagnostic") => {
                let m = serde_json::json!({
                    "reason": "compiler-message",
                    "package_id": format!("path+file://{cwd}#ctx@1.0.0"),
                    "target": {"name": super::build_dir::CELL_CRATE, "kind": ["cdylib"]},
                    "message": v,
                });
                messages.push(m.to_string());
            }
            Ok(v) if v.is_object() => {}
            _ => {
                rest.push_str(line);
                rest.push('\n');
            }
        }
    }
    (messages, rest)
}

/// Puts the cell library rustc wrote in its `--out-dir` (`deps/libctx.so`) where cargo puts it
/// (the directory above), as cargo does (a hard link, else a copy); returns that path.
fn uplift(args: &[String]) -> Option<PathBuf> {
    let out_dir = args.windows(2).find(|w| w[0] == "--out-dir").map(|w| PathBuf::from(&w[1]))?;
    let name =
        format!("{}{}{}", std::env::consts::DLL_PREFIX, super::build_dir::CELL_CRATE, std::env::consts::DLL_SUFFIX);
    let built = out_dir.join(&name);
    let dest = out_dir.parent()?.join(&name);
    let _ = std::fs::remove_file(&dest);
    std::fs::hard_link(&built, &dest).or_else(|_| std::fs::copy(&built, &dest).map(|_| ())).ok()?;
    Some(dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dep_info_lists_every_source_with_escaped_spaces() {
        let text = "/t/deps/libfoo-1.rlib: /p/foo/src/lib.rs /p/my\\ dir/src/a.rs\n\n/p/foo/src/lib.rs:\n";
        assert_eq!(dep_info_sources(text), [PathBuf::from("/p/foo/src/lib.rs"), PathBuf::from("/p/my dir/src/a.rs")]);
        assert!(dep_info_sources("").is_empty());
    }

    #[test]
    fn arguments_name_the_externs_and_dependency_dirs() {
        let args: Vec<String> =
            ["--extern", "a=/t/liba.rlib", "-L", "dependency=/t/deps", "-L", "native=/x", "--extern", "b"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        assert_eq!(externs(&args), [PathBuf::from("/t/liba.rlib")]);
        assert_eq!(dependency_dirs(&args), [PathBuf::from("/t/deps")]);
    }

    #[test]
    fn rustc_diagnostics_become_cargo_messages() {
        let stderr = concat!(
            r#"{"$message_type":"diagnostic","message":"cannot find value `x`","level":"error","spans":[]}"#,
            "\n",
            r#"{"$message_type":"artifact","artifact":"/t/libctx.so","emit":"link"}"#,
            "\nwarning: a plain line\n"
        );
        let (msgs, rest) = cargo_messages(stderr, "/b");
        assert_eq!(msgs.len(), 1);
        let m: serde_json::Value = serde_json::from_str(&msgs[0]).unwrap();
        assert_eq!(m["reason"], "compiler-message");
        assert_eq!(m["message"]["message"], "cannot find value `x`");
        assert_eq!(rest, "warning: a plain line\n");
    }

    #[test]
    fn the_key_follows_the_manifest_and_the_environment_but_not_the_kernels_settings() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Cargo.toml"), "[package]\nname = \"ctx\"\n").unwrap();
        let args = [OsString::from("build")];
        let env = |extra: &[(&str, &str)]| {
            let mut v = vec![(OsString::from("RUSTFLAGS"), OsString::from("-Cprefer-dynamic"))];
            v.extend(extra.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))));
            v.into_iter()
        };
        let k0 = key(dir.path(), &args, env(&[]));
        assert_eq!(k0, key(dir.path(), &args, env(&[("GPUMEM_KERNEL_CELL_OPT", "0")])), "read again by the wrapper");
        assert_ne!(k0, key(dir.path(), &args, env(&[("RUSTC", "/other/rustc")])));
        assert_ne!(k0, key(dir.path(), &[OsString::from("check")], env(&[])));
        std::fs::write(dir.path().join("Cargo.toml"), "[package]\nname = \"ctx\"\n[dependencies]\na = \"1\"\n")
            .unwrap();
        assert_ne!(k0, key(dir.path(), &args, env(&[])), "a :dep changes the manifest");
    }

    #[test]
    fn a_path_packages_sources_are_watched_and_a_change_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let pkg = dir.path().join("mycrate");
        std::fs::create_dir_all(pkg.join("src")).unwrap();
        std::fs::write(pkg.join("Cargo.toml"), "[package]\nname = \"my-crate\"\n").unwrap();
        std::fs::write(pkg.join("build.rs"), "fn main() {}\n").unwrap();
        let lib = pkg.join("src/lib.rs");
        std::fs::write(&lib, "pub fn v() -> u32 { 1 }\n").unwrap();
        let deps = dir.path().join("deps");
        std::fs::create_dir_all(&deps).unwrap();
        std::fs::write(
            deps.join("my_crate-0123.d"),
            format!("{}/libmy_crate-0123.rlib: {}\n", deps.display(), lib.display()),
        )
        .unwrap();
        std::fs::write(deps.join("other-1.d"), "x: /elsewhere/lib.rs\n").unwrap();
        let lock = dir.path().join("Cargo.lock");
        std::fs::write(
            &lock,
            "[[package]]\nname = \"ctx\"\nversion = \"1.0.0\"\n\n[[package]]\nname = \"my-crate\"\nversion = \"0.1.0\"\n\n\
             [[package]]\nname = \"serde\"\nversion = \"1.0.0\"\nsource = \"registry+https://github.com/rust-lang/crates.io-index\"\n",
        )
        .unwrap();
        assert_eq!(path_packages(&lock), ["my_crate"]);
        let mut files = package_files(&deps, "my_crate");
        files.sort();
        assert_eq!(files, [pkg.join("Cargo.toml"), pkg.join("build.rs"), lib.clone()]);
        let before = watched(&lib).unwrap();
        std::fs::write(&lib, "pub fn v() -> u32 { 22 }\n").unwrap();
        assert_ne!(watched(&lib), Some(before), "an edit changes length or time");
    }
}
