//! The HTTP target: any OpenAI-compatible server (superinfer, vLLM, …) over the network.
//! Each request goes to `POST /v1/completions` at its arrival time, streamed, with the tenant's
//! own key, `max_tokens` set to the requested output length and `ignore_eos` (honoured by
//! superinfer and vLLM, ignored by servers without it), and a prompt of about the requested
//! length (one common word per token). Times are measured here, on the client: the first
//! token is the first chunk with text, and every chunk with text is one token time (a server
//! that sends several tokens per chunk is measured per chunk; the `usage` of the last chunk,
//! when sent, gives the true output count).
//!
//! The scheduling policy is the server's; the policy passed to [`Target::run`] is only the
//! report's label.

use super::Target;
use crate::record::RequestRecord;
use crate::workload::{RequestSpec, TenantSpec};
use anyhow::{bail, Context};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use superinfer_policies::PolicyKind;
use tokio::time::Instant;

/// Where and how to send.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpTargetConfig {
    /// Base URL, e.g. `http://127.0.0.1:8000` (with or without a trailing `/v1`).
    pub base_url: String,
    /// Model to ask for; `None`: the first of `GET /v1/models`.
    pub model: Option<String>,
    /// Key for tenants whose spec has neither `api_key` nor `api_key_env`.
    pub default_api_key: Option<String>,
    /// After the last arrival, wait at most this long; requests not finished by then are
    /// cut (and count as misses where they missed).
    pub drain_s: f64,
}

/// Sends workloads to a server.
pub struct HttpTarget {
    cfg: HttpTargetConfig,
    client: reqwest::Client,
    runtime: tokio::runtime::Runtime,
    /// Failures of the last run by kind (HTTP status or transport error), for the summary.
    pub last_failures: BTreeMap<String, u64>,
}

impl HttpTarget {
    pub fn new(mut cfg: HttpTargetConfig) -> anyhow::Result<HttpTarget> {
        let trimmed = cfg.base_url.trim_end_matches('/');
        cfg.base_url = trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string();
        if !(cfg.base_url.starts_with("http://") || cfg.base_url.starts_with("https://")) {
            bail!(
                "--target must be an http:// or https:// URL, got {}",
                cfg.base_url
            );
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()?;
        Ok(HttpTarget {
            cfg,
            client,
            runtime,
            last_failures: BTreeMap::new(),
        })
    }

    async fn model(&self, key: Option<&str>) -> anyhow::Result<String> {
        if let Some(m) = &self.cfg.model {
            return Ok(m.clone());
        }
        let mut req = self.client.get(format!("{}/v1/models", self.cfg.base_url));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.context("GET /v1/models")?;
        let status = resp.status();
        let body: Value = resp.json().await.context("GET /v1/models: not JSON")?;
        body["data"][0]["id"]
            .as_str()
            .map(String::from)
            .with_context(|| format!("GET /v1/models answered {status} without a model: {body}"))
    }
}

/// Each tenant's key: `api_key`, else the variable `api_key_env`, else the default.
pub fn tenant_keys(
    tenants: &[TenantSpec],
    default: Option<&str>,
) -> anyhow::Result<Vec<Option<String>>> {
    tenants
        .iter()
        .map(|t| match (&t.api_key, &t.api_key_env) {
            (Some(k), _) => Ok(Some(k.clone())),
            (None, Some(var)) => std::env::var(var).map(Some).with_context(|| {
                format!(
                    "tenant '{}': api_key_env names {var}, which is not set",
                    t.name
                )
            }),
            (None, None) => Ok(default.map(String::from)),
        })
        .collect()
}

/// About `tokens` tokens of text for common tokenizers: one short common word per token,
/// led by the request id so that prompts differ (no accidental prefix sharing).
pub fn prompt_text(id: u64, tokens: u32) -> String {
    const WORDS: &[&str] = &[
        "the", "of", "and", "to", "in", "is", "that", "it", "for", "on",
    ];
    let mut s = format!("{id}");
    for i in 1..tokens.max(1) as usize {
        s.push(' ');
        s.push_str(WORDS[i % WORDS.len()]);
    }
    s
}

struct Send<'a> {
    client: &'a reqwest::Client,
    url: &'a str,
    model: &'a str,
    key: Option<&'a str>,
    start: Instant,
    end: Instant,
}

