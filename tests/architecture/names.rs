//! One name, one type: no two structs, enums, unions, traits or type aliases of `src/` share a
//! name (associated types, which a trait names for every implementation, and items only tests
//! compile are not types of their own), so that a name read anywhere says which type it is.

use super::*;

/// The named types a source declares, outside `#[cfg(test)]` modules.
#[derive(Default)]
struct Declared {
    names: Vec<String>,
}

impl<'ast> Visit<'ast> for Declared {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if !cfg_test(item) {
            syn::visit::visit_item_mod(self, item);
        }
    }

    fn visit_item(&mut self, item: &'ast syn::Item) {
        let name = match item {
            syn::Item::Struct(i) => Some(&i.ident),
            syn::Item::Enum(i) => Some(&i.ident),
            syn::Item::Union(i) => Some(&i.ident),
            syn::Item::Trait(i) => Some(&i.ident),
            syn::Item::Type(i) => Some(&i.ident),
            _ => None,
        };
        if let Some(name) = name {
            self.names.push(name.to_string());
        }
        syn::visit::visit_item(self, item);
    }
}

/// Each name more than one file (or one file twice) gives a type, with where.
pub fn shared_names(sources: &[(Vec<String>, String)]) -> Vec<String> {
    let mut wheres = BTreeMap::<String, Vec<String>>::new();
    for (module, code) in sources {
        let file = syn::parse_file(code).unwrap_or_else(|e| panic!("{module:?}: {e}"));
        let mut found = Declared::default();
        found.visit_file(&file);
        for name in found.names {
            wheres.entry(name).or_default().push(file_name(module));
        }
    }
    wheres
        .into_iter()
        .filter(|(_, files)| files.len() > 1)
        .map(|(name, files)| format!("{name}: {}", files.join(", ")))
        .collect()
}

#[test]
fn no_two_types_share_a_name() {
    let shared = shared_names(&sources());
    assert!(shared.is_empty(), "types sharing a name: {shared:#?}");
}

#[test]
fn the_name_check_sees_types_of_every_kind_and_skips_associated_types() {
    let sources = vec![
        (
            vec!["a".to_owned()],
            "pub struct Entry; trait T { type Value; } impl T for Entry { type Value = u8; }\n\
             enum Kind { A } #[cfg(test)] mod tests { struct Slot; }"
                .to_owned(),
        ),
        (
            vec!["b".to_owned()],
            "type Kind = u8; pub(crate) trait Entry {} struct Value; struct Slot;".to_owned(),
        ),
    ];
    assert_eq!(
        shared_names(&sources),
        ["Entry: a.rs, b.rs", "Kind: a.rs, b.rs"]
    );
}
