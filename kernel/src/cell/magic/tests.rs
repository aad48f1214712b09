//! The magic parser's tests: every magic and bad magic, the help and its table, and every
//! `%gpumem VERB` users read.

use super::*;

fn p(s: &str) -> Option<PathBuf> {
    Some(PathBuf::from(s))
}

#[test]
fn line_magics_table() {
    let cases: &[(&str, Magic)] = &[
        ("%gpumem", Magic::Help),
        ("%gpumem help", Magic::Help),
        ("%gpumem on", Magic::On),
        ("  %gpumem off  ", Magic::Off),
        ("%gpumem history", Magic::History),
        ("%gpumem plot", Magic::Plot),
        ("%gpumem ranks", Magic::Ranks(None)),
        ("%gpumem ranks 3", Magic::Ranks(Some(3))),
        ("%gpumem ranks [12]", Magic::Ranks(Some(12))),
        ("%gpumem summary", Magic::Summary),
        ("%gpumem reset", Magic::Reset),
        ("%gpumem snapshot", Magic::Snapshot(None)),
        ("%gpumem snapshot out/snap", Magic::Snapshot(p("out/snap"))),
        ("%gpumem snapshot --on-oom oom", Magic::OnOom(p("oom"))),
        ("%gpumem snapshot --on-oom=oom", Magic::OnOom(p("oom"))),
        ("%gpumem snapshot --on-oom off", Magic::OnOom(None)),
        ("%gpumem diff 3 [5]", Magic::Diff(DiffSide::Cell(3), DiffSide::Cell(5))),
        ("%gpumem diff snap/a now", Magic::Diff(DiffSide::Path(PathBuf::from("snap/a")), DiffSide::Now)),
        ("%gpumem budget 20GiB", Magic::Budget(Some(20 << 30))),
        ("%gpumem budget 1.5G", Magic::Budget(Some(3 << 29))),
        ("%gpumem budget 512 MiB", Magic::Budget(Some(512 << 20))),
        ("%gpumem budget off", Magic::Budget(None)),
        ("%gpumem metrics on", Magic::Metrics(Some(String::new()))),
        ("%gpumem metrics on 9100", Magic::Metrics(Some("9100".into()))),
        ("%gpumem metrics off", Magic::Metrics(None)),
        ("%gpumem fit 24GiB", Magic::Fit(24 << 30)),
        ("%gpumem fit 24 GiB", Magic::Fit(24 << 30)),
        ("%gpumem fit 1000000", Magic::Fit(1_000_000)),
        ("%gpumem explain", Magic::Explain),
        ("%gpumem trim", Magic::Trim),
        ("%gpumem export h.csv", Magic::Export(PathBuf::from("h.csv"), ExportFormat::Csv)),
        ("%gpumem export dir/H.JSON", Magic::Export(PathBuf::from("dir/H.JSON"), ExportFormat::Json)),
        ("%gpumem record on", Magic::Record { on: true, max_entries: None, stacks: false }),
        ("%gpumem record off", Magic::Record { on: false, max_entries: None, stacks: false }),
        (
            "%gpumem record on --max-entries 10_000 --stacks",
            Magic::Record { on: true, max_entries: Some(10_000), stacks: true },
        ),
        ("%gpumem record on --max-entries=5", Magic::Record { on: true, max_entries: Some(5), stacks: false }),
        ("%%gpumem", Magic::Cell { timeline: false, snapshot: None }),
        ("%%gpumem --timeline", Magic::Cell { timeline: true, snapshot: None }),
        ("%%gpumem --snapshot s --timeline", Magic::Cell { timeline: true, snapshot: p("s") }),
        ("%%gpumem --snapshot=s", Magic::Cell { timeline: false, snapshot: p("s") }),
    ];
    for (src, want) in cases {
        let (magics, code) = parse(src);
        assert_eq!(magics, vec![want.clone()], "{src}");
        assert!(code.trim_start().starts_with("// %"), "{src} → {code:?}");
        assert!(!has_code(&code), "{src}");
    }
}

