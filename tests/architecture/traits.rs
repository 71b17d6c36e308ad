//! No trait of `src/` declares more than [`MAX_METHODS`] methods: a trait that grows past it
//! holds more than one concern, and whoever is handed it is handed them all (the store's
//! contract is one trait per concern for that reason). Every file is parsed (`syn`), so traits in
//! inline modules, functions and `#[cfg(test)]` modules count; the checker is checked on a
//! made-up crate below.

use super::*;

/// The most methods a trait may declare (provided ones counted).
const MAX_METHODS: usize = 15;

/// Counts the methods of every trait a file declares.
struct Traits<'f> {
    file: &'f str,
    max: usize,
    /// A line per trait over `max`.
    large: Vec<String>,
}

impl<'ast> Visit<'ast> for Traits<'_> {
    fn visit_item_trait(&mut self, item: &'ast syn::ItemTrait) {
        let methods = (item.items.iter())
            .filter(|i| matches!(i, syn::TraitItem::Fn(_)))
            .count();
        if methods > self.max {
            self.large.push(format!(
                "{}: trait {} declares {methods} methods (at most {})",
                self.file, item.ident, self.max
            ));
        }
        syn::visit::visit_item_trait(self, item);
    }
}

/// The traits of `files` (name, source) that declare more than `max` methods.
fn large_traits(files: &[(String, String)], max: usize) -> Vec<String> {
    let mut large = Vec::new();
    for (file, code) in files {
        let parsed = syn::parse_file(code).unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut traits = Traits {
            file,
            max,
            large: Vec::new(),
        };
        traits.visit_file(&parsed);
        large.append(&mut traits.large);
    }
    large
}

#[test]
fn no_trait_in_src_declares_more_than_15_methods() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    assert!(paths.len() > 100, "src/ has {} files", paths.len());
    let files: Vec<(String, String)> = (paths.iter())
        .map(|f| {
            let name = f.strip_prefix(&src).unwrap().display().to_string();
            (
                name,
                std::fs::read_to_string(f).expect("read a source file"),
            )
        })
        .collect();
    let large = large_traits(&files, MAX_METHODS);
    assert!(large.is_empty(), "traits too large:\n{}", large.join("\n"));
}

#[test]
fn a_trait_with_too_many_methods_fails_wherever_it_is() {
    let methods =
        |n: usize| -> String { (0..n).map(|i| format!("fn m{i}(&self) {{}}\n")).collect() };
    let files = [
        (
            "store/contract.rs".to_owned(),
            format!(
                "#[async_trait]\npub trait Fits: Send {{\n{}type Item;\nconst N: usize;\n}}",
                methods(3)
            ),
        ),
        (
            "gateway/parts/log.rs".to_owned(),
            format!(
                "mod inner {{ #[cfg(test)] mod tests {{ trait Wide {{ {} }} }} }}",
                methods(4)
            ),
        ),
        (
            "events/hub.rs".to_owned(),
            format!("fn f() {{ trait Local {{ {} }} }}", methods(5)),
        ),
    ];
    let large = large_traits(&files, 3).join("\n");
    for expected in [
        "gateway/parts/log.rs: trait Wide declares 4 methods (at most 3)",
        "events/hub.rs: trait Local declares 5 methods (at most 3)",
    ] {
        assert!(large.contains(expected), "{expected:?} not in:\n{large}");
    }
    assert_eq!(large.lines().count(), 2, "{large}");
}
