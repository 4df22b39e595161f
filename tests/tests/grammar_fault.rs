//! A grammar engine that panics while computing a request's token mask fails that request
//! only: it ends with an OpenAI-shaped 400 and one WARN line, unconstrained requests beside
//! it finish, and the engine stays healthy. The panic is injected (`superinfer_engine::
//! handle::fault`, a dev-only feature) through the environment, so this file is a test binary
//! of its own.

use serde_json::json;
use superinfer_engine::handle::fault::MASK_PANIC;
use superinfer_tests::{metric_value, LogCapture, TestOptions, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_grammar_mask_fails_only_its_request() {
    std::env::set_var(MASK_PANIC, "1");
    let log = LogCapture::install();
    // The embedded tiny model on the CPU: a real tokenizer, so grammars compile.
    let s = TestServer::start_with(TestOptions {
        sim_profile: None,
        ..TestOptions::default()
    })
    .await;
    let plain = json!({"model": s.model(), "prompt": "Say hello", "max_tokens": 16,
                       "ignore_eos": true});
    let constrained = json!({"model": s.model(), "prompt": "A phone number:", "max_tokens": 16,
                             "structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}});
    let (a, b, c) = tokio::join!(
        s.post("/v1/completions", &s.key, &plain),
        s.post("/v1/completions", &s.key, &constrained),
        s.post("/v1/completions", &s.key, &plain),
    );
    for plain in [a, c] {
        assert_eq!(plain.status(), 200);
        let v: serde_json::Value = plain.json().await.unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 16, "{v}");
    }
    assert_eq!(b.status(), 400);
    let v: serde_json::Value = b.json().await.unwrap();
    let msg = v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(msg.contains("grammar engine failed"), "{v}");
    assert!(
        !msg.contains("panicked") && !msg.contains(".rs:"),
        "internals: {msg}"
    );
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");

    // The engine serves on.
    assert_eq!(
        s.client
            .get(s.url("/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let (status, body) = s.complete(&s.key, 4).await;
    assert_eq!(status, 200, "{body}");
    let text = s.scrape().await;
    let failures = metric_value(&text, "superinfer_engine_failures_total", &[]);
    assert_eq!(failures.unwrap_or(0.0), 0.0);
    // Every admitted request is a TTFT check: the failed one, which never had a first token,
    // as a miss with its reason.
    let ttft = [("tenant", "default"), ("slo", "ttft")];
    assert_eq!(
        metric_value(&text, "superinfer_slo_checks_total", &ttft),
        Some(4.0)
    );
    assert_eq!(
        metric_value(&text, "superinfer_slo_met_total", &ttft),
        Some(3.0)
    );
    let unserved = [("tenant", "default"), ("reason", "invalid")];
    assert_eq!(
        metric_value(&text, "superinfer_ttft_unserved_total", &unserved),
        Some(1.0)
    );

    let errors = log.errors();
    assert!(errors.is_empty(), "{errors:#?}");
    let text = log.text();
    let warns = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("grammar engine failed"))
        .count();
    assert_eq!(warns, 1, "{text}");
    s.shutdown().await;
}
