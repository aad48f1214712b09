//! One copy of every `:dep` crate for the whole session.
//!
//! evcxr builds every cell as a shared library of its own and links each `:dep` crate into it
//! statically, statics included: a `static` counter bumped from three cells reads 1, 1, 1; cubecl
//! keeps its device servers in a static, so each cell that calls burn starts a new server with
//! pools of its own, and tensors of two cells cannot meet. gpumem-kernel instead puts the
//! session's dependencies into one shared library, a generated crate with
//! `crate-type = ["dylib"]` that re-exports them (`pub extern crate candle_core;`), and loads
//! it before the cell that declared them: the cells then link those crates from it (rustc finds
//! them already included in a dylib the cell depends on), so each static exists once.
//!
//! - The generated crate is named by what it holds (`gpumem_deps_<hash>`) and lives in one
//!   directory for every build directory (`~/.cache/gpumem-kernel/deps`), so a later session, or
//!   a second kernel, with the same `:dep`s finds it built. It is an ordinary path dependency of
//!   the cells' crate: cargo builds it with the cells' profile, over the same dependency builds.
//! - It is linked into the cells' crate through our patch of evcxr
//!   (`CommandContext::link_in_next_execution`, `vendor/evcxr/PATCHES.md` §6): a dependency,
//!   and an `extern crate` in every later cell's compiled code that type inference never reads
//!   (rust-analyzer would otherwise resolve every crate it re-exports, seconds with candle,
//!   before the user's code names any). The first generation links with the cell that declares
//!   it, in that cell's one build; the user's own `:dep` lines go to evcxr unchanged, so type
//!   inference and `use` work as before and the cell's line numbers do not move.
//! - A `:dep` after that adds a generation that depends on the one loaded (a loaded shared
//!   library cannot be rebuilt under its name) and holds only the new crates.
//! - A generation no session planned for [`KEEP_UNUSED`] (30 days) is removed when a kernel
//!   starts ([`prune`]): its crate and what cargo built of it in the build directories beside the
//!   shared one (a shared library each, tens to hundreds of MiB). Planning one marks it used
//!   (`.used`); a later session that declares the same crates builds it again.
//! - What cannot be loaded this way (the build fails: a crate whose library name is not its
//!   package's, native static libraries, …) falls back to evcxr's static linking, said in one
//!   line that names it; `:allow_static_linking 1` turns the whole mechanism off, `0` on again
//!   (evcxr never sees the command: its own dylib mode does not build on current Rust).

use super::stable_hash::StableHash;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The generated crates' names start with this (`gpumem_nb::kernel::cells` knows it too, to
/// read their symbols as the cells').
pub const PREFIX: &str = gpumem_nb::kernel::cells::SESSION_DEPS_PREFIX;

/// The `:dep` lines of a cell: each dependency's key and its spec as TOML (`"*"` when bare),
/// in order; the kernel's own generated crates are left out.
pub fn deps_of(code: &str) -> Vec<(String, String)> {
    code.lines()
        .filter_map(|l| l.trim().strip_prefix(":dep").filter(|a| a.starts_with(char::is_whitespace)))
        .filter_map(|args| {
            let args = args.trim();
            let (key, spec) = match args.split_once('=') {
                Some((k, s)) => (k.trim(), s.trim()),
                None => (args, "\"*\""),
            };
            (!key.is_empty() && !key.starts_with(PREFIX)).then(|| (key.to_string(), spec.to_string()))
        })
        .collect()
}

/// The `:allow_static_linking` lines of a cell: the last one's setting (`true`: static, as
/// evcxr does; `false`: one copy per session), and the code with each such line kept as a
/// comment (evcxr must not see it; line numbers stay).
pub fn static_linking_setting(code: &str) -> (Option<bool>, String) {
    let mut setting = None;
    let mut out = String::with_capacity(code.len());
    for line in code.split_inclusive('\n') {
        match line.trim().strip_prefix(":allow_static_linking") {
            Some(v) if v.is_empty() || v.starts_with(char::is_whitespace) => {
                setting = Some(!matches!(v.trim(), "0" | "false"));
                out.push_str("// ");
                out.push_str(line.trim_start());
            }
            _ => out.push_str(line),
        }
    }
    (setting, out)
}

/// A generation about to be loaded: its crate and the cell that loads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Load {
    /// The generated crate's name.
    pub name: String,
    /// Its Cargo dependency spec (`{ path = "…" }`).
    pub spec: String,
    /// The dependencies it adds (their keys), for the fallback's message.
    pub adds: Vec<String>,
    deps: Vec<(String, String)>,
}

