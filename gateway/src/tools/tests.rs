use super::*;
use serde_json::json;

fn tools() -> ValidTools {
    let weather = json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}});
    let time = json!({"type": "function", "function": {"name": "get_time"}});
    validate(Some(vec![weather, time]), Some(json!("required")), None)
        .expect("valid tools")
        .expect("some tools")
}

fn names_and_args(calls: &[ToolCall]) -> Vec<(String, Value)> {
    calls
        .iter()
        .map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap()))
        .collect()
}

#[test]
fn hermes_calls_are_parsed_and_other_text_stays_text() {
    let t = tools();
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
                {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"get_time\", \
                \"arguments\": \"{}\"}</tool_call>";
    let p = parse(text, ToolFormat::Hermes, &t.tools);
    assert_eq!(p.content, "Let me check.");
    assert_eq!(
        names_and_args(&p.calls),
        vec![
            ("get_weather".into(), json!({"city": "Paris"})),
            ("get_time".into(), json!({}))
        ]
    );
    assert!(p.calls[0].id.starts_with("call_") && p.calls[0].id != p.calls[1].id);
    // An unknown function, broken JSON or no call at all: text.
    for text in [
        "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"get_time\", \"argu",
        "Just text.",
    ] {
        let p = parse(text, ToolFormat::Hermes, &t.tools);
        assert!(p.calls.is_empty(), "{text}");
        assert_eq!(p.content, text.trim());
    }
}

#[test]
fn llama_json_calls_are_parsed() {
    let t = tools();
    let p = parse(
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome; IT\"}}",
        ToolFormat::Llama3Json,
        &t.tools,
    );
    assert_eq!(
        names_and_args(&p.calls),
        vec![("get_weather".into(), json!({"city": "Rome; IT"}))]
    );
    assert!(p.content.is_empty());
    let p = parse(
        "{\"name\": \"get_time\", \"parameters\": {}}; {\"name\": \"get_weather\", \
         \"parameters\": {\"city\": \"Oslo\"}}",
        ToolFormat::Llama3Json,
        &t.tools,
    );
    assert_eq!(p.calls.len(), 2);
    for text in ["The weather is fine.", "{\"name\": \"get_time\"} and more"] {
        let p = parse(text, ToolFormat::Llama3Json, &t.tools);
        assert!(p.calls.is_empty());
        assert_eq!(p.content, text);
    }
}

/// What a tool stream lets out for `text` pushed in pieces of `n` characters, then finished.
fn events_of(text: &str, n: usize, format: ToolFormat, tools: &[Tool]) -> Vec<ToolStreamEvent> {
    let mut s = ToolStream::new(format, tools.to_vec());
    let chars: Vec<char> = text.chars().collect();
    let mut events = Vec::new();
    for piece in chars.chunks(n) {
        events.extend(s.push(&piece.iter().collect::<String>()));
    }
    events.extend(s.finish());
    events
}

/// `text` streamed in pieces of `n` characters gives the content and calls `whole` (the
/// whole answer parsed) has.
fn streams_as_whole(text: &str, n: usize, format: ToolFormat, tools: &[Tool], whole: &Parsed) {
    let (content, calls) = stream(text, n, format, tools);
    assert_eq!(content.trim(), whole.content, "{text} by {n}");
    assert_eq!(
        names_and_args(&calls),
        names_and_args(&whole.calls),
        "{text} by {n}"
    );
}

/// Streams `text` in pieces of `n` characters; returns the content sent and the calls.
fn stream(text: &str, n: usize, format: ToolFormat, tools: &[Tool]) -> (String, Vec<ToolCall>) {
    let events = events_of(text, n, format, tools);
    let mut content = String::new();
    let mut calls = Vec::new();
    for e in events {
        match e {
            ToolStreamEvent::Content(c) => content.push_str(&c),
            ToolStreamEvent::Call(c) | ToolStreamEvent::CallStart(c) => calls.push(c),
            ToolStreamEvent::CallArgs(a) => calls
                .last_mut()
                .expect("arguments after their call opened")
                .arguments
                .push_str(&a),
        }
    }
    (content, calls)
}

#[test]
fn streamed_pieces_reassemble_to_the_parsed_answer() {
    let t = tools();
    let hermes = "Sure <tool_c> then <tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
                  {\"city\": \"Lima\"}}\n</tool_call>";
    let llama = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}";
    for (text, format) in [
        (hermes, ToolFormat::Hermes),
        (llama, ToolFormat::Llama3Json),
        ("plain answer", ToolFormat::Llama3Json),
        ("plain <tool_call", ToolFormat::Hermes),
    ] {
        let whole = parse(text, format, &t.tools);
        for n in [1, 3, 7, 1000] {
            streams_as_whole(text, n, format, &t.tools, &whole);
        }
    }
}

#[test]
fn tools_and_tool_choice_are_validated() {
    let f = |name: &str| json!({"type": "function", "function": {"name": name}});
    let err = |tools: Option<Vec<Value>>, choice: Option<Value>| {
        validate(tools, choice, None).expect_err("refused")
    };
    let param = |e: GatewayError| match e {
        GatewayError::InvalidRequest { param, .. } => param.unwrap_or_default(),
        other => panic!("{other:?}"),
    };
    assert_eq!(param(err(Some(vec![json!({"type": "x"})]), None)), "tools");
    assert_eq!(param(err(Some(vec![f("a b")]), None)), "tools");
    assert_eq!(param(err(Some(vec![f("a"), f("a")]), None)), "tools");
    assert_eq!(
        param(err(Some(vec![f("a")]), Some(json!("sometimes")))),
        "tool_choice"
    );
    let named = json!({"type": "function", "function": {"name": "b"}});
    assert_eq!(param(err(Some(vec![f("a")]), Some(named))), "tool_choice");
    assert_eq!(param(err(None, Some(json!("required")))), "tool_choice");
    assert_eq!(validate(None, Some(json!("none")), None).unwrap(), None);
    let v = validate(Some(vec![f("a")]), None, Some(false))
        .unwrap()
        .unwrap();
    assert_eq!(v.choice, ToolChoice::Auto);
    assert!(!v.parallel && v.parses() && v.grammar(ToolFormat::Hermes).is_none());
}

#[test]
fn the_required_and_named_grammars_compile() {
    let dir = tempfile::tempdir().unwrap();
    superinfer_engine::model::tiny::write_tiny_model(dir.path(), 1).unwrap();
    let codec = superinfer_engine::TextCodec::from_model_dir(dir.path()).unwrap();
    let c = superinfer_engine::grammar::GrammarCompiler::new(&codec, None).unwrap();
    let mut t = tools();
    for format in [ToolFormat::Hermes, ToolFormat::Llama3Json] {
        for choice in [ToolChoice::Required, ToolChoice::Named("get_time".into())] {
            for parallel in [true, false] {
                t.choice = choice.clone();
                t.parallel = parallel;
                let g = t.grammar(format).expect("a grammar");
                c.compile(&g, None)
                    .unwrap_or_else(|e| panic!("{format:?} {choice:?}: {e}\n{g:?}"));
            }
        }
    }
}

#[test]
fn a_plain_hermes_call_streams_its_arguments_in_pieces_and_other_shapes_go_whole() {
    let t = tools();
    let plain = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Li}ma \
                 \\\"{x\", \"at\": {\"d\": [1, {\"e\": 2}]}}}\n</tool_call> then \
                 <tool_call>{\"arguments\": {\"city\": \"Oslo\"}, \"name\": \"get_weather\"}\
                 </tool_call><tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>";
    let whole = parse(plain, ToolFormat::Hermes, &t.tools);
    assert_eq!(whole.calls.len(), 2, "{whole:?}");
    for n in [1, 2, 5, 1000] {
        let events = events_of(plain, n, ToolFormat::Hermes, &t.tools);
        let starts = events
            .iter()
            .filter(|e| matches!(e, ToolStreamEvent::CallStart(_)))
            .count();
        let pieces = events
            .iter()
            .filter(|e| matches!(e, ToolStreamEvent::CallArgs(_)))
            .count();
        let wholes = events
            .iter()
            .filter(|e| matches!(e, ToolStreamEvent::Call(_)))
            .count();
        // The plain call streams; `arguments` before `name` goes whole; an unknown name is
        // text.
        assert_eq!((starts, wholes), (1, 1), "by {n}: {events:?}");
        if n < 10 {
            assert!(pieces > 3, "by {n}: {pieces} pieces");
        }
        streams_as_whole(plain, n, ToolFormat::Hermes, &t.tools, &whole);
    }
    // Cut short mid-arguments: the call keeps what was sent, nothing more comes.
    let mut s = ToolStream::new(ToolFormat::Hermes, t.tools.clone());
    let events = s.push("<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"ci");
    assert!(matches!(&events[0], ToolStreamEvent::CallStart(c) if c.name == "get_weather"));
    assert_eq!(events[1], ToolStreamEvent::CallArgs("{\"ci".into()));
    assert!(s.finish().is_empty());
}

#[test]
fn llama_calls_stream_their_parameters_and_other_answers_stay_whole_or_text() {
    let t = tools();
    let two = "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}; {\"name\": \
               \"get_weather\", \"parameters\": {\"city\": \"Os}lo\", \"n\": [1, {\"a\": 2}]}}";
    for (text, starts, wholes) in [
        (two, 2, 0),
        // Parameters before the name: one whole call at the end.
        (
            "{\"parameters\": {\"city\": \"Oslo\"}, \"name\": \"get_weather\"}",
            0,
            1,
        ),
        // Not a call: text, sent at the end as it was.
        ("{\"name\": \"get_time\"} and more", 0, 0),
        ("Plain words.", 0, 0),
    ] {
        let whole = parse(text, ToolFormat::Llama3Json, &t.tools);
        for n in [1, 3, 1000] {
            let events = events_of(text, n, ToolFormat::Llama3Json, &t.tools);
            let count = |f: fn(&ToolStreamEvent) -> bool| events.iter().filter(|e| f(e)).count();
            assert_eq!(
                (
                    count(|e| matches!(e, ToolStreamEvent::CallStart(_))),
                    count(|e| matches!(e, ToolStreamEvent::Call(_)))
                ),
                (starts, wholes),
                "{text} by {n}: {events:?}"
            );
            if starts > 0 && n == 1 {
                assert!(count(|e| matches!(e, ToolStreamEvent::CallArgs(_))) > 5);
            }
            streams_as_whole(text, n, ToolFormat::Llama3Json, &t.tools, &whole);
        }
    }
}
