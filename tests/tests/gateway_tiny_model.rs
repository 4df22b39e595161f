//! The default `superinfer serve`: the embedded tiny model on the CPU runner, with its real
//! tokenizer, chat template and sampler behind the gateway.

use reqwest::StatusCode;
use serde_json::{json, Value};
use superinfer_tests::{sse_events, TestOptions, TestServer};

/// Log-probability entries over a streamed chat answer's chunks.
fn streamed_logprob_entries(sse: &str) -> usize {
    sse_events(sse)
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"][0]["logprobs"]["content"]
                .as_array()
                .map(Vec::len)
        })
        .sum()
}

/// The embedded model's `tokenizer.json`, as the server wrote it.
fn tokenizer_json(s: &TestServer) -> Value {
    let path = s.dir.path().join("model/tokenizer.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

async fn tiny() -> TestServer {
    TestServer::start_with(TestOptions {
        sim_profile: None,
        ..TestOptions::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_model_serves_chat_and_completions() {
    let s = tiny().await;
    assert_eq!(s.model(), "superinfer-tiny");
    assert!(s.dir.path().join("model/config.json").exists());
    let body = json!({
        "model": s.model(), "stream": true, "max_tokens": 8, "ignore_eos": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "In the beginning"}],
    });
    let resp = s.post("/v1/chat/completions", &s.key, &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let events = sse_events(&resp.text().await.unwrap());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 8, "{usage}");
    // The chat template adds tokens around the message.
    assert!(
        usage["usage"]["prompt_tokens"].as_u64().unwrap() > 3,
        "{usage}"
    );

    // Greedy is deterministic; a seed makes sampling deterministic too.
    for extra in [
        json!({"temperature": 0}),
        json!({"temperature": 1.0, "seed": 42}),
    ] {
        let mut body = json!({"prompt": "And God said", "max_tokens": 6, "ignore_eos": true});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let a: Value = s.post_json("/v1/completions", &s.key, &body).await;
        let b: Value = s.post_json("/v1/completions", &s.key, &body).await;
        assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"], "{body}");
        assert_eq!(a["usage"]["completion_tokens"], 6);
    }
    // Token-id prompts are checked against the vocabulary.
    let resp = s
        .post(
            "/v1/completions",
            &s.key,
            &json!({"prompt": [1, 2, 999999]}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_probabilities_come_back_per_token() {
    let s = tiny().await;
    // Seeded: an unseeded draw may end a token inside a character, whose text alone then
    // reads as a replacement character and the tokens no longer join into the text.
    let body = json!({"prompt": "And God said", "max_tokens": 5, "ignore_eos": true,
        "logprobs": 2, "seed": 7});
    let v: Value = s.post_json("/v1/completions", &s.key, &body).await;
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 5, "{v}");
    assert_eq!(lp["text_offset"][0], 0);
    for (p, top) in lp["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(lp["top_logprobs"].as_array().unwrap())
    {
        assert!(p.as_f64().unwrap() <= 0.0, "{v}");
        assert_eq!(
            top.as_object().unwrap().len().min(2),
            top.as_object().unwrap().len()
        );
    }
    let joined: String = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(joined, v["choices"][0]["text"].as_str().unwrap());

    let body = json!({
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "ignore_eos": true,
        "stream": true, "logprobs": true, "top_logprobs": 1,
    });
    let text = s.post_text("/v1/chat/completions", &s.key, &body).await;
    assert_eq!(streamed_logprob_entries(&text), 4, "{text}");
    // Without the flag: `logprobs` is null.
    let v: Value = s
        .post_json(
            "/v1/completions",
            &s.key,
            &json!({"prompt": "x", "max_tokens": 1}),
        )
        .await;
    assert!(v["choices"][0]["logprobs"].is_null(), "{v}");
    s.shutdown().await;
}

/// A streamed token whose text never comes out (here the end-of-text token, generated past
/// with `ignore_eos` and decoded to nothing, as the last token of the answer) still gets its
/// log-probability entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_without_text_keeps_its_log_probability_when_streamed() {
    let s = tiny().await;
    let tokenizer = tokenizer_json(&s);
    let eos = tokenizer["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["content"] == "<|end_of_text|>")
        .and_then(|t| t["id"].as_u64())
        .expect("the end-of-text token");
    for max_tokens in [1, 3] {
        let body = json!({
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "ignore_eos": true, "temperature": 0, "logit_bias": {eos.to_string(): 100},
            "stream": true, "logprobs": true,
        });
        let text = s.post_text("/v1/chat/completions", &s.key, &body).await;
        assert_eq!(streamed_logprob_entries(&text), max_tokens, "{text}");
    }
}

/// A token holding only part of a multi-byte character reports the bytes it stands for (its
/// text alone is U+FFFD), so that a client can join the bytes of consecutive tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_character_token_reports_its_own_bytes() {
    let s = tiny().await;
    let tokenizer = tokenizer_json(&s);
    // The byte-level alphabet's "â" is the byte 0xE2, which opens a three-byte sequence.
    let id = tokenizer["model"]["vocab"]["â"]
        .as_u64()
        .expect("byte 0xE2 in the vocabulary");
    for stream in [false, true] {
        let body = json!({
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "ignore_eos": true, "temperature": 0, "logit_bias": {id.to_string(): 100},
            "logprobs": true, "top_logprobs": 2, "stream": stream,
        });
        let text = s.post_text("/v1/chat/completions", &s.key, &body).await;
        let entry = if stream {
            sse_events(&text)
                .iter()
                .filter(|e| e.as_str() != "[DONE]")
                .map(|e| serde_json::from_str::<Value>(e).unwrap())
                .find_map(|c| c["choices"][0]["logprobs"]["content"].get(0).cloned())
                .expect("an entry")
        } else {
            serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["logprobs"]["content"][0]
                .clone()
        };
        assert_eq!(entry["bytes"], json!([0xE2]), "{text}");
        assert_eq!(entry["token"], "\u{FFFD}", "{text}");
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top[0]["bytes"], json!([0xE2]), "{text}");
    }
}

/// The tenant's GPU seconds so far (`superinfer_request_gpu_seconds`): (count, sum).
async fn gpu_seconds(s: &TestServer) -> (f64, f64) {
    let text = s.get("/metrics", &s.key).await.text().await.unwrap();
    let labels = [("tenant", "default")];
    let get = |name| superinfer_tests::metric_value(&text, name, &labels).unwrap_or(0.0);
    (
        get("superinfer_request_gpu_seconds_count"),
        get("superinfer_request_gpu_seconds_sum"),
    )
}

/// Waits until the tenant's GPU-seconds count reaches `count`; the sum then.
async fn gpu_seconds_after(s: &TestServer, count: f64) -> f64 {
    for _ in 0..250 {
        let (n, sum) = gpu_seconds(s).await;
        if n >= count {
            return sum;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("no GPU time recorded for request {count}");
}

/// A request ended by a stop string and one whose client left mid-stream both record the
/// engine time they took (the engine ends them by an abort, whose trace comes back later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_and_disconnects_record_their_gpu_time() {
    let s = tiny().await;
    let body = json!({"model": s.model(), "prompt": "Once upon a time", "max_tokens": 300,
                      "stop": [" ", "e", "a", "t"], "temperature": 1.0, "seed": 7});
    let v: Value = s.post_json("/v1/completions", &s.key, &body).await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let after_stop = gpu_seconds_after(&s, 1.0).await;
    assert!(after_stop > 0.0, "a stopped request took no engine time");

    let body = json!({"model": s.model(), "prompt": "Once upon a time", "max_tokens": 2000,
                      "ignore_eos": true, "stream": true});
    let mut resp = s.post("/v1/completions", &s.key, &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    for _ in 0..3 {
        resp.chunk().await.unwrap().expect("a chunk");
    }
    drop(resp);
    let after_leave = gpu_seconds_after(&s, 2.0).await;
    assert!(
        after_leave > after_stop,
        "a request whose client left took no engine time"
    );
    s.shutdown().await;
}

/// On the CPU runner too, a long prompt arriving beside a stream is cut into chunks that keep
/// each step within the stream's TBT budget (a cost model measured on this CPU), instead of
/// one step of the whole prompt (a 4,095-token prompt was a 5.7-s gap in every stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompt_beside_a_stream_is_chunked_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("steps.jsonl");
    let s = TestServer::start_with(TestOptions {
        sim_profile: None,
        settings: superinfer_gateway::Settings {
            step_trace: Some(trace.clone()),
            ..Default::default()
        },
        ..TestOptions::default()
    })
    .await;
    let stream = json!({"model": s.model(), "prompt": "Once upon a time", "max_tokens": 600,
                        "ignore_eos": true, "stream": true});
    let mut resp = s.post("/v1/completions", &s.key, &stream).await;
    assert_eq!(resp.status(), StatusCode::OK);
    resp.chunk().await.unwrap().expect("the stream decodes");
    let long: Vec<u32> = (0..3500u32).map(|i| 10 + i % 1000).collect();
    let body = json!({"model": s.model(), "prompt": long, "max_tokens": 1});
    let done = s.post("/v1/completions", &s.key, &body).await;
    assert_eq!(done.status(), StatusCode::OK);
    drop(resp);
    s.shutdown().await;
    let steps: Vec<Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let beside: Vec<u64> = steps
        .iter()
        .filter(|r| r["decodes"].as_u64() > Some(0))
        .flat_map(|r| r["chunk_spans"].as_array().unwrap().clone())
        .map(|span| span[1].as_u64().unwrap())
        .collect();
    let covered: u64 = beside.iter().sum();
    assert!(
        covered >= 3000,
        "the prompt ran beside the stream: {beside:?}"
    );
    assert!(
        beside.len() >= 3 && beside.iter().all(|&len| len < 3500),
        "in chunks: {beside:?}"
    );
}

/// A constrained request's host CPU is shown per tenant, by work: its text-pool work (parse,
/// template, tokenize, compile) and its grammar's token masks in the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_cpu_of_text_work_and_grammar_masks_is_shown_per_tenant() {
    let s = tiny().await;
    let body = json!({"model": s.model(), "prompt": "Name:", "max_tokens": 8,
                      "guided_regex": "[a-z]{8}"});
    let resp = s.post("/v1/completions", &s.key, &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut seen = (0.0, 0.0);
    for _ in 0..250 {
        let text = s.get("/metrics", &s.key).await.text().await.unwrap();
        let get = |work| {
            let labels = [("tenant", "default"), ("work", work)];
            superinfer_tests::metric_value(&text, "superinfer_request_host_seconds_sum", &labels)
                .unwrap_or(0.0)
        };
        seen = (get("text"), get("grammar_mask"));
        if seen.0 > 0.0 && seen.1 > 0.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(seen.0 > 0.0 && seen.1 > 0.0, "text and mask CPU: {seen:?}");
    s.shutdown().await;
}
