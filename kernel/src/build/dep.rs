//! `:dep gpumem-nb` in gpumem-kernel: the crate the kernel was built with.
//!
//! The kernel and the crate in the child speak one control protocol, so the crate a notebook
//! loads should be the one the kernel was built with. A bare `:dep gpumem-nb` (and one whose
//! version requirement this build satisfies, with or without features) is rewritten, before
//! evcxr sees it, to that crate: its source directory when the kernel was built from a checkout
//! that is still there, otherwise the exact version from the registry. A requirement this build
//! does not satisfy is refused with one line naming both versions. A `path`, `git` or
//! `registry` source is the user's explicit choice and is left alone.

use std::path::{Path, PathBuf};

/// The crate's name in `:dep` lines.
pub const CRATE: &str = "gpumem-nb";

/// The gpumem-nb this kernel was built with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Own {
    /// Its version.
    pub version: String,
    /// Its source directory, when that is still a gpumem-nb of this version.
    pub source: Option<PathBuf>,
}

impl Own {
    /// This build's gpumem-nb: the version it was compiled against, and its source: the crate
    /// installed beside the executable (a wheel's `share/gpumem-kernel/crates/gpumem-nb-VERSION`,
    /// [`installed_source`]) when it is there, else the checkout next to the kernel's own
    /// sources when it holds that version.
    pub fn of_this_build() -> Own {
        let version = gpumem_nb::VERSION.to_string();
        let exe = std::env::current_exe().ok().map(|e| e.canonicalize().unwrap_or(e));
        let installed = exe.as_deref().and_then(|e| installed_source(e, &version));
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf);
        let source = installed.into_iter().chain(checkout).find(|dir| source_version(dir).as_deref() == Some(&version));
        Own { version, source: source.map(|d| d.canonicalize().unwrap_or(d)) }
    }

    /// The dependency as evcxr should see it, with `extra` (features and the like) kept.
    fn spec(&self, extra: &toml::Table) -> String {
        let mut parts = vec![match &self.source {
            Some(dir) => format!("path = {}", toml::Value::String(dir.to_string_lossy().into_owned())),
            None => format!("version = {}", toml::Value::String(format!("={}", self.version))),
        }];
        parts.extend(extra.iter().map(|(k, v)| format!("{k} = {v}")));
        format!("{{ {} }}", parts.join(", "))
    }
}

/// Where an installed kernel keeps its gpumem-nb: `PREFIX/share/gpumem-kernel/crates/
/// gpumem-nb-VERSION` for the executable `PREFIX/bin/gpumem-kernel` (the wheel puts the packaged
/// crate there, so notebook cells build the crate the kernel speaks to without a checkout or a
/// registry).
pub fn installed_source(exe: &Path, version: &str) -> Option<PathBuf> {
    let prefix = exe.parent()?.parent()?;
    Some(prefix.join("share").join("gpumem-kernel").join("crates").join(format!("{CRATE}-{version}")))
}

/// The version of the gpumem-nb package in `dir`, if `dir/Cargo.toml` is one.
fn source_version(dir: &Path) -> Option<String> {
    let doc: toml::Table = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?.parse().ok()?;
    let package = doc.get("package")?.as_table()?;
    (package.get("name")?.as_str()? == CRATE).then_some(())?;
    package.get("version")?.as_str().map(str::to_string)
}

/// `code` with its `:dep gpumem-nb` lines resolved to `own`; an error line for a version
/// requirement `own` does not satisfy. Other lines are untouched.
pub fn resolve(code: &str, own: &Own) -> Result<String, String> {
    let mut out = String::with_capacity(code.len());
    for line in code.split_inclusive('\n') {
        let body = line.trim_end_matches(['\n', '\r']);
        match rewrite_line(body.trim(), own)? {
            Some(new) => {
                let indent = &body[..body.len() - body.trim_start().len()];
                out.push_str(indent);
                out.push_str(&new);
                out.push_str(&line[body.len()..]);
            }
            None => out.push_str(line),
        }
    }
    Ok(out)
}

/// Whether a `:dep` line of `code` names gpumem-nb (whatever its source): the notebook depends
/// on the crate, which loads in the child at its first use.
pub fn names_own(code: &str) -> bool {
    code.lines().any(|l| {
        l.trim()
            .strip_prefix(":dep")
            .filter(|a| a.starts_with(char::is_whitespace))
            .is_some_and(|a| a.split('=').next().is_some_and(|n| n.trim() == CRATE))
    })
}

/// The replacement of one `:dep` line, `None` to keep it.
fn rewrite_line(line: &str, own: &Own) -> Result<Option<String>, String> {
    let Some(args) = line.strip_prefix(":dep").filter(|a| a.starts_with(char::is_whitespace)) else {
        return Ok(None);
    };
    let args = args.trim();
    // evcxr's own split: `name`, or `name = config`.
    let (name, config) = match args.split_once('=') {
        Some((n, c)) => (n.trim(), Some(c.trim())),
        None => (args, None),
    };
    if name != CRATE {
        return Ok(None);
    }
    let Some(config) = config else {
        return Ok(Some(format!(":dep {CRATE} = {}", own.spec(&toml::Table::new()))));
    };
    // Not TOML: evcxr and cargo say what is wrong with it.
    let Ok(doc) = format!("dep = {config}").parse::<toml::Table>() else { return Ok(None) };
    let (requirement, extra) = match doc.get("dep") {
        Some(toml::Value::String(req)) => (Some(req.clone()), toml::Table::new()),
        Some(toml::Value::Table(t)) => {
            if ["path", "git", "registry", "registry-index"].iter().any(|k| t.contains_key(*k)) {
                return Ok(None);
            }
            let mut extra = t.clone();
            let req = match extra.remove("version") {
                Some(toml::Value::String(r)) => Some(r),
                Some(_) => return Ok(None),
                None => None,
            };
            (req, extra)
        }
        _ => return Ok(None),
    };
    if let Some(req) = requirement {
        check_version(&req, &own.version)?;
    }
    Ok(Some(format!(":dep {CRATE} = {}", own.spec(&extra))))
}

