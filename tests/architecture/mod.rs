//! The layers of `src/`, enforced. Every source file is parsed as Rust (`syn`), and every path
//! it names is resolved to the module that defines it: `use` trees (groups wrapped over many
//! lines included), paths in code and types, and `crate::`/`$crate::` paths inside macros.
//! Paths start at the crate root, at `self`/`super` (inline modules counted) or at a child
//! module. The test fails when a top-level module imports one its rule does not allow, when a
//! top-level module has no rule (a new or renamed layer), when a rule names a module that does
//! not exist, and when the top-level modules import each other in a circle; and when any two
//! files of `src/` import each other, directly or through others (a name a module re-exports
//! counts as its defining file's; a file's `#[cfg(test)]` module may use what it likes). The
//! rules are ARCHITECTURE.md's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

mod checker;
mod folders;
mod kinds;
mod names;
mod parts;
mod traits;

/// What each top-level module may import from the crate (itself aside): ARCHITECTURE.md's
/// layers, each reaching only down. The crate root (`lib.rs`) wires them all together and may
/// import anything.
const ALLOWED: &[(&str, &[&str])] = &[
    // The HTTP surface: the service, the hub's typed events, the pool's member states, the
    // agents' capabilities, the flags' types, lone surrogates in JSON, the metrics recorder.
    (
        "api",
        &[
            "gateway",
            "events",
            "pool",
            "agent_rpc",
            "config",
            "surrogates",
            "telemetry",
            "redact",
        ],
    ),
    // The service: everything below it, nothing of the HTTP surface.
    (
        "gateway",
        &[
            "pool",
            "events",
            "store",
            "cluster",
            "agent_rpc",
            "config",
            "redact",
            "workspace",
            "install",
        ],
    ),
    ("pool", &["agent_rpc"]),
    ("events", &["store"]),
    ("cluster", &["store"]),
    ("agent_rpc", &["surrogates", "telemetry", "redact"]),
    ("store", &[]),
    // The flags: an agent's command line is the transport's `AgentCommand`.
    ("config", &["agent_rpc", "redact"]),
    // `check-agent` starts each agent once; `bridge` (`acp-gateway connect`) is only a client of
    // some `/acp`.
    ("check", &["agent_rpc", "pool", "config"]),
    // `redact` (credentials out of logged URLs) is a leaf every layer that logs a URL uses.
    ("bridge", &["redact"]),
    ("telemetry", &["redact"]),
    ("surrogates", &[]),
    ("redact", &[]),
    // A session's workspace: its files, confined to its folder.
    ("workspace", &[]),
    // Installing agents from the ACP registry: a leaf that masks the URLs it names.
    ("install", &["redact"]),
    // The configuration read once at start: the API keys (an `api` type), the flags and the
    // database URL.
    ("settings", &["api", "config", "store", "redact"]),
];

/// Files under `src/` that are crate roots: `lib.rs` wires the layers; `main.rs` is the binary,
/// which sees the library from outside.
const ROOTS: &[&str] = &["lib.rs", "main.rs"];

/// The `.rs` files under `dir` (an npm tree left out).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.ends_with("node_modules") {
            continue;
        } else if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `src/`: `gateway/live.rs` is `[gateway, live]`,
/// `gateway/mod.rs` is `[gateway]`, `lib.rs` is `[]`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().expect("a file name");
    if file != "mod.rs" && !(parts.is_empty() && ROOTS.contains(&file.as_str())) {
        parts.push(file.trim_end_matches(".rs").to_owned());
    }
    parts
}

/// The paths a file names, each as its segments, with the module (inline ones counted) it is
/// named in.
#[derive(Default)]
struct Paths {
    /// The module the visitor is in.
    at: Vec<String>,
    found: Vec<(Vec<String>, Vec<String>)>,
    /// `pub use` items: the module, the name it exports, the path it names.
    reexports: Vec<(Vec<String>, String, Vec<String>)>,
    /// Inside a `#[cfg(test)]` module: what is found goes to `in_tests`.
    testing: usize,
    in_tests: Vec<(Vec<String>, Vec<String>)>,
    /// Modules in files of their own that only tests compile (`#[cfg(test)] mod tests;`).
    test_files: Vec<Vec<String>>,
}

impl Paths {
    fn add(&mut self, segments: Vec<String>) {
        if segments.is_empty() {
            return;
        }
        let found = (self.at.clone(), segments);
        if self.testing > 0 {
            self.in_tests.push(found);
        } else {
            self.found.push(found);
        }
    }

