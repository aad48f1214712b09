//! A backtrace as a notebook's user reads it: the notebook's own frames (a cell and its line, a
//! function an earlier cell defined), the dependencies' functions, and what std, evcxr, the
//! kernel and the error's own making add folded away; and where a backtrace sits in an error's
//! text (std's format, anyhow's `Stack backtrace:`, candle's `WithBacktrace`).

/// Whose a backtrace frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// std and core (panicking machinery, closures' call shims, the runtime's start).
    Std,
    /// evcxr's runtime and the kernel's `main`.
    Internal,
    /// The notebook's code (evcxr's generated crate).
    Cell,
    /// Any other crate (the cell's dependencies).
    Dep,
}

/// One frame: its function and where (`None` without line tables).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Frame {
    name: String,
    at: Option<String>,
}

fn frames(lines: &[String]) -> Vec<Frame> {
    let mut out: Vec<Frame> = Vec::new();
    for l in lines {
        let t = l.trim();
        if let Some(at) = t.strip_prefix("at ") {
            if let Some(f) = out.last_mut().filter(|f| f.at.is_none()) {
                f.at = Some(at.to_string());
            }
            continue;
        }
        let name = match t.split_once(": ") {
            Some((n, rest)) if n.bytes().all(|b| b.is_ascii_digit()) => rest,
            _ => t,
        };
        // `RUST_BACKTRACE=full` puts the address first: `0x55d4c1a2b3c4 - name`.
        let name = match name.split_once(" - ") {
            Some((ip, rest)) if ip.strip_prefix("0x").is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit())) => rest,
            _ => name,
        };
        if !name.is_empty() {
            out.push(Frame { name: name.to_string(), at: None });
        }
    }
    out
}

/// The cell crate's own file, as rustc names it in locations: `src/lib.rs:L:C`, or with the
/// build directory in front (`/…/evcxr/src/lib.rs:L:C`) since cells carry line tables.
fn cell_file_line(at: &str) -> Option<u32> {
    let rest = cell_relative(at)?.strip_prefix("src/lib.rs:")?;
    rest.split(':').next()?.parse().ok()
}

/// `at` relative to the cell crate (`src/lib.rs:…`) when it lies in it.
fn cell_relative(at: &str) -> Option<&str> {
    if at.starts_with("src/lib.rs:") {
        return Some(at);
    }
    let dir = std::env::var_os("EVCXR_TMPDIR")?;
    let dir = dir.to_str()?.trim_end_matches('/');
    at.strip_prefix(dir)?.strip_prefix('/').filter(|r| r.starts_with("src/lib.rs:"))
}

fn owner(f: &Frame) -> Owner {
    let at = f.at.as_deref().unwrap_or("");
    if cell_relative(at).is_some() || f.name.starts_with("run_user_code_") || f.name.starts_with("ctx::") {
        return Owner::Cell;
    }
    if at.contains("/evcxr-")
        || at.contains(concat!(env!("CARGO_MANIFEST_DIR"), "/"))
        || ["load_and_run", "handle_line", "run_loop", "runtime_hook", "main"].contains(&f.name.as_str())
        || f.name.starts_with("evcxr::")
        || f.name.starts_with("gpumem_kernel::")
    {
        return Owner::Internal;
    }
    const STD: [&str; 17] = [
        "__rustc::",
        "rust_begin_unwind",
        "__rust_begin_short_backtrace",
        "__rust_end_short_backtrace",
        "__rust_try",
        "std::",
        "core::",
        "alloc::",
        "<alloc::",
        "<core::",
        "<std::",
        "__libc_start",
        "_start",
        "clone3",
        "__clone",
        "__GI___clone",
        "start_thread",
    ];
    // std, core and alloc by their sources (a toolchain's `rustlib/src/rust/library/…` or the
    // `/rustc/<hash>/library/…` of its debug info), glibc's (a thread's start, `main`'s caller)
    // and frames without a symbol (`<unknown>`: std's code inlined into the unwinder's callers)
    // with them.
    let library = ["/library/std/", "/library/core/", "/library/alloc/", "/library/panic_", "./nptl/", "./csu/"];
    if at.contains("/rustc/")
        || library.iter().any(|l| at.contains(l))
        || f.name == "<unknown>"
        || STD.iter().any(|p| f.name.starts_with(p))
    {
        return Owner::Std;
    }
    Owner::Dep
}

/// Maps a line of evcxr's generated `src/lib.rs` to (cell, line in the cell), when known.
pub(super) type Locate<'a> = &'a dyn Fn(u32) -> Option<(u64, u32)>;

