//! Property test of the request parser and validator over arbitrary input: raw bytes, JSON
//! values of any shape, and valid bodies with fields replaced by random values. For every
//! input, parsing and validation (with the tiny model's real tokenizer and the word stand-in)
//! must not panic, must refuse with a 4xx in OpenAI's error shape, or must produce a request
//! within every limit.
//!
//! CI runs [`CI_CASES`] inputs per strategy. The long run (`--ignored`, 1,000,000 inputs in
//! all; docs/BENCHMARKS.md records its result):
//! `cargo test -p superinfer-gateway --test request_fuzz -- --ignored --nocapture`

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Map, Value};
use std::sync::OnceLock;
use superinfer_gateway::text::Text;
use superinfer_gateway::validate::{self, Endpoint, ModelInfo};
use superinfer_tenants::{Quotas, Slo, Tenant, TenantId};

const CI_CASES: u32 = 3_000;
const LONG_CASES: u32 = 1_000_000 / 3 + 1;

fn tiny() -> &'static Text {
    static TEXT: OnceLock<(tempfile::TempDir, Text)> = OnceLock::new();
    &TEXT
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("a temporary directory");
            superinfer_engine::model::tiny::write_tiny_model(dir.path(), 0).expect("tiny model");
            let codec = superinfer_engine::TextCodec::from_model_dir(dir.path()).expect("codec");
            (dir, Text::model(codec))
        })
        .1
}

fn tenant() -> Tenant {
    Tenant {
        id: TenantId(1),
        name: "fuzz".into(),
        slo: Slo::default(),
        weight: 1.0,
        quotas: Quotas {
            max_prompt_tokens: 64,
            max_output_tokens: 32,
            ..Quotas::default()
        },
        enabled: true,
        created_at_ms: 0,
        cache_namespace: None,
    }
}

const MODEL: &str = "m";

/// The property: no panic; a refusal is a 4xx in OpenAI's shape; a request is within limits.
fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    let model = ModelInfo {
        id: MODEL.into(),
        max_model_len: 96,
        prompt_logprobs: false,
    };
    let t = tenant();
    for endpoint in [Endpoint::Completions, Endpoint::Chat] {
        for text in [tiny(), &Text::words()] {
            let r = validate::parse(bytes)
                .and_then(|b| validate::validate(endpoint, b, &t, &model, text));
            match r {
                Ok(v) => {
                    let n = v.prompt.len() as u32;
                    prop_assert!(n >= 1 && n <= t.quotas.max_prompt_tokens);
                    prop_assert!(v.max_tokens >= 1 && v.max_tokens <= t.quotas.max_output_tokens);
                    prop_assert!(n + v.max_tokens <= model.max_model_len);
                }
                Err(e) => {
                    prop_assert!(e.status().is_client_error(), "{} for {:?}", e.status(), e);
                    let body = serde_json::to_value(e.body()).expect("serializable");
                    prop_assert!(body["error"]["message"]
                        .as_str()
                        .is_some_and(|m| !m.is_empty()));
                    prop_assert!(body["error"]["type"].is_string());
                }
            }
        }
    }
    Ok(())
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|x| json!(x)),
        (0u32..5000).prop_map(|n| json!(n)),
        "\\PC{0,24}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((field(), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

const FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "stream",
    "stream_options",
    "n",
    "best_of",
    "echo",
    "suffix",
    "logprobs",
    "top_logprobs",
    "tools",
    "user",
    "priority",
    "role",
    "content",
    "type",
    "text",
    "include_usage",
];

fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(FIELDS).prop_map(str::to_string),
        1 => "\\PC{0,8}",
    ]
}

/// A valid body with some fields replaced, added or removed.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    let base = prop_oneof![
        Just(json!({"model": MODEL, "prompt": "hello there", "max_tokens": 4})),
        Just(json!({"prompt": [1, 2, 3], "max_tokens": 3, "stream": true,
                    "stream_options": {"include_usage": true}, "logprobs": 2})),
        Just(
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                    "logprobs": true, "top_logprobs": 3, "stop": ["x"]})
        ),
    ];
    (
        base,
        prop::collection::vec((field(), json_value(), any::<bool>()), 0..4),
    )
        .prop_map(|(mut body, edits)| {
            let obj = body.as_object_mut().expect("an object");
            for (k, v, remove) in edits {
                if remove {
                    obj.remove(&k);
                } else {
                    obj.insert(k, v);
                }
            }
            serde_json::to_vec(&body).expect("serializable")
        })
}

fn run(cases: u32) {
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let strategies: [(&str, BoxedStrategy<Vec<u8>>); 3] = [
        ("bytes", prop::collection::vec(any::<u8>(), 0..256).boxed()),
        (
            "json",
            json_value()
                .prop_map(|v| serde_json::to_vec(&v).expect("serializable"))
                .boxed(),
        ),
        ("mutated", mutated().boxed()),
    ];
    for (name, strategy) in strategies {
        let mut runner = TestRunner::new(config.clone());
        if let Err(e) = runner.run(&strategy, |bytes| check(&bytes)) {
            panic!("{name}: {e}");
        }
    }
}

#[test]
fn arbitrary_input_is_parsed_or_refused_cleanly() {
    run(CI_CASES);
}

#[test]
#[ignore = "the long run: 1,000,000 inputs; see docs/BENCHMARKS.md"]
fn arbitrary_input_is_parsed_or_refused_cleanly_long() {
    let t0 = std::time::Instant::now();
    run(LONG_CASES);
    eprintln!(
        "{} inputs in {:?}, no failure",
        LONG_CASES * 3,
        t0.elapsed()
    );
}
