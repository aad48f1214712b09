//! The layer lists are true. Each "house" (the crate in `src/lib.rs`, the notebook room in
//! `src/notebook/mod.rs`, gpumem-kernel in `kernel/src/lib.rs` and each of its rooms' `mod.rs`)
//! lists its units in layers (`//! N. `a`, `b` — …`); every `crate::` / `super::` path in
//! non-test code of a unit names itself or a unit on an earlier line, so no unit imports one
//! above it and no two import each other. No path goes through the crate root (a name the root
//! only re-exports). HOW_IT_WORKS.md names every source file, and every file it names exists.
//! Reads the sources; runs nothing of the crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Layer of each unit, from the `//! N. …` list of a root file: the names in backticks before
/// " — " (an item may wrap onto the next `//!` lines).
fn layers(root: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut open: Option<(usize, String)> = None;
    for line in root.lines() {
        let Some(rest) = line.strip_prefix("//! ") else {
            open = None;
            continue;
        };
        let numbered = rest.split_once(". ").and_then(|(num, rest)| Some((num.parse::<usize>().ok()?, rest)));
        let (n, head) = match (numbered, &mut open) {
            (Some((n, rest)), _) => (n, rest.to_string()),
            (None, Some((n, head))) if rest.starts_with("  ") => (*n, format!("{head} {}", rest.trim())),
            _ => {
                open = None;
                continue;
            }
        };
        match head.split_once(" — ") {
            Some((names, _)) => {
                for name in names.split('`').skip(1).step_by(2) {
                    out.insert(name.to_string(), n);
                }
                open = None;
            }
            None => open = Some((n, head)),
        }
    }
    out
}

/// Non-test code of a file: without `#[cfg(test)] mod tests { … }` at its end, and without
/// comments.
fn code(text: &str) -> String {
    let body = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    body.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// A source file's module path inside its crate (`src/notebook/report/line.rs` →
/// `notebook::report::line`; a `mod.rs` is its folder).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// Every module path a file's code names through `crate::` or `super::` (absolute, from the
/// crate root), with groups (`crate::{a::X, b}`) taken item by item.
fn imports(here: &[String], text: &str) -> Vec<Vec<String>> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let starts_word =
            i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':');
        let (mut base, mut tail) = if starts_word && rest.starts_with("crate::") {
            (Vec::new(), &rest[7..])
        } else if starts_word && rest.starts_with("super::") {
            (here[..here.len().saturating_sub(1)].to_vec(), &rest[7..])
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        while let Some(t) = tail.strip_prefix("super::") {
            base.pop();
            tail = t;
        }
        let items: Vec<&str> = match tail.strip_prefix('{') {
            Some(g) => {
                let mut depth = 0;
                let end = g
                    .char_indices()
                    .find(|&(_, c)| {
                        match c {
                            '{' => depth += 1,
                            '}' if depth == 0 => return true,
                            '}' => depth -= 1,
                            _ => {}
                        }
                        false
                    })
                    .map_or(g.len(), |(j, _)| j);
                g[..end].split(',').collect()
            }
            None => vec![tail],
        };
        for item in items {
            let mut path = base.clone();
            for seg in item.trim().split("::") {
                let s = ident(seg);
                if s.is_empty() || s == "self" {
                    break;
                }
                path.push(s);
                if seg.len() != ident(seg).len() {
                    break;
                }
            }
            if path.len() > base.len() {
                out.push(path);
            }
        }
        i += 7;
    }
    out
}

/// A house: a root file with a layer list and the folder whose children are its units.
struct House {
    name: &'static str,
    /// The crate's `src/`.
    src: PathBuf,
    /// The house's module path inside the crate (empty: the crate itself).
    at: Vec<String>,
}

