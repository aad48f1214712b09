//! What evcxr's compile of a cell is doing, for the live line and `run`'s console.
//!
//! The first `:dep gpumem-nb` cell builds the crate and every dependency (a minute on two
//! cores); evcxr runs that cargo build silently. A [`Watch`] sees it from outside: a `cargo
//! build` child of this process (or of the cargo wrapper, this same binary) is running, and its
//! `rustc` children say which crates it is
//! compiling (a build compiles dependencies while one of them is not the cells' own crate);
//! the packages it has to build are the ones `cargo tree` lists for the host (features and
//! platforms resolved as the build resolves them; asked once per `Cargo.toml`), and a package is built
//! once cargo has written the fingerprint of its library
//! (`target/…/.fingerprint/<name>-<hash>/lib-*`, written after a unit succeeds).
//! Packages built by an earlier session count as built: that is what makes a warm start fast.
//! Once a build of the crate has succeeded, the graph is narrowed to what it built (a package
//! listed but never built would otherwise keep a later build looking unfinished).
//!
//! Only Linux has `/proc` to find the build by; elsewhere [`Watch::poll`] says nothing.

use crate::output::Progress;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// Watches one build directory (evcxr's `EVCXR_TMPDIR`, where the cells' crate is).
#[derive(Debug)]
pub struct Watch {
    crate_dir: PathBuf,
    host: Option<String>,
    /// The running build.
    build: Option<Build>,
    /// The graph of the last `Cargo.toml` seen.
    graph: Option<Graph>,
}

/// A running `cargo build`, as seen so far.
#[derive(Debug)]
struct Build {
    pid: u32,
    /// When it was first seen.
    began: SystemTime,
    /// It has compiled a crate other than the cells' own.
    dependency_seen: bool,
    /// It has started on the cells' own crate.
    root_seen: bool,
    /// The dependencies compiling at the last look that found any.
    compiling: Vec<String>,
}

/// The packages a `Cargo.toml` builds.
#[derive(Debug)]
struct Graph {
    /// The manifest's text (a new one asks cargo again).
    manifest: String,
    /// The crate itself (the cells' crate).
    root: String,
    /// Name → number of versions, the root not counted.
    packages: HashMap<String, usize>,
}

impl Watch {
    /// A watch on the cells' crate in `crate_dir`.
    pub fn new(crate_dir: &Path) -> Watch {
        Watch { crate_dir: crate_dir.to_path_buf(), host: host_triple(), build: None, graph: None }
    }

    /// The build's progress while a `cargo build` child of this process runs; `None` otherwise.
    /// Its seconds count from `origin`: when the user asked (the cell's request), not when the
    /// build was first seen, which comes seconds later.
    pub fn poll(&mut self, origin: Instant) -> Option<Progress> {
        let Some((pid, compiling)) = cargo_build() else {
            if let Some(b) = self.build.take() {
                self.settle(b.began);
            }
            return None;
        };
        self.observe(pid, compiling, origin)
    }

    /// The progress of build `pid`, which compiles `compiling` (crate names) now.
    fn observe(&mut self, pid: u32, compiling: Vec<String>, origin: Instant) -> Option<Progress> {
        if self.build.as_ref().is_none_or(|b| b.pid != pid) {
            // A new build: the one before it (if this watch missed its end) is over.
            if let Some(b) = self.build.take() {
                self.settle(b.began);
            }
            let build = Build {
                pid,
                began: SystemTime::now(),
                dependency_seen: false,
                root_seen: false,
                compiling: Vec::new(),
            };
            self.build = Some(build);
        }
        let dir = self.crate_dir.clone();
        let (built, total, root, packages) = match self.graph() {
            Some(g) => (
                count_built(&g.packages, &built_libraries(&dir)),
                Some(g.packages.values().sum::<usize>()),
                g.root.replace('-', "_"),
                g.packages.keys().cloned().collect(),
            ),
            None => (0, None, "ctx".to_string(), Vec::new()),
        };
        let build = self.build.as_mut()?;
        let mut dependencies: Vec<String> = Vec::new();
        for name in compiling {
            let words = user_words(&name, &packages);
            if name == root {
                build.root_seen = true;
            } else if !dependencies.contains(&words) {
                dependencies.push(words);
            }
        }
        if !dependencies.is_empty() {
            dependencies.sort();
            build.dependency_seen = true;
            build.compiling = dependencies;
        }
        Some(Progress {
            built,
            total,
            elapsed: origin.elapsed(),
            dependencies: build.dependency_seen && !build.root_seen,
            compiling: build.compiling.clone(),
        })
    }

