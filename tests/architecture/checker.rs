//! The checker checked: the scanner reads every form of path, and forbidden imports, circles
//! (also through a re-export) and unknown layers fail.

use super::*;

/// Sources of a made-up crate, as `graph` takes them.
fn crate_of(files: &[(&str, &str)]) -> Vec<(Vec<String>, String)> {
    files
        .iter()
        .map(|(path, code)| (module_path(Path::new(path)), (*code).to_owned()))
        .collect()
}

#[test]
fn the_scanner_reads_every_form_of_path() {
    let sources = crate_of(&[
        (
            "lib.rs",
            "pub mod api; pub mod gateway; pub mod store; pub mod acp;",
        ),
        ("store/mod.rs", "pub struct Store;"),
        ("acp/mod.rs", "pub struct Line;"),
        ("api/mod.rs", "pub mod error;"),
        ("api/error.rs", "pub struct ApiError;"),
        (
            "gateway/mod.rs",
            "mod live;\nuse live::Table;\n// crate::api in a comment\n\
             #[cfg(test)] mod tests { use super::super::acp::Line; }",
        ),
        (
            "gateway/live.rs",
            "use crate::{\n    store::Store,\n    api::{\n        error::ApiError,\n    },\n};\n\
             pub struct Table;\nfn f() { let _ = mycrate::gateway::x(); }",
        ),
    ]);
    let found = graph(&sources);
    let uses: BTreeSet<&str> = found["gateway"].keys().map(String::as_str).collect();
    assert_eq!(uses, ["acp", "api", "store"].into(), "{found:?}");
    let by_macro = crate_of(&[
        ("lib.rs", "pub mod store; pub mod events;"),
        (
            "store/mod.rs",
            "macro_rules! m { () => { $crate::events::Hub::new() } }",
        ),
        ("events/mod.rs", "pub struct Hub;"),
    ]);
    assert!(graph(&by_macro)["store"].contains_key("events"));
}

#[test]
fn forbidden_imports_circles_and_unknown_layers_fail() {
    let sources = crate_of(&[
        (
            "lib.rs",
            "pub mod api; pub mod gateway; pub mod store; pub mod extra;",
        ),
        ("api/mod.rs", "use crate::gateway::Gateway;"),
        (
            "gateway/mod.rs",
            "pub struct Gateway;\nuse crate::{\n    api::Json,\n};",
        ),
        ("store/mod.rs", "use crate::gateway::Gateway;"),
        ("extra.rs", "pub struct Extra;"),
    ]);
    let rules: &[(&str, &[&str])] = &[
        ("api", &["gateway"]),
        ("gateway", &[]),
        ("store", &[]),
        ("gone", &[]),
    ];
    let broken = violations(&graph(&sources), rules).join("\n");
    for expected in [
        "gateway/ imports api/ in {\"gateway.rs\"}",
        "store/ imports gateway/",
        "extra/ has no rule",
        "ALLOWED names gone",
        "an import circle: api -> gateway -> api",
    ] {
        assert!(broken.contains(expected), "{expected:?} not in:\n{broken}");
    }
}

#[test]
fn a_circle_between_files_fails_even_through_a_reexport() {
    let sources = crate_of(&[
        ("lib.rs", "pub mod gateway;"),
        (
            "gateway/mod.rs",
            "mod live;\nmod error;\npub use error::Error;\npub struct Gateway;\nfn f(_: live::Table) {}",
        ),
        ("gateway/error.rs", "pub struct Error;"),
        (
            "gateway/live.rs",
            "use super::{\n    Error,\n    Gateway,\n};\npub struct Table;",
        ),
    ]);
    let graph = file_graph(&sources);
    let live: BTreeSet<&str> = graph["gateway/live.rs"]
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(live, ["gateway.rs", "gateway/error.rs"].into(), "{graph:?}");
    assert_eq!(
        circle(&graph).map(|c| c.join(" -> ")).as_deref(),
        Some("gateway.rs -> gateway/live.rs -> gateway.rs")
    );
    let fixed = crate_of(&[
        ("lib.rs", "pub mod gateway;"),
        (
            "gateway/mod.rs",
            "mod live;\nmod error;\npub use error::Error;\nfn f(_: live::Table) {}",
        ),
        ("gateway/error.rs", "pub struct Error;"),
        ("gateway/live.rs", "use super::Error;\npub struct Table;"),
    ]);
    assert_eq!(circle(&file_graph(&fixed)), None);
}

#[test]
fn a_name_taken_through_a_parent_mod_rs_fails() {
    let sources = crate_of(&[
        ("lib.rs", "pub mod gateway;"),
        (
            "gateway/mod.rs",
            "mod error;\nmod parts;\npub use error::Error;\npub struct Config;",
        ),
        ("gateway/error.rs", "pub struct Error;"),
        ("gateway/parts/mod.rs", "mod log;"),
        (
            "gateway/parts/log.rs",
            "use super::super::Error;\nuse crate::gateway::error::Error as Fine;\n\
             fn f(_: crate::gateway::Config) {}\n\
             #[cfg(test)] mod tests { use crate::gateway::Error; }",
        ),
    ]);
    let broken = folders::through_parents(&sources).join("\n");
    for expected in [
        "gateway/parts/log.rs names gateway::Error through gateway/mod.rs",
        "gateway/parts/log.rs names gateway::Config through gateway/mod.rs",
    ] {
        assert!(broken.contains(expected), "{expected:?} not in:\n{broken}");
    }
    assert_eq!(broken.lines().count(), 2, "{broken}");
}

#[test]
fn a_part_importing_a_use_case_or_a_child_in_no_layer_fails() {
    let sources = crate_of(&[
        ("lib.rs", "pub mod gateway;"),
        (
            "gateway/mod.rs",
            "mod error;\nmod parts;\nmod turns;\nmod stray;",
        ),
        ("gateway/error.rs", "pub struct Error;"),
        ("gateway/parts/mod.rs", "pub mod log;"),
        (
            "gateway/parts/log.rs",
            "use crate::gateway::error::Error;\nuse crate::gateway::turns::Turns;",
        ),
        (
            "gateway/turns.rs",
            "pub struct Turns;\nuse super::parts::log;\nuse super::error::Error;",
        ),
        ("gateway/stray.rs", "use super::error::Error;"),
    ]);
    let layers: &[(&str, &[&[&str]])] = &[("gateway", &[&["error"], &["parts"], &["turns"]])];
    let broken = folders::layer_violations(&file_graph(&sources), layers).join("\n");
    for expected in [
        "gateway/parts/log.rs imports gateway/turns.rs, which sits in a higher layer",
        "gateway/stray.rs is in no layer of gateway/",
    ] {
        assert!(broken.contains(expected), "{expected:?} not in:\n{broken}");
    }
    assert_eq!(broken.lines().count(), 2, "{broken}");
}

#[test]
fn an_unused_allowance_fails() {
    let sources = crate_of(&[
        ("lib.rs", "pub mod api; pub mod gateway; pub mod store;"),
        ("api/mod.rs", "use crate::gateway::Gateway;"),
        ("gateway/mod.rs", "pub struct Gateway;"),
        ("store/mod.rs", "pub struct Store;"),
    ]);
    let rules: &[(&str, &[&str])] = &[
        ("api", &["gateway", "store"]),
        ("gateway", &[]),
        ("store", &[]),
    ];
    let broken = violations(&graph(&sources), rules).join("\n");
    assert!(
        broken.contains("ALLOWED lets api/ import store/, which no file of api/ does"),
        "{broken}"
    );
}
