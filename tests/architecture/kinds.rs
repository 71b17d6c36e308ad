//! Each of the gateway's own event kinds is named in one file: `store/kind.rs`, which declares
//! [`EventKind`]. Everywhere else in `src/` (tests aside) says `EventKind::…`, so a kind cannot
//! be misspelt in one place, and renaming one is one line.

use acp_gateway::store::EventKind;

use super::*;

/// The string literals of a source, outside `#[cfg(test)]` modules (and those inside macros,
/// as their tokens print).
#[derive(Default)]
struct Literals {
    found: Vec<String>,
}

impl<'ast> Visit<'ast> for Literals {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if !cfg_test(item) {
            syn::visit::visit_item_mod(self, item);
        }
    }

    fn visit_lit_str(&mut self, lit: &'ast syn::LitStr) {
        self.found.push(format!("{:?}", lit.value()));
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.found.push(mac.tokens.to_string());
    }
}

/// Each `names` that a file of `sources` other than `home` writes as a string, with where.
pub fn named_elsewhere(
    sources: &[(Vec<String>, String)],
    names: &[&str],
    home: &str,
) -> Vec<String> {
    let mut out = vec![];
    for (module, code) in sources {
        let file_name = file_name(module);
        if file_name == home {
            continue;
        }
        let file = syn::parse_file(code).unwrap_or_else(|e| panic!("{module:?}: {e}"));
        let mut literals = Literals::default();
        literals.visit_file(&file);
        for name in names {
            let quoted = format!("{name:?}");
            if literals.found.iter().any(|l| l.contains(&quoted)) {
                out.push(format!("{name} in {file_name}"));
            }
        }
    }
    out
}

#[test]
fn each_gateway_event_kind_is_named_only_where_it_is_declared() {
    let names = EventKind::names(EventKind::GATEWAY);
    let found = named_elsewhere(&sources(), &names, "store/kind.rs");
    assert!(
        found.is_empty(),
        "kinds written outside store/kind.rs: {found:#?}"
    );
}

#[test]
fn the_kind_check_sees_literals_in_code_and_macros_but_not_in_tests() {
    let sources = vec![
        (
            vec!["a".to_owned()],
            r#"fn f() { g("turn_ended"); }"#.to_owned(),
        ),
        (
            vec!["b".to_owned()],
            r#"fn f() { json!({"event": "forked"}); }"#.to_owned(),
        ),
        (
            vec!["c".to_owned()],
            r#"#[cfg(test)] mod t { fn f() { g("turn_ended"); } }"#.to_owned(),
        ),
        (
            vec!["store".to_owned(), "kind".to_owned()],
            r#"const A: &str = "forked";"#.to_owned(),
        ),
    ];
    assert_eq!(
        named_elsewhere(&sources, &["turn_ended", "forked"], "store/kind.rs"),
        ["turn_ended in a.rs", "forked in b.rs"]
    );
}