/// A location for people: the notebook's as `cell [N] line L` (or the cell alone), a
/// dependency's from its crate directory on (`ndarray-0.16.1/src/lib.rs:10:5`).
pub(super) fn place(at: &str, cell: u64, locate: Locate<'_>) -> String {
    if let Some(line) = cell_file_line(at) {
        return match locate(line) {
            Some((c, l)) => format!("cell [{c}] line {l}"),
            None => format!("cell [{cell}]"),
        };
    }
    match at.find("/registry/src/") {
        Some(i) => at[i + "/registry/src/".len()..].split_once('/').map_or(at, |(_, p)| p).to_string(),
        None => at.to_string(),
    }
}

/// A frame's function for people: a cell's body as `cell [N]`, an item the notebook defined
/// without evcxr's crate name.
fn function(f: &Frame, cell: u64) -> String {
    let name = f.name.strip_prefix("ctx::").unwrap_or(&f.name);
    // The cell's body (and its closures, named alone as `{closure#0}` by some debug info), or
    // std's `catch_unwind` shim with the body inlined.
    if name.starts_with("run_user_code_")
        || ((name == "__rust_try" || name.starts_with("{closure")) && owner(f) == Owner::Cell)
    {
        return format!("cell [{cell}]");
    }
    // The symbol's hash, when the demangler left one (`::h0123…`).
    match name.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => head.to_string(),
        _ => name.to_string(),
    }
}

/// An error's text split into its message and the backtrace it carries: every run of std
/// `Backtrace` lines in it (as `Display` writes one, frames `   0: name` numbered from 0 with
/// their `             at file:line:col` lines) is taken out of the message, with the
/// `Stack backtrace:` heading anyhow puts before its own. The backtrace kept is the innermost
/// error's: the last one inside the message (a candle error's in an anyhow chain's
/// `Caused by:`), else anyhow's own. Blank lines that ended the message go with it.
///
/// A run starts at frame 0 with its number right-aligned in four columns (`   0: `) at the
/// start of a line, or indented as anyhow indents a cause's lines (4 spaces for one cause, 7
/// for a numbered one): anyhow's numbered causes (`    0: reading the weights`) are five columns
/// wide and stay in the message.
pub(super) fn split_backtrace(lines: &[String]) -> (Vec<String>, Vec<String>) {
    // (first line, end, whether a heading line is just before it).
    let mut runs: Vec<(usize, usize, bool)> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        match backtrace_run(lines, i) {
            Some(end) => {
                let headed = i > 0 && ["Stack backtrace:", "stack backtrace:"].contains(&lines[i - 1].trim());
                runs.push((i, end, headed));
                i = end;
            }
            None => i += 1,
        }
    }
    let chosen = runs.iter().rfind(|r| !r.2).or(runs.last());
    let backtrace = chosen.map(|&(a, b, _)| lines[a..b].to_vec()).unwrap_or_default();
    let taken = |k: usize| runs.iter().any(|&(a, b, headed)| (a..b).contains(&k) || (headed && k + 1 == a));
    let mut message: Vec<String> = (0..lines.len()).filter(|&k| !taken(k)).map(|k| lines[k].clone()).collect();
    while message.last().is_some_and(|l| l.trim().is_empty()) {
        message.pop();
    }
    let blank = message.iter().take_while(|l| l.trim().is_empty()).count();
    message.drain(..blank);
    (message, backtrace)
}

/// A line of a backtrace's frames: the column of its number's colon, and the number.
fn frame_number(line: &str) -> Option<(usize, u32)> {
    let rest = line.trim_start_matches(' ');
    let lead = line.len() - rest.len();
    let (n, name) = rest.split_once(": ")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || name.trim().is_empty() {
        return None;
    }
    Some((lead + n.len(), n.parse().ok()?))
}

/// The end of the backtrace whose frame 0 is `lines[start]`, when one starts there (see
/// [`split_backtrace`]): frames numbered one after another with their colons in one column,
/// each frame's `at` lines indented past its name, and the names of frames inlined into it
/// (std prints them under the frame, where its name starts); two frames at least.
fn backtrace_run(lines: &[String], start: usize) -> Option<usize> {
    let (colon, n) = frame_number(&lines[start])?;
    // Colons in column 4: std's own; 8 and 11: one anyhow cause's lines, or a numbered one's.
    if n != 0 || ![4, 8, 11].contains(&colon) {
        return None;
    }
    let name_col = colon + 2;
    let (mut next, mut end) = (1, start + 1);
    while let Some(l) = lines.get(end) {
        let rest = l.trim_start_matches(' ');
        let lead = l.len() - rest.len();
        if frame_number(l).is_some_and(|f| f == (colon, next)) {
            next += 1;
        } else if !((lead > name_col && rest.starts_with("at ")) || (lead == name_col && !rest.is_empty())) {
            break;
        }
        end += 1;
    }
    (next >= 2).then_some(end)
}

