//! The HTTP target: any OpenAI-compatible server (superinfer, vLLM, …) over the network.
//! Each request goes to `POST /v1/completions` at its arrival time, streamed, with the tenant's
//! own key, `max_tokens` set to the requested output length and `ignore_eos` (honoured by
//! superinfer and vLLM, ignored by servers without it), and a prompt of real words, about one
//! per requested token: the tenant's system prompt, then the user message in a plain
//! `User: … \nAssistant:` frame. A follow-up turn of a conversation is sent its think time
//! after the previous turn's stream ended, with exactly the previous prompt, the text the
//! server returned and the new message, so any server's prefix cache can hit. Times are
//! measured here, on the client: the first token is the first chunk with text, and every chunk
//! with text is one token time (a server that sends several tokens per chunk is measured per
//! chunk; the `usage` of the last chunk, when sent, gives the true output and prompt counts
//! and, as `prompt_tokens_details.cached_tokens`, the cached prompt tokens). A request refused
//! with an HTTP error, or ended by an error event, ends then (its `finish_s`), as in the twin: its
//! wait is the client's, not the run's.
//!
//! The scheduling policy is the server's; the policy passed to [`Target::run`] is only the
//! report's label.

mod gpu_time;

use super::Target;
use crate::record::RequestRecord;
use crate::workload::conversation::{first_prompt_text, next_prompt_text};
use crate::workload::{RequestSpec, TenantSpec};
use anyhow::{bail, Context};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
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
    /// Keep every prompt sent (for tests of the content): see `last_prompts`.
    pub keep_prompts: bool,
    /// The prompt text of every request of the last run, by id, when `keep_prompts` is set.
    pub last_prompts: HashMap<u64, String>,
    /// Each tenant's GPU time in the last run, where the server reports it (`gpu_time`).
    last_gpu_s: Option<Vec<f64>>,
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
            keep_prompts: false,
            last_prompts: HashMap::new(),
            last_gpu_s: None,
        })
    }

    /// The served model's context (`max_model_len` of GET /v1/models, as this project's
    /// server and vLLM give it), asked with the default key or else the first of `tenants`'
    /// keys; `None` when the server does not say.
    pub fn context_tokens(&self, tenants: &[TenantSpec]) -> Option<u32> {
        let key = self.cfg.default_api_key.clone().or_else(|| {
            tenant_keys(tenants, None)
                .ok()
                .and_then(|keys| keys.into_iter().flatten().next())
        });
        let mut req = self.client.get(format!("{}/v1/models", self.cfg.base_url));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        self.runtime.block_on(async {
            let body: Value = req.send().await.ok()?.json().await.ok()?;
            let models = body["data"].as_array()?;
            let model = match &self.cfg.model {
                Some(m) => models.iter().find(|v| v["id"].as_str() == Some(m))?,
                None => models.first()?,
            };
            u32::try_from(model["max_model_len"].as_u64()?).ok()
        })
    }

    /// The server's GPU seconds by tenant now (`gpu_time`); `None` when it has no such series
    /// or no `/metrics` on this address.
    async fn gpu_seconds(&self) -> Option<HashMap<String, f64>> {
        let url = format!("{}/metrics", self.cfg.base_url);
        let answer = self.client.get(url).timeout(Duration::from_secs(10)).send();
        let answer = answer.await.ok()?.error_for_status().ok()?;
        gpu_time::parse(&answer.text().await.ok()?)
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

/// A refusal's kind, for the run's failure summary: its status and the OpenAI error's message
/// (at most 160 characters) with every number written `N`, so that refusals for one reason
/// count together whatever their sizes.
fn refusal_reason(status: u16, body: Option<&[u8]>) -> String {
    let message = body
        .and_then(|b| serde_json::from_slice::<Value>(b).ok())
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned));
    let Some(message) = message else {
        return format!("HTTP {status}");
    };
    let mut out = String::new();
    let mut in_number = false;
    for c in message.chars().take(160) {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('N');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    format!("HTTP {status}: {out}")
}

/// What the server sent back for one request.
struct Reply {
    rec: RequestRecord,
    failure: Option<String>,
    /// The streamed text, concatenated.
    text: String,
}

struct Send<'a> {
    client: &'a reqwest::Client,
    url: &'a str,
    model: &'a str,
    key: Option<&'a str>,
    start: Instant,
    end: Instant,
    duration_s: f64,
    keep_prompts: bool,
    prompts: &'a Mutex<HashMap<u64, String>>,
}

