//! The items a module's code refers to: every path in its items (signatures, bodies, impl
//! headers, bounds, patterns, and the arguments of macro calls, parsed best-effort),
//! resolved to the module that defines the item. Attributes, visibilities and `use`
//! declarations are not visited: a `use` by itself is not a dependency.

use std::collections::{BTreeMap, BTreeSet};

use syn::parse::discouraged::Speculative;
use syn::parse::{ParseStream, Parser};
use syn::visit::{self, Visit};
use syn::{Expr, Generics, ImplItem, Item, Pat, Path, QSelf, Token, Type};

use super::resolve::{Resolver, Target};
use super::tree::{impl_item_attrs, is_test_only, item_attrs, UsePath};

/// The references found in one module's code.
pub(crate) struct Refs<'r, 't> {
    resolver: &'r Resolver<'t>,
    module: usize,
    /// Local names in scope, innermost scope last: variables, and generic parameters (marked
    /// `true`: they may start a path such as `T::Item`).
    scopes: Vec<Vec<(String, bool)>>,
    /// How deep in macro calls' tokens the visit is.
    in_macro: usize,
    /// Per module this one depends on, the items that make the dependency.
    pub edges: BTreeMap<usize, BTreeSet<String>>,
    /// Paths that resolved to nothing, as written.
    pub unresolved: Vec<String>,
}

impl<'r, 't> Refs<'r, 't> {
    pub fn new(resolver: &'r Resolver<'t>, module: usize) -> Self {
        Refs {
            resolver,
            module,
            scopes: vec![Vec::new()],
            in_macro: 0,
            edges: BTreeMap::new(),
            unresolved: Vec::new(),
        }
    }

    /// Records what the first `len` segments of `path` name, then visits its generic arguments.
    fn path_prefix(&mut self, path: &Path, len: usize) {
        let segs: Vec<String> = path
            .segments
            .iter()
            .take(len)
            .map(|s| s.ident.to_string())
            .collect();
        if !segs.is_empty() {
            self.reference(UsePath {
                absolute: path.leading_colon.is_some(),
                segs,
            });
        }
        for seg in &path.segments {
            self.visit_path_arguments(&seg.arguments);
        }
    }

    /// A path that may be qualified (`<T as Trait>::f`): the trait part is the reference.
    fn qualified(&mut self, qself: Option<&QSelf>, path: &Path) {
        match qself {
            None => self.path_prefix(path, path.segments.len()),
            Some(q) => {
                self.visit_type(&q.ty);
                self.path_prefix(path, q.position);
            }
        }
    }

    /// Records the item `path` names when another module defines it.
    fn reference(&mut self, path: UsePath) {
        let single = path.segs.len() == 1;
        if !path.absolute && self.is_local(&path.segs[0], !single) {
            return;
        }
        match self.resolver.resolve(self.module, &path, true, 0) {
            Some(Target::Item { module, name }) if module != self.module => {
                self.edges.entry(module).or_default().insert(name);
            }
            Some(_) => {}
            // A lone name in a macro call may be the macro's own syntax (`biased;`).
            None if single && self.in_macro > 0 => {}
            None => self.unresolved.push(path.segs.join("::")),
        }
    }

    /// Whether `name` is a local name in scope (`generic`: only a generic parameter).
    fn is_local(&self, name: &str, generic: bool) -> bool {
        let hit = |&(ref n, g): &(String, bool)| n == name && (g || !generic);
        self.scopes.iter().any(|s| s.iter().any(hit))
    }

    fn bind(&mut self, name: String, generic: bool) {
        if let Some(scope) = self.scopes.last_mut() {
            scope.push((name, generic));
        }
    }

    /// Runs `f` in a new scope holding the generic parameters of `generics`.
    fn scoped(&mut self, generics: Option<&Generics>, f: impl FnOnce(&mut Self)) {
        self.scopes.push(Vec::new());
        for param in generics.into_iter().flat_map(|g| &g.params) {
            match param {
                syn::GenericParam::Type(t) => self.bind(t.ident.to_string(), true),
                syn::GenericParam::Const(c) => self.bind(c.ident.to_string(), false),
                syn::GenericParam::Lifetime(_) => {}
            }
        }
        f(self);
        self.scopes.pop();
    }
}

