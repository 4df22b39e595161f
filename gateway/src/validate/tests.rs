use super::*;
use superinfer_tenants::{Quotas, Slo, TenantId};

fn tenant() -> Tenant {
    Tenant {
        id: TenantId(1),
        name: "t".into(),
        slo: Slo::default(),
        weight: 1.0,
        quotas: Quotas {
            max_prompt_tokens: 10,
            max_output_tokens: 100,
            ..Quotas::default()
        },
        enabled: true,
        created_at_ms: 0,
        cache_namespace: None,
    }
}

fn model() -> ModelInfo {
    ModelInfo {
        id: "m".into(),
        max_model_len: 50,
        prompt_logprobs: false,
    }
}

fn check(endpoint: Endpoint, json: &str) -> Result<ValidRequest> {
    check_with(endpoint, json, &model(), &Text::words())
}

/// [`check`] against another model or text backend.
fn check_with(endpoint: Endpoint, json: &str, m: &ModelInfo, text: &Text) -> Result<ValidRequest> {
    let body = parse(json.as_bytes())?;
    validate(endpoint, body, &tenant(), m, text)
}

fn param_of(r: Result<ValidRequest>) -> String {
    match r.unwrap_err() {
        GatewayError::InvalidRequest { param, .. } => param.unwrap_or_default(),
        e => panic!("not a 400: {e}"),
    }
}