#[test]
fn bad_magics_table() {
    let cases: &[(&str, &str)] = &[
        ("%gpumem frobnicate", "unknown verb `frobnicate`"),
        ("%gpumem budget", "needs a size"),
        ("%gpumem budget twelve", "bad size \"twelve\""),
        ("%gpumem budget 0", "use `budget off`"),
        ("%gpumem export history.txt", ".csv or .json"),
        ("%gpumem export", "needs a file name"),
        ("%gpumem metrics", "`on [ADDR]`"),
        ("%gpumem metrics on there", "not an address: `there`"),
        ("%gpumem record", "needs `on` or `off`"),
        ("%gpumem record maybe", "not `maybe`"),
        ("%gpumem record on --max-entries", "needs a number"),
        ("%gpumem record on --max-entries lots", "not \"lots\""),
        ("%gpumem record on --max-entries 0", "at least 1"),
        ("%gpumem record on --color", "unknown option `--color`"),
        ("%gpumem record off --stacks", "takes no options"),
        ("%gpumem on please", "takes no arguments"),
        ("%gpumem snapshot a b", "at most one directory"),
        ("%gpumem snapshot --on-oom", "needs a directory"),
        ("%gpumem snapshot --on-oom a b", "one directory"),
        ("%gpumem snapshot --on-oomx a", "`--on-oom DIR|off`"),
        ("%gpumem diff 3", "two states"),
        ("%gpumem fit", "needs a device size"),
        ("%gpumem fit big", "bad size \"big\""),
        ("%gpumem fit 0", "more than 0 bytes"),
        ("%gpumem explain now", "takes no arguments"),
        ("%gpumem trim all", "takes no arguments"),
        ("%gpumem ranks all", "bad cell \"all\" (a cell number"),
        ("%gpumem ranks 0", "bad cell \"0\""),
        ("%gpumem ranks 1 2", "at most one cell number"),
        ("%%gpumem --fast", "unknown option `--fast`"),
        ("%%gpumem --snapshot", "needs a directory"),
    ];
    for (src, needle) in cases {
        let (magics, _) = parse(src);
        match &magics[..] {
            [Magic::Bad { line: 1, text, error }] => {
                assert!(error.contains(needle), "{src}: {error}");
                assert!(!error.contains('\n'), "{src}: one line");
                assert_eq!(text, src.trim());
            }
            other => panic!("{src}: {other:?}"),
        }
    }
}

#[test]
fn code_keeps_line_numbers_and_other_lines() {
    let cell = "%%gpumem --timeline\n:dep foo = \"1\"\n  %gpumem budget 1GiB\nlet x = 1;\r\n%gpumem plot\nx";
    let (magics, code) = parse(cell);
    assert_eq!(magics.len(), 3);
    assert_eq!(code.lines().count(), cell.lines().count());
    let lines: Vec<&str> = code.lines().collect();
    assert_eq!(lines[0], "// %%gpumem --timeline");
    assert_eq!(lines[1], ":dep foo = \"1\"");
    assert_eq!(lines[2], "  // %gpumem budget 1GiB");
    assert_eq!(lines[3], "let x = 1;");
    assert!(code.contains("let x = 1;\r\n"), "line endings kept");
    assert_eq!(lines[5], "x");
    assert!(has_code(&code));
    // Not ours: other `%` words and identifiers that merely start with the name.
    let (m, c) = parse("%gpumemory on\nlet gpumem = 1;");
    assert!(m.is_empty());
    assert_eq!(c, "%gpumemory on\nlet gpumem = 1;");
}

#[test]
fn cell_magic_must_come_first() {
    let (m, _) = parse("\n\n%%gpumem --timeline\nlet a = 1;");
    assert_eq!(m, vec![Magic::Cell { timeline: true, snapshot: None }]);
    let (m, _) = parse("let a = 1;\n%%gpumem --timeline");
    assert!(matches!(&m[..], [Magic::Bad { line: 2, error, .. }] if error.contains("first line")));
}

#[test]
fn help_lists_every_command_and_says_what_happens_to_code() {
    let h = help_text();
    for c in COMMANDS {
        assert!(h.contains(c.verb), "{}", c.verb);
    }
    assert!(h.contains("fails the cell (a UsageError naming the line"));
    assert!(usage().starts_with("usage: %gpumem help | on | off"));
}

#[test]
fn every_magic_is_a_row_of_the_table_and_the_help_says_when_each_runs() {
    let all = [
        Magic::Help,
        Magic::On,
        Magic::Off,
        Magic::History,
        Magic::Plot,
        Magic::Ranks(None),
        Magic::Summary,
        Magic::Top(5),
        Magic::Snapshot(None),
        Magic::OnOom(None),
        Magic::Diff(DiffSide::Now, DiffSide::Cell(1)),
        Magic::Record { on: true, max_entries: None, stacks: false },
        Magic::Budget(None),
        Magic::Fit(1),
        Magic::Explain,
        Magic::Trim,
        Magic::Export(PathBuf::from("x.csv"), ExportFormat::Csv),
        Magic::Metrics(None),
        Magic::Reset,
        Magic::Restart,
        Magic::Cell { timeline: false, snapshot: None },
        Magic::Sweep(SweepSpec { variable: "b".into(), values: vec!["1".into()], on: None }),
    ];
    let rows: Vec<*const Command> = all.iter().map(|m| m.command().expect("a row") as *const Command).collect();
    for (i, c) in COMMANDS.iter().enumerate() {
        assert!(rows.contains(&(c as *const Command)), "row {i} ({} {}) is no magic", c.verb, c.args);
    }
    let h = help_text();
    let sentence = h.lines().find(|l| l.starts_with("Settings (")).expect("the when sentence");
    let (before, after) = sentence.split_once(" take effect before").unwrap();
    for m in &all {
        let c = m.command().unwrap();
        if c.verb == "help" || c.verb.starts_with("%%") {
            continue;
        }
        let name = if c.args.starts_with("--on-oom") { "snapshot --on-oom" } else { c.verb };
        let side = if m.runs_after_code() { after } else { before };
        assert!(side.contains(name), "{name} on the wrong side of: {sentence}");
    }
    assert!(after.contains("top") && before.contains("metrics"), "{sentence}");
}

