//! Notebook cells as the code that runs them: which line of which cell a line of evcxr's
//! generated `src/lib.rs` is.
//!
//! evcxr compiles every cell into a crate whose `src/lib.rs` it writes itself: the items the
//! notebook defined so far (functions, types, `use`s, each as the user wrote it), then the
//! cell's statements inside `run_user_code_N`, with evcxr's own code around them (variable
//! store, `catch_unwind`). Each item and statement is copied verbatim from its cell, starting
//! where it starts (possibly mid-line) and ending where the next one starts (evcxr 0.22,
//! `statement_splitter.rs`, `code_block.rs`). Commands (`:dep`), blank lines and comments
//! before the first statement are not copied, so a line of `lib.rs` is a line of a cell only
//! by its text.
//!
//! [`LineMap::build`] finds that text: each run of consecutive `lib.rs` lines that are
//! consecutive lines of one cell (the first and last may be part of a line) is mapped to that
//! cell, the newest cell winning when several hold the same text (a function redefined). A
//! lone line that carries no code of its own (`}`, `)`, `Ok(())`) is never mapped on its own.
//! Line numbers are 1-based on both sides: line 1 is the cell's first line as the user sees
//! it, `:dep` lines and comments included.
#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The name gpumem-kernel gives the shared library of a session's `:dep` crates
/// (`gpumem_deps_<hash>`, loaded by every cell): its code is the notebook's dependencies, read
/// by the namer as the cells' libraries are.
pub const SESSION_DEPS_PREFIX: &str = "gpumem_deps_";

/// Consecutive lines of `lib.rs` that are consecutive lines of one cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineRun {
    /// First `lib.rs` line (1-based).
    pub lib_line: u32,
    /// How many lines.
    pub len: u32,
    /// The cell (its execution count).
    pub cell: u64,
    /// The cell's line for `lib_line` (1-based).
    pub line: u32,
}

/// Where each mapped line of one generated `lib.rs` comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineMap {
    /// The runs, by `lib_line`.
    pub runs: Vec<LineRun>,
}

/// Whether a line carries code of its own (not only brackets, separators, `Ok(())`).
fn substantial(line: &str) -> bool {
    let t = line.trim().trim_end_matches([';', ',', ')', '}', ']', '{', '(', ' ']);
    t.len() >= 2 && t != "Ok(())" && t.chars().any(|c| c.is_alphanumeric())
}

/// Whether generated line `g` can be user line `u`: the same text, or (a statement that starts
/// or ends mid-line) its start or its end at a boundary between tokens.
fn fits(g: &str, u: &str) -> bool {
    let (g, u) = (g.trim(), u.trim());
    if g.is_empty() || u.is_empty() {
        return false;
    }
    if g == u {
        return true;
    }
    if g.len() >= u.len() {
        return false;
    }
    let boundary = |c: Option<char>| c.is_none_or(|c| c.is_whitespace() || matches!(c, ';' | '}' | '{' | ','));
    (u.ends_with(g) && boundary(u[..u.len() - g.len()].chars().last()))
        || (u.starts_with(g) && boundary(g.chars().last()))
}

/// A generated line is looked for among this many cells at most (the newest that hold it): a
/// line written in more cells than this (`drop(a);`, `}`) costs the same in a session of any
/// length.
const MAX_CANDIDATES: usize = 128;

/// Where a line is: (cell, 0-based line of the cell).
type At = (u64, u32);

/// The notebook's cells, kept with an index of their lines, so that building a [`LineMap`]
/// costs the generated file's length, not the session's: every line by its text, and every
/// part of a line that a statement boundary (after `;`, `{`, `}` or `,`) splits off, since
/// evcxr may start or end a statement there. Cells come and go one at a time, as a session
/// runs and its oldest cells are no longer kept.
#[derive(Clone, Debug, Default)]
pub struct CellIndex {
    cells: std::collections::BTreeMap<u64, Vec<String>>,
    exact: HashMap<String, Vec<At>>,
    heads: HashMap<String, Vec<At>>,
    tails: HashMap<String, Vec<At>>,
}

/// The parts a trimmed line splits into at each statement boundary: (the start up to and with
/// the boundary, the rest without its leading blanks).
fn splits(t: &str) -> impl Iterator<Item = (&str, &str)> {
    t.char_indices().filter(|(_, c)| matches!(c, ';' | '{' | '}' | ',')).filter_map(|(i, c)| {
        let tail = t[i + c.len_utf8()..].trim_start();
        (!tail.is_empty()).then(|| (&t[..i + c.len_utf8()], tail))
    })
}

