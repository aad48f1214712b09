// Copyright 2026 The gpumem-nb Authors (gpumem-kernel's patch of evcxr, see PATCHES.md §3).
//
// Licensed under the Apache License, Version 2.0 <LICENSE or
// https://www.apache.org/licenses/LICENSE-2.0> or the MIT license <LICENSE
// or https://opensource.org/licenses/MIT>, at your option. This file may not be
// copied, modified, or distributed except according to those terms.

//! Variables kept for their cell only.
//!
//! A top-level `let` whose value cannot be stored for later cells (it borrows another variable,
//! a temporary, or has a type that cannot be written) no longer fails its cell: the variable
//! lives to the end of its cell, its cell's other variables are stored as usual, and one line
//! says which variable, why, and how to keep it. A later cell that names it gets the same
//! explanation instead of a bare "cannot find value".

use crate::rust_analyzer::NotKept;
use ra_ap_syntax::SyntaxKind;
use ra_ap_syntax::SyntaxNode;
use ra_ap_syntax::ast;
use ra_ap_syntax::ast::AstNode;

/// A variable of a cell that is not stored after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CellOnly {
    /// Why, as a predicate of the variable's name: "borrows `data`".
    pub(crate) why: String,
    /// How to keep it: "write `let head = data[..3].to_vec();`".
    pub(crate) fix: Option<String>,
    /// Made so by the cell being evaluated (said under that cell).
    pub(crate) new: bool,
    /// Dropped before the cell's variables are stored (it borrows one of them, and may hold the
    /// borrow until it is dropped: a guard).
    pub(crate) drop: bool,
}

/// A variable kept for its cell only, as the cell's outputs tell it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellOnlyVariable {
    /// The variable.
    pub name: String,
    /// One line: the variable, why, and how to keep it.
    pub line: String,
}

/// Why a variable is kept for its cell only.
pub(crate) enum Why<'a> {
    /// rust-analyzer's reason.
    Analysis(&'a NotKept),
    /// A borrow-check error at its store line: it borrows `borrowed` (None: a temporary).
    Borrows(Option<String>),
    /// rustc refused the type we wrote for it (its message).
    TypeRefused(String),
}

impl CellOnly {
    /// `name` made a cell-only variable for `why`; `init` is the text of its `let`'s initializer
    /// and `ty` the type we had for it, when known.
    pub(crate) fn new(name: &str, why: Why<'_>, init: Option<&str>, ty: Option<&str>) -> CellOnly {
        let give_type = || Some(format!("give it a type: `let {name}: Type = …;`"));
        let (why, fix, drop) = match why {
            Why::Analysis(NotKept::Unknown) => (
                "has a type rust-analyzer could not infer".to_owned(),
                give_type(),
                false,
            ),
            Why::Analysis(NotKept::Unnameable { shown, why }) => (
                format!("has a type that cannot be named (`{shown}`: {why})"),
                None,
                false,
            ),
            Why::Analysis(NotKept::ClosureBorrows { local }) => (
                format!("borrows `{local}`"),
                init.map(|c| format!("write `let {name} = move {};`", c.trim())),
                false,
            ),
            // Not dropped by a line of ours: its borrow then ends where the cell last uses it
            // (an explicit drop would hold it to the cell's end, and a later line of the cell
            // that uses the borrowed variable would fail, as cudarc's launch builder did). A
            // value that holds its borrow until it is dropped (a guard) says so at the stores,
            // and gets the drop then.
            Why::Borrows(Some(borrowed)) => (
                format!("borrows `{borrowed}`"),
                owned_fix(name, init, ty),
                false,
            ),
            Why::Borrows(None) => (
                "borrows a temporary value".to_owned(),
                Some("bind that value to a variable of its own first".to_owned()),
                false,
            ),
            Why::TypeRefused(message) => {
                let ty = ty.map(|t| format!(" `{t}`")).unwrap_or_default();
                (
                    format!("has a type{ty} that does not compile here ({message})"),
                    give_type(),
                    false,
                )
            }
        };
        CellOnly {
            why,
            fix,
            new: true,
            drop,
        }
    }

    /// The line under the cell that made it.
    pub(crate) fn line(&self, name: &str) -> String {
        match &self.fix {
            Some(fix) => format!("`{name}` {}: kept for this cell only; {fix}", self.why),
            None => format!("`{name}` {}: kept for this cell only", self.why),
        }
    }

    /// What a later cell that names it is told, after rustc's "cannot find value".
    pub(crate) fn explanation(&self, name: &str) -> String {
        match &self.fix {
            Some(fix) => format!(
                ": `{name}` {}, so it was kept for its cell only; {fix} there",
                self.why
            ),
            None => format!(": `{name}` {}, so it was kept for its cell only", self.why),
        }
    }
}

/// How to keep a variable that borrows another, where its `let` says: own the data
/// (`&data[..3]` → `data[..3].to_vec()`), collect an iterator; a guard or a builder is used where
/// it is made (no fix: the line says it lives to the cell's end).
fn owned_fix(name: &str, init: Option<&str>, ty: Option<&str>) -> Option<String> {
    let init = init.map(str::trim);
    if let Some(inner) = init
        .and_then(|i| i.strip_prefix('&'))
        .filter(|i| !i.starts_with("mut "))
    {
        let inner = inner.trim();
        let owned = match ty.map(str::trim) {
            Some(t) if t.starts_with("&str") || t.starts_with("&'static str") => "to_string()",
            Some(t) if t.starts_with("&[") || t.starts_with("&mut [") => "to_vec()",
            _ => "clone()",
        };
        return Some(format!("write `let {name} = {inner}.{owned};`"));
    }
    if init.is_some_and(|i| i.contains(".iter()") || i.contains(".chars()")) {
        return Some(
            "collect it (`.collect::<Vec<_>>()`) or iterate an owned value (`.into_iter()`)"
                .to_owned(),
        );
    }
    None
}

