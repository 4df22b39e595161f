//! Name resolution over a crate's module tree: a path, as written in some module, to the
//! module or item it names, following `use` bindings and glob imports (re-exports included)
//! to the module that defines the item.

use std::cell::RefCell;
use std::collections::BTreeSet;

use super::tree::{Bindings, Tree, UsePath};

/// How many `use` hops a resolution may follow.
const MAX_DEPTH: usize = 16;

/// Names every module can use without binding them: the standard prelude's types, traits
/// and variants, and the primitive types.
#[rustfmt::skip]
const PRELUDE: &[&str] = &[
    "Option", "Some", "None", "Result", "Ok", "Err", "Vec", "String", "Box", "ToString", "ToOwned",
    "Clone", "Copy", "Default", "Drop", "Eq", "PartialEq", "Ord", "PartialOrd", "Hash", "Debug",
    "Fn", "FnMut", "FnOnce", "From", "Into", "TryFrom", "TryInto", "Iterator", "IntoIterator",
    "Extend", "DoubleEndedIterator", "ExactSizeIterator", "FromIterator", "AsRef", "AsMut", "Send",
    "Sync", "Sized", "Unpin", "drop", "bool", "char", "str", "u8", "u16", "u32", "u64", "u128",
    "usize", "i8", "i16", "i32", "i64", "i128", "isize", "f32", "f64",
];

/// What a path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// A module of the crate.
    Module(usize),
    /// An item and the module that defines it.
    Item { module: usize, name: String },
    /// Something outside the crate (a dependency, `std`, the prelude).
    External,
    /// `Self`, which stands for a type of the module that uses it.
    SelfType,
}

/// Which namespace a name is looked up in first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Want {
    /// A segment followed by more: a module if there is one.
    Namespace,
    /// The last segment: an item if there is one.
    Item,
}

/// Resolves paths in one crate.
pub(crate) struct Resolver<'a> {
    tree: &'a Tree,
    /// External crate names (dependencies, `std`, `core`, `alloc`, the crate's own library).
    externs: &'a BTreeSet<String>,
    /// Lookups in progress, so that `use` cycles end.
    active: RefCell<BTreeSet<(usize, String, Want)>>,
}

impl<'a> Resolver<'a> {
    pub fn new(tree: &'a Tree, externs: &'a BTreeSet<String>) -> Self {
        Resolver {
            tree,
            externs,
            active: RefCell::new(BTreeSet::new()),
        }
    }

    /// Whether `name` names something outside the crate when nothing in scope binds it.
    pub fn is_external(&self, name: &str) -> bool {
        self.externs.contains(name) || PRELUDE.contains(&name)
    }

    /// What `path`, written in module `m`, names; `inside`: also see the names bound in
    /// `m`'s function bodies. Resolution stops at the first item (the rest names associated
    /// items or variants).
    pub fn resolve(&self, m: usize, path: &UsePath, inside: bool, depth: usize) -> Option<Target> {
        let segs = &path.segs;
        if depth > MAX_DEPTH || segs.is_empty() {
            return None;
        }
        if path.absolute {
            return Some(Target::External);
        }
        let last = segs.len() - 1;
        let want = |i: usize| {
            if i == last {
                Want::Item
            } else {
                Want::Namespace
            }
        };
        let mut cur = match segs[0].as_str() {
            "crate" => Target::Module(0),
            "super" => Target::Module(self.tree.modules[m].parent?),
            "self" => Target::Module(m),
            "Self" => return Some(Target::SelfType),
            first => match self.lookup(m, first, want(0), inside, depth) {
                Some(t) => t,
                None if self.is_external(first) => return Some(Target::External),
                None => return None,
            },
        };
        for (i, seg) in segs.iter().enumerate().skip(1) {
            let Target::Module(g) = cur else {
                break;
            };
            cur = match seg.as_str() {
                "super" => Target::Module(self.tree.modules[g].parent?),
                "self" => Target::Module(g),
                name => self.lookup(g, name, want(i), false, depth + 1)?,
            };
        }
        Some(cur)
    }

    /// What `name` means in module `m`: its own definitions, then its `use` bindings, then its
    /// glob imports.
    fn lookup(
        &self,
        m: usize,
        name: &str,
        want: Want,
        inside: bool,
        depth: usize,
    ) -> Option<Target> {
        if depth > MAX_DEPTH {
            return None;
        }
        let key = (m, name.to_string(), want);
        if !self.active.borrow_mut().insert(key.clone()) {
            return None;
        }
        let found = self.lookup_in(m, name, want, inside, depth);
        self.active.borrow_mut().remove(&key);
        found
    }

    fn lookup_in(
        &self,
        m: usize,
        name: &str,
        want: Want,
        inside: bool,
        depth: usize,
    ) -> Option<Target> {
        let module = &self.tree.modules[m];
        let defined = |b: &Bindings| b.items.contains(name);
        let child = module.children.get(name).map(|&c| Target::Module(c));
        let item =
            (defined(&module.module) || (inside && defined(&module.local))).then(|| Target::Item {
                module: m,
                name: name.to_string(),
            });
        let scopes: &[(&Bindings, bool)] = if inside {
            &[(&module.module, false), (&module.local, true)]
        } else {
            &[(&module.module, false)]
        };
        // Definitions and explicit imports; `mod x; pub use x::x;` binds `x` twice.
        let mut found = vec![child, item];
        for &(b, local) in scopes {
            if b.externs.contains(name) {
                found.push(Some(Target::External));
            }
            for path in b.uses.get(name).into_iter().flatten() {
                found.push(self.resolve(m, path, local, depth + 1));
            }
        }
        if let Some(t) = prefer(found, want) {
            return Some(t);
        }
        let mut external_glob = false;
        for &(b, local) in scopes {
            for glob in &b.globs {
                match self.resolve(m, glob, local, depth + 1) {
                    Some(Target::Module(g)) if g != m => {
                        if let Some(t) = self.lookup(g, name, want, false, depth + 1) {
                            return Some(t);
                        }
                    }
                    // `use Enum::*`: the variants.
                    Some(Target::Item {
                        module: e,
                        name: enum_name,
                    }) => {
                        let variants = self.tree.modules[e].variants.get(&enum_name);
                        if variants.is_some_and(|v| v.contains(name)) {
                            return Some(Target::Item {
                                module: e,
                                name: enum_name,
                            });
                        }
                    }
                    Some(Target::External) => external_glob = true,
                    _ => {}
                }
            }
        }
        // Whatever else is in scope came from an external glob (`use rayon::prelude::*`).
        external_glob.then_some(Target::External)
    }
}

/// The candidate that fits `want` best: a module for a namespace, anything else for an item.
fn prefer(candidates: Vec<Option<Target>>, want: Want) -> Option<Target> {
    let found: Vec<Target> = candidates.into_iter().flatten().collect();
    let is_module = |t: &&Target| matches!(t, Target::Module(_));
    let best = match want {
        Want::Namespace => found.iter().find(is_module),
        Want::Item => found.iter().find(|t| !is_module(t)),
    };
    best.or(found.first()).cloned()
}