/// Imports against a house's layer order (and paths that resolve to none of its units), one
/// line each. `files` are the crate's sources with their text.
fn check_house(house: &House, files: &[(PathBuf, String)]) -> Vec<String> {
    let folder = house.at.iter().fold(house.src.clone(), |p, s| p.join(s));
    let root_file = if house.at.is_empty() { "lib.rs" } else { "mod.rs" };
    let root_text = files
        .iter()
        .find(|(p, _)| *p == folder.join(root_file))
        .map(|(_, t)| t.clone())
        .unwrap_or_else(|| panic!("{}: no {root_file}", house.name));
    let layer = layers(&root_text);
    assert!(!layer.is_empty(), "{}: {root_file} has no layer list", house.name);
    let mut bad = Vec::new();
    let mut units = BTreeSet::new();
    for (file, text) in files {
        let here = module_path(&house.src, file);
        if !here.starts_with(&house.at) || here.len() == house.at.len() {
            continue; // not in this house, or its root file
        }
        let unit = here[house.at.len()].clone();
        if unit == "bin" || unit == "main" || file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        units.insert(unit.clone());
        for target in imports(&here, &code(text)) {
            if !target.starts_with(&house.at) || target.len() == house.at.len() {
                continue;
            }
            let to_unit = &target[house.at.len()];
            if *to_unit == unit {
                continue;
            }
            let (Some(&from), Some(&to)) = (layer.get(&unit), layer.get(to_unit)) else {
                bad.push(format!(
                    "{}: {} uses {} ({to_unit} is not a unit of {}'s layer list)",
                    file.display(),
                    unit,
                    target.join("::"),
                    house.name
                ));
                continue;
            };
            if to >= from {
                bad.push(format!(
                    "{}: {unit} (layer {from} of {}) uses {} ({to_unit}, layer {to})",
                    file.display(),
                    house.name,
                    target.join("::")
                ));
            }
        }
    }
    for u in &units {
        if !layer.contains_key(u) {
            bad.push(format!("{}: {u} is not in its layer list", house.name));
        }
    }
    bad
}

fn sources(src: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    files.into_iter().map(|f| (f.clone(), std::fs::read_to_string(&f).unwrap())).collect()
}

fn houses() -> Vec<(House, Vec<(PathBuf, String)>)> {
    let lib = repo().join("src");
    let kernel = repo().join("kernel/src");
    let lib_files = sources(&lib);
    let kernel_files = sources(&kernel);
    let at = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        (House { name: "gpumem-nb", src: lib.clone(), at: vec![] }, lib_files.clone()),
        (House { name: "gpumem-nb's notebook", src: lib, at: at(&["notebook"]) }, lib_files),
        (House { name: "gpumem-kernel", src: kernel.clone(), at: vec![] }, kernel_files.clone()),
        (House { name: "gpumem-kernel's session", src: kernel.clone(), at: at(&["session"]) }, kernel_files.clone()),
        (House { name: "gpumem-kernel's build", src: kernel.clone(), at: at(&["build"]) }, kernel_files.clone()),
        (House { name: "gpumem-kernel's cell", src: kernel.clone(), at: at(&["cell"]) }, kernel_files.clone()),
        (House { name: "gpumem-kernel's jupyter", src: kernel, at: at(&["jupyter"]) }, kernel_files),
    ]
}

#[test]
fn every_import_points_to_an_earlier_layer_in_every_house() {
    let mut bad = Vec::new();
    for (house, files) in houses() {
        bad.extend(check_house(&house, &files));
    }
    bad.sort();
    bad.dedup();
    assert!(bad.is_empty(), "imports against the layer lists:\n{}", bad.join("\n"));
}

#[test]
fn the_scan_sees_imports_and_a_bad_one_fails_it() {
    // The scan reads real paths: the crate has many, in every form.
    let (_, files) = houses().remove(0);
    let n: usize = files.iter().map(|(f, t)| imports(&module_path(&repo().join("src"), f), &code(t)).len()).sum();
    assert!(n > 300, "the scan found only {n} paths: is it reading the sources?");
    // Forms: a group, `super::` chains, a path ending in an item.
    let here = vec!["notebook".to_string(), "report".to_string(), "line".to_string()];
    let got = imports(&here, "use crate::{a::B, c};\nlet x = super::super::tracking::top(3);\nuse super::Span;");
    let want: Vec<Vec<String>> =
        [vec!["a", "B"], vec!["c"], vec!["notebook", "tracking", "top"], vec!["notebook", "report", "Span"]]
            .iter()
            .map(|v| v.iter().map(|s| s.to_string()).collect())
            .collect();
    assert_eq!(got, want);
    // A deliberate bad import in each house is caught: the notebook's registry (layer 2)
    // reaching up to its session (layer 7); the kernel's build room reaching into the running
    // side (a cell's live line), and its session reaching up to the engine; inside the build
    // room, the build directory (layer 1) reaching up to the session's dependencies (layer 3);
    // inside the cell room, the hooks (layer 3) reaching up to the engine (layer 5).
    let cases = [
        ("gpumem-nb", "units.rs", "use crate::allocator::Allocator;"),
        ("gpumem-nb's notebook", "registry.rs", "use crate::notebook::session::current;"),
        ("gpumem-kernel", "build/progress.rs", "use crate::cell::live::Sampler;"),
        ("gpumem-kernel", "session/control.rs", "use crate::cell::engine::Engine;"),
        ("gpumem-kernel's build", "build_dir.rs", "use crate::build::session_deps::SessionDeps;"),
        ("gpumem-kernel's cell", "hooks.rs", "use crate::cell::engine::Engine;"),
    ];
    let all = houses();
    for (name, unit, up) in cases {
        let (house, files) = all.iter().find(|(h, _)| h.name == name).unwrap();
        let mut files = files.clone();
        let folder = house.at.iter().fold(house.src.clone(), |p, s| p.join(s));
        assert!(check_house(house, &files).is_empty(), "{name}: clean before the bad import");
        let (_, text) = files.iter_mut().find(|(p, _)| *p == folder.join(unit)).unwrap();
        text.insert_str(0, &format!("{up}\n"));
        let bad = check_house(house, &files);
        assert!(bad.len() == 1 && bad[0].contains("layer"), "{name}, {unit}: {bad:?}");
    }
}