    /// After a build that began at `began`: when it built the crate itself, every package it
    /// needed is built, so the graph becomes those (and loses what this host never builds).
    fn settle(&mut self, began: SystemTime) {
        let dir = self.crate_dir.clone();
        let Some(graph) = self.graph.as_mut() else { return };
        let libs = built_libraries(&dir);
        if libs.get(&graph.root).is_none_or(|(_, newest)| *newest < began) {
            return;
        }
        graph.packages = graph
            .packages
            .iter()
            .filter_map(|(name, versions)| {
                let built = libs.get(name).map_or(0, |(n, _)| (*n).min(*versions));
                (built > 0).then(|| (name.clone(), built))
            })
            .collect();
    }

    /// The packages of the cells' crate's graph (asked of cargo again when `Cargo.toml`
    /// changed; `None` when cargo could not say).
    fn graph(&mut self) -> Option<&Graph> {
        let manifest = std::fs::read_to_string(self.crate_dir.join("Cargo.toml")).ok()?;
        if self.graph.as_ref().is_none_or(|g| g.manifest != manifest) {
            let (root, packages) = cargo_tree_packages(&self.crate_dir, self.host.as_deref())?;
            self.graph = Some(Graph { manifest, root, packages });
        }
        self.graph.as_ref()
    }
}

/// Calls `each` with the progress every `period` while a build runs, on a thread of its own,
/// until [`Ticker::stop`].
pub struct Ticker {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Ticker {
    /// Starts ticking on `watch`, the seconds counted from `origin` (the cell's request).
    pub fn start(
        watch: Arc<Mutex<Watch>>,
        origin: Instant,
        period: Duration,
        each: impl Fn(&Progress) + Send + 'static,
    ) -> std::io::Result<Ticker> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new().name("gpumem-compile".into()).spawn(move || {
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(period) {
                let progress = watch.lock().ok().and_then(|mut w| w.poll(origin));
                if let Some(p) = progress {
                    each(&p);
                }
            }
        })?;
        Ok(Ticker { stop, thread })
    }

