//! The prefix cache through the gateway, on the embedded tiny model (blocks of 16 tokens):
//! `usage.prompt_tokens_details.cached_tokens`, per-tenant namespaces, shared namespaces,
//! `cache_salt`, `--no-prefix-cache`, the admin drop call and the metrics.

use reqwest::StatusCode;
use serde_json::{json, Value};
use superinfer_gateway::Settings;
use superinfer_tests::{error_message, metric_value, sse_events, TestOptions, TestServer};

async fn tiny(settings: Settings) -> TestServer {
    TestServer::start_with(TestOptions {
        sim_profile: None,
        settings,
        ..TestOptions::default()
    })
    .await
}

/// A prompt of many blocks: about 90 words, over 100 tokens of the tiny model's tokenizer.
fn long_prompt(topic: &str) -> String {
    let words = "the quick brown fox jumps over the lazy dog while the river runs to the sea";
    format!("{topic}: {}", [words; 6].join(" and "))
}

/// A greedy completion of `prompt` (with `extra` fields merged in): (text, prompt tokens,
/// cached tokens).
async fn complete(s: &TestServer, key: &str, prompt: &str, extra: Value) -> (String, u64, u64) {
    let mut body = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let resp = s.post("/v1/completions", key, &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let v: Value = resp.json().await.unwrap();
    let usage = &v["usage"];
    (
        v["choices"][0]["text"].as_str().unwrap().to_owned(),
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("no cached_tokens: {v}")),
    )
}