impl CellIndex {
    /// An empty index.
    pub fn new() -> CellIndex {
        CellIndex::default()
    }

    /// How many cells it holds.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Whether it holds no cell.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// Adds cell `cell` (its execution count) with its code as the cell showed it, replacing
    /// an earlier code of the same cell.
    pub fn insert(&mut self, cell: u64, code: &str) {
        self.remove(cell);
        let lines: Vec<String> = code.lines().map(str::to_string).collect();
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim();
            if t.is_empty() {
                continue;
            }
            let at = (cell, i as u32);
            list(&mut self.exact, t, at);
            for (head, tail) in splits(t) {
                list(&mut self.heads, head, at);
                list(&mut self.tails, tail, at);
            }
        }
        self.cells.insert(cell, lines);
    }

    /// Removes cell `cell`, if held.
    pub fn remove(&mut self, cell: u64) {
        let Some(lines) = self.cells.remove(&cell) else { return };
        let unlist = |map: &mut HashMap<String, Vec<At>>, key: &str| {
            if let Some(v) = map.get_mut(key) {
                v.retain(|a| a.0 != cell);
                if v.is_empty() {
                    map.remove(key);
                }
            }
        };
        for l in &lines {
            let t = l.trim();
            unlist(&mut self.exact, t);
            for (head, tail) in splits(t) {
                unlist(&mut self.heads, head);
                unlist(&mut self.tails, tail);
            }
        }
    }

    /// Removes the oldest cell (the lowest execution count); false when empty.
    pub fn pop_oldest(&mut self) -> bool {
        match self.cells.keys().next().copied() {
            Some(cell) => {
                self.remove(cell);
                true
            }
            None => false,
        }
    }

    fn lines(&self, cell: u64) -> &[String] {
        self.cells.get(&cell).map_or(&[], Vec::as_slice)
    }

    /// Where generated line `g` can come from: the lines that hold its text, or else those it
    /// is the start or the end of (split at a statement boundary); newest cell first, at most
    /// [`MAX_CANDIDATES`] cells.
    fn candidates(&self, g: &str) -> Vec<At> {
        let t = g.trim();
        if t.is_empty() {
            return Vec::new();
        }
        let newest = |list: &[At], keep: &dyn Fn(At) -> bool| -> Vec<At> {
            let mut cells = 0;
            let mut last = None;
            let mut v = Vec::new();
            for &at in list.iter().rev().filter(|&&at| keep(at)) {
                if last != Some(at.0) {
                    last = Some(at.0);
                    cells += 1;
                    if cells > MAX_CANDIDATES {
                        break;
                    }
                }
                v.push(at);
            }
            v
        };
        let mut v = match self.exact.get(t) {
            Some(list) => newest(list, &|_| true),
            None => {
                let fit = |(c, i): At| fits(g, &self.lines(c)[i as usize]);
                let mut v = newest(self.heads.get(t).map_or(&[], Vec::as_slice), &fit);
                v.extend(newest(self.tails.get(t).map_or(&[], Vec::as_slice), &fit));
                v
            }
        };
        // Newest cell first, its lines in order (the first of equally long runs wins).
        v.sort_unstable_by_key(|&(c, i)| (std::cmp::Reverse(c), i));
        v.dedup();
        v
    }
}

/// Adds `at` to the list of `key`, which stays in (cell, line) order.
fn list(map: &mut HashMap<String, Vec<At>>, key: &str, at: At) {
    let v = map.entry(key.to_string()).or_default();
    let i = v.partition_point(|x| *x < at);
    v.insert(i, at);
}

impl LineMap {
    /// The map of one generated `lib.rs` over the notebook's cells so far (`(execution count,
    /// code)`, in any order; the code as the cell showed it, magic lines replaced by comments
    /// of the same lines).
    pub fn build(lib_rs: &str, cells: &[(u64, &str)]) -> LineMap {
        let mut index = CellIndex::new();
        for (n, c) in cells {
            index.insert(*n, c);
        }
        LineMap::build_indexed(lib_rs, &index)
    }

