//! Fleet-wide quotas end to end (issue 15's acceptance): a real `redis-server`, `superinfer
//! serve` nodes on the simulated engine sharing it (`--quota-store`), the same tenants file on
//! each, and clients spreading one tenant's traffic over three nodes.
//! - the fleet admits that tenant's tokens per minute within 5% of its quota, where nodes on
//!   their own limiters (the control, no `--quota-store`) admit about three times as much;
//! - a second tenant is unaffected;
//! - killing one node (SIGKILL) leaves the others serving, and its concurrency leases expire
//!   after the lease TTL;
//! - a slow (SIGSTOP) or dead (SIGKILL) Redis gives each node its configured behaviour within
//!   one second: `open` serves on the local limiter, `closed` answers 503 with Retry-After.
//!
//! Tokens per minute is a bucket of `Q` tokens refilled at `Q / 60` per second (in debt →
//! refused), so over a run of `T` seconds from a full bucket it admits `Q * (1 + T / 60)`
//! tokens (plus what requests already admitted add as they finish): that is the quota the
//! admitted tokens are compared with.

#[path = "support/node.rs"]
mod node;
#[path = "support/redis_server.rs"]
mod redis_server;

use node::Node;
use redis_server::RedisServer;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const ALPHA: &str = "sk-si-a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
const BETA: &str = "sk-si-b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2";
const GAMMA: &str = "sk-si-c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3";
const ENV: &[(&str, &str)] = &[
    ("FLEET_ALPHA_KEY", ALPHA),
    ("FLEET_BETA_KEY", BETA),
    ("FLEET_GAMMA_KEY", GAMMA),
];
/// Alpha's tokens per minute: the quota under test.
const ALPHA_TPM: u64 = 30_000;
const TENANTS: &str = r#"
[[tenant]]
name = "alpha"
api_key_env = "FLEET_ALPHA_KEY"
tokens_per_min = 30000
requests_per_s = 1000
burst = 1000
max_concurrent = 64

[[tenant]]
name = "beta"
api_key_env = "FLEET_BETA_KEY"
tokens_per_min = 10000000
requests_per_s = 1000
burst = 1000

[[tenant]]
name = "gamma"
api_key_env = "FLEET_GAMMA_KEY"
max_concurrent = 2
max_output_tokens = 4000
"#;
const RUN: Duration = Duration::from_secs(8);
const LEASE_TTL_MS: u64 = 1500;
/// A paced profile: its requests stay in flight long enough to hold leases.
const PACED: &str = "gh200-qwen2.5-32b";

fn fleet_args<'a>(url: &'a str, failure: &'a str) -> Vec<&'a str> {
    vec![
        "--quota-store",
        url,
        "--quota-store-failure",
        failure,
        "--quota-store-timeout-ms",
        "100",
        "--quota-store-lease-ttl-ms",
        "1500",
    ]
}

async fn complete(c: &reqwest::Client, base: &str, key: &str, max_tokens: u32) -> (u16, Value) {
    let r = c
        .post(format!("{base}/v1/completions"))
        .bearer_auth(key)
        .json(&json!({"prompt": "fleet quota probe", "max_tokens": max_tokens, "ignore_eos": true}))
        .send()
        .await
        .expect("the node answers");
    let status = r.status().as_u16();
    let retry_after = r.headers().get("retry-after").cloned();
    let mut body: Value = r.json().await.unwrap_or(Value::Null);
    if let Some(v) = retry_after {
        body["retry_after_header"] = json!(v.to_str().unwrap_or(""));
    }
    (status, body)
}

