//! Fuzz-style: 10,000 random and mutated bodies against the generation endpoints. Every
//! answer must be a 200 (with a well-formed body or stream) or a 4xx with OpenAI's error
//! shape; the server must keep serving. Deterministic: the seed is printed and can be replayed
//! with `SUPERINFER_FUZZ_SEED`.

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reqwest::StatusCode;
use serde_json::{json, Map, Value};
use superinfer_tests::{error_message, sse_events, TestServer};

const BODIES: usize = 10_000;
const CLIENTS: usize = 8;

/// Valid requests to start mutating from.
fn seeds(model: &str) -> Vec<(&'static str, Value)> {
    vec![
        (
            "/v1/completions",
            json!({"model": model, "prompt": "Hello there", "max_tokens": 4}),
        ),
        (
            "/v1/completions",
            json!({"prompt": ["a b c"], "max_tokens": 2, "stream": true,
            "stream_options": {"include_usage": true}, "temperature": 0.7, "top_p": 0.9,
            "top_k": 20, "min_p": 0.05, "seed": 7, "stop": ["world"]}),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 3], "max_tokens": 3, "ignore_eos": true,
            "frequency_penalty": 0.5, "presence_penalty": -0.5, "repetition_penalty": 1.1}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": model, "max_tokens": 3,
            "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "/v1/chat/completions",
            json!({"stream": true, "max_completion_tokens": 2,
            "messages": [{"role": "system", "content": "x"},
                         {"role": "user", "content": [{"type": "text", "text": "hey"}]}]}),
        ),
    ]
}

fn random_value(rng: &mut ChaCha8Rng, depth: u32) -> Value {
    match rng.random_range(0..if depth > 2 { 6 } else { 8 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.random()),
        2 => json!(rng.random_range(-5i64..5000)),
        3 => json!(rng.random_range(-1e6f64..1e6)),
        4 => json!([-1e308, 1e308, 0.0, -0.0, 2.5, 1.0][rng.random_range(0..6)]),
        5 => {
            let len = rng.random_range(0..12);
            Value::String((0..len).map(|_| rng.random_range(' '..='~')).collect())
        }
        6 => Value::Array(
            (0..rng.random_range(0..4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let mut m = Map::new();
            for _ in 0..rng.random_range(0..4) {
                m.insert(random_key(rng), random_value(rng, depth + 1));
            }
            Value::Object(m)
        }
    }
}

const KEYS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "echo",
    "logprobs",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "ignore_eos",
    "stop_token_ids",
    "priority",
    "user",
    "best_of",
    "suffix",
    "tools",
];

fn random_key(rng: &mut ChaCha8Rng) -> String {
    if rng.random_bool(0.8) {
        KEYS.choose(rng).unwrap().to_string()
    } else {
        format!("x{}", rng.random_range(0..100))
    }
}

/// A mutated seed, random JSON, or mangled bytes.
fn body(rng: &mut ChaCha8Rng, seeds: &[(&'static str, Value)]) -> (&'static str, Vec<u8>) {
    let (path, seed) = seeds.choose(rng).unwrap().clone();
    let path = if rng.random_bool(0.1) {
        ["/v1/completions", "/v1/chat/completions"][rng.random_range(0..2)]
    } else {
        path
    };
    let bytes = match rng.random_range(0..10) {
        0 => serde_json::to_vec(&random_value(rng, 0)).unwrap(),
        1 => {
            let mut b = serde_json::to_vec(&seed).unwrap();
            for _ in 0..rng.random_range(1..4) {
                if b.is_empty() {
                    break;
                }
                let i = rng.random_range(0..b.len());
                match rng.random_range(0..3) {
                    0 => b[i] = rng.random(),
                    1 => {
                        b.remove(i);
                    }
                    _ => b.truncate(i),
                }
            }
            b
        }
        _ => {
            let mut v = seed;
            let obj = v.as_object_mut().unwrap();
            for _ in 0..rng.random_range(1..4) {
                if rng.random_bool(0.3) && !obj.is_empty() {
                    let k = obj
                        .keys()
                        .nth(rng.random_range(0..obj.len()))
                        .unwrap()
                        .clone();
                    obj.remove(&k);
                } else {
                    obj.insert(random_key(rng), random_value(rng, 0));
                }
            }
            serde_json::to_vec(&v).unwrap()
        }
    };
    (path, bytes)
}

fn check(status: StatusCode, content_type: &str, text: &str, sent: &[u8]) {
    let shown = String::from_utf8_lossy(&sent[..sent.len().min(300)]).to_string();
    if status == StatusCode::OK {
        if content_type.starts_with("text/event-stream") {
            let events = sse_events(text);
            assert_eq!(
                events.last().map(String::as_str),
                Some("[DONE]"),
                "{shown}\n{text}"
            );
            for e in &events[..events.len() - 1] {
                let v: Value = serde_json::from_str(e).unwrap_or_else(|_| panic!("{shown}\n{e}"));
                assert!(v.get("error").is_none(), "{shown}\n{e}");
            }
        } else {
            let v: Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("{shown}\n{text}"));
            assert!(v["usage"]["total_tokens"].is_u64(), "{shown}\n{text}");
        }
    } else {
        assert!(status.is_client_error(), "{status} for {shown}\n{text}");
        let v: Value =
            serde_json::from_str(text).unwrap_or_else(|_| panic!("{status} {shown}\n{text}"));
        let msg = error_message(&v);
        assert!(!msg.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_random_and_mutated_bodies_get_200_or_a_well_formed_4xx() {
    let seed: u64 = std::env::var("SUPERINFER_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("SUPERINFER_FUZZ_SEED={seed}");
    let s = TestServer::start().await;
    // Generous quotas, short outputs: the test is about parsing and validation.
    let (_, key) = s
        .create_tenant(
            json!({"name": "fuzz", "quotas": {"requests_per_s": 1e6, "burst": 1000000,
            "tokens_per_min": 1000000000u64, "max_concurrent": 1000, "max_output_tokens": 64}}),
        )
        .await;
    let seeds = seeds(&s.model());
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (client, base, key, seeds) =
            (s.client.clone(), s.base.clone(), key.clone(), seeds.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rng.set_stream(c as u64);
            let mut counts = [0usize; 2];
            for _ in 0..BODIES / CLIENTS {
                let (path, bytes) = body(&mut rng, &seeds);
                let resp = client
                    .post(format!("{base}{path}"))
                    .bearer_auth(&key)
                    .header("content-type", "application/json")
                    .body(bytes.clone())
                    .send()
                    .await
                    .expect("the server answers every request");
                let status = resp.status();
                let ct = resp
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let text = resp.text().await.expect("a complete body");
                check(status, &ct, &text, &bytes);
                counts[usize::from(status != StatusCode::OK)] += 1;
            }
            counts
        }));
    }
    let mut total = [0usize; 2];
    for t in tasks {
        let c = t.await.expect("no client panicked");
        total[0] += c[0];
        total[1] += c[1];
    }
    println!("{} answered 200, {} answered 4xx", total[0], total[1]);
    assert_eq!(total[0] + total[1], BODIES);
    assert!(
        total[0] > 500 && total[1] > 500,
        "{total:?}: the mix should exercise both"
    );
    assert_eq!(s.complete(&s.key, 1).await.0, StatusCode::OK);
    s.shutdown().await;
}