/// The session's generations.
#[derive(Debug)]
pub struct SessionDeps {
    /// Where generated crates are written.
    root: PathBuf,
    on: bool,
    /// Every dependency the loaded generations hold: key → spec.
    held: BTreeMap<String, String>,
    /// Dependencies that could not be loaded this way (linked per cell from then on).
    refused: BTreeMap<String, String>,
    /// The newest loaded generation.
    top: Option<String>,
    /// Every loaded generation (its name and the crates it adds), oldest first.
    loaded: Vec<(String, Vec<String>)>,
    /// The path of the first loaded generation's variable probe (`variable_probe`), if any.
    probe: Option<String>,
}

impl SessionDeps {
    /// Generated crates under `root`.
    pub fn new(root: PathBuf) -> SessionDeps {
        SessionDeps {
            root,
            on: true,
            held: BTreeMap::new(),
            refused: BTreeMap::new(),
            top: None,
            loaded: Vec::new(),
            probe: None,
        }
    }

    /// Where the generated crates go by default: beside the shared build directory
    /// (`~/.cache/gpumem-kernel/deps`), else inside the cells' build directory.
    pub fn default_root() -> Option<PathBuf> {
        super::build_dir::default_path()
            .and_then(|d| d.parent().map(|p| p.join("deps")))
            .or_else(|| std::env::var_os("EVCXR_TMPDIR").map(|d| PathBuf::from(d).join("gpumem-deps")))
    }

    /// Whether `:dep` crates are loaded once per session (on unless `:allow_static_linking 1`).
    pub fn enabled(&self) -> bool {
        self.on
    }

    /// Turns the mechanism on or off (`:allow_static_linking 0` / `1`). Generations already
    /// loaded stay loaded.
    pub fn set_enabled(&mut self, on: bool) {
        self.on = on;
    }

    /// The generation that holds the new dependencies of a cell whose code (after `:dep
    /// gpumem-nb` was resolved) is `code`, written to disk; `None` when the cell adds none, or
    /// when the mechanism is off. Relative `path`s are taken from `cwd` (as evcxr takes them).
    pub fn plan(&mut self, code: &str, cwd: &Path) -> Result<Option<Load>, String> {
        if !self.on {
            return Ok(None);
        }
        let mut deps: Vec<(String, String)> = Vec::new();
        for (key, spec) in deps_of(code) {
            let spec = absolute_paths(&spec, cwd);
            if self.held.get(&key) == Some(&spec) || self.refused.get(&key) == Some(&spec) {
                continue;
            }
            deps.retain(|(k, _)| *k != key);
            deps.push((key, spec));
        }
        if deps.is_empty() {
            return Ok(None);
        }
        let name = generation_name(self.top.as_deref(), &deps);
        let dir = self.root.join(&name);
        write_generation(&dir, &name, self.top.as_deref().map(|p| (p, self.root.join(p))), &deps)
            .and_then(|()| mark_used(&dir, std::time::SystemTime::now()))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = toml::Value::String(dir.to_string_lossy().into_owned());
        let spec = format!("{{ path = {path} }}");
        Ok(Some(Load { adds: deps.iter().map(|(k, _)| k.clone()).collect(), name, spec, deps }))
    }

    /// No generation is loaded yet (a first one cannot make cargo build a loaded one again).
    pub fn none_loaded(&self) -> bool {
        self.loaded.is_empty()
    }

    /// `load` is loaded: its crates are the session's.
    pub fn loaded(&mut self, load: &Load) {
        if self.probe.is_none() && super::variable_probe::for_deps(&load.deps).is_some() {
            self.probe = Some(format!("{}::{}", load.name, super::variable_probe::MODULE_NAME));
        }
        self.held.extend(load.deps.iter().cloned());
        self.top = Some(load.name.clone());
        self.loaded.push((load.name.clone(), load.adds.clone()));
    }

    /// The module every cell shows its variables to at its end, when a loaded generation has
    /// one (`variable_probe`: burn 0.21 with `autodiff`).
    pub fn probe(&self) -> Option<&str> {
        self.probe.as_deref()
    }

