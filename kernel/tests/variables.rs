//! A notebook's top-level `let`s behave as in a program (issue 43): every variable is kept for
//! later cells, or lives to its cell's end with one line saying why; a cell never fails for a
//! variable it could not keep. Through `gpumem-kernel run`, real evcxr (patched:
//! `vendor/evcxr/PATCHES.md` §3–4), no dependency but a small path crate.

mod common;

use common::{errors, fresh_dir, notebook, notices, path_crate, result_text, run};

/// Closures, iterator adapters, borrowed slices, a guard, `?` and a variable a loop moves and
/// assigns again, written as in a program: every cell runs; what borrows another variable lives
/// to its cell's end with one line under the cell, and a later cell that names it is told why.
#[test]
fn variables_are_kept_or_live_to_their_cells_end() {
    let cells: &[&str] = &[
        // 0, 1: a `move` closure kept as a boxed `Fn`, called in the next cell.
        "let scale = 3u64;\nlet halve = move |x: u64| x * scale / 2;\nhalve(4)",
        "halve(10)",
        // 2–4: a borrowed slice: its cell runs, `data` is kept, `head` is not (and says so).
        "let data: Vec<u32> = (1..=10).collect();\nlet head = &data[..3];\nhead.iter().sum::<u32>()",
        "data.len()",
        "head.len()",
        // 5, 6: an iterator adapter with a closure in it, kept boxed.
        "let evens = data.clone().into_iter().filter(|x| x % 2 == 0);",
        "evens.collect::<Vec<u32>>()",
        // 7, 8: an `FnMut` closure, kept boxed and callable (mutably) in the next cell.
        "let mut count = 0u32;\nlet mut tick = move || {\n    count += 1;\n    count\n};\ntick()",
        "tick() + tick()",
        // 9–11: a variable of an earlier cell that a loop moves and assigns again.
        "fn grow(mut v: Vec<u32>) -> Vec<u32> {\n    v.push(0);\n    v\n}\nlet mut log: Vec<u32> = Vec::new();",
        "for _ in 0..3 {\n    log = grow(log);\n}\nlog.len()",
        "log.len()",
        // 12, 13: a closure that borrows a local (no `move`): its cell runs; later, the reason.
        "let offset = 10;\nlet add = |x: i32| x + offset;\nadd(1)",
        "add(2)",
        // 14, 15: a guard that borrows its mutex: dropped at the cell's end, the mutex kept.
        "let shared = std::sync::Mutex::new(vec![1, 2]);\nlet guard = shared.lock().unwrap();\nguard.len()",
        "shared.lock().unwrap().len()",
        // 16: `?` in a cell whose first compile must already know it.
        "let n: u32 = \"42\".parse()?;\nn + 1",
        // 17, 18: a value that borrows another mutably and is done with it before the cell uses
        // that one again (cudarc's launch builder): the cell runs, `out` is kept.
        "let mut out = vec![0u32; 4];\nlet mut args: Vec<&mut Vec<u32>> = Vec::new();\nargs.push(&mut out);\nargs[0][1] = 7;\nout[1]",
        "out[1] + 1",
    ];
    let nb = notebook(&cells.iter().map(|c| (*c, &["raises-exception"][..])).collect::<Vec<_>>());
    let (_, out, stderr) = run("variables", &nb, &[]);
    let ok = |i: usize, want: &str| {
        assert!(errors(&out, i).is_empty(), "cell {i} failed: {:?}\n{stderr}", errors(&out, i));
        assert_eq!(result_text(&out, i), want, "cell {i}: {}", cells[i]);
    };
    ok(0, "6");
    ok(1, "15");
    ok(2, "6");
    assert_eq!(
        notices(&out, 2),
        ["`head` borrows `data`: kept for this cell only; write `let head = data[..3].to_vec();`"]
    );
    ok(3, "10");
    let e = errors(&out, 4);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].ends_with(
            "cannot find value `head` in this scope: `head` borrows `data`, so it was kept for its cell only; write \
             `let head = data[..3].to_vec();` there"
        ),
        "{e:?}"
    );
    ok(5, "");
    assert!(notices(&out, 5).is_empty(), "an owned adapter is kept: {:?}", notices(&out, 5));
    ok(6, "[2, 4, 6, 8, 10]");
    ok(7, "1");
    ok(8, "5");
    ok(9, "");
    ok(10, "3");
    ok(11, "3");
    ok(12, "11");
    assert_eq!(
        notices(&out, 12),
        ["`add` borrows `offset`: kept for this cell only; write `let add = move |x: i32| x + offset;`"]
    );
    let e = errors(&out, 13);
    assert!(e.len() == 1 && e[0].contains("`add` borrows `offset`, so it was kept for its cell only"), "{e:?}");
    ok(14, "2");
    let guard = notices(&out, 14);
    assert_eq!(guard, ["`guard` borrows `shared`: kept for this cell only"]);
    ok(15, "2");
    ok(16, "43");
    ok(17, "7");
    assert!(
        notices(&out, 17).concat().starts_with("`args` borrows `out`: kept for this cell only"),
        "{:?}",
        notices(&out, 17)
    );
    ok(18, "8");
}