/// Every `%gpumem VERB` a user reads (the READMEs, HOW_IT_WORKS.md, the notebooks, both
/// crates' messages and docs) names a verb of the table.
#[test]
fn every_magic_users_read_exists() {
    fn below(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                below(&p, out);
            } else if p.file_name().is_some_and(|n| n == "tests.rs") {
                // Tests (this file) write bad magics on purpose.
            } else if p.extension().is_some_and(|x| x == "rs" || x == "ipynb") {
                out.push(p);
            }
        }
    }
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![repo.join("README.md"), repo.join("kernel/README.md"), repo.join("HOW_IT_WORKS.md")];
    for d in ["src", "kernel/src", "notebooks"] {
        below(&repo.join(d), &mut files);
    }
    let mut seen = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let text = text.split("#[cfg(test)]\nmod tests {").next().unwrap();
        for (i, _) in text.match_indices("%gpumem ") {
            if text[..i].ends_with('%') {
                continue;
            }
            let word: String =
                text[i + 8..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-').collect();
            if !word.starts_with(|c: char| c.is_ascii_alphabetic()) {
                continue;
            }
            seen += 1;
            assert!(COMMANDS.iter().any(|c| c.verb == word), "{}: `%gpumem {word}` is no magic", f.display());
        }
    }
    assert!(seen > 50, "the scan found {seen} magics");
}

#[test]
fn help_is_a_table_with_its_notes() {
    let h = help_html();
    assert!(h.contains("<table") && !h.contains("<pre"), "{h}");
    assert_eq!(h.matches("<tr style").count(), COMMANDS.len() + 1, "the header and a row per magic");
    assert!(h.contains("after the cell&#39;s code") && h.contains("Settings ("), "{h}");
}

#[test]
fn a_typo_gets_a_did_you_mean() {
    let err = |line: &str| match &parse(line).0[..] {
        [Magic::Bad { error, .. }] => error.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(err("%gpumem histroy"), "unknown verb `histroy` (did you mean `history`?)");
    assert_eq!(err("%gpumem explian"), "unknown verb `explian` (did you mean `explain`?)");
    assert_eq!(err("%gpumem frobnicate"), "unknown verb `frobnicate`");
}

#[test]
fn output_magics_run_after_code() {
    assert!(Magic::History.runs_after_code());
    assert!(Magic::Snapshot(None).runs_after_code());
    assert!(Magic::Diff(DiffSide::Now, DiffSide::Cell(1)).runs_after_code());
    assert!(Magic::Fit(1).runs_after_code() && Magic::Explain.runs_after_code());
    assert!(Magic::Ranks(None).runs_after_code());
    assert!(!Magic::OnOom(None).runs_after_code());
    assert!(!Magic::Budget(None).runs_after_code());
    assert!(!Magic::Record { on: true, max_entries: None, stacks: false }.runs_after_code());
}

#[test]
fn a_sweep_takes_a_variable_and_three_numbers_or_says_what_is_wrong() {
    let first = |cell: &str| parse(cell).0.into_iter().next().unwrap();
    assert_eq!(
        first("%%gpumem sweep batch=32,8,16,8 --on 24GiB\nlet x = batch;"),
        Magic::Sweep(SweepSpec {
            variable: "batch".into(),
            values: vec!["8".into(), "16".into(), "32".into()],
            on: Some(24 << 30)
        }),
        "ascending, each once"
    );
    assert_eq!(
        first("%%gpumem sweep scale=0.5,1.0,1_000"),
        Magic::Sweep(SweepSpec {
            variable: "scale".into(),
            values: vec!["0.5".into(), "1.0".into(), "1_000".into()],
            on: None
        })
    );
    let cases = [
        ("%%gpumem sweep", "needs a variable and its values"),
        ("%%gpumem sweep batch", "needs VAR=V1,V2,V3"),
        ("%%gpumem sweep batch=", "has no values"),
        ("%%gpumem sweep batch=8,x16,32", "\"x16\" is not a number"),
        ("%%gpumem sweep batch=8,-16,32", "\"-16\" is not a number"),
        ("%%gpumem sweep 8b=1,2,3", "is not a variable name"),
        ("%%gpumem sweep batch=8,16", "at least 3 different values"),
        ("%%gpumem sweep batch=8,8,16", "(got 2)"),
        ("%%gpumem sweep batch=8,16,32 --on 24Gx", "bad size \"24Gx\" for `--on`"),
        ("%%gpumem sweep batch=8,16,32 --fast", "unknown option `--fast`"),
    ];
    for (cell, want) in cases {
        match &parse(cell).0[..] {
            [Magic::Bad { error, .. }] => {
                assert!(error.contains(want), "{cell}: {error}");
                assert!(!error.contains('\n'), "one line: {error}");
            }
            other => panic!("{cell}: {other:?}"),
        }
    }
}
