//! A hostile tenant's long bodies beside another tenant, on real sockets: prompts of
//! megabytes that really are tokenized (the tenant's prompt limit allows them) must stall
//! neither the health checks nor the other tenant (the text pool, its admission and its
//! low-priority lane); `/tokenize` bodies that cannot fit the model are refused at once.

use serde_json::json;
use std::time::{Duration, Instant};
use superinfer_tests::{error_message, TestOptions, TestServer};

/// `n` latencies of `f`, sorted.
async fn latencies<F, Fut>(n: usize, gap: Duration, mut f: F) -> Vec<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        f().await;
        out.push(t0.elapsed());
        tokio::time::sleep(gap).await;
    }
    out.sort();
    out
}

/// A hostile tenant's prompts: this many at once, of this many bytes.
const LONG_PROMPTS: usize = 8;
const LONG_PROMPT_BYTES: usize = 1_000_000;

fn p99(v: &[Duration]) -> Duration {
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompts_of_one_tenant_stall_neither_health_checks_nor_another_tenant() {
    let s = TestServer::start_with(TestOptions {
        sim_profile: None, // the tiny model's real tokenizer
        ..TestOptions::default()
    })
    .await;
    let (_, big) = s
        .create_tenant(json!({"name": "big", "quotas": {"max_prompt_tokens": 10_000_000}}))
        .await;
    let prompt = "lorem ipsum dolor sit amet ".repeat(LONG_PROMPT_BYTES / 27);
    // The default tenant's limit (a few thousand tokens) cannot fit 4 MB: refused by its
    // length, at once, before tokenizing.
    let t0 = Instant::now();
    let r = s
        .post(
            "/v1/completions",
            &s.key,
            &json!({"prompt": prompt, "max_tokens": 1}),
        )
        .await;
    assert_eq!(r.status(), 400);
    let msg = error_message(&r.json().await.unwrap());
    assert!(msg.contains("bytes long"), "{msg}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());

    let small = || async {
        assert_eq!(s.complete(&s.key, 1).await.0, 200);
    };
    let health = || async {
        let r = s.client.get(s.url("/healthz")).send().await.unwrap();
        assert_eq!(r.status(), 200);
    };
    let base_small = latencies(20, Duration::from_millis(20), small).await;
    // `big` may send long prompts: each is tokenized (about a second of CPU here) in the text
    // pool.
    let flood = async {
        let one = || async {
            let body = json!({"prompt": prompt, "max_tokens": 1});
            s.post("/v1/completions", &big, &body).await.status()
        };
        // `/tokenize` refuses text that cannot fit the model's context by its bytes alone.
        let tokenize = || async {
            let body = json!({"prompt": prompt});
            s.post("/tokenize", &big, &body).await.status()
        };
        let t0 = Instant::now();
        let (codes, tokenized) = tokio::join!(
            futures_util::future::join_all((0..LONG_PROMPTS).map(|_| one())),
            futures_util::future::join_all((0..LONG_PROMPTS / 2).map(|_| tokenize())),
        );
        eprintln!(
            "{LONG_PROMPTS} long prompts answered in {:?}: {codes:?}; /tokenize: {tokenized:?}",
            t0.elapsed()
        );
        // Refused for the model's context once tokenized, or by the pool's admission.
        assert!(
            codes.iter().all(|c| [400, 429, 503].contains(&c.as_u16())),
            "{codes:?}"
        );
        assert!(
            tokenized
                .iter()
                .all(|c| [400, 429, 503].contains(&c.as_u16())),
            "{tokenized:?}"
        );
    };
    let during = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let h = latencies(20, Duration::from_millis(30), health).await;
        let o = latencies(20, Duration::from_millis(20), small).await;
        (h, o)
    };
    let ((), (health_during, small_during)) = tokio::join!(flood, during);
    // Before the text pool, /healthz waited for the tokenizer: about 1-2 s per request.
    assert!(
        p99(&health_during) < Duration::from_millis(500),
        "/healthz p99 {:?} while another tenant's prompts are tokenized",
        p99(&health_during)
    );
    let (base, now) = (p99(&base_small), p99(&small_during));
    eprintln!(
        "/healthz p99 {:?}; other tenant p99 {base:?} alone, {now:?} beside the long prompts",
        p99(&health_during)
    );
    assert!(
        now <= base * 2 + Duration::from_millis(250),
        "the other tenant's p99 went from {base:?} to {now:?}"
    );
    s.shutdown().await;
}