/// Tokens admitted for one tenant by a set of clients over `RUN`.
#[derive(Debug, Default)]
struct Load {
    tokens: u64,
    admitted: u64,
    refused: u64,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Load {
    /// The bucket's allowance over the admissions' span, from full.
    fn allowance(&self, tpm: u64) -> f64 {
        let span = match (self.first, self.last) {
            (Some(a), Some(b)) => (b - a).as_secs_f64(),
            _ => 0.0,
        };
        tpm as f64 * (1.0 + span / 60.0)
    }

    fn add(&mut self, o: Load) {
        self.tokens += o.tokens;
        self.admitted += o.admitted;
        self.refused += o.refused;
        self.first = [self.first, o.first].into_iter().flatten().min();
        self.last = [self.last, o.last].into_iter().flatten().max();
    }
}

/// `per_node` clients on each node send `key`'s requests back to back for `RUN`.
async fn drive(nodes: &[String], key: &'static str, per_node: usize) -> Load {
    let end = Instant::now() + RUN;
    let mut tasks = Vec::new();
    for base in nodes
        .iter()
        .flat_map(|b| std::iter::repeat_n(b.clone(), per_node))
    {
        tasks.push(tokio::spawn(async move {
            let c = reqwest::Client::new();
            let mut load = Load::default();
            while Instant::now() < end {
                let sent = Instant::now();
                let (status, body) = complete(&c, &base, key, 50).await;
                match status {
                    200 => {
                        load.tokens += body["usage"]["total_tokens"].as_u64().expect("usage");
                        load.admitted += 1;
                        load.first.get_or_insert(sent);
                        load.last = Some(sent);
                    }
                    429 => {
                        load.refused += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    other => panic!("{base}: {other} {body}"),
                }
            }
            load
        }));
    }
    let mut total = Load::default();
    for t in tasks {
        total.add(t.await.expect("a client task"));
    }
    total
}

/// The first answer of `base` to `key` that satisfies `want`, polling, and how long after
/// `since` it came; panics after `limit`.
async fn first_answer(
    base: &str,
    key: &str,
    since: Instant,
    limit: Duration,
    want: impl Fn(u16) -> bool,
) -> (Duration, u16, Value) {
    let c = reqwest::Client::new();
    loop {
        let (status, body) = complete(&c, base, key, 4).await;
        if want(status) {
            return (since.elapsed(), status, body);
        }
        assert!(since.elapsed() < limit, "{base}: still {status} {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics"))
}

async fn metrics(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_shares_each_tenants_quota_through_redis() {
    let started = Instant::now();
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let url = redis.url();
    let open = fleet_args(&url, "open");
    let a = Node::start("zero", &tenants, &open, ENV);
    let b = Node::start("zero", &tenants, &open, ENV);
    let mut c = Node::start(PACED, &tenants, &open, ENV);
    let d = Node::start("zero", &tenants, &fleet_args(&url, "closed"), ENV);
    let three = [a.base.clone(), b.base.clone(), c.base.clone()];

    // 1. One tenant over three nodes: the fleet's quota, and a second tenant unaffected.
    let bystander = tokio::spawn({
        let three = three.clone();
        async move {
            let c = reqwest::Client::new();
            for i in 0..24 {
                let (status, body) = complete(&c, &three[i % 3], BETA, 4).await;
                assert_eq!(status, 200, "beta on {}: {body}", three[i % 3]);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let fleet = drive(&three, ALPHA, 2).await;
    bystander.await.expect("beta is served throughout");
    let allowance = fleet.allowance(ALPHA_TPM);
    let ratio = fleet.tokens as f64 / allowance;
    println!(
        "fleet: alpha admitted {} tokens in {} requests ({} refused), allowance {allowance:.0} \
         (ratio {ratio:.3})",
        fleet.tokens, fleet.admitted, fleet.refused
    );
    assert!(fleet.refused > 0, "the quota was reached");
    assert!((ratio - 1.0).abs() <= 0.05, "ratio {ratio:.3}");

    // 2. A node dies holding both of gamma's concurrency slots: the others keep serving, and
    //    its leases expire after the TTL (not at once: the fleet cannot tell a dead node from
    //    a slow one).
    let held = hold_two_streams(&c.base).await;
    let (status, body) = complete(&reqwest::Client::new(), &a.base, GAMMA, 4).await;
    assert_eq!(
        status, 429,
        "gamma's slots are held on the paced node: {body}"
    );
    // Past one TTL the running requests still hold their leases: the heartbeats extend them.
    tokio::time::sleep(Duration::from_millis(LEASE_TTL_MS + 500)).await;
    let (status, body) = complete(&reqwest::Client::new(), &b.base, GAMMA, 4).await;
    assert_eq!(
        status, 429,
        "heartbeats keep running requests' leases: {body}"
    );
    let killed = Instant::now();
    c.kill();
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = complete(&reqwest::Client::new(), &b.base, GAMMA, 4).await;
    assert_eq!(
        status, 429,
        "the dead node's leases live until their TTL: {body}"
    );
    let ttl = Duration::from_millis(LEASE_TTL_MS);
    let (expired_after, ..) = first_answer(&a.base, GAMMA, killed, ttl * 3, |s| s == 200).await;
    println!("node killed: its leases expired after {expired_after:?} (TTL {ttl:?})");
    assert!(
        expired_after >= ttl * 2 / 3 - Duration::from_millis(150),
        "{expired_after:?}"
    );
    assert!(
        expired_after <= ttl + Duration::from_millis(700),
        "{expired_after:?}"
    );
    for base in [&a.base, &b.base] {
        let (status, body) = complete(&reqwest::Client::new(), base, BETA, 4).await;
        assert_eq!(status, 200, "{base} serves after the node died: {body}");
    }

    // 3. Redis slow (SIGSTOP), then back, then dead (SIGKILL).
    let ok = |s: u16| s == 200;
    let unavailable = |s: u16| s == 503;
    redis.signal("-STOP");
    let stopped = Instant::now();
    let (open_after, ..) = first_answer(&a.base, ALPHA, stopped, Duration::from_secs(1), ok).await;
    let (closed_after, _, body) =
        first_answer(&d.base, BETA, stopped, Duration::from_secs(1), unavailable).await;
    println!("redis stopped: open node served after {open_after:?}, closed node 503 after {closed_after:?}");
    assert_closed_answer(&body);
    redis.signal("-CONT");
    let resumed = Instant::now();
    let (back_after, ..) = first_answer(&d.base, BETA, resumed, Duration::from_secs(3), ok).await;
    println!("redis resumed: closed node served again after {back_after:?}");
    redis.kill();
    let dead = Instant::now();
    let (open_dead, ..) = first_answer(&b.base, ALPHA, dead, Duration::from_secs(1), ok).await;
    let (closed_dead, _, body) =
        first_answer(&d.base, BETA, dead, Duration::from_secs(1), unavailable).await;
    println!(
        "redis killed: open node served after {open_dead:?}, closed node 503 after {closed_dead:?}"
    );
    assert_closed_answer(&body);
    // A answered while Redis was stopped (timeouts); B after it was killed.
    let text = metrics(&a.base).await;
    assert!(metric(&text, "superinfer_quota_store_fallback_total ") >= 1.0);
    assert!(
        metric(
            &text,
            "superinfer_quota_store_errors_total{kind=\"timeout\"} "
        ) >= 1.0
    );
    let text = metrics(&b.base).await;
    assert_eq!(metric(&text, "superinfer_quota_store_up "), 0.0);
    assert!(metric(&text, "superinfer_quota_store_fallback_total ") >= 1.0);
    let errors = ["timeout", "connection"].map(|k| {
        metric(
            &text,
            &format!("superinfer_quota_store_errors_total{{kind=\"{k}\"}} "),
        )
    });
    println!(
        "node b's quota store errors after the kill: timeout {}, connection {}",
        errors[0], errors[1]
    );
    assert!(errors[0] + errors[1] >= 1.0);
    let text = metrics(&d.base).await;
    assert!(
        metric(
            &text,
            "superinfer_requests_rejected_total{tenant=\"beta\",reason=\"quota_store\"} "
        ) >= 2.0
    );
    drop((a, b, d));

    // 4. The control: the same traffic on nodes with their own limiters admits ~3x.
    let solo: Vec<Node> = (0..3)
        .map(|_| Node::start("zero", &tenants, &[], ENV))
        .collect();
    let bases: Vec<String> = solo.iter().map(|n| n.base.clone()).collect();
    let control = drive(&bases, ALPHA, 2).await;
    let per_node = control.allowance(ALPHA_TPM);
    let control_ratio = control.tokens as f64 / per_node;
    println!(
        "control (per-node limits): alpha admitted {} tokens, {control_ratio:.2} x one quota",
        control.tokens
    );
    assert!(
        control_ratio > 2.5,
        "per-node limits admit about 3x: {control_ratio:.2}"
    );
    println!("fleet test took {:?}", started.elapsed());
}

/// Two streams of gamma on `base` that stay open (the paced engine takes seconds for them);
/// each has sent its first bytes, so both hold a lease.
async fn hold_two_streams(base: &str) -> Vec<reqwest::Response> {
    let c = reqwest::Client::new();
    let mut held = Vec::new();
    for _ in 0..2 {
        let r = c
            .post(format!("{base}/v1/completions"))
            .bearer_auth(GAMMA)
            .json(
                &json!({"prompt": "hold", "max_tokens": 4000, "ignore_eos": true, "stream": true}),
            )
            .send()
            .await
            .expect("the paced node answers");
        assert_eq!(r.status(), 200);
        held.push(r);
    }
    for r in &mut held {
        let _ = r.chunk().await;
    }
    held
}

fn assert_closed_answer(body: &Value) {
    assert_eq!(body["error"]["type"], "overloaded_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("quota store"), "{body}");
    assert_eq!(body["retry_after_header"], "1", "{body}");
}

/// A Redis pause while a request ends (`CLIENT PAUSE`): its lease's release fails at first
/// and is retried, so the tenant's seat is free again about when the pause ends, not a lease
/// TTL (30 s by default) later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_pause_costs_a_seat_for_about_the_pause_not_a_lease_ttl() {
    const PAUSE_MS: u64 = 500;
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        "[[tenant]]\nname = \"solo\"\napi_key_env = \"FLEET_ALPHA_KEY\"\nmax_concurrent = 1\nmax_output_tokens = 4000\n",
    )
    .unwrap();
    let url = redis.url();
    let args = [
        "--quota-store",
        &url,
        "--quota-store-failure",
        "closed",
        "--quota-store-timeout-ms",
        "100",
    ];
    let node = Node::start(PACED, &tenants, &args, ENV);
    let c = reqwest::Client::new();
    let mut held = c
        .post(format!("{}/v1/completions", node.base))
        .bearer_auth(ALPHA)
        .json(&json!({"prompt": "hold", "max_tokens": 4000, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .expect("the node answers");
    assert_eq!(held.status(), 200);
    let _ = held.chunk().await;
    let (busy, body) = complete(&c, &node.base, ALPHA, 2).await;
    assert_eq!(busy, 429, "the one seat is held: {body}");

    // Pause every Redis client, then end the request inside the pause.
    let client = redis::Client::open(url.clone()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(PAUSE_MS)
        .query(&mut conn)
        .unwrap();
    let paused = Instant::now();
    drop(held);
    tokio::time::sleep(Duration::from_millis(PAUSE_MS)).await;

    // Once the pause is over, the seat comes back within a few retries.
    let deadline = paused + Duration::from_millis(PAUSE_MS + 1500);
    loop {
        let (status, body) = complete(&c, &node.base, ALPHA, 2).await;
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {status} {:?} after the {PAUSE_MS} ms pause: {body}",
            paused.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("seat back {:?} after the pause began", paused.elapsed());
}