/// Where an error was made, as its first frames say: anyhow's constructors and `context`,
/// eyre's, candle's `Error::bt` and std's `Backtrace::capture` (folded with std's machinery at the
/// start of a returned error's backtrace).
fn makes_errors(f: &Frame) -> bool {
    // `<E as anyhow::context::ext::StdError>::ext_context`: the trait's path.
    let name = f.name.trim_start_matches('<');
    let name = name.split_once(" as ").map_or(name, |(_, t)| t);
    ["anyhow::", "eyre::", "candle_core::error::", "std::backtrace::"].iter().any(|p| name.starts_with(p))
}

/// The notebook's part of a backtrace (std's own lines, as a panic's or std's `Backtrace`
/// `Display` writes them: `   3: name` and `             at file:line:col`), innermost first:
/// from the first frame that is not std's panicking machinery (nor where anyhow or candle made an
/// error) to the last frame of the notebook (or of a dependency, when no frame is the
/// notebook's), with std's, evcxr's and the kernel's frames folded away. A heading line
/// (`title (what was folded):`), then the frames; nothing when `backtrace` holds no frame.
pub(super) fn folded(backtrace: &[String], title: &str, cell: u64, locate: Locate<'_>) -> Vec<String> {
    let all = frames(backtrace);
    if all.is_empty() {
        return Vec::new();
    }
    let owners: Vec<Owner> = all.iter().map(owner).collect();
    let first = all.iter().zip(&owners).position(|(f, o)| *o != Owner::Std && !makes_errors(f));
    let made = first.map_or(0, |a| all[..a].iter().filter(|f| makes_errors(f)).count());
    let last = owners.iter().rposition(|o| *o == Owner::Cell).or_else(|| owners.iter().rposition(|o| *o == Owner::Dep));
    let shown: Vec<(usize, &Frame)> = match (first, last) {
        (Some(a), Some(b)) if a <= b => (a..=b)
            // std's frames between the notebook's (closure shims, `?`'s conversions,
            // `catch_unwind` glue) are folded as much as evcxr's and the kernel's.
            .filter(|&i| owners[i] != Owner::Internal && owners[i] != Owner::Std)
            .map(|i| (i, &all[i]))
            .collect(),
        _ => Vec::new(),
    };
    // One frame for the cell's body and its closures (and any function repeated in a row:
    // inlined shims of it), the one that says where.
    let mut kept: Vec<(usize, &Frame)> = Vec::new();
    for (i, f) in shown {
        match kept.last_mut() {
            Some(last) if function(last.1, cell) == function(f, cell) => {
                if last.1.at.is_none() && f.at.is_some() {
                    *last = (i, f);
                }
            }
            _ => kept.push((i, f)),
        }
    }
    let shown = kept;
    let hidden = all.len() - shown.len();
    let whose =
        if made > 0 { "std, evcxr, gpumem-kernel and the error's making" } else { "std, evcxr and gpumem-kernel" };
    // Frames std could not name: in the notebook's process, code of a cell loaded after the
    // process's first backtrace (std reads the list of loaded libraries once), or code without
    // symbols.
    let nameless = all.iter().filter(|f| f.name == "<unknown>").count();
    let what = match (shown.is_empty(), nameless) {
        (true, 0) => format!("{hidden} frames, all of {whose}: hidden"),
        (false, 0) => format!("innermost first; {hidden} frames of {whose} hidden"),
        (true, n) => format!("{hidden} frames hidden: of {whose}, and {n} std could not name"),
        (false, n) => format!("innermost first; {hidden} frames hidden: of {whose}, and {n} std could not name"),
    };
    let mut tb = vec![format!("{title} ({what}):")];
    for (n, (_, f)) in shown.iter().enumerate() {
        let name = function(f, cell);
        tb.push(format!("{n:>4}: {name}"));
        if let Some(at) = f.at.as_deref().map(|at| place(at, cell, locate)).filter(|at| *at != name) {
            tb.push(format!("          at {at}"));
        }
    }
    tb
}
