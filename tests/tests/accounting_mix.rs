//! Every token accounted once, over random mixes of requests: completions and chats, streamed
//! or not, `n` 1–2, lists of prompts, stop strings, streams the client drops after their first
//! chunk, requests the engine refuses (a queue of 2, a prompt too long for its KV tier),
//! requests the quotas refuse (a tenant with 2 seats and few tokens per minute) and
//! constrained requests whose grammar fails in the engine (its masks panic: injected for this
//! whole test binary through the environment), sent concurrently to the embedded tiny model
//! (a real tokenizer, so grammars compile). After each mix, for every tenant: the ledger
//! equals the `usage` the clients received (a dropped stream within what it could have
//! generated), the tenant's statistics and TTFT series count every sequence submitted, the
//! ledger's less those the engine refused at its queue (shed), no seat stays held, and the
//! tokens-per-minute balance is the quota less exactly what the ledger billed (within what the
//! bucket refilled meanwhile: no reservation leaks).

use futures_util::StreamExt;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reqwest::StatusCode;
use serde_json::{json, Value};
use superinfer_engine::handle::fault::MASK_PANIC;
use superinfer_gateway::Settings;
use superinfer_tests::{metric_value, sse_usage, TestOptions, TestServer, ADMIN_TOKEN};

/// What the clients of one tenant saw: (requests, sequences, prompt, completion) from the
/// `usage` of answers received whole, and the bound on what dropped streams may have cost.
#[derive(Debug, Default)]
struct Seen {
    received: [u64; 4],
    /// Dropped streams: requests, sequences, and their most completion tokens.
    dropped: [u64; 3],
    refused: u64,
    /// Streams that ended in an error event (a grammar that failed in the engine): requests.
    errored: u64,
    /// Requests whose grammar failed, streamed or not.
    grammar_failed: u64,
    /// Requests the node refused for load at submission (its queue or inbox full, or
    /// draining): each a TTFT miss of its tenant, never submitted to the engine.
    shed_at_submit: u64,
}

struct Op {
    tenant: usize,
    chat: bool,
    stream: bool,
    n: u64,
    prompts: u64,
    max_tokens: u64,
    stop: bool,
    long: bool,
    drop_after_first: bool,
    /// Constrained by a regular expression whose grammar fails in the engine.
    grammar: bool,
}

fn random_op(rng: &mut ChaCha8Rng) -> Op {
    let chat = rng.random_bool(0.4);
    let stream = rng.random_bool(0.5);
    // A failing grammar's stream is read whole (its first chunk may already be the error).
    let grammar = rng.random_bool(0.15);
    Op {
        tenant: rng.random_range(0..2),
        chat,
        stream,
        n: rng.random_range(1..=2),
        prompts: if chat { 1 } else { rng.random_range(1..=2) },
        max_tokens: rng.random_range(1..=6),
        stop: rng.random_bool(0.3),
        long: rng.random_bool(0.1),
        drop_after_first: stream && !grammar && rng.random_bool(0.25),
        grammar,
    }
}

