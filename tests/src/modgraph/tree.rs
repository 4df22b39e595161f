//! The module tree of one crate and the names each module binds.
//!
//! Loading follows `mod x;` declarations from the crate root the way rustc does (Rust 2018
//! file layout, `#[path = "..."]` included) and inline `mod x { ... }` blocks. Modules and
//! items gated by `#[cfg(test)]` are left out: test code may import anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use syn::visit::Visit;
use syn::{Attribute, ImplItem, Item, ItemMod, UseTree};

/// Reads a source file; `None` when there is none at that path.
pub type ReadFn<'a> = dyn Fn(&Path) -> Option<String> + 'a;

/// A path as written in a `use` declaration.
#[derive(Clone, Debug)]
pub(crate) struct UsePath {
    /// Starts with `::` (an external crate).
    pub absolute: bool,
    pub segs: Vec<String>,
}

/// The names one scope binds: a module's items, or the items of the function bodies in it.
#[derive(Debug, Default)]
pub(crate) struct Bindings {
    /// Items defined here (functions, types, traits, constants, statics).
    pub items: BTreeSet<String>,
    /// `use` bindings: the bound name (after `as`) and the paths it stands for (several when
    /// one name is imported into different namespaces).
    pub uses: BTreeMap<String, Vec<UsePath>>,
    /// `use path::*`.
    pub globs: Vec<UsePath>,
    /// `extern crate x as y` names.
    pub externs: BTreeSet<String>,
}

/// One module of the tree.
pub(crate) struct ModuleData {
    /// The path from the crate root; empty for the root.
    pub segs: Vec<String>,
    /// The file that holds the module's code (the parent's file for an inline module).
    pub file: PathBuf,
    /// Where `mod x;` inside this module looks for `x.rs` and `x/mod.rs`.
    dir: PathBuf,
    /// Declared inline (`mod x { ... }`).
    inline: bool,
    pub parent: Option<usize>,
    /// Child modules by name.
    pub children: BTreeMap<String, usize>,
    /// Names bound at module level.
    pub module: Bindings,
    /// Names bound inside the module's function bodies (visible only from this module).
    pub local: Bindings,
    /// The variants of the enums defined here, by enum name.
    pub variants: BTreeMap<String, BTreeSet<String>>,
    /// The module's items other than `mod` and `use`: the code whose paths make edges.
    pub body: Vec<Item>,
}

impl ModuleData {
    /// A module with nothing bound yet.
    fn new(
        parent: Option<usize>,
        segs: Vec<String>,
        file: PathBuf,
        dir: PathBuf,
        inline: bool,
    ) -> Self {
        ModuleData {
            segs,
            file,
            dir,
            inline,
            parent,
            children: BTreeMap::new(),
            module: Bindings::default(),
            local: Bindings::default(),
            variants: BTreeMap::new(),
            body: Vec::new(),
        }
    }
}

/// A crate's modules, the root first.
#[derive(Default)]
pub(crate) struct Tree {
    pub modules: Vec<ModuleData>,
    /// Files that were declared but missing or did not parse.
    pub errors: Vec<String>,
}

impl Tree {
    /// Loads the tree whose root file is `root`.
    pub fn load(root: &Path, read: &ReadFn) -> Tree {
        let mut tree = Tree::default();
        let root = normalize(root);
        let Some(items) = tree.parse(&root, read) else {
            return tree;
        };
        let dir = root.parent().map(Path::to_path_buf).unwrap_or_default();
        tree.add_module(
            ModuleData::new(None, Vec::new(), root, dir, false),
            items,
            read,
        );
        tree
    }

    /// The items of `file`, or `None` (and an error) when it is missing or does not parse.
    fn parse(&mut self, file: &Path, read: &ReadFn) -> Option<Vec<Item>> {
        let Some(src) = read(file) else {
            self.errors
                .push(format!("{}: no such file", file.display()));
            return None;
        };
        match syn::parse_file(&src) {
            Ok(f) => Some(f.items),
            Err(e) => {
                self.errors.push(format!("{}: {e}", file.display()));
                None
            }
        }
    }

