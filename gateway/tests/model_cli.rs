//! `superinfer model tiny --out DIR`, run as a process: the files load with the real loading
//! code, and the same seed writes the same bytes.

use std::path::Path;
use std::process::Command;

fn write_tiny(out: &Path, seed: u64) {
    let status = Command::new(env!("CARGO_BIN_EXE_superinfer"))
        .args(["model", "tiny", "--out"])
        .arg(out)
        .args(["--seed", &seed.to_string()])
        .status()
        .expect("the superinfer binary runs");
    assert!(status.success(), "superinfer model tiny failed: {status}");
}

#[test]
fn model_tiny_writes_a_loadable_deterministic_model() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("c"),
    );
    write_tiny(&a, 0);
    write_tiny(&b, 0);
    write_tiny(&c, 1);
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(a.join(f).is_file(), "{f} missing");
        assert_eq!(
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(b.join(f)).unwrap(),
            "{f} differs"
        );
    }
    assert_ne!(
        std::fs::read(a.join("model.safetensors")).unwrap(),
        std::fs::read(c.join("model.safetensors")).unwrap(),
        "another seed gives other weights"
    );
    let codec = superinfer_engine::TextCodec::from_model_dir(&a).expect("the tokenizer loads");
    let ids = codec.encode("Hello, world", false).unwrap();
    assert_eq!(codec.decode(&ids), "Hello, world");
}

#[test]
fn model_tiny_without_out_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_superinfer"))
        .args(["model", "tiny"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--out"));
}
