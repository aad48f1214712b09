// Copyright 2020 The Evcxr Authors.
//
// Licensed under the Apache License, Version 2.0 <LICENSE or
// https://www.apache.org/licenses/LICENSE-2.0> or the MIT license <LICENSE
// or https://opensource.org/licenses/MIT>, at your option. This file may not be
// copied, modified, or distributed except according to those terms.

use anyhow::Context;
use anyhow::Result;
use anyhow::anyhow;
use anyhow::bail;
use once_cell::sync::Lazy;
use ra_ap_base_db::ProcMacroLoadingError;
use ra_ap_base_db::SourceRoot;
use ra_ap_hir as ra_hir;
use ra_ap_ide as ra_ide;
use ra_ap_ide::CompletionFieldsToResolve;
use ra_ap_ide::FileRange;
use ra_ap_ide::RaFixtureConfig;
use ra_ap_ide::SubstTyLen;
use ra_ap_ide_db::FxHashMap;
use ra_ap_ide_db::SnippetCap;
use ra_ap_ide_db::imports::insert_use::ImportGranularity;
use ra_ap_ide_db::imports::insert_use::InsertUseConfig;
use ra_ap_paths::AbsPathBuf;
use ra_ap_proc_macro_api::ProcMacroClient;
use ra_ap_project_model::CargoConfig;
use ra_ap_project_model::ProjectManifest;
use ra_ap_project_model::ProjectWorkspace;
use ra_ap_project_model::RustLibSource;
use ra_ap_syntax::TextRange;
use ra_ap_syntax::ast::AstNode;
use ra_ap_syntax::ast::{self};
use ra_ap_vfs as ra_vfs;
use ra_ap_vfs::FileId;
use ra_ap_vfs::loader::LoadingProgress;
use ra_ap_vfs_notify as vfs_notify;
use ra_ide::CallableSnippets;
use ra_ide::Edition;
use ra_ide::HoverConfig;
use ra_ide::HoverResult;
use ra_ide::RangeInfo;
use std::collections::HashMap;
use std::convert::TryFrom;
use std::path::Path;

pub(crate) const EDITION: Edition = Edition::Edition2024;

pub(crate) struct RustAnalyzer {
    with_sysroot: bool,
    root_directory: AbsPathBuf,
    analysis_host: ra_ide::AnalysisHost,
    vfs: ra_vfs::Vfs,
    loader: vfs_notify::NotifyHandle,
    message_receiver: crossbeam_channel::Receiver<ra_vfs::loader::Message>,
    last_cargo_toml: Option<Vec<u8>>,
    source_file: AbsPathBuf,
    source_file_id: FileId,
    current_source: String,
    /// The cells' crate as a workspace, kept to build its crate graph again when proc macros
    /// become available (gpumem-kernel's patch, PATCHES.md §5).
    workspace: Option<ProjectWorkspace>,
    /// The sysroot's proc-macro server, started at the first crate graph with proc-macro crates
    /// (or why it could not be).
    proc_macro_server: Option<Result<ProcMacroClient, String>>,
    /// The built proc macros (`PROC_MACROS_FILE`) the crate graph was last built with.
    last_proc_macros: Option<Vec<u8>>,
    /// The crate graph changed since the crates were last read: the next source change reads
    /// them one by one (gpumem-kernel's patch, PATCHES.md §10).
    graph_changed: bool,
    /// Library files whose text type inference was given as empty: no crate of the graph has
    /// them as a module (PATCHES.md §10). Their text is given back when the graph changes.
    blanked: Vec<FileId>,
}

/// Where evcxr's build records the proc-macro libraries cargo built for the cells' crate: one
/// JSON object from `name@version` to the library's path (gpumem-kernel's patch).
pub(crate) const PROC_MACROS_FILE: &str = "evcxr-proc-macros.json";

