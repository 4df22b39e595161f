//! The HTTP edge under hostile clients, on real sockets: slowloris connections, oversized and
//! slow bodies, connection floods, half-closed clients, and every answer of the HTTP layer in
//! OpenAI's error shape. Timing bounds are generous (a shared 2-core machine): they separate
//! "at once" from "after a timeout", not fast from slow.

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use superinfer_gateway::Settings;
use superinfer_tests::{error_message, raw, read_response, TestOptions, TestServer, ADMIN_TOKEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn server(settings: Settings) -> TestServer {
    TestServer::start_with(TestOptions {
        settings,
        ..TestOptions::default()
    })
    .await
}

/// Whether the server closes `stream` within `within` (EOF or reset).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, read).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_connections_are_closed_after_the_header_timeout() {
    let s = server(Settings {
        header_timeout_s: Some(1.0),
        ..Settings::default()
    })
    .await;
    let t0 = Instant::now();
    let mut conns = Vec::new();
    for i in 0..40 {
        let mut c = TcpStream::connect(s.addr()).await.unwrap();
        if i % 2 == 0 {
            // Headers started, never finished.
            c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: 1")
                .await
                .unwrap();
        }
        conns.push(c);
    }
    for c in &mut conns {
        assert!(
            closed_within(c, Duration::from_secs(15)).await,
            "a connection without complete headers stayed open"
        );
    }
    let took = t0.elapsed();
    eprintln!("40 slowloris connections closed {took:?} after they opened (timeout 1 s)");
    assert!(
        took >= Duration::from_millis(900),
        "closed before the timeout: {took:?}"
    );
    // A keep-alive connection that goes idle after its answer is closed the same way.
    let mut c = TcpStream::connect(s.addr()).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut c).await.unwrap().status, 200);
    assert!(closed_within(&mut c, Duration::from_secs(15)).await);
    // The server still serves, and shuts down without waiting for the drain deadline.
    assert_eq!(s.complete(&s.key, 2).await.0, 200);
    let t0 = Instant::now();
    s.shutdown().await;
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_length_over_the_limit_is_refused_before_the_body() {
    let s = server(Settings {
        max_body_bytes: Some(1000),
        ..Settings::default()
    })
    .await;
    let mut c = TcpStream::connect(s.addr()).await.unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n",
        s.key
    );
    let t0 = Instant::now();
    c.write_all(head.as_bytes()).await.unwrap();
    let r = read_response(&mut c).await.expect("an answer");
    let took = t0.elapsed();
    eprintln!("413 for an oversized Content-Length after {took:?}");
    assert_eq!(r.status, 413, "{:?}", String::from_utf8_lossy(&r.body));
    assert!(error_message(&r.json()).contains("larger than 1000 bytes"));
    // The body was never sent: the answer cannot have waited for it (the old path waited for
    // the 60 s body timeout). 100 ms on a quiet machine; generous here.
    assert!(took < Duration::from_secs(2), "{took:?}");
    // A chunked body over the limit is cut off at the limit, also with 413.
    let body = format!("{{\"prompt\": \"{}\"}}", "a ".repeat(1000));
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        s.key,
        body.len()
    );
    let r = raw(s.addr(), req.as_bytes()).await.unwrap();
    assert_eq!(r.status, 413);
    error_message(&r.json());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_of_the_http_layer_is_an_openai_error() {
    let s = server(Settings {
        body_timeout_s: Some(1.0),
        max_headers: Some(20),
        ..Settings::default()
    })
    .await;
    let key = s.key.clone();
    let admin = format!("Authorization: Bearer {ADMIN_TOKEN}\r\n");
    let many: String = (0..30).map(|i| format!("X-H{i}: v\r\n")).collect();
    // Past hyper's own hard limit (twice ours, at least 100): hyper answers 431 itself.
    let too_many: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
    let cases: Vec<(u16, String)> = vec![
        (404, "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n".into()),
        (
            405,
            "DELETE /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n".into(),
        ),
        (
            400,
            format!("GET /admin/v1/tenants/%zz%ff HTTP/1.1\r\nHost: x\r\n{admin}\r\n"),
        ),
        (
            400,
            format!("GET /admin/v1/tenants/%C3%28 HTTP/1.1\r\nHost: x\r\n{admin}\r\n"),
        ),
        (
            431,
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many}\r\n"),
        ),
        (
            431,
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{too_many}\r\n"),
        ),
        // Heads hyper cannot parse, answered by hyper itself (`conn::head_errors` gives
        // them the body): a header line without a colon, a control byte in a value, a
        // malformed request line, input that is not HTTP at all.
        (
            400,
            "GET /healthz HTTP/1.1\r\nbad header line\r\n\r\n".into(),
        ),
        (400, "GET /healthz HTTP/1.1\r\nX: \u{1}\r\n\r\n".into()),
        (400, "GET  HTTP/9.9\r\n\r\n".into()),
        (400, "\u{16}\u{3}\u{1} garbage\r\n\r\n".into()),
        (
            400,
            format!(
                "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
                 Authorization: Bearer sk-other\r\n\r\n"
            ),
        ),
        (
            401,
            "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \u{e9}t\u{e9}\r\n\r\n"
                .into(),
        ),
        (
            400,
            format!(
                "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
                 Content-Length: 5\r\n\r\n{{\"pro"
            ),
        ),
        (
            400,
            format!(
                "POST /admin/v1/tenants HTTP/1.1\r\nHost: x\r\n{admin}Content-Length: 3\r\n\r\n[1]"
            ),
        ),
    ];
    for (want, req) in &cases {
        let r = raw(s.addr(), req.as_bytes()).await.expect("an answer");
        assert_eq!(
            r.status,
            *want,
            "{req:?}: {:?}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(
            r.header("content-type"),
            Some("application/json"),
            "{req:?}"
        );
        error_message(&r.json());
    }
    // A client's request id is echoed only when short and plain.
    for (sent, kept) in [
        ("abc-123.x", true),
        (&*"a".repeat(200), false),
        ("a<b>", false),
    ] {
        let req = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nx-request-id: {sent}\r\n\r\n");
        let r = raw(s.addr(), req.as_bytes()).await.unwrap();
        let back = r.header("x-request-id").expect("an id");
        assert_eq!(back == sent, kept, "{sent:?} -> {back:?}");
        assert!(back.len() <= 64);
    }
    // After the heads hyper refused, the server keeps serving.
    assert_eq!(s.complete(&s.key, 2).await.0, 200);
    // A body that stops arriving: 408 after the body timeout.
    let mut c = TcpStream::connect(s.addr()).await.unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Content-Length: 100\r\n\r\n{{\"prompt\""
    );
    c.write_all(head.as_bytes()).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(20), read_response(&mut c))
        .await
        .expect("answered within the body timeout")
        .expect("an answer");
    assert_eq!(r.status, 408, "{:?}", String::from_utf8_lossy(&r.body));
    assert!(error_message(&r.json()).contains("did not arrive within 1 s"));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limits_get_an_answer_and_the_rest_are_served() {
    let s = server(Settings {
        max_connections: Some(3),
        max_connections_per_ip: Some(2),
        ..Settings::default()
    })
    .await;
    let idle: Vec<TcpStream> =
        futures_util::future::join_all((0..2).map(|_| TcpStream::connect(s.addr())))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    // Let the server accept them before the third arrives.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Liveness is answered even over a limit: the process is alive.
    let r = raw(s.addr(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("an answer");
    assert_eq!(r.status, 200);
    let r = raw(s.addr(), b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("an answer");
    assert_eq!(r.status, 429);
    assert!(r.header("retry-after").is_some());
    let msg = error_message(&r.json());
    assert!(msg.contains("from this address (limit 2)"), "{msg}");
    drop(idle);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(s.complete(&s.key, 2).await.0, 200);
    let text = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("superinfer_requests_shed_total{reason=\"connections\"} 2"),
        "{text}"
    );
    s.shutdown().await;
}

/// Slow-header connections by the dozen from a few addresses fill every unreserved place;
/// the liveness probe and a light client from another address are still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_slow_connections_from_few_addresses_cannot_starve_probes() {
    let s = server(Settings {
        max_connections: Some(32),
        max_connections_per_ip: Some(32),
        ..Settings::default()
    })
    .await;
    let mut slow = Vec::new();
    for i in 0..60u8 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(format!("127.0.0.{}:0", 2 + i % 3).parse().unwrap())
            .unwrap();
        let mut c = sock.connect(s.addr()).await.unwrap();
        // Headers that never finish.
        let _ = c.write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n").await;
        slow.push(c);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = raw(s.addr(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("an answer");
    assert_eq!(r.status, 200);
    assert_eq!(
        s.complete(&s.key, 2).await.0,
        200,
        "a light client is served"
    );
    drop(slow);
    s.shutdown().await;
}

/// A client whose side of the connection ends while its request runs is gone (as uvicorn,
/// and so vLLM, take it): its request is aborted and its seat freed, not computed for nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_closes_its_side_after_its_request_is_taken_as_gone() {
    let s = TestServer::start_with(TestOptions {
        sim_profile: Some("h200-llama-3-8b".into()),
        ..TestOptions::default()
    })
    .await;
    let body = json!({"prompt": "hello there", "max_tokens": 2000, "ignore_eos": true}).to_string();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        s.key,
        body.len()
    );
    let mut c = TcpStream::connect(s.addr()).await.unwrap();
    c.write_all(req.as_bytes()).await.unwrap();
    let engine = s.server.state.engine.clone();
    let t0 = Instant::now();
    while engine.stats().running + engine.stats().waiting == 0 {
        assert!(t0.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    c.shutdown().await.unwrap(); // our side: no more bytes
    assert!(
        read_response(&mut c).await.is_none(),
        "no answer for a client that left"
    );
    let t0 = Instant::now();
    loop {
        let st = engine.stats();
        let v: Value = s
            .get("/v1/tenant/stats", &s.key)
            .await
            .json()
            .await
            .unwrap();
        if st.running + st.waiting == 0 && v["in_flight"] == 0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "not aborted: {st:?} {v}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_names_never_read_as_ids() {
    let s = server(Settings::default()).await;
    let (id, _) = s.create_tenant(json!({"name": "acme"})).await;
    let other = id + 1;
    for bad in [other.to_string(), "007".into()] {
        let (status, body) = s.admin("POST", "", Some(json!({"name": bad}))).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["param"], "name", "{body}");
        assert!(error_message(&body).contains("all digits"), "{body}");
        let (status, body) = s.admin("PATCH", "/acme", Some(json!({"name": bad}))).await;
        assert_eq!(status, 400, "{body}");
    }
    // By id and by name, the same tenant; a number too large for an id is no tenant.
    let (_, by_id) = s.admin("GET", &format!("/{id}"), None).await;
    let (_, by_name) = s.admin("GET", "/acme", None).await;
    assert_eq!(by_id, by_name);
    let (status, body) = s.admin("DELETE", "/99999999999", None).await;
    assert_eq!(status, 404, "{body}");
    assert!(error_message(&body).contains("no tenant with id 99999999999"));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_stops_reading_is_aborted_and_frees_its_kv() {
    let s = server(Settings {
        stream_buffer: Some(4),
        stream_stall_timeout_s: Some(1.0),
        max_model_len: Some(32_768),
        ..Settings::default()
    })
    .await;
    // Long events (20 alternatives per token), more of them than the sockets hold, a small
    // receive window, and no reading.
    let (_, key) = s
        .create_tenant(json!({"name": "reader", "quotas": {"max_output_tokens": 30000}}))
        .await;
    let body = json!({"prompt": "hello", "max_tokens": 30000, "ignore_eos": true, "stream": true,
                      "logprobs": 20})
    .to_string();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut c = sock.connect(s.addr()).await.unwrap();
    c.write_all(req.as_bytes()).await.unwrap();
    // The answer's head says the request was admitted (more tokens than the sockets hold).
    let mut head = [0u8; 12];
    c.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let stats = |s: &TestServer| s.server.state.engine.stats();
    tokio::time::sleep(Duration::from_secs(4)).await;
    // The server gave up: the request left the engine and its blocks are free.
    let deadline = Instant::now() + Duration::from_secs(20);
    while (stats(&s).running > 0 || stats(&s).hbm_used > 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(stats(&s).running, 0);
    assert_eq!(
        stats(&s).hbm_used,
        0,
        "KV still held by a stream nobody reads"
    );
    // Reading now gets what was buffered, then the connection ends without `[DONE]`.
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), c.read_to_end(&mut got)).await;
    assert!(
        read.is_ok(),
        "the connection of the aborted stream is still open"
    );
    assert!(
        !String::from_utf8_lossy(&got).contains("[DONE]"),
        "the whole stream ({} bytes) was delivered",
        got.len()
    );
    let text = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("superinfer_streams_aborted_total{reason=\"slow_reader\"} 1"),
        "{text}"
    );
    // The tenant's concurrency slot came back too.
    let (_, v) = s.admin("GET", "/reader/stats", None).await;
    assert_eq!(v["in_flight"], 0, "{v}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_usage_returns_to_zero_after_streams_are_reset_mid_way() {
    let s = TestServer::start_with(TestOptions {
        sim_profile: Some("h200-llama-3-8b".into()),
        ..TestOptions::default()
    })
    .await;
    let body = json!({"prompt": "hello there", "max_tokens": 2000, "ignore_eos": true,
                      "stream": true})
    .to_string();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        s.key,
        body.len()
    );
    let mut conns = Vec::new();
    for _ in 0..30 {
        let mut c = TcpStream::connect(s.addr()).await.unwrap();
        c.write_all(req.as_bytes()).await.unwrap();
        conns.push(c);
    }
    for c in &mut conns {
        let mut first = [0u8; 256];
        c.read_exact(&mut first).await.unwrap();
    }
    assert!(s.server.state.engine.stats().hbm_used > 0);
    for c in conns {
        // RST instead of FIN: linger 0.
        c.set_zero_linger().unwrap();
        drop(c);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let stats = || s.server.state.engine.stats();
    while (stats().hbm_used > 0 || stats().running > 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let st = stats();
    assert_eq!((st.running, st.waiting, st.hbm_used), (0, 0, 0), "{st:?}");
    let text = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("superinfer_kv_usage_ratio{tier=\"hbm\"} 0\n"),
        "{text}"
    );
    s.shutdown().await;
}
