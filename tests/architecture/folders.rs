//! The rules inside folders. A file takes a name from the file that defines it, never through
//! a parent folder's `mod.rs` (which is the folder's face to the rest of the crate, and would
//! otherwise hide which file depends on which); inside the folders of [`LAYERS`], each child (a
//! file or a sub-folder) sits in a layer and imports only its own layer and those below; and
//! the checker must see the edges of [`EXPECTED`], so that a scanner gone blind cannot pass.

use super::*;

/// Folders whose children sit in layers, lowest first: a child imports only children of its
/// own layer or of lower ones, and a child in no layer fails (a new file says where it sits).
/// The folder's own `mod.rs` wires it and sits above every layer.
pub const LAYERS: &[(&str, &[&[&str]])] = &[(
    "gateway",
    &[
        // Shared leaf types: what use cases and parts take and answer with.
        &[
            "error",
            "caller",
            "clock",
            "cursor",
            "input",
            "output",
            "problem",
            "state",
            "event",
            "event_schema",
            "portable",
            "markdown",
        ],
        // The parts: the owners of the service's state.
        &["parts"],
        // The use cases, each holding the parts it needs.
        &[
            "sessions",
            "create",
            "controls",
            "turns",
            "queue",
            "usage",
            "installs",
            "history",
            "transcripts",
            "shares",
            "sync",
            "system",
            "webhooks",
            "idempotency",
            "files",
            "changes",
        ],
    ],
)];

/// Edges the file graph must hold: one per layer boundary the rules guard, so that a scanner
/// that stopped seeing paths fails here instead of passing everything.
const EXPECTED: &[(&str, &str)] = &[
    ("api/sessions.rs", "gateway/sessions.rs"),
    ("gateway/turns.rs", "gateway/parts/live.rs"),
    ("gateway/parts/log.rs", "gateway/clock.rs"),
    ("gateway/parts/callbacks.rs", "pool/members.rs"),
    ("events/writer.rs", "store/event.rs"),
];

/// A file's module path from its name in the file graph (`gateway.rs` is `[gateway]`).
fn module_of(file: &str) -> Vec<String> {
    file.trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect()
}

/// Every name a file takes through the `mod.rs` of a folder it is in (a name that file defines
/// or re-exports), as `file names Name through folder/mod.rs`.
pub fn through_parents(sources: &[(Vec<String>, String)]) -> Vec<String> {
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|(m, _)| m.clone()).collect();
    let mut broken = BTreeSet::new();
    for (file, paths) in parse(sources) {
        for (at, segments) in &paths.found {
            let Some(full) = absolute(at, segments, &modules) else {
                continue;
            };
            let Some(owner) = (0..=full.len())
                .rev()
                .map(|n| full[..n].to_vec())
                .find(|m| modules.contains(m))
            else {
                continue;
            };
            let parent = owner.len() < file.len() && file.starts_with(&owner);
            if parent && full.len() > owner.len() {
                let folder = if owner.is_empty() {
                    "lib.rs".to_owned()
                } else {
                    format!("{}/mod.rs", owner.join("/"))
                };
                broken.insert(format!(
                    "{} names {} through {folder}: take it from the file that defines it",
                    file_name(&file),
                    full.join("::"),
                ));
            }
        }
    }
    broken.into_iter().collect()
}

/// What breaks `layers` in `graph`: a child of a layered folder in no layer, and an import of
/// a child of a higher layer.
pub fn layer_violations(
    graph: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    layers: &[(&str, &[&[&str]])],
) -> Vec<String> {
    let mut broken = BTreeSet::new();
    for (folder, order) in layers {
        let folder = module_of(&format!("{folder}.rs"));
        let child = |file: &str| {
            let module = module_of(file);
            (module.len() > folder.len() && module.starts_with(&folder))
                .then(|| module[folder.len()].clone())
        };
        let layer = |name: &str| order.iter().position(|l| l.contains(&name));
        for (from, uses) in graph {
            let Some(from_child) = child(from) else {
                continue;
            };
            let Some(from_layer) = layer(&from_child) else {
                broken.insert(format!(
                    "{from} is in no layer of {}/ (say where it sits in LAYERS)",
                    folder.join("/")
                ));
                continue;
            };
            for to in uses.keys() {
                let Some(to_child) = child(to) else {
                    continue;
                };
                if to_child != from_child && layer(&to_child).is_none_or(|l| l > from_layer) {
                    broken.insert(format!("{from} imports {to}, which sits in a higher layer"));
                }
            }
        }
    }
    broken.into_iter().collect()
}

#[test]
fn no_file_takes_a_name_through_a_folders_mod_rs() {
    let broken = through_parents(&sources());
    assert!(
        broken.is_empty(),
        "{} names taken through a parent mod.rs:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn inside_a_layered_folder_imports_run_down() {
    let broken = layer_violations(&file_graph(&sources()), LAYERS);
    assert!(
        broken.is_empty(),
        "layers inside folders broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_checker_sees_the_expected_edges() {
    let graph = file_graph(&sources());
    let missing: Vec<String> = EXPECTED
        .iter()
        .filter(|(from, to)| {
            let named = |f: &str| f.replace("/mod.rs", ".rs");
            !graph
                .get(&named(from))
                .is_some_and(|uses| uses.contains_key(&named(to)))
        })
        .map(|(from, to)| format!("{from} -> {to}"))
        .collect();
    assert!(missing.is_empty(), "edges not seen: {missing:?}");
}
