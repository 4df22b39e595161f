//! Admission control end to end: a real server on 127.0.0.1:0 (simulated engine, paced),
//! real HTTP clients: per-tenant quotas (rate, tokens per minute, concurrency) answer 429 with
//! Retry-After and leave other tenants alone; a full engine queue answers 503.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use superinfer_tests::{error_message, metric_value, TestOptions, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_quota_is_429_with_retry_after_and_other_tenants_are_unaffected() {
    // Paced (Llama-3-8B on an H200, ~6 ms a token): the concurrency check below needs a
    // stream that lasts; at zero cost per step its 2,000 tokens could all be written into the
    // socket, and its slot freed, before the second request arrived.
    let s = TestServer::start_with(TestOptions {
        sim_profile: Some("h200-llama-3-8b".into()),
        ..TestOptions::default()
    })
    .await;
    let (_, key) = s
        .create_tenant(json!({"name": "small", "quotas": {"requests_per_s": 0.2, "burst": 2}}))
        .await;
    assert_eq!(s.complete(&key, 1).await.0, StatusCode::OK);
    assert_eq!(s.complete(&key, 1).await.0, StatusCode::OK);
    let resp = s
        .post(
            "/v1/completions",
            &key,
            &json!({"prompt": "hi", "max_tokens": 1}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=5).contains(&retry), "{retry}");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    assert!(error_message(&v).contains("0.2 requests/s"));
    // The default tenant has its own bucket.
    assert_eq!(s.complete(&s.key, 1).await.0, StatusCode::OK);

    // Tokens per minute: 12 tokens (4 prompt + 8 output) against 10 per minute puts the
    // tenant 2 tokens in debt, repaid in 12 s.
    let (_, thrifty) = s
        .create_tenant(json!({"name": "thrifty", "quotas": {"tokens_per_min": 10}}))
        .await;
    let body = json!({"prompt": "a b c d", "max_tokens": 8, "ignore_eos": true});
    assert_eq!(
        s.post("/v1/completions", &thrifty, &body).await.status(),
        StatusCode::OK
    );
    let resp = s.post("/v1/completions", &thrifty, &body).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((10..=13).contains(&retry), "{retry}");
    assert!(error_message(&resp.json().await.unwrap()).contains("10 tokens/min"));

    // Concurrency: one slot, held by a slow stream.
    let (_, one) = s
        .create_tenant(json!({"name": "one", "quotas": {"max_concurrent": 1}}))
        .await;
    let slow = json!({"prompt": "hi", "max_tokens": 2000, "stream": true, "ignore_eos": true});
    let held = s.post("/v1/completions", &one, &slow).await;
    assert_eq!(held.status(), StatusCode::OK);
    let resp = s
        .post("/v1/completions", &one, &json!({"prompt": "hi"}))
        .await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(resp.headers().contains_key("retry-after"));
    drop(held);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_engine_queue_is_503_with_retry_after() {
    // 8 HBM blocks (128 tokens) and no DRAM tier: a 90-token prompt takes 6 blocks, so a
    // second one waits, and with --max-queue 1 the one after that is refused. Paced at the
    // slowest built-in profile (Qwen2.5-32B, ~19 ms per decode step): the first request holds
    // its blocks for ~0.6 s, well beyond the time the second needs to reach the queue even on
    // a loaded 2-core machine (at Llama-3-8B's ~6 ms the margin was ~0.2 s and too small).
    let s = TestServer::start_with(TestOptions {
        sim_profile: Some("gh200-qwen2.5-32b".into()),
        max_queue: Some(1),
        hbm_blocks: Some(8),
        dram_blocks: Some(0),
        ..TestOptions::default()
    })
    .await;
    let engine = s.server.state.engine.clone();
    let long =
        json!({"prompt": "w ".repeat(90), "max_tokens": 30, "ignore_eos": true, "stream": true});
    let running = s.post("/v1/completions", &s.key, &long).await;
    assert_eq!(running.status(), StatusCode::OK);
    // The stream's headers come before admission: until the engine has taken the first
    // request, it still holds the one queue place and the second would be refused.
    let start = Instant::now();
    while engine.stats().running < 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            engine.stats()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Not streamed: its response (and so its place in the queue) lasts until it is served.
    let mut queued = long.clone();
    queued["stream"] = json!(false);
    let waiting = tokio::spawn({
        let (client, url, key) = (s.client.clone(), s.url("/v1/completions"), s.key.clone());
        async move {
            client
                .post(url)
                .bearer_auth(key)
                .json(&queued)
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    let start = Instant::now();
    while engine.stats().waiting < 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?} {:?}",
            engine.stats(),
            waiting.is_finished()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let resp = s
        .post(
            "/v1/completions",
            &s.key,
            &json!({"prompt": "hi", "max_tokens": 1}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["retry-after"], "1");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "overloaded");
    assert!(error_message(&v).contains("queue is full"));
    // The node's own refusal is a TTFT miss of its tenant, as a request shed in the queue is.
    let text = s.get("/metrics", &s.key).await.text().await.unwrap();
    let labels = [("tenant", "default"), ("reason", "shed")];
    let shed = superinfer_tests::metric_value(&text, "superinfer_ttft_unserved_total", &labels);
    assert_eq!(shed, Some(1.0), "{text}");
    drop(running);
    assert_eq!(waiting.await.unwrap(), StatusCode::OK);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize_count_against_the_request_rate() {
    let s = TestServer::start().await;
    let (_, key) = s
        .create_tenant(json!({"name": "counter", "quotas": {"requests_per_s": 0.1, "burst": 3}}))
        .await;
    let tokenize = json!({"model": s.model(), "prompt": "a b c"});
    let v: Value = s.post_json("/tokenize", &key, &tokenize).await;
    let tokens = v["tokens"].clone();
    assert!(tokens.as_array().is_some_and(|t| !t.is_empty()), "{v}");
    let detokenize = json!({"model": s.model(), "tokens": tokens});
    assert_eq!(
        s.post("/detokenize", &key, &detokenize).await.status(),
        StatusCode::OK
    );
    // The third request of the burst is a generation: it and the two before share one rate.
    assert_eq!(s.complete(&key, 1).await.0, StatusCode::OK);
    for (path, body) in [("/tokenize", &tokenize), ("/detokenize", &detokenize)] {
        let resp = s.post(path, &key, body).await;
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
        assert!(resp.headers().contains_key("retry-after"), "{path}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_num_seqs_caps_the_engines_batch() {
    let s = TestServer::start_with(TestOptions {
        sim_profile: Some("h200-llama-3-8b".into()),
        settings: superinfer_gateway::Settings {
            max_num_seqs: Some(2),
            ..Default::default()
        },
        ..TestOptions::default()
    })
    .await;
    let engine = s.server.state.engine.clone();
    let long = json!({"prompt": "hi", "max_tokens": 2000, "ignore_eos": true, "stream": true});
    // Sent at once: a stream's headers wait for its first token, which two of them get only
    // when a seat frees.
    let held: Vec<_> = (0..4)
        .map(|_| {
            let (client, url, key) = (s.client.clone(), s.url("/v1/completions"), s.key.clone());
            let body = long.clone();
            tokio::spawn(async move { client.post(url).bearer_auth(key).json(&body).send().await })
        })
        .collect();
    let start = Instant::now();
    loop {
        let st = engine.stats();
        assert!(st.running <= 2, "{st:?}");
        if st.running == 2 && st.waiting == 2 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{st:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for h in held {
        h.abort();
    }
    s.shutdown().await;
}

/// A stream the engine refuses at submission (here: it would miss its TTFT SLO, `shed_late`)
/// is an HTTP 503 with Retry-After before the first byte, not a 200 followed by an error event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_engine_refuses_is_an_http_error() {
    // As in the queue test: 8 HBM blocks, a 90-token prompt takes 6, so one runs at a time;
    // paced at the 32B profile so each holds its blocks for about half a second.
    let s = TestServer::start_with(TestOptions {
        sim_profile: Some("gh200-qwen2.5-32b".into()),
        hbm_blocks: Some(8),
        dram_blocks: Some(0),
        settings: superinfer_gateway::Settings {
            shed_late: Some(0.5),
            // No queue deadline: the second request must wait to be admitted (at 10 × the
            // 1-ms target it would be shed instead).
            queue_deadline_ttfts: Some(0.0),
            // First come, first served: no preemption, so each waits its turn whole.
            policy: Some(superinfer_policies::PolicyKind::Fcfs),
            ..Default::default()
        },
        ..TestOptions::default()
    })
    .await;
    // A 1-ms TTFT SLO: any wait in the queue is far past it.
    let (_, key) = s
        .create_tenant(json!({"name": "hurried", "slo": {"ttft_ms": 1}}))
        .await;
    let engine = s.server.state.engine.clone();
    let long = json!({"prompt": "w ".repeat(90), "max_tokens": 30, "ignore_eos": true});
    let wait_for = |what: &'static str, cond: fn(&superinfer_engine::EngineStats) -> bool| {
        let engine = engine.clone();
        async move {
            let start = Instant::now();
            while !cond(&engine.stats()) {
                assert!(start.elapsed() < Duration::from_secs(10), "{what}");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };
    let send = |body: Value| {
        let (client, url, key) = (s.client.clone(), s.url("/v1/completions"), key.clone());
        tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    // The first runs, the second waits (and, admitted later, teaches the engine that this
    // tenant's requests wait far past its SLO), the third waits behind the second.
    let first = send(long.clone());
    wait_for("the first runs", |st| st.running >= 1).await;
    let second = send(long.clone());
    wait_for("the second waits", |st| st.waiting >= 1).await;
    wait_for("the second is admitted", |st| {
        st.waiting == 0 && st.running >= 1
    })
    .await;
    let third = send(long.clone());
    wait_for("the third waits", |st| st.waiting >= 1).await;
    // The fourth, streamed, would queue too: refused at submission, as an HTTP error.
    let mut streamed = long.clone();
    streamed["stream"] = json!(true);
    let resp = s.post("/v1/completions", &key, &streamed).await;
    if resp.status() != StatusCode::SERVICE_UNAVAILABLE {
        panic!(
            "{} {:?}: {}",
            resp.status(),
            engine.stats(),
            resp.text().await.unwrap()
        );
    }
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = resp.json().await.unwrap();
    assert!(error_message(&v).contains("SLO"), "{v}");
    for h in [first, second, third] {
        assert_eq!(h.await.unwrap(), StatusCode::OK);
    }
    s.shutdown().await;
}

/// A request still queued at its deadline (its tenant's own `queue_deadline_ms`, 200 ms, where
/// the node's would be 100 × its 100-ms TTFT target), streamed or not, is shed: 503 with Retry-After that says
/// why, counted per tenant and reason; the server serves on, and another tenant's requests are
/// untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_queued_past_its_deadline_is_shed_with_503_and_counted() {
    // One 90-token prompt at a time (8 HBM blocks), each holding them about half a second.
    let s = TestServer::start_with(TestOptions::one_prompt_at_a_time(100.0)).await;
    let (_, key) = s
        .create_tenant(json!({
            "name": "hurried",
            "slo": {"ttft_ms": 100, "queue_deadline_ms": 200}
        }))
        .await;
    let engine = s.server.state.engine.clone();
    let long = json!({"prompt": "w ".repeat(90), "max_tokens": 30, "ignore_eos": true});
    let first = {
        let (client, url, key, body) = (
            s.client.clone(),
            s.url("/v1/completions"),
            key.clone(),
            long.clone(),
        );
        tokio::spawn(async move {
            let r = client.post(url).bearer_auth(key).json(&body).send().await;
            r.unwrap().status()
        })
    };
    let start = Instant::now();
    while engine.stats().running == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "the first runs");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Two queued behind it for ~0.5 s, past their 0.2 s deadline; the streamed one too gets
    // the 503 (its headers wait for its first token), not a 200 and an error event.
    let t = Instant::now();
    let mut streamed = long.clone();
    streamed["stream"] = json!(true);
    let (plain, streamed) = tokio::join!(
        s.post("/v1/completions", &key, &long),
        s.post("/v1/completions", &key, &streamed)
    );
    for resp in [plain, streamed] {
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            t.elapsed() < Duration::from_millis(450),
            "{:?}",
            t.elapsed()
        );
        assert!(resp.headers().contains_key("retry-after"));
        let v: Value = resp.json().await.unwrap();
        assert!(error_message(&v).contains("queue deadline"), "{v}");
    }
    assert_eq!(first.await.unwrap(), StatusCode::OK);
    assert_eq!(engine.stats().shed_deadline, 2);
    let text = s.scrape().await;
    let unserved = [("tenant", "hurried"), ("reason", "deadline")];
    assert_eq!(
        metric_value(&text, "superinfer_ttft_unserved_total", &unserved),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        metric_value(
            &text,
            "superinfer_requests_shed_total",
            &[("reason", "deadline")]
        ),
        Some(2.0)
    );
    // The node serves on.
    assert_eq!(s.complete(&key, 2).await.0, StatusCode::OK);
    s.shutdown().await;
}