impl<'ast> Visit<'ast> for Refs<'_, '_> {
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}
    fn visit_item_use(&mut self, _: &'ast syn::ItemUse) {}
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}

    fn visit_item(&mut self, item: &'ast Item) {
        if !is_test_only(item_attrs(item)) {
            visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        if !is_test_only(impl_item_attrs(item)) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_item_fn(&mut self, i: &'ast syn::ItemFn) {
        self.scoped(Some(&i.sig.generics), |v| visit::visit_item_fn(v, i));
    }
    fn visit_impl_item_fn(&mut self, i: &'ast syn::ImplItemFn) {
        self.scoped(Some(&i.sig.generics), |v| visit::visit_impl_item_fn(v, i));
    }
    fn visit_trait_item_fn(&mut self, i: &'ast syn::TraitItemFn) {
        self.scoped(Some(&i.sig.generics), |v| visit::visit_trait_item_fn(v, i));
    }
    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        self.scoped(Some(&i.generics), |v| visit::visit_item_impl(v, i));
    }
    fn visit_item_struct(&mut self, i: &'ast syn::ItemStruct) {
        self.scoped(Some(&i.generics), |v| visit::visit_item_struct(v, i));
    }
    fn visit_item_enum(&mut self, i: &'ast syn::ItemEnum) {
        self.scoped(Some(&i.generics), |v| visit::visit_item_enum(v, i));
    }
    fn visit_item_union(&mut self, i: &'ast syn::ItemUnion) {
        self.scoped(Some(&i.generics), |v| visit::visit_item_union(v, i));
    }
    fn visit_item_trait(&mut self, i: &'ast syn::ItemTrait) {
        self.scoped(Some(&i.generics), |v| visit::visit_item_trait(v, i));
    }
    fn visit_item_type(&mut self, i: &'ast syn::ItemType) {
        self.scoped(Some(&i.generics), |v| visit::visit_item_type(v, i));
    }
    fn visit_block(&mut self, b: &'ast syn::Block) {
        self.scoped(None, |v| visit::visit_block(v, b));
    }
    fn visit_expr_closure(&mut self, c: &'ast syn::ExprClosure) {
        self.scoped(None, |v| visit::visit_expr_closure(v, c));
    }
    fn visit_arm(&mut self, a: &'ast syn::Arm) {
        self.scoped(None, |v| visit::visit_arm(v, a));
    }

    fn visit_expr_for_loop(&mut self, f: &'ast syn::ExprForLoop) {
        self.visit_expr(&f.expr);
        self.scoped(None, |v| {
            v.visit_pat(&f.pat);
            v.visit_block(&f.body);
        });
    }

    /// The initializer first: it does not see the names the pattern binds.
    fn visit_local(&mut self, l: &'ast syn::Local) {
        if let Some(init) = &l.init {
            self.visit_expr(&init.expr);
            if let Some((_, diverge)) = &init.diverge {
                self.visit_expr(diverge);
            }
        }
        self.visit_pat(&l.pat);
    }

    fn visit_expr_let(&mut self, e: &'ast syn::ExprLet) {
        self.visit_expr(&e.expr);
        self.visit_pat(&e.pat);
    }

    /// A lower-case identifier pattern binds a name; a capitalized one names a constant, a
    /// unit struct or a variant.
    fn visit_pat_ident(&mut self, p: &'ast syn::PatIdent) {
        let name = p.ident.to_string();
        let plain = p.by_ref.is_none() && p.mutability.is_none() && p.subpat.is_none();
        if plain && name.starts_with(|c: char| c.is_ascii_uppercase()) {
            self.reference(UsePath {
                absolute: false,
                segs: vec![name],
            });
            return;
        }
        self.bind(name, false);
        if let Some((_, sub)) = &p.subpat {
            self.visit_pat(sub);
        }
    }

    fn visit_path(&mut self, path: &'ast Path) {
        self.path_prefix(path, path.segments.len());
    }
    fn visit_expr_path(&mut self, e: &'ast syn::ExprPath) {
        self.qualified(e.qself.as_ref(), &e.path);
    }
    fn visit_type_path(&mut self, t: &'ast syn::TypePath) {
        self.qualified(t.qself.as_ref(), &t.path);
    }
    fn visit_expr_struct(&mut self, e: &'ast syn::ExprStruct) {
        self.qualified(e.qself.as_ref(), &e.path);
        for field in &e.fields {
            self.visit_expr(&field.expr);
        }
        if let Some(rest) = &e.rest {
            self.visit_expr(rest);
        }
    }
    fn visit_pat_struct(&mut self, p: &'ast syn::PatStruct) {
        self.qualified(p.qself.as_ref(), &p.path);
        for field in &p.fields {
            self.visit_pat(&field.pat);
        }
    }
    fn visit_pat_tuple_struct(&mut self, p: &'ast syn::PatTupleStruct) {
        self.qualified(p.qself.as_ref(), &p.path);
        for elem in &p.elems {
            self.visit_pat(elem);
        }
    }

    /// A macro call's path is not followed (`macro_rules!` macros are not items here); its
    /// tokens are parsed as items, else as comma- or semicolon-separated expressions,
    /// patterns or types, skipping the parts that are none of them. In `name = value` (a
    /// `tracing` field, a named format argument) only the value is visited.
    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        if mac.path.is_ident("macro_rules") || mac.path.is_ident("cfg") {
            return;
        }
        self.in_macro += 1;
        match syn::parse2::<syn::File>(mac.tokens.clone()) {
            Ok(file) if !file.items.is_empty() => {
                for item in &file.items {
                    self.visit_item(item);
                }
            }
            _ => {
                for arg in &macro_args.parse2(mac.tokens.clone()).unwrap_or_default() {
                    match arg {
                        MacroArg::Expr(Expr::Assign(a)) if is_ident(&a.left) => {
                            self.visit_expr(&a.right)
                        }
                        MacroArg::Expr(e) => self.visit_expr(e),
                        MacroArg::Pat(p) => self.visit_pat(p),
                        MacroArg::Type(t) => self.visit_type(t),
                    }
                }
            }
        }
        self.in_macro -= 1;
    }
}