#[test]
fn no_path_goes_through_the_crate_root() {
    for (src, units) in [(repo().join("src"), "gpumem-nb"), (repo().join("kernel/src"), "gpumem-kernel")] {
        let files = sources(&src);
        let root = &files.iter().find(|(p, _)| *p == src.join("lib.rs")).unwrap().1;
        // What the root declares as modules (the only names `crate::X` may start with).
        let modules: BTreeSet<String> = root
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let l = l.strip_prefix("pub ").or_else(|| l.strip_prefix("pub(crate) ")).unwrap_or(l);
                let name = l.strip_prefix("mod ")?;
                Some(name.trim_end_matches([';', ' ', '{']).to_string())
            })
            .collect();
        assert!(modules.len() >= 4, "{units}: modules {modules:?}");
        let mut bad = Vec::new();
        for (file, text) in &files {
            if file.ends_with("lib.rs") || file.starts_with(src.join("bin")) {
                continue;
            }
            for path in imports(&module_path(&src, file), &code(text)) {
                if !modules.contains(&path[0]) {
                    bad.push(format!("{}: crate::{}", file.display(), path.join("::")));
                }
            }
        }
        bad.sort();
        bad.dedup();
        assert!(bad.is_empty(), "{units}: paths through the crate root:\n{}", bad.join("\n"));
    }
}

#[test]
fn the_root_holds_at_most_eight_files_and_no_file_is_long() {
    let src = repo().join("src");
    let root: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lib.rs")
        .collect();
    assert!(root.len() <= 8, "src/ root holds {} files besides lib.rs: {root:?}", root.len());
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    rust_files(&repo().join("kernel/src"), &mut files);
    for f in files {
        let n = std::fs::read_to_string(&f).unwrap().lines().count();
        assert!(n <= 900, "{} has {n} lines (at most 900)", f.display());
    }
}

#[test]
fn the_root_re_exports_at_most_thirty_names() {
    let lib = std::fs::read_to_string(repo().join("src/lib.rs")).unwrap();
    let flat: String = lib.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join(" ");
    let mut names = Vec::new();
    // Only the root's own `pub use` lines (not those inside its inline modules).
    let top: String = flat.split("pub mod blocks").next().unwrap().to_string();
    for stmt in top.split(';') {
        let Some(path) = stmt.trim().rsplit("pub use ").next().filter(|_| stmt.contains("pub use ")) else { continue };
        let group = path.rsplit("::").next().unwrap_or(path).trim_matches(|c| c == '{' || c == '}' || c == ' ');
        names.extend(group.split(',').map(|n| n.split(" as ").last().unwrap().trim().to_string()));
    }
    names.retain(|n| !n.is_empty());
    assert!(names.len() >= 10, "the scan found {names:?}");
    assert!(names.len() <= 30, "the root re-exports {} names: {names:?}", names.len());
}

#[test]
fn unsafe_code_is_denied_except_in_the_three_marked_modules() {
    let src = repo().join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    assert!(lib.contains("#![deny(unsafe_code)]"));
    let mut allowed = Vec::new();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.contains("allow(unsafe_code)") {
                let next = lines.get(i + 1).copied().unwrap_or("").trim();
                allowed.push(format!("{}: {next}", f.strip_prefix(&src).unwrap().display()));
            }
        }
    }
    allowed.sort();
    assert_eq!(
        allowed,
        ["device/mod.rs: pub mod cuda;", "notebook/mod.rs: pub(crate) mod anchor;", "record/unwind.rs: mod machine;"]
    );
}

