//! `%gpumem` line magics and the `%%gpumem` cell magic: a pure parser.
//!
//! [`parse`] takes a cell's source and returns the magics it holds plus the code to hand to
//! evcxr. Every magic line is replaced by `// <the line>` so line numbers in compiler errors
//! stay right, and evcxr never sees a `%`. evcxr's own `:` commands and `!` shell lines are
//! left alone.
//!
//! Rules:
//! - `%%gpumem [--timeline] [--snapshot DIR]` is a cell magic and must be the first non-blank
//!   line of the cell.
//! - Any line whose first non-blank text is `%gpumem` is a line magic.
//! - A malformed magic becomes [`Magic::Bad`] with a one-line reason; the engine then fails the
//!   cell with a `UsageError` before anything of it runs (see `help`).

use std::path::PathBuf;

/// What `%gpumem export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    /// One row per cell, bytes as integers.
    Csv,
    /// The full per-cell records (the same objects as `application/vnd.gpumem.cell+json`).
    Json,
}

/// One side of `%gpumem diff`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiffSide {
    /// The allocations live after this cell (`3` or `[3]`), rebuilt from the recorded history.
    Cell(u64),
    /// The allocations live now.
    Now,
    /// A snapshot written by `%gpumem snapshot`: its directory, or its `snapshot.json`.
    Path(PathBuf),
}

impl DiffSide {
    fn parse(word: &str) -> DiffSide {
        let digits = word.strip_prefix('[').and_then(|w| w.strip_suffix(']')).unwrap_or(word);
        match digits.parse::<u64>() {
            Ok(n) => DiffSide::Cell(n),
            Err(_) if word == "now" => DiffSide::Now,
            Err(_) => DiffSide::Path(PathBuf::from(word)),
        }
    }
}

/// What `%%gpumem sweep` sweeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepSpec {
    /// The variable the cell uses (`batch`).
    pub variable: String,
    /// Its values as written (Rust number literals), ascending, each once.
    pub values: Vec<String>,
    /// `--on SIZE`: a device size to answer for, beside this device and the cards.
    pub on: Option<u64>,
}

/// The fewest values a sweep takes: two tell no line from a curve.
pub const SWEEP_MIN_VALUES: usize = 3;