/// Whether `e` is a lone identifier.
fn is_ident(e: &Expr) -> bool {
    matches!(e, Expr::Path(p) if p.qself.is_none() && p.path.get_ident().is_some())
}

/// One part of a macro call's tokens.
enum MacroArg {
    Expr(Expr),
    Pat(Pat),
    Type(Type),
}

/// The parts of a macro call's tokens, split at top-level `,` and `;`.
fn macro_args(input: ParseStream) -> syn::Result<Vec<MacroArg>> {
    let at_end = |s: ParseStream| s.is_empty() || s.peek(Token![,]) || s.peek(Token![;]);
    let mut out = Vec::new();
    while !input.is_empty() {
        let fork = input.fork();
        let fork_pat = input.fork();
        let fork_ty = input.fork();
        if let Some(e) = fork.parse::<Expr>().ok().filter(|_| at_end(&fork)) {
            input.advance_to(&fork);
            out.push(MacroArg::Expr(e));
        } else if let Some(p) = Pat::parse_multi_with_leading_vert(&fork_pat)
            .ok()
            .filter(|_| at_end(&fork_pat))
        {
            input.advance_to(&fork_pat);
            out.push(MacroArg::Pat(p));
        } else if let Some(t) = fork_ty.parse::<Type>().ok().filter(|_| at_end(&fork_ty)) {
            input.advance_to(&fork_ty);
            out.push(MacroArg::Type(t));
        } else {
            skip_part(input)?;
        }
        if input.peek(Token![,]) {
            input.parse::<Token![,]>()?;
        } else if input.peek(Token![;]) {
            input.parse::<Token![;]>()?;
        }
    }
    Ok(out)
}

/// Skips tokens up to the next top-level `,` or `;`.
fn skip_part(input: ParseStream) -> syn::Result<()> {
    input.step(|cursor| {
        let mut rest = *cursor;
        while let Some((_, next)) = rest.token_tree() {
            if rest
                .punct()
                .is_some_and(|(p, _)| matches!(p.as_char(), ',' | ';'))
            {
                break;
            }
            rest = next;
        }
        Ok(((), rest))
    })
}
