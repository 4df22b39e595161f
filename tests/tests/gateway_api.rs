//! The gateway end to end: a real server on 127.0.0.1:0 (simulated engine), real HTTP
//! clients, several tenants.

use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use superinfer_tests::{error_message, sse_events, TestOptions, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_tenants_stream_and_complete_at_once() {
    let s = TestServer::start().await;
    let (_, key_b) = s
        .create_tenant(json!({"name": "acme", "weight": 2.0}))
        .await;
    let model = s.model();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let key = if i % 2 == 0 {
            s.key.clone()
        } else {
            key_b.clone()
        };
        let (client, url) = (s.client.clone(), s.url("/v1/completions"));
        let body = json!({
            "model": model, "prompt": "one two three four", "max_tokens": 5 + i,
            "stream": i % 4 < 2, "stream_options": if i % 4 < 2 { json!({"include_usage": true}) } else { Value::Null },
            "ignore_eos": true,
        });
        tasks.push(tokio::spawn(async move {
            let resp = client
                .post(url)
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .unwrap();
            (
                i,
                body["stream"].as_bool().unwrap(),
                resp.status(),
                resp.text().await.unwrap(),
            )
        }));
    }
    for t in tasks {
        let (i, stream, status, text) = t.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{text}");
        let want = 5 + i as u64;
        if stream {
            let events = sse_events(&text);
            assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{text}");
            let chunks: Vec<Value> = events[..events.len() - 1]
                .iter()
                .map(|e| serde_json::from_str(e).unwrap())
                .collect();
            let texts = chunks.iter().filter(|c| {
                c["choices"][0]["text"]
                    .as_str()
                    .is_some_and(|t| !t.is_empty())
            });
            assert_eq!(texts.count() as u64, want);
            let finish = chunks
                .iter()
                .find_map(|c| c["choices"][0]["finish_reason"].as_str());
            assert_eq!(finish, Some("length"));
            let usage = &chunks.last().unwrap()["usage"];
            assert_eq!(usage["completion_tokens"].as_u64(), Some(want), "{text}");
            assert_eq!(usage["prompt_tokens"].as_u64(), Some(4));
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["object"], "text_completion");
            assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(want));
            assert_eq!(v["usage"]["total_tokens"].as_u64(), Some(want + 4));
            assert_eq!(v["choices"][0]["finish_reason"], "length");
            let words = v["choices"][0]["text"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .count();
            assert_eq!(words as u64, want);
        }
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streams_role_then_content_then_finish() {
    let s = TestServer::start().await;
    let body = json!({
        "model": s.model(), "stream": true, "max_tokens": 3,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    });
    let resp = s.post("/v1/chat/completions", &s.key, &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let events = sse_events(&resp.text().await.unwrap());
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let content: String = events[1..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(content.split_whitespace().count(), 3, "{content}");
    assert_eq!(events.last().unwrap(), "[DONE]");

    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2});
    let resp = s.post("/v1/chat/completions", &s.key, &body).await;
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["usage"]["completion_tokens"], 2);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_cut_the_answer() {
    let s = TestServer::start().await;
    // The simulated engine always samples token 0, which the stand-in renders as " hello".
    let body = json!({"prompt": "x", "max_tokens": 10, "stop": ["llo he"]});
    let v: Value = s.post_json("/v1/completions", &s.key, &body).await;
    assert_eq!(v["choices"][0]["text"], " he", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 2);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_bad_and_disabled_keys_are_refused() {
    let s = TestServer::start().await;
    let body = json!({"prompt": "hi"});
    let resp = s
        .client
        .post(s.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert!(error_message(&resp.json().await.unwrap()).contains("Authorization"));
    let fake = format!("sk-si-{}", "0".repeat(64));
    for key in ["nonsense", fake.as_str()] {
        let resp = s.post("/v1/completions", key, &body).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
    }
    let (id, key) = s
        .create_tenant(json!({"name": "off", "enabled": false}))
        .await;
    let resp = s.post("/v1/completions", &key, &body).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert!(error_message(&resp.json().await.unwrap()).contains("disabled"));
    let (status, _) = s
        .admin("PATCH", &format!("/{id}"), Some(json!({"enabled": true})))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(s.complete(&key, 1).await.0, StatusCode::OK);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_reads_only_its_own_stats() {
    let s = TestServer::start().await;
    let (a_id, a) = s
        .create_tenant(json!({"name": "alpha", "slo": {"ttft_ms": 2000}}))
        .await;
    let (b_id, b) = s.create_tenant(json!({"name": "beta"})).await;
    for _ in 0..3 {
        assert_eq!(s.complete(&a, 4).await.0, StatusCode::OK);
    }
    let v: Value = s.get("/v1/tenant/stats", &a).await.json().await.unwrap();
    assert_eq!(v["tenant"]["name"], "alpha");
    assert_eq!(v["stats"]["sequences_finished"], 3);
    assert_eq!(v["stats"]["completion_tokens"], 12);
    assert_eq!(v["stats"]["ttft"]["slo_s"], 2.0);
    assert_eq!(v["stats"]["ttft"]["attainment"], 1.0);
    // Beta sees its own (empty) stats, whatever it asks for.
    let resp = s.get(&format!("/v1/tenant/stats?tenant={a_id}"), &b).await;
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["tenant"]["id"], b_id);
    assert_eq!(v["stats"]["sequences_finished"], 0);
    // A tenant key opens no admin route.
    let resp = s.get(&format!("/admin/v1/tenants/{a_id}/stats"), &b).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let resp = s.get("/v1/tenant/stats", "sk-si-nope").await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    // The admin reads anyone's.
    let (status, v) = s.admin("GET", &format!("/{a_id}/stats"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["stats"]["sequences_finished"], 3);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_creates_patches_rotates_and_deletes() {
    let s = TestServer::start().await;
    let (id, key) = s
        .create_tenant(
            json!({"name": "gamma", "slo": {"ttft_ms": 800, "tbt_ms": 50}, "weight": 3.0}),
        )
        .await;
    assert!(key.starts_with("sk-si-"));
    let (status, list) = s.admin("GET", "", None).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default", "gamma"]);
    let (_, t) = s.admin("GET", "/gamma", None).await;
    assert_eq!(t["id"], id);
    assert_eq!(t["slo"]["ttft_ms"], 800);
    assert!(t.get("api_key").is_none() && !t.to_string().contains("sk-si-"));

    let (status, t) = s
        .admin(
            "PATCH",
            &format!("/{id}"),
            Some(json!({"quotas": {"max_output_tokens": 3}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{t}");
    assert_eq!(t["quotas"]["max_output_tokens"], 3);
    let (status, v) = s.complete(&key, 4).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_message(&v).contains("max_output_tokens"));

    let (status, v) = s.admin("POST", &format!("/{id}/rotate-key"), None).await;
    assert_eq!(status, StatusCode::OK);
    let new_key = v["api_key"].as_str().unwrap().to_string();
    assert_ne!(new_key, key);
    assert_eq!(s.complete(&key, 1).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(s.complete(&new_key, 1).await.0, StatusCode::OK);

    let (status, v) = s
        .admin("PATCH", &format!("/{id}"), Some(json!({"weight": -1})))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "weight");
    let (status, _) = s.admin("POST", "", Some(json!({"name": "gamma"}))).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, v) = s
        .admin("POST", "", Some(json!({"name": "x", "wieght": 2})))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");

    let (status, _) = s.admin("DELETE", &format!("/{id}"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(s.complete(&new_key, 1).await.0, StatusCode::UNAUTHORIZED);
    let (status, _) = s.admin("GET", &format!("/{id}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Without the admin token: 401.
    let resp = s.get("/admin/v1/tenants", &s.key).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_the_right_4xx_and_the_server_keeps_serving() {
    let s = TestServer::start().await;
    let cases: Vec<(&str, String, StatusCode, &str)> = vec![
        (
            "/v1/completions",
            "{".into(),
            StatusCode::BAD_REQUEST,
            "not valid JSON",
        ),
        (
            "/v1/completions",
            r#"{"prompt": ""}"#.into(),
            StatusCode::BAD_REQUEST,
            "empty",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "max_tokens": "many"}"#.into(),
            StatusCode::BAD_REQUEST,
            "max_tokens",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "temperature": 9}"#.into(),
            StatusCode::BAD_REQUEST,
            "temperature",
        ),
        (
            "/v1/completions",
            r#"{"model": "gpt-4", "prompt": "a"}"#.into(),
            StatusCode::NOT_FOUND,
            "does not exist",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": []}"#.into(),
            StatusCode::BAD_REQUEST,
            "at least one message",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "wizard", "content": "x"}]}"#.into(),
            StatusCode::BAD_REQUEST,
            "unknown role",
        ),
        (
            "/v1/completions",
            format!(r#"{{"prompt": "{}"}}"#, "w ".repeat(9000)),
            StatusCode::BAD_REQUEST,
            "max_prompt_tokens",
        ),
    ];
    for (path, body, want, needle) in cases {
        // A fresh client each time: the server closes a connection whose body it refused
        // unread (413), and a pooled client could reuse it.
        let resp = reqwest::Client::new()
            .post(s.url(path))
            .bearer_auth(&s.key)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), want, "{}", &body[..body.len().min(80)]);
        let msg = error_message(&resp.json().await.unwrap());
        assert!(msg.contains(needle), "{msg}");
    }
    // A body over the limit is refused from its Content-Length, before it is read, and the
    // connection closed: a client still writing the body may see a broken pipe instead of the
    // answer (reqwest does, at random), so this one is sent by hand: the head and the start
    // of a 5 MiB body, then the answer is read.
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{{\"prompt\": \"www",
        s.key,
        5 << 20
    );
    let resp = superinfer_tests::raw(s.addr(), head.as_bytes())
        .await
        .expect("an answer to an oversized body");
    assert_eq!(resp.status, 413);
    assert!(
        error_message(&resp.json()).contains("larger than"),
        "{resp:?}"
    );
    let resp = s.get("/v1/nothing", &s.key).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    error_message(&resp.json().await.unwrap());
    let resp = s.get("/v1/completions", &s.key).await;
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    error_message(&resp.json().await.unwrap());
    assert_eq!(s.complete(&s.key, 2).await.0, StatusCode::OK);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_aborts_its_request() {
    // Paced: 2000 tokens take seconds, so the request is surely running when dropped.
    let s = TestServer::start_with(TestOptions {
        sim_profile: Some("h200-llama-3-8b".into()),
        ..TestOptions::default()
    })
    .await;
    let body = json!({"prompt": "hi", "max_tokens": 2000, "stream": true, "ignore_eos": true});
    let resp = s.post("/v1/completions", &s.key, &body).await;
    let mut bytes = resp.bytes_stream();
    let first = bytes.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    let engine = s.server.state.engine.clone();
    let start = Instant::now();
    // The engine publishes its gauges after routing a step's tokens: wait for them.
    while engine.stats().running != 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            engine.stats()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(bytes);
    loop {
        let st = engine.stats();
        if st.running + st.waiting == 0 && st.hbm_used == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "not aborted: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let v: Value = s
        .get("/v1/tenant/stats", &s.key)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["in_flight"], 0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_and_metrics() {
    let s = TestServer::start_with(TestOptions {
        metrics_listen: true,
        ..TestOptions::default()
    })
    .await;
    let v: Value = s.get("/v1/models", &s.key).await.json().await.unwrap();
    assert_eq!(v["data"][0]["id"], s.model());
    for path in ["/healthz", "/readyz"] {
        assert_eq!(
            s.client.get(s.url(path)).send().await.unwrap().status(),
            StatusCode::OK
        );
    }
    assert_eq!(s.complete(&s.key, 3).await.0, StatusCode::OK);
    // Moved to its own listener: not on the main one.
    assert_eq!(
        s.client
            .get(s.url("/metrics"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::NOT_FOUND
    );
    let url = format!("http://{}/metrics", s.server.metrics_addr.unwrap());
    let text = s
        .client
        .get(url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        "superinfer_time_to_first_token_seconds_bucket{tenant=\"default\"",
        "superinfer_inter_token_latency_seconds_count{tenant=\"default\"} 2",
        "superinfer_requests_total{tenant=\"default\",finish_reason=\"length\"} 1",
        "superinfer_generation_tokens_total{tenant=\"default\"} 3",
        "superinfer_ttft_slo_attainment_ratio{tenant=\"default\"} 1",
        "superinfer_num_requests_running 0",
        "superinfer_num_requests_waiting 0",
        "superinfer_num_requests_rotary 0",
        "superinfer_kv_usage_ratio{tier=\"hbm\"}",
        "superinfer_kv_usage_ratio{tier=\"dram\"}",
        "superinfer_rotations_total",
        "superinfer_recomputes_total 0",
        "superinfer_shed_total 0",
        "superinfer_transfer_bytes_total{direction=\"h2d\"}",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
    s.shutdown().await;
}
