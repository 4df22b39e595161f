//! The usage ledger against the embedded tiny model: after a mixed run (several tenants,
//! streamed and not, chat and completions, `n` > 1, a cached prompt, a 400), the ledger's
//! totals per tenant equal exactly the sum of the `usage` fields the clients received.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::HashMap;
use superinfer_tests::{sse_usage, TestOptions, TestServer, ADMIN_TOKEN};

/// (requests, sequences, prompt, cached, completion) summed per tenant on the client side.
type Sums = HashMap<String, [u64; 5]>;

/// The ledger's columns in the order of [`Sums`].
const COLUMNS: [&str; 5] = [
    "requests",
    "sequences",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
];

/// One request of `sequences` choices whose client was told `usage`.
fn add(sums: &mut Sums, tenant: &str, sequences: u64, usage: &Value) {
    let e = sums.entry(tenant.to_string()).or_default();
    e[0] += 1;
    e[1] += sequences;
    e[2] += usage["prompt_tokens"].as_u64().expect("prompt_tokens");
    e[3] += usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens");
    e[4] += usage["completion_tokens"]
        .as_u64()
        .expect("completion_tokens");
}

/// A request; returns the `usage` the client got (the usage chunk of a stream).
async fn usage_of(s: &TestServer, key: &str, path: &str, body: Value) -> Value {
    let stream = body["stream"].as_bool().unwrap_or(false);
    let resp = s.post(path, key, &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let text = resp.text().await.expect("a body");
    if !stream {
        let v: Value = serde_json::from_str(&text).expect("JSON");
        return v["usage"].clone();
    }
    sse_usage(&text)
}

async fn ledger(s: &TestServer, query: &str) -> reqwest::Response {
    s.client
        .get(s.url(&format!("/admin/v1/usage{query}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("the server answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_equals_what_the_clients_were_told() {
    let s = TestServer::start_with(TestOptions {
        sim_profile: None,
        ..TestOptions::default()
    })
    .await;
    let (_, key_a) = s.create_tenant(json!({"name": "alpha"})).await;
    let (_, key_b) = s.create_tenant(json!({"name": "beta"})).await;
    let model = s.model();
    let long = "the quick brown fox jumps over the lazy dog ".repeat(8);
    let mut sums = Sums::new();
    let keys = [
        ("default", s.key.clone()),
        ("alpha", key_a),
        ("beta", key_b),
    ];
    for (i, (tenant, key)) in keys.iter().enumerate() {
        let n = 3 + i as u64;
        let plain = json!({"model": model, "prompt": "Say hello", "max_tokens": n});
        add(
            &mut sums,
            tenant,
            1,
            &usage_of(&s, key, "/v1/completions", plain).await,
        );
        let streamed = json!({"model": model, "prompt": "Once upon", "max_tokens": n,
                              "stream": true, "stream_options": {"include_usage": true}});
        add(
            &mut sums,
            tenant,
            1,
            &usage_of(&s, key, "/v1/completions", streamed).await,
        );
        let chat = json!({"model": model, "messages": [{"role": "user", "content": "hi"}],
                          "max_tokens": n, "stream": true,
                          "stream_options": {"include_usage": true}});
        add(
            &mut sums,
            tenant,
            1,
            &usage_of(&s, key, "/v1/chat/completions", chat).await,
        );
        // Twice the same long prompt: the second finds blocks in the prefix cache.
        for _ in 0..2 {
            let cached = json!({"model": model, "prompt": long, "max_tokens": 2});
            add(
                &mut sums,
                tenant,
                1,
                &usage_of(&s, key, "/v1/completions", cached).await,
            );
        }
        let several = json!({"model": model, "prompt": ["a", "b c"], "n": 2, "max_tokens": n});
        add(
            &mut sums,
            tenant,
            4,
            &usage_of(&s, key, "/v1/completions", several).await,
        );
        let several_streamed = json!({"model": model, "prompt": "x", "n": 3, "max_tokens": 2,
            "stream": true, "stream_options": {"include_usage": true}});
        add(
            &mut sums,
            tenant,
            3,
            &usage_of(&s, key, "/v1/completions", several_streamed).await,
        );
        // Refused before admission: no usage, not in the ledger.
        let bad = json!({"model": model, "prompt": "x", "temperature": 5});
        let r = s.post("/v1/completions", key, &bad).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    }
    assert!(
        sums["alpha"][3] > 0,
        "the repeated prompt was cached: {sums:?}"
    );

    let resp = ledger(&s, "").await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.expect("JSON");
    assert_eq!(body["object"], "usage.list");
    let mut got = Sums::new();
    let mut total = [0u64; 5];
    for row in body["data"].as_array().expect("rows") {
        let e = got
            .entry(row["tenant"].as_str().expect("a name").to_string())
            .or_default();
        for (i, f) in COLUMNS.iter().enumerate() {
            e[i] += row[f].as_u64().expect("a count");
            total[i] += row[f].as_u64().expect("a count");
        }
        assert_eq!(row["errors"], 0);
        assert!(row["hour"].as_str().expect("an hour").ends_with(":00:00Z"));
    }
    assert_eq!(got, sums);
    for (i, f) in COLUMNS.iter().enumerate() {
        assert_eq!(body["totals"][f], total[i], "{f}");
    }
    // The tenant's statistics and the metrics count in the ledger's units.
    for (tenant, key) in &keys {
        let v: Value = s.get("/v1/tenant/stats", key).await.json().await.unwrap();
        let st = &v["stats"];
        let e = sums[*tenant];
        assert_eq!(st["requests_admitted"], e[0], "{tenant}: {v}");
        assert_eq!(st["sequences_admitted"], e[1], "{tenant}: {v}");
        assert_eq!(st["sequences_finished"], e[1], "{tenant}: {v}");
        assert_eq!(st["prompt_tokens"], e[2], "{tenant}: {v}");
        assert_eq!(st["completion_tokens"], e[4], "{tenant}: {v}");
        assert_eq!(st["ttft"]["count"], e[1], "{tenant}: {v}");
    }
    let metrics = s.client.get(s.url("/metrics")).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    let series = |unit: &str| {
        let head = format!("superinfer_admitted_total{{tenant=\"alpha\",unit=\"{unit}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(head.as_str()))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{head}in {metrics}"))
    };
    assert_eq!(series("requests"), sums["alpha"][0]);
    assert_eq!(series("sequences"), sums["alpha"][1]);

    let csv = ledger(&s, "?tenant=alpha&format=csv&from=2020-01-01").await;
    assert_eq!(
        csv.headers()["content-type"].to_str().expect("ASCII"),
        "text/csv; charset=utf-8"
    );
    let csv = csv.text().await.expect("text");
    let lines: Vec<&str> = csv.lines().collect();
    assert!(
        lines[0].starts_with("tenant_id,tenant,hour,requests,"),
        "{csv}"
    );
    let requests: u64 = lines[1..]
        .iter()
        .map(|l| {
            l.split(',')
                .nth(3)
                .expect("requests")
                .parse::<u64>()
                .expect("a number")
        })
        .sum();
    assert_eq!(requests, sums["alpha"][0]);
    assert!(lines[0].starts_with("tenant_id,tenant,hour,requests,sequences,"));
    assert!(lines[1..]
        .iter()
        .all(|l| l.split(',').nth(1) == Some("alpha")));

    let future = ledger(&s, "?from=2999-01-01").await;
    let future: Value = future.json().await.expect("JSON");
    assert_eq!(future["data"].as_array().map(Vec::len), Some(0));
    for bad in [
        "?format=xml",
        "?tenant=nobody",
        "?from=yesterday",
        "?color=red",
        "?from=2&to=1",
    ] {
        let r = ledger(&s, bad).await;
        assert!(r.status().is_client_error(), "{bad}: {}", r.status());
    }
    s.shutdown().await;
}