/// One parsed magic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Magic {
    /// `%gpumem help` (also `%gpumem` alone).
    Help,
    /// `%gpumem on`: show the per-cell report.
    On,
    /// `%gpumem off`: hide the per-cell report (cells are still measured and kept in history).
    Off,
    /// `%gpumem history`: a table of every cell of this session.
    History,
    /// `%gpumem plot`: peaks per cell as a chart, with the budget line.
    Plot,
    /// `%gpumem ranks [CELL]`: the cells' worker processes by rank (one row per cell: min / max /
    /// mean / sum and the rank holding the most), or one cell's processes one by one.
    Ranks(Option<u64>),
    /// `%gpumem summary`: the allocator's `memory_summary()`.
    Summary,
    /// `%gpumem top [N]`: the N sites holding the most memory now and at the session's peak.
    Top(usize),
    /// `%gpumem snapshot [DIR]`: write snapshot.pickle/.json/trace_plot.html.
    Snapshot(Option<PathBuf>),
    /// `%gpumem snapshot --on-oom DIR|off`: write a snapshot into `DIR/cell-N` when a cell runs
    /// out of memory (`None`: stop).
    OnOom(Option<PathBuf>),
    /// `%gpumem diff A B`: two states compared allocation by allocation.
    Diff(DiffSide, DiffSide),
    /// `%gpumem record on|off [--max-entries N] [--stacks]`.
    Record {
        /// `on` or `off`.
        on: bool,
        /// Ring size; `None`: unbounded.
        max_entries: Option<u64>,
        /// Capture Rust stack frames for each event.
        stacks: bool,
    },
    /// `%gpumem budget SIZE|off`.
    Budget(Option<u64>),
    /// `%gpumem fit SIZE`: would the session's recorded allocations fit on a device of SIZE
    /// bytes, per policy and per cell, and the smallest device per policy.
    Fit(u64),
    /// `%gpumem explain`: every reserved byte of device 0, in parts that add up.
    Explain,
    /// `%gpumem trim`: the process's caches given back (gpumem-nb's allocator's, the CUDA
    /// stream-ordered pools, watched frameworks' pools), inside the cell's measured time.
    Trim,
    /// `%gpumem export FILE.csv|FILE.json`.
    Export(PathBuf, ExportFormat),
    /// `%gpumem metrics on [ADDR]` (`Some`, the address as written, may be empty) or
    /// `%gpumem metrics off` (`None`): the OpenMetrics endpoint for Prometheus.
    Metrics(Option<String>),
    /// `%gpumem reset`: forget this session's history (not the allocator's state).
    Reset,
    /// `%gpumem restart`: a fresh notebook process (as `:restart`), the history kept: after a
    /// lost CUDA context, the way on.
    Restart,
    /// `%%gpumem [--timeline] [--snapshot DIR]`: full history for this one cell.
    Cell {
        /// Show the memory-over-time chart of the cell after it runs.
        timeline: bool,
        /// Write a snapshot of the cell to this directory.
        snapshot: Option<PathBuf>,
    },
    /// `%%gpumem sweep VAR=V1,V2,V3 [--on SIZE]`: the cell run once per value (after a warm-up
    /// run that is not counted), each run's peak by component fitted, the largest value that fits
    /// this device, each card and SIZE.
    Sweep(SweepSpec),
    /// A magic line that could not be understood.
    Bad {
        /// 1-based line in the cell.
        line: usize,
        /// The line as written.
        text: String,
        /// Why, in one line.
        error: String,
    },
}

impl Magic {
    /// The row of [`COMMANDS`] this magic is (`None` for a magic that could not be understood).
    pub fn command(&self) -> Option<&'static Command> {
        let (verb, on_oom) = match self {
            Magic::Help => ("help", false),
            Magic::On => ("on", false),
            Magic::Off => ("off", false),
            Magic::History => ("history", false),
            Magic::Plot => ("plot", false),
            Magic::Ranks(_) => ("ranks", false),
            Magic::Summary => ("summary", false),
            Magic::Top(_) => ("top", false),
            Magic::Snapshot(_) => ("snapshot", false),
            Magic::OnOom(_) => ("snapshot", true),
            Magic::Diff(..) => ("diff", false),
            Magic::Record { .. } => ("record", false),
            Magic::Budget(_) => ("budget", false),
            Magic::Fit(_) => ("fit", false),
            Magic::Explain => ("explain", false),
            Magic::Trim => ("trim", false),
            Magic::Export(..) => ("export", false),
            Magic::Metrics(_) => ("metrics", false),
            Magic::Reset => ("reset", false),
            Magic::Restart => ("restart", false),
            Magic::Cell { .. } => ("%%gpumem", false),
            Magic::Sweep(_) => ("%%gpumem sweep", false),
            Magic::Bad { .. } => return None,
        };
        COMMANDS.iter().find(|c| c.verb == verb && c.args.starts_with("--on-oom") == on_oom)
    }

    /// Whether the magic shows or saves something, and so runs after the cell's code (so it
    /// includes that cell); the others change settings and take effect before the code runs.
    /// Read from [`COMMANDS`], which `help` prints.
    pub fn runs_after_code(&self) -> bool {
        self.command().is_some_and(|c| c.when == When::AfterCode)
    }
}

/// When a magic runs, relative to its cell's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// A setting: it takes effect before the cell's code runs.
    BeforeCode,
    /// It shows or saves something: it runs after the cell's code, so it includes that cell.
    AfterCode,
}