/// HOW_IT_WORKS.md names every source file of both crates (under a `### `folder/`` heading, a
/// bullet "- `file.rs`: …"), and every file it names exists.
#[test]
fn how_it_works_names_every_room() {
    let doc = std::fs::read_to_string(repo().join("HOW_IT_WORKS.md")).unwrap();
    let mut named = BTreeSet::new();
    let mut folder: Option<String> = None;
    for line in doc.lines() {
        if let Some(h) = line.strip_prefix("### `") {
            folder = h.split('`').next().filter(|f| f.ends_with('/')).map(str::to_string);
        } else if line.starts_with("## ") {
            folder = None;
        } else if let (Some(dir), Some(item)) = (&folder, line.strip_prefix("- `")) {
            let name = item.split('`').next().unwrap();
            if name.ends_with(".rs") {
                let path = format!("{dir}{name}");
                assert!(named.insert(path.clone()), "HOW_IT_WORKS.md names {path} twice");
            }
        }
    }
    let mut files = Vec::new();
    rust_files(&repo().join("src"), &mut files);
    rust_files(&repo().join("kernel/src"), &mut files);
    let actual: BTreeSet<String> = files
        .iter()
        .map(|f| f.strip_prefix(repo()).unwrap().to_string_lossy().into_owned())
        .filter(|f| !f.ends_with("/tests.rs"))
        .collect();
    let missing: Vec<_> = actual.difference(&named).collect();
    let stale: Vec<_> = named.difference(&actual).collect();
    assert!(missing.is_empty(), "HOW_IT_WORKS.md does not name: {missing:?}");
    assert!(stale.is_empty(), "HOW_IT_WORKS.md names files that do not exist: {stale:?}");
}

/// The text of HOW_IT_WORKS.md's section under `### {title}`, up to the next heading.
fn how_it_works_section(title: &str) -> String {
    let doc = std::fs::read_to_string(repo().join("HOW_IT_WORKS.md")).unwrap();
    let start = doc.find(&format!("\n### {title}\n")).unwrap_or_else(|| panic!("HOW_IT_WORKS.md has no '### {title}'"));
    let body = &doc[start + title.len() + 6..];
    body[..body.find("\n#").unwrap_or(body.len())].to_string()
}

/// Every role `main` asks for before it reads its arguments is named in HOW_IT_WORKS.md's list of
/// roles (by `module::function`), in the order `main` asks; and the count of `unsafe` blocks in
/// `main.rs` is the one the page gives.
#[test]
fn how_it_works_names_every_role_of_main() {
    let main = std::fs::read_to_string(repo().join("kernel/src/main.rs")).unwrap();
    let body = &main[main.find("fn main()").unwrap()..];
    let body = &body[..body.find("let args").unwrap()];
    let calls: Vec<String> = code(body)
        .lines()
        .filter_map(|l| {
            let l = l.trim().strip_suffix("();")?;
            let parts: Vec<&str> = l.split("::").collect();
            Some(parts[parts.len().saturating_sub(2)..].join("::"))
        })
        .collect();
    assert!(calls.len() >= 5, "the scan found {calls:?} in main");
    let roles = how_it_works_section("One binary, six roles");
    let mut at = 0;
    for call in &calls {
        let found = roles[at..].find(&format!("`{call}`")).or_else(|| roles[at..].find(&format!("`{call}")));
        let Some(i) = found else {
            panic!("HOW_IT_WORKS.md's roles do not name `{call}` (or not in main's order): {calls:?}")
        };
        at += i;
    }
    let blocks = code(&main).matches("unsafe {").count();
    assert!(
        roles.contains(&format!("`main.rs` has {blocks} `unsafe` blocks")),
        "main.rs has {blocks} unsafe blocks; HOW_IT_WORKS.md says otherwise"
    );
    let lib = std::fs::read_to_string(repo().join("kernel/src/lib.rs")).unwrap();
    assert!(lib.contains("#![forbid(unsafe_code)]"));
}

/// The walk of one cell names files that exist, from the request to the history row.
#[test]
fn how_it_works_walks_a_cell_through_files_that_exist() {
    let walk = how_it_works_section("A cell's way through the kernel");
    let files: Vec<&str> =
        walk.split('`').skip(1).step_by(2).filter(|s| s.ends_with(".rs") && s.contains('/')).collect();
    assert!(files.len() >= 15, "the walk names only {files:?}");
    for f in &files {
        assert!(repo().join(f).is_file(), "HOW_IT_WORKS.md's walk names {f}, which does not exist");
    }
    for room in ["kernel/src/jupyter/", "kernel/src/cell/engine/", "kernel/src/build/", "kernel/src/session/"] {
        assert!(files.iter().any(|f| f.starts_with(room)), "the walk goes through no file of {room}");
    }
}
