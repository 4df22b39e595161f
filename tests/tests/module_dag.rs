//! The modules of every crate of the workspace import each other without cycles, except for
//! the known cycles of `tests/module-cycles.txt`, a baseline that may only shrink.
//!
//! See `superinfer_tests::modgraph` for what makes an edge. Run with `--nocapture` for the
//! current cycles with their edges, and the paths the resolution could not follow.

use std::path::Path;

use superinfer_tests::modgraph::{self, Cycle};

#[test]
fn module_imports_form_a_dag_except_the_known_cycles() {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir
        .parent()
        .expect("the tests crate is in the workspace");
    let graphs = modgraph::analyze_workspace(workspace).expect("the workspace manifests read");

    let errors: Vec<&String> = graphs.iter().flat_map(|g| &g.errors).collect();
    assert!(
        errors.is_empty(),
        "module files missing or unparsable: {errors:#?}"
    );

    let mut cycles: Vec<Cycle> = graphs.iter().flat_map(|g| g.cycles()).collect();
    modgraph::sort_largest_first(&mut cycles);

    let modules: usize = graphs.iter().map(|g| g.modules.len()).sum();
    let edges: usize = graphs.iter().map(|g| g.edges.len()).sum();
    let unresolved: usize = graphs.iter().map(|g| g.unresolved.len()).sum();
    eprintln!(
        "{} crates, {modules} modules, {edges} edges, {} cycles; {unresolved} paths unresolved",
        graphs.len(),
        cycles.len()
    );
    for g in &graphs {
        eprintln!(
            "  {}: {} modules, {} edges, {} unresolved",
            g.name,
            g.modules.len(),
            g.edges.len(),
            g.unresolved.len()
        );
    }
    for g in &graphs {
        for path in &g.unresolved {
            eprintln!("  unresolved in {}: {path}", g.name);
        }
    }
    for c in &cycles {
        eprintln!("{}", c.report());
    }

    let baseline_path = manifest_dir.join("module-cycles.txt");
    let baseline = std::fs::read_to_string(&baseline_path).expect("tests/module-cycles.txt");
    if let Err(msg) = modgraph::check_baseline(&cycles, &baseline) {
        panic!("{}: {msg}", baseline_path.display());
    }
}