/// Sends one request at its arrival time and records what the client saw.
async fn one(s: Send<'_>, spec: RequestSpec) -> (RequestRecord, Option<String>) {
    let mut rec = RequestRecord::unserved(&spec);
    tokio::time::sleep_until(s.start + Duration::from_secs_f64(spec.arrival_s)).await;
    let body = json!({
        "model": s.model,
        "prompt": prompt_text(spec.id, spec.prompt_tokens),
        "max_tokens": spec.output_tokens,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let mut req = s.client.post(s.url).json(&body);
    if let Some(k) = s.key {
        req = req.bearer_auth(k);
    }
    let resp = match tokio::time::timeout_at(s.end, req.send()).await {
        Err(_) => return (rec, Some("timed out".into())),
        Ok(Err(e)) => return (rec, Some(transport(&e))),
        Ok(Ok(r)) => r,
    };
    if !resp.status().is_success() {
        return (rec, Some(format!("HTTP {}", resp.status().as_u16())));
    }
    let mut bytes = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut usage = None;
    loop {
        let chunk = match tokio::time::timeout_at(s.end, bytes.next()).await {
            Err(_) => return (rec, Some("cut at the end of the run".into())),
            Ok(None) => return (rec, Some("stream ended without [DONE]".into())),
            Ok(Some(Err(e))) => return (rec, Some(transport(&e))),
            Ok(Some(Ok(c))) => c,
        };
        let now = s.start.elapsed().as_secs_f64();
        buf.extend_from_slice(&chunk);
        while let Some(at) = find(&buf, b"\n\n") {
            let event: Vec<u8> = buf.drain(..at + 2).collect();
            let Some(data) = event.strip_prefix(b"data: ") else {
                continue;
            };
            let data = &data[..data.len() - 2];
            if data == b"[DONE]" {
                rec.finish_s = Some(now);
                if let Some(n) = usage {
                    rec.generated_tokens = n;
                }
                return (rec, None);
            }
            let Ok(v) = serde_json::from_slice::<Value>(data) else {
                continue;
            };
            if v.get("error").is_some() {
                return (rec, Some("error event in the stream".into()));
            }
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                usage = Some(n as u32);
            }
            let text = v["choices"][0]["text"].as_str().unwrap_or("");
            if !text.is_empty() {
                rec.first_token_s.get_or_insert(now);
                rec.token_times_s.push(now);
                rec.generated_tokens += 1;
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn transport(e: &reqwest::Error) -> String {
    if e.is_connect() {
        "connection refused or failed".into()
    } else if e.is_timeout() {
        "timed out".into()
    } else {
        "transport error".into()
    }
}

impl Target for HttpTarget {
    fn run(
        &mut self,
        _policy: PolicyKind,
        tenants: &[TenantSpec],
        requests: &[RequestSpec],
        duration_s: f64,
    ) -> anyhow::Result<Vec<RequestRecord>> {
        let keys = tenant_keys(tenants, self.cfg.default_api_key.as_deref())?;
        let failures = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
        let records = self.runtime.block_on(async {
            let model = self
                .model(keys.iter().flatten().next().map(String::as_str))
                .await?;
            let url = format!("{}/v1/completions", self.cfg.base_url);
            let start = Instant::now();
            let end = start + Duration::from_secs_f64(duration_s + self.cfg.drain_s.max(0.0));
            let sends = requests.iter().map(|spec| {
                let send = Send {
                    client: &self.client,
                    url: &url,
                    model: &model,
                    key: keys[spec.tenant].as_deref(),
                    start,
                    end,
                };
                let failures = failures.clone();
                async move {
                    let (rec, failure) = one(send, *spec).await;
                    if let Some(f) = failure {
                        let mut m = failures.lock().unwrap_or_else(|p| p.into_inner());
                        *m.entry(f).or_default() += 1;
                    }
                    rec
                }
            });
            anyhow::Ok(futures_util::future::join_all(sends).await)
        })?;
        self.last_failures = failures.lock().map(|m| m.clone()).unwrap_or_default();
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{ArrivalSpec, LengthSpec};

    #[test]
    fn prompts_have_one_word_per_requested_token() {
        assert_eq!(prompt_text(7, 5).split_whitespace().count(), 5);
        assert_eq!(prompt_text(7, 0), "7");
        assert_ne!(prompt_text(1, 10), prompt_text(2, 10));
    }

    #[test]
    fn keys_come_from_the_spec_the_environment_or_the_default() {
        let mut a = TenantSpec::new(
            "a",
            LengthSpec::Fixed {
                prompt: 1,
                output: 1,
            },
            ArrivalSpec::Poisson { rps: 1.0 },
        );
        let mut b = a.clone();
        b.name = "b".into();
        let c = TenantSpec {
            name: "c".into(),
            ..a.clone()
        };
        a.api_key = Some("sk-a".into());
        b.api_key_env = Some("SUPERINFER_LOADGEN_TEST_KEY_UNSET".into());
        let e = tenant_keys(&[a.clone(), b], None).unwrap_err().to_string();
        assert!(e.contains("not set"), "{e}");
        let keys = tenant_keys(&[a, c], Some("sk-default")).unwrap();
        assert_eq!(keys, [Some("sk-a".into()), Some("sk-default".into())]);
    }

    #[test]
    fn the_base_url_is_normalized_and_checked() {
        let cfg = |u: &str| HttpTargetConfig {
            base_url: u.into(),
            model: None,
            default_api_key: None,
            drain_s: 1.0,
        };
        assert_eq!(
            HttpTarget::new(cfg("http://h:1/v1/")).unwrap().cfg.base_url,
            "http://h:1"
        );
        assert!(HttpTarget::new(cfg("h:1")).is_err());
    }
}
