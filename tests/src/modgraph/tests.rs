//! The graph on tiny crates given as sources.

use super::{check_baseline, CrateGraph};

fn items(graph: &CrateGraph, from: &str, to: &str) -> Vec<String> {
    graph
        .edge(from, to)
        .map(|s| s.iter().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn a_cycle_through_super_and_crate_imports_is_found() {
    let lib = "pub mod a;\n\
               use crate::a::Y;\n\
               pub struct X;\n\
               pub fn make() -> Y { Y }\n";
    let a = "use super::X;\n\
             pub struct Y;\n\
             pub fn take(x: X) -> usize { let _ = x; 1 }\n\
             #[cfg(test)]\n\
             mod tests { use crate::*; fn t() { let _ = make(); } }\n";
    let graph = CrateGraph::from_sources("demo", &[("src/lib.rs", lib), ("src/a.rs", a)]);
    assert!(graph.errors.is_empty(), "{:?}", graph.errors);
    assert_eq!(items(&graph, "crate", "a"), ["Y"]);
    assert_eq!(items(&graph, "a", "crate"), ["X"]);
    assert!(graph.modules.iter().all(|m| m.path != "a::tests"));
    let cycles = graph.cycles();
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert_eq!(cycles[0].baseline_line(), "demo: a crate");
    assert_eq!(cycles[0].edges.len(), 2);
    assert!(
        cycles[0].report().contains("a -> crate (X)"),
        "{}",
        cycles[0].report()
    );

    // The import alone, unused, is no dependency.
    let a_unused = "#[allow(unused_imports)]\nuse super::X;\npub struct Y;\n";
    let graph = CrateGraph::from_sources("demo", &[("src/lib.rs", lib), ("src/a.rs", a_unused)]);
    assert!(graph.cycles().is_empty(), "{:?}", graph.cycles());
}

#[test]
fn a_facade_reexport_is_not_a_dependency() {
    let lib = "mod kv;\nmod server;\npub use kv::Pool;\npub struct Config;\n";
    let kv = "mod open;\nmod pool;\npub use open::open;\npub use self::pool::Pool;\n";
    let open = "pub fn open() -> super::Pool { todo!() }\n";
    let pool = "use crate::Config;\npub struct Pool { pub config: Config }\n";
    let server = "use crate::Pool;\n\
                  pub fn run(p: &Pool) -> &Pool { p }\n\
                  pub fn start() { let _ = crate::kv::open(); }\n";
    let graph = CrateGraph::from_sources(
        "demo",
        &[
            ("src/lib.rs", lib),
            ("src/kv.rs", kv),
            ("src/kv/open.rs", open),
            ("src/kv/pool.rs", pool),
            ("src/server.rs", server),
        ],
    );
    assert!(graph.errors.is_empty(), "{:?}", graph.errors);
    assert_eq!(items(&graph, "kv::pool", "crate"), ["Config"]);
    // Through both re-exports to the defining module.
    assert_eq!(items(&graph, "server", "kv::pool"), ["Pool"]);
    // `mod open; pub use open::open;`: the function, not the module.
    assert_eq!(items(&graph, "server", "kv::open"), ["open"]);
    assert_eq!(items(&graph, "kv::open", "kv::pool"), ["Pool"]);
    assert!(graph.edge("server", "crate").is_none());
    assert!(graph.edge("crate", "kv").is_none());
    assert!(graph.edge("kv", "kv::pool").is_none());
    assert!(graph.cycles().is_empty(), "{:?}", graph.cycles());
}

#[test]
fn glob_imports_resolve() {
    let lib = "mod a;\nmod b;\n";
    let a = "pub struct Foo;\n\
             pub enum Kind { Big, Small }\n\
             pub fn helper() {}\n\
             pub fn size(k: &Kind) -> usize { match k { Kind::Big => 2, Kind::Small => 1 } }\n\
             pub mod inner { use super::*; pub fn twice() { helper(); helper(); } }\n";
    let b = "use crate::a::*;\n\
             pub fn g(k: Kind) -> Foo {\n\
                 use Kind::*;\n\
                 let _ = matches!(k, Small);\n\
                 helper();\n\
                 Foo\n\
             }\n";
    let graph = CrateGraph::from_sources(
        "demo",
        &[("src/lib.rs", lib), ("src/a.rs", a), ("src/b.rs", b)],
    );
    assert!(graph.errors.is_empty(), "{:?}", graph.errors);
    assert_eq!(items(&graph, "b", "a"), ["Foo", "Kind", "helper"]);
    assert_eq!(items(&graph, "a::inner", "a"), ["helper"]);
    assert!(graph.unresolved.is_empty(), "{:?}", graph.unresolved);
    assert!(graph.cycles().is_empty());

    // `a` calling into `b` closes a cycle.
    let a_cycle = format!("{a}pub fn back() {{ crate::b::g(Kind::Big); }}\n");
    let graph = CrateGraph::from_sources(
        "demo",
        &[("src/lib.rs", lib), ("src/a.rs", &a_cycle), ("src/b.rs", b)],
    );
    let lines: Vec<String> = graph.cycles().iter().map(|c| c.baseline_line()).collect();
    assert_eq!(lines, ["demo: a b"]);
}

#[test]
fn the_baseline_must_match_the_cycles_exactly() {
    let lib = "pub mod a;\npub mod b;\npub struct R;\n";
    let a = "pub struct A;\npub fn f(_: crate::b::B, _: crate::R) {}\n";
    let b = "pub struct B;\npub fn g(_: super::a::A) {}\n";
    let graph = CrateGraph::from_sources(
        "demo",
        &[("src/lib.rs", lib), ("src/a.rs", a), ("src/b.rs", b)],
    );
    let cycles = graph.cycles();
    assert_eq!(cycles.len(), 1);
    assert!(check_baseline(&cycles, "# known\ndemo: a b\n").is_ok());
    // A new cycle.
    let err = check_baseline(&cycles, "").unwrap_err();
    assert!(
        err.contains("a -> b (B)") && err.contains("\ndemo: a b\n"),
        "{err}"
    );
    // A line wider than the cycle (it shrank).
    let err = check_baseline(&cycles, "demo: a b crate\n").unwrap_err();
    assert!(err.contains("match no current cycle"), "{err}");
    // A line for a cycle that is gone.
    let err = check_baseline(&cycles, "demo: a b\ndemo: crate b\n").unwrap_err();
    assert!(err.contains("demo: b crate"), "{err}");
}
