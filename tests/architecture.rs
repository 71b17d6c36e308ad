//! The layers of `src/`, enforced: reads every source file, collects which top-level modules it
//! refers to (`crate::x`, `super::…` climbing to the crate root, `use crate::{x, y}`), and fails
//! when a module reaches a layer it must not (see ARCHITECTURE.md), or when the top-level modules
//! import each other in a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What each layer must not import.
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("gateway", &["api"]),
    (
        "acp",
        &["api", "gateway", "store", "events", "pool", "cluster"],
    ),
    ("pool", &["api", "store", "gateway", "events"]),
    ("events", &["api", "gateway", "pool", "cluster"]),
    ("cluster", &["api", "gateway"]),
];

/// Layers that may import nothing else from the crate.
const SELF_CONTAINED: &[&str] = &["store"];

/// The crate root: wires the layers together, so it may import them all.
const ROOT_FILES: &[&str] = &["lib.rs", "main.rs"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `src/`: `gateway/live.rs` is `[gateway, live]`,
/// `gateway/mod.rs` is `[gateway]`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().expect("a file name");
    if file != "mod.rs" {
        parts.push(file.trim_end_matches(".rs").to_owned());
    }
    parts
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn ident_prefix(s: &str) -> &str {
    let s = s.trim_start();
    &s[..s.find(|c: char| !is_ident(c)).unwrap_or(s.len())]
}

/// The first segment of each path in a `use` group, `a::{b, c}, d}` giving `a` and `d`.
fn group_heads(group: &str) -> Vec<&str> {
    let mut heads = vec![ident_prefix(group)];
    let mut depth = 0;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => heads.push(ident_prefix(&group[i + 1..])),
            _ => {}
        }
    }
    heads
}

/// The top-level modules a file's code names, from its module path `module`.
fn references(code: &str, module: &[String], top_level: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("crate::").or_else(|| rest.find("super::")) {
            let preceded_by_ident = rest[..i].chars().last().is_some_and(is_ident);
            let mut tail = &rest[i..];
            // The module this path starts from, counted in segments below the crate root.
            let depth = if tail.starts_with("crate::") {
                tail = &tail["crate::".len()..];
                0
            } else {
                let mut d = module.len();
                while let Some(t) = tail.strip_prefix("super::") {
                    d = d.saturating_sub(1);
                    tail = t;
                }
                d
            };
            if !preceded_by_ident && depth == 0 {
                // `crate::{a, b::c}` names several.
                let names: Vec<&str> = match tail.strip_prefix('{') {
                    Some(group) => group_heads(group),
                    None => vec![ident_prefix(tail)],
                };
                found.extend(
                    names
                        .into_iter()
                        .filter(|n| top_level.contains(*n))
                        .map(str::to_owned),
                );
            }
            rest = &rest[i + 1..];
        }
    }
    found
}

/// Every top-level module of `src/` and the top-level modules each one refers to.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let top_level: BTreeSet<String> = files
        .iter()
        .map(|f| module_path(f.strip_prefix(&src).unwrap()))
        .filter_map(|m| m.first().cloned())
        .filter(|m| !ROOT_FILES.contains(&format!("{m}.rs").as_str()))
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap();
        if ROOT_FILES.contains(&rel.to_string_lossy().as_ref()) {
            continue;
        }
        let module = module_path(rel);
        let code = std::fs::read_to_string(&file).expect("read a source file");
        let mut refs = references(&code, &module, &top_level);
        refs.remove(&module[0]);
        graph.entry(module[0].clone()).or_default().extend(refs);
    }
    graph
}

/// The files of `layer` that name `target`, for the failure message.
fn offenders(layer: &str, target: &str) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let top_level: BTreeSet<String> = [target.to_owned()].into();
    files
        .into_iter()
        .filter(|f| {
            let rel = f.strip_prefix(&src).unwrap();
            let module = module_path(rel);
            module.first().map(String::as_str) == Some(layer)
                && references(&std::fs::read_to_string(f).unwrap(), &module, &top_level)
                    .contains(target)
        })
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .collect()
}

#[test]
fn no_layer_imports_what_it_must_not() {
    let graph = graph();
    let mut broken = Vec::new();
    for (layer, forbidden) in FORBIDDEN {
        let uses = graph.get(*layer).cloned().unwrap_or_default();
        for target in forbidden.iter().filter(|t| uses.contains(**t)) {
            broken.push(format!(
                "{layer}/ imports {target}/ in {:?}",
                offenders(layer, target)
            ));
        }
    }
    for layer in SELF_CONTAINED {
        for target in graph.get(*layer).cloned().unwrap_or_default() {
            broken.push(format!(
                "{layer}/ must import nothing else from the crate, but imports {target}/ in {:?}",
                offenders(layer, &target)
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "layer rules broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn top_level_modules_import_each_other_without_circles() {
    let graph = graph();
    // Depth-first search for a back edge; reports the circle.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
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
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(circle) = visit(node, &graph, &mut Vec::new(), &mut done) {
            panic!(
                "an import circle: {} (graph: {graph:?})",
                circle.join(" -> ")
            );
        }
    }
}

#[test]
fn the_scanner_sees_every_form_of_path() {
    let top: BTreeSet<String> = ["api", "store", "gateway"].map(str::to_owned).into();
    let module = ["gateway".to_owned(), "live".to_owned()];
    let code = "use crate::api::error::ApiError;\nuse crate::{store::{Store, StoreError}, gateway};\n// crate::api in a comment\nlet x = super::super::api::Json;\nuse super::Inner;\n";
    let refs = references(code, &module, &top);
    assert_eq!(refs, ["api", "gateway", "store"].map(str::to_owned).into());
    let none = references("use super::Inner; mycrate::api::x();", &module, &top);
    assert!(none.is_empty(), "{none:?}");
}

#[test]
fn no_source_file_is_longer_than_600_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let long: Vec<String> = files
        .into_iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(&f).unwrap().lines().count();
            (lines > 600).then(|| format!("{} ({lines} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "files over 600 lines: {long:?}");
}