/// One row of the command table: what `help` prints and what the parser accepts.
pub struct Command {
    /// The verb (`on`, `budget`, …); the cell magic has `%%gpumem` here.
    pub verb: &'static str,
    /// Arguments as shown in the usage.
    pub args: &'static str,
    /// What it does.
    pub what: &'static str,
    /// When it runs ([`Magic::runs_after_code`] and the help's sentence come from here).
    pub when: When,
}

/// Every magic, in the order `help` lists them.
pub static COMMANDS: &[Command] = &[
    Command { verb: "help", args: "", what: "this list", when: When::BeforeCode },
    Command {
        verb: "on",
        args: "",
        what: "show the memory report after every cell (the default)",
        when: When::BeforeCode,
    },
    Command {
        verb: "off",
        args: "",
        what: "hide the per-cell report (cells are still measured and kept in history)",
        when: When::BeforeCode,
    },
    Command { verb: "history", args: "", what: "a table of every cell run in this session", when: When::AfterCode },
    Command {
        verb: "plot",
        args: "",
        what: "peak memory per cell as a chart, with the budget line",
        when: When::AfterCode,
    },
    Command {
        verb: "ranks",
        args: "[CELL]",
        what: "the processes the notebook started that hold device memory (one per GPU, each with its rank: RANK, \
               SLURM_PROCID, OMPI_COMM_WORLD_RANK or --rank), per cell: how many, min / max / mean / sum of their \
               bytes and the rank holding the most; with CELL, that cell's processes one by one",
        when: When::AfterCode,
    },
    Command {
        verb: "summary",
        args: "",
        what: "the allocator's memory_summary() (needs gpumem-nb loaded)",
        when: When::AfterCode,
    },
    Command {
        verb: "top",
        args: "[N]",
        what: "the N sites (function, cell:line) holding the most memory now and at the session's peak (default 5)",
        when: When::AfterCode,
    },
    Command {
        verb: "snapshot",
        args: "[DIR]",
        what: "write snapshot.pickle, snapshot.json and trace_plot.html (default DIR: gpumem-snapshots/cell-N)",
        when: When::AfterCode,
    },
    Command {
        verb: "snapshot",
        args: "--on-oom DIR|off",
        what: "when a cell runs out of memory, write a snapshot at that moment into DIR/cell-N; its report says why",
        when: When::BeforeCode,
    },
    Command {
        verb: "diff",
        args: "A B",
        what: "compare two states allocation by allocation, by cell and owner; A, B: snapshot directories, `now`, or \
               cell numbers (what was live after that cell: needs `record on --stacks` from before it)",
        when: When::AfterCode,
    },
    Command {
        verb: "fit",
        args: "SIZE",
        what: "would this session's recorded allocations (every source) fit on a device of SIZE (e.g. 24GiB)? per \
               policy (default, expandable, compact) and per cell, with the first request that fails and the smallest \
               device per policy (needs `record on` from the first cell)",
        when: When::AfterCode,
    },
    Command {
        verb: "explain",
        args: "",
        what: "every reserved byte of device 0: requested, rounding, pending frees, cached free blocks by pool and \
               size class, what empty_cache() returns, the largest free blocks, the CUDA pool beside it",
        when: When::AfterCode,
    },
    Command {
        verb: "trim",
        args: "",
        what: "give back what the process holds cached and unused: gpumem-nb's allocator's cache (empty_cache) and each \
               CUDA device's stream-ordered pool (candle, cudarc); what each held before and after, and NVML's figure \
               of the process; the cell's report shows the change",
        when: When::AfterCode,
    },
    Command {
        verb: "record",
        args: "on|off [--max-entries N] [--stacks]",
        what: "record the allocator's history (all events), optionally with Rust stacks",
        when: When::BeforeCode,
    },
    Command {
        verb: "budget",
        args: "SIZE|off",
        what: "warn when a cell's peak goes over SIZE (e.g. 20GiB, 512MiB, 1.5G)",
        when: When::BeforeCode,
    },
    Command {
        verb: "export",
        args: "FILE.csv|FILE.json",
        what: "write the session's per-cell history to a file",
        when: When::AfterCode,
    },
    Command {
        verb: "metrics",
        args: "on [ADDR]|off",
        what: "serve every cell's numbers to Prometheus at http://ADDR/metrics (OpenMetrics; default \
               127.0.0.1:9464, loopback)",
        when: When::BeforeCode,
    },
    Command {
        verb: "reset",
        args: "",
        what: "forget this session's history (the allocator is untouched)",
        when: When::BeforeCode,
    },
    Command {
        verb: "restart",
        args: "",
        what: "a fresh notebook process, as :restart, the history kept (after a lost CUDA context: the way on)",
        when: When::BeforeCode,
    },
    Command {
        verb: "%%gpumem sweep",
        args: "VAR=V1,V2,V3 [--on SIZE]",
        what: "first line of a cell: run the cell once per value of VAR (ascending, after a warm-up run that is not \
               counted, the caches trimmed between runs); each run's peak by component, each fitted as constant or \
               linear in VAR, and the largest VAR that fits this device, each card and SIZE. The cell's `let`s drop \
               at the end of each run; it may borrow earlier variables, never move or assign them",
        when: When::BeforeCode,
    },
    Command {
        verb: "%%gpumem",
        args: "[--timeline] [--snapshot DIR]",
        what: "first line of a cell: record everything in that cell; show its timeline, write a snapshot",
        when: When::BeforeCode,
    },
];

