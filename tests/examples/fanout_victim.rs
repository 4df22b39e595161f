//! Victim TTFT while an attacker holds as many sequences as its quotas let it: the cost of
//! fan-out, with the seats counted per sequence (as served) and as the old per-request count
//! allowed. Run: `cargo run -p superinfer-tests --example fanout_victim -- [victim requests]`.
//!
//! The server runs the simulated engine at the profile named by `FANOUT_PROFILE` (default
//! `h200-llama-3-8b`), paced on the real clock (steps take the profile's time), with the
//! engine's default 1,024 sequence seats (`max_num_seqs`). The attacker tenant sends requests
//! of 64 sequences (a list of 8 prompts × `n` 8, 256 output tokens each) from 20 clients at
//! once, each resending as soon as it is answered:
//! - `per-request`: `max_concurrent` 1,280, which is what 20 requests of 64 sequences held when
//!   a request counted as one seat whatever its fan-out (a tenant with `max_concurrent` 20):
//!   every engine seat is the attacker's and more of its sequences wait. Run twice: with
//!   `--preempt-for-seats` off (the default) and on.
//! - `per-sequence`: `max_concurrent` 20 counted per sequence: a 64-sequence request is refused
//!   (400), so the attacker sends the most it may, 16 sequences in one request, and its other
//!   clients get 429 while those run.
//!
//! The victim (equal weight, TTFT target 1 s) sends short streamed chats one after another;
//! its TTFT is the time to the first content token. The report is its TTFT p50 / p99 / max
//! and its attainment, per mode, side by side in one run.

use futures_util::StreamExt;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use superinfer_tests::{TestOptions, TestServer};

const ATTACK_CLIENTS: usize = 20;

/// The first data event of an SSE body that carries generated text, if `buf` holds one.
fn has_content(buf: &str) -> bool {
    buf.split("\n\n").any(|event| {
        let Some(data) = event.trim().strip_prefix("data: ") else {
            return false;
        };
        serde_json::from_str::<serde_json::Value>(data).is_ok_and(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        })
    })
}

async fn run(per_sequence: bool, preempt: bool, victim_requests: usize) -> (Vec<Duration>, usize) {
    let settings = superinfer_gateway::config::Settings {
        preempt_for_seats: Some(preempt),
        ..Default::default()
    };
    let s = TestServer::start_with(TestOptions {
        sim_profile: Some(
            std::env::var("FANOUT_PROFILE").unwrap_or_else(|_| "h200-llama-3-8b".into()),
        ),
        settings,
        ..TestOptions::default()
    })
    .await;
    let (concurrent, prompts, n) = if per_sequence {
        (ATTACK_CLIENTS as u32, 2, 8)
    } else {
        (64 * ATTACK_CLIENTS as u32, 8, 8)
    };
    let quotas = json!({"requests_per_s": 10000.0, "burst": 10000, "max_concurrent": concurrent,
        "tokens_per_min": 1_000_000_000u64, "max_output_tokens": 4096});
    let (_, attacker) = s
        .create_tenant(json!({"name": "attacker", "quotas": quotas}))
        .await;
    let (_, victim) = s
        .create_tenant(json!({"name": "victim", "slo": {"ttft_ms": 1000}}))
        .await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut attackers = Vec::new();
    for _ in 0..ATTACK_CLIENTS {
        let (c, url, key, stop) = (
            s.client.clone(),
            s.url("/v1/completions"),
            attacker.clone(),
            stop.clone(),
        );
        let list: Vec<String> = (0..prompts).map(|i| format!("attack prompt {i}")).collect();
        attackers.push(tokio::spawn(async move {
            let body = json!({"prompt": list, "n": n, "max_tokens": 256, "ignore_eos": true});
            while !stop.load(Ordering::Relaxed) {
                let r = c.post(&url).bearer_auth(&key).json(&body).send().await;
                if let Ok(r) = r {
                    if r.status() == 429 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    let _ = r.bytes().await;
                }
            }
        }));
    }
    // Let the attack fill the engine.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = s.server.state.engine.stats();
    let mut ttfts = Vec::with_capacity(victim_requests);
    for _ in 0..victim_requests {
        let body = json!({"model": s.model(), "stream": true, "max_tokens": 8,
            "messages": [{"role": "user", "content": "How are you today?"}]});
        let t0 = Instant::now();
        let r = s
            .client
            .post(s.url("/v1/chat/completions"))
            .bearer_auth(&victim)
            .json(&body)
            .send()
            .await
            .expect("the victim is answered");
        assert_eq!(r.status(), 200);
        let mut bytes = r.bytes_stream();
        let (mut first, mut buf) = (None, String::new());
        while let Some(chunk) = bytes.next().await {
            let chunk = chunk.expect("the victim's stream completes");
            if first.is_none() {
                buf.push_str(&String::from_utf8_lossy(&chunk));
                if has_content(&buf) {
                    first = Some(t0.elapsed());
                }
            }
        }
        ttfts.push(first.expect("a first token"));
    }
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.abort();
    }
    s.shutdown().await;
    ttfts.sort();
    (ttfts, held.running + held.waiting + held.rotary)
}

fn at(v: &[Duration], q: f64) -> f64 {
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)].as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let victim_requests: usize = std::env::args()
        .nth(1)
        .map_or(100, |a| a.parse().expect("a count of victim requests"));
    println!("| seats counted | preempt for seats | attacker sequences held | victim TTFT p50 | p99 | max | within 1 s |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (per_sequence, preempt) in [(false, false), (false, true), (true, false)] {
        let (t, held) = run(per_sequence, preempt, victim_requests).await;
        let met = t.iter().filter(|d| **d <= Duration::from_secs(1)).count();
        let mode = if per_sequence {
            "per sequence"
        } else {
            "per request"
        };
        let preempt = if preempt { "on" } else { "off" };
        println!(
            "| {mode} | {preempt} | {held} | {:.3} s | {:.3} s | {:.3} s | {:.1}% |",
            at(&t, 0.5),
            at(&t, 0.99),
            t.last().unwrap().as_secs_f64(),
            100.0 * met as f64 / t.len() as f64
        );
    }
}