/// The first name in backticks of a rustc message (`` `data` does not live long enough``).
pub(crate) fn first_backticked(message: &str) -> Option<String> {
    let rest = message.split_once('`')?.1;
    let name = rest.split_once('`')?.0;
    (!name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_'))
        .then(|| name.to_owned())
}

/// rustc's borrow-check errors: a variable among their spans that is not the primary one is the
/// borrower (the primary store line is the borrowed variable being moved into the store).
pub(crate) fn is_borrow_error(code: Option<&str>) -> bool {
    matches!(
        code,
        Some(
            "E0597"
                | "E0505"
                | "E0502"
                | "E0499"
                | "E0506"
                | "E0716"
                | "E0373"
                | "E0521"
                | "E0713"
                | "E0515"
        )
    )
}

/// Whether a top-level statement of a cell uses `?` on the cell's own behalf (not inside a
/// closure, a function or an async block of its own): the cell's code then runs in a function
/// that returns a `Result`, from its first compile.
pub(crate) fn uses_question_mark(node: &SyntaxNode) -> bool {
    if ast::Item::can_cast(node.kind()) {
        return false;
    }
    node.descendants()
        .filter(|d| d.kind() == SyntaxKind::TRY_EXPR)
        .any(|t| {
            !t.ancestors().take_while(|a| a != node).any(|a| {
                matches!(a.kind(), SyntaxKind::CLOSURE_EXPR | SyntaxKind::FN)
                    || ast::BlockExpr::cast(a).is_some_and(|b| {
                        b.async_token().is_some() || b.try_block_modifier().is_some()
                    })
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_say_the_variable_why_and_the_fix() {
        let c = CellOnly::new(
            "head",
            Why::Borrows(Some("data".into())),
            Some("&data[..3]"),
            Some("&[u32]"),
        );
        assert_eq!(
            c.line("head"),
            "`head` borrows `data`: kept for this cell only; write `let head = data[..3].to_vec();`"
        );
        assert!(!c.drop);
        assert_eq!(
            c.explanation("head"),
            ": `head` borrows `data`, so it was kept for its cell only; write `let head = \
             data[..3].to_vec();` there"
        );
        let s = CellOnly::new(
            "s",
            Why::Borrows(Some("text".into())),
            Some("&text[1..]"),
            Some("&str"),
        );
        assert!(
            s.line("s")
                .ends_with("write `let s = text[1..].to_string();`"),
            "{}",
            s.line("s")
        );
        let f = CellOnly::new(
            "f",
            Why::Analysis(&NotKept::ClosureBorrows {
                local: "scale".into(),
            }),
            Some("|x: u64| x * scale"),
            None,
        );
        assert_eq!(
            f.line("f"),
            "`f` borrows `scale`: kept for this cell only; write `let f = move |x: u64| x * scale;`"
        );
        let it = CellOnly::new(
            "it",
            Why::Borrows(Some("v".into())),
            Some("v.iter().map(|x| x * 2)"),
            None,
        );
        assert!(it.line("it").contains(".into_iter()"), "{}", it.line("it"));
        let u = CellOnly::new("l1", Why::Analysis(&NotKept::Unknown), None, None);
        assert_eq!(
            u.line("l1"),
            "`l1` has a type rust-analyzer could not infer: kept for this cell only; give it a type: \
             `let l1: Type = …;`"
        );
    }

    #[test]
    fn names_and_codes() {
        assert_eq!(
            first_backticked("`data` does not live long enough").as_deref(),
            Some("data")
        );
        assert_eq!(
            first_backticked("cannot move out of `data` because it is borrowed").as_deref(),
            Some("data")
        );
        assert_eq!(
            first_backticked("temporary value dropped while borrowed"),
            None
        );
        assert!(is_borrow_error(Some("E0597")) && !is_borrow_error(Some("E0308")));
    }

    fn statement(code: &str) -> SyntaxNode {
        let parsed = ast::SourceFile::parse(
            &format!("fn f() {{ {code} }}"),
            crate::rust_analyzer::EDITION,
        );
        let f = parsed
            .tree()
            .syntax()
            .descendants()
            .find_map(ast::StmtList::cast)
            .unwrap();
        f.statements()
            .next()
            .map(|s| s.syntax().clone())
            .or_else(|| f.tail_expr().map(|e| e.syntax().clone()))
            .unwrap()
    }

    #[test]
    fn question_marks_of_the_cell_itself() {
        assert!(uses_question_mark(&statement(
            "let l1 = linear(4, 3, vb.pp(\"l1\"))?;"
        )));
        assert!(uses_question_mark(&statement("foo()?.bar()")));
        assert!(!uses_question_mark(&statement(
            "let f = |t: &Tensor| t.sqr()?.mean_all();"
        )));
        assert!(!uses_question_mark(&statement(
            "let a = async { x.await? };"
        )));
        assert!(!uses_question_mark(&statement("let n = 1 + 1;")));
    }
}