/// The one-line usage shown after an error.
pub fn usage() -> String {
    let mut verbs: Vec<&str> = COMMANDS.iter().filter(|c| !c.verb.starts_with("%%")).map(|c| c.verb).collect();
    verbs.dedup();
    format!(
        "usage: %gpumem {} (see %gpumem help) · cell magics: %%gpumem [--timeline] [--snapshot DIR], \
         %%gpumem sweep VAR=V1,V2,V3 [--on SIZE]",
        verbs.join(" | ")
    )
}

/// The `help` text, generated from [`COMMANDS`].
pub fn help_text() -> String {
    let mut out = String::from("gpumem kernel magics\n\n");
    let width = COMMANDS.iter().map(|c| magic_head(c).len()).max().unwrap_or(0);
    for c in COMMANDS {
        let head = magic_head(c);
        out.push_str(&format!("  {head:<width$}  {}\n", c.what));
    }
    let named = |when: When| {
        let mut v: Vec<String> = Vec::new();
        for c in COMMANDS.iter().filter(|c| c.when == when && !c.verb.starts_with("%%") && c.verb != "help") {
            let name =
                if c.args.starts_with("--on-oom") { "snapshot --on-oom".to_string() } else { c.verb.to_string() };
            if !v.contains(&name) {
                v.push(name);
            }
        }
        v.join(", ")
    };
    out.push_str(&format!(
        "\nSettings ({}) take effect before the cell's code runs; {} run after it, so they include that cell.\n",
        named(When::BeforeCode),
        named(When::AfterCode)
    ));
    out.push_str(
        "A magic line that cannot be understood fails the cell (a UsageError naming the line, with the \
         usage) before anything of it runs, so Run All stops there as at a compile error.\n\
         Magic lines become `// %gpumem …` comments, so compiler line numbers stay right; \
         evcxr's `:` commands (:dep, :vars, …) work as usual.\n\
         A cell made only of magics and comments runs no code and gets no report.\n",
    );
    out
}

/// The `help` as a table (one row per magic: how it is written, what it does, when it runs),
/// and the notes under it: what JupyterLab shows (the text form is [`help_text`]).
pub fn help_html() -> String {
    let mut t = gpumem_nb::render::Table::new(["magic", "what it does", "runs"]);
    for c in COMMANDS {
        let when = match (c.verb, c.when) {
            ("help", _) => "",
            ("%%gpumem", _) => "around the cell's code",
            ("%%gpumem sweep", _) => "in place of the cell's code",
            (_, When::BeforeCode) => "before the cell's code",
            (_, When::AfterCode) => "after the cell's code",
        };
        t.row([magic_head(c), c.what.to_string(), when.to_string()]);
    }
    let text = help_text();
    let notes: String = text
        .split_once("\n\n")
        .map_or("", |(_, rest)| rest)
        .split_once("\n\n")
        .map_or("", |(_, notes)| notes)
        .lines()
        .map(|l| format!("<p style=\"margin:4px 0\">{}</p>", gpumem_nb::render::escape(l)))
        .collect();
    format!("<div class=\"gpumem-help\"><b>gpumem kernel magics</b>{}{notes}</div>", t.to_html())
}