    /// [`LineMap::build`] over cells already indexed: what a session that keeps its cells
    /// uses, so that each generated file costs its own length.
    pub fn build_indexed(lib_rs: &str, cells: &CellIndex) -> LineMap {
        let genl: Vec<&str> = lib_rs.lines().collect();
        // How far a run starting with generated line `gi` at (cell, line) goes: the next
        // generated line is the cell's next line, or the rest of the same line (a statement
        // split mid-line), or a blank line inside the run.
        let run_len = |gi: usize, lines: &[String], li: usize| -> Vec<usize> {
            let mut user = vec![li];
            let (mut g, mut u) = (gi + 1, li);
            while g < genl.len() {
                let next = genl[g];
                let blank_in_both = next.trim().is_empty() && u + 1 < lines.len() && lines[u + 1].trim().is_empty();
                if blank_in_both || (u + 1 < lines.len() && fits(next, &lines[u + 1])) {
                    u += 1;
                } else if fits(next, &lines[u]) && lines[u].trim() != next.trim() {
                    // The rest of a line split between two statements.
                } else {
                    break;
                }
                user.push(u);
                g += 1;
            }
            user
        };
        let mut runs: Vec<LineRun> = Vec::new();
        let mut gi = 0;
        while gi < genl.len() {
            let mut best: Option<(u64, Vec<usize>)> = None;
            for (cell, li) in cells.candidates(genl[gi]) {
                let user = run_len(gi, cells.lines(cell), li as usize);
                if best.as_ref().is_none_or(|b| user.len() > b.1.len()) {
                    best = Some((cell, user));
                }
            }
            let Some((cell, user)) = best else {
                gi += 1;
                continue;
            };
            let len = user.len();
            let worth = len >= 2 && genl[gi..gi + len].iter().any(|l| substantial(l)) || substantial(genl[gi]);
            if !worth {
                gi += 1;
                continue;
            }
            // One run per stretch of consecutive user lines.
            let mut k = 0;
            while k < len {
                let mut j = k + 1;
                while j < len && user[j] == user[j - 1] + 1 {
                    j += 1;
                }
                if j - k == 1 || user[k..j].windows(2).all(|w| w[1] == w[0] + 1) {
                    runs.push(LineRun {
                        lib_line: (gi + k + 1) as u32,
                        len: (j - k) as u32,
                        cell,
                        line: (user[k] + 1) as u32,
                    });
                }
                k = j;
            }
            gi += len;
        }
        LineMap { runs }
    }

    /// The cell and line of `lib.rs` line `lib_line` (1-based), if it is a cell's.
    pub fn lookup(&self, lib_line: u32) -> Option<(u64, u32)> {
        let i = self.runs.partition_point(|r| r.lib_line <= lib_line);
        let r = self.runs.get(i.checked_sub(1)?)?;
        (lib_line < r.lib_line + r.len).then(|| (r.cell, r.line + (lib_line - r.lib_line)))
    }
}

