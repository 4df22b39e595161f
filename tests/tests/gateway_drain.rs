//! Graceful shutdown on real sockets: while draining, probes and new requests get a clear 503
//! and streams admitted before finish; streams still running at the drain deadline end with
//! an error event and `[DONE]`, and their usage reaches the ledger before the process exits.

use serde_json::{json, Value};
use std::time::Duration;
use superinfer_gateway::Settings;
use superinfer_tests::{TestOptions, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_draining_readyz_answers_503_and_in_flight_streams_finish() {
    let s = TestServer::start_with(TestOptions {
        sim_profile: Some("h200-llama-3-8b".into()),
        ..TestOptions::default()
    })
    .await;
    let body = json!({"prompt": "hi", "max_tokens": 200, "stream": true, "ignore_eos": true});
    let stream = s.post("/v1/completions", &s.key, &body).await;
    assert_eq!(stream.status(), 200);
    let TestServer {
        server,
        base,
        key,
        client,
        dir: _dir,
    } = s;
    let stopping = tokio::spawn(server.shutdown());
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A fresh client: new connections are answered while the stream drains.
    let fresh = reqwest::Client::new();
    let r = fresh.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "draining");
    // vLLM's probe says why, as a refusal to retry elsewhere (logged at info, not as a failure).
    let r = fresh.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().get("retry-after").is_some());
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "shutting_down"
    );
    let r = fresh
        .post(format!("{base}/v1/completions"))
        .bearer_auth(&key)
        .json(&json!({"prompt": "hi", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().get("retry-after").is_some());
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "shutting_down"
    );
    // The stream admitted before the drain ends normally.
    let text = stream.text().await.unwrap();
    let events = superinfer_tests::sse_events(&text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{text}");
    assert!(!text.contains("\"error\""), "{text}");
    stopping.await.unwrap().unwrap();
    drop(client);
}

/// A stream still running when the drain deadline passes ends properly: an error event
/// (`shutting_down`) and `[DONE]`, never a body cut mid-way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_past_the_drain_deadline_end_with_an_error_event_and_done() {
    let s = TestServer::start_with(TestOptions {
        sim_profile: Some("h200-llama-3-8b".into()),
        settings: Settings {
            drain_timeout_s: Some(0.3),
            ..Default::default()
        },
        ..TestOptions::default()
    })
    .await;
    let body = json!({"prompt": "hi", "max_tokens": 1000, "stream": true, "ignore_eos": true});
    let streams =
        futures_util::future::join_all((0..3).map(|_| s.post("/v1/completions", &s.key, &body)))
            .await;
    let TestServer {
        server,
        client,
        dir,
        ..
    } = s;
    let stopping = tokio::spawn(server.shutdown());
    for stream in streams {
        assert_eq!(stream.status(), 200);
        let text = stream.text().await.expect("the stream ends, not cut");
        let events = superinfer_tests::sse_events(&text);
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{text}");
        let error = &events[events.len() - 2];
        assert!(error.contains("shutting_down"), "{error}");
    }
    stopping.await.unwrap().unwrap();
    drop(client);
    // Their records, settled as the engine ended them, reached the ledger before exit.
    let store = superinfer_tenants::TenantStore::open(dir.path().join("tenants")).unwrap();
    let rows = store
        .usage()
        .rows(&superinfer_tenants::UsageQuery::default())
        .unwrap();
    let billed: u64 = rows.iter().map(|r| r.counts.requests).sum();
    let errors: u64 = rows.iter().map(|r| r.counts.errors).sum();
    assert_eq!((billed, errors), (3, 3), "{rows:?}");
}