fn magic_head(c: &Command) -> String {
    if c.verb.starts_with("%%") {
        format!("{} {}", c.verb, c.args)
    } else if c.args.is_empty() {
        format!("%gpumem {}", c.verb)
    } else {
        format!("%gpumem {} {}", c.verb, c.args)
    }
}

/// The verb of the table nearest to a mistyped one (at most two letters changed, added, removed
/// or swapped), when there is one.
fn closest_verb(word: &str) -> Option<&'static str> {
    // Optimal string alignment distance: a swap of two neighbours is one edit.
    fn distance(a: &[char], b: &[char]) -> usize {
        let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
        for (i, row) in d.iter_mut().enumerate() {
            row[0] = i;
        }
        for (j, cell) in d[0].iter_mut().enumerate() {
            *cell = j;
        }
        for i in 1..=a.len() {
            for j in 1..=b.len() {
                let cost = usize::from(a[i - 1] != b[j - 1]);
                d[i][j] = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
                if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                    d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
                }
            }
        }
        d[a.len()][b.len()]
    }
    let w: Vec<char> = word.to_lowercase().chars().collect();
    COMMANDS
        .iter()
        .filter(|c| !c.verb.starts_with("%%"))
        .map(|c| (distance(&w, &c.verb.chars().collect::<Vec<_>>()), c.verb))
        .filter(|&(d, v)| d <= 2 && d < v.len())
        .min_by_key(|&(d, _)| d)
        .map(|(_, v)| v)
}

/// Splits a cell into its magics and the code for evcxr (magic lines commented out).
pub fn parse(cell: &str) -> (Vec<Magic>, String) {
    let mut magics = Vec::new();
    let mut code = String::with_capacity(cell.len() + 8);
    let mut seen_code = false;
    for (i, raw) in cell.split_inclusive('\n').enumerate() {
        let (line, nl) = match raw.strip_suffix('\n') {
            Some(l) => (l.strip_suffix('\r').unwrap_or(l), &raw[l.len()..]),
            None => (raw, ""),
        };
        let trimmed = line.trim();
        let lineno = i + 1;
        if let Some(rest) = strip_word(trimmed, "%%gpumem") {
            let m = if seen_code {
                Magic::Bad {
                    line: lineno,
                    text: trimmed.to_string(),
                    error: "%%gpumem must be the first line of the cell".into(),
                }
            } else {
                parse_cell_magic(rest).unwrap_or_else(|error| Magic::Bad { line: lineno, text: trimmed.into(), error })
            };
            magics.push(m);
            comment_out(&mut code, line, nl);
        } else if let Some(rest) = strip_word(trimmed, "%gpumem") {
            let m =
                parse_line_magic(rest).unwrap_or_else(|error| Magic::Bad { line: lineno, text: trimmed.into(), error });
            magics.push(m);
            comment_out(&mut code, line, nl);
        } else {
            if !trimmed.is_empty() {
                seen_code = true;
            }
            code.push_str(raw);
        }
    }
    (magics, code)
}

/// Whether code (as returned by [`parse`]) has anything to run: not only blank lines and `//`
/// comments.
pub fn has_code(code: &str) -> bool {
    code.lines().map(str::trim).any(|l| !l.is_empty() && !l.starts_with("//"))
}

fn comment_out(code: &mut String, line: &str, nl: &str) {
    let indent = &line[..line.len() - line.trim_start().len()];
    code.push_str(indent);
    code.push_str("// ");
    code.push_str(line.trim_start());
    code.push_str(nl);
}

