//! `superinfer tenants apply -f FILE` and `superinfer serve --tenants-file FILE` as child
//! processes: keys from SHA-256 hashes and from the environment, idempotence, refusal of a
//! plain-text key, and SIGHUP re-applying the file to the running server (with pruning).

use serde_json::json;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const KEY_A: &str = "sk-si-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const KEY_B: &str = "sk-si-fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

/// The hex SHA-256 of a key, as `sha256sum` prints it (and the store keeps it).
fn sha256_hex(s: &str) -> String {
    superinfer_tenants::KeyHash::of(s).to_hex()
}

fn both_tenants() -> String {
    format!(
        "[[tenant]]\nname = \"alpha\"\napi_key_sha256 = \"{}\"\nweight = 2\ntokens_per_min = 50000\n\n\
         [[tenant]]\nname = \"beta\"\napi_key_env = \"BETA_KEY\"\nttft_ms = 1500\n",
        sha256_hex(KEY_A)
    )
}

fn superinfer(args: &[&str], data_dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_superinfer"))
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env("BETA_KEY", KEY_B)
        .output()
        .expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn apply_is_idempotent_and_refuses_plain_keys() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("tenants.toml");
    std::fs::write(&file, both_tenants()).expect("the file is written");
    let f = file.to_str().expect("a UTF-8 path");
    let first = superinfer(&["tenants", "apply", "-f", f], dir.path());
    assert!(first.status.success(), "{first:?}");
    let out = stdout(&first);
    assert!(out.contains("created alpha\ncreated beta\n"), "{out}");
    assert!(
        out.ends_with("2 created, 0 updated, 0 unchanged, 0 removed\n"),
        "{out}"
    );
    let second = superinfer(&["tenants", "apply", "-f", f, "--prune"], dir.path());
    assert!(second.status.success(), "{second:?}");
    let out = stdout(&second);
    assert!(
        out.ends_with("0 created, 0 updated, 2 unchanged, 0 removed\n"),
        "{out}"
    );

    std::fs::write(
        &file,
        format!("[[tenant]]\nname = \"gamma\"\napi_key = \"{KEY_A}\"\n"),
    )
    .expect("the file is written");
    let plain = superinfer(&["tenants", "apply", "-f", f], dir.path());
    assert_eq!(plain.status.code(), Some(1));
    let err = String::from_utf8_lossy(&plain.stderr);
    assert!(
        err.contains("plain-text API key") && err.contains("api_key_sha256"),
        "{err}"
    );
    let list = stdout(&superinfer(&["tenants", "list"], dir.path()));
    assert_eq!(
        list.lines().count(),
        2,
        "the refused file changed nothing: {list}"
    );
}

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[allow(clippy::zombie_processes)] // `Drop for Server` kills and waits for the child.
fn serve(data_dir: &Path, file: &Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_superinfer"))
        .args(["serve", "--listen", "127.0.0.1:0", "--sim-profile", "zero"])
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--tenants-file")
        .arg(file)
        .arg("--tenants-prune")
        .env("BETA_KEY", KEY_B)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the binary starts");
    let out = child.stdout.take().expect("piped stdout");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .expect("the server prints where it listens");
        assert!(
            !line.starts_with("default tenant api key"),
            "a tenants file creates no default tenant"
        );
        if let Some(base) = line.strip_prefix("listening on ") {
            return Server {
                child,
                base: base.to_string(),
            };
        }
    }
}

async fn complete(base: &str, key: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .bearer_auth(key)
        .json(&json!({"prompt": "hi", "max_tokens": 2}))
        .send()
        .await
        .expect("the server answers")
        .status()
        .as_u16()
}

fn sighup(s: &Server) {
    let ok = Command::new("kill")
        .args(["-HUP", &s.child.id().to_string()])
        .status()
        .expect("kill runs")
        .success();
    assert!(ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_applies_the_file_at_start_and_on_sighup() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("tenants.toml");
    std::fs::write(&file, both_tenants()).expect("the file is written");
    let mut s = serve(&dir.path().join("data"), &file);
    assert_eq!(
        complete(&s.base, KEY_A).await,
        200,
        "the key of the SHA-256 entry works"
    );
    assert_eq!(
        complete(&s.base, KEY_B).await,
        200,
        "the key from the environment works"
    );

    // beta leaves the file: SIGHUP prunes it; alpha keeps working.
    let only_alpha = both_tenants()
        .split("\n\n")
        .next()
        .expect("two tables")
        .to_string();
    std::fs::write(&file, only_alpha).expect("the file is written");
    sighup(&s);
    let deadline = Instant::now() + Duration::from_secs(20);
    while complete(&s.base, KEY_B).await != 401 {
        assert!(Instant::now() < deadline, "SIGHUP did not remove beta");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(complete(&s.base, KEY_A).await, 200);

    // A bad file on SIGHUP is refused whole; the server keeps serving what it had.
    std::fs::write(&file, "[[tenant]]\nname = \"alpha\"\n").expect("the file is written");
    sighup(&s);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        s.child.try_wait().expect("waitable").is_none(),
        "the server is still up"
    );
    assert_eq!(complete(&s.base, KEY_A).await, 200);
}
