//! Gateway throughput and added latency: non-streamed `POST /v1/completions` (1 output token)
//! over keep-alive HTTP/1.1 connections against the engine on the simulated runner at zero
//! cost per step, compared with the same requests submitted to the engine directly (no HTTP,
//! no auth, no JSON). The difference of the two latency distributions is what the gateway
//! adds, with each `--ledger-sync` (`answer`: every answer waits for its usage record's disk
//! write; `interval`: none waits). Client and server share the machine.
//!
//! ```sh
//! cargo bench -p superinfer-gateway --bench gateway
//! BENCH_SECS=10 BENCH_CONNS=32 cargo bench -p superinfer-gateway --bench gateway
//! ```

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde_json::json;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use superinfer_engine::{EngineHandle, EngineRequest, StreamEvent};
use superinfer_gateway::usage::LedgerSync;
use superinfer_gateway::{ServeConfig, Settings};
use superinfer_policies::{RequestId, Slo, TenantId};
use tokio::net::TcpStream;

// The allocator the `superinfer` binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One client's next request, made again and again.
type Call = Box<dyn FnMut() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Result {
    requests: usize,
    seconds: f64,
    latencies_us: Vec<f64>,
}

impl Result {
    fn pct(&self, q: f64) -> f64 {
        let i = ((q * self.latencies_us.len() as f64).ceil() as usize)
            .clamp(1, self.latencies_us.len());
        self.latencies_us[i - 1]
    }

    fn rps(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
}

/// Runs `conns` loops of `one()` for `secs` after a one-second warm-up; collects latencies.
async fn drive<F, Fut>(conns: usize, secs: u64, make: F) -> Result
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Call> + Send,
{
    let warm = Instant::now() + Duration::from_secs(1);
    let end = warm + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let make = make.clone();
        tasks.push(tokio::spawn(async move {
            let mut one = make().await;
            let mut lat = Vec::new();
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                one().await;
                if t0 >= warm {
                    lat.push(t0.elapsed().as_secs_f64() * 1e6);
                }
            }
            lat
        }));
    }
    let mut latencies_us = Vec::new();
    for t in tasks {
        latencies_us.extend(t.await.expect("a bench task"));
    }
    latencies_us.sort_by(f64::total_cmp);
    Result {
        requests: latencies_us.len(),
        seconds: secs as f64,
        latencies_us,
    }
}

fn engine_request() -> EngineRequest {
    EngineRequest {
        slo: Slo {
            ttft_s: 5.0,
            tbt_s: 0.1,
        },
        ignore_eos: true,
        ..EngineRequest::new(RequestId(0), TenantId(1), vec![7; 4], 1)
    }
}

async fn engine_direct(engine: EngineHandle, conns: usize, secs: u64) -> Result {
    drive(conns, secs, move || {
        let engine = engine.clone();
        async move {
            let f: Call = Box::new(move || {
                let engine = engine.clone();
                Box::pin(async move {
                    let mut s = engine.submit(engine_request()).expect("the engine accepts");
                    while let Some(ev) = s.next().await {
                        if matches!(ev, StreamEvent::Finished { .. }) {
                            break;
                        }
                    }
                })
            });
            f
        }
    })
    .await
}

async fn gateway(
    addr: std::net::SocketAddr,
    key: String,
    model: String,
    conns: usize,
    secs: u64,
) -> Result {
    let body = Bytes::from(
        serde_json::to_vec(
            &json!({"model": model, "prompt": "one two three four", "max_tokens": 1}),
        )
        .expect("a JSON body"),
    );
    let auth = format!("Bearer {key}");
    drive(conns, secs, move || {
        let (body, auth) = (body.clone(), auth.clone());
        async move {
            let stream = TcpStream::connect(addr).await.expect("connect");
            stream.set_nodelay(true).expect("nodelay");
            let (sender, conn) = http1::handshake(TokioIo::new(stream))
                .await
                .expect("handshake");
            tokio::spawn(conn);
            let sender = Arc::new(tokio::sync::Mutex::new(sender));
            let f: Call = Box::new(move || {
                let (sender, body, auth) = (sender.clone(), body.clone(), auth.clone());
                Box::pin(async move {
                    let req = hyper::Request::post("/v1/completions")
                        .header("host", "bench")
                        .header("content-type", "application/json")
                        .header("authorization", auth)
                        .body(Full::new(body))
                        .expect("a request");
                    let mut sender = sender.lock().await;
                    // A chunked answer's end may reach the client just before the
                    // connection takes the next request.
                    sender.ready().await.expect("the connection stays open");
                    let resp = sender.send_request(req).await.expect("a response");
                    assert_eq!(resp.status(), 200);
                    let _ = resp.into_body().collect().await.expect("a body");
                })
            });
            f
        }
    })
    .await
}

fn main() {
    let secs = env("BENCH_SECS", 10);
    let conns = env("BENCH_CONNS", 32) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        // The same requests through the gateway with each `--ledger-sync`: `answer` waits at
        // each answer's end for its usage record to be on disk, `interval` never waits.
        let mut rows = Vec::new();
        let mut direct = None;
        for sync in [LedgerSync::Answer, LedgerSync::Interval] {
            let dir = tempfile::tempdir().expect("a temp dir");
            let settings = Settings {
                listen: Some("127.0.0.1:0".parse().expect("an address")),
                data_dir: Some(dir.path().to_path_buf()),
                admin_token: Some("bench-admin-token-0123456789".into()),
                sim_profile: Some("zero".into()),
                max_queue: Some(100_000),
                ledger_sync: Some(sync),
                ..Settings::default()
            };
            let server =
                superinfer_gateway::start(ServeConfig::resolve(settings).expect("settings"))
                    .await
                    .expect("the server starts");
            let store = server.state.registry.store().clone();
            let default = store.get_by_name("default").expect("store").expect("the default tenant");
            let patch = serde_json::from_value(json!({"quotas": {"requests_per_s": 1e6, "burst": 1000000,
                "tokens_per_min": 1_000_000_000_000u64, "max_concurrent": 100000}}))
            .expect("a patch");
            store.patch(default.id, patch).expect("patched");
            server.state.registry.refresh().await.expect("refreshed");
            let key = server.default_api_key.clone().expect("a key");
            let model = server.state.model.id.clone();
            if direct.is_none() {
                direct = Some(engine_direct(server.state.engine.clone(), conns, secs).await);
            }
            let http = gateway(server.addr, key, model, conns, secs).await;
            rows.push((sync, http));
            server.shutdown().await.expect("shutdown");
        }
        let direct = direct.expect("measured");
        println!("gateway bench: {conns} concurrent clients, {secs} s each after 1 s warm-up, engine on the simulated runner at zero cost");
        println!("| path | requests/s | p50 latency | p99 latency |");
        println!("|---|---|---|---|");
        println!(
            "| engine direct (no HTTP) | {:.0} | {:.0} µs | {:.0} µs |",
            direct.rps(),
            direct.pct(0.5),
            direct.pct(0.99)
        );
        for (sync, r) in &rows {
            println!(
                "| through the gateway, --ledger-sync {sync:?} | {:.0} | {:.0} µs | {:.0} µs |",
                r.rps(),
                r.pct(0.5),
                r.pct(0.99)
            );
        }
        for (sync, http) in &rows {
            println!(
                "added by the gateway (--ledger-sync {sync:?}): p50 {:.0} µs, p99 {:.0} µs",
                http.pct(0.5) - direct.pct(0.5),
                http.pct(0.99) - direct.pct(0.99)
            );
        }
    });
}