/// Sends one request at `at` (seconds on the run's clock) with `prompt` and records what the
/// client saw.
async fn one(s: &Send<'_>, spec: &RequestSpec, at: f64, prompt: Value) -> Reply {
    let mut rec = RequestRecord::unserved(spec);
    rec.arrival_s = at;
    let mut text = String::new();
    let fail = |rec, text, why: &str| Reply {
        rec,
        failure: Some(why.into()),
        text,
    };
    tokio::time::sleep_until(s.start + Duration::from_secs_f64(at)).await;
    let body = json!({
        "model": s.model,
        "prompt": prompt,
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
        Err(_) => return fail(rec, text, "timed out"),
        Ok(Err(e)) => return fail(rec, text, &transport(&e)),
        Ok(Ok(r)) => r,
    };
    if !resp.status().is_success() {
        let status = resp.status().as_u16();
        rec.refused = Some(status);
        // It ended here: the client waited this long, not to the end of the run.
        rec.finish_s = Some(s.start.elapsed().as_secs_f64());
        let why = refusal_reason(status, resp.bytes().await.ok().as_deref());
        return fail(rec, text, &why);
    }
    let mut bytes = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut usage: Option<Value> = None;
    loop {
        let chunk = match tokio::time::timeout_at(s.end, bytes.next()).await {
            Err(_) => return fail(rec, text, "cut at the end of the run"),
            Ok(None) => return fail(rec, text, "stream ended without [DONE]"),
            Ok(Some(Err(e))) => return fail(rec, text, &transport(&e)),
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
                if let Some(u) = &usage {
                    apply_usage(&mut rec, u);
                }
                return Reply {
                    rec,
                    failure: None,
                    text,
                };
            }
            let Ok(v) = serde_json::from_slice::<Value>(data) else {
                continue;
            };
            if v.get("error").is_some() {
                rec.finish_s = Some(now);
                return fail(rec, text, "error event in the stream");
            }
            if v["usage"].is_object() {
                usage = Some(v["usage"].clone());
            }
            let piece = v["choices"][0]["text"].as_str().unwrap_or("");
            if !piece.is_empty() {
                text.push_str(piece);
                rec.first_token_s.get_or_insert(now);
                rec.token_times_s.push(now);
                rec.generated_tokens += 1;
            }
        }
    }
}

/// The server's own counts from `usage`: output and prompt tokens, and the cached prompt
/// tokens when it reports them (missing means unknown, not 0). The tier is not in OpenAI's
/// usage, so DRAM hits stay unknown.
pub fn apply_usage(rec: &mut RequestRecord, usage: &Value) {
    if let Some(n) = usage["completion_tokens"].as_u64() {
        rec.generated_tokens = n as u32;
    }
    if let Some(n) = usage["prompt_tokens"].as_u64() {
        rec.prompt_tokens = n as u32;
    }
    if let Some(n) = usage["prompt_tokens_details"]["cached_tokens"].as_u64() {
        rec.cached_tokens = Some(n as u32);
    }
}

/// Sends a conversation (or a single request: a chain of one) turn by turn: each follow-up
/// its think time after the previous reply ended, if that is inside the arrival window and
/// the previous turn completed. Returns the records of the turns sent.
async fn chain(s: Send<'_>, requests: Vec<RequestSpec>, system: (u64, u32)) -> Vec<Reply> {
    let mut replies: Vec<Reply> = Vec::new();
    let mut prompt = String::new();
    for (k, spec) in requests.iter().enumerate() {
        let at;
        prompt = match replies.last() {
            None => {
                at = spec.arrival_s;
                first_prompt_text(system.0, system.1, spec.content_seed, spec.message_tokens)
            }
            Some(prev) => {
                let (Some(done), None) = (prev.rec.finish_s, &prev.failure) else {
                    break;
                };
                at = done + spec.turn.map_or(0.0, |t| t.think_s);
                if at >= s.duration_s {
                    break;
                }
                next_prompt_text(&prompt, &prev.text, spec.content_seed, spec.message_tokens)
            }
        };
        // A replayed trace row is sent as token ids, so the server never re-tokenizes it.
        let body = match &spec.blocks {
            Some(b) => json!(b.prompt_ids(spec.content_seed, spec.prompt_tokens)),
            None => Value::String(prompt.clone()),
        };
        if s.keep_prompts {
            let kept = body.as_str().map_or_else(|| body.to_string(), String::from);
            s.prompts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(spec.id, kept);
        }
        debug_assert!(k == 0 || spec.turn.is_some());
        replies.push(one(&s, spec, at, body).await);
    }
    replies
}