/// Whether `version` satisfies the cargo requirement `req` (a bare `0.1` means `^0.1`, as in
/// Cargo.toml); the refusal names both.
fn check_version(req: &str, version: &str) -> Result<(), String> {
    let parsed = semver::VersionReq::parse(req.trim())
        .map_err(|e| format!(":dep {CRATE} = \"{req}\": not a version requirement ({e})"))?;
    let own = semver::Version::parse(version).map_err(|e| format!("this kernel's {CRATE} version {version}: {e}"))?;
    if parsed.matches(&own) {
        Ok(())
    } else {
        Err(format!(
            ":dep {CRATE} = \"{req}\" asks for a version this kernel was not built with: it was built with \
             {CRATE} {version} (the kernel and the crate must match; write `:dep {CRATE}` to load that one)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(source: Option<&str>) -> Own {
        Own { version: "0.1.0".into(), source: source.map(PathBuf::from) }
    }

    #[test]
    fn bare_and_matching_deps_become_the_kernels_own() {
        let src = own(Some("/src/gpumem-nb"));
        assert_eq!(resolve(":dep gpumem-nb", &src).unwrap(), ":dep gpumem-nb = { path = \"/src/gpumem-nb\" }");
        assert_eq!(
            resolve("  :dep gpumem-nb = \"0.1\"\nlet x = 1;\n", &src).unwrap(),
            "  :dep gpumem-nb = { path = \"/src/gpumem-nb\" }\nlet x = 1;\n"
        );
        let with_features = resolve(":dep gpumem-nb = { version = \"0.1.0\", features = [\"cublas\"] }\r\n", &src);
        assert_eq!(
            with_features.unwrap(),
            ":dep gpumem-nb = { path = \"/src/gpumem-nb\", features = [\"cublas\"] }\r\n"
        );
        assert_eq!(
            resolve(":dep gpumem-nb = { features = [\"nvrtc\"], default-features = false }", &own(None)).unwrap(),
            ":dep gpumem-nb = { version = \"=0.1.0\", default-features = false, features = [\"nvrtc\"] }"
        );
    }

    #[test]
    fn a_dep_on_the_crate_is_seen_whatever_its_source() {
        assert!(names_own(":dep gpumem-nb"));
        assert!(names_own("let x = 1;\n  :dep gpumem-nb = { path = \"/x\" }"));
        assert!(!names_own(":dep gpumem-nb-extra = \"1\""));
        assert!(!names_own("// :dep gpumem-nb"));
    }

    #[test]
    fn other_lines_and_explicit_sources_are_left_alone() {
        let src = own(Some("/src"));
        for code in [
            ":dep gpumem-nb = { path = \"..\" }",
            ":dep gpumem-nb = { git = \"https://example.org/g.git\" }",
            ":dep gpumem-nbx",
            ":dep candle-core = \"0.11\"",
            ":depgpumem-nb",
            "// :dep gpumem-nb",
            "let s = \":dep gpumem-nb\";",
            ":dep gpumem-nb = { not toml",
        ] {
            assert_eq!(resolve(code, &src).unwrap(), code, "{code}");
        }
    }

    #[test]
    fn a_version_this_build_does_not_satisfy_is_one_line_naming_both() {
        let e = resolve(":dep gpumem-nb = \"0.2\"", &own(Some("/src"))).unwrap_err();
        assert!(!e.contains('\n'));
        assert!(e.contains("\"0.2\"") && e.contains("gpumem-nb 0.1.0"), "{e}");
        let e = resolve(":dep gpumem-nb = { version = \"=0.1.1\" }", &own(None)).unwrap_err();
        assert!(e.contains("=0.1.1") && e.contains("0.1.0"), "{e}");
        let e = resolve(":dep gpumem-nb = \"one\"", &own(None)).unwrap_err();
        assert!(e.contains("not a version requirement"), "{e}");
    }

    #[test]
    fn an_installed_kernel_finds_its_crate_beside_it() {
        let p = installed_source(Path::new("/venv/bin/gpumem-kernel"), "0.1.0").unwrap();
        assert_eq!(p, Path::new("/venv/share/gpumem-kernel/crates/gpumem-nb-0.1.0"));
        assert_eq!(installed_source(Path::new("gpumem-kernel"), "0.1.0"), None);
        // Only a gpumem-nb of that version counts as one.
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("Cargo.toml"), "[package]\nname = \"gpumem-nb\"\nversion = \"0.1.0\"\n").unwrap();
        assert_eq!(source_version(d.path()).as_deref(), Some("0.1.0"));
        std::fs::write(d.path().join("Cargo.toml"), "[package]\nname = \"other\"\nversion = \"0.1.0\"\n").unwrap();
        assert_eq!(source_version(d.path()), None);
    }

    #[test]
    fn this_build_is_the_checkout_it_was_built_from() {
        let o = Own::of_this_build();
        assert_eq!(o.version, gpumem_nb::VERSION);
        let dir = o.source.expect("built from the repository");
        assert_eq!(source_version(&dir).as_deref(), Some(gpumem_nb::VERSION));
    }
}