/// The cached count of a second identical request: the first one's blocks become cache
/// entries once written back, a moment after it ends, so ask again a few times.
async fn cached_after(s: &TestServer, key: &str, prompt: &str, extra: Value) -> u64 {
    let mut cached = 0;
    for _ in 0..20 {
        cached = complete(s, key, prompt, extra.clone()).await.2;
        if cached > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    cached
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_hits_its_own_prefix_and_no_one_else_does_unless_shared() {
    let s = tiny(Settings::default()).await;
    let prompt = long_prompt("alpha");
    let (miss_text, prompt_tokens, first) = complete(&s, &s.key, &prompt, json!({})).await;
    assert!(
        prompt_tokens > 64,
        "{prompt_tokens} tokens: too short a prompt"
    );
    assert_eq!(first, 0, "a new prompt cannot be cached");
    let cached = cached_after(&s, &s.key, &prompt, json!({})).await;
    assert!(cached >= 48, "the second request hit {cached} tokens");
    assert!(cached < prompt_tokens && cached % 16 == 0, "{cached}");
    // Greedy output with a hit is the output without one.
    let (hit_text, _, again) = complete(&s, &s.key, &prompt, json!({})).await;
    assert!(again > 0);
    assert_eq!(hit_text, miss_text);

    // Streams report it in the usage chunk, continuous usage in every chunk.
    let body = json!({"prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true, "continuous_usage_stats": true}});
    let text = s.post_text("/v1/completions", &s.key, &body).await;
    let events = sse_events(&text);
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert!(
        usage["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0),
        "{text}"
    );
    let first_chunk: Value = serde_json::from_str(&events[0]).unwrap();
    assert!(
        first_chunk["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0),
        "{text}"
    );

    // n > 1: `usage` counts the prompt (and its cached tokens) once, as OpenAI does; the
    // metrics count every choice's hits, which is where followers show.
    let hits = |text: String| -> f64 {
        ["hbm", "dram"]
            .iter()
            .filter_map(|tier| {
                metric_value(
                    &text,
                    "superinfer_prefix_cache_hit_tokens_total",
                    &[("tenant", "default"), ("tier", tier)],
                )
            })
            .sum()
    };
    let single = complete(&s, &s.key, &prompt, json!({})).await.2;
    let before = hits(s.scrape().await);
    let body = json!({"prompt": prompt, "max_tokens": 2, "temperature": 0, "n": 2});
    let v: Value = s.post_json("/v1/completions", &s.key, &body).await;
    let counted = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(counted, single, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens, "{v}");
    assert_eq!(hits(s.scrape().await) - before, 2.0 * single as f64);
    // A new prompt with n = 3 is computed once: the later two choices follow the first and
    // hit its full blocks (before `follows`, all three computed it: no hit).
    for (i, endpoint) in ["/v1/completions", "/v1/chat/completions"]
        .iter()
        .enumerate()
    {
        let fresh = long_prompt(&format!("gamma {i}"));
        let mut body = json!({"max_tokens": 4, "temperature": 0, "n": 3, "ignore_eos": true});
        if i == 0 {
            body["prompt"] = json!(fresh);
        } else {
            body["messages"] = json!([{"role": "user", "content": fresh}]);
        }
        let before = hits(s.scrape().await);
        let v = s.post_json(endpoint, &s.key, &body).await;
        let n3 = hits(s.scrape().await) - before;
        assert_eq!(v["usage"]["completion_tokens"], 12, "{v}");
        body["n"] = json!(1);
        let again = s.post_json(endpoint, &s.key, &body).await;
        let one = again["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(one >= 48, "{again}");
        assert_eq!(n3, 2.0 * one as f64, "{endpoint}: {v}");
        assert_eq!(v["usage"]["prompt_tokens"], again["usage"]["prompt_tokens"]);
    }

    // Another tenant with the same prompt: its own namespace, a miss.
    let (_, other) = s.create_tenant(json!({"name": "other"})).await;
    assert_eq!(complete(&s, &other, &prompt, json!({})).await.2, 0);

    // Two tenants in one shared namespace hit each other's blocks.
    let (_, a) = s
        .create_tenant(json!({"name": "team-a", "cache_namespace": "team"}))
        .await;
    let (b_id, b) = s.create_tenant(json!({"name": "team-b"})).await;
    let (status, t) = s
        .admin(
            "PATCH",
            &format!("/{b_id}"),
            Some(json!({"cache_namespace": "team"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{t}");
    assert_eq!(t["cache_namespace"], "team");
    let shared = long_prompt("beta");
    assert_eq!(complete(&s, &a, &shared, json!({})).await.2, 0);
    assert!(cached_after(&s, &b, &shared, json!({})).await > 0);
    // The shared namespace is not the default tenant's.
    assert_eq!(complete(&s, &s.key, &shared, json!({})).await.2, 0);

    // Chat completions report it too.
    let chat = json!({"messages": [{"role": "user", "content": long_prompt("gamma")}],
        "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let mut cached = 0;
    for _ in 0..20 {
        let v: Value = s.post_json("/v1/chat/completions", &s.key, &chat).await;
        cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        if cached > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(cached > 0, "chat never hit");

    // Per-tenant hit and query counters, and the cached blocks per tier.
    let metrics = s.scrape().await;
    let value = |prefix: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in\n{metrics}"))
    };
    let q = value("superinfer_prefix_cache_query_tokens_total{tenant=\"default\"}");
    assert!(q >= 3.0 * prompt_tokens as f64, "{q}");
    let hits = value("superinfer_prefix_cache_hit_tokens_total{tenant=\"default\",tier=\"hbm\"}")
        + value("superinfer_prefix_cache_hit_tokens_total{tenant=\"default\",tier=\"dram\"}");
    assert!(hits > 0.0 && hits < q, "{hits} of {q}");
    let other_hits =
        value("superinfer_prefix_cache_hit_tokens_total{tenant=\"other\",tier=\"hbm\"}")
            + value("superinfer_prefix_cache_hit_tokens_total{tenant=\"other\",tier=\"dram\"}");
    assert_eq!(other_hits, 0.0);
    let blocks = value("superinfer_prefix_cache_blocks{tier=\"hbm\"}")
        + value("superinfer_prefix_cache_blocks{tier=\"dram\"}");
    assert!(blocks > 0.0, "{blocks}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_salt_separates_namespaces_and_bad_salts_are_refused() {
    let s = tiny(Settings::default()).await;
    let prompt = long_prompt("salted");
    let one = json!({"cache_salt": "one"});
    assert_eq!(complete(&s, &s.key, &prompt, one.clone()).await.2, 0);
    assert!(cached_after(&s, &s.key, &prompt, one.clone()).await > 0);
    // Another salt, or none, is another namespace.
    assert_eq!(
        complete(&s, &s.key, &prompt, json!({"cache_salt": "two"}))
            .await
            .2,
        0
    );
    assert_eq!(complete(&s, &s.key, &prompt, json!({})).await.2, 0);
    for (bad, why) in [
        (json!(""), "empty"),
        (json!("x".repeat(257)), "257 bytes"),
        (json!(7), "wrong type"),
        (json!(["a"]), "wrong type"),
    ] {
        for path in ["/v1/completions", "/v1/chat/completions"] {
            let body = json!({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}],
                "cache_salt": bad, "max_tokens": 1});
            let mut body = body;
            let drop = if path == "/v1/completions" {
                "messages"
            } else {
                "prompt"
            };
            body.as_object_mut().unwrap().remove(drop);
            let resp = s.post(path, &s.key, &body).await;
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{why} at {path}");
            let v: Value = resp.json().await.unwrap();
            error_message(&v);
            assert_eq!(v["error"]["param"], "cache_salt", "{why}: {v}");
        }
    }
    // The server keeps serving.
    assert!(complete(&s, &s.key, "hi", json!({})).await.1 > 0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_prefix_cache_nothing_is_ever_cached() {
    let s = tiny(Settings {
        no_prefix_cache: Some(true),
        ..Settings::default()
    })
    .await;
    let prompt = long_prompt("off");
    let (first, _, _) = complete(&s, &s.key, &prompt, json!({})).await;
    for _ in 0..4 {
        let (text, _, cached) = complete(&s, &s.key, &prompt, json!({})).await;
        assert_eq!(cached, 0);
        assert_eq!(text, first);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let metrics = s.scrape().await;
    assert!(
        metrics.contains("superinfer_prefix_cache_blocks{tier=\"hbm\"} 0\n"),
        "{metrics}"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_drop_call_empties_a_tenants_cache_and_the_shared_one_only_when_asked() {
    let s = tiny(Settings::default()).await;
    let prompt = long_prompt("drop");
    complete(&s, &s.key, &prompt, json!({})).await;
    assert!(cached_after(&s, &s.key, &prompt, json!({})).await > 0);
    let (status, v) = s.admin("DELETE", "/default/prefix-cache", None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["dropped_blocks"].as_u64() > Some(0), "{v}");
    assert_eq!(v["namespaces"][0]["namespace"], "tenant:1", "{v}");
    assert_eq!(
        complete(&s, &s.key, &prompt, json!({})).await.2,
        0,
        "a hit after the drop"
    );

    // A tenant in a shared namespace: its own namespace only, unless ?shared=true.
    let (_, key) = s
        .create_tenant(json!({"name": "teamer", "cache_namespace": "crew"}))
        .await;
    complete(&s, &key, &prompt, json!({})).await;
    assert!(cached_after(&s, &key, &prompt, json!({})).await > 0);
    let (status, v) = s.admin("DELETE", "/teamer/prefix-cache", None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["cache_namespace"], "crew");
    assert!(v["note"].as_str().unwrap().contains("?shared=true"), "{v}");
    assert!(
        complete(&s, &key, &prompt, json!({})).await.2 > 0,
        "the shared one stays"
    );
    let (status, v) = s
        .admin("DELETE", "/teamer/prefix-cache?shared=true", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["namespaces"][1]["namespace"], "shared:crew", "{v}");
    assert!(
        v["namespaces"][1]["dropped_blocks"].as_u64() > Some(0),
        "{v}"
    );
    assert_eq!(complete(&s, &key, &prompt, json!({})).await.2, 0);

    // Unknown tenants, bad queries and bad namespace names.
    let (status, v) = s.admin("DELETE", "/nobody/prefix-cache", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let (status, v) = s
        .admin("DELETE", "/teamer/prefix-cache?shared=yes", None)
        .await;
    assert_eq!(
        (status, v["error"]["param"].clone()),
        (StatusCode::BAD_REQUEST, json!("shared"))
    );
    for bad in [
        json!(""),
        json!("has space"),
        json!("x".repeat(65)),
        json!(5),
    ] {
        let (status, v) = s
            .admin(
                "POST",
                "",
                Some(json!({"name": "bad-ns", "cache_namespace": bad})),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert!(error_message(&v).contains("cache_namespace"), "{v}");
        let (status, v) = s
            .admin("PATCH", "/teamer", Some(json!({"cache_namespace": bad})))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    // null puts a tenant back in its own namespace.
    let (status, v) = s
        .admin("PATCH", "/teamer", Some(json!({"cache_namespace": null})))
        .await;
    assert_eq!(
        (status, v["cache_namespace"].clone()),
        (StatusCode::OK, Value::Null)
    );
    let (_, list) = s.admin("GET", "", None).await;
    assert!(list["data"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t.get("cache_namespace").is_some()));
    s.shutdown().await;
}