fn body(op: &Op, model: &str) -> Value {
    let words = if op.long { 3000 } else { 4 };
    let text = |i: u64| format!("prompt {i} ") + &"word ".repeat(words);
    let mut b = if op.chat {
        json!({"model": model, "messages": [{"role": "user", "content": text(0)}]})
    } else if op.prompts == 1 {
        json!({"model": model, "prompt": text(0)})
    } else {
        json!({"model": model, "prompt": (0..op.prompts).map(text).collect::<Vec<_>>()})
    };
    b["max_tokens"] = json!(op.max_tokens);
    b["n"] = json!(op.n);
    if op.stop {
        b["stop"] = json!(["w"]);
    }
    if op.grammar {
        b["structured_outputs"] = json!({"regex": "[0-9]{3}"});
    }
    if op.stream {
        b["stream"] = json!(true);
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

/// Sends `op`; records what its client saw.
async fn send(s: &TestServer, key: &str, op: &Op, seen: &mut Seen) {
    let path = if op.chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let resp = s.post(path, key, &body(op, &s.model())).await;
    if resp.status() != StatusCode::OK {
        let status = resp.status();
        seen.grammar_failed += u64::from(op.grammar && status == StatusCode::BAD_REQUEST);
        assert!(
            [
                StatusCode::BAD_REQUEST,
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::SERVICE_UNAVAILABLE
            ]
            .contains(&status),
            "{status}"
        );
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        let message = v["error"]["message"].as_str().unwrap_or_default();
        seen.shed_at_submit += u64::from(
            status == StatusCode::SERVICE_UNAVAILABLE
                && (message.contains("queue is full")
                    || message.contains("inbox is full")
                    || v["error"]["code"] == "shutting_down"),
        );
        seen.refused += 1;
        return;
    }
    let sequences = op.n * op.prompts;
    if op.drop_after_first {
        let mut chunks = resp.bytes_stream();
        let _first = chunks.next().await;
        drop(chunks);
        seen.dropped[0] += 1;
        seen.dropped[1] += sequences;
        seen.dropped[2] += sequences * op.max_tokens;
        return;
    }
    let text = resp.text().await.expect("a body");
    if op.stream && text.contains("data: {\"error\"") {
        // The error event instead of the usage chunk: an error, billed what it delivered.
        assert!(
            op.grammar,
            "only a failing grammar ends a stream in an error: {text}"
        );
        seen.errored += 1;
        seen.grammar_failed += 1;
        return;
    }
    let usage = if op.stream {
        sse_usage(&text)
    } else {
        serde_json::from_str::<Value>(&text).expect("JSON")["usage"].clone()
    };
    let r = &mut seen.received;
    r[0] += 1;
    r[1] += sequences;
    r[2] += usage["prompt_tokens"].as_u64().expect("prompt_tokens");
    r[3] += usage["completion_tokens"]
        .as_u64()
        .expect("completion_tokens");
}

async fn admin_get(s: &TestServer, path: &str) -> Value {
    let resp = s
        .client
        .get(s.url(path))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("the server answers");
    assert_eq!(resp.status(), StatusCode::OK);
    resp.json().await.expect("JSON")
}

/// Runs one mix; returns the requests refused, the streams dropped and the requests whose
/// grammar failed, over both tenants.
async fn one_mix(seed: u64) -> (u64, u64, u64) {
    let s = TestServer::start_with(TestOptions {
        sim_profile: None,
        max_queue: Some(2),
        hbm_blocks: Some(96),
        settings: Settings::default(),
        ..TestOptions::default()
    })
    .await;
    // Each tenant's tokens-per-minute bucket is full from its creation on.
    let created = std::time::Instant::now();
    let (roomy_id, roomy) = s.create_tenant(json!({"name": "roomy"})).await;
    let (tight_id, tight) = s
        .create_tenant(json!({"name": "tight",
            "quotas": {"max_concurrent": 2, "tokens_per_min": 400}}))
        .await;
    let keys = [roomy, tight];
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let ops: Vec<Op> = (0..24).map(|_| random_op(&mut rng)).collect();
    let mut seen: [Seen; 2] = Default::default();
    // Four at a time, so that queues fill and seats run out.
    for group in ops.chunks(4) {
        let runs = group.iter().map(|op| {
            let key = keys[op.tenant].clone();
            let s = &s;
            async move {
                let mut one = Seen::default();
                send(s, &key, op, &mut one).await;
                (op.tenant, one)
            }
        });
        for (t, one) in futures_util::future::join_all(runs).await {
            let e = &mut seen[t];
            for i in 0..4 {
                e.received[i] += one.received[i];
            }
            for i in 0..3 {
                e.dropped[i] += one.dropped[i];
            }
            e.refused += one.refused;
            e.errored += one.errored;
            e.grammar_failed += one.grammar_failed;
            e.shed_at_submit += one.shed_at_submit;
        }
    }
    // Dropped streams end within a step or two; then every seat is back.
    for (id, seen) in [(roomy_id, &seen[0]), (tight_id, &seen[1])] {
        let mut stats = Value::Null;
        for _ in 0..100 {
            stats = admin_get(&s, &format!("/admin/v1/tenants/{id}/stats")).await;
            if stats["in_flight"] == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(stats["in_flight"], 0, "seed {seed}: {stats}");
        let usage = admin_get(&s, &format!("/admin/v1/usage?tenant={id}")).await;
        let t = &usage["totals"];
        let got = |f: &str| t[f].as_u64().expect("a count");
        let (r, d) = (seen.received, seen.dropped);
        let ctx = format!("seed {seed}, tenant {id}: {seen:?} vs {t}");
        // A request of several choices whose later choice the engine refused is an HTTP
        // error, yet its earlier choices were accepted: a request with an error, no tokens.
        let errors = got("errors");
        assert!(errors >= seen.errored, "{ctx}");
        assert!(errors <= seen.refused + seen.errored, "{ctx}");
        assert_eq!(got("requests"), r[0] + d[0] + errors, "{ctx}");
        assert!(got("sequences") >= r[1] + d[1] + errors, "{ctx}");
        if d[0] == 0 && seen.errored == 0 {
            assert_eq!(got("prompt_tokens"), r[2], "{ctx}");
            assert_eq!(got("completion_tokens"), r[3], "{ctx}");
        } else {
            assert!(got("prompt_tokens") > r[2], "{ctx}");
            let c = got("completion_tokens");
            assert!(c >= r[3] && c <= r[3] + d[2], "{ctx}");
        }
        // The statistics count every sequence submitted to the engine, the TTFT series those
        // and the requests the node refused for load at submission; the ledger those the
        // engine accepted: the difference is what the engine refused at its queue. Both kinds
        // of refusal are TTFT misses with reason `shed` (no other shedding is on here).
        let st = &stats["stats"];
        let admitted = st["sequences_admitted"].as_u64().expect("a count");
        let at_submit = seen.shed_at_submit;
        assert_eq!(st["ttft"]["count"], admitted + at_submit, "{ctx}");
        let name = stats["tenant"]["name"]
            .as_str()
            .expect("a name")
            .to_string();
        let metrics = s.client.get(s.url("/metrics")).send().await.unwrap();
        let metrics = metrics.text().await.unwrap();
        let shed = metric_value(
            &metrics,
            "superinfer_ttft_unserved_total",
            &[("tenant", &name), ("reason", "shed")],
        )
        .unwrap_or(0.0) as u64;
        assert_eq!(admitted - got("sequences") + at_submit, shed, "{ctx}");
        assert!(
            st["requests_admitted"].as_u64() >= Some(got("requests")),
            "{ctx}"
        );
        assert_eq!(st["completion_tokens"], got("completion_tokens"), "{ctx}");
        // The quota was charged exactly what the ledger billed (reservations settled, refused
        // requests refunded): from a full bucket, the balance is that much lower, plus at most
        // what the bucket refilled since the tenant was created.
        let cap = stats["quotas"]["tokens_per_min"].as_f64().expect("a quota");
        let balance = stats["tokens_available"].as_f64().expect("a local balance");
        let billed = (got("prompt_tokens") + got("completion_tokens")) as f64;
        let refill = cap / 60.0 * created.elapsed().as_secs_f64();
        assert!(
            balance >= cap - billed - 1e-6 && balance <= cap.min(cap - billed + refill) + 1e-6,
            "{ctx}: balance {balance}, quota {cap}, billed {billed}, refill at most {refill}"
        );
    }
    s.shutdown().await;
    let refused = seen.iter().map(|e| e.refused).sum();
    let dropped = seen.iter().map(|e| e.dropped[0]).sum();
    let grammar_failed = seen.iter().map(|e| e.grammar_failed).sum();
    (refused, dropped, grammar_failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_mixes_are_accounted_once_everywhere() {
    std::env::set_var(MASK_PANIC, "1");
    let (mut refused, mut dropped, mut grammar_failed) = (0, 0, 0);
    for seed in 0..6 {
        let (r, d, g) = one_mix(seed).await;
        refused += r;
        dropped += d;
        grammar_failed += g;
    }
    // The mixes did reach the refusals, dropped streams and grammar failures they are about.
    assert!(
        refused > 0 && dropped > 0 && grammar_failed > 0,
        "{refused} refused, {dropped} dropped, {grammar_failed} grammar failures"
    );
}