/// `text` without the leading `word`, if `word` is followed by whitespace or nothing.
fn strip_word<'a>(text: &'a str, word: &str) -> Option<&'a str> {
    let rest = text.strip_prefix(word)?;
    (rest.is_empty() || rest.starts_with(char::is_whitespace)).then(|| rest.trim())
}

fn parse_line_magic(args: &str) -> Result<Magic, String> {
    let words: Vec<&str> = args.split_whitespace().collect();
    let Some((&verb, rest)) = words.split_first() else { return Ok(Magic::Help) };
    let no_args = |m: Magic| {
        if rest.is_empty() { Ok(m) } else { Err(format!("`{verb}` takes no arguments (got {:?})", rest.join(" "))) }
    };
    match verb {
        "help" | "-h" | "--help" => no_args(Magic::Help),
        "on" => no_args(Magic::On),
        "off" => no_args(Magic::Off),
        "history" => no_args(Magic::History),
        "explain" => no_args(Magic::Explain),
        "trim" => no_args(Magic::Trim),
        "fit" => match rest {
            [] => Err("`fit` needs a device size (e.g. 24GiB, 80GiB, 16000000000)".into()),
            words => {
                // Allow a space between number and unit: `fit 24 GiB`.
                let joined = words.join("");
                match gpumem_nb::units::parse_size(&joined) {
                    Some(0) => Err("`fit` needs a device of more than 0 bytes".into()),
                    Some(b) => Ok(Magic::Fit(b)),
                    None => Err(format!("bad size {joined:?} (write e.g. 24GiB, 512MiB, 1.5G or a number of bytes)")),
                }
            }
        },
        "plot" => no_args(Magic::Plot),
        "ranks" => match rest {
            [] => Ok(Magic::Ranks(None)),
            [cell] => {
                let digits = cell.strip_prefix('[').and_then(|c| c.strip_suffix(']')).unwrap_or(cell);
                match digits.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(Magic::Ranks(Some(n))),
                    _ => Err(format!("bad cell {cell:?} (a cell number, e.g. `ranks 3`)")),
                }
            }
            _ => Err(format!("`ranks` takes at most one cell number (got {:?})", rest.join(" "))),
        },
        "summary" => no_args(Magic::Summary),
        "top" => match rest {
            [] => Ok(Magic::Top(5)),
            [n] => match n.parse::<usize>() {
                Ok(n) if (1..=1000).contains(&n) => Ok(Magic::Top(n)),
                _ => Err(format!("bad count {n:?} (a number from 1 to 1000)")),
            },
            _ => Err("top takes at most one argument: N".into()),
        },
        "reset" => no_args(Magic::Reset),
        "restart" => no_args(Magic::Restart),
        "snapshot" => match rest {
            [] => Ok(Magic::Snapshot(None)),
            [opt, ..] if opt.starts_with("--on-oom") => parse_on_oom(rest),
            [dir] => Ok(Magic::Snapshot(Some(PathBuf::from(dir)))),
            _ => Err(format!("`snapshot` takes at most one directory (got {:?})", rest.join(" "))),
        },
        "diff" => match rest {
            [a, b] => Ok(Magic::Diff(DiffSide::parse(a), DiffSide::parse(b))),
            _ => {
                Err("`diff` compares two states: snapshot directories, `now` or cell numbers (e.g. `diff 3 5`)".into())
            }
        },
        "budget" => match rest {
            ["off" | "none"] => Ok(Magic::Budget(None)),
            [size] => parse_budget(size).map(|b| Magic::Budget(Some(b))),
            [] => Err("`budget` needs a size (e.g. 20GiB) or `off`".into()),
            _ => {
                // Allow a space between number and unit: `budget 20 GiB`.
                let joined = rest.join("");
                parse_budget(&joined).map(|b| Magic::Budget(Some(b)))
            }
        },
        "export" => match rest {
            [file] => {
                let lower = file.to_ascii_lowercase();
                let format = if lower.ends_with(".csv") {
                    ExportFormat::Csv
                } else if lower.ends_with(".json") {
                    ExportFormat::Json
                } else {
                    return Err(format!("`export` writes .csv or .json files, not {file:?}"));
                };
                Ok(Magic::Export(PathBuf::from(file), format))
            }
            [] => Err("`export` needs a file name ending in .csv or .json".into()),
            _ => Err(format!("`export` takes one file name (got {:?})", rest.join(" "))),
        },
        "record" => parse_record(rest),
        "metrics" => match rest {
            ["on"] => Ok(Magic::Metrics(Some(String::new()))),
            ["on", addr] => gpumem_nb::metrics::parse_addr(addr)
                .map(|_| Magic::Metrics(Some(addr.to_string())))
                .map_err(|e| e.to_string()),
            ["off"] => Ok(Magic::Metrics(None)),
            _ => Err("`metrics` takes `on [ADDR]` (e.g. `on 127.0.0.1:9464`) or `off`".into()),
        },
        other => Err(match closest_verb(other) {
            Some(v) => format!("unknown verb `{other}` (did you mean `{v}`?)"),
            None => format!("unknown verb `{other}`"),
        }),
    }
}