    /// Every path of a `use` tree, its prefix given.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.add([&prefix[..], &[n.ident.to_string()]].concat()),
            syn::UseTree::Rename(r) => self.add([&prefix[..], &[r.ident.to_string()]].concat()),
            syn::UseTree::Glob(_) => self.add(prefix.clone()),
            syn::UseTree::Group(g) => {
                for item in &g.items {
                    self.use_tree(prefix, item);
                }
            }
        }
    }

    /// The paths in a macro's tokens (`crate :: a :: b`, `$crate :: a`, `child :: f` in a
    /// `routes!(…)`), each word read up to its first character that cannot be in a name (a
    /// token string glues `]` or `)` to the word before it).
    fn tokens(&mut self, tokens: &str) {
        let ident = |w: &str| -> String {
            w.trim_start_matches('$')
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        };
        let words: Vec<&str> = tokens.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            let first = ident(w);
            // `pub(in crate::a)` names who may see an item, not what it uses.
            let visibility = i > 0 && words[i - 1].ends_with("(in");
            let starts = !first.is_empty() && !visibility && (i == 0 || words[i - 1] != "::");
            if !starts || words.get(i + 1) != Some(&"::") || first.len() + 1 < w.len() {
                continue;
            }
            let mut segments = vec![first];
            let mut j = i + 1;
            while words.get(j) == Some(&"::") {
                let Some(next) = words.get(j + 1) else {
                    break;
                };
                let name = ident(next);
                if name.is_empty() {
                    break;
                }
                let whole = name.len() == next.len();
                segments.push(name);
                j += 2;
                if !whole {
                    break;
                }
            }
            self.add(segments);
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let before = self.found.len();
        self.use_tree(&mut Vec::new(), &item.tree);
        if !matches!(item.vis, syn::Visibility::Inherited) {
            let exported = self.found[before..].iter().map(|(at, segments)| {
                let name = segments.last().cloned().unwrap_or_default();
                (at.clone(), name, segments.clone())
            });
            self.reexports.extend(exported.collect::<Vec<_>>());
        }
    }

    /// A path of one segment in code is a local name or an item in scope, never a module.
    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.segments.len() > 1 {
            self.add(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, path);
    }

    /// `pub(super)` and `pub(in path)` name who may see an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        let test = cfg_test(item);
        self.testing += usize::from(test);
        self.at.push(item.ident.to_string());
        if test && item.content.is_none() {
            self.test_files.push(self.at.clone());
        }
        syn::visit::visit_item_mod(self, item);
        self.at.pop();
        self.testing -= usize::from(test);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(&mac.tokens.to_string());
        syn::visit::visit_macro(self, mac);
    }
}

/// The module of the crate that `segments`, named in module `at`, lead into (the longest
/// prefix that is a module of `modules`); `None` for what lies outside the crate.
fn resolve(
    at: &[String],
    segments: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let full = absolute(at, segments, modules)?;
    (0..=full.len())
        .rev()
        .map(|n| full[..n].to_vec())
        .find(|m| modules.contains(m))
}

