//! The `superinfer` binary as a child process: first start prints the default key once,
//! tenants survive a restart, SIGTERM drains in-flight streams and exits cleanly.

use futures_util::StreamExt;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const ADMIN: &str = "process-test-admin-token";

struct Server {
    child: Child,
    base: String,
    default_key: Option<String>,
    lines: mpsc::Receiver<String>,
}

impl Server {
    /// Starts `superinfer serve` on a free port and waits until it listens.
    fn start(data_dir: &Path, profile: &str) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_superinfer"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--sim-profile", profile])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--admin-token", ADMIN, "--drain-timeout-s", "20"]);
        Server::spawn(cmd)
    }

    /// Spawns a prepared `superinfer serve` command and waits until it listens.
    #[allow(clippy::zombie_processes)] // `Drop for Server` kills and waits for the child.
    fn spawn(mut cmd: Command) -> Server {
        let mut child = cmd
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the binary starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut default_key = None;
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(60))
                .expect("the server prints where it listens");
            if let Some(k) = line.strip_prefix("default tenant api key: ") {
                default_key = Some(k.to_string());
            }
            if let Some(addr) = line.strip_prefix("listening on ") {
                return Server {
                    child,
                    base: addr.to_string(),
                    default_key,
                    lines,
                };
            }
        }
    }

    fn sigterm(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok);
    }

    fn wait(mut self) -> std::process::ExitStatus {
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait().expect("waitable") {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("the server did not exit within 30 s");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        while self.lines.try_recv().is_ok() {}
    }
}

