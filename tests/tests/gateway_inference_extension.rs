//! The Gateway API Inference Extension's model-server protocol, on real sockets: the
//! vLLM-named metrics its endpoint picker reads, with the values of the engine's own gauges,
//! and its headers (`x-gateway-inference-objective`, `x-gateway-inference-fairness-id`)
//! refused from an untrusted peer and honoured from a `--trusted-proxy` one.

use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};
use superinfer_gateway::proxy::{ObjectiveSpec, TrustedNet, FAIRNESS_HEADER, OBJECTIVE_HEADER};
use superinfer_gateway::Settings;
use superinfer_tests::{metric_value, TestOptions, TestServer};

const HBM_BLOCKS: u32 = 64;

fn gauge(text: &str, name: &str, model: &str) -> f64 {
    metric_value(text, name, &[("model_name", model)])
        .unwrap_or_else(|| panic!("no {name}{{model_name=\"{model}\"}} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vllm_gauges_follow_the_engine() {
    let s = TestServer::start_with(TestOptions {
        sim_profile: None,
        hbm_blocks: Some(HBM_BLOCKS),
        ..TestOptions::default()
    })
    .await;
    let model = s.model();
    // A long stream keeps one request in the running batch while we scrape.
    let body = json!({"model": model, "prompt": "Once upon a time", "max_tokens": 400,
        "ignore_eos": true, "stream": true});
    let resp = s.post("/v1/completions", &s.key, &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut chunks = resp.bytes_stream();
    chunks.next().await.expect("a first chunk").expect("bytes");
    let during = s.scrape().await;
    assert_eq!(gauge(&during, "vllm:num_requests_running", &model), 1.0);
    assert_eq!(gauge(&during, "vllm:num_requests_waiting", &model), 0.0);
    let usage = gauge(&during, "vllm:kv_cache_usage_perc", &model);
    assert!(usage > 0.0 && usage <= 1.0, "{usage}");
    let ours = metric_value(&during, "superinfer_kv_usage_ratio", &[("tier", "hbm")]);
    assert_eq!(Some(usage), ours, "the same HBM share under both names");
    while let Some(c) = chunks.next().await {
        c.expect("the stream ends cleanly");
    }

    let (status, _) = s.complete(&s.key, 4).await;
    assert_eq!(status, StatusCode::OK);
    let after = s.scrape().await;
    assert_eq!(gauge(&after, "vllm:num_requests_running", &model), 0.0);
    assert_eq!(gauge(&after, "vllm:num_requests_waiting", &model), 0.0);
    assert_eq!(gauge(&after, "vllm:kv_cache_usage_perc", &model), 0.0);
    let config = metric_value(
        &after,
        "vllm:cache_config_info",
        &[
            ("model_name", &model),
            ("block_size", "16"),
            ("num_gpu_blocks", &HBM_BLOCKS.to_string()),
        ],
    );
    assert_eq!(config, Some(1.0), "{after}");
    assert!(
        !after.contains("vllm:lora_requests_info"),
        "no LoRA adapters: no LoRA series"
    );
    s.shutdown().await;
}

/// A paced simulated engine (every step takes real milliseconds, so a 1 ms TTFT objective is
/// missed for sure while the tenant's own 5 s SLO is met).
async fn paced(trusted: &str) -> TestServer {
    TestServer::start_with(TestOptions {
        sim_profile: Some("h200-llama-3-8b".into()),
        settings: Settings {
            trusted_proxy: Some(vec![trusted.parse::<TrustedNet>().unwrap()]),
            objective: Some(vec!["strict=1:1".parse::<ObjectiveSpec>().unwrap()]),
            ..Settings::default()
        },
        ..TestOptions::default()
    })
    .await
}

async fn complete_with(s: &TestServer, headers: &[(&str, &str)]) -> (StatusCode, Value) {
    let prompt = "Say hello again";
    let body = json!({"model": s.model(), "prompt": prompt, "max_tokens": 2});
    let mut req = s
        .client
        .post(s.url("/v1/completions"))
        .bearer_auth(&s.key)
        .json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("the server answers");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_headers_from_an_untrusted_peer_are_refused_by_name() {
    // The test client connects from 127.0.0.1; only 10.0.0.1 is trusted.
    let s = paced("10.0.0.1").await;
    for header in [OBJECTIVE_HEADER, FAIRNESS_HEADER] {
        let (status, body) = complete_with(&s, &[(header, "strict")]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["error"]["param"], header, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("trusted proxy"), "{message}");
    }
    let (status, _) = complete_with(&s, &[]).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "without the headers all is as before"
    );
    let text = s.scrape().await;
    let refused = metric_value(
        &text,
        "superinfer_requests_rejected_total",
        &[("tenant", "default"), ("reason", "untrusted_header")],
    );
    assert_eq!(refused, Some(2.0), "{text}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxy_tightens_the_slo_and_names_only_the_tenant() {
    let s = paced("127.0.0.0/8").await;
    // The gap between the two tokens of each answer: a paced decode step, several
    // milliseconds, far within the tenant's TBT target and always past the objective's 1 ms.
    // (Its TTFT is no proof: a paced engine hands out a step's tokens as the step starts.)
    let attainment = |text: &str| {
        metric_value(
            text,
            "superinfer_tbt_slo_attainment_ratio",
            &[("tenant", "default")],
        )
    };
    let (status, body) = complete_with(&s, &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        attainment(&s.scrape().await),
        Some(1.0),
        "the tenant's TBT met"
    );
    let (status, body) = complete_with(
        &s,
        &[(OBJECTIVE_HEADER, "strict"), (FAIRNESS_HEADER, "default")],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        attainment(&s.scrape().await),
        Some(0.5),
        "the objective's 1 ms TBT replaced the tenant's for that request"
    );

    let (status, body) = complete_with(&s, &[(OBJECTIVE_HEADER, "gold")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["param"], OBJECTIVE_HEADER);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("strict"));
    let (status, body) = complete_with(&s, &[(FAIRNESS_HEADER, "someone-else")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["param"], FAIRNESS_HEADER);
    s.shutdown().await;
}
