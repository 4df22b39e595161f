//! A fleet's billing under failures, end to end: a real `redis-server`, three `superinfer
//! serve` nodes (processes, paced simulated engine) sharing it for quotas, each with its own
//! ledger, and clients sending one tenant's requests (streamed and not) to all three.
//! Mid-traffic one node is killed with SIGKILL and restarted on its data directory, then Redis
//! is paused (`CLIENT PAUSE`). Afterwards `superinfer usage`'s fleet export (every node's
//! ledger, summed once) must equal what the clients received for every completed request:
//! the ledger's group commit puts a record on disk before the answer's last byte, so a kill
//! loses none of them. Requests cut off by the kill may be billed (their record was written,
//! their last bytes never arrived), never counted twice. No node refuses requests for longer
//! than the pause plus one lease period (the dead node's concurrency leases expire).

#[path = "support/node.rs"]
mod node;
#[path = "support/redis_server.rs"]
mod redis_server;

use node::Node;
use redis_server::RedisServer;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use superinfer_gateway::cli::fleet_usage::{fleet_report, FleetUsageArgs};
use superinfer_gateway::usage::Format;

const KEY: &str = "sk-si-d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4";
const ADMIN: &str = "fleet-billing-admin-token-0123456789abcdef";
const ENV: &[(&str, &str)] = &[
    ("FLEET_BILLING_KEY", KEY),
    ("SUPERINFER_ADMIN_TOKEN", ADMIN),
];
/// Six clients, six seats: the killed node's orphaned leases make the others wait for a seat
/// until those leases expire.
const TENANTS: &str = r#"
[[tenant]]
name = "payer"
api_key_env = "FLEET_BILLING_KEY"
max_concurrent = 6
requests_per_s = 10000
burst = 10000
tokens_per_min = 1000000000
"#;
/// Tokens take a few milliseconds each, so requests are in flight when the node dies.
const PROFILE: &str = "h100-llama-3-8b";
const LEASE_TTL_MS: u64 = 1500;
const PAUSE_MS: u64 = 500;
const CLIENTS_PER_NODE: usize = 2;
/// Longest prompt of the probe, tokens (a bound for what a cut-off request may be billed).
const PROMPT_BOUND: u64 = 64;
const MAX_TOKENS: u64 = 24;

fn node_args(url: &str) -> Vec<&str> {
    vec![
        "--quota-store",
        url,
        "--quota-store-failure",
        "closed",
        "--quota-store-timeout-ms",
        "100",
        "--quota-store-lease-ttl-ms",
        "1500",
    ]
}

/// What one client saw.
#[derive(Debug, Default)]
struct Seen {
    /// Requests answered in full (a body, or a stream through `[DONE]`), with their usage.
    completed: u64,
    tokens: u64,
    /// Requests sent whose answer was cut off (the node died under them).
    cut_off: u64,
    /// Refusals (429, 503) and the longest run of them before a request got through.
    refused: u64,
    longest_refusal: Duration,
}

enum Answer {
    Completed(u64),
    Refused,
    CutOff,
    NotSent,
}

async fn send(c: &reqwest::Client, base: &str, i: u64) -> Answer {
    let stream = i.is_multiple_of(2);
    let max_tokens = 8 + i % (MAX_TOKENS - 7);
    let body = json!({
        "prompt": format!("fleet billing probe {i}"),
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": stream,
        "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
    });
    let resp = c
        .post(format!("{base}/v1/completions"))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await;
    let resp = match resp {
        Ok(r) => r,
        Err(e) if e.is_connect() => return Answer::NotSent,
        Err(_) => return Answer::CutOff,
    };
    let status = resp.status().as_u16();
    let Ok(text) = resp.text().await else {
        return Answer::CutOff;
    };
    match status {
        429 | 503 => return Answer::Refused,
        200 => {}
        other => panic!("{base}: {other} {text}"),
    }
    let usage = if stream {
        if !text.trim_end().ends_with("data: [DONE]") {
            return Answer::CutOff;
        }
        let usage = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|v| v["usage"].is_object());
        match usage {
            Some(v) => v["usage"].clone(),
            None => panic!("{base}: a stream without its usage chunk: {text}"),
        }
    } else {
        serde_json::from_str::<Value>(&text).expect("a JSON body")["usage"].clone()
    };
    Answer::Completed(
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap(),
    )
}

