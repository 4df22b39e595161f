//! The request-field table of `docs/API.md`, walked row by row against a server on the
//! embedded tiny model: every honoured or no-effect field answers 200, every refused one 400
//! naming it. Then what the newer honoured fields do: `logit_bias`, `echo`,
//! `stream_options.continuous_usage_stats`.

use reqwest::StatusCode;
use serde_json::{json, Value};
use superinfer_engine::TextCodec;
use superinfer_tests::{error_message, sse_events, TestOptions, TestServer};

const API: &str = include_str!("../../docs/API.md");

struct Row {
    field: String,
    endpoints: Vec<&'static str>,
    status: String,
    example: Value,
}

/// The rows between `<!-- fields -->` and `<!-- /fields -->`.
fn rows() -> Vec<Row> {
    let start = API
        .find("<!-- fields -->")
        .expect("the table's start marker");
    let end = API
        .find("<!-- /fields -->")
        .expect("the table's end marker");
    API[start..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").map(|c| c.trim_matches(['|', ' '])).collect();
            let endpoints = match cells[1] {
                "both" => vec!["/v1/completions", "/v1/chat/completions"],
                "completions" => vec!["/v1/completions"],
                "chat" => vec!["/v1/chat/completions"],
                other => panic!("endpoint {other:?} in {l}"),
            };
            Row {
                field: cells[0].trim_matches('`').to_owned(),
                endpoints,
                status: cells[2].to_owned(),
                example: serde_json::from_str(cells[3].trim_matches('`')).expect(l),
            }
        })
        .collect()
}

fn base(path: &str) -> Value {
    if path == "/v1/completions" {
        json!({"prompt": "In the beginning", "max_tokens": 3})
    } else {
        json!({"messages": [{"role": "user", "content": "In the beginning"}], "max_tokens": 3})
    }
}