/// Records the proc-macro libraries among cargo's messages of a build of the cells' crate in
/// `crate_dir`'s `PROC_MACROS_FILE` (merged with those of earlier builds: a build without
/// cargo reports none).
pub(crate) fn record_proc_macros(cargo_stdout: &[u8], crate_dir: &Path) {
    let path = crate_dir.join(PROC_MACROS_FILE);
    let mut known: std::collections::BTreeMap<String, String> = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let before = known.clone();
    for line in String::from_utf8_lossy(cargo_stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_proc_macro = message["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "proc-macro"));
        if message["reason"] != "compiler-artifact" || !is_proc_macro {
            continue;
        }
        let (Some(name), Some(version), Some(file)) = (
            message["target"]["name"].as_str(),
            message["package_id"]
                .as_str()
                .and_then(|id| id.rsplit_once('@'))
                .map(|(_, v)| v),
            message["filenames"][0].as_str(),
        ) else {
            continue;
        };
        known.insert(
            format!("{}@{version}", name.replace('-', "_")),
            file.to_owned(),
        );
    }
    if known != before
        && let Ok(text) = serde_json::to_vec_pretty(&known)
    {
        let _ = std::fs::write(&path, text);
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum TypeName {
    /// The type as code that compiles in the cells' crate (every ADT and trait by a path).
    Named(String),
    /// Kept as this boxed trait object (a closure, an `impl Fn`, an `impl Iterator`, a single
    /// `impl Trait`); the value is boxed when it is first stored. `needs_mut`: calling or
    /// iterating it takes `&mut` (`FnMut`, an iterator).
    Boxed { type_name: String, needs_mut: bool },
    /// Cannot be kept after its cell, and why.
    NotKept(NotKept),
}

/// Why a variable cannot be kept after its cell, as rust-analyzer sees it.
#[derive(Debug, PartialEq, Eq)]
pub enum NotKept {
    /// rust-analyzer has no type for it.
    Unknown,
    /// Its type cannot be written in code (shown as rust-analyzer displays it).
    Unnameable { shown: String, why: &'static str },
    /// A closure that captures `local` by reference (not `move`).
    ClosureBorrows { local: String },
}

#[derive(Debug)]
pub(crate) struct VariableInfo {
    /// The variable's type as Rust code, or None if we couldn't determine it.
    pub(crate) type_name: TypeName,
    /// Whether the variable is declared as mutable.
    pub(crate) is_mutable: bool,
}

impl RustAnalyzer {
    pub(crate) fn new(root_directory: &Path) -> Result<RustAnalyzer> {
        use ra_vfs::loader::Handle;
        let (message_sender, message_receiver) = crossbeam_channel::unbounded();
        let mut vfs = ra_vfs::Vfs::default();
        let root_directory = AbsPathBuf::try_from(
            root_directory
                .to_str()
                .context("Root directory is not UTF-8")?,
        )
        .map_err(|path| anyhow!("Evcxr tmpdir is not absolute: '{:?}'", path))?;
        let source_file = root_directory.join("src/lib.rs");
        // We need to write the file to the filesystem even though we subsequently set the file
        // contents via the vfs and change.change_file. This is because the loader checks for the
        // files existence when determining the crate structure.
        let src_dir = root_directory.join("src");
        std::fs::create_dir_all(&src_dir)
            .with_context(|| format!("Failed to create directory `{src_dir:?}`"))?;
        // Pre-allocate an ID for our main source file.
        let vfs_source_file: ra_vfs::VfsPath = source_file.clone().into();
        vfs.set_file_contents(vfs_source_file.clone(), Some(vec![]));
        let (source_file_id, _) = vfs.file_id(&vfs_source_file).unwrap();
        Ok(RustAnalyzer {
            with_sysroot: true,
            root_directory,
            analysis_host: Default::default(),
            vfs,
            loader: vfs_notify::NotifyHandle::spawn(message_sender),
            message_receiver,
            last_cargo_toml: None,
            source_file,
            source_file_id,
            current_source: String::new(),
            workspace: None,
            proc_macro_server: None,
            last_proc_macros: None,
            graph_changed: false,
            blanked: Vec::new(),
        })
    }

    pub(crate) fn set_source(&mut self, source: String) -> Result<()> {
        self.set_source_until(source, None).map(|_| ())
    }

    /// Whether Cargo.toml differs from the one type inference last read: the next
    /// `set_source` loads a new crate graph.
    pub(crate) fn cargo_toml_changed(&self) -> bool {
        std::fs::read(self.cargo_toml_filename()).ok() != self.last_cargo_toml
    }

    /// `set_source`, reading a new crate graph's crates only until `done` turns true; what is
    /// left unread then is read by the next `set_source` (gpumem-kernel's patch, PATCHES.md
    /// §11: a `:dep` cell's build runs meanwhile). Whether every crate was read.
    pub(crate) fn set_source_until(
        &mut self,
        source: String,
        done: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<bool> {
        self.current_source = source;
        let mut change = ra_hir::ChangeWithProcMacros::default();

        // While a build runs (`done`), src/lib.rs is the build's: type inference keeps its text
        // in the database only.
        if done.is_none() {
            std::fs::write(self.source_file.as_path(), &*self.current_source)
                .with_context(|| format!("Failed to write {:?}", self.source_file))?;
        }
        self.vfs.set_file_contents(
            self.source_file.clone().into(),
            Some(self.current_source.bytes().collect()),
        );
        change.change_file(self.source_file_id, Some(self.current_source.clone()));

        // Check to see if we haven't yet loaded Cargo.toml, or if it's changed since we read it.
        let cargo_toml = Some(std::fs::read(self.cargo_toml_filename()).with_context(|| {
            format!(
                "Failed to read Cargo.toml from `{:?}`",
                self.cargo_toml_filename()
            )
        })?);
        let proc_macros = std::fs::read(self.root_directory.join(PROC_MACROS_FILE)).ok();
        if cargo_toml != self.last_cargo_toml {
            self.load_cargo_toml(&mut change)?;
            self.last_cargo_toml = cargo_toml;
            self.last_proc_macros = proc_macros;
        } else if proc_macros != self.last_proc_macros && self.workspace.is_some() {
            // A build made the dependencies' proc macros: the crate graph again, with them.
            self.set_crate_graph(&mut change);
            self.last_proc_macros = proc_macros;
        }

        if self.graph_changed {
            // A new graph may make a module of a file it had no use for (a feature turned on).
            for id in std::mem::take(&mut self.blanked) {
                let text = self
                    .vfs
                    .file_path(id)
                    .as_path()
                    .and_then(|p| std::fs::read_to_string(p).ok());
                change.change_file(id, Some(text.unwrap_or_default()));
            }
        }
        self.analysis_host.apply_change(change);
        if std::mem::take(&mut self.graph_changed) {
            if self.read_crates_one_by_one(done) {
                self.blank_unused_files();
                self.release_memory();
            } else {
                // Stopped early: the rest at the next `set_source`.
                self.graph_changed = true;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Gives type inference an empty text for each library file that no crate of the graph has
    /// as a module (another platform's modules, a feature's that is off, tests): read once by the
    /// loader, never parsed, their text would stay in the database. Only files of the registry's
    /// crates and of the standard library's sources are emptied, and none in the folder of a
    /// module that `include!`s a file (a build script's output lives elsewhere and is kept).
    fn blank_unused_files(&mut self) {
        use ra_ap_base_db::SourceDatabase;
        let db = self.analysis_host.raw_database();
        let mut modules = std::collections::HashSet::new();
        ra_hir::attach_db(db, || {
            for krate in ra_ap_base_db::all_crates(db).iter() {
                for m in ra_hir::Crate::from(*krate).modules(db) {
                    modules.insert(
                        m.definition_source_file_id(db)
                            .original_file(db)
                            .file_id(db),
                    );
                }
            }
        });
        let mut including = Vec::new();
        for (id, path) in self.vfs.iter() {
            if modules.contains(&id) && db.file_text(id).text(db).contains("include!") {
                let path = path.to_string();
                if let Some((dir, _)) = path.rsplit_once('/') {
                    including.push(format!("{dir}/"));
                }
            }
        }
        let mut change = ra_hir::ChangeWithProcMacros::default();
        for (id, path) in self.vfs.iter() {
            let path = path.to_string();
            let library =
                path.contains("/registry/src/") || path.contains("/lib/rustlib/src/rust/library/");
            if !library
                || modules.contains(&id)
                || including.iter().any(|d| path.starts_with(d.as_str()))
            {
                continue;
            }
            if !db.file_text(id).text(db).is_empty() {
                change.change_file(id, Some(String::new()));
                self.blanked.push(id);
            }
        }
        self.analysis_host.apply_change(change);
    }

    /// Each crate's definitions and trait impls, dependencies first, with a new revision after
    /// each, so that salsa's LRU caches let go of the syntax trees one crate needed before the
    /// next parses its own: type inference finds them computed, and the memory it needs at its
    /// peak is about one crate's trees, not every crate's at once (gpumem-kernel's patch,
    /// PATCHES.md §10). Stops before the next crate once `done` is true, and then answers
    /// false (§11).
    fn read_crates_one_by_one(&mut self, done: Option<&std::sync::atomic::AtomicBool>) -> bool {
        use ra_ap_base_db::salsa::Database;
        let crates = ra_ap_base_db::all_crates(self.analysis_host.raw_database()).to_vec();
        for krate in crates {
            if done.is_some_and(|d| d.load(std::sync::atomic::Ordering::Acquire)) {
                return false;
            }
            let db = self.analysis_host.raw_database();
            ra_hir::attach_db(db, || {
                let _ = ra_hir::crate_def_map(db, krate);
                let _ = ra_hir::TraitImpls::for_crate(db, krate);
            });
            self.analysis_host
                .raw_database_mut()
                .synthetic_write(ra_ap_base_db::salsa::Durability::LOW);
        }
        true
    }

    /// What type inference no longer needs dropped (salsa's unused memos, interned types no
    /// query holds), and the heap's free pages given back to the system (gpumem-kernel's patch,
    /// PATCHES.md §10).
    pub(crate) fn release_memory(&mut self) {
        self.analysis_host.trigger_garbage_collection();
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim takes no pointer and frees nothing in use: it returns glibc's
        // free heap pages to the kernel.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    /// Returns top-level variable names and their types in the specified function.
    pub(crate) fn top_level_variables(&self, function_name: &str) -> HashMap<String, VariableInfo> {
        use ra_ap_syntax::ast::HasModuleItem;
        use ra_ap_syntax::ast::HasName;
        let mut result = HashMap::new();
        let db = self.analysis_host.raw_database();
        let sema = ra_ide::Semantics::new(db);

        let source_file = sema.parse(ra_ap_base_db::EditionedFileId::new(
            db,
            self.source_file_id,
            EDITION,
        ));

        ra_ap_hir::attach_db(db, || {
            for item in source_file.items() {
                if let ast::Item::Fn(function) = item
                    && function
                        .name()
                        .map(|n| n.text() == function_name)
                        .unwrap_or(false)
                {
                    let Some(body) = function.body() else {
                        continue;
                    };
                    let scope = sema.scope(function.syntax()).unwrap();
                    for statement in body.statements() {
                        if let ast::Stmt::LetStmt(let_stmt) = statement
                            && let Some(pat) = let_stmt.pat()
                            && !add_variable_for_pattern(
                                &pat,
                                &sema,
                                let_stmt.ty(),
                                &scope,
                                &mut result,
                            )
                        {
                            // We didn't add a variable for `pat`, possibly because it's a
                            // more complex pattern that needs destructuring. Try for each
                            // sub pattern. This time, we ignore the explicit type, because
                            // it applies to the whole pattern, not to its parts. Note, this
                            // will attempt `pat` again, but that's OK, since it failed
                            // above, so will fail again.
                            for d in pat.syntax().descendants() {
                                if let Some(sub_pat) = ast::Pat::cast(d) {
                                    add_variable_for_pattern(
                                        &sub_pat,
                                        &sema,
                                        None,
                                        &scope,
                                        &mut result,
                                    );
                                }
                            }
                        }
                    }
                }
            }
        });

        result
    }

    fn load_cargo_toml(&mut self, change: &mut ra_hir::ChangeWithProcMacros) -> Result<()> {
        let manifest = ProjectManifest::from_manifest_file(self.cargo_toml_filename())?;
        let sysroot = if self.with_sysroot {
            Some(RustLibSource::Discover)
        } else {
            None
        };
        let config = CargoConfig {
            sysroot,
            ..CargoConfig::default()
        };
        let workspace = ProjectWorkspace::load(manifest, &config, &|_| {})?;
        let load = workspace
            .to_roots()
            .iter()
            .map(|root| {
                ra_vfs::loader::Entry::Directories(ra_vfs::loader::Directories {
                    extensions: vec!["rs".to_owned()],
                    include: root.include.clone(),
                    exclude: root.exclude.clone(),
                })
            })
            .collect();
        // Note, set_config is what triggers loading and calling the callback that we registered when we created self.loader.
        use ra_vfs::loader::Handle;
        self.loader.set_config(ra_vfs::loader::Config {
            version: 1,
            load,
            watch: vec![],
        });

        for message in &self.message_receiver {
            match message {
                ra_vfs::loader::Message::Progress {
                    n_total: _, n_done, ..
                } => {
                    if n_done == LoadingProgress::Finished {
                        break;
                    }
                }
                ra_vfs::loader::Message::Loaded { files }
                | ra_vfs::loader::Message::Changed { files } => {
                    for (path, contents) in files {
                        let vfs_path: ra_vfs::VfsPath = path.to_path_buf().into();
                        self.vfs
                            .set_file_contents(vfs_path.clone(), contents.clone());
                    }
                }
            }
        }

        for (file_id, changed_file) in self.vfs.take_changes() {
            let mut new_contents = None;
            if let ra_vfs::Change::Create(v, _hash) | ra_vfs::Change::Modify(v, _hash) =
                changed_file.change
                && let Ok(text) = std::str::from_utf8(&v)
            {
                new_contents = Some(text.to_owned());
            }
            change.change_file(file_id, new_contents);
        }
        // The cells' crate is the only source that changes between evaluations; every other
        // root (the sysroot, registry and path dependencies) is a library, so salsa does not
        // re-verify what was derived from them each time the cell's source is set.
        let mut file_sets = ra_vfs::file_set::FileSetConfig::builder();
        file_sets.add_file_set(vec![ra_vfs::VfsPath::from(self.root_directory.join("src"))]);
        change.set_roots(
            file_sets
                .build()
                .partition(&self.vfs)
                .into_iter()
                .enumerate()
                .map(|(i, set)| {
                    if i == 0 {
                        SourceRoot::new_local(set)
                    } else {
                        SourceRoot::new_library(set)
                    }
                })
                .collect(),
        );
        self.workspace = Some(workspace);
        self.set_crate_graph(change);
        Ok(())
    }

    /// The crate graph of the cells' workspace, with the proc macros of the dependencies that a
    /// build has made (`PROC_MACROS_FILE`), expanded by the sysroot's proc-macro server: a
    /// `#[derive(Module)]` of burn or `#[derive(Deserialize)]` of serde then exists for type
    /// inference, as it does for rustc (gpumem-kernel's patch, PATCHES.md §5).
    fn set_crate_graph(&mut self, change: &mut ra_hir::ChangeWithProcMacros) {
        let Some(workspace) = &self.workspace else {
            return;
        };
        let (crate_graph, proc_macro_paths) = workspace.to_crate_graph(
            &mut |path| {
                self.vfs
                    .file_id(&path.to_path_buf().into())
                    .map(|(id, _)| id)
            },
            &FxHashMap::default(),
        );
        let built: HashMap<String, String> =
            std::fs::read(self.root_directory.join(PROC_MACROS_FILE))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
        if !proc_macro_paths.is_empty() && self.proc_macro_server.is_none() {
            let server = match workspace.find_sysroot_proc_macro_srv() {
                Some(Ok(path)) => ProcMacroClient::spawn(
                    &path,
                    &FxHashMap::<String, Option<String>>::default(),
                    workspace.toolchain.as_ref(),
                    1,
                )
                .map_err(|e| e.to_string()),
                Some(Err(e)) => Err(e.to_string()),
                None => Err("no sysroot".to_owned()),
            };
            self.proc_macro_server = Some(server);
        }
        let proc_macros: ra_hir::ProcMacrosBuilder = proc_macro_paths
            .into_iter()
            .map(|(id, path)| {
                let krate = &crate_graph[id];
                let name = krate
                    .extra
                    .display_name
                    .as_ref()
                    .map(|n| n.canonical_name().as_str().to_owned());
                let key = name
                    .zip(krate.extra.version.clone())
                    .map(|(n, v)| format!("{n}@{v}"));
                let dylib = key
                    .and_then(|k| built.get(&k))
                    .and_then(|p| AbsPathBuf::try_from(p.as_str()).ok());
                let loaded = match (dylib, &self.proc_macro_server) {
                    (Some(dylib), Some(Ok(server))) => {
                        ra_ap_load_cargo::load_proc_macro(server, &dylib, &[])
                    }
                    (Some(_), Some(Err(e))) => Err(ProcMacroLoadingError::ProcMacroSrvError(
                        e.clone().into_boxed_str(),
                    )),
                    _ => path.and_then(|_| Err(ProcMacroLoadingError::NotYetBuilt)),
                };
                (id, loaded)
            })
            .collect();
        change.set_crate_graph(crate_graph);
        change.set_proc_macros(proc_macros);
        self.graph_changed = true;
    }

    fn cargo_toml_filename(&self) -> AbsPathBuf {
        self.root_directory.join("Cargo.toml")
    }

    pub(crate) fn completions(&self, position: usize) -> Result<Completions> {
        let mut completions = Vec::new();
        let mut range = None;
        let config = ra_ide::CompletionConfig {
            enable_postfix_completions: true,
            snippet_cap: SnippetCap::new(true),
            enable_imports_on_the_fly: false,
            enable_self_on_the_fly: true,
            enable_private_editable: true,
            prefer_no_std: false,
            full_function_signatures: true,
            snippets: vec![],
            insert_use: InsertUseConfig {
                prefix_kind: ra_hir::PrefixKind::ByCrate,
                group: false,
                granularity: ImportGranularity::Item,
                enforce_granularity: false,
                skip_glob_imports: false,
            },
            callable: Some(CallableSnippets::FillArguments),
            limit: None,
            prefer_prelude: false,
            enable_term_search: true,
            term_search_fuel: 400,
            prefer_absolute: false,
            add_semicolon_to_unit: true,
            fields_to_resolve: CompletionFieldsToResolve::empty(),
            exclude_flyimport: vec![],
            exclude_traits: &[],
            enable_auto_iter: true,
            enable_auto_await: true,
            ra_fixture: RaFixtureConfig::default(),
            add_colons_to_module: true,
        };
        if let Ok(Some(completion_items)) = self.analysis_host.analysis().completions(
            &config,
            ra_ide::FilePosition {
                file_id: self.source_file_id,
                offset: (position as u32).into(),
            },
            None,
        ) {
            for item in completion_items {
                use regex::Regex;
                static ARG_PLACEHOLDER: Lazy<Regex> =
                    Lazy::new(|| Regex::new("\\$\\{[0-9]+:([^}]*)\\}").unwrap());
                let mut indels = item.text_edit.iter();
                if let Some(indel) = indels.next() {
                    let text_to_delete = &self.current_source[indel.delete];
                    // Rust analyzer returns all available methods/fields etc. It's up to us to
                    // decide how what we filter and what we keep.
                    if !item.lookup().starts_with(text_to_delete) {
                        continue;
                    }
                    completions.push(Completion {
                        code: ARG_PLACEHOLDER
                            .replace_all(&indel.insert, "$1")
                            .replace("$0", ""),
                        kind: jupyter_kind(item.kind),
                        label: item.label.primary.to_string(),
                    });
                    if let Some(previous_range) = range.as_ref() {
                        if *previous_range != indel.delete {
                            bail!(
                                "Different completions wanted to replace different parts of the text"
                            );
                        }
                    } else {
                        range = Some(indel.delete)
                    }
                }
                if indels.next().is_some() {
                    bail!("Completion unexpectedly provided more than one insertion/deletion");
                }
            }
        }
        Ok(Completions {
            completions,
            start_offset: range.map(|range| range.start().into()).unwrap_or(position),
            end_offset: range.map(|range| range.end().into()).unwrap_or(position),
        })
    }

    pub(crate) fn hover(
        &self,
        text_range: TextRange,
        is_mark_down: bool,
    ) -> Result<Option<RangeInfo<HoverResult>>> {
        use ra_ide::HoverDocFormat as hdf;
        let hover_config: HoverConfig = HoverConfig {
            links_in_hover: true,
            memory_layout: None,
            documentation: true,
            keywords: true,
            format: if is_mark_down {
                hdf::Markdown
            } else {
                hdf::PlainText
            },
            max_trait_assoc_items_count: None,
            max_fields_count: Some(5),
            max_enum_variants_count: Some(5),
            max_subst_ty_len: SubstTyLen::Unlimited,
            show_drop_glue: false,
            ra_fixture: RaFixtureConfig::default(),
        };
        let file_range = FileRange {
            file_id: self.source_file_id,
            range: text_range,
        };
        match self
            .analysis_host
            .analysis()
            .hover(&hover_config, file_range)
        {
            Ok(range_info) => Ok(range_info),
            _ => bail!("hover fail"),
        }
    }
}

/// If `pat` represents a variable that is being defined, then record it in `result` and return
/// true.
fn add_variable_for_pattern(
    pat: &ast::Pat,
    sema: &ra_hir::Semantics<ra_ide::RootDatabase>,
    explicit_type: Option<ast::Type>,
    scope: &ra_hir::SemanticsScope<'_>,
    result: &mut HashMap<String, VariableInfo>,
) -> bool {
    use ra_ap_syntax::ast::HasName;
    if let ast::Pat::IdentPat(ident_pat) = pat
        && let Some(name) = ident_pat.name()
    {
        let type_name = get_type_name(
            explicit_type,
            sema.type_of_pat(pat).map(|info| info.original()),
            sema,
            scope,
        );
        result.insert(
            name.text().to_string(),
            VariableInfo {
                type_name,
                is_mutable: ident_pat.mut_token().is_some(),
            },
        );
        return true;
    }
    false
}

fn get_type_name(
    explicit_type: Option<ast::Type>,
    inferred_type: Option<ra_hir::Type>,
    sema: &ra_hir::Semantics<ra_ide::RootDatabase>,
    scope: &ra_hir::SemanticsScope<'_>,
) -> TypeName {
    use ra_hir::HirDisplay;
    if let Some(explicit_type) = explicit_type {
        let type_name = explicit_type.syntax().text().to_string();
        if is_type_valid(&type_name) {
            return TypeName::Named(type_name);
        }
    }
    let Some(ty) = inferred_type else {
        return TypeName::NotKept(NotKept::Unknown);
    };
    if let Some(type_name) =
        source_type(&ty, sema, scope).or_else(|| through_aliases(&ty, sema, scope))
    {
        return TypeName::Named(type_name);
    }
    if let Some(kept) = boxed_callable(&ty, sema, scope)
        .or_else(|| boxed_iterator(&ty, sema, scope))
        .or_else(|| boxed_impl_trait(&ty, sema, scope))
    {
        return kept;
    }
    let module = scope.module();
    let shown = ty
        .display(sema.db, module.krate(sema.db).to_display_target(sema.db))
        .to_string();
    if shown == "{unknown}" || shown.contains("{unknown}") {
        return TypeName::NotKept(NotKept::Unknown);
    }
    let why = if ty.display_source_code(sema.db, module.into(), true).is_ok() {
        // It renders with opaque parts: a closure or an `impl Trait` inside another type.
        "its type contains a closure or an `impl Trait`, which cannot be named"
    } else {
        "its type cannot be named from the notebook (a private type?)"
    };
    TypeName::NotKept(NotKept::Unnameable { shown, why })
}

/// How paths to traits are looked for (the same preferences rust-analyzer's own source-code
/// display uses for ADTs).
const FIND_PATH: ra_hir::FindPathConfig = ra_hir::FindPathConfig {
    prefer_no_std: false,
    prefer_prelude: true,
    prefer_absolute: false,
    allow_unstable: true,
};

/// `ty` as code valid in `module`: every ADT and trait by a path, nothing opaque, no `_`.
fn source_type(
    ty: &ra_hir::Type,
    sema: &ra_hir::Semantics<ra_ide::RootDatabase>,
    scope: &ra_hir::SemanticsScope<'_>,
) -> Option<String> {
    use ra_hir::HirDisplay;
    // Opaque parts (a closure, an `impl Trait`) are refused: such text parses, but a stored
    // variable's type cannot contain them (E0562).
    let text = ty
        .display_source_code(sema.db, scope.module().into(), false)
        .ok()?
        // Regions erased in a closure's signature: elided again.
        .replace("'<erased>", "'_");
    let text = qualify_paths(&text, ty, sema, scope)?;
    is_type_valid(&text).then_some(text)
}

/// How an item is named when the notebook's scope hides the name rust-analyzer chose (a cell's
/// `use candle_core::Result;` hides the prelude's `Result`).
const FIND_PATH_ABSOLUTE: ra_hir::FindPathConfig = ra_hir::FindPathConfig {
    prefer_no_std: false,
    prefer_prelude: false,
    prefer_absolute: true,
    allow_unstable: true,
};

/// Whether `text`, as a path in `scope`, names `def`.
fn resolves_to(text: &str, def: ra_hir::ModuleDef, scope: &ra_hir::SemanticsScope<'_>) -> bool {
    let path = ast::make::path_from_text_with_edition(text, EDITION);
    matches!(scope.speculative_resolve(&path), Some(ra_hir::PathResolution::Def(d)) if d == def)
}

/// A path to `def` that names it in `scope`: the plain one when it does, else an absolute one.
fn path_in_scope(
    def: ra_hir::ModuleDef,
    sema: &ra_hir::Semantics<ra_ide::RootDatabase>,
    scope: &ra_hir::SemanticsScope<'_>,
) -> Option<String> {
    let db = sema.db;
    let module = scope.module();
    let plain = module
        .find_path(db, def, FIND_PATH)?
        .display(db, EDITION)
        .to_string();
    if resolves_to(&plain, def, scope) {
        return Some(plain);
    }
    let absolute = module
        .find_path(db, def, FIND_PATH_ABSOLUTE)?
        .display(db, EDITION)
        .to_string();
    resolves_to(&absolute, def, scope).then_some(absolute)
}

/// Makes every path in rust-analyzer's source text of `ty` name what it meant, from `scope`:
/// - the traits of `dyn` and `impl` bounds and of `<T as Trait>`, which rust-analyzer writes by
///   their bare name (candle's `VarBuilder` is `VarBuilderArgs<'_, Box<dyn SimpleBackend>>`, and
///   `SimpleBackend` is not in the notebook's scope), get their paths;
/// - a type whose name the notebook's scope gives to something else (rust-analyzer writes the
///   prelude's `Result` where a cell's `use candle_core::Result;` made `Result` candle's alias)
///   gets an absolute path.
///
/// `None` when an item has no path from there, or two traits share a name.
fn qualify_paths(
    text: &str,
    ty: &ra_hir::Type,
    sema: &ra_hir::Semantics<ra_ide::RootDatabase>,
    scope: &ra_hir::SemanticsScope<'_>,
) -> Option<String> {
    use ra_ap_syntax::SyntaxKind;
    let db = sema.db;
    let module = scope.module();
    let (adts, traits) = named_items(ty, db);
    if traits.is_empty() && adts.is_empty() {
        return Some(text.to_owned());
    }
    // A trait's bare name, and an ADT's path as rust-analyzer wrote it, to the path written.
    let mut trait_paths: HashMap<String, String> = HashMap::new();
    for t in traits {
        let def = ra_hir::ModuleDef::Trait(t);
        let name = t.name(db).display(db, EDITION).to_string();
        let path = path_in_scope(def, sema, scope)?;
        if trait_paths
            .insert(name, path.clone())
            .is_some_and(|other| other != path)
        {
            return None;
        }
    }
    let mut type_paths: HashMap<String, String> = HashMap::new();
    for adt in adts {
        let def = ra_hir::ModuleDef::Adt(adt);
        let written = module
            .find_path(db, def, FIND_PATH)?
            .display(db, EDITION)
            .to_string();
        if !resolves_to(&written, def, scope) {
            type_paths.insert(written, path_in_scope(def, sema, scope)?);
        }
    }
    rewrite_paths(text, |path, _| {
        let Some(parent) = path
            .syntax()
            .parent()
            .filter(|p| p.kind() == SyntaxKind::PATH_TYPE)
        else {
            return Some(None);
        };
        let in_trait_position = parent
            .parent()
            .is_some_and(|g| matches!(g.kind(), SyntaxKind::TYPE_BOUND | SyntaxKind::TYPE_ANCHOR));
        // The path up to its last name, without generic arguments: `a::b::C` of `a::b::C<T>`.
        let written: Vec<String> = path
            .segments()
            .map(|s| {
                s.name_ref()
                    .map(|n| n.text().to_string())
                    .unwrap_or_default()
            })
            .collect();
        let written = written.join("::");
        let replacement = if in_trait_position && path.qualifier().is_none() {
            trait_paths.get(&written)
        } else {
            type_paths.get(&written)
        };
        Some(replacement.filter(|full| **full != written).cloned())
    })
}

/// The ADTs and traits `ty` names, everywhere in it (`dyn` and `impl` bounds, `<T as Trait>`).
fn named_items(
    ty: &ra_hir::Type,
    db: &ra_ide::RootDatabase,
) -> (Vec<ra_hir::Adt>, Vec<ra_hir::Trait>) {
    let mut adts = Vec::new();
    let mut traits = Vec::new();
    ty.walk(db, |t| {
        adts.extend(t.as_adt());
        traits.extend(t.as_dyn_trait());
        if let Some(it) = t.as_impl_traits(db) {
            traits.extend(it);
        }
        traits.extend(t.as_associated_type_parent_trait(db));
    });
    (adts, traits)
}

/// `text`, a type, with its paths rewritten: `replace` is asked for each path with its last
/// name, and answers `None` to give up, `Some(None)` to keep the path, `Some(Some(full))` to
/// write `full` from the path's start to that name (its generic arguments kept).
fn rewrite_paths(
    text: &str,
    mut replace: impl FnMut(&ast::Path, &ast::NameRef) -> Option<Option<String>>,
) -> Option<String> {
    let prefix = "type EvcxrT = ";
    let source = format!("{prefix}{text};");
    let parsed = ast::SourceFile::parse(&source, EDITION);
    let mut edits = Vec::new();
    for path in parsed
        .syntax_node()
        .descendants()
        .filter_map(ast::Path::cast)
    {
        let Some(last) = path.segment().and_then(|s| s.name_ref()) else {
            continue;
        };
        if let Some(full) = replace(&path, &last)? {
            let start = usize::from(path.syntax().text_range().start());
            edits.push((start..usize::from(last.syntax().text_range().end()), full));
        }
    }
    let mut out = source;
    for (range, full) in edits.into_iter().rev() {
        out.replace_range(range, &full);
    }
    Some(out[prefix.len()..out.len() - 1].to_owned())
}

/// `ty` written with the type aliases the notebook can name, where its full type cannot be
/// written from there: burn's `Cuda<f32>` is `CubeBackend<CudaRuntime, f32, i32, u8>`, whose
/// crates the notebook does not depend on, and a model on it is written `Model<MyBackend>` after
/// the book's `type MyBackend = Cuda<f32>;`. Each part of `ty` that is an alias's type (an alias
/// without generic parameters, the longest first) becomes the alias's name; every other name
/// gets a path from the notebook (`path_in_scope`). `None` when no alias applies or a name is
/// left without a path.
fn through_aliases(
    ty: &ra_hir::Type,
    sema: &ra_hir::Semantics<ra_ide::RootDatabase>,
    scope: &ra_hir::SemanticsScope<'_>,
) -> Option<String> {
    use ra_ap_syntax::SyntaxKind;
    use ra_hir::HirDisplay;
    let db = sema.db;
    let target = scope.module().krate(db).to_display_target(db);
    let mut aliases: Vec<(String, String)> = Vec::new();
    scope.process_all_names(&mut |name, def| {
        if let ra_hir::ScopeDef::ModuleDef(ra_hir::ModuleDef::TypeAlias(alias)) = def
            && ra_hir::GenericDef::from(alias).params(db).is_empty()
        {
            let shown = alias.ty(db).display(db, target).to_string();
            if !shown.contains("{unknown}") {
                aliases.push((shown, name.display(db, EDITION).to_string()));
            }
        }
    });
    aliases.sort_by_key(|(shown, _)| std::cmp::Reverse(shown.len()));
    let mut text = ty.display(db, target).to_string();
    let mut used = false;
    for (shown, name) in &aliases {
        if let Some(replaced) = replace_whole(&text, shown, name) {
            text = replaced;
            used = true;
        }
    }
    if !used {
        return None;
    }
    // The names left, by what `ty` holds.
    let (adts, traits) = named_items(ty, db);
    let defs: HashMap<String, ra_hir::ModuleDef> = adts
        .into_iter()
        .map(|a| (a.name(db).display(db, EDITION).to_string(), a.into()))
        .chain(
            traits
                .into_iter()
                .map(|t| (t.name(db).display(db, EDITION).to_string(), t.into())),
        )
        .collect();
    let text = rewrite_paths(&text, |path, last| {
        // Whole paths only (not the qualifier of another).
        if path
            .syntax()
            .parent()
            .is_some_and(|p| p.kind() == SyntaxKind::PATH)
        {
            return Some(None);
        }
        let name = last.text().to_string();
        let plain = path.qualifier().is_none();
        match defs.get(&name) {
            Some(def) if plain && resolves_to(&name, *def, scope) => Some(None),
            Some(def) => path_in_scope(*def, sema, scope).map(Some),
            // A builtin type or an alias put in above.
            None if plain
                && scope
                    .speculative_resolve(&ast::make::path_from_text_with_edition(&name, EDITION))
                    .is_some() =>
            {
                Some(None)
            }
            None => None,
        }
    })?;
    is_type_valid(&text).then_some(text)
}

/// `text` with every whole occurrence of `what` (not part of a longer name or path) replaced by
/// `with`; `None` when there is none.
fn replace_whole(text: &str, what: &str, with: &str) -> Option<String> {
    let name_char = |c: char| c.is_alphanumeric() || c == '_' || c == ':';
    let mut out = String::new();
    let mut rest = text;
    let mut found = false;
    while let Some(at) = rest.find(what) {
        let before = rest[..at]
            .chars()
            .next_back()
            .or_else(|| out.chars().next_back());
        let after = rest[at + what.len()..].chars().next();
        let whole =
            !before.is_some_and(name_char) && !after.is_some_and(|c| name_char(c) || c == '<');
        out.push_str(&rest[..at]);
        out.push_str(if whole { with } else { what });
        found |= whole;
        rest = &rest[at + what.len()..];
    }
    out.push_str(rest);
    found.then_some(out)
}

/// A closure or a value of an `impl Fn*` type, kept as `Box<dyn Fn*(params) -> ret>`; a closure
/// that borrows a local (captures it by reference) cannot be kept.
fn boxed_callable(
    ty: &ra_hir::Type,
    sema: &ra_hir::Semantics<ra_ide::RootDatabase>,
    scope: &ra_hir::SemanticsScope<'_>,
) -> Option<TypeName> {
    let db = sema.db;
    let callable = ty.as_callable(db)?;
    let kind = match callable.kind() {
        ra_hir::CallableKind::Closure(c) => {
            if let Some(cap) = c
                .captured_items(db)
                .iter()
                .find(|c| c.kind() != ra_hir::CaptureKind::Move)
            {
                let local = cap.local().name(db).display(db, EDITION).to_string();
                return Some(TypeName::NotKept(NotKept::ClosureBorrows { local }));
            }
            c.fn_trait(db)
        }
        ra_hir::CallableKind::FnImpl(t) => t,
        _ => return None,
    };
    let (fn_trait, needs_mut) = match kind {
        ra_hir::FnTrait::Fn => ("Fn", false),
        ra_hir::FnTrait::FnMut => ("FnMut", true),
        ra_hir::FnTrait::FnOnce => ("FnOnce", false),
        _ => return None,
    };
    let params = callable
        .params()
        .iter()
        .map(|p| source_type(p.ty(), sema, scope))
        .collect::<Option<Vec<_>>>()?;
    let ret = callable.return_type();
    let ret = if ret.is_unit() {
        String::new()
    } else {
        format!(" -> {}", source_type(&ret, sema, scope)?)
    };
    let type_name = format!("Box<dyn {fn_trait}({}){ret}>", params.join(", "));
    is_type_valid(&type_name).then_some(TypeName::Boxed {
        type_name,
        needs_mut,
    })
}

/// An iterator of a type that cannot be named (an adapter with a closure in it), kept as
/// `Box<dyn Iterator<Item = …>>`.
fn boxed_iterator(
    ty: &ra_hir::Type,
    sema: &ra_hir::Semantics<ra_ide::RootDatabase>,
    scope: &ra_hir::SemanticsScope<'_>,
) -> Option<TypeName> {
    let db = sema.db;
    if !ty.clone().impls_iterator(db) {
        return None;
    }
    let item = source_type(&ty.clone().iterator_item(db)?, sema, scope)?;
    let type_name = format!("Box<dyn Iterator<Item = {item}>>");
    is_type_valid(&type_name).then_some(TypeName::Boxed {
        type_name,
        needs_mut: true,
    })
}

/// A value of one `impl Trait` (a function's opaque return type) kept as `Box<dyn Trait>`,
/// when the trait can be made an object and has no generics or associated types to name.
fn boxed_impl_trait(
    ty: &ra_hir::Type,
    sema: &ra_hir::Semantics<ra_ide::RootDatabase>,
    scope: &ra_hir::SemanticsScope<'_>,
) -> Option<TypeName> {
    let db = sema.db;
    let traits: Vec<ra_hir::Trait> = ty.as_impl_traits(db)?.filter(|t| !t.is_auto(db)).collect();
    let [t] = traits[..] else {
        return None;
    };
    if t.dyn_compatibility(db).is_some()
        || t.type_or_const_param_count(db, false) > 0
        || t.items(db)
            .iter()
            .any(|i| matches!(i, ra_hir::AssocItem::TypeAlias(_)))
    {
        return None;
    }
    let path = path_in_scope(ra_hir::ModuleDef::Trait(t), sema, scope)?;
    let type_name = format!("Box<dyn {path}>");
    is_type_valid(&type_name).then_some(TypeName::Boxed {
        type_name,
        needs_mut: false,
    })
}

/// Completions found in a particular context.
#[derive(Default)]
pub struct Completions {
    pub completions: Vec<Completion>,
    pub start_offset: usize,
    pub end_offset: usize,
}

/// A code completion. We use our own type rather than exposing rust-analyzer's CompletionItem,
/// since rust-analyzer is an internal implementation detail, so we don't want to expose it in a
/// public API.
#[derive(Debug, Eq, PartialEq)]
pub struct Completion {
    pub code: String,
    pub kind: &'static str,
    pub label: String,
}

fn jupyter_kind(kind: ra_ide::CompletionItemKind) -> &'static str {
    use ra_ap_ide_db::SymbolKind;
    use ra_ide::CompletionItemKind as K;
    match kind {
        K::SymbolKind(SymbolKind::Function | SymbolKind::Method) => "function",
        K::SymbolKind(
            SymbolKind::Struct
            | SymbolKind::Enum
            | SymbolKind::Union
            | SymbolKind::Trait
            | SymbolKind::TypeAlias
            | SymbolKind::TypeParam
            | SymbolKind::SelfType,
        ) => "class",
        K::SymbolKind(SymbolKind::Module | SymbolKind::CrateRoot | SymbolKind::ToolModule) => {
            "module"
        }
        K::SymbolKind(
            SymbolKind::Const
            | SymbolKind::Static
            | SymbolKind::ConstParam
            | SymbolKind::Variant
            | SymbolKind::Field
            | SymbolKind::Local
            | SymbolKind::SelfParam
            | SymbolKind::ValueParam
            | SymbolKind::Label,
        )
        | K::Binding
        | K::InferredType => "instance",
        K::SymbolKind(
            SymbolKind::Macro
            | SymbolKind::ProcMacro
            | SymbolKind::Derive
            | SymbolKind::DeriveHelper
            | SymbolKind::Attribute
            | SymbolKind::BuiltinAttr,
        ) => "function",
        K::Keyword => "keyword",
        K::Snippet | K::BuiltinType | K::UnresolvedReference | K::Expression => "instance",
        _ => "instance",
    }
}

/// Returns whether this appears to be a valid type. Rust analyzer, when asked to emit code for some
/// types, produces invalid code. In particular, fixed sized arrays come out without a size. e.g.
/// instead of `[i32, 5]`, we get `[i32, _]`.
pub(crate) fn is_type_valid(type_name: &str) -> bool {
    use ra_ap_syntax::SyntaxKind;
    let wrapped_source = format!("const _: {type_name} = foo();");
    let parsed = ast::SourceFile::parse(&wrapped_source, EDITION);
    if !parsed.errors().is_empty() {
        return false;
    }
    for node in parsed.syntax_node().descendants() {
        if node.kind() == SyntaxKind::ERROR
            || node.kind() == SyntaxKind::INFER_TYPE
            || node.kind() == SyntaxKind::IMPL_TRAIT_TYPE
        {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod test {
    use super::RustAnalyzer;
    use super::TypeName;
    use super::is_type_valid;
    use anyhow::Result;

    impl TypeName {
        fn named(name: &str) -> TypeName {
            TypeName::Named(name.to_owned())
        }
    }

    /// A type the notebook cannot write (a struct in a module private to another) is written
    /// with an alias in scope; without one it is not kept.
    #[test]
    fn types_written_through_aliases() -> Result<()> {
        let tmpdir = tempfile::tempdir()?;
        let mut ra = RustAnalyzer::new(tmpdir.path())?;
        ra.with_sysroot = false;
        std::fs::write(
            ra.cargo_toml_filename().to_path_buf(),
            "[package]\nname = \"foo\"\nversion = \"0.1.0\"\nedition = \"2024\"\n[lib]\n",
        )?;
        ra.set_source(
            r#"
            mod a {
                mod b {
                    pub struct S<X>(pub X);
                    pub struct Q;
                }
                pub type T = b::S<u8>;
                pub fn make() -> b::S<u8> { b::S(1) }
                pub fn other() -> b::Q { b::Q }
            }
            pub struct Holder<X>(pub X);
            type Mine = a::T;
            fn foo() {
                let v = a::make();
                let w = [a::make(), a::make()];
                let h = Holder((a::make(), 1u16));
                let q = a::other();
            }"#
            .to_owned(),
        )?;
        let var_types = ra.top_level_variables("foo");
        assert_eq!(var_types["v"].type_name, TypeName::named("Mine"));
        assert_eq!(var_types["w"].type_name, TypeName::named("[Mine; 2]"));
        assert_eq!(
            var_types["h"].type_name,
            TypeName::named("Holder<(Mine, u16)>")
        );
        assert!(
            matches!(
                &var_types["q"].type_name,
                TypeName::NotKept(super::NotKept::Unnameable { .. })
            ),
            "{:?}",
            var_types["q"].type_name
        );
        Ok(())
    }

    #[test]
    fn replace_whole_names_only() {
        assert_eq!(
            super::replace_whole("Model<S<u8>, XS<u8>>", "S<u8>", "Mine").as_deref(),
            Some("Model<Mine, XS<u8>>")
        );
        assert_eq!(super::replace_whole("a::S<u8>", "S<u8>", "Mine"), None);
        assert_eq!(super::replace_whole("f32x4", "f32", "F"), None);
    }

    #[test]
    fn get_variable_types() -> Result<()> {
        let tmpdir = tempfile::tempdir()?;
        let mut ra = RustAnalyzer::new(tmpdir.path())?;
        ra.with_sysroot = false;
        std::fs::write(
            ra.cargo_toml_filename().to_path_buf(),
            r#"
            [package]
            name = "foo"
            version = "0.1.0"
            edition = "2024"

            [lib]
            "#,
        )?;

        ra.set_source(
            r#"
            struct Foo<const I: usize> {}
            struct Point {x: u8, y: u8}
            fn foo() {
                let v1 = true;
                let mut v1 = 42i32;
                let v2 = &[false];
                let v3: Foo<10> = Foo::<10> {};
                {
                    let v2 = false;
                    let v100 = true;
                }
                let (v4, ..) = (42u64, 43, 44);
                let p1 = Point {x: 1, y: 2};
                let Point {x, y: y2} = p1;
            }
            fn foo2() {
                let v9 = true;
            }"#
            .to_owned(),
        )?;
        let var_types = ra.top_level_variables("foo");
        assert_eq!(var_types["v1"].type_name, TypeName::named("i32"));
        assert!(var_types["v1"].is_mutable);
        assert_eq!(var_types["v2"].type_name, TypeName::named("&[bool; 1]"));
        assert!(!var_types["v2"].is_mutable);
        assert_eq!(var_types["v3"].type_name, TypeName::named("Foo<10>"));
        assert!(!var_types.contains_key("v100"));
        assert_eq!(var_types["v4"].type_name, TypeName::named("u64"));
        assert_eq!(var_types["x"].type_name, TypeName::named("u8"));
        assert_eq!(var_types["y2"].type_name, TypeName::named("u8"));

        ra.set_source(
            r#"
            fn foo() {
                let v1 = 1u16;
            }"#
            .to_owned(),
        )?;
        let var_types = ra.top_level_variables("foo");
        assert_eq!(var_types["v1"].type_name, TypeName::named("u16"));
        assert!(!var_types.contains_key("v2"));

        Ok(())
    }

    #[test]
    fn test_is_type_valid() {
        assert!(is_type_valid("Vec<String>"));
        assert!(is_type_valid("&[i32]"));
        assert!(!is_type_valid("[i32, _]"));
        assert!(!is_type_valid("Vec<_>"));
        assert!(is_type_valid("Foo<42>"));
    }
}