/// The `N` of the `run_user_code_N` a generated `lib.rs` defines (what evcxr's child calls, and
/// what the cell's library exports).
pub fn run_number(lib_rs: &str) -> Option<u64> {
    let at = lib_rs.find("fn run_user_code_")? + "fn run_user_code_".len();
    let digits: String = lib_rs[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What evcxr 0.22 wrote for the cells below (abridged from a real `lib.rs`: the items, then
    /// the cell's statements in `run_user_code_3`).
    const LIB_RS: &str = "#![allow(unused_imports, unused_mut, dead_code)]
fn alloc48() -> gpumem_nb::mem::DriverAlloc {
    // the caller keeps it
    gpumem_nb::mem::driver_alloc_mib(48).unwrap()
}
#[unsafe(no_mangle)]
pub extern \"C\" fn run_user_code_3(
evcxr_variable_store: *mut u8) -> *mut u8 {
if std::panic::catch_unwind(||{
let a = alloc48();
let b = gpumem_nb::mem::driver_alloc_mib(40)?; let c = 1;
}).is_err() {
    println!(\"EVCXR_PANIC_NOTIFICATION\");
}
evcxr_variable_store
}
";

    #[test]
    fn lib_rs_lines_map_to_the_cells_that_wrote_them() {
        let cell2 = ":dep gpumem-nb = { path = \"..\" }\n// helpers\nfn alloc48() -> gpumem_nb::mem::DriverAlloc {\n    // the caller keeps it\n    gpumem_nb::mem::driver_alloc_mib(48).unwrap()\n}\n";
        let cell3 =
            "// two allocations\nlet a = alloc48();\nlet b = gpumem_nb::mem::driver_alloc_mib(40)?; let c = 1;\n";
        let map = LineMap::build(LIB_RS, &[(2, cell2), (3, cell3)]);
        // The function's body: cell 2, lines 3-6.
        assert_eq!(map.lookup(2), Some((2, 3)));
        assert_eq!(map.lookup(4), Some((2, 5)));
        assert_eq!(map.lookup(5), Some((2, 6)));
        // The statements: cell 3, lines 2 and 3 (the second holds two statements).
        assert_eq!(map.lookup(10), Some((3, 2)));
        assert_eq!(map.lookup(11), Some((3, 3)));
        // evcxr's own lines are nobody's.
        for l in [1, 6, 7, 8, 9, 12, 13, 14, 15, 16, 99] {
            assert_eq!(map.lookup(l), None, "line {l}");
        }
        assert_eq!(run_number(LIB_RS), Some(3));
    }

    #[test]
    fn the_newest_cell_wins_and_lone_brackets_are_not_mapped() {
        let lib = "fn f() {\n    work(1)\n}\nlet x = f();\n}\n";
        let old = "fn f() {\n    work(1)\n}\n";
        let new = "// again\nfn f() {\n    work(1)\n}\nlet x = f();\n";
        let map = LineMap::build(lib, &[(1, old), (4, new)]);
        assert_eq!(map.lookup(1), Some((4, 2)));
        assert_eq!(map.lookup(2), Some((4, 3)));
        assert_eq!(map.lookup(4), Some((4, 5)));
        assert_eq!(map.lookup(5), None, "a lone bracket after the run");
        // A statement split mid-line maps both parts to the same line.
        let map = LineMap::build("let a = 1; \nlet b = a + 1;\n", &[(7, "let a = 1; let b = a + 1;\n")]);
        assert_eq!((map.lookup(1), map.lookup(2)), (Some((7, 1)), Some((7, 1))));
    }

    #[test]
    fn an_index_kept_through_a_session_maps_as_one_built_at_once() {
        let cells = [
            (1, "fn f() {\n    work(1)\n}\n"),
            (2, "let a = f(); let b = g(2);\n"),
            (3, "// again\nfn f() {\n    work(1)\n}\nlet x = f();\n"),
            (4, "drop(a);\n"),
        ];
        let lib = "fn f() {\n    work(1)\n}\nlet a = f(); \nlet b = g(2);\ndrop(a);\n}\n";
        let fresh = LineMap::build(lib, &cells);
        // The same cells, arriving with others that come and go, one replaced.
        let mut index = CellIndex::new();
        index.insert(9, "let a = f(); let b = g(2);\nfn f() {\n");
        for (n, c) in cells {
            index.insert(n, if n == 3 { "stale" } else { c });
        }
        index.insert(3, cells[2].1);
        assert!(index.pop_oldest() && index.len() == 4);
        index.insert(1, cells[0].1);
        index.remove(9);
        assert_eq!(index.len(), 4);
        assert_eq!(LineMap::build_indexed(lib, &index), fresh);
        assert_eq!(fresh.lookup(1), Some((3, 2)), "the newest definition");
        assert_eq!((fresh.lookup(4), fresh.lookup(5)), (Some((2, 1)), Some((2, 1))), "split mid-line");
        assert_eq!(fresh.lookup(6), Some((4, 1)));
        index.remove(4);
        assert_eq!(LineMap::build_indexed(lib, &index).lookup(6), None, "a removed cell maps nothing");
    }

    #[test]
    fn a_line_written_in_many_cells_is_looked_for_in_the_newest() {
        let mut index = CellIndex::new();
        index.insert(1, "let d = take(2);\nkeep(d);\n");
        for n in 2..1000 {
            index.insert(n, "let d = take(2);\n");
        }
        // Only cell 1 has the two lines together, but 998 newer cells hold its first line.
        let map = LineMap::build_indexed("let d = take(2);\nkeep(d);\n", &index);
        assert_eq!(map.lookup(1), Some((999, 1)));
        assert_eq!(map.lookup(2), Some((1, 2)), "the second line is found on its own");
        let mut index = CellIndex::new();
        for n in 1..=MAX_CANDIDATES as u64 {
            index.insert(n, "let d = take(2);\n");
        }
        index.insert(0, "let d = take(2);\nkeep(d);\n");
        assert_eq!(
            LineMap::build_indexed("let d = take(2);\nkeep(d);\n", &index).lookup(1),
            Some((MAX_CANDIDATES as u64, 1))
        );
        index.pop_oldest();
        index.insert(MAX_CANDIDATES as u64 + 1, "let d = take(2);\nkeep(d);\n");
        assert_eq!(
            LineMap::build_indexed("let d = take(2);\nkeep(d);\n", &index).lookup(1),
            Some((MAX_CANDIDATES as u64 + 1, 1))
        );
    }
}
