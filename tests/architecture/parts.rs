//! Parts keep their state. A struct that holds a lock, a channel or an atomic — itself, or
//! through a field of type `Arc<S>` where `S` is such a struct — opens at most [`MOST_OPEN`] fields to other
//! files (any field with a visibility: `pub`, `pub(crate)`, `pub(super)`, `pub(in …)`); the rest
//! of it is reached through its methods.

use super::*;

/// Fields such a struct may open to other files.
const MOST_OPEN: usize = 2;

/// Where the parts live: the service's state owners, the event hub, the pool, the agent
/// transport and the cluster membership. (The router's state, the start-up settings and the
/// bridge are wiring, not parts.)
const PART_FOLDERS: &[&str] = &["gateway/parts", "events", "pool", "agent_rpc", "cluster"];

/// The names in a field's type that make a struct hold shared state.
const STATEFUL: &[&str] = &[
    "Mutex",
    "RwLock",
    "AtomicBool",
    "AtomicU32",
    "AtomicU64",
    "AtomicUsize",
    "AtomicI64",
    "Sender",
    "UnboundedSender",
    "Receiver",
    "UnboundedReceiver",
    "Notify",
    "Semaphore",
];

/// Every struct of a source: its name, its fields' type names and whether each is open.
#[derive(Default)]
struct Structs {
    found: Vec<(String, Vec<(Names, bool)>)>,
}

impl<'ast> Visit<'ast> for Structs {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if !cfg_test(item) {
            syn::visit::visit_item_mod(self, item);
        }
    }

    fn visit_item_struct(&mut self, item: &'ast syn::ItemStruct) {
        let fields = item
            .fields
            .iter()
            .map(|f| {
                let mut names = Names::default();
                names.visit_type(&f.ty);
                let open = !matches!(f.vis, syn::Visibility::Inherited);
                (names, open)
            })
            .collect();
        self.found.push((item.ident.to_string(), fields));
    }
}

/// The identifiers a type names: all of them, and those inside an `Arc<…>` (a part shared
/// with its owner, which is how one part holds another).
#[derive(Default)]
struct Names {
    direct: BTreeSet<String>,
    shared: BTreeSet<String>,
    in_arc: usize,
}

impl<'ast> Visit<'ast> for Names {
    fn visit_path_segment(&mut self, segment: &'ast syn::PathSegment) {
        let name = segment.ident.to_string();
        if self.in_arc > 0 {
            self.shared.insert(name.clone());
        }
        let arc = name == "Arc";
        self.direct.insert(name);
        self.in_arc += usize::from(arc);
        syn::visit::visit_path_arguments(self, &segment.arguments);
        self.in_arc -= usize::from(arc);
    }
}

/// Each struct holding shared state (directly or through a field's struct) that opens more
/// than [`MOST_OPEN`] fields, with the count.
pub fn too_open(sources: &[(Vec<String>, String)]) -> Vec<String> {
    let mut structs = Vec::new();
    for (module, code) in sources {
        let file = syn::parse_file(code).unwrap_or_else(|e| panic!("{module:?}: {e}"));
        let mut found = Structs::default();
        found.visit_file(&file);
        structs.extend(
            found
                .found
                .into_iter()
                .map(|(name, fields)| (module.clone(), name, fields)),
        );
    }
    // Which struct names hold shared state, to a fixed point through fields' types.
    let locks: BTreeSet<String> = STATEFUL.iter().map(|s| (*s).to_owned()).collect();
    let mut stateful = BTreeSet::new();
    loop {
        let before = stateful.len();
        for (_, name, fields) in &structs {
            if fields.iter().any(|(names, _)| {
                !names.direct.is_disjoint(&locks) || !names.shared.is_disjoint(&stateful)
            }) {
                stateful.insert(name.clone());
            }
        }
        if stateful.len() == before {
            break;
        }
    }
    let mut broken: Vec<String> = structs
        .iter()
        .filter(|(module, name, _)| {
            let file = file_name(module);
            stateful.contains(name) && PART_FOLDERS.iter().any(|f| file.starts_with(f))
        })
        .filter_map(|(module, name, fields)| {
            let open = fields.iter().filter(|(_, open)| *open).count();
            (open > MOST_OPEN).then(|| format!("{} {name}: {open} fields open", file_name(module)))
        })
        .collect();
    broken.sort();
    broken
}

#[test]
fn a_part_opens_at_most_two_fields() {
    let found = too_open(&sources());
    assert!(
        found.is_empty(),
        "parts that open their state to other files: {found:#?}"
    );
}

#[test]
fn the_part_check_sees_state_through_a_field() {
    let sources = vec![(
        vec!["events".to_owned()],
        "pub struct Table { pub a: u8, pub b: u8, pub c: std::sync::Mutex<u8> }\n\
         pub struct Holder { pub(crate) t: Arc<Table>, pub(super) x: u8, pub y: u8 }\n\
         pub struct Fine { pub t: Arc<Table>, pub x: u8, y: Mutex<u8> }\n\
         pub struct Plain { pub a: u8, pub b: u8, pub c: u8 }"
            .to_owned(),
    )];
    assert_eq!(
        too_open(&sources),
        [
            "events.rs Holder: 3 fields open",
            "events.rs Table: 3 fields open"
        ]
    );
}