    /// Stops and waits for the thread.
    pub fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// The host's target triple (`rustc -vV`), the platform evcxr builds cells for.
fn host_triple() -> Option<String> {
    let out = Command::new("rustc").arg("-vV").stderr(Stdio::null()).output().ok()?;
    String::from_utf8(out.stdout).ok()?.lines().find_map(|l| l.strip_prefix("host: ").map(str::to_string))
}

/// A running `cargo build` whose parent is this process (Linux `/proc`): its pid, and the crates
/// its `rustc` children compile now (`--crate-name`; a build script's run counts as its crate).
fn cargo_build() -> Option<(u32, Vec<String>)> {
    let me = std::process::id();
    let mut processes: Vec<(u32, String, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        if let Some((comm, ppid)) = parse_stat(&stat) {
            processes.push((pid, comm.to_string(), ppid));
        }
    }
    let cmdline = |pid: u32| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    // cargo is this process's child, or its grandchild through the cargo wrapper (this binary:
    // `quick_build`).
    let children: Vec<u32> = processes.iter().filter(|(_, _, ppid)| *ppid == me).map(|(pid, _, _)| *pid).collect();
    let cargo = processes
        .iter()
        .find(|(pid, comm, ppid)| {
            (*ppid == me || children.contains(ppid))
                && comm == "cargo"
                && cmdline(*pid).split(|&b| b == 0).any(|a| a == b"build")
        })?
        .0;
    let compiling = processes
        .iter()
        .filter(|(_, _, ppid)| *ppid == cargo)
        .filter_map(|(pid, comm, _)| {
            if comm.starts_with("build-script") {
                return Some(String::from("build script"));
            }
            crate_name(&cmdline(*pid))
        })
        .collect();
    Some((cargo, compiling))
}

/// What a crate being compiled is, in the words a user knows it by: the package's own name
/// (`candle-core`, not rustc's `candle_core`; `packages` are the graph's), and the kernel's
/// generated session library (`gpumem_deps_<hash>`, kernel/src/build/session_deps.rs) as what it
/// is to the user: the notebook's `:dep` crates, linked into one library.
fn user_words(crate_name: &str, packages: &[String]) -> String {
    if crate_name.starts_with(gpumem_nb::kernel::cells::SESSION_DEPS_PREFIX) {
        return "the notebook's :dep crates, into one library".to_string();
    }
    packages.iter().find(|p| p.replace('-', "_") == crate_name).cloned().unwrap_or_else(|| crate_name.to_string())
}

/// The `--crate-name` of a `rustc` command line (NUL-separated, as in `/proc/PID/cmdline`).
fn crate_name(cmdline: &[u8]) -> Option<String> {
    let mut args = cmdline.split(|&b| b == 0);
    args.by_ref().find(|a| *a == b"--crate-name")?;
    args.next().and_then(|n| std::str::from_utf8(n).ok()).map(str::to_string)
}

/// `comm` and the parent pid from a `/proc/PID/stat` line (`pid (comm) state ppid …`; `comm`
/// may itself hold spaces and parentheses, so it ends at the last `)`).
fn parse_stat(stat: &str) -> Option<(&str, u32)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    let _state = rest.next()?;
    Some((comm, rest.next()?.parse().ok()?))
}

/// The crate in `dir`'s name, and package name → number of versions for every package it builds
/// on `host`: `cargo tree` over normal and build dependencies, which resolves features and
/// platforms as the build does (the crate itself not counted).
fn cargo_tree_packages(dir: &Path, host: Option<&str>) -> Option<(String, HashMap<String, usize>)> {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["tree", "--offline", "-e", "normal,build", "--prefix", "none", "-f", "{p}"]).current_dir(dir);
    if let Some(h) = host {
        cmd.args(["--target", h]);
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().ok()?;
    let mut stdout = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut buf = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut buf).map(|_| buf)
    });
    // Bounded: a wedged cargo must not hold the live line.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(_)) | Err(_) => return None,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    tree_packages(&reader.join().ok()?.ok()?)
}

/// The root's name (the first line), and the other packages of `cargo tree --prefix none -f
/// {p}`'s output (`name vVERSION [(source)] [(*)]`, one a line, repeated where shared) by name,
/// with their number of versions.
fn tree_packages(tree: &str) -> Option<(String, HashMap<String, usize>)> {
    let mut lines = tree.lines().filter_map(|l| {
        let mut words = l.split_whitespace();
        Some((words.next()?, words.next()?.strip_prefix('v')?))
    });
    let (root, root_version) = lines.next()?;
    let mut seen = std::collections::HashSet::new();
    let mut out = HashMap::new();
    for (name, version) in lines {
        if (name, version) != (root, root_version) && seen.insert((name, version)) {
            *out.entry(name.to_string()).or_insert(0) += 1;
        }
    }
    Some((root.to_string(), out))
}