    /// The loaded generations' shared libraries as built under `build_dir` (evcxr's
    /// `EVCXR_TMPDIR`), each with its modification time. A new generation can make cargo build
    /// a loaded one again (a new crate asks more features of a crate they share); the process
    /// then holds the old build while new cells link the new one, and the next cell that loads
    /// fails (`dlopen failed`): compare before and after a load.
    pub fn built_libraries(&self, build_dir: &Path) -> Vec<(String, Option<std::time::SystemTime>)> {
        let target = build_dir.join("target");
        let mut dirs = vec![target.join("debug").join("deps")];
        if let Ok(entries) = std::fs::read_dir(&target) {
            dirs.extend(entries.flatten().map(|e| e.path().join("debug").join("deps")));
        }
        self.loaded
            .iter()
            .map(|(name, _)| {
                let file = format!("{}{name}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
                let modified = dirs.iter().filter_map(|d| std::fs::metadata(d.join(&file)).ok()?.modified().ok()).max();
                (name.clone(), modified)
            })
            .collect()
    }

    /// The crates of the loaded generations whose libraries under `build_dir` changed since
    /// `before` ([`SessionDeps::built_libraries`]), one entry per generation.
    pub fn rebuilt(&self, before: &[(String, Option<std::time::SystemTime>)], build_dir: &Path) -> Vec<String> {
        let after = self.built_libraries(build_dir);
        before
            .iter()
            .filter(|(name, t)| after.iter().any(|(n, u)| n == name && u != t))
            .filter_map(|(name, _)| self.loaded.iter().find(|(n, _)| n == name).map(|(_, adds)| adds.join(", ")))
            .collect()
    }

    /// `load` could not be loaded: its crates are linked into each cell from now on.
    pub fn refused(&mut self, load: &Load) {
        self.refused.extend(load.deps.iter().cloned());
    }

    /// evcxr forgot its dependencies and items (`:clear`): nothing is loaded.
    pub fn cleared(&mut self) {
        self.held.clear();
        self.top = None;
        self.loaded.clear();
    }
}

/// `spec` with a relative `path` made absolute against `cwd`; other specs as they are.
fn absolute_paths(spec: &str, cwd: &Path) -> String {
    let Ok(mut doc) = format!("d = {spec}").parse::<toml::Table>() else { return spec.to_string() };
    let Some(toml::Value::Table(t)) = doc.get_mut("d") else { return spec.to_string() };
    let Some(toml::Value::String(p)) = t.get("path") else { return spec.to_string() };
    if Path::new(p).is_absolute() {
        return spec.to_string();
    }
    let abs = cwd.join(p);
    let abs = abs.canonicalize().unwrap_or(abs);
    t.insert("path".into(), toml::Value::String(abs.to_string_lossy().into_owned()));
    inline(&doc["d"])
}

/// A TOML value on one line (an inline table for a table).
fn inline(v: &toml::Value) -> String {
    match v {
        toml::Value::Table(t) => {
            let parts: Vec<String> = t.iter().map(|(k, v)| format!("{k} = {}", inline(v))).collect();
            format!("{{ {} }}", parts.join(", "))
        }
        toml::Value::Array(a) => format!("[{}]", a.iter().map(inline).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

/// The name of the generation holding `deps` over `parent`: the same inputs, the same name
/// (so a later session finds it built).
fn generation_name(parent: Option<&str>, deps: &[(String, String)]) -> String {
    let mut h = StableHash::default();
    h.text(env!("CARGO_PKG_VERSION")).text(parent.unwrap_or(""));
    for (k, s) in deps {
        h.text(k).text(s);
    }
    format!("{PREFIX}{}", h.hex())
}

/// Writes the generated crate into `dir` (atomically: a complete crate or none).
fn write_generation(
    dir: &Path,
    name: &str,
    parent: Option<(&str, PathBuf)>,
    deps: &[(String, String)],
) -> std::io::Result<()> {
    let mut manifest = format!(
        "# Generated by gpumem-kernel: the notebook session's dependencies, built once and loaded\n\
         # by every cell.\n[package]\nname = \"{name}\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
         [lib]\ncrate-type = [\"dylib\"]\npath = \"lib.rs\"\n\n[dependencies]\n"
    );
    let mut lib = String::from(
        "// Generated by gpumem-kernel: one copy of each crate for the session.\n#![allow(unused_extern_crates)]\n",
    );
    if let Some((p, pdir)) = &parent {
        manifest
            .push_str(&format!("{p} = {{ path = {} }}\n", toml::Value::String(pdir.to_string_lossy().into_owned())));
        lib.push_str(&format!("pub extern crate {p};\n"));
    }
    for (key, spec) in deps {
        manifest.push_str(&format!("{key} = {spec}\n"));
        lib.push_str(&format!("pub extern crate {};\n", key.replace('-', "_")));
    }
    // A reader of cubecl's own books, built against the session's cubecl (`books_shim`).
    if let Some((dep, code)) = super::books_shim::for_deps(deps) {
        if let Some(dep) = dep {
            manifest.push_str(&format!("{dep}\n"));
        }
        lib.push_str(&code);
    }
    // The probe of what the variables hold by burn's types (`variable_probe`).
    if let Some(code) = super::variable_probe::for_deps(deps) {
        lib.push_str(&code);
    }
    if std::fs::read_to_string(dir.join("Cargo.toml")).is_ok_and(|m| m == manifest)
        && std::fs::read_to_string(dir.join("lib.rs")).is_ok_and(|l| l == lib)
    {
        return Ok(());
    }
    let parent_dir = dir.parent().unwrap_or(dir);
    std::fs::create_dir_all(parent_dir)?;
    let tmp = parent_dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    std::fs::write(tmp.join("Cargo.toml"), &manifest)?;
    std::fs::write(tmp.join("lib.rs"), &lib)?;
    let _ = std::fs::remove_dir_all(dir);
    match std::fs::rename(&tmp, dir) {
        Ok(()) => Ok(()),
        // Another kernel wrote the same crate meanwhile: its content is this one's.
        Err(_) if dir.join("lib.rs").is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// How long a generation stays on disk after the last session that planned it.
pub const KEEP_UNUSED: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// The file whose modification time says when a generation was last planned.
const USED: &str = ".used";

/// Marks the generation in `dir` used at `when`.
fn mark_used(dir: &Path, when: std::time::SystemTime) -> std::io::Result<()> {
    std::fs::File::create(dir.join(USED))?.set_modified(when)
}

/// When the generation in `dir` was last planned (its manifest's time where it has no mark).
fn last_used(dir: &Path) -> Option<std::time::SystemTime> {
    let time = |f: &str| std::fs::metadata(dir.join(f)).and_then(|m| m.modified()).ok();
    time(USED).or_else(|| time("Cargo.toml"))
}

/// What pruning removed: the generations' names and the bytes their files held.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// The generations removed.
    pub names: Vec<String>,
    /// The bytes of every file removed (crates and build outputs).
    pub bytes: u64,
}

/// Removes the generations under `root` that no session planned within `keep` before `now`:
/// each crate's directory and every build output named after it (cargo's `deps/`,
/// `.fingerprint/`, `incremental/`, the copied-up library) in the build directories beside
/// `root` (those of its parent that hold a `target`, and the parent itself). A kernel that still
/// runs with one loaded keeps its mapped copy; a cell of it that links again would rebuild it
/// (cargo rebuilds what is missing), which takes a session open longer than `keep`.
pub fn prune(root: &Path, keep: std::time::Duration, now: std::time::SystemTime) -> Pruned {
    let mut pruned = Pruned::default();
    let Ok(entries) = std::fs::read_dir(root) else { return pruned };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let dir = e.path();
        if !name.starts_with(PREFIX) || !dir.is_dir() {
            continue;
        }
        let stale = last_used(&dir).is_some_and(|t| now.duration_since(t).is_ok_and(|age| age > keep));
        if stale {
            pruned.bytes += size_of(&dir);
            if std::fs::remove_dir_all(&dir).is_ok() {
                pruned.names.push(name);
            }
        }
    }
    if pruned.names.is_empty() {
        return pruned;
    }
    let Some(parent) = root.parent() else { return pruned };
    let mut builds: Vec<PathBuf> = vec![parent.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(parent) {
        builds.extend(entries.flatten().map(|e| e.path()).filter(|p| p.join("target").is_dir()));
    }
    for build in builds {
        pruned.bytes += remove_named(&build.join("target"), &pruned.names, 5);
    }
    pruned
}

/// The bytes of the files under `p`.
fn size_of(p: &Path) -> u64 {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => {
            std::fs::read_dir(p).map(|es| es.flatten().map(|e| size_of(&e.path())).sum()).unwrap_or(0)
        }
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

/// Removes every entry under `dir` (down to `depth` levels) whose name contains one of
/// `names`; returns the bytes removed.
fn remove_named(dir: &Path, names: &[String], depth: usize) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut bytes = 0;
    for e in entries.flatten() {
        let (path, file) = (e.path(), e.file_name().to_string_lossy().into_owned());
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if names.iter().any(|n| file.contains(n.as_str())) {
            let size = size_of(&path);
            let gone = if is_dir { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            if gone.is_ok() {
                bytes += size;
            }
        } else if is_dir && depth > 0 {
            bytes += remove_named(&path, names, depth - 1);
        }
    }
    bytes
}

/// The line said when loading `load` built loaded generations again (`rebuilt`, the crates
/// they hold) and the notebook's process was restarted for it.
pub fn rebuilt_message(load: &Load, rebuilt: &[String]) -> String {
    format!(
        "gpumem-kernel: adding {} built {} again (cargo gave a crate they share the features the new crates ask \
         for); the notebook's process restarted so that every cell runs one build: variables are lost, as after \
         :restart (declare every :dep in the first cell to avoid it)",
        load.adds.join(", "),
        rebuilt.join(", ")
    )
}

/// The line said when a generation cannot be loaded.
pub fn fallback_message(load: &Load, error: &str) -> String {
    let why = error.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("its build failed");
    format!(
        "gpumem-kernel: {} cannot be loaded once for the session ({why}); each cell links its own copy, so its \
         statics are per cell (a crate whose library is named otherwise than its package: `:dep libname = {{ \
         package = \"…\" }}`)",
        load.adds.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dep_lines_and_the_static_linking_switch() {
        let code = ":dep candle-core = { version = \"0.9\", features = [\"cuda\"] }\n:dep  rand\nlet x = 1;\n:dep gpumem_deps_00 = { path = \"/x\" }\n";
        assert_eq!(
            deps_of(code),
            [
                ("candle-core".to_string(), "{ version = \"0.9\", features = [\"cuda\"] }".to_string()),
                ("rand".to_string(), "\"*\"".to_string())
            ]
        );
        let (s, rest) = static_linking_setting(":allow_static_linking 1\nlet y = 2;\n");
        assert_eq!((s, rest.as_str()), (Some(true), "// :allow_static_linking 1\nlet y = 2;\n"));
        assert_eq!(static_linking_setting("  :allow_static_linking 0").0, Some(false));
        assert_eq!(static_linking_setting(":allow_static_linkingx").0, None);
    }

    #[test]
    fn generations_hold_what_is_new_and_layer_over_the_loaded_one() {
        let root = tempfile::tempdir().unwrap();
        let cwd = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(cwd.path().join("counter")).unwrap();
        let mut s = SessionDeps::new(root.path().to_path_buf());
        assert_eq!(s.plan("let x = 1;", cwd.path()).unwrap(), None);
        let first = s.plan(":dep counter = { path = \"counter\" }\n:dep cfg-if = \"1\"", cwd.path()).unwrap().unwrap();
        assert!(first.name.starts_with(PREFIX), "{first:?}");
        let dir = root.path().join(&first.name);
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let abs = cwd.path().join("counter").canonicalize().unwrap();
        assert!(manifest.contains(&format!("counter = {{ path = \"{}\" }}", abs.display())), "{manifest}");
        assert!(manifest.contains("cfg-if = \"1\"") && manifest.contains("crate-type = [\"dylib\"]"), "{manifest}");
        let lib = std::fs::read_to_string(dir.join("lib.rs")).unwrap();
        assert!(lib.contains("pub extern crate counter;\npub extern crate cfg_if;\n"), "{lib}");
        assert_eq!(first.spec, format!("{{ path = \"{}\" }}", dir.display()));
        // The same again: the same name, nothing rewritten.
        let mut again = SessionDeps::new(root.path().to_path_buf());
        let same = again.plan(":dep counter = { path = \"counter\" }\n:dep cfg-if = \"1\"", cwd.path()).unwrap();
        assert_eq!(same.map(|l| l.name), Some(first.name.clone()));
        // Loaded: the same lines add nothing; a new crate is a generation over it.
        s.loaded(&first);
        assert_eq!(s.plan(":dep cfg-if = \"1\"", cwd.path()).unwrap(), None);
        let second = s.plan(":dep libc = \"0.2\"", cwd.path()).unwrap().unwrap();
        assert_ne!(second.name, first.name);
        let manifest = std::fs::read_to_string(root.path().join(&second.name).join("Cargo.toml")).unwrap();
        assert!(manifest.contains(&format!("{} = {{ path = ", first.name)) && manifest.contains("libc = \"0.2\""));
        assert!(!manifest.contains("cfg-if"), "only what is new: {manifest}");
        // Refused: linked per cell from then on, not tried again; off: nothing.
        s.refused(&second);
        assert_eq!(s.plan(":dep libc = \"0.2\"", cwd.path()).unwrap(), None);
        s.set_enabled(false);
        assert_eq!(s.plan(":dep rand = \"0.8\"", cwd.path()).unwrap(), None);
        let msg = fallback_message(&second, "\nerror[E0463]: can't find crate for `libc`\n");
        assert!(msg.starts_with("gpumem-kernel: libc cannot be loaded once for the session (error[E0463]"), "{msg}");
    }

    /// burn 0.21 with CUDA: its generation also reads cubecl's books (`books_shim`), with cubecl
    /// under a name of its own; a generation of other crates gets nothing of it.
    #[test]
    fn a_burn_generation_carries_the_reader_of_cubecl_s_books() {
        let root = tempfile::tempdir().unwrap();
        let mut s = SessionDeps::new(root.path().to_path_buf());
        let burn = ":dep burn = { version = \"0.21\", default-features = false, features = [\"std\", \"cuda\"] }";
        let load = s.plan(burn, root.path()).unwrap().unwrap();
        let dir = root.path().join(&load.name);
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains("\ngpumem_books_cubecl = { package = \"cubecl\", version = \"0.10.0\""),
            "{manifest}"
        );
        let lib = std::fs::read_to_string(dir.join("lib.rs")).unwrap();
        assert!(lib.contains("pub extern crate burn;\n") && lib.contains("pub mod __gpumem_books {"), "{lib}");
        assert!(lib.contains("pub extern \"C\" fn gpumem_books_cubecl_usage_v1("), "{lib}");
        assert_eq!(load.adds, ["burn"], "the reader is no dependency of the notebook's");
        s.loaded(&load);
        let other = s.plan(":dep cfg-if = \"1\"", root.path()).unwrap().unwrap();
        let dir = root.path().join(&other.name);
        assert!(!std::fs::read_to_string(dir.join("Cargo.toml")).unwrap().contains("gpumem_books"));
        assert!(!std::fs::read_to_string(dir.join("lib.rs")).unwrap().contains("__gpumem_books"));
    }

    /// A generation nobody planned for longer than the limit goes, with its build outputs in
    /// every build directory beside the root; one planned since, and other files, stay.
    #[test]
    fn generations_unused_too_long_are_removed_with_their_builds() {
        let cache = tempfile::tempdir().unwrap();
        let root = cache.path().join("deps");
        let cwd = tempfile::tempdir().unwrap();
        let old = SessionDeps::new(root.clone()).plan(":dep cfg-if = \"1\"", cwd.path()).unwrap().unwrap();
        let kept = SessionDeps::new(root.clone()).plan(":dep libc = \"0.2\"", cwd.path()).unwrap().unwrap();
        let day = std::time::Duration::from_secs(24 * 3600);
        let now = std::time::SystemTime::now();
        mark_used(&root.join(&old.name), now - 40 * day).unwrap();
        let mut built = Vec::new();
        for build in ["evcxr", "evcxr-2"] {
            let deps = cache.path().join(build).join("target/x86_64-unknown-linux-gnu/debug/deps");
            let fingerprint = deps.with_file_name(".fingerprint").join(format!("{}-0123", old.name));
            std::fs::create_dir_all(&fingerprint).unwrap();
            std::fs::create_dir_all(&deps).unwrap();
            std::fs::write(fingerprint.join("lib"), b"1234").unwrap();
            for lib in [&old.name, &kept.name, &"libc-0123".to_string()] {
                std::fs::write(deps.join(format!("lib{lib}.so")), vec![0u8; 1000]).unwrap();
                built.push(deps.join(format!("lib{lib}.so")));
            }
            built.push(fingerprint);
        }
        assert_eq!(prune(&root, 50 * day, now).names, Vec::<String>::new(), "nothing unused for 50 days");
        let p = prune(&root, KEEP_UNUSED, now);
        assert_eq!(p.names, std::slice::from_ref(&old.name));
        assert!(!root.join(&old.name).exists() && root.join(&kept.name).join("lib.rs").is_file());
        let gone: Vec<bool> = built.iter().map(|b| !b.exists()).collect();
        assert_eq!(gone, [true, false, false, true, true, false, false, true], "{built:?}");
        assert!(p.bytes >= 2 * 1004, "{p:?}");
        // Planning marks it used again: a later session that declares it writes it again.
        let again = SessionDeps::new(root.clone()).plan(":dep cfg-if = \"1\"", cwd.path()).unwrap().unwrap();
        assert_eq!(again.name, old.name);
        assert!(prune(&root, KEEP_UNUSED, now).names.is_empty());
    }
}