/// The shape of candle's `VarBuilder` without candle: a type alias over a struct holding a
/// `Box<dyn Trait>` whose trait lives in a module the notebook never imports, and a crate
/// `Result` alias that hides the prelude's `Result` in the notebook. The variables are kept
/// (their types written with paths that compile from the notebook) and used in later cells.
#[test]
fn types_are_written_with_paths_that_compile_in_the_notebook() {
    let dir = fresh_dir("variables-paths");
    let krate = path_crate(
        &dir,
        "builder",
        "",
        "pub mod backend {\n\
             pub trait Backend {\n        fn name(&self) -> String;\n    }\n\
             pub struct Memory;\n\
             impl Backend for Memory {\n        fn name(&self) -> String {\n            \"memory\".into()\n        }\n    }\n\
         }\n\
         pub struct BuilderArgs<'a, B> {\n    backend: B,\n    _life: std::marker::PhantomData<&'a ()>,\n}\n\
         pub type Builder<'a> = BuilderArgs<'a, Box<dyn backend::Backend + 'a>>;\n\
         impl<'a> BuilderArgs<'a, Box<dyn backend::Backend + 'a>> {\n\
             pub fn from_memory() -> Builder<'a> {\n        BuilderArgs { backend: Box::new(backend::Memory), _life: std::marker::PhantomData }\n    }\n\
             pub fn name(&self) -> String {\n        self.backend.name()\n    }\n\
         }\n\
         #[derive(Debug)]\npub struct Error(pub String);\n\
         impl std::fmt::Display for Error {\n    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {\n        f.write_str(&self.0)\n    }\n}\n\
         pub type Result<T> = std::result::Result<T, Error>;\n\
         pub fn check(x: f32) -> Result<f32> {\n    if x >= 0.0 { Ok(x) } else { Err(Error(\"negative\".into())) }\n}\n\
         mod engine {\n    pub struct Engine<T>(pub T);\n}\n\
         pub type Cpu = engine::Engine<u8>;\n\
         pub fn engine() -> engine::Engine<u8> {\n    engine::Engine(5)\n}\n",
    );
    let dep = format!(":dep builder = {{ path = {:?} }}", krate.to_str().unwrap());
    let cells: Vec<String> = vec![
        dep,
        "use builder::{Builder, Result};\nlet b = Builder::from_memory();\nb.name()".into(),
        "b.name()".into(),
        "let checked = |x: f32| -> Result<f32> { builder::check(x * 2.0) };\nchecked(1.0)?".into(),
        "checked(2.0)?".into(),
        // 5, 6: a type in a module the crate keeps private, named through an alias of the
        // notebook's (burn's `Model<MyBackend>` over `CubeBackend<CudaRuntime, …>`).
        "type MyEngine = builder::Cpu;\nlet e = builder::engine();".into(),
        "e.0 + 1".into(),
    ];
    let nb = notebook(&cells.iter().map(|c| (c.as_str(), &[][..])).collect::<Vec<_>>());
    let (status, out, stderr) = run("variables-paths", &nb, &[]);
    for i in 1..cells.len() {
        assert!(errors(&out, i).is_empty(), "cell {i} failed: {:?}\n{stderr}", errors(&out, i));
        assert!(notices(&out, i).is_empty(), "cell {i} kept everything: {:?}", notices(&out, i));
    }
    assert_eq!(result_text(&out, 2), "\"memory\"");
    assert_eq!(result_text(&out, 4), "4.0");
    assert_eq!(result_text(&out, 6), "6");
    assert_eq!(status, 0, "{stderr}");
}