/// Package name → (how many built libraries, the newest one's time) in the crate's target
/// directory: for the target, and for the host (build scripts and proc macros are built there).
/// A library is built once cargo has written its fingerprint (`lib-<name>`).
fn built_libraries(crate_dir: &Path) -> HashMap<String, (usize, SystemTime)> {
    let target = crate_dir.join("target");
    let mut dirs = vec![target.join("debug").join(".fingerprint")];
    if let Ok(rd) = std::fs::read_dir(&target) {
        dirs.extend(rd.flatten().map(|e| e.path().join("debug").join(".fingerprint")));
    }
    let mut libs: HashMap<String, (usize, SystemTime)> = HashMap::new();
    for dir in dirs {
        for unit in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = unit.file_name();
            let Some((package, _hash)) = name.to_str().and_then(|n| n.rsplit_once('-')) else { continue };
            let written = std::fs::read_dir(unit.path())
                .into_iter()
                .flatten()
                .flatten()
                .filter(|f| f.file_name().to_str().is_some_and(|n| n.starts_with("lib-") && !n.ends_with(".timestamp")))
                .filter_map(|f| f.metadata().and_then(|m| m.modified()).ok())
                .max();
            if let Some(at) = written {
                let e = libs.entry(package.to_string()).or_insert((0, at));
                e.0 += 1;
                e.1 = e.1.max(at);
            }
        }
    }
    libs
}