    /// Adds `module` with its `items`, then its child modules; returns its index.
    fn add_module(&mut self, module: ModuleData, items: Vec<Item>, read: &ReadFn) -> usize {
        let id = self.modules.len();
        self.modules.push(module);
        let mut mods = Vec::new();
        for item in items {
            if is_test_only(item_attrs(&item)) {
                continue;
            }
            let m = &mut self.modules[id];
            match item {
                Item::Mod(decl) => mods.push(decl),
                Item::Use(u) => flatten_use(
                    &u.tree,
                    &mut Vec::new(),
                    u.leading_colon.is_some(),
                    &mut m.module,
                ),
                other => {
                    define(&other, &mut m.module, &mut m.variants);
                    m.body.push(other);
                }
            }
        }
        let m = &mut self.modules[id];
        let mut locals = LocalItems {
            bindings: &mut m.local,
            variants: &mut m.variants,
        };
        for item in &m.body {
            locals.visit_item(item);
        }
        for decl in mods {
            self.add_child(id, decl, read);
        }
        id
    }

    /// Adds the module that `decl` (inside module `parent`) declares.
    fn add_child(&mut self, parent: usize, decl: ItemMod, read: &ReadFn) {
        let name = decl.ident.to_string();
        let p = &self.modules[parent];
        let mut segs = p.segs.clone();
        segs.push(name.clone());
        let path_attr = path_attribute(&decl.attrs);
        let (file, dir, inline, items) = if let Some((_, items)) = decl.content {
            let dir = match &path_attr {
                Some(rel) => p.dir.join(rel),
                None => p.dir.join(&name),
            };
            (p.file.clone(), dir, true, items)
        } else {
            let candidates = match &path_attr {
                // Relative to the declaring file's directory, or to the inline module's
                // directory when declared inside one.
                Some(rel) => {
                    let base = if p.inline {
                        p.dir.clone()
                    } else {
                        p.file.parent().map(Path::to_path_buf).unwrap_or_default()
                    };
                    vec![normalize(&base.join(rel))]
                }
                None => vec![
                    normalize(&p.dir.join(format!("{name}.rs"))),
                    normalize(&p.dir.join(&name).join("mod.rs")),
                ],
            };
            let Some(file) = candidates.iter().find(|f| read(f).is_some()).cloned() else {
                let tried: Vec<String> =
                    candidates.iter().map(|c| c.display().to_string()).collect();
                self.errors.push(format!(
                    "module `{}` declared in {}: none of {}",
                    segs.join("::"),
                    p.file.display(),
                    tried.join(", ")
                ));
                return;
            };
            // Files named `mod.rs` or loaded by `#[path]` own their directory; `x.rs` owns `x/`.
            let parent_dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
            let dir = if path_attr.is_some() || file.file_name().is_some_and(|n| n == "mod.rs") {
                parent_dir
            } else {
                parent_dir.join(&name)
            };
            let Some(items) = self.parse(&file, read) else {
                return;
            };
            (file, dir, false, items)
        };
        let module = ModuleData::new(Some(parent), segs, file, dir, inline);
        let id = self.add_module(module, items, read);
        self.modules[parent].children.insert(name, id);
    }
}

/// Collects the items and `use` declarations inside function bodies.
struct LocalItems<'a> {
    bindings: &'a mut Bindings,
    variants: &'a mut BTreeMap<String, BTreeSet<String>>,
}

impl<'ast> Visit<'ast> for LocalItems<'_> {
    fn visit_item(&mut self, item: &'ast Item) {
        if !is_test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        if !is_test_only(impl_item_attrs(item)) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_block(&mut self, block: &'ast syn::Block) {
        for stmt in &block.stmts {
            if let syn::Stmt::Item(item) = stmt {
                match item {
                    _ if is_test_only(item_attrs(item)) => {}
                    Item::Use(u) => flatten_use(
                        &u.tree,
                        &mut Vec::new(),
                        u.leading_colon.is_some(),
                        self.bindings,
                    ),
                    Item::Mod(_) => {}
                    other => define(other, self.bindings, self.variants),
                }
            }
        }
        syn::visit::visit_block(self, block);
    }
}

