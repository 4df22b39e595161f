//! Per-request traces (`gateway/src/generate/trace.rs`): with
//! `superinfer::request=debug`, every request has a `request{tenant id}` span with a
//! first-token event and a `finished` event (finish reason, tokens, time queued in the
//! engine, preemptions; why it went unserved). Its own binary: it installs the process's
//! tracing subscriber.

use reqwest::StatusCode;
use serde_json::json;
use superinfer_tests::{LogCapture, TestOptions, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_is_traced_from_queue_to_finish() {
    let log = LogCapture::install_with("warn,superinfer::request=debug");
    // One 90-token prompt at a time, each holding HBM ~0.5 s; deadline 2 × 100 ms.
    let s = TestServer::start_with(TestOptions::one_prompt_at_a_time(2.0)).await;
    let (_, key) = s
        .create_tenant(json!({"name": "traced", "slo": {"ttft_ms": 100}}))
        .await;
    let long = json!({"prompt": "w ".repeat(90), "max_tokens": 30, "ignore_eos": true});
    let (a, b) = tokio::join!(s.post("/v1/completions", &key, &long), async {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        s.post("/v1/completions", &key, &long).await
    });
    assert_eq!(a.status(), StatusCode::OK);
    assert_eq!(b.status(), StatusCode::SERVICE_UNAVAILABLE);
    s.shutdown().await;
    let text = log.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("request{tenant=\"traced\""))
        .collect();
    let served: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("finished") && l.contains("finish_reason=\"length\""))
        .collect();
    assert_eq!(served.len(), 1, "{text}");
    for field in [
        "prompt_tokens=",
        "completion_tokens=30",
        "queued_s=",
        "preemptions=0",
        "gpu_s=",
        "e2e_s=",
    ] {
        assert!(served[0].contains(field), "{field} in {}", served[0]);
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("first token") && l.contains("ttft_s=")),
        "{text}"
    );
    let shed: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("finished") && l.contains("unserved=\"deadline\""))
        .collect();
    assert_eq!(shed.len(), 1, "{text}");
    assert!(shed[0].contains("completion_tokens=0"), "{}", shed[0]);
}