/// How many of `graph`'s packages are built (a package built for the host and for the target
/// counts once per version).
fn count_built(graph: &HashMap<String, usize>, libs: &HashMap<String, (usize, SystemTime)>) -> usize {
    graph.iter().map(|(name, versions)| libs.get(name).map_or(0, |(n, _)| (*n).min(*versions))).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names() {
        assert_eq!(parse_stat("123 (cargo) S 77 123 77 0"), Some(("cargo", 77)));
        assert_eq!(parse_stat("9 (a) b (c)) R 1 2"), Some(("a) b (c)", 1)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(crate_name(b"rustc\0--crate-name\0serde_json\0--edition=2021"), Some("serde_json".into()));
        assert_eq!(crate_name(b"rustc\0-vV"), None);
    }

    #[test]
    fn the_graph_is_what_cargo_tree_lists() {
        let tree = "ctx v1.0.0 (/tmp/x)\na v0.1.0\nb v1.2.3\ncc v1.0.0\na v0.2.0\nb v1.2.3 (*)\n\
                    serde_derive v1.0.229 (proc-macro)\n";
        let (root, g) = tree_packages(tree).unwrap();
        assert_eq!(root, "ctx");
        assert_eq!(g.len(), 4, "{g:?}");
        assert_eq!((g["a"], g["b"], g["cc"], g["serde_derive"]), (2, 1, 1, 1));
        assert!(tree_packages("").is_none());
    }

    #[test]
    fn built_libraries_are_counted_once_per_version() {
        let d = tempfile::tempdir().unwrap();
        let fp = |triple: Option<&str>, unit: &str, file: &str| {
            let mut dir = d.path().join("target");
            if let Some(t) = triple {
                dir = dir.join(t);
            }
            let dir = dir.join("debug").join(".fingerprint").join(unit);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(file), "").unwrap();
        };
        let graph: HashMap<String, usize> = [("a".to_string(), 2), ("serde-json".into(), 1), ("cc".into(), 1)].into();
        assert_eq!(count_built(&graph, &built_libraries(d.path())), 0);
        fp(Some("x86_64-unknown-linux-gnu"), "a-0123456789abcdef", "lib-a");
        fp(Some("x86_64-unknown-linux-gnu"), "serde-json-00000000000000aa", "invoked.timestamp");
        assert_eq!(count_built(&graph, &built_libraries(d.path())), 1, "started is not built");
        fp(Some("x86_64-unknown-linux-gnu"), "serde-json-00000000000000aa", "lib-serde_json");
        fp(None, "serde-json-00000000000000bb", "lib-serde_json");
        assert_eq!(count_built(&graph, &built_libraries(d.path())), 2, "host and target copies are one package");
        fp(None, "a-fedcba9876543210", "lib-a.json");
        fp(None, "cc-1111111111111111", "build-script-build-script-build");
        assert_eq!(
            count_built(&graph, &built_libraries(d.path())),
            3,
            "a's two versions; cc's build script alone is not its lib"
        );
        let p = Progress {
            built: 3,
            total: Some(4),
            elapsed: Duration::from_millis(41_500),
            dependencies: true,
            compiling: vec!["gpumem-nb".into()],
        };
        assert_eq!(p.describe(), "compiling dependencies: 3 of 4 crates built · 41 s");
        assert!(p.building_dependencies());
        assert!(!Progress { dependencies: false, ..p.clone() }.building_dependencies());
        assert_eq!(Progress { built: 4, ..p.clone() }.describe(), "recompiling gpumem-nb · 41 s");
        assert_eq!(Progress { total: None, compiling: vec![], ..p }.describe(), "compiling · 41 s");
    }

    #[test]
    fn seconds_count_from_the_request_and_crates_are_named_as_users_know_them() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("Cargo.toml"), "[package]\nname = \"ctx\"\n").unwrap();
        let packages: HashMap<String, usize> = [("candle-core".to_string(), 1), ("gpumem-nb".into(), 1)].into();
        let mut w = Watch {
            crate_dir: d.path().to_path_buf(),
            host: None,
            build: None,
            graph: Some(Graph { manifest: "[package]\nname = \"ctx\"\n".into(), root: "ctx".into(), packages }),
        };
        // The request came 20 s before the build was first seen: the user has waited 20 s.
        let origin = Instant::now() - Duration::from_secs(20);
        let deps = format!("{}1a94d4f28b3ab5ee", gpumem_nb::kernel::cells::SESSION_DEPS_PREFIX);
        let p = w.observe(7, vec!["candle_core".into(), deps, "build script".into()], origin).unwrap();
        assert!(p.elapsed >= Duration::from_secs(20), "{:?}", p.elapsed);
        assert_eq!(
            p.compiling,
            ["build script", "candle-core", "the notebook's :dep crates, into one library"],
            "package names, never the generated crate's"
        );
        assert!(p.describe().ends_with(" · 20 s") || p.describe().ends_with(" · 21 s"), "{}", p.describe());
        // The same build a minute later, from the same origin; the cells' own crate is not a dependency.
        let later = w.observe(7, vec!["ctx".into()], origin - Duration::from_secs(60)).unwrap();
        assert!(later.elapsed >= Duration::from_secs(80));
        assert!(!later.building_dependencies(), "the cells' crate itself is being built");
        assert_eq!(user_words("serde_json", &[]), "serde_json", "a crate the graph does not list keeps its name");
    }

    #[test]
    fn a_successful_build_narrows_the_graph_to_what_it_built() {
        let d = tempfile::tempdir().unwrap();
        let lib = |unit: &str, file: &str| {
            let dir =
                d.path().join("target").join("x86_64-unknown-linux-gnu").join("debug").join(".fingerprint").join(unit);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(file), "").unwrap();
        };
        let packages: HashMap<String, usize> = [("a".to_string(), 1), ("errno".into(), 1)].into();
        let mut w = Watch {
            crate_dir: d.path().to_path_buf(),
            host: None,
            build: None,
            graph: Some(Graph { manifest: String::new(), root: "ctx".into(), packages: packages.clone() }),
        };
        let before = SystemTime::now() - Duration::from_secs(60);
        lib("a-0000000000000001", "lib-a");
        // The crate itself not built (a failed cell): nothing is concluded.
        w.settle(before);
        assert_eq!(w.graph.as_ref().unwrap().packages, packages);
        // Built, but before this build began: not this build's doing.
        lib("ctx-0000000000000002", "lib-ctx");
        w.settle(SystemTime::now() + Duration::from_secs(60));
        assert_eq!(w.graph.as_ref().unwrap().packages, packages);
        w.settle(before);
        assert_eq!(
            w.graph.as_ref().unwrap().packages,
            HashMap::from([("a".to_string(), 1)]),
            "errno was never built here"
        );
    }
}