/// `segments`, named in module `at`, as a path from the crate root; `None` for what lies
/// outside the crate.
fn absolute(
    at: &[String],
    segments: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let (mut full, rest) = match segments[0].as_str() {
        "crate" => (Vec::new(), &segments[1..]),
        "self" | "super" => {
            let mut base = at.to_vec();
            let mut rest = segments;
            while let Some(first) = rest.first() {
                match first.as_str() {
                    "super" => {
                        base.pop()?;
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
            (base, rest)
        }
        // A child module of the one it is named in (`use live::LiveTable;` in `gateway/`).
        child if modules.contains(&[at, &[child.to_owned()]].concat()) => (at.to_vec(), segments),
        _ => return None,
    };
    full.extend(rest.iter().cloned());
    Some(full)
}

/// Each top-level module and the top-level modules it names, from `(file module path,
/// source)` pairs; the crate root is left out.
fn graph(
    sources: &[(Vec<String>, String)],
) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|(m, _)| m.clone()).collect();
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (module, code) in sources {
        let Some(top) = module.first() else {
            continue;
        };
        let file = syn::parse_file(code).unwrap_or_else(|e| panic!("{module:?}: {e}"));
        let mut paths = Paths {
            at: module.clone(),
            ..Paths::default()
        };
        paths.visit_file(&file);
        let uses = graph.entry(top.clone()).or_default();
        for (at, segments) in paths.found.iter().chain(&paths.in_tests) {
            let Some(target) = resolve(at, segments, &modules) else {
                continue;
            };
            match target.first() {
                Some(other) if other != top => {
                    let shown = format!("{}.rs", module.join("/"));
                    uses.entry(other.clone()).or_default().insert(shown);
                }
                _ => {}
            }
        }
    }
    graph
}

/// What is wrong with `graph` against `allowed`: imports no rule allows, modules without a
/// rule, rules without a module, allowances no file uses, and a circle.
fn violations(
    graph: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    allowed: &[(&str, &[&str])],
) -> Vec<String> {
    let rules: BTreeMap<&str, &[&str]> = allowed.iter().copied().collect();
    let mut broken = Vec::new();
    for (module, uses) in graph {
        let Some(rule) = rules.get(module.as_str()) else {
            broken.push(format!(
                "{module}/ has no rule in ALLOWED (a new or renamed layer: say what it may import)"
            ));
            continue;
        };
        for (target, files) in uses {
            if !rule.contains(&target.as_str()) {
                broken.push(format!("{module}/ imports {target}/ in {files:?}"));
            }
        }
    }
    for (module, rule) in &rules {
        let Some(uses) = graph.get(*module) else {
            broken.push(format!(
                "ALLOWED names {module}, which is no module of src/"
            ));
            continue;
        };
        for target in rule.iter().filter(|t| !uses.contains_key(**t)) {
            broken.push(format!(
                "ALLOWED lets {module}/ import {target}/, which no file of {module}/ does (an unused allowance)"
            ));
        }
    }
    if let Some(circle) = circle(graph) {
        broken.push(format!("an import circle: {}", circle.join(" -> ")));
    }
    broken
}

/// A circle among the modules of `graph`, if there is one.
fn circle(graph: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flat_map(|uses| uses.keys()) {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// Every file of `sources` parsed: its module path and the paths it names.
fn parse(sources: &[(Vec<String>, String)]) -> Vec<(Vec<String>, Paths)> {
    let parsed: Vec<(Vec<String>, Paths)> = sources
        .iter()
        .map(|(module, code)| {
            let file = syn::parse_file(code).unwrap_or_else(|e| panic!("{module:?}: {e}"));
            let mut paths = Paths {
                at: module.clone(),
                ..Paths::default()
            };
            paths.visit_file(&file);
            (module.clone(), paths)
        })
        .collect();
    let tests: BTreeSet<Vec<String>> = parsed
        .iter()
        .flat_map(|(_, paths)| paths.test_files.iter().cloned())
        .collect();
    parsed
        .into_iter()
        .filter(|(module, _)| !tests.contains(module))
        .collect()
}

/// What a module re-exports (`pub use`): (module, name) to the path it names, from the crate
/// root.
fn reexports(
    parsed: &[(Vec<String>, Paths)],
    modules: &BTreeSet<Vec<String>>,
) -> BTreeMap<(Vec<String>, String), Vec<String>> {
    let mut reexported = BTreeMap::new();
    for (_, paths) in parsed {
        for (at, name, segments) in &paths.reexports {
            if let Some(to) = absolute(at, segments, modules) {
                reexported.insert((at.clone(), name.clone()), to);
            }
        }
    }
    reexported
}

/// A file's name as the graphs show it: `gateway/live.rs`, `gateway.rs` for `gateway/mod.rs`.
/// Whether a module is compiled only for tests (`#[cfg(test)]`).
fn cfg_test(item: &syn::ItemMod) -> bool {
    item.attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
    })
}

fn file_name(module: &[String]) -> String {
    format!("{}.rs", module.join("/"))
}

/// Each file (as its module path) and the files it names, from `(file module path, source)`
/// pairs: a name a module re-exports (`pub use`) leads to the file that defines it; a file's
/// names of itself and the crate root are left out.
fn file_graph(
    sources: &[(Vec<String>, String)],
) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|(m, _)| m.clone()).collect();
    let parsed = parse(sources);
    let reexported = reexports(&parsed, &modules);
    // The file a path leads to, following re-exports (a few hops at most).
    let target = |mut full: Vec<String>| {
        for _ in 0..8 {
            let module = (0..=full.len())
                .rev()
                .map(|n| full[..n].to_vec())
                .find(|m| modules.contains(m))?;
            match full.get(module.len()) {
                Some(name) => match reexported.get(&(module.clone(), name.clone())) {
                    Some(to) if *to != full => full = to.clone(),
                    _ => return Some(module),
                },
                None => return Some(module),
            }
        }
        None
    };
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (module, paths) in &parsed {
        if module.is_empty() {
            continue;
        }
        let uses = graph.entry(file_name(module)).or_default();
        for (at, segments) in &paths.found {
            let Some(to) = absolute(at, segments, &modules).and_then(&target) else {
                continue;
            };
            if to != *module && !to.is_empty() {
                uses.entry(file_name(&to)).or_default();
            }
        }
    }
    graph
}

/// Every library source file of `src/` as (module path, text).
fn sources() -> Vec<(Vec<String>, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .into_iter()
        .filter(|f| f.strip_prefix(&src).unwrap() != Path::new("main.rs"))
        .map(|f| {
            let module = module_path(f.strip_prefix(&src).unwrap());
            (
                module,
                std::fs::read_to_string(&f).expect("read a source file"),
            )
        })
        .collect()
}

#[test]
fn every_layer_imports_only_what_its_rule_allows() {
    let graph = graph(&sources());
    let broken = violations(&graph, ALLOWED);
    assert!(
        broken.is_empty(),
        "layer rules broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn no_two_files_import_each_other_even_through_others() {
    let mut graph = file_graph(&sources());
    let mut circles = Vec::new();
    // Each circle found is reported, and one of its edges set aside to find the next.
    while let Some(circle) = circle(&graph) {
        circles.push(circle.join(" -> "));
        if let Some(uses) = graph.get_mut(&circle[0]) {
            uses.remove(&circle[1]);
        }
    }
    assert!(
        circles.is_empty(),
        "import circles between files:\n{}",
        circles.join("\n")
    );
}

#[test]
fn no_file_of_src_tests_or_benches_is_longer_than_600_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches"] {
        rust_files(&root.join(dir), &mut files);
    }
    let long: Vec<String> = files
        .into_iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(&f).unwrap().lines().count();
            (lines > 600).then(|| format!("{} ({lines} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "files over 600 lines: {long:?}");
}
