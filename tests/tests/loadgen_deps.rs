//! The load generator and the twin build on the engine's scheduler-facing core only: no model
//! code, so no candle (`superinfer-engine` without its `model` feature). Checked on the
//! resolved dependency graph, as `cargo tree` prints it.

use std::process::Command;

#[test]
fn the_load_generator_does_not_depend_on_candle() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--manifest-path", root])
        .args([
            "-p",
            "superinfer-loadgen",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        tree.lines().any(|l| l.starts_with("superinfer-engine ")),
        "the load generator uses the engine: {tree}"
    );
    let candle: Vec<&str> = tree.lines().filter(|l| l.starts_with("candle")).collect();
    assert!(candle.is_empty(), "the load generator pulls in {candle:?}");
}