/// Records the name `item` defines (and an enum's variants).
fn define(item: &Item, bindings: &mut Bindings, variants: &mut BTreeMap<String, BTreeSet<String>>) {
    let name = match item {
        Item::Const(i) => &i.ident,
        Item::Static(i) => &i.ident,
        Item::Fn(i) => &i.sig.ident,
        Item::Struct(i) => &i.ident,
        Item::Union(i) => &i.ident,
        Item::Trait(i) => &i.ident,
        Item::TraitAlias(i) => &i.ident,
        Item::Type(i) => &i.ident,
        Item::Enum(i) => {
            let names = i.variants.iter().map(|v| v.ident.to_string()).collect();
            variants.insert(i.ident.to_string(), names);
            &i.ident
        }
        Item::ExternCrate(i) => {
            let name = i.rename.as_ref().map_or(&i.ident, |(_, r)| r);
            if name != "self" && name != "_" {
                bindings.externs.insert(name.to_string());
            }
            return;
        }
        Item::ForeignMod(f) => {
            for foreign in &f.items {
                let ident = match foreign {
                    syn::ForeignItem::Fn(i) => &i.sig.ident,
                    syn::ForeignItem::Static(i) => &i.ident,
                    syn::ForeignItem::Type(i) => &i.ident,
                    _ => continue,
                };
                bindings.items.insert(ident.to_string());
            }
            return;
        }
        _ => return,
    };
    bindings.items.insert(name.to_string());
}

/// Adds the bindings of one `use` tree under `prefix`.
fn flatten_use(tree: &UseTree, prefix: &mut Vec<String>, absolute: bool, out: &mut Bindings) {
    let mut bind = |name: String, segs: Vec<String>| {
        out.uses
            .entry(name)
            .or_default()
            .push(UsePath { absolute, segs });
    };
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten_use(&p.tree, prefix, absolute, out);
            prefix.pop();
        }
        UseTree::Name(n) if n.ident == "self" => {
            if let Some(last) = prefix.last() {
                bind(last.clone(), prefix.clone());
            }
        }
        UseTree::Name(n) => {
            let mut segs = prefix.clone();
            segs.push(n.ident.to_string());
            bind(n.ident.to_string(), segs);
        }
        UseTree::Rename(r) if r.rename == "_" => {}
        UseTree::Rename(r) => {
            let mut segs = prefix.clone();
            if r.ident != "self" {
                segs.push(r.ident.to_string());
            }
            bind(r.rename.to_string(), segs);
        }
        UseTree::Glob(_) => out.globs.push(UsePath {
            absolute,
            segs: prefix.clone(),
        }),
        UseTree::Group(g) => {
            for t in &g.items {
                flatten_use(t, prefix, absolute, out);
            }
        }
    }
}

/// The attributes of an item.
pub(crate) fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The attributes of an item of an `impl` block.
pub(crate) fn impl_item_attrs(item: &ImplItem) -> &[Attribute] {
    match item {
        ImplItem::Const(i) => &i.attrs,
        ImplItem::Fn(i) => &i.attrs,
        ImplItem::Type(i) => &i.attrs,
        ImplItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}

/// Whether some `#[cfg(...)]` among `attrs` holds only in test builds.
pub(crate) fn is_test_only(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| needs_test(&m))
    })
}

/// Whether the cfg predicate `meta` requires `test`.
fn needs_test(meta: &syn::Meta) -> bool {
    let nested = |list: &syn::MetaList| {
        list.parse_args_with(
            syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
        )
        .map(|p| p.into_iter().collect::<Vec<_>>())
        .unwrap_or_default()
    };
    match meta {
        syn::Meta::Path(p) => p.is_ident("test"),
        syn::Meta::List(l) if l.path.is_ident("all") => nested(l).iter().any(needs_test),
        syn::Meta::List(l) if l.path.is_ident("any") => {
            let preds = nested(l);
            !preds.is_empty() && preds.iter().all(needs_test)
        }
        _ => false,
    }
}

/// The value of a `#[path = "..."]` attribute.
fn path_attribute(attrs: &[Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// `path` with `.` and `..` components folded away (lexically).
pub(crate) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                let at_start = matches!(
                    out.components().next_back(),
                    None | Some(Component::ParentDir)
                );
                if at_start || !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}