/// The requests grouped by conversation, each group in turn order; a single request is a
/// group of one.
fn chains(requests: &[RequestSpec]) -> Vec<Vec<RequestSpec>> {
    let mut groups: Vec<Vec<RequestSpec>> = Vec::new();
    let mut by_id: HashMap<u64, usize> = HashMap::new();
    for r in requests {
        match r
            .turn
            .and_then(|t| t.after)
            .and_then(|prev| by_id.get(&prev).copied())
        {
            Some(g) => {
                groups[g].push(r.clone());
                by_id.insert(r.id, g);
            }
            None => {
                by_id.insert(r.id, groups.len());
                groups.push(vec![r.clone()]);
            }
        }
    }
    groups
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
    fn tenant_gpu_seconds(&self) -> Option<Vec<f64>> {
        self.last_gpu_s.clone()
    }

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
            let gpu_before = self.gpu_seconds().await;
            let start = Instant::now();
            let end = start + Duration::from_secs_f64(duration_s + self.cfg.drain_s.max(0.0));
            let prompts = Mutex::new(HashMap::new());
            let sends = chains(requests).into_iter().map(|chained| {
                let tenant = &tenants[chained[0].tenant];
                let send = Send {
                    client: &self.client,
                    url: &url,
                    model: &model,
                    key: keys[chained[0].tenant].as_deref(),
                    start,
                    end,
                    duration_s,
                    keep_prompts: self.keep_prompts,
                    prompts: &prompts,
                };
                let system = (tenant.system_seed(), tenant.system_prompt_tokens);
                let failures = failures.clone();
                async move {
                    let replies = chain(send, chained, system).await;
                    let mut m = failures.lock().unwrap_or_else(|p| p.into_inner());
                    for f in replies.iter().filter_map(|r| r.failure.clone()) {
                        *m.entry(f).or_default() += 1;
                    }
                    replies.into_iter().map(|r| r.rec).collect::<Vec<_>>()
                }
            });
            let records = futures_util::future::join_all(sends).await;
            let prompts = prompts.into_inner().unwrap_or_else(|p| p.into_inner());
            let gpu = gpu_time::between(
                gpu_before.as_ref(),
                self.gpu_seconds().await.as_ref(),
                tenants.iter().map(|t| &t.name),
            );
            let records = records.into_iter().flatten().collect::<Vec<_>>();
            anyhow::Ok((records, prompts, gpu))
        })?;
        let (records, prompts, gpu) = records;
        self.last_gpu_s = gpu;
        self.last_prompts = prompts;
        self.last_failures = failures.lock().map(|m| m.clone()).unwrap_or_default();
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{ArrivalSpec, LengthSpec};

    #[test]
    fn a_refusal_is_summed_by_its_status_and_message_whatever_its_numbers() {
        let body = |n: u32| {
            format!(
                r#"{{"error":{{"message":"this model's maximum context length is 8192 tokens, but {n} were requested","type":"invalid_request_error"}}}}"#
            )
        };
        let a = refusal_reason(400, Some(body(23770).as_bytes()));
        assert_eq!(a, refusal_reason(400, Some(body(9000).as_bytes())));
        assert_eq!(
            a,
            "HTTP 400: this model's maximum context length is N tokens, but N were requested"
        );
        assert_eq!(refusal_reason(503, Some(b"not json")), "HTTP 503");
        assert_eq!(refusal_reason(502, None), "HTTP 502");
    }

    #[test]
    fn usage_gives_the_servers_counts_and_a_missing_cached_count_stays_unknown() {
        let spec = crate::workload::generate(
            &[TenantSpec::new(
                "t",
                LengthSpec::Fixed {
                    prompt: 10,
                    output: 5,
                },
                ArrivalSpec::Poisson { rps: 5.0 },
            )],
            2.0,
            1,
        )
        .unwrap()[0]
            .clone();
        let mut rec = RequestRecord::unserved(&spec);
        apply_usage(
            &mut rec,
            &json!({"prompt_tokens": 12, "completion_tokens": 5}),
        );
        assert_eq!((rec.prompt_tokens, rec.generated_tokens), (12, 5));
        assert_eq!(rec.cached_tokens, None);
        let usage = json!({"prompt_tokens": 40, "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 32}});
        apply_usage(&mut rec, &usage);
        assert_eq!((rec.prompt_tokens, rec.cached_tokens), (40, Some(32)));
        assert_eq!(rec.cached_dram_tokens, None);
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