fn parse_budget(size: &str) -> Result<u64, String> {
    match gpumem_nb::units::parse_size(size) {
        Some(0) => Err("a budget of 0 bytes would flag every cell; use `budget off` to turn it off".into()),
        Some(b) => Ok(b),
        None => Err(format!("bad size {size:?} (write e.g. 20GiB, 512MiB, 1.5G or a number of bytes)")),
    }
}

fn parse_record(rest: &[&str]) -> Result<Magic, String> {
    let (&mode, opts) = rest.split_first().ok_or("`record` needs `on` or `off`")?;
    let on = match mode {
        "on" => true,
        "off" => false,
        other => return Err(format!("`record` needs `on` or `off`, not `{other}`")),
    };
    let mut max_entries = None;
    let mut stacks = false;
    let mut opts = Opts::new(opts);
    while let Some((name, inline)) = opts.next() {
        match name {
            "--stacks" if inline.is_none() => stacks = true,
            "--max-entries" => {
                let v = opts.value(inline).ok_or("`--max-entries` needs a number")?;
                let n: u64 =
                    v.replace('_', "").parse().map_err(|_| format!("`--max-entries` needs a number, not {v:?}"))?;
                if n == 0 {
                    return Err("`--max-entries` must be at least 1".into());
                }
                max_entries = Some(n);
            }
            other => return Err(format!("unknown option `{other}` for `record`")),
        }
    }
    if !on && (stacks || max_entries.is_some()) {
        return Err("`record off` takes no options".into());
    }
    Ok(Magic::Record { on, max_entries, stacks })
}

fn parse_on_oom(rest: &[&str]) -> Result<Magic, String> {
    let mut opts = Opts::new(rest);
    let dir = match opts.next() {
        Some(("--on-oom", inline)) => opts.value(inline).ok_or("`--on-oom` needs a directory, or `off`")?,
        _ => return Err("`snapshot` takes `--on-oom DIR|off` or a directory".into()),
    };
    if let Some((extra, _)) = opts.next() {
        return Err(format!("`snapshot --on-oom` takes one directory (got {extra:?} too)"));
    }
    Ok(Magic::OnOom((dir != "off").then(|| PathBuf::from(dir))))
}

fn parse_cell_magic(args: &str) -> Result<Magic, String> {
    if let Some(rest) = strip_word(args, "sweep") {
        return parse_sweep(rest).map(Magic::Sweep);
    }
    let mut timeline = false;
    let mut snapshot = None;
    let words: Vec<&str> = args.split_whitespace().collect();
    let mut opts = Opts::new(&words);
    while let Some((name, inline)) = opts.next() {
        match name {
            "--timeline" if inline.is_none() => timeline = true,
            "--snapshot" => {
                let dir = opts.value(inline).ok_or("`--snapshot` needs a directory")?;
                snapshot = Some(PathBuf::from(dir));
            }
            other => return Err(format!("unknown option `{other}` for %%gpumem")),
        }
    }
    Ok(Magic::Cell { timeline, snapshot })
}