async fn complete(base: &str, key: &str) -> reqwest::StatusCode {
    reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .bearer_auth(key)
        .json(&json!({"prompt": "hi", "max_tokens": 2}))
        .send()
        .await
        .expect("the server answers")
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_and_keys_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), "zero");
    let default_key = s
        .default_key
        .clone()
        .expect("the first start prints the default key");
    assert!(default_key.starts_with("sk-si-") && default_key.len() == 70);
    let client = reqwest::Client::new();
    let created: Value = client
        .post(format!("{}/admin/v1/tenants", s.base))
        .bearer_auth(ADMIN)
        .json(&json!({"name": "durable", "weight": 4.0, "slo": {"ttft_ms": 1234}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key = created["api_key"].as_str().unwrap().to_string();
    let status = client
        .patch(format!("{}/admin/v1/tenants/durable", s.base))
        .bearer_auth(ADMIN)
        .json(&json!({"quotas": {"max_concurrent": 3}}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
    assert_eq!(complete(&s.base, &key).await, 200);
    s.sigterm();
    assert!(s.wait().success());

    let s = Server::start(dir.path(), "zero");
    assert_eq!(
        s.default_key, None,
        "the key is shown on the first start only"
    );
    assert_eq!(complete(&s.base, &default_key).await, 200);
    assert_eq!(complete(&s.base, &key).await, 200);
    let t: Value = client
        .get(format!("{}/admin/v1/tenants/durable", s.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(t["weight"], 4.0);
    assert_eq!(t["slo"]["ttft_ms"], 1234);
    assert_eq!(t["quotas"]["max_concurrent"], 3);
    s.sigterm();
    assert!(s.wait().success());

    // Offline, the CLI sees the same store.
    let out = Command::new(env!("CARGO_BIN_EXE_superinfer"))
        .args(["tenants", "list", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(names, ["default", "durable"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_accepting_and_drains_in_flight_streams() {
    let dir = tempfile::tempdir().unwrap();
    // Paced at the h200-llama-3-8b profile: ~6 ms a token, so 150 tokens take about a second.
    let s = Server::start(dir.path(), "h200-llama-3-8b");
    let key = s.default_key.clone().unwrap();
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/completions", s.base))
        .bearer_auth(&key)
        .json(&json!({"prompt": "hi", "max_tokens": 150, "stream": true, "ignore_eos": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut text = String::from_utf8(body.next().await.unwrap().unwrap().to_vec()).unwrap();
    s.sigterm();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // New connections are refused while the stream drains.
    let fresh = reqwest::Client::new()
        .post(format!("{}/v1/completions", s.base))
        .bearer_auth(&key)
        .json(&json!({"prompt": "hi"}))
        .send()
        .await;
    assert!(
        fresh.is_err() || fresh.as_ref().unwrap().status() == 503,
        "{fresh:?}"
    );
    while let Some(chunk) = body.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    let tokens = text.matches("\"text\":\"").count() - 1;
    assert_eq!(tokens, 150);
    let status = tokio::task::spawn_blocking(move || s.wait()).await.unwrap();
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_panic_ends_the_stream_with_503_and_the_process_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_superinfer"));
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--sim-profile",
        "h200-llama-3-8b",
    ])
    .arg("--data-dir")
    .arg(dir.path())
    .args(["--admin-token", ADMIN, "--drain-timeout-s", "20"])
    // `superinfer_engine::handle::fault` (a dev-only feature of this build).
    .env("SUPERINFER_FAULT_PANIC_AT_STEP", "30");
    let s = Server::spawn(cmd);
    let key = s.default_key.clone().unwrap();
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/completions", s.base))
        .bearer_auth(&key)
        .json(&json!({"prompt": "hi", "max_tokens": 2000, "stream": true, "ignore_eos": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    while let Some(chunk) = body.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(text.contains("\"code\":\"engine_failed\""), "{text}");
    assert!(text.contains("injected fault"), "{text}");
    // The server drains and exits non-zero for its supervisor to restart it.
    let status = tokio::task::spawn_blocking(move || s.wait()).await.unwrap();
    assert_eq!(status.code(), Some(1), "{status:?}");
}

#[test]
fn bad_flags_exit_2_and_a_locked_data_dir_is_explained() {
    let out = Command::new(env!("CARGO_BIN_EXE_superinfer"))
        .args(["serve", "--listen", "not-an-address"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), "zero");
    let out = Command::new(env!("CARGO_BIN_EXE_superinfer"))
        .args(["tenants", "list", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is the server running"), "{err}");
    drop(s);
}

#[test]
fn flags_override_the_environment_which_overrides_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let (file_dir, env_dir, flag_dir) = (
        dir.path().join("file"),
        dir.path().join("env"),
        dir.path().join("flag"),
    );
    let config = dir.path().join("superinfer.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nsim_profile = \"zero\"\ndata_dir = {:?}\n",
            file_dir.to_str().unwrap()
        ),
    )
    .unwrap();
    let run = |flag: Option<&Path>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_superinfer"));
        cmd.arg("serve").arg("--config").arg(&config);
        cmd.env("SUPERINFER_DATA_DIR", &env_dir);
        if let Some(f) = flag {
            cmd.arg("--data-dir").arg(f);
        }
        let s = Server::spawn(cmd);
        s.sigterm();
        assert!(s.wait().success());
    };
    run(None);
    assert!(env_dir.join("tenants").exists() && !file_dir.exists());
    run(Some(&flag_dir));
    assert!(flag_dir.join("tenants").exists() && !file_dir.exists());
}

/// A binary built with the test-only fault-injection feature (as cargo builds this one for
/// the tests, and `cargo test --release` or `cargo bench` build `target/release/superinfer`)
/// says so at start-up, naming the variables that arm it and which are set.
#[test]
fn a_binary_with_fault_injection_says_so_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_superinfer"))
        .args(["serve", "--listen", "127.0.0.1:0", "--sim-profile", "zero"])
        .arg("--data-dir")
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .env("SUPERINFER_FAULT_MASK_PANIC", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let stdout = child.stdout.take().expect("piped stdout");
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        if line.starts_with("listening on ") {
            break;
        }
    }
    let _ = child.kill();
    let out = child.wait_with_output().expect("the child ends");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("test-only fault-injection feature"), "{err}");
    assert!(
        err.contains("set now: SUPERINFER_FAULT_MASK_PANIC"),
        "{err}"
    );
}
