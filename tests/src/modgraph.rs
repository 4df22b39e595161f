//! The dependency graph between the modules of each crate, and its cycles.
//!
//! A module depends on another when its code (signatures, bodies, impl headers, bounds,
//! patterns, macro arguments) names an item that the other module defines. Paths are resolved
//! the way rustc resolves them, simplified: the first segment is `crate`, `super`, `self`, a
//! name the module defines or imports (by `use`, or a glob import), an external crate, or a
//! prelude name; `use` bindings and `pub use` re-exports are followed to the module that
//! defines the item. A `use` declaration alone makes no edge (a facade that re-exports is not
//! a dependency), nor does a parent's `mod child;`. Code under `#[cfg(test)]` is left out.
//!
//! The graph should be a DAG in every crate; [`check_baseline`] compares its cycles with the
//! known ones.

mod cycles;
mod manifest;
mod refs;
mod resolve;
mod tree;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub use cycles::{check_baseline, sort_largest_first, Cycle, CycleEdge};
pub use tree::ReadFn;

use refs::Refs;
use resolve::Resolver;
use tree::Tree;

/// One module of a crate.
#[derive(Clone, Debug)]
pub struct ModuleInfo {
    /// The path from the crate root (`kv::pool`); `crate` for the root.
    pub path: String,
    /// The file that holds its code.
    pub file: PathBuf,
}

/// The module graph of one crate.
#[derive(Clone, Debug)]
pub struct CrateGraph {
    /// The package name (`<package>/bin/<name>` for a binary).
    pub name: String,
    /// The modules, the root first.
    pub modules: Vec<ModuleInfo>,
    /// `(a, b)` → the items of module `b` that module `a`'s code uses (`a ≠ b`).
    pub edges: BTreeMap<(usize, usize), BTreeSet<String>>,
    /// Paths that resolved to nothing (items made by macros, locals the scoping missed, ...),
    /// as `module: path`.
    pub unresolved: Vec<String>,
    /// Module files that are missing or did not parse.
    pub errors: Vec<String>,
}

impl CrateGraph {
    /// Builds the graph of the crate whose root file is `root`; `externs`: the external crate
    /// names its code may use; `read`: reads a source file.
    pub fn analyze(
        name: &str,
        root: &Path,
        externs: &BTreeSet<String>,
        read: &ReadFn,
    ) -> CrateGraph {
        let tree = Tree::load(root, read);
        let resolver = Resolver::new(&tree, externs);
        let mut edges: BTreeMap<(usize, usize), BTreeSet<String>> = BTreeMap::new();
        let mut unresolved = Vec::new();
        let path = |segs: &[String]| {
            if segs.is_empty() {
                "crate".to_string()
            } else {
                segs.join("::")
            }
        };
        for (id, module) in tree.modules.iter().enumerate() {
            let mut refs = Refs::new(&resolver, id);
            for item in &module.body {
                syn::visit::Visit::visit_item(&mut refs, item);
            }
            for (to, items) in refs.edges {
                edges.entry((id, to)).or_default().extend(items);
            }
            let here = path(&module.segs);
            unresolved.extend(refs.unresolved.into_iter().map(|p| format!("{here}: {p}")));
        }
        CrateGraph {
            name: name.to_string(),
            modules: tree
                .modules
                .iter()
                .map(|m| ModuleInfo {
                    path: path(&m.segs),
                    file: m.file.clone(),
                })
                .collect(),
            edges,
            unresolved,
            errors: tree.errors,
        }
    }

    /// Builds the graph of a crate given as `(file, source)` pairs, the root file first; only
    /// `std`, `core` and `alloc` are external.
    pub fn from_sources(name: &str, sources: &[(&str, &str)]) -> CrateGraph {
        let files: BTreeMap<PathBuf, &str> = sources
            .iter()
            .map(|&(f, s)| (tree::normalize(Path::new(f)), s))
            .collect();
        let read = |p: &Path| files.get(p).map(|s| s.to_string());
        let externs = ["std", "core", "alloc"].map(String::from).into();
        let root = sources.first().map_or("src/lib.rs", |&(f, _)| f);
        CrateGraph::analyze(name, Path::new(root), &externs, &read)
    }

    /// The strongly connected components of more than one module, largest first.
    pub fn cycles(&self) -> Vec<Cycle> {
        let modules: Vec<(String, String)> = self
            .modules
            .iter()
            .map(|m| (m.path.clone(), m.file.display().to_string()))
            .collect();
        cycles::find(&self.name, &modules, &self.edges)
    }

    /// The items of module `to` that module `from` uses (by module path), if it uses any.
    pub fn edge(&self, from: &str, to: &str) -> Option<&BTreeSet<String>> {
        let id = |p: &str| self.modules.iter().position(|m| m.path == p);
        self.edges.get(&(id(from)?, id(to)?))
    }
}

/// The graphs of the crates of the workspace rooted at `workspace`: every member's library,
/// and those of its binaries that declare modules. Module files are reported relative to
/// `workspace`.
pub fn analyze_workspace(workspace: &Path) -> Result<Vec<CrateGraph>, String> {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let mut graphs = Vec::new();
    for krate in manifest::crate_roots(workspace)? {
        let mut graph = CrateGraph::analyze(&krate.name, &krate.root, &krate.externs, &read);
        if krate.binary && graph.modules.len() < 2 {
            continue;
        }
        for module in &mut graph.modules {
            if let Ok(rel) = module.file.strip_prefix(workspace) {
                module.file = rel.to_path_buf();
            }
        }
        graphs.push(graph);
    }
    Ok(graphs)
}

#[cfg(test)]
mod tests;