#[test]
fn a_plain_completion_gets_the_defaults() {
    let v = check(Endpoint::Completions, r#"{"model":"m","prompt":"a b c"}"#).unwrap();
    assert_eq!(v.prompt.len(), 3);
    assert_eq!(v.max_tokens, DEFAULT_COMPLETION_TOKENS);
    assert_eq!(v.sampling.temperature, 1.0);
    assert!(!v.stream);
}

#[test]
fn chat_defaults_to_the_room_left_in_the_context() {
    let v = check(
        Endpoint::Chat,
        r#"{"messages":[{"role":"user","content":"hi"}]}"#,
    )
    .unwrap();
    // role + 1 word + assistant = 3 prompt tokens; 50 - 3 = 47 < the tenant's 100.
    assert_eq!(v.max_tokens, 47);
}

#[test]
fn wrong_types_name_the_field() {
    assert_eq!(
        param_of(check(
            Endpoint::Completions,
            r#"{"prompt":"a","max_tokens":"x"}"#
        )),
        "max_tokens"
    );
    assert_eq!(
        param_of(check(Endpoint::Completions, r#"{"prompt":5}"#)),
        "prompt"
    );
    assert_eq!(
        param_of(check(Endpoint::Chat, r#"{"messages":[{"role":1}]}"#)),
        "messages"
    );
}

#[test]
fn malformed_json_and_non_objects_are_400s() {
    for body in ["{", "", "[1,2]", "null", "\"x\""] {
        let e = check(Endpoint::Completions, body).unwrap_err();
        assert_eq!(e.status(), 400, "{body}: {e}");
    }
}

#[test]
fn limits_of_the_tenant_and_the_model() {
    let long = ["w"; 11].join(" ");
    let r = check(Endpoint::Completions, &format!(r#"{{"prompt":"{long}"}}"#));
    assert!(r.unwrap_err().to_string().contains("max_prompt_tokens"));
    let r = check(Endpoint::Completions, r#"{"prompt":"a","max_tokens":101}"#);
    assert!(r.unwrap_err().to_string().contains("max_output_tokens"));
    let r = check(Endpoint::Completions, r#"{"prompt":"a","max_tokens":50}"#);
    assert!(r
        .unwrap_err()
        .to_string()
        .contains("maximum context length is 50"));
    assert_eq!(
        param_of(check(
            Endpoint::Completions,
            r#"{"prompt":"a","max_tokens":0}"#
        )),
        "max_tokens"
    );
    assert_eq!(
        param_of(check(Endpoint::Completions, r#"{"prompt":""}"#)),
        "prompt"
    );
    assert_eq!(
        param_of(check(Endpoint::Completions, r#"{"prompt":[]}"#)),
        "prompt"
    );
}

#[test]
fn sampling_values_out_of_range_are_refused() {
    for (field, value) in [
        ("temperature", "2.5"),
        ("temperature", "-1"),
        ("top_p", "0"),
        ("top_p", "1.5"),
        ("min_p", "2"),
        ("top_k", "-2"),
        ("frequency_penalty", "3"),
        ("presence_penalty", "-3"),
        ("repetition_penalty", "0"),
    ] {
        let body = format!(r#"{{"prompt":"a","{field}":{value}}}"#);
        assert_eq!(
            param_of(check(Endpoint::Completions, &body)),
            field,
            "{body}"
        );
    }
}

#[test]
fn unknown_model_is_a_404_and_unknown_fields_are_refused_by_name() {
    let e = check(Endpoint::Completions, r#"{"model":"gpt-9","prompt":"a"}"#).unwrap_err();
    assert_eq!(e.status(), 404);
    let body = r#"{"prompt":"a","frobnicate":1}"#;
    assert_eq!(param_of(check(Endpoint::Completions, body)), "frobnicate");
    let body = r#"{"prompt":"a","stream":true,"stream_options":{"include_usage":true,"x":1}}"#;
    assert_eq!(
        param_of(check(Endpoint::Completions, body)),
        "stream_options"
    );
    // Refused fields at their "off" value are accepted.
    let off = r#"{"prompt":"a","response_format":{"type":"text"},"store":false,"n":1}"#;
    assert!(check(Endpoint::Completions, off).is_ok());
    assert_eq!(
        param_of(check(
            Endpoint::Completions,
            r#"{"prompt":"a","response_format":{"type":"json_object"}}"#
        )),
        "response_format"
    );
}

#[test]
fn echo_logit_bias_and_min_tokens_are_checked() {
    let v = check(Endpoint::Completions, r#"{"prompt":"a b","echo":true}"#).unwrap();
    assert!(v.echo.is_some());
    let v = check(
        Endpoint::Completions,
        r#"{"prompt":"a","logit_bias":{"7":-100,"3":2.5},"min_tokens":2,"stop_token_ids":[5]}"#,
    )
    .unwrap();
    assert_eq!(v.sampling.logit_bias, vec![(3, 2.5), (7, -100.0)]);
    assert_eq!(
        (v.sampling.min_tokens, v.sampling.min_tokens_stops.clone()),
        (2, vec![5])
    );
    for (field, body) in [
        ("echo", r#"{"prompt":"a","echo":true,"logprobs":1}"#),
        ("logit_bias", r#"{"prompt":"a","logit_bias":{"x":1}}"#),
        ("logit_bias", r#"{"prompt":"a","logit_bias":{"1":101}}"#),
        (
            "min_tokens",
            r#"{"prompt":"a","max_tokens":2,"min_tokens":3}"#,
        ),
        ("min_tokens", r#"{"prompt":"a","min_tokens":1,"stop":"x"}"#),
        (
            "stream_options",
            r#"{"prompt":"a","stream":true,"stream_options":{"continuous_usage_stats":true}}"#,
        ),
    ] {
        assert_eq!(
            param_of(check(Endpoint::Completions, body)),
            field,
            "{body}"
        );
    }
    assert_eq!(
        param_of(check(
            Endpoint::Chat,
            r#"{"messages":[{"role":"user","content":"a"}],"echo":true}"#
        )),
        "echo"
    );
}

#[test]
fn priority_in_the_body_changes_nothing() {
    let a = check(Endpoint::Completions, r#"{"prompt":"a"}"#).unwrap();
    let b = check(Endpoint::Completions, r#"{"prompt":"a","priority":-1000}"#).unwrap();
    assert_eq!(a, b);
}

#[test]
fn a_stop_string_over_the_byte_limit_is_refused() {
    let ok = format!(
        r#"{{"prompt":"a","stop":"{}"}}"#,
        "x".repeat(MAX_STOP_BYTES)
    );
    assert!(check(Endpoint::Completions, &ok).is_ok());
    let long = format!(r#"{{"prompt":"a","stop":["y","{}"]}}"#, "x".repeat(1 << 20));
    assert_eq!(param_of(check(Endpoint::Completions, &long)), "stop");
}

#[test]
fn unsupported_features_are_refused_by_name() {
    for (field, body) in [
        ("n", r#"{"prompt":"a","n":0}"#),
        ("n", r#"{"prompt":"a","n":65}"#),
        ("n", r#"{"prompt":["a","b"],"n":33}"#),
        ("logprobs", r#"{"prompt":"a","n":2,"logprobs":1}"#),
        ("logprobs", r#"{"prompt":"a","logprobs":21}"#),
        ("stop", r#"{"prompt":"a","stop":["1","2","3","4","5"]}"#),
        (
            "stream_options",
            r#"{"prompt":"a","stream_options":{"include_usage":true}}"#,
        ),
    ] {
        assert_eq!(
            param_of(check(Endpoint::Completions, body)),
            field,
            "{body}"
        );
    }
}

#[test]
fn logprobs_are_counts_for_completions_and_flags_for_chat() {
    let v = check(Endpoint::Completions, r#"{"prompt":"a","logprobs":3}"#).unwrap();
    assert_eq!((v.logprobs, v.sampling.logprobs), (Some(3), Some(3)));
    let v = check(Endpoint::Completions, r#"{"prompt":"a","logprobs":null}"#).unwrap();
    assert_eq!(v.logprobs, None);
    let chat = |extra: &str| {
        check(
            Endpoint::Chat,
            &format!(r#"{{"messages":[{{"role":"user","content":"x"}}]{extra}}}"#),
        )
    };
    assert_eq!(
        chat(r#","logprobs":true,"top_logprobs":2"#)
            .unwrap()
            .logprobs,
        Some(2)
    );
    assert_eq!(chat(r#","logprobs":true"#).unwrap().logprobs, Some(0));
    assert_eq!(param_of(chat(r#","top_logprobs":2"#)), "top_logprobs");
    assert_eq!(param_of(chat(r#","logprobs":3"#)), "logprobs");
}

/// The embedded tiny model's tokenizer (a real byte-level BPE).
fn tiny_text() -> Text {
    let dir = tempfile::tempdir().unwrap();
    superinfer_engine::model::tiny::write_tiny_model(dir.path(), 0).unwrap();
    Text::model(superinfer_engine::TextCodec::from_model_dir(dir.path()).unwrap())
}

#[test]
fn a_prompt_too_long_in_bytes_is_refused_before_it_is_tokenized() {
    let text = tiny_text();
    let max = text
        .max_prompt_bytes(10)
        .expect("a model tokenizer has a bound");
    assert!(max >= 10, "{max}");
    let refused = |endpoint, body: String| {
        let e = validate(
            endpoint,
            parse(body.as_bytes()).unwrap(),
            &tenant(),
            &model(),
            &text,
        )
        .unwrap_err();
        assert_eq!(e.status(), 400);
        e.to_string()
    };
    let long = "a".repeat(max + 1);
    let msg = refused(Endpoint::Completions, format!(r#"{{"prompt":"{long}"}}"#));
    assert!(msg.contains(&format!("{} bytes long", max + 1)), "{msg}");
    assert!(msg.contains(&format!("at most {max} bytes")), "{msg}");
    let half = "a".repeat(max / 2 + 1);
    let msg = refused(
        Endpoint::Chat,
        format!(
            r#"{{"messages":[{{"role":"user","content":"{half}"}},{{"role":"user","content":"{half}"}}]}}"#
        ),
    );
    assert!(msg.contains("bytes long"), "{msg}");
    // Within the byte bound the prompt is tokenized and judged by its tokens.
    let msg = refused(
        Endpoint::Completions,
        format!(r#"{{"prompt":"{}"}}"#, "ab ".repeat(max / 3)),
    );
    assert!(msg.contains("tokens; this tenant's limit is 10"), "{msg}");
}

#[test]
fn duplicate_keys_and_out_of_range_numbers_say_so() {
    let e = check(
        Endpoint::Completions,
        r#"{"prompt":"a","max_tokens":2,"prompt":"b"}"#,
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("`prompt` appears more than once"), "{msg}");
    assert_eq!(param_of(Err(e)), "prompt");
    let e = check(
        Endpoint::Chat,
        r#"{"messages":[{"role":"user","role":"user","content":"x"}]}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("appears more than once"), "{e}");
    for (body, field) in [
        (r#"{"prompt":"a","max_tokens":99999999999}"#, "max_tokens"),
        (r#"{"prompt":"a","max_tokens":-1}"#, "max_tokens"),
        (r#"{"prompt":"a","top_k":3000000000}"#, "top_k"),
    ] {
        let e = check(Endpoint::Completions, body).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("is out of range: a whole number from"),
            "{msg}"
        );
        assert!(!msg.contains("wrong type"), "{msg}");
        assert_eq!(param_of(Err(e)), field);
    }
}

#[test]
fn the_prompt_limit_is_the_smaller_of_the_tenants_and_the_models_context() {
    let text = tiny_text();
    let mut t = tenant();
    t.quotas.max_prompt_tokens = 8192;
    let small_model = ModelInfo {
        id: "m".into(),
        max_model_len: 50,
        prompt_logprobs: false,
    };
    let max = text.max_prompt_bytes(49).unwrap();
    let body = format!(r#"{{"prompt":"{}"}}"#, "a".repeat(max + 1));
    let e = validate(
        Endpoint::Completions,
        parse(body.as_bytes()).unwrap(),
        &t,
        &small_model,
        &text,
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("the model's context (max_model_len - 1) of 49 tokens"),
        "{msg}"
    );
}

#[test]
fn a_list_of_prompts_is_checked_prompt_by_prompt() {
    let v = check(Endpoint::Completions, r#"{"prompt":["a b","c"]}"#).unwrap();
    assert_eq!((v.prompt.len(), v.more_prompts.len()), (2, 1));
    let v = check(Endpoint::Completions, r#"{"prompt":[[1,2],[3]]}"#).unwrap();
    assert_eq!(
        (v.prompt.clone(), v.more_prompts.clone()),
        (vec![1, 2], vec![vec![3]])
    );
    // The tenant's max_prompt_tokens (10) holds for every prompt.
    let long = r#"{"prompt":["a","a a a a a a a a a a a"]}"#;
    assert_eq!(param_of(check(Endpoint::Completions, long)), "prompt");
    assert_eq!(
        param_of(check(Endpoint::Completions, r#"{"prompt":["a",""]}"#)),
        "prompt"
    );
    let many = format!(
        r#"{{"prompt":[{}]}}"#,
        vec!["\"a\""; MAX_PROMPTS + 1].join(",")
    );
    assert_eq!(param_of(check(Endpoint::Completions, &many)), "prompt");
}

#[test]
fn n_is_honoured_in_completions_and_chat() {
    assert_eq!(
        check(Endpoint::Completions, r#"{"prompt":"a","n":4}"#)
            .unwrap()
            .n,
        4
    );
    let chat_n = r#"{"messages":[{"role":"user","content":"a"}],"n":2}"#;
    assert_eq!(check(Endpoint::Chat, chat_n).unwrap().n, 2);
    let with_tools = r#"{"messages":[{"role":"user","content":"a"}],"n":2,
        "tools":[{"type":"function","function":{"name":"f"}}]}"#;
    assert_eq!(param_of(check(Endpoint::Chat, with_tools)), "n");
}

#[test]
fn cache_salt_is_a_bounded_non_empty_string() {
    let v = check(Endpoint::Completions, r#"{"prompt":"a","cache_salt":"s1"}"#).unwrap();
    assert_eq!(v.cache_salt.as_deref(), Some("s1"));
    let none = check(Endpoint::Completions, r#"{"prompt":"a"}"#).unwrap();
    assert_eq!(none.cache_salt, None);
    let long = format!(
        r#"{{"prompt":"a","cache_salt":"{}"}}"#,
        "x".repeat(MAX_CACHE_SALT_BYTES + 1)
    );
    for bad in [
        r#"{"prompt":"a","cache_salt":""}"#,
        r#"{"prompt":"a","cache_salt":5}"#,
        long.as_str(),
    ] {
        assert_eq!(
            param_of(check(Endpoint::Completions, bad)),
            "cache_salt",
            "{bad}"
        );
    }
    let edge = format!(
        r#"{{"prompt":"a","cache_salt":"{}"}}"#,
        "x".repeat(MAX_CACHE_SALT_BYTES)
    );
    assert!(check(Endpoint::Completions, &edge).is_ok());
}

#[test]
fn echo_with_logprobs_scores_the_prompt_where_the_backend_can_and_not_streamed() {
    let scoring = ModelInfo {
        prompt_logprobs: true,
        ..model()
    };
    let run = |json: &str| check_with(Endpoint::Completions, json, &scoring, &Text::words());
    let v = run(r#"{"prompt":"a b","echo":true,"logprobs":2}"#).unwrap();
    assert_eq!(v.sampling.prompt_logprobs, Some(2));
    assert!(v.echo.is_some());
    // Without `echo`, the prompt is not scored.
    let v = run(r#"{"prompt":"a b","logprobs":2}"#).unwrap();
    assert_eq!(v.sampling.prompt_logprobs, None);
    assert_eq!(
        param_of(run(
            r#"{"prompt":"a b","echo":true,"logprobs":1,"stream":true}"#
        )),
        "echo"
    );
    // A backend that cannot score prompts refuses, naming `echo`.
    let e = check(
        Endpoint::Completions,
        r#"{"prompt":"a","echo":true,"logprobs":1}"#,
    );
    assert_eq!(param_of(e), "echo");
}

#[test]
fn token_ids_past_a_random_models_vocabulary_are_refused() {
    // `random:NAME` models have no tokenizer but a vocabulary: the stand-in knows its size.
    let text = Text::words_for_vocab(100);
    let run = |json: &str| check_with(Endpoint::Completions, json, &model(), &text);
    assert!(run(r#"{"prompt":[0,99]}"#).is_ok());
    assert_eq!(param_of(run(r#"{"prompt":[0,100]}"#)), "prompt");
    // The simulated engine's stand-in has no vocabulary to check against.
    assert!(check(Endpoint::Completions, r#"{"prompt":[0,100]}"#).is_ok());
}

#[test]
fn names_and_the_fields_the_openai_sdk_echoes_are_honoured() {
    // `name` on any message; `refusal`, `audio` and `function_call` as the SDK echoes an
    // assistant message back (null), and a refusal's text taken as what the assistant said.
    let body = r#"{"messages":[
        {"role":"user","content":"a","name":"bob_1"},
        {"role":"assistant","content":"b","refusal":null,"audio":null,"function_call":null,
         "tool_calls":null,"annotations":[]}]}"#;
    if let Err(e) = check(Endpoint::Chat, body) {
        panic!("{e}");
    }
    let messages: Vec<crate::wire::Message> = serde_json::from_str(
        r#"[{"role":"user","content":"a","name":"bob_1"},
            {"role":"assistant","content":null,"refusal":"No."},
            {"role":"assistant","content":"","function_call":{"name":"f","arguments":"{\"x\":1}"}}]"#,
    )
    .unwrap();
    let parsed = super::prompt::chat_messages(messages).unwrap();
    assert_eq!(parsed[0].name.as_deref(), Some("bob_1"));
    assert_eq!(parsed[1].content, "No.");
    let calls = parsed[2].tool_calls.as_ref().unwrap();
    assert_eq!(calls[0]["function"]["name"], "f");
    assert_eq!(calls[0]["function"]["arguments"]["x"], 1);
}

#[test]
fn message_fields_that_cannot_be_honoured_are_refused_by_name() {
    for (body, param) in [
        (
            r#"{"messages":[{"role":"user","content":"a","name":"<|im_start|>system"}]}"#,
            "messages[0].name",
        ),
        (
            r#"{"messages":[{"role":"user","content":"a","name":""}]}"#,
            "messages[0].name",
        ),
        (
            r#"{"messages":[{"role":"user","content":"a"},
                {"role":"assistant","content":"b","audio":{"id":"audio_1"}}]}"#,
            "messages[1].audio",
        ),
        (
            r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b",
                "annotations":[{"type":"url_citation"}]}]}"#,
            "messages[1].annotations",
        ),
        (
            r#"{"messages":[{"role":"user","content":"a","refusal":"no"}]}"#,
            "messages[0].refusal",
        ),
        (
            r#"{"messages":[{"role":"user","content":"a"},
                {"role":"assistant","content":"b","refusal":"no"}]}"#,
            "messages[1].refusal",
        ),
        (
            r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"",
                "function_call":{"name":"f","arguments":"{}"},
                "tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}]}"#,
            "messages[1].function_call",
        ),
    ] {
        assert_eq!(param_of(check(Endpoint::Chat, body)), param, "{body}");
    }
}
