//! The server driven by the official `openai` Python package (chat streaming and not,
//! completions streaming and not, errors). Fails when python3 or the package is missing:
//! `.ci/run` installs it (`python3 -m pip install openai`), and a test that passes without
//! running would hide a broken client path.

use std::path::Path;
use std::process::Command;
use superinfer_tests::TestServer;

fn python_with_openai() -> Option<String> {
    let out = Command::new("python3")
        .args(["-c", "import openai; print(openai.__version__)"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_client_works() {
    let version = python_with_openai().expect(
        "python3 with the `openai` package is needed for this test \
         (python3 -m pip install openai; .ci/run installs it)",
    );
    let s = TestServer::start().await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/openai_e2e.py");
    let (base, key, model) = (s.base.clone(), s.key.clone(), s.model());
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .args([&base, &key, &model])
            .output()
            .expect("python3 runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "openai {version}:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("ok"), "{stdout}");
    s.shutdown().await;
}