/// One client of the node whose current address is in `base`, until `end`.
async fn client(base: Arc<Mutex<String>>, first: u64, end: Instant) -> Seen {
    let c = reqwest::Client::new();
    let mut seen = Seen::default();
    let mut refusing_since: Option<Instant> = None;
    let mut i = first;
    while Instant::now() < end {
        i += 1000;
        let target = base.lock().unwrap().clone();
        let sent = Instant::now();
        match send(&c, &target, i).await {
            Answer::Completed(tokens) => {
                seen.completed += 1;
                seen.tokens += tokens;
                if let Some(since) = refusing_since.take() {
                    seen.longest_refusal = seen.longest_refusal.max(sent - since);
                }
            }
            Answer::Refused => {
                seen.refused += 1;
                refusing_since.get_or_insert(sent);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Answer::CutOff => {
                seen.cut_off += 1;
                refusing_since = None;
            }
            Answer::NotSent => {
                // The node is down: its downtime is not a refusal.
                refusing_since = None;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    if let Some(since) = refusing_since {
        seen.longest_refusal = seen.longest_refusal.max(since.elapsed());
    }
    seen
}

fn start(tenants: &Path, url: &str) -> Node {
    Node::start(PROFILE, tenants, &node_args(url), ENV)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_bills_what_clients_received_through_a_node_kill_and_a_redis_pause() {
    let redis = RedisServer::start();
    let url = redis.url();
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let mut nodes: Vec<Node> = (0..3).map(|_| start(&tenants, &url)).collect();
    let bases: Vec<Arc<Mutex<String>>> = nodes
        .iter()
        .map(|n| Arc::new(Mutex::new(n.base.clone())))
        .collect();

    let begin = Instant::now();
    let end = begin + Duration::from_secs(7);
    let mut tasks = Vec::new();
    for (k, base) in bases.iter().enumerate() {
        for j in 0..CLIENTS_PER_NODE {
            let first = (k * CLIENTS_PER_NODE + j) as u64;
            tasks.push(tokio::spawn(client(base.clone(), first, end)));
        }
    }
    // 1. kill -9 the third node mid-traffic, and restart it on its data directory.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    nodes[2].kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    nodes[2].restart(PROFILE, &tenants, &node_args(&url), ENV);
    *bases[2].lock().unwrap() = nodes[2].base.clone();
    // 2. Pause every Redis client once the fleet is whole again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut conn = redis::Client::open(url.clone())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(PAUSE_MS)
        .query(&mut conn)
        .unwrap();

    let mut total = Seen::default();
    for t in tasks {
        let s = t.await.expect("a client task");
        total.completed += s.completed;
        total.tokens += s.tokens;
        total.cut_off += s.cut_off;
        total.refused += s.refused;
        total.longest_refusal = total.longest_refusal.max(s.longest_refusal);
    }
    println!("clients: {total:?}");
    assert!(total.completed > 50, "traffic flowed: {total:?}");
    assert!(
        total.refused > 0,
        "the pause and the orphaned leases refused some: {total:?}"
    );

    let report = fleet_report(&FleetUsageArgs {
        nodes: nodes.iter().map(|n| n.base.clone()).collect(),
        admin_token: ADMIN.into(),
        tenant: Some("payer".into()),
        from: None,
        to: None,
        format: Format::Json,
        timeout_s: 10.0,
    })
    .await
    .expect("the fleet export");
    assert_eq!(
        report.ledgers.len(),
        3,
        "the restarted node kept its ledger"
    );
    let billed_requests = report.totals.requests;
    let billed_tokens = report.totals.prompt_tokens + report.totals.completion_tokens;
    println!(
        "fleet export: {billed_requests} requests, {billed_tokens} tokens; clients received \
         {} requests, {} tokens in full, {} cut off",
        total.completed, total.tokens, total.cut_off
    );
    // Every completed request once; cut-off ones at most once each, within their bound.
    assert!(
        (total.completed..=total.completed + total.cut_off).contains(&billed_requests),
        "billed {billed_requests} requests, completed {} (+{} cut off)",
        total.completed,
        total.cut_off
    );
    let bound = total.tokens + total.cut_off * (PROMPT_BOUND + MAX_TOKENS);
    assert!(
        (total.tokens..=bound).contains(&billed_tokens),
        "billed {billed_tokens} tokens, received {} (bound {bound})",
        total.tokens
    );
    let limit = Duration::from_millis(PAUSE_MS + LEASE_TTL_MS + 1000);
    assert!(
        total.longest_refusal <= limit,
        "a node refused for {:?} (limit {limit:?})",
        total.longest_refusal
    );
}
