//! The server driven by the official `openai` Python package (chat streaming and not,
//! completions streaming and not, errors). Fails when python3 or the package is missing:
//! `.ci/run` installs it (`python3 -m pip install openai`), and a test that passes without
//! running would hide a broken client path.

use std::process::Command;
use superinfer_tests::{run_python_client, TestServer};

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
    let stdout = run_python_client("openai_e2e.py", &s, &s.key.clone()).await;
    eprintln!("openai {version}: {stdout}");
    s.shutdown().await;
}