async fn tiny() -> TestServer {
    TestServer::start_with(TestOptions {
        sim_profile: None,
        ..TestOptions::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_the_field_table_is_honoured_or_refused_by_name() {
    let s = tiny().await;
    // Some 120 requests: a tenant whose rate quota does not get in the way.
    let quotas = json!({"requests_per_s": 10000.0, "burst": 10000, "tokens_per_min": 100000000});
    let (_, key) = s
        .create_tenant(json!({"name": "walker", "quotas": quotas}))
        .await;
    let rows = rows();
    assert!(rows.len() >= 60, "{} rows", rows.len());
    for row in &rows {
        for path in &row.endpoints {
            let mut body = base(path);
            let obj = body.as_object_mut().unwrap();
            obj.extend(row.example.as_object().expect("an object").clone());
            let resp = s.post(path, &key, &body).await;
            let status = resp.status();
            let text = resp.text().await.unwrap();
            match row.status.as_str() {
                "honoured" | "no effect" => {
                    assert_eq!(
                        status,
                        StatusCode::OK,
                        "{} on {path}: {body} → {text}",
                        row.field
                    )
                }
                "refused" => {
                    assert_eq!(
                        status,
                        StatusCode::BAD_REQUEST,
                        "{} on {path}: {body} → {text}",
                        row.field
                    );
                    let v: Value = serde_json::from_str(&text).unwrap();
                    error_message(&v);
                    let param = row.field.split('.').next().unwrap();
                    assert_eq!(v["error"]["param"], param, "{path}: {body} → {v}");
                }
                other => panic!("status {other:?} of {}", row.field),
            }
        }
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_echo_and_continuous_usage_do_what_they_say() {
    let s = tiny().await;
    let codec = TextCodec::from_model_dir(&s.dir.path().join("model")).unwrap();
    let id = codec.encode(" the", false).unwrap()[0];
    let body = json!({"prompt": "In the beginning", "max_tokens": 4, "temperature": 0,
                      "ignore_eos": true, "logit_bias": {id.to_string(): 100}});
    let v: Value = s.post_json("/v1/completions", &s.key, &body).await;
    assert_eq!(v["choices"][0]["text"], codec.decode(&[id; 4]), "{v}");

    let body =
        json!({"prompt": "In the beginning", "max_tokens": 4, "echo": true, "ignore_eos": true});
    let v: Value = s.post_json("/v1/completions", &s.key, &body).await;
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("In the beginning") && text.len() > 16,
        "{v}"
    );
    // With `logprobs`: the prompt's tokens lead, the first unscored, each scored by the model
    // (`engine/tests/prompt_logprobs_cpu.rs` checks the values), then the answer's.
    let body = json!({"prompt": "In the beginning", "max_tokens": 4, "echo": true,
                      "logprobs": 2, "ignore_eos": true, "temperature": 0});
    let v = s.post_json("/v1/completions", &s.key, &body).await;
    let lp = &v["choices"][0]["logprobs"];
    let n_prompt = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    let tokens = lp["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.len(), n_prompt + 4, "{v}");
    assert!(
        lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null(),
        "{v}"
    );
    for i in 1..tokens.len() {
        let p = lp["token_logprobs"][i].as_f64().expect("a score");
        assert!(p <= 0.0, "{v}");
        assert_eq!(lp["top_logprobs"][i].as_object().unwrap().len(), 2, "{v}");
    }
    let joined: String = tokens[..n_prompt]
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(joined.trim(), "In the beginning", "{v}");
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert!(
        offsets[0] == 0 && offsets.windows(2).all(|w| w[0] <= w[1]),
        "{offsets:?}"
    );

    let streamed = json!({"prompt": "In the beginning", "max_tokens": 4, "echo": true,
                          "ignore_eos": true, "stream": true});
    let body = s.post_text("/v1/completions", &s.key, &streamed).await;
    let first: Value = serde_json::from_str(&sse_events(&body)[0]).unwrap();
    assert_eq!(first["choices"][0]["text"], "In the beginning", "{first}");

    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                      "ignore_eos": true, "stream": true,
                      "stream_options": {"include_usage": true, "continuous_usage_stats": true}});
    let text = s.post_text("/v1/chat/completions", &s.key, &body).await;
    let events = sse_events(&text);
    let counts: Vec<u64> = events[1..events.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["usage"]["completion_tokens"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    assert_eq!(counts.last(), Some(&4), "{counts:?}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_of_prompts_gives_one_choice_each_streamed_or_not() {
    let s = tiny().await;
    let prompts = ["In the beginning", "And God said", "Let there be light"];
    let one = |p: &str| json!({"prompt": p, "max_tokens": 5, "temperature": 0, "ignore_eos": true});
    let mut alone = Vec::new();
    for p in prompts {
        let v: Value = s.post_json("/v1/completions", &s.key, &one(p)).await;
        alone.push(v["choices"][0]["text"].as_str().unwrap().to_owned());
    }
    let mut body = one("");
    body["prompt"] = json!(prompts);
    let v: Value = s.post_json("/v1/completions", &s.key, &body).await;
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{v}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i, "{v}");
        assert_eq!(c["text"], alone[i], "greedy: the same text as alone ({v})");
    }
    assert_eq!(v["usage"]["completion_tokens"], 15, "{v}");

    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = s.post_text("/v1/completions", &s.key, &body).await;
    let events = sse_events(&text);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let mut streamed = vec![String::new(); 3];
    let mut finishes = 0;
    for e in &events[..events.len() - 2] {
        let v: Value = serde_json::from_str(e).unwrap();
        let c = &v["choices"][0];
        let i = c["index"].as_u64().unwrap() as usize;
        streamed[i].push_str(c["text"].as_str().unwrap());
        finishes += usize::from(c["finish_reason"].is_string());
    }
    assert_eq!(streamed, alone);
    assert_eq!(finishes, 3);
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 15, "{usage}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_per_prompt_differ_by_seed_and_repeat_exactly() {
    let s = tiny().await;
    let body = json!({"prompt": ["In the beginning", "And God said"], "n": 3, "max_tokens": 6,
                      "temperature": 1.0, "seed": 5, "ignore_eos": true});
    let a: Value = s.post_json("/v1/completions", &s.key, &body).await;
    let b: Value = s.post_json("/v1/completions", &s.key, &body).await;
    let texts = |v: &Value| -> Vec<String> {
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(texts(&a).len(), 6, "{a}");
    assert_eq!(texts(&a), texts(&b), "seeded: the same choices again");
    assert_ne!(
        texts(&a)[0],
        texts(&a)[1],
        "choices of one prompt draw from different seeds: {a}"
    );
    // Choice 3 is the second prompt's first: the same as that prompt alone with the seed.
    let alone = json!({"prompt": "And God said", "max_tokens": 6, "temperature": 1.0, "seed": 5,
                       "ignore_eos": true});
    let c: Value = s.post_json("/v1/completions", &s.key, &alone).await;
    assert_eq!(c["choices"][0]["text"], a["choices"][3]["text"], "{a} {c}");
    assert_eq!(a["usage"]["completion_tokens"], 36, "{a}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_n_gives_n_choices_streamed_or_not() {
    let s = tiny().await;
    let body = json!({"messages": [{"role": "user", "content": "In the beginning"}],
                      "n": 3, "max_tokens": 5, "temperature": 1.0, "seed": 2, "ignore_eos": true});
    let v: Value = s.post_json("/v1/chat/completions", &s.key, &body).await;
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3, "{v}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i, "{v}");
        assert_eq!(c["message"]["role"], "assistant");
        assert!(c["message"]["content"].is_string());
        assert_eq!(c["finish_reason"], "length");
    }
    assert_ne!(choices[0]["message"], choices[1]["message"], "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 15, "{v}");
    // Streamed: each choice opens with its role, its deltas carry its index, and they add up
    // to the same choices (seeded).
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let text = s.post_text("/v1/chat/completions", &s.key, &streamed).await;
    let mut contents = vec![String::new(); 3];
    let mut roles = 0;
    let mut finishes = 0;
    for e in sse_events(&text) {
        if e == "[DONE]" {
            continue;
        }
        let c: Value = serde_json::from_str(&e).unwrap();
        let c = &c["choices"][0];
        let i = c["index"].as_u64().unwrap() as usize;
        roles += usize::from(c["delta"]["role"] == "assistant");
        finishes += usize::from(!c["finish_reason"].is_null());
        if let Some(t) = c["delta"]["content"].as_str() {
            contents[i].push_str(t);
        }
    }
    assert_eq!((roles, finishes), (3, 3), "{text}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["message"]["content"], contents[i], "{text}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_of_returns_the_candidates_with_the_highest_mean_logprob() {
    let s = tiny().await;
    let body = json!({"prompt": "In the beginning", "max_tokens": 4, "temperature": 1.0,
                      "seed": 11, "ignore_eos": true, "best_of": 4, "n": 2});
    let v: Value = s.post_json("/v1/completions", &s.key, &body).await;
    let got: Vec<&str> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(got.len(), 2, "{v}");
    assert_eq!(
        v["usage"]["completion_tokens"], 16,
        "all four candidates count: {v}"
    );
    // Candidate j draws from seed + j: each alone, with its log-probabilities, to rank them.
    let mut ranked = Vec::new();
    for j in 0..4 {
        let one = json!({"prompt": "In the beginning", "max_tokens": 4, "temperature": 1.0,
                         "seed": 11 + j, "ignore_eos": true, "logprobs": 0});
        let c: Value = s.post_json("/v1/completions", &s.key, &one).await;
        let lps = c["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap();
        let mean = lps.iter().map(|x| x.as_f64().unwrap()).sum::<f64>() / lps.len() as f64;
        ranked.push((mean, c["choices"][0]["text"].as_str().unwrap().to_owned()));
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    assert_eq!(
        got,
        [ranked[0].1.as_str(), ranked[1].1.as_str()],
        "{ranked:?}"
    );
    s.shutdown().await;
}
