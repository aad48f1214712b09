//! A cell's value shown in one compile instead of two.
//!
//! evcxr shows a cell's final expression by compiling `(expr).evcxr_display();` first and, when
//! that does not compile (any type without its own `evcxr_display`: `42`, a `Vec`, a `String`),
//! compiling the whole cell again with `format!("{:?}", &(expr))` (its "Fallback" phase): on the
//! development machine that second compile is 180–290 ms of a 500 ms cell (BENCHMARKS.md, "Small
//! cells"). gpumem-kernel defines, once per session in a cell of its own, a trait that gives every
//! `Debug` type an `evcxr_display` writing exactly what evcxr's fallback writes (the same
//! `text/plain` content, in evcxr's output format). A type's own `evcxr_display` (an inherent
//! method: gpumem-nb's tables, plotters' charts) still wins: Rust picks inherent methods before
//! trait methods. A type without `Debug` goes on to evcxr's fallback as before.
//!
//! The kernel follows evcxr's settings from the cells it runs: `:fmt X` (the trait formats with
//! X), `:types` (types shown: evcxr's own path, the trait then has no impl), `:clear` (items gone:
//! defined again). Settings it cannot follow (an evcxr `config.toml` or `init.evcxr` that sets a
//! format or types, `prelude.rs` with an `evcxr_display`, `:load_config` in a cell) leave the
//! value to evcxr alone for the session.

/// The trait's name (an item of the session, as a cell's own items are).
pub const TRAIT: &str = "GpumemKernelDebugDisplay";

/// How evcxr is set to show values, as far as the kernel follows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shown {
    /// `format!(FORMAT, value)` as `text/plain` (evcxr's fallback without `:types`).
    Format(String),
    /// evcxr's own path (`:types` on).
    Evcxr,
}

/// The session's display state.
#[derive(Debug)]
pub struct Display {
    /// Whether the kernel may follow evcxr's settings at all.
    on: bool,
    format: String,
    types: bool,
    /// What the defined trait does, when it is defined.
    defined: Option<Shown>,
}

impl Display {
    /// Off when evcxr's own configuration (`config_dir`) sets what the kernel cannot follow.
    pub fn new(config_dir: Option<&std::path::Path>) -> Display {
        let read = |name: &str| config_dir.and_then(|d| std::fs::read_to_string(d.join(name)).ok()).unwrap_or_default();
        let settings = format!("{}\n{}", read("config.toml"), read("init.evcxr"));
        let unfollowable = ["fmt", "types", "output_format", "display_types"].iter().any(|w| settings.contains(w))
            || read("prelude.rs").contains("evcxr_display");
        Display { on: !unfollowable, format: "{:?}".into(), types: false, defined: None }
    }

    /// Follows the evcxr commands of a cell that evcxr ran.
    pub fn follow(&mut self, code: &str) {
        for line in code.lines().map(str::trim) {
            let (cmd, arg) = line.split_once(char::is_whitespace).map_or((line, ""), |(c, a)| (c, a.trim()));
            match cmd {
                ":fmt" => self.format = if arg.is_empty() { "{:?}".into() } else { arg.to_string() },
                ":types" => self.types = !self.types,
                ":load_config" => self.on = false,
                ":clear" => self.defined = None,
                _ => {}
            }
        }
    }

    /// evcxr forgot the session's items (a restart that did not keep them).
    pub fn forget(&mut self) {
        self.defined = None;
    }

    /// The cell to run before a cell's code so that the trait does what evcxr's settings say;
    /// `None` when it already does (or the kernel leaves values to evcxr). `defined` is whether
    /// evcxr still has the trait among its items.
    pub fn cell(&self, defined: bool) -> Option<(Shown, String)> {
        if !self.on {
            return None;
        }
        let want = if self.types { Shown::Evcxr } else { Shown::Format(self.format.clone()) };
        if defined && self.defined.as_ref() == Some(&want) {
            return None;
        }
        Some((want.clone(), source(&want)))
    }

    /// `shown` is defined.
    pub fn defined(&mut self, shown: Shown) {
        self.defined = Some(shown);
    }

    /// The trait could not be defined (a format rustc refuses): evcxr alone from now on.
    pub fn refused(&mut self) {
        self.on = false;
    }
}

/// The trait and, for a format, its impl for every `Debug` type (one item for evcxr: the impl
/// follows the trait in the same cell, so a new definition replaces both).
pub fn source(shown: &Shown) -> String {
    let mut s = format!("#[doc(hidden)]\npub trait {TRAIT} {{\n    fn evcxr_display(&self);\n}}\n");
    if let Shown::Format(f) = shown {
        let f = f.replace('\\', "\\\\").replace('"', "\\\"");
        s.push_str(&format!(
            "impl<T: ::std::fmt::Debug + ?Sized> {TRAIT} for T {{\n    fn evcxr_display(&self) {{\n        \
             use ::std::io::Write;\n        let text = format!(\"{f}\", &self);\n        \
             let mut out = ::std::io::stdout().lock();\n        \
             let _ = out.write_all(b\"EVCXR_BEGIN_CONTENT text/plain\\n\");\n        \
             let _ = out.write_all(text.as_bytes());\n        \
             let _ = out.write_all(b\"\\nEVCXR_END_CONTENT\\n\");\n    }}\n}}\n"
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trait_follows_evcxr_s_settings() {
        let mut d = Display::new(None);
        let (shown, src) = d.cell(false).unwrap();
        assert_eq!(shown, Shown::Format("{:?}".into()));
        assert!(src.contains("impl<T: ::std::fmt::Debug + ?Sized> GpumemKernelDebugDisplay for T"), "{src}");
        assert!(src.contains("format!(\"{:?}\", &self)"), "{src}");
        d.defined(shown);
        assert_eq!(d.cell(true), None, "defined and unchanged");
        assert!(d.cell(false).is_some(), "gone from evcxr's items: again");
        d.follow(":fmt {:#?}\nlet x = 1;");
        let (shown, src) = d.cell(true).unwrap();
        assert_eq!(shown, Shown::Format("{:#?}".into()));
        assert!(src.contains("format!(\"{:#?}\", &self)"), "{src}");
        d.defined(shown);
        d.follow(":types");
        let (shown, src) = d.cell(true).unwrap();
        assert_eq!(shown, Shown::Evcxr);
        assert!(!src.contains("impl"), "types shown: evcxr's own path: {src}");
        d.defined(shown);
        d.follow(":types\n:fmt");
        assert_eq!(d.cell(true).unwrap().0, Shown::Format("{:?}".into()));
        d.follow(":load_config");
        assert_eq!(d.cell(false), None, "settings it cannot follow: evcxr alone");
    }

    #[test]
    fn evcxr_s_own_configuration_it_cannot_follow_turns_it_off() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Display::new(Some(dir.path())).cell(false).is_some());
        std::fs::write(dir.path().join("init.evcxr"), ":types\n").unwrap();
        assert_eq!(Display::new(Some(dir.path())).cell(false), None);
        std::fs::write(dir.path().join("init.evcxr"), ":dep rand\n").unwrap();
        std::fs::write(dir.path().join("prelude.rs"), "trait D { fn evcxr_display(&self); }").unwrap();
        assert_eq!(Display::new(Some(dir.path())).cell(false), None);
    }
}
