//! A panic on the engine thread, seen through HTTP: the streams in flight end with a typed
//! 503 error event, `/health` and `/readyz` turn 503 within a second, the failure is counted
//! in `superinfer_engine_failures_total`, and new requests are refused with 503, not queued
//! forever. The panic is injected (`superinfer_engine::handle::fault`, a dev-only feature)
//! through the environment, so this file is a test binary of its own: no other test's engine
//! reads the variable.

use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use superinfer_engine::handle::fault::PANIC_AT_STEP;
use superinfer_tests::{metric_value, TestOptions, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_panic_fails_every_stream_and_turns_health_503() {
    // Paced at the h200-llama-3-8b profile (~6 ms a decode step): step 40 comes about a
    // quarter of a second after the first request starts, long before its 2,000 tokens.
    std::env::set_var(PANIC_AT_STEP, "40");
    let s = TestServer::start_with(TestOptions {
        sim_profile: Some("h200-llama-3-8b".into()),
        ..TestOptions::default()
    })
    .await;
    for path in ["/health", "/readyz"] {
        assert_eq!(
            s.client.get(s.url(path)).send().await.unwrap().status(),
            200
        );
    }
    let body = json!({"model": s.model(), "prompt": "hi", "max_tokens": 2000,
                      "ignore_eos": true, "stream": true});
    let streams: Vec<_> = (0..3)
        .map(|_| s.post("/v1/completions", &s.key, &body))
        .collect();
    // A tenant whose reservations would put it in token debt after two requests, were they
    // not refunded when the engine refuses them.
    let (_, thrifty) = s
        .create_tenant(json!({"name": "thrifty", "quotas": {"tokens_per_min": 1000}}))
        .await;
    let mut texts = Vec::new();
    for resp in futures_util::future::join_all(streams).await {
        assert_eq!(resp.status(), 200);
        let mut text = String::new();
        let mut chunks = resp.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            text.push_str(&String::from_utf8_lossy(
                &chunk.expect("the stream ends cleanly"),
            ));
        }
        texts.push(text);
    }
    let failed_at = Instant::now();
    let mut delivered = 0;
    for text in &texts {
        let events = superinfer_tests::sse_events(text);
        delivered += events.iter().filter(|e| e.contains("\"text\":")).count() as u64;
        let last_json: Value = events
            .iter()
            .rev()
            .find(|e| e.as_str() != "[DONE]")
            .map(|e| serde_json::from_str(e).expect("JSON events"))
            .expect("events");
        let err = &last_json["error"];
        assert_eq!(err["code"], "engine_failed", "{text}");
        assert_eq!(err["type"], "server_error", "{text}");
        assert!(
            err["message"].as_str().unwrap().contains("injected fault"),
            "{text}"
        );
        assert!(
            !text.contains("\"finish_reason\":\"length\""),
            "a stream finished normally: {text}"
        );
    }
    // Health answers 503 within a second of the failure, and stays so.
    for path in ["/health", "/readyz"] {
        loop {
            let status = s.client.get(s.url(path)).send().await.unwrap().status();
            if status == StatusCode::SERVICE_UNAVAILABLE {
                break;
            }
            assert!(
                failed_at.elapsed() < Duration::from_secs(1),
                "{path} still {status} a second after the engine failed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let failures = metric_value(&s.scrape().await, "superinfer_engine_failures_total", &[]);
    assert_eq!(failures, Some(1.0));
    // A new request is answered at once with 503, not queued on a dead engine.
    let start = Instant::now();
    let (status, body) = s.complete(&s.key, 4).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(start.elapsed() < Duration::from_secs(2));
    // Refused by the dead engine: each 400-token reservation is refunded, so the tenant is
    // never in debt (503 every time, never 429).
    let big = json!({"model": s.model(), "prompt": "a b c", "max_tokens": 400});
    for _ in 0..5 {
        let r = s.post("/v1/completions", &thrifty, &big).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    // The ledger bills what the streams delivered before the error, with the errors.
    let usage = usage_of(&s, "default").await;
    let totals = &usage["totals"];
    assert_eq!(totals["requests"], 3, "{usage}");
    assert_eq!(totals["errors"], 3, "{usage}");
    assert!(delivered > 0);
    assert_eq!(totals["completion_tokens"], delivered, "{usage}");
    let thrifty_usage = usage_of(&s, "thrifty").await;
    assert_eq!(thrifty_usage["totals"]["requests"], 0, "{thrifty_usage}");
    // The server itself keeps answering (its supervisor decides when to restart it).
    let models = s.get("/v1/models", &s.key).await;
    assert_eq!(models.status(), 200);
}

/// The usage ledger's export for `tenant`.
async fn usage_of(s: &TestServer, tenant: &str) -> Value {
    s.client
        .get(s.url(&format!("/admin/v1/usage?tenant={tenant}")))
        .bearer_auth(superinfer_tests::ADMIN_TOKEN)
        .send()
        .await
        .expect("the server answers")
        .json()
        .await
        .expect("JSON")
}
