//! The default `superinfer serve`: the embedded tiny model on the CPU runner, with its real
//! tokenizer, chat template and sampler behind the gateway.

use reqwest::StatusCode;
use serde_json::{json, Value};
use superinfer_tests::{sse_events, TestOptions, TestServer};

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
        let a: Value = s
            .post("/v1/completions", &s.key, &body)
            .await
            .json()
            .await
            .unwrap();
        let b: Value = s
            .post("/v1/completions", &s.key, &body)
            .await
            .json()
            .await
            .unwrap();
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
