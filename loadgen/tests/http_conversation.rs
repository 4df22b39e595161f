//! `loadgen http` conversations against a tiny mock server on a real socket: every follow-up
//! turn's prompt is exactly the previous prompt, the text the server returned and a new
//! message; the cached count of `usage.prompt_tokens_details` reaches the report.

use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use superinfer_loadgen::target::http::{HttpTarget, HttpTargetConfig};
use superinfer_loadgen::workload::{ArrivalSpec, ConversationSpec, LengthSpec, TenantSpec};
use superinfer_loadgen::Target;
use superinfer_policies::PolicyKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers every completion with `" w<n>"` per token, where n counts the requests, and
/// reports 16 cached tokens; keeps the prompts it was sent.
async fn serve(listener: tokio::net::TcpListener, seen: Arc<Mutex<Vec<String>>>) {
    let mut n = 0u64;
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            return;
        };
        n += 1;
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let body = loop {
                let k = sock.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..k]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some(at) = text.find("\r\n\r\n") {
                    let len: usize = text[..at]
                        .lines()
                        .find_map(|l| {
                            let l = l.to_ascii_lowercase();
                            l.strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if buf.len() >= at + 4 + len {
                        break buf[at + 4..at + 4 + len].to_vec();
                    }
                }
            };
            let req: Value = serde_json::from_slice(&body).unwrap();
            seen.lock()
                .unwrap()
                .push(req["prompt"].as_str().unwrap().to_string());
            let tokens = req["max_tokens"].as_u64().unwrap();
            let mut out = String::from(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
            );
            for _ in 0..tokens {
                out.push_str(&format!(
                    "data: {{\"choices\":[{{\"text\":\" w{n}\"}}]}}\n\n"
                ));
            }
            out.push_str(&format!(
                "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":99,\"completion_tokens\":{tokens},\
                 \"prompt_tokens_details\":{{\"cached_tokens\":16}}}}}}\n\ndata: [DONE]\n\n"
            ));
            let _ = sock.write_all(out.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

#[test]
fn follow_up_turns_repeat_the_prompt_and_the_returned_text_exactly() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    rt.spawn(serve(listener, seen.clone()));
    let tenants = vec![TenantSpec {
        system_prompt_tokens: 40,
        conversation: Some(ConversationSpec::new(4.0, 0.05)),
        ..TenantSpec::new(
            "t",
            LengthSpec::Fixed {
                prompt: 12,
                output: 3,
            },
            ArrivalSpec::Poisson { rps: 4.0 },
        )
    }];
    let d = 2.0;
    let reqs = superinfer_loadgen::generate(&tenants, d, 5).unwrap();
    let mut target = HttpTarget::new(HttpTargetConfig {
        base_url: format!("http://{addr}"),
        model: Some("mock".into()),
        default_api_key: None,
        drain_s: 10.0,
    })
    .unwrap();
    target.keep_prompts = true;
    let recs = target.run(PolicyKind::Wlvf, &tenants, &reqs, d).unwrap();
    let by_id: HashMap<u64, _> = recs.iter().map(|r| (r.id, r)).collect();
    let prompts = &target.last_prompts;
    let mut follow_ups = 0;
    for spec in &reqs {
        let Some(rec) = by_id.get(&spec.id) else {
            continue;
        };
        assert_eq!(rec.cached_tokens, Some(16));
        assert_eq!(rec.prompt_tokens, 99, "the server's count");
        let Some(prev) = spec.turn.and_then(|t| t.after) else {
            continue;
        };
        follow_ups += 1;
        let before = &prompts[&prev];
        let answer_at = before.len();
        let prompt = &prompts[&spec.id];
        assert!(
            prompt.starts_with(before.as_str()),
            "{prompt:?} / {before:?}"
        );
        // The returned text: three identical tokens " wN" of one request.
        let rest = &prompt[answer_at..];
        let answer: String = rest.split("\n\nUser: ").next().unwrap().to_string();
        let words: Vec<&str> = answer.split_whitespace().collect();
        assert_eq!(words.len(), 3, "{answer:?}");
        assert!(words.iter().all(|w| *w == words[0] && w.starts_with('w')));
        assert!(rec.arrival_s >= by_id[&prev].finish_s.unwrap());
    }
    assert!(follow_ups >= 3, "{follow_ups}");
    let sent = seen.lock().unwrap();
    assert_eq!(sent.len(), recs.len());
    for p in prompts.values() {
        assert!(sent.contains(p), "the server got exactly the prompt kept");
    }
}