/// `VAR=V1,V2,V3 [--on SIZE]`.
fn parse_sweep(args: &str) -> Result<SweepSpec, String> {
    const EXAMPLE: &str = "e.g. `%%gpumem sweep batch=8,16,32`";
    let words: Vec<&str> = args.split_whitespace().collect();
    let Some((&first, opts)) = words.split_first() else {
        return Err(format!("`sweep` needs a variable and its values, {EXAMPLE}"));
    };
    let Some((variable, list)) = first.split_once('=') else {
        return Err(format!("`sweep` needs VAR=V1,V2,V3, not {first:?} ({EXAMPLE})"));
    };
    let is_ident = |v: &str| {
        v.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && v != "_"
    };
    if !is_ident(variable) {
        return Err(format!("`sweep`: {variable:?} is not a variable name ({EXAMPLE})"));
    }
    let written: Vec<&str> = list.split(',').map(str::trim).filter(|v| !v.is_empty()).collect();
    if written.is_empty() {
        return Err(format!("`sweep {variable}=` has no values: give at least {SWEEP_MIN_VALUES} ({EXAMPLE})"));
    }
    let mut values: Vec<(f64, String)> = Vec::new();
    for v in written {
        let number = v.replace('_', "").parse::<f64>().ok().filter(|n| n.is_finite() && *n >= 0.0);
        match number {
            Some(n) if v.chars().all(|c| c.is_ascii_digit() || c == '.' || c == '_') => values.push((n, v.to_string())),
            _ => return Err(format!("`sweep`: {v:?} is not a number (values are numbers: {variable}=8,16,32)")),
        }
    }
    values.sort_by(|a, b| a.0.total_cmp(&b.0));
    values.dedup_by(|a, b| a.0 == b.0);
    if values.len() < SWEEP_MIN_VALUES {
        return Err(format!(
            "`sweep` needs at least {SWEEP_MIN_VALUES} different values to tell constant from linear (got {})",
            values.len()
        ));
    }
    let mut on = None;
    let mut opts = Opts::new(opts);
    while let Some((name, inline)) = opts.next() {
        match name {
            "--on" => {
                let v = opts.value(inline).ok_or("`--on` needs a device size (e.g. 24GiB)")?;
                match gpumem_nb::units::parse_size(v) {
                    Some(b) if b > 0 => on = Some(b),
                    _ => {
                        return Err(format!(
                            "bad size {v:?} for `--on` (write e.g. 24GiB, 512MiB or a number of bytes)"
                        ));
                    }
                }
            }
            other => return Err(format!("unknown option `{other}` for %%gpumem sweep")),
        }
    }
    Ok(SweepSpec { variable: variable.to_string(), values: values.into_iter().map(|(_, v)| v).collect(), on })
}

/// A magic's options, one at a time: `--name`, `--name=value` or `--name value`.
struct Opts<'a> {
    words: std::slice::Iter<'a, &'a str>,
}

impl<'a> Opts<'a> {
    fn new(words: &'a [&'a str]) -> Opts<'a> {
        Opts { words: words.iter() }
    }

    /// The value of the option just read: written inline (`--name=value`), else the next word.
    fn value(&mut self, inline: Option<&'a str>) -> Option<&'a str> {
        inline.or_else(|| self.words.next().copied())
    }
}

impl<'a> Iterator for Opts<'a> {
    /// The option's name, and its value when written `--name=value`.
    type Item = (&'a str, Option<&'a str>);

    fn next(&mut self) -> Option<Self::Item> {
        let opt = *self.words.next()?;
        Some(match opt.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (opt, None),
        })
    }
}

#[cfg(test)]
mod tests;
